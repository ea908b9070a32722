"""Trainers for ``tests/test_reattach.py``, and, run as a script, the
controllers it kills and starts:

- ``spawn NAME KEEP_ALIVE [OPTIONS [SLOW]]``: spawns proc mesh NAME (two
  processes, with ``keep_alive`` seconds unless it is ``none``, and the
  other ``spawn_procs`` options of the JSON object OPTIONS) and trainers on
  it, trains three steps, prints ``ready <pids as JSON>`` and waits (to be
  killed); with SLOW (a Unix socket's path), it spawns ``slow``
  (:class:`SlowInit`) first, whose constructors wait there, so that it is
  killed in the middle of that spawn; with SLOW ``in-flight``, it calls
  ``Trainer.work_on`` (which never ends by itself) first, so that it is
  killed with that call in flight;
- ``step NAME``: re-attaches to NAME, trains one step and exits at once
  (``os._exit``: a second controller lost without stopping anything);
- ``resume NAME``: re-attaches to NAME, prints the trainers' state, trains
  two more steps, prints their state again, then stops the mesh;
- ``race NAME``: prints ``ready``, reads a line (the test's go) and
  re-attaches to NAME; taken by another controller, it prints ``taken <the
  error as JSON>`` and exits; else it trains one step, prints ``won <the
  trainers' states as JSON>``, and stops the mesh once it reads a line;
- ``claim NAME``: prints ``ready``, reads a line (the test's go) and
  spawns proc mesh NAME (one process, kept alive 60 s); refused, it prints
  ``refused <the error as JSON>`` and exits; else it prints ``started <its
  pids as JSON>``, and stops the mesh once it reads a line;
- ``give-up NAME SECONDS``: re-attaches to NAME giving up after SECONDS
  (``asyncio.wait_for``), then, given up, re-attaches again without a
  limit; trains one step, prints ``{"outcome": "given up" or
  "reattached", "errors": [...]}`` (the errors its loop's exception handler
  got: a task's error nobody retrieved) and exits at once, as ``step`` does.

With ``--job CACHE_DIR`` last, the hosts are those of a ``ProcessJob`` of two
hosts (host agents, cached in CACHE_DIR) and every host runs one process;
with ``--attach JSON``, those of ``meshio.attach(**JSON)`` (host agents
started otherwise, e.g. in network namespaces: ``tests/netns_hosts.py``).
"""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import os
import socket
import sys
from typing import Any

import meshio
from meshio import Actor, endpoint
from meshio.jobs import ProcessJob

#: ``--job CACHE_DIR``: the job whose hosts the mesh runs on (else this host)
JOB: str | None = None
#: ``--attach JSON``: the arguments of the ``meshio.attach`` whose hosts it runs on
ATTACH: dict[str, Any] | None = None


async def hosts() -> meshio.HostMesh:
    """Where the mesh runs: this host, the job's two hosts, or those attached."""
    if ATTACH is not None:
        return meshio.attach(**ATTACH)
    if JOB is None:
        return meshio.this_host()
    return (await ProcessJob(meshes={"hosts": 2}, cache_dir=JOB).state()).hosts


def per_host() -> dict[str, int]:
    return {"gpus": 2} if JOB is None and ATTACH is None else {"gpus": 1}


class Trainer(Actor):
    """Its weights after each step: state that a lost controller must not lose."""

    def __init__(self, lr: float) -> None:
        self.lr = lr
        self.history: list[float] = []
        self.working = asyncio.Event()
        self.cancelled = False

    @endpoint
    async def train(self, steps: int) -> None:
        weight = self.history[-1] if self.history else 0.0
        self.history.extend(weight + self.lr * (i + 1) for i in range(steps))

    @endpoint
    async def state(self) -> tuple[int, float]:
        """Steps trained, and the weight now."""
        return len(self.history), self.history[-1] if self.history else 0.0

    @endpoint
    async def pid(self) -> int:
        return os.getpid()

    @endpoint
    async def work_on(self) -> None:
        """A step that never ends by itself: in flight when its controller is lost."""
        self.working.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            self.cancelled = True
            raise

    @endpoint(concurrent=True)
    async def wait_working(self) -> None:
        await self.working.wait()

    @endpoint(concurrent=True)
    async def was_cancelled(self) -> bool:
        return self.cancelled

    @endpoint
    async def report(self) -> None:
        """A ``logging`` record for whichever controller serves it now."""
        logging.getLogger("trainer").warning("trainer at step %d", len(self.history))


class SlowInit(Actor):
    """Its constructor, given a Unix socket's path, connects there and waits
    until the other end closes: the test holds it in the middle of a spawn."""

    def __init__(self, hold: str | None) -> None:
        if hold is not None:
            with socket.socket(socket.AF_UNIX) as s:
                s.connect(hold)
                s.recv(1)

    @endpoint
    async def pid(self) -> int:
        return os.getpid()


async def spawn(name: str, keep_alive: float | None, options: dict[str, object],
                slow: str | None) -> None:
    procs = await (await hosts()).spawn_procs(per_host=per_host(), name=name,
                                              keep_alive=keep_alive,
                                              **options)  # type: ignore[arg-type]
    trainers = await procs.spawn("trainers", Trainer, lr=0.5)
    await trainers.train.call(steps=3)
    in_flight = trainers.work_on.call() if slow == "in-flight" else None  # (never returns)
    if in_flight is not None:
        await trainers.wait_working.call()
    print("ready", json.dumps(procs.pids), flush=True)
    if slow is not None and in_flight is None:
        await procs.spawn("slow", SlowInit, slow)  # (killed before it returns)
    sys.stdin.read()  # until the test kills this process


async def step(name: str) -> None:
    procs = await (await hosts()).reattach(name)
    trainers = procs.actors("trainers", Trainer)
    await trainers.train.call(steps=1)
    print("stepped", flush=True)
    os._exit(0)


async def claim(name: str) -> None:
    print("ready", flush=True)
    await asyncio.to_thread(sys.stdin.readline)
    try:
        procs = (await hosts()).spawn_procs(per_host={"gpus": 1}, name=name, keep_alive=60)
    except ValueError as e:
        print("refused", json.dumps(str(e)), flush=True)
        return
    await procs
    print("started", json.dumps(procs.pids), flush=True)
    await asyncio.to_thread(sys.stdin.readline)
    await procs.stop()


async def give_up(name: str, seconds: float) -> None:
    errors: list[str] = []
    asyncio.get_running_loop().set_exception_handler(
        lambda loop, context: errors.append(f"{context['message']}: {context.get('exception')!r}"))
    host = await hosts()
    try:
        procs = await asyncio.wait_for(host.reattach(name), seconds)
        outcome = "reattached"
    except TimeoutError:
        outcome = "given up"
        procs = await host.reattach(name)
    trainers = procs.actors("trainers", Trainer)
    await trainers.train.call(steps=1)
    gc.collect()  # (a task's error nobody retrieved is reported as the task is freed)
    print(json.dumps({"outcome": outcome, "errors": errors}), flush=True)
    os._exit(0)


async def resume(name: str) -> None:
    procs = await (await hosts()).reattach(name)
    trainers = procs.actors("trainers", Trainer)
    print("before", json.dumps(list((await trainers.state.call()).values())), flush=True)
    await trainers.train.call(steps=2)
    print("after", json.dumps(list((await trainers.state.call()).values())), flush=True)
    records: asyncio.Queue[str] = asyncio.Queue()
    seen = logging.Handler()
    seen.emit = lambda record: records.put_nowait(record.getMessage())  # type: ignore[method-assign]
    logging.getLogger("trainer").addHandler(seen)
    await trainers.report.call()
    got = [await asyncio.wait_for(records.get(), 60) for _ in range(2)]
    print("records", json.dumps(got), flush=True)
    await procs.stop()


async def race(name: str) -> None:
    print("ready", flush=True)
    await asyncio.to_thread(sys.stdin.readline)
    try:
        procs = await (await hosts()).reattach(name)
    except meshio.ProcMeshTakenError as e:
        print("taken", json.dumps(str(e)), flush=True)
        return
    trainers = procs.actors("trainers", Trainer)
    await trainers.train.call(steps=1)
    print("won", json.dumps(list((await trainers.state.call()).values())), flush=True)
    await asyncio.to_thread(sys.stdin.readline)
    await procs.stop()


def held() -> None:
    """A bootstrap waiting until the test lets it go (closes the Unix socket
    named by ``HELD_AT``): the test kills the controller meanwhile."""
    with socket.socket(socket.AF_UNIX) as s:
        s.connect(os.environ["HELD_AT"])
        s.recv(1)


async def spawn_held(name: str, hold: str) -> None:
    """Spawn kept-alive workers held in their bootstrap (killed meanwhile)."""
    await (await hosts()).spawn_procs(per_host=per_host(), name=name, keep_alive=60,
                                      env={"HELD_AT": hold}, bootstrap=held)


if __name__ == "__main__":
    if sys.argv[-2] == "--job":
        JOB = sys.argv.pop()
        sys.argv.pop()
    elif sys.argv[-2] == "--attach":
        ATTACH = json.loads(sys.argv.pop())
        sys.argv.pop()
    what, mesh = sys.argv[1], sys.argv[2]
    if what == "spawn":
        meshio.run(spawn(mesh, None if sys.argv[3] == "none" else float(sys.argv[3]),
                         json.loads(sys.argv[4]) if len(sys.argv) > 4 else {},
                         sys.argv[5] if len(sys.argv) > 5 else None))
    elif what == "spawn-held":
        meshio.run(spawn_held(mesh, sys.argv[3]))
    elif what == "give-up":
        meshio.run(give_up(mesh, float(sys.argv[3])))
    else:
        meshio.run({"step": step, "resume": resume, "race": race, "claim": claim}[what](mesh))
