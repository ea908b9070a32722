import meshio
from meshio import Actor, endpoint


class Echo(Actor):
    @endpoint
    async def echo(self, x: int) -> int:
        return x


async def test_call_returns_value_mesh(procs: meshio.ProcMesh) -> None:
    echo = await procs.spawn("echo", Echo)
    result = await echo.echo.call(x=7)
    assert result.values() == [7, 7]
