"""Restart strategies: one_for_all restarts every process of its children,
rest_for_one the failed one and every child declared after it."""

from __future__ import annotations

import os
import signal

from supervision_helpers import Events, W, manual_sup, supervised

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
