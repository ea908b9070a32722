"""Worker ``logging`` records reach the controller's ``logging`` as records
(issue 19 §2): re-emitted through the logger of the same name with
``actor``, ``rank``, ``mesh``, ``host`` and ``pid``, not also as text;
``log_records=False`` leaves them as text, ``log_dir=`` puts them in
per-rank files; an unpicklable argument is formatted first; a flood is
bounded (dropped, counted, told once)."""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

import meshio
from log_watch import LogWatch
from meshio import Actor, context, endpoint
from meshio._logs import LOG_BACKLOG

GUARD = 30.0
HOST = socket.gethostname()
#: the worker prints this on stderr after logging: once it shows, any text
#: the records would have made has shown too (one pipe, in order)
MARK = "after-the-records"


class Unprintable:
    def __str__(self) -> str:
        raise RuntimeError("no str")

    def __repr__(self) -> str:
        raise RuntimeError("no repr")


class Talk(Actor):
    @endpoint
    async def say(self, text: str) -> int:
        rank = context().point.rank
        logging.getLogger("mine").warning("rank %d says %s", rank, text)
        logging.getLogger("mine").info("not at the default level")
        print(MARK, file=sys.stderr, flush=True)
        return os.getpid()

    @endpoint
    def say_in_thread(self, text: str) -> None:
        try:
            raise ValueError("bad value")
        except ValueError:
            logging.getLogger("mine.sub").exception("thread %s", text)

    @endpoint
    async def unpicklable(self) -> None:
        logging.getLogger("mine").warning("holding %s", threading.Lock(),
                                          extra={"tag": "kept", "handle": threading.Lock()})

    @endpoint
    def unprintable(self) -> None:
        logging.getLogger("mine").warning("cannot print %s", Unprintable())
        logging.getLogger("mine").warning(Unprintable())

    @endpoint
    async def extra(self, extra: dict[str, str]) -> None:
        logging.getLogger("mine").warning("with extra %s", sorted(extra), extra=extra)

    @endpoint
    async def flood(self, n: int, tag: str) -> None:
        log = logging.getLogger("flood")
        for i in range(n):  # the loop is not given back meanwhile: nothing is sent yet
            log.warning("%s %d", tag, i)

    @endpoint
    async def end(self, tag: str) -> None:
        logging.getLogger("flood").warning("end %s", tag)


class Records(logging.Handler):
    """The records a controller logger gets, awaitable."""

    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []
        self.event = asyncio.Event()

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)
        self.event.set()

    async def until(self, n: int) -> list[logging.LogRecord]:
        async with asyncio.timeout(GUARD):
            while len(self.records) < n:
                self.event.clear()
                await self.event.wait()
        return self.records


def attach(name: str) -> Iterator[Records]:
    handler = Records()
    logger = logging.getLogger(name)
    logger.addHandler(handler)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)


@pytest.fixture
def mine() -> Iterator[Records]:
    yield from attach("mine")


@pytest.fixture
def flood() -> Iterator[Records]:
    yield from attach("flood")


async def until_stderr(capfd: pytest.CaptureFixture[str], seen: list[str], text: str) -> str:
    """Worker output read so far (accumulated in ``seen``) once ``text`` is in it."""
    async with asyncio.timeout(GUARD):
        while text not in "".join(seen):
            seen.append(capfd.readouterr().err)
            await asyncio.sleep(0.01)  # (the pipe's reader runs on this loop)
    return "".join(seen)


async def test_worker_records_reach_controller_handlers_as_records(
        procs: meshio.ProcMesh, mine: Records, capfd: pytest.CaptureFixture[str]) -> None:
    talk = await procs.spawn("talk", Talk)
    pids = (await talk.say.call("hi")).values()
    records = await mine.until(2)
    assert sorted(r.getMessage() for r in records) == ["rank 0 says hi", "rank 1 says hi"]
    for r in records:
        assert r.name == "mine" and r.levelno == logging.WARNING
        assert r.msg == "rank %d says %s" and r.args == (r.rank, "hi")  # type: ignore[attr-defined]
        assert (r.actor, r.mesh, r.host) == ("talk", "procs", HOST)  # type: ignore[attr-defined]
        assert r.pid == r.process == pids[r.rank] == procs.pids[r.rank]  # type: ignore[attr-defined]
        assert r.funcName == "say" and r.pathname == __file__
    # the user's filters see the attributes
    only_rank_1 = Records()
    only_rank_1.addFilter(lambda r: getattr(r, "rank", None) == 1)
    logging.getLogger("mine.sub").addHandler(only_rank_1)
    try:
        await talk.say_in_thread.call("t")
        sub = (await mine.until(4))[2]
        assert [r.rank for r in only_rank_1.records] == [1]  # type: ignore[attr-defined]
    finally:
        logging.getLogger("mine.sub").removeHandler(only_rank_1)
    assert sub.name == "mine.sub" and sub.levelno == logging.ERROR
    assert sub.exc_info is None and sub.exc_text is not None  # formatted in the worker
    assert "ValueError: bad value" in sub.exc_text
    assert "ValueError: bad value" in logging.Formatter().format(sub)
    # not also as text: the worker's stderr, up to a line printed after them
    seen: list[str] = []
    await until_stderr(capfd, seen, f"[procs procs=0] {MARK}")
    err = await until_stderr(capfd, seen, f"[procs procs=1] {MARK}")
    assert "says hi" not in err and "bad value" not in err
    assert "not at the default level" not in err + "".join(r.getMessage() for r in records)


async def test_controller_logger_levels_and_disabled_loggers_apply(
        procs: meshio.ProcMesh, mine: Records) -> None:
    talk = await procs.spawn("talk", Talk)
    logger = logging.getLogger("mine")
    logger.setLevel(logging.ERROR)
    try:
        await talk.say.call("quiet")  # WARNING: below this controller's level for "mine"
        await talk.say_in_thread.call("loud")  # ERROR on mine.sub: through
        records = await mine.until(2)
    finally:
        logger.setLevel(logging.NOTSET)
    assert sorted(r.getMessage() for r in records) == ["thread loud", "thread loud"]


@pytest.mark.meshio_procs(per_host={"procs": 2}, log_records=False)
async def test_turned_off_records_stay_text(
        procs: meshio.ProcMesh, mine: Records, capfd: pytest.CaptureFixture[str]) -> None:
    talk = await procs.spawn("talk", Talk)
    await talk.say.call("plain")
    err = await until_stderr(capfd, [], "[procs procs=1] rank 1 says plain")
    assert "[procs procs=0] rank 0 says plain" in err  # the worker's own stderr, forwarded
    await until_stderr(capfd, [err], f"[procs procs=1] {MARK}")
    assert mine.records == []


async def test_log_dir_writes_per_rank_files(
        meshio_host: meshio.HostMesh, mine: Records, tmp_path: Path) -> None:
    logs = tmp_path / "logs" / "run1"  # made by the workers
    async with meshio_host.spawn_procs(per_host={"gpus": 2}, name="trainers",
                                       log_dir=logs) as procs:
        talk = await procs.spawn("talk", Talk)
        await talk.say.call("to a file")
        await talk.say_in_thread.call("also")
    assert sorted(p.name for p in logs.iterdir()) == ["trainers-0.log", "trainers-1.log"]
    for rank in (0, 1):
        text = (logs / f"trainers-{rank}.log").read_text()
        assert f"WARNING mine talk[{rank}]: rank {rank} says to a file\n" in text
        assert f"ERROR mine.sub talk[{rank}]: thread also\nTraceback" in text
        assert "ValueError: bad value" in text
        assert f"rank {1 - rank} says" not in text
    assert mine.records == []  # not sent


async def test_spawn_procs_checks_the_log_options(meshio_host: meshio.HostMesh) -> None:
    with pytest.raises(TypeError, match="log_records must be True or False"):
        meshio_host.spawn_procs(log_records="no")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="log_dir must be a path"):
        meshio_host.spawn_procs(log_dir=3)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="cannot go with log_records=False"):
        meshio_host.spawn_procs(log_records=False, log_dir="logs")


async def test_unpicklable_argument_is_formatted_first(
        procs: meshio.ProcMesh, mine: Records) -> None:
    talk = await procs.spawn("talk", Talk)
    await talk.slice(procs=0).unpicklable.call_one()
    [record] = await mine.until(1)
    assert record.getMessage().startswith("holding <unlocked _thread.lock object at 0x")
    assert record.args is None
    assert record.tag == "kept"  # type: ignore[attr-defined]
    assert record.handle.startswith("<unlocked _thread.lock")  # type: ignore[attr-defined]
    assert (record.actor, record.rank) == ("talk", 0)  # type: ignore[attr-defined]


async def test_a_message_that_does_not_print_arrives_as_text(
        procs: meshio.ProcMesh, mine: Records) -> None:
    """A record whose ``msg % args`` fails, even to ``repr()``, is not lost
    ("--- Logging error ---" in the worker): it arrives with its message
    saying what there was, which the controller's handlers can print."""
    talk = await procs.spawn("talk", Talk)
    await talk.slice(procs=1).unprintable.call_one()
    with_arg, as_msg = await mine.until(2)
    assert with_arg.getMessage() == (
        "'cannot print %s' % (<unprintable Unprintable>,) (RuntimeError: no str)")
    assert as_msg.getMessage() == "<unprintable Unprintable> (RuntimeError: no str)"
    for r in (with_arg, as_msg):
        assert r.args is None
        assert (r.actor, r.rank, r.mesh, r.pid) == (  # type: ignore[attr-defined]
            "talk", 1, "procs", procs.pids[1])
        assert logging.Formatter("%(actor)s[%(rank)s] %(message)s").format(r).startswith(
            "talk[1] <unprintable Unprintable>" if r is as_msg else "talk[1] 'cannot print")


async def test_an_extra_named_like_a_stamp_keeps_the_other_stamps(
        procs: meshio.ProcMesh, mine: Records) -> None:
    """``extra={"mesh": ...}`` (a user's own meaning of the word) is kept,
    and the record still has meshio's other stamps: a controller formatter
    using ``%(actor)s`` prints it."""
    talk = await procs.spawn("talk", Talk)
    await talk.slice(procs=0).extra.call_one({"mesh": "wing.stl"})
    await talk.slice(procs=1).extra.call_one({"rank": "custom", "host": "mine"})
    by_pid = {r.pid: r for r in await mine.until(2)}  # type: ignore[attr-defined]
    first, second = by_pid[procs.pids[0]], by_pid[procs.pids[1]]  # (two processes: any order)
    assert (first.mesh, first.actor, first.rank, first.host, first.pid) == (  # type: ignore[attr-defined]
        "wing.stl", "talk", 0, HOST, procs.pids[0])
    assert (second.mesh, second.actor, second.rank, second.host, second.pid) == (  # type: ignore[attr-defined]
        "procs", "talk", "custom", "mine", procs.pids[1])
    shown = logging.Formatter("%(actor)s pid=%(pid)s host=%(host)s: %(message)s").format(first)
    assert shown == f"talk pid={procs.pids[0]} host={HOST}: with extra ['mesh']"


@pytest.mark.meshio_procs(per_host={"procs": 1})
async def test_a_flood_is_bounded_dropped_counted_and_told_once(
        procs: meshio.ProcMesh, flood: Records, controller_log: LogWatch) -> None:
    talk = await procs.spawn("talk", Talk)
    extra = 500
    await talk.flood.call_one(LOG_BACKLOG + extra, "first")
    await talk.end.call_one("first")  # sent after the flood's records: all are in by then
    records = await flood.until(LOG_BACKLOG + 1)
    assert records[-1].getMessage() == "end first"
    assert [r.getMessage() for r in records[:-1]] == [f"first {i}" for i in range(LOG_BACKLOG)]
    told = await controller_log.wait_for("dropped")
    assert (f"[procs procs=0] (pid {procs.pids[0]}) dropped {extra} logging records: more "
            f"than {LOG_BACKLOG} waited to be sent") in told
    [p] = (await meshio.stats()).proc_meshes[0].processes
    assert p.log_records_dropped == extra

    await talk.flood.call_one(LOG_BACKLOG + extra, "second")
    await talk.end.call_one("second")
    records = await flood.until(2 * LOG_BACKLOG + 2)
    assert records[-1].getMessage() == "end second" and len(records) == 2 * LOG_BACKLOG + 2
    [p] = (await meshio.stats()).proc_meshes[0].processes
    assert p.log_records_dropped == 2 * extra
    assert len([m for m in controller_log.messages if "dropped" in m]) == 1  # said once


CONTROLLER = """
import logging, meshio
from meshio import Actor, endpoint

class Talk(Actor):
    @endpoint
    async def say(self) -> None:
        logging.getLogger("mine").warning("unconfigured says hi")

async def main() -> None:
    async with meshio.this_host().spawn_procs(per_host={"procs": 2}) as procs:
        talk = await procs.spawn("talk", Talk)
        await talk.say.call()
        await talk.say.call()  # (the first call's records are in before its reply is used)

meshio.run(main())
"""


def test_without_handlers_records_print_like_worker_output(tmp_path: Path) -> None:
    """A controller that configured no logging prints a worker's records
    as it printed its output: after the worker's label."""
    script = tmp_path / "controller.py"
    script.write_text(CONTROLLER)
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                         timeout=GUARD, check=True)
    lines = out.stderr.splitlines()
    for rank in (0, 1):
        assert lines.count(f"[procs procs={rank}] unconfigured says hi") == 2, out.stderr
