"""``context(ActorClass)``: the running actor's context with ``mesh`` typed
as its own class (checked at run time too)."""

from __future__ import annotations

import meshio
from meshio import Actor, context, endpoint


class Ring(Actor):
    @endpoint(concurrent=True)  # also answers ring[0]'s own call to the whole mesh
    async def ident(self, x: int) -> int:
        return x

    @endpoint
    async def via_peers(self, x: int) -> list[int]:
        """Call the whole mesh through ``context(Ring).mesh``, typed as Ring."""
        return (await context(Ring).mesh.ident.call(x)).values()

    @endpoint
    def wrong_class(self) -> str:
        try:
            context(Other)
        except TypeError as e:
            return str(e)
        return "no error"


class Other(Actor):
    pass


async def test_context_typed_by_the_actor_class() -> None:
    """issue 9 (types): ``context(Ring).mesh`` is the actor's own mesh, typed
    as ``Ring``; asking for a class the actor is not raises a TypeError that
    names both classes."""
    async with meshio.this_host().spawn_procs(per_host={"procs": 2}) as procs:
        ring = await procs.spawn("ring", Ring)
        assert await ring.slice(procs=0).via_peers.call_one(7) == [7, 7]
        message = await ring.slice(procs=1).wrong_class.call_one()
        assert message == ("context(Other): the running actor 'ring' is of class Ring, "
                           "not Other; pass its own class (or a base)")
