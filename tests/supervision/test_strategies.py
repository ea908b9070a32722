"""Restart strategies: one_for_all restarts every process of its children,
rest_for_one the failed one and every child declared after it."""

from __future__ import annotations

import asyncio
import functools
import os
import signal
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from supervision_helpers import DEADLINE, Events, W, manual_sup, supervised

import meshio


async def test_one_for_all_restarts_every_process() -> None:
    async with supervised(3, "one_for_all") as s:
        w = await s.procs.spawn("w", W, 2)
        os.kill(s.old[1], signal.SIGKILL)
        await s.events.until(lambda e: e.kind == "restart" and e.rank == 2)
        # the others stopped in reverse order, then all started in order
        assert s.events.kinds() == [
            ("failure", "procs", 1), ("stopped", "procs", 2), ("stopped", "procs", 0),
            ("restart", "procs", 0), ("restart", "procs", 1), ("restart", "procs", 2)]
        new = s.procs.pids
        assert not set(new) & set(s.old)
        assert [e.pid for e in s.events.seen if e.kind == "restart"] == new
        # each stopped event names the process it stopped (they had pid -1)
        assert [(e.pid, e.host) for e in s.events.seen if e.kind == "stopped"] == [
            (s.old[2], s.events.seen[0].host), (s.old[0], s.events.seen[0].host)]
        info = (await w.info.call()).values()
        assert [(k, r, n, pid) for k, _, r, _, n, pid in info] == [
            (2, r, 1, new[r]) for r in range(3)]


async def test_rest_for_one_restarts_failed_and_later_children() -> None:
    sup, _ = manual_sup("rest_for_one", max_restarts=10)
    host = meshio.this_host()
    async with Events(sup) as events, \
            host.spawn_procs(per_host={"procs": 2}, supervisor=sup, name="a") as a, \
            host.spawn_procs(per_host={"procs": 2}, supervisor=sup, name="b") as b:
        wa = await a.spawn("wa", W, 1)
        wb = await b.spawn("wb", W, 2)
        a0, b0 = a.pids, b.pids

        # a failure in the first mesh restarts it and the one declared after it
        os.kill(a0[0], signal.SIGKILL)
        await events.next("restart", rank=1, mesh="b")
        assert events.kinds() == [
            ("failure", "a", 0), ("stopped", "b", 1), ("stopped", "b", 0), ("stopped", "a", 1),
            ("restart", "a", 0), ("restart", "a", 1), ("restart", "b", 0), ("restart", "b", 1)]
        a1, b1 = a.pids, b.pids
        assert not set(a1) & set(a0) and not set(b1) & set(b0)

        # a failure in the second restarts only the second (from that rank on)
        del events.seen[:]
        os.kill(b1[0], signal.SIGKILL)
        await events.next("restart", rank=1, mesh="b")
        assert events.kinds() == [("failure", "b", 0), ("stopped", "b", 1),
                                  ("restart", "b", 0), ("restart", "b", 1)]
        assert a.pids == a1 and not set(b.pids) & set(b1)

        # the last one: only itself
        del events.seen[:]
        b2 = b.pids
        os.kill(b2[1], signal.SIGKILL)
        await events.next("restart", rank=1, mesh="b")
        assert events.kinds() == [("failure", "b", 1), ("restart", "b", 1)]
        assert a.pids == a1 and b.pids[0] == b2[0] and b.pids[1] != b2[1]
        assert (await wa.echo.call(1)).values() == [(0, 1), (1, 1)]
        assert (await wb.echo.call(2)).values() == [(0, 2), (1, 2)]


def gang_barrier(flag: str, path: str) -> None:
    """A bootstrap (pickled by reference): once ``flag`` exists, the process
    tells the barrier at ``path`` its pid and waits for every replacement of
    its gang to have done so (a gang started one process at a time never
    gets past it: the first one gives up after DEADLINE seconds)."""
    if not os.path.exists(flag):
        return
    with socket.socket(socket.AF_UNIX) as s:
        s.settimeout(DEADLINE)
        s.connect(path)
        s.sendall(f"{os.getpid()}\n".encode())
        if s.recv(2) != b"go":
            raise RuntimeError("the gang barrier closed before every replacement had started")


@asynccontextmanager
async def barrier(path: Path, n: int) -> AsyncIterator[list[int]]:
    """The other side of :func:`gang_barrier`: once ``n`` processes wait,
    all go on; yields the pids they gave, in arrival order."""
    pids: list[int] = []
    writers: list[asyncio.StreamWriter] = []

    async def arrive(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        pids.append(int(await reader.readline()))
        writers.append(writer)
        if len(writers) == n:
            for w in writers:
                w.write(b"go")
                await w.drain()
                w.close()

    server = await asyncio.start_unix_server(arrive, str(path))
    async with server:
        yield pids


async def test_one_for_all_restarts_the_gang_together(tmp_path: Path) -> None:
    """The replacements of a one_for_all gang start together: each one's
    bootstrap waits for all the others to be started (one at a time, the
    first would wait forever); ``procs.ready()`` returns once all are up."""
    flag, path = tmp_path / "flag", tmp_path / "barrier"
    sup, _ = manual_sup("one_for_all")
    async with Events(sup) as events, barrier(path, 3) as arrived, \
            meshio.this_host().spawn_procs(
                per_host={"procs": 3}, supervisor=sup,
                bootstrap=functools.partial(gang_barrier, str(flag), str(path))) as procs:
        w = await procs.spawn("w", W, 2)
        old = procs.pids
        flag.touch()
        os.kill(old[0], signal.SIGKILL)
        await events.next("restart", rank=2)
        await asyncio.wait_for(procs.ready(), DEADLINE)
        new = procs.pids
        assert sorted(arrived) == sorted(new) and not set(new) & set(old)
        assert events.kinds() == [
            ("failure", "procs", 0), ("stopped", "procs", 2), ("stopped", "procs", 1),
            ("restart", "procs", 0), ("restart", "procs", 1), ("restart", "procs", 2)]
        assert [e.pid for e in events.seen if e.kind == "restart"] == new
        assert (await w.pid.call()).values() == new
