"""Actor classes shipped by value (defined in ``__main__``, a notebook or a
function) may refer to any picklable value: tensors, arrays, bytes."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from meshio import Actor, endpoint
from meshio._transport._serial import unpicklable_part
from script_run import run_script

LOCK = threading.Lock()

SCRIPT = """
import numpy as np
import torch

import meshio
from meshio import Actor, endpoint

WEIGHTS = torch.arange(6, dtype=torch.float32).reshape(2, 3)   # module-level tensor
TABLE = np.arange(4, dtype=np.int64)
BLOB = bytes(range(256)) * 512                                    # 128 KiB


class Model(Actor):
    @endpoint
    async def total(self) -> float:
        return float(WEIGHTS.sum()) + float(TABLE.sum()) + len(BLOB)


def make_local(scale: float) -> type[Actor]:
    bias = torch.full((3,), scale)            # captured by the closure

    class Local(Actor):
        @endpoint
        async def shifted(self) -> list[float]:
            return (WEIGHTS[0] + bias).tolist()

    return Local


async def main() -> None:
    async with meshio.this_host().spawn_procs(per_host={"procs": 2}) as procs:
        model = await procs.spawn("model", Model)
        print("TOTAL", (await model.total.call()).values(), flush=True)
        local = await procs.spawn("local", make_local(0.5))
        print("LOCAL", await local.slice(procs=1).shifted.call_one(), flush=True)


meshio.run(main())
"""


def test_actor_class_by_value_refers_to_tensors_and_arrays(tmp_path: Path) -> None:
    """issue 8 item 1: a class in __main__ that refers to a module-level
    tensor, array and bytes, and a class made in a function that captures a
    tensor, can be spawned (they used to fail with "not enough out-of-band
    buffers")."""
    pytest.importorskip("torch")
    pytest.importorskip("numpy")
    lines = run_script(tmp_path, SCRIPT)
    assert f"TOTAL {[15.0 + 6 + 256 * 512] * 2}" in lines, lines
    assert "LOCAL [0.5, 1.5, 2.5]" in lines, lines



ANNOTATED = """
import asyncio
import dataclasses
import enum
import sys
from typing import Any

import meshio
from meshio import Actor, endpoint
from meshio.testing import in_process_host


@dataclasses.dataclass
class Msg:
    a: int


class Color(enum.Enum):
    RED = 1


class UsesMsg(Actor):
    @endpoint
    async def typed(self, m: Msg, c: Color) -> int:
        return m.a + c.value

    @endpoint
    async def untyped(self, m: Any) -> Any:
        return m


async def main() -> None:
    host = in_process_host() if sys.argv[1] == "in-process" else meshio.this_host()
    async with host.spawn_procs(per_host={"procs": 2}) as procs:
        first = (await procs.spawn("first", UsesMsg)).slice(procs=0)
        print("TYPED", await first.typed.call_one(Msg(1), Color.RED), flush=True)
        again = (await procs.spawn("again", UsesMsg)).slice(procs=1)
        print("AGAIN", await again.typed.call_one(Msg(2), Color.RED), flush=True)
        print("UNTYPED", await again.untyped.call_one([Msg(3), Color.RED]), flush=True)


asyncio.run(main())
"""


@pytest.mark.parametrize("transport", ["processes", "in-process"])
def test_a_class_by_value_used_in_an_annotation_still_pickles(tmp_path: Path,
                                                              transport: str) -> None:
    """A dataclass (and an enum) in __main__ used as a parameter's
    annotation: once msgspec had decoded it (keeping its
    ``__msgspec_cache__`` on the class), spawning the actor class again
    failed ("cannot pickle 'msgspec._core.DataclassInfo' object"), and so
    did passing an instance where the annotation is ``Any``."""
    assert run_script(tmp_path, ANNOTATED, transport) == [
        "TYPED 2", "AGAIN 3", "UNTYPED [Msg(a=3), <Color.RED: 1>]"]


SPAWN_CHILD = """
import multiprocessing
import os

import meshio
from meshio import Actor, endpoint


class Greeter(Actor):
    @endpoint
    async def greet(self, name: str) -> str:
        return f"{shout(name)} from {os.getpid()}"


def shout(name: str) -> str:
    return name.upper()


async def controller() -> None:
    async with meshio.this_host().spawn_procs(per_host={"procs": 2}) as procs:
        greeter = await procs.spawn("greeter", Greeter)
        print("GREETED", sorted(x.split()[0] for x in (await greeter.greet.call("ada")).values()),
              flush=True)
        print("FUNCTION", await greeter.slice(procs=0).greet.call_one(shout("b")), flush=True)


def child() -> None:
    meshio.run(controller())


if __name__ == "__main__":
    for method in ("spawn", "forkserver"):
        p = multiprocessing.get_context(method).Process(target=child)
        p.start()
        p.join()
        print(method, "EXIT", p.exitcode, flush=True)
"""


def test_a_controller_in_a_multiprocessing_spawn_child_ships_the_main_script(
        tmp_path: Path) -> None:
    """A controller in a ``multiprocessing`` child started by ``spawn`` or
    ``forkserver``, where the user's script runs as module
    ``__mp_main__``: its actor class (and the function it calls) went by
    reference, and every worker failed its constructor with
    ``ModuleNotFoundError: No module named '__mp_main__'``."""
    lines = run_script(tmp_path, SPAWN_CHILD)
    assert lines.count("GREETED ['ADA', 'ADA']") == 2, lines
    assert sum(x.startswith("FUNCTION B from ") for x in lines) == 2, lines
    assert [x for x in lines if "EXIT" in x] == ["spawn EXIT 0", "forkserver EXIT 0"], lines


UNPICKLABLE = """
import threading

import meshio
from meshio import Actor, endpoint

LOCK = threading.Lock()


class Locked(Actor):
    @endpoint
    def locked(self) -> int:
        with LOCK:
            return 1


def make_local() -> type[Actor]:
    guard = threading.Lock()                  # captured by the closure

    class Local(Actor):
        @endpoint
        def guarded(self) -> int:
            with guard:
                return 2

    return Local


class Ok(Actor):
    @endpoint
    def one(self) -> int:
        return 1


async def main() -> None:
    async with meshio.this_host().spawn_procs(per_host={"procs": 1}) as procs:
        for cls in (Locked, make_local()):
            try:
                await procs.spawn("l", cls)
            except TypeError as e:
                print("ERROR", e, flush=True)
                print("CONTEXT", e.__cause__, e.__suppress_context__, flush=True)
        ok = await procs.spawn("l", Ok)
        print("RESPAWN", await ok.one.call_one(), flush=True)
        stats = await meshio.stats()
        print("ACTORS", [a.actor for pm in stats.proc_meshes for p in pm.processes
                         for a in p.actors], flush=True)


meshio.run(main())
"""


def test_a_class_that_cannot_be_pickled_says_why_and_leaves_its_name_free(
        tmp_path: Path) -> None:
    """A class in __main__ whose method uses a module-level lock (or captures
    one) cannot be pickled: the spawn failed with cloudpickle's bare
    ``cannot pickle '_thread.lock' object`` under ~30 frames of meshio, and
    kept the name taken for good ("already has actors named 'l'; stop them
    first", of a mesh the user never got)."""
    lines = run_script(tmp_path, UNPICKLABLE)
    errors = [x for x in lines if x.startswith("ERROR ")]
    assert len(errors) == 2, lines
    assert "class Locked" in errors[0] and "by value" in errors[0], errors
    assert "__main__" in errors[0] and "'LOCK'" in errors[0], errors
    assert "cannot pickle '_thread.lock' object" in errors[0], errors
    assert "Local" in errors[1] and "'guard'" in errors[1], errors
    assert lines.count("CONTEXT None True") == 2, lines
    assert "RESPAWN 1" in lines, lines
    assert "ACTORS ['l']" in lines, lines


def test_the_part_of_a_class_that_cannot_be_pickled_is_named() -> None:
    """The error names the one value that fails, not a method that names its
    own class (or calls ``super()``), which fails only with the class."""

    class Base(Actor):
        @endpoint
        def ping(self) -> int:
            return 0

    class Uses(Base):
        @endpoint
        def clone(self) -> str:
            return repr(Uses) + repr(super().ping)

        @property
        def held(self) -> bool:
            return LOCK.locked()

    class Holds(Actor):
        lock = threading.Lock()

    uses, holds = unpicklable_part(Uses), unpicklable_part(Holds)
    assert uses is not None and uses.startswith("the global 'LOCK' that "), uses
    assert uses.endswith(".<locals>.Uses.held uses"), uses
    assert holds is not None and holds.startswith("the class attribute "), holds
    assert holds.endswith(".<locals>.Holds.lock"), holds
    assert unpicklable_part(Base) is None
