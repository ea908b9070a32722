"""Metrics (issue 19 §2): per endpoint calls, errors, queue and latency
percentiles, per process CPU, memory and restarts, as ``await
meshio.stats()`` (answered by the workers' loops: a busy actor is counted
too) and as Prometheus text from ``meshio.serve_metrics()``."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import signal
import socket
import threading
import urllib.error
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample
from supervision_helpers import W, supervised

import meshio
from meshio import (
    Actor,
    ActorStats,
    Channel,
    EndpointStats,
    Port,
    ProcessStats,
    ProcMeshStats,
    Stats,
    endpoint,
)
from meshio._metrics import WINDOW, Meter
from meshio._prometheus import SLICE, prometheus_text, render

GUARD = 30.0
HOST = socket.gethostname()


class Counted(Actor):
    def __init__(self) -> None:
        self.released = threading.Event()

    @endpoint
    async def work(self, fail: bool) -> int:
        if fail:
            raise ValueError("asked to fail")
        return 1

    @endpoint
    def block(self, started: Port[int]) -> None:
        started.send(meshio.current_rank().rank)
        assert self.released.wait(GUARD)

    @endpoint(concurrent=True)
    async def release(self) -> None:
        self.released.set()


def endpoint_of(snapshot: Stats, actor: str, rank: int, name: str) -> EndpointStats:
    return next(e for _, _, a, e in snapshot.endpoints()
                if a.actor == actor and a.rank == rank and e.endpoint == name)


async def calls(mesh: Counted, n: int, fail_every: int) -> int:
    """``n`` calls of ``work`` on rank 0, every ``fail_every``-th failing; the failures."""
    failed = 0
    for i in range(n):
        try:
            await mesh.slice(procs=0).work.call_one(i % fail_every == 0)
        except meshio.ActorError as e:
            assert e.remote_type == "ValueError"
            failed += 1
    return failed


@pytest.mark.meshio_transports("processes", "in-process")
async def test_stats_count_calls_errors_and_latency(
        procs: meshio.ProcMesh, meshio_transport: str) -> None:
    counted = await procs.spawn("counted", Counted)
    failed = await calls(counted, 30, 4)
    assert failed == 8
    snapshot = await meshio.stats()
    assert isinstance(snapshot, Stats)
    [pm] = snapshot.proc_meshes
    assert pm.name == "procs" and [p.rank for p in pm.processes] == [0, 1]
    work = endpoint_of(snapshot, "counted", 0, "Counted.work")
    assert (work.calls, work.errors, work.queued, work.running) == (30, 8, 0, 0)
    assert work.p50 is not None and work.p90 is not None and work.p99 is not None
    assert 0 < work.p50 <= work.p90 <= work.p99 <= work.seconds
    idle = endpoint_of(snapshot, "counted", 1, "Counted.work")
    assert (idle.calls, idle.errors, idle.p50, idle.seconds) == (0, 0, None, 0.0)
    for p in pm.processes:
        assert p.error is None and p.restarts == 0 and p.host == HOST
        assert p.pid == (procs.pids[p.rank] if meshio_transport == "processes" else os.getpid())
        assert p.cpu_user > 0 and p.cpu_seconds == p.cpu_user + p.cpu_system
        assert p.rss > 1 << 20
        assert p.point == {"procs": p.rank}
        [a] = p.actors
        assert (a.actor, a.rank, a.point, a.queued) == ("counted", p.rank, p.point, 0)
        assert [e.endpoint for e in a.endpoints] == [
            "Counted.block", "Counted.release", "Counted.work"]
    with pytest.raises(dataclasses.FrozenInstanceError):
        work.calls = 0  # type: ignore[misc]
    assert '"endpoint":"Counted.work","calls":30,"errors":8' in snapshot.json()


async def test_a_busy_actor_answers_with_its_queue(procs: meshio.ProcMesh) -> None:
    counted = await procs.spawn("counted", Counted)
    one = counted.slice(procs=0)
    port, started = Channel[int].open()
    blocked = asyncio.ensure_future(one.block.call_one(port))
    try:
        async with asyncio.timeout(GUARD):
            assert await started.recv() == 0  # the def endpoint runs, blocked
            waiting = [asyncio.ensure_future(one.work.call_one(False)) for _ in range(3)]
            # (sent before the request for stats, on the same connection)
            snapshot = await meshio.stats()
            block = endpoint_of(snapshot, "counted", 0, "Counted.block")
            work = endpoint_of(snapshot, "counted", 0, "Counted.work")
            assert (block.running, block.queued, block.calls) == (1, 0, 0)
            assert (work.running, work.queued, work.calls) == (0, 3, 0)
            [actor] = snapshot.proc_meshes[0].processes[0].actors
            assert actor.queued == 3
            await one.release.call_one()
            assert await asyncio.gather(*waiting) == [1, 1, 1]
            await blocked
    finally:
        blocked.cancel()
    snapshot = await meshio.stats()
    block = endpoint_of(snapshot, "counted", 0, "Counted.block")
    work = endpoint_of(snapshot, "counted", 0, "Counted.work")
    assert (block.running, block.calls, work.queued, work.calls) == (0, 1, 0, 3)


async def test_restarts_after_a_sigkill_under_a_supervisor() -> None:
    async with supervised(2) as s:
        await s.procs.spawn("w", W, 1)
        os.kill(s.old[1], signal.SIGKILL)
        _, restart = await s.restarted(1)
        snapshot = await meshio.stats()
        [pm] = snapshot.proc_meshes
        assert [(p.rank, p.restarts, p.pid) for p in pm.processes] == [
            (0, 0, s.old[0]), (1, 1, restart.pid)]
        assert all(p.error is None and [a.actor for a in p.actors] == ["w"]
                   for p in pm.processes)  # the actor was rebuilt in the new process


async def test_a_stopped_process_is_named_and_the_others_answer(
        procs: meshio.ProcMesh) -> None:
    await procs.spawn("counted", Counted)
    pid = procs.pids[1]
    os.kill(pid, signal.SIGSTOP)
    try:
        snapshot = await meshio.stats(timeout=2.0)
    finally:
        os.kill(pid, signal.SIGCONT)
    stopped = snapshot.proc_meshes[0].processes[1]
    assert stopped.error is not None and "did not answer within 2 s" in stopped.error
    assert (stopped.pid, stopped.actors, stopped.rss) == (pid, (), 0)


async def test_stats_without_proc_meshes_and_bad_timeouts() -> None:
    assert await meshio.stats() == Stats(())
    for bad in (0, -1.0, float("nan")):
        with pytest.raises(ValueError, match=r"stats\(timeout=...\) must be seconds > 0"):
            await meshio.stats(timeout=bad)
    with pytest.raises(TypeError, match=r"stats\(timeout=...\) must be a number of seconds"):
        await meshio.stats(timeout=True)


def test_meter_window_is_bounded_and_its_percentiles_nearest_rank() -> None:
    meter = Meter()
    assert meter.percentiles() is None
    for i in range(1, 101):
        meter.record(i / 1000, i % 10 == 0)
    assert (meter.calls, meter.errors) == (100, 10)
    assert meter.percentiles() == (0.05, 0.09, 0.099)
    for _ in range(WINDOW):  # the old calls leave the window
        meter.record(1.0, False)
    assert meter.percentiles() == (1.0, 1.0, 1.0) and len(meter.window) == WINDOW
    assert meter.calls == 100 + WINDOW


def fetch(url: str) -> tuple[int, str, str]:
    try:
        with urllib.request.urlopen(url, timeout=GUARD) as r:
            return r.status, r.headers["Content-Type"], r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.headers["Content-Type"], e.read().decode()


def samples(text: str) -> dict[str, list[Sample]]:
    return {f.name: f.samples for f in text_string_to_metric_families(text)}


async def test_prometheus_scrape_over_http(procs: meshio.ProcMesh) -> None:
    counted = await procs.spawn("counted", Counted)
    failed = await calls(counted, 10, 5)
    async with meshio.serve_metrics(port=0) as server:
        assert isinstance(server, meshio.MetricsServer) and server.port > 0
        assert server.url == f"http://127.0.0.1:{server.port}/metrics"
        status, ctype, text = await asyncio.to_thread(fetch, server.url)
        assert status == 200 and ctype.startswith("text/plain; version=0.0.4")
        got = samples(text)
        [mesh_id] = {s.labels["mesh_id"] for family in got.values() for s in family}
        assert mesh_id.startswith("procs-") and len(mesh_id) == len("procs-") + 8
        where = {"mesh": "procs", "mesh_id": mesh_id, "proc": "0", "host": HOST}
        labels = {**where, "actor": "counted", "rank": "0", "endpoint": "Counted.work"}

        def value(name: str, **extra: str) -> float:
            return next(s.value for family in got.values() for s in family
                        if s.name == name and s.labels == {**labels, **extra})

        assert value("meshio_endpoint_calls_total") == 10
        assert value("meshio_endpoint_errors_total") == failed == 2
        assert value("meshio_endpoint_queued") == 0
        assert value("meshio_endpoint_running") == 0
        assert value("meshio_endpoint_latency_seconds_count") == 10
        quantiles = [value("meshio_endpoint_latency_seconds", quantile=q)
                     for q in ("0.5", "0.9", "0.99")]
        assert 0 < quantiles[0] <= quantiles[1] <= quantiles[2]
        assert value("meshio_endpoint_latency_seconds_sum") >= quantiles[2]
        by_proc = {name: {tuple(sorted(s.labels.items())): s.value for s in got[name]}
                   for name in ("meshio_process_up", "meshio_process_cpu_seconds",
                                "meshio_process_resident_memory_bytes",
                                "meshio_process_restarts",
                                "meshio_process_log_records_dropped")}
        key = tuple(sorted(where.items()))
        assert by_proc["meshio_process_up"][key] == 1
        assert by_proc["meshio_process_restarts"][key] == 0
        assert by_proc["meshio_process_log_records_dropped"][key] == 0
        assert by_proc["meshio_process_resident_memory_bytes"][key] > 1 << 20
        assert by_proc["meshio_process_cpu_seconds"][
            tuple(sorted({**where, "mode": "user"}.items()))] > 0
        assert len(by_proc["meshio_process_up"]) == 2  # both processes

        status, _, text = await asyncio.to_thread(fetch, server.url.replace("/metrics", "/"))
        assert (status, text) == (404, "see /metrics\n")
        url = server.url
    with pytest.raises(urllib.error.URLError):  # closed: nobody listens there
        await asyncio.to_thread(fetch, url)
    await server.aclose()  # idempotent


async def test_serve_metrics_checks_its_arguments() -> None:
    with pytest.raises(TypeError, match="port must be an int"):
        meshio.serve_metrics(port="9100")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"port must be in 0\.\.65535"):
        meshio.serve_metrics(port=70000)
    with pytest.raises(TypeError, match="host must be a str"):
        meshio.serve_metrics(host=None)  # type: ignore[arg-type]
    async with meshio.serve_metrics() as server:
        with pytest.raises(OSError):  # in use
            meshio.serve_metrics(port=server.port)


def test_serve_metrics_needs_a_running_loop() -> None:
    with pytest.raises(RuntimeError, match="call it in async code"):
        meshio.serve_metrics()


async def test_proc_meshes_of_one_name_are_told_apart_by_mesh_id() -> None:
    host = meshio.this_host()
    async with host.spawn_procs(per_host={"procs": 1}) as one, \
            host.spawn_procs(per_host={"procs": 1}) as two:  # both named "procs"
        first = await one.spawn("counted", Counted)
        second = await two.spawn("counted", Counted)
        assert await first.work.call_one(False) == 1
        for _ in range(3):
            assert await second.work.call_one(False) == 1
        async with meshio.serve_metrics(port=0) as server:
            status, _, text = await asyncio.to_thread(fetch, server.url)
    assert status == 200
    got = samples(text)
    # no two samples of a scrape may have one name and one label set
    series = [(s.name, tuple(sorted(s.labels.items()))) for f in got.values() for s in f]
    assert len(series) == len(set(series)), sorted(series)
    by_id = {s.labels["mesh_id"]: s.value for s in got["meshio_endpoint_calls"]
             if s.labels["endpoint"] == "Counted.work"}
    assert sorted(by_id.values()) == [1.0, 3.0], by_id
    assert all(i.startswith("procs-") for i in by_id)
    up = {(s.labels["mesh"], s.labels["mesh_id"]): s.value for s in got["meshio_process_up"]}
    assert up == {("procs", i): 1.0 for i in by_id}


def test_prometheus_text_replaces_what_utf8_cannot_encode() -> None:
    # (a host name or an actor's name from bytes that were not UTF-8)
    endpoint_stats = EndpointStats("W.step", 1, 0, 0, 0, 0.5, 0.5, 0.5, 0.5)
    actor = ActorStats("caf\udce9", 0, {"procs": 0}, 0, 0, (endpoint_stats,))
    process = ProcessStats(0, {"procs": 0}, "host\ud800", 1, 0, 1.0, 0.0, 1 << 20, 0,
                           (actor,))
    text = prometheus_text(Stats((ProcMeshStats("procs", (process,), "procs-0123abcd"),)))
    [calls] = samples(text.decode())["meshio_endpoint_calls"]
    assert calls.labels == {"mesh": "procs", "mesh_id": "procs-0123abcd", "proc": "0",
                            "host": "host\\ud800", "actor": "caf\\xe9", "rank": "0",
                            "endpoint": "W.step"}
    assert calls.value == 1


def test_prometheus_text_escapes_labels_and_writes_every_sample() -> None:
    # what Prometheus reads back: each family once, every sample with its
    # labels unescaped (quote, backslash, newline), a process that did not
    # answer only up and restarts, an endpoint never called no quantiles
    step = EndpointStats("W.step", 3, 1, 2, 1, 0.75, 0.125, 0.5, 0.5)
    idle = EndpointStats("W.idle", 0, 0, 0, 0, 0.0, None, None, None)
    actor = ActorStats('a"b\\c\nd', 1, {"procs": 1}, 2, 0, (step, idle))
    alive = ProcessStats(1, {"procs": 1}, "h1", 7, 2, 1.5, 0.25, 123456789012, 4, (actor,))
    gone = ProcessStats(0, {"procs": 0}, "h0", 6, 0, 0.0, 0.0, 0, 0, (), "gone")
    other = ProcessStats(0, {"procs": 0}, "h2", 8, 0, 0.5, 0.5, 1, 0, ())
    text = prometheus_text(Stats((ProcMeshStats("procs", (gone, alive), "procs-0123abcd"),
                                  ProcMeshStats("x", (other,), "x-89abcdef")))).decode()
    families = list(text_string_to_metric_families(text))
    got = {f.name: {(s.name, tuple(sorted(s.labels.items()))): s.value for s in f.samples}
           for f in families}
    assert len(families) == len(got) == 10
    where = {"mesh": "procs", "mesh_id": "procs-0123abcd", "proc": "1", "host": "h1"}
    ep = {**where, "actor": 'a"b\\c\nd', "rank": "1"}

    def key(name: str, **labels: str) -> tuple[str, tuple[tuple[str, str], ...]]:
        return name, tuple(sorted(labels.items()))

    latency = {key("meshio_endpoint_latency_seconds", **ep, endpoint="W.step", quantile=q): v
               for q, v in (("0.5", 0.125), ("0.9", 0.5), ("0.99", 0.5))}
    for e, seconds in ((step, 0.75), (idle, 0.0)):
        latency[key("meshio_endpoint_latency_seconds_sum", **ep, endpoint=e.endpoint)] = seconds
        latency[key("meshio_endpoint_latency_seconds_count", **ep, endpoint=e.endpoint)] = e.calls
    assert got["meshio_endpoint_latency_seconds"] == latency
    for family, field in (("calls", "calls"), ("errors", "errors"), ("queued", "queued"),
                          ("running", "running")):
        total = "_total" if family in ("calls", "errors") else ""
        name = f"meshio_endpoint_{family}{total}"
        assert got[f"meshio_endpoint_{family}"] == {
            key(name, **ep, endpoint=e.endpoint): getattr(e, field) for e in (step, idle)}
    gone_at = {**where, "proc": "0", "host": "h0"}
    other_at = {"mesh": "x", "mesh_id": "x-89abcdef", "proc": "0", "host": "h2"}
    assert got["meshio_process_up"] == {key("meshio_process_up", **gone_at): 0,
                                        key("meshio_process_up", **where): 1,
                                        key("meshio_process_up", **other_at): 1}
    assert got["meshio_process_restarts"] == {
        key("meshio_process_restarts_total", **gone_at): 0,
        key("meshio_process_restarts_total", **where): 2,
        key("meshio_process_restarts_total", **other_at): 0}
    assert got["meshio_process_cpu_seconds"] == {
        key("meshio_process_cpu_seconds_total", **where, mode="user"): 1.5,
        key("meshio_process_cpu_seconds_total", **where, mode="system"): 0.25,
        key("meshio_process_cpu_seconds_total", **other_at, mode="user"): 0.5,
        key("meshio_process_cpu_seconds_total", **other_at, mode="system"): 0.5}
    assert got["meshio_process_resident_memory_bytes"] == {
        key("meshio_process_resident_memory_bytes", **where): 123456789012,
        key("meshio_process_resident_memory_bytes", **other_at): 1}
    assert got["meshio_process_log_records_dropped"] == {
        key("meshio_process_log_records_dropped_total", **where): 4,
        key("meshio_process_log_records_dropped_total", **other_at): 0}


async def test_render_lets_the_loop_run_between_slices() -> None:
    # a scrape of a job of thousands of actors must not hold the controller's
    # loop for the whole text: it returns to the loop after each SLICE
    endpoints = tuple(EndpointStats(f"W.e{i}", 1, 0, 0, 0, 0.5, 0.5, 0.5, 0.5)
                      for i in range(10))
    actors = tuple(ActorStats(f"m{i}", 0, {"procs": 0}, 0, 0, endpoints)
                   for i in range(SLICE * 4 // len(endpoints)))
    process = ProcessStats(0, {"procs": 0}, "h", 1, 0, 1.0, 0.0, 1, 0, actors)
    snapshot = Stats((ProcMeshStats("procs", (process,), "procs-0123abcd"),))
    loop = asyncio.get_running_loop()
    turns = 0
    rendering = True

    def turn() -> None:  # once per turn of the loop while rendering
        nonlocal turns
        turns += 1
        if rendering:
            loop.call_soon(turn)

    loop.call_soon(turn)
    body = await render(snapshot)
    rendering = False
    assert turns >= 4
    assert body == prometheus_text(snapshot)
    calls = samples(body.decode())["meshio_endpoint_calls"]
    assert len(calls) == len(actors) * len(endpoints)


def test_process_stats_cpu_seconds_adds_user_and_system() -> None:
    p = ProcessStats(0, {}, "h", 1, 0, 1.5, 0.25, 0, 0, ())
    assert p.cpu_seconds == 1.75


def test_stats_print_and_show_in_a_notebook_as_one_readable_tree() -> None:
    """``print(stats)``, ``str(stats)`` and what IPython shows for ``await
    meshio.stats()`` as a cell's last line are the same short tree (IPython
    showed a dump of the dataclasses, thousands of characters on one line)."""
    pretty = pytest.importorskip("IPython.lib.pretty").pretty
    work = EndpointStats("Counted.work", 30, 8, 2, 1, 0.5, 0.000123, 0.0456, 1.5)
    idle = EndpointStats("Counted.idle", 1, 0, 0, 0, 0.25, 0.25, 0.25, 0.25)
    never = EndpointStats("Counted.never", 0, 0, 0, 0, 0.0, None, None, None)
    answered = ProcessStats(0, {"procs": 0}, "h", 41, 2, 1.0, 0.25, 3 * 2**20, 5, (
        ActorStats("counted", 0, {"procs": 0}, 3, 4, (work, idle, never)),))
    stopped = ProcessStats(1, {"procs": 1}, "h", 42, 0, 0.0, 0.0, 0, 0, (),
                           "proc mesh 'procs' rank 1 (pid 42) did not answer within 2 s")
    stats = Stats((ProcMeshStats("procs", (answered, stopped), "procs-1a2b3c4d"),))
    assert str(stats).splitlines() == [
        "proc mesh 'procs' (procs-1a2b3c4d)",
        "  rank 0 (pid 41 on h): cpu 1.25 s, rss 3.0 MiB, restarts 2, log records dropped 5",
        "    counted rank 0, 3 queued, 4 expired",
        "      Counted.work: 30 calls, 8 raised, 2 queued, 1 running, p50 0.123 ms, "
        "p90 45.6 ms, p99 1.5 s",
        "      Counted.idle: 1 call, p50 250 ms, p90 250 ms, p99 250 ms",
        "      Counted.never: 0 calls",
        "  rank 1 (pid 42 on h): error: proc mesh 'procs' rank 1 (pid 42) did not answer "
        "within 2 s",
    ]
    assert pretty(stats) == str(stats).rstrip("\n") == stats.text().rstrip("\n")
    assert str(Stats(())) == "no proc meshes\n"
    assert repr(stats).startswith("Stats(proc_meshes=(ProcMeshStats(")  # (unchanged)
