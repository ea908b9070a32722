"""Type inference of ``spawn_procs(partition_timeout=...)`` (issue 18 item 9).

Checked by ``mypy --strict tests/typing/`` and ``pyright`` (strict), never
run.  Each ``assert_type`` line is a claim about what the checker infers;
each ``# type: ignore[code]`` line is an error it must report.
"""

# pyright: reportUnnecessaryTypeIgnoreComment=error

from __future__ import annotations

from typing import assert_type

import meshio
from meshio import HostMesh, ProcMesh, SupervisionError


async def use(hosts: HostMesh, sup: meshio.Supervisor) -> None:
    procs = hosts.spawn_procs(partition_timeout=30.0, supervisor=sup)
    assert_type(procs, ProcMesh)
    assert_type(hosts.spawn_procs(partition_timeout=30), ProcMesh)
    assert_type((await procs.wait_failed()).cause, str)
    assert_type(SupervisionError("x", cause="partitioned").host, str)
    hosts.spawn_procs(partition_timeout="30")  # type: ignore[arg-type]
    hosts.spawn_procs(partition_timeout=None)  # type: ignore[arg-type]
