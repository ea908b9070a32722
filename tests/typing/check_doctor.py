"""Type inference of ``meshio.doctor`` and ``meshio.DoctorCheck``.

Checked by ``mypy --strict tests/typing/`` and ``pyright`` (strict), never
run.  Each ``assert_type`` line is a claim about what the checker infers;
each ``# type: ignore[code]`` line is an error it must report.
"""

# pyright: reportUnnecessaryTypeIgnoreComment=error

from __future__ import annotations

from typing import Literal, assert_type

import meshio
from meshio import DoctorCheck


async def use() -> None:
    checks = await meshio.doctor()
    assert_type(checks, tuple[DoctorCheck, ...])
    assert_type(await meshio.doctor(timeout=2.0), tuple[DoctorCheck, ...])
    check = checks[0]
    assert_type(check.name, str)
    assert_type(check.status, Literal["ok", "missing", "warning"])
    assert_type(check.detail, str)
    assert_type(check.facts["version"], str | int | float | bool | list[str] | None)
    await meshio.doctor(timeout="5")  # type: ignore[arg-type]
    await meshio.doctor(5.0)  # type: ignore[call-arg]
    check.status = "ok"  # type: ignore[misc]
