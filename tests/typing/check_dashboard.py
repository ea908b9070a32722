"""Type inference of ``meshio.serve_dashboard()`` and its server.

Checked by ``mypy --strict tests/typing/`` and ``pyright`` (strict), never
run; see ``check_endpoints.py``.
"""

# pyright: reportUnnecessaryTypeIgnoreComment=error

from __future__ import annotations

from typing import assert_type

import meshio
from meshio import DashboardServer


async def use() -> None:
    server = meshio.serve_dashboard(port=8265)
    assert_type(server, DashboardServer)
    assert_type(server.url, str)
    assert_type(server.token, str)
    assert_type(server.host, str)
    assert_type(server.port, int)
    await server.aclose()
    async with meshio.serve_dashboard(port=0, host="0.0.0.0") as served:
        assert_type(served, DashboardServer)
    async with meshio.serve_metrics() as metrics:
        assert_type(metrics, meshio.MetricsServer)
    meshio.serve_dashboard(port="8265")  # type: ignore[arg-type]
    meshio.serve_dashboard(8265, "127.0.0.1", 1.0)  # type: ignore[call-arg]
