"""``examples/tour.ipynb`` (issue 19 §5), executed by a real kernel as
Jupyter runs it: actor classes defined in cells, a mesh kept across cells,
a remote error, a worker's output, and a cell interrupted mid-call (the
kernel gets SIGINT, as from Jupyter's interrupt button) after which the
mesh still answers."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import nbclient
import nbformat
import pytest

from kernels import KERNEL, kernelspec

ROOT = Path(__file__).resolve().parent.parent
TOUR = ROOT / "examples" / "tour.ipynb"
#: generous: a kernel, two workers, a loaded machine
DEADLINE = 120
#: the forwarded line of the call the test interrupts
NAPPING = "[procs procs=1] napping for 60 s"


def _text(cell: Any) -> str:
    """A cell's outputs as text: streams, results, errors."""
    parts = []
    for out in cell.get("outputs", []):
        if out["output_type"] == "stream":
            parts.append(out["text"])
        elif out["output_type"] in ("execute_result", "display_data"):
            parts.append(out["data"].get("text/plain", "") + "\n")
        elif out["output_type"] == "error":
            parts.append(f"{out['ename']}: {out['evalue']}\n")
    return "".join(parts)


@pytest.fixture(scope="module")
def tour(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """Runs the tour in a real ipykernel (through nbclient); while the nap
    cell awaits its call, once the worker's line has reached that cell, the
    kernel is interrupted as Jupyter's button does. Each code cell's output
    as text, in order."""
    pytest.importorskip("ipykernel")
    tmp = tmp_path_factory.mktemp("tour")
    nb = nbformat.read(TOUR, as_version=4)

    class Client(nbclient.NotebookClient):
        """Sets ``napping`` when the nap call's forwarded line arrives."""

        napping: asyncio.Event

        def output(self, outs: Any, msg: Any, display_id: Any, cell_index: int) -> Any:
            out = super().output(outs, msg, display_id, cell_index)
            if msg["msg_type"] == "stream" and NAPPING in msg["content"]["text"]:
                self.napping.set()
            return out

    async def run() -> None:
        client = Client(nb, kernel_name=KERNEL, timeout=DEADLINE, allow_errors=True,
                        resources={"metadata": {"path": str(tmp)}})
        client.napping = asyncio.Event()
        async with client.async_setup_kernel():
            for index, cell in enumerate(nb.cells):
                if ".nap.call_one(" not in cell.source:
                    await client.async_execute_cell(cell, index)
                    continue
                task = asyncio.create_task(client.async_execute_cell(cell, index))
                try:
                    await asyncio.wait_for(client.napping.wait(), DEADLINE)
                    await client.km.interrupt_kernel()
                finally:
                    await task

    with pytest.MonkeyPatch.context() as mp:
        kernelspec(mp, tmp)
        asyncio.run(run())
    return [_text(c) for c in nb.cells if c.cell_type == "code"]


def test_tour_cells(tour: list[str]) -> None:
    """Classes defined in cells, a mesh used across cells, a remote error
    caught and shown, a worker's line in the calling cell, an interrupted
    call cancelled on the worker, and the mesh answering after it."""
    defs, spawn, greet, counter, error, nap, after, stop = tour
    assert defs == "", defs
    assert spawn == "{'procs': 2}\n", spawn
    assert greet == ("['hello, notebook, from rank 0', 'hello, notebook, from rank 1']\n"), greet
    assert counter == "[5, 5]\n", counter
    assert error == ("ZeroDivisionError on rank 1: float division by zero\n"
                     "ZeroDivisionError: float division by zero\n"), error
    assert NAPPING + "\n" in nap, nap
    # ipykernel cancels the interrupted cell's task (older ones raised KeyboardInterrupt)
    assert nap.endswith(("CancelledError: \n", "KeyboardInterrupt: \n")), nap
    assert "rested" not in nap, nap
    assert after == ("nap cancelled on the worker: True\n"
                     "['hello, after the interrupt, from rank 0',\n"
                     " 'hello, after the interrupt, from rank 1']\n"), after
    assert stop == "True\n", stop


def test_tour_is_stored_without_outputs() -> None:
    """The notebook is kept clean: no outputs or execution counts from
    someone's machine (the tests make them)."""
    nb = nbformat.read(TOUR, as_version=4)
    nbformat.validate(nb)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert len(code) == 8
    assert all(c.outputs == [] and c.execution_count is None for c in code)
