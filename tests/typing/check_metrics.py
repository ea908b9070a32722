"""Type inference of ``meshio.stats()``, its tree of frozen dataclasses,
``meshio.serve_metrics()`` and the ``spawn_procs`` log options.

Checked by ``mypy --strict tests/typing/`` and ``pyright`` (strict), never
run; see ``check_endpoints.py``.
"""

# pyright: reportUnnecessaryTypeIgnoreComment=error

from __future__ import annotations

from pathlib import Path
from typing import assert_type

import meshio
from meshio import (
    ActorStats,
    EndpointStats,
    MetricsServer,
    ProcessStats,
    ProcMeshStats,
    Stats,
)


async def use() -> None:
    stats = await meshio.stats()
    assert_type(stats, Stats)
    assert_type(await meshio.stats(timeout=2.5), Stats)
    assert_type(stats.proc_meshes, tuple[ProcMeshStats, ...])
    assert_type(stats.json(), str)
    mesh = stats.proc_meshes[0]
    assert_type(mesh.name, str)
    process = mesh.processes[0]
    assert_type(process, ProcessStats)
    assert_type(process.cpu_seconds, float)
    assert_type(process.rss, int)
    assert_type(process.restarts, int)
    assert_type(process.error, str | None)
    actor = process.actors[0]
    assert_type(actor, ActorStats)
    assert_type(actor.point, dict[str, int])
    endpoint = actor.endpoints[0]
    assert_type(endpoint, EndpointStats)
    assert_type(endpoint.calls, int)
    assert_type(endpoint.p99, float | None)
    for pm, p, a, e in stats.endpoints():
        assert_type(pm, ProcMeshStats)
        assert_type(p, ProcessStats)
        assert_type(a, ActorStats)
        assert_type(e, EndpointStats)
    await meshio.stats(1.0)  # type: ignore[call-arg]
    endpoint.calls = 3  # type: ignore[misc]

    server = meshio.serve_metrics(port=9100)
    assert_type(server, MetricsServer)
    assert_type(server.port, int)
    assert_type(server.url, str)
    await server.aclose()
    async with meshio.serve_metrics(port=0, host="127.0.0.1") as served:
        assert_type(served, MetricsServer)
    meshio.serve_metrics(port="9100")  # type: ignore[arg-type]

    host = meshio.this_host()
    host.spawn_procs(log_records=False)
    host.spawn_procs(log_dir=Path("logs"))
    host.spawn_procs(log_dir="logs")
    host.spawn_procs(log_records="off")  # type: ignore[arg-type]
