"""``ValueMesh``: the gathered results of a call, one value per point."""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar, Generic, TypeVar, cast

from ._extent import MeshShape, Point, Region

__all__ = ("ValueMesh",)

R = TypeVar("R")


class ValueMesh(MeshShape, Generic[R]):
    """One value per point of a mesh, with the mesh's named dims.

    Slicing, flattening and renaming work as on any mesh.
    """

    __slots__ = ("_region", "_values")

    def __init__(self, region: Region, values: Sequence[R]) -> None:
        if len(values) != len(region.ranks):
            raise ValueError(f"ValueMesh: {len(values)} values for {len(region.ranks)} points")
        self._region = region
        self._values: list[R] = list(values)

    def _with_region(self, region: Region) -> ValueMesh[R]:
        by_rank = dict(zip(self._region.ranks, self._values))
        return ValueMesh(region, [by_rank[r] for r in region.ranks])

    def values(self) -> list[R]:
        """The values, in row-major point order."""
        return list(self._values)

    def items(self) -> list[tuple[Point, R]]:
        """``(point, value)`` pairs, in row-major point order."""
        return list(zip(self._region.points(), self._values))

    def item(self, **coords: int) -> R:
        """The value at ``coords`` (dims of size 1 may be left out)."""
        return self._values[self._region.index(coords)]

    def __repr__(self) -> str:
        inner = ", ".join(f"{dict(p)}: {v!r}" for p, v in self.items()[:8])
        more = ", ..." if len(self) > 8 else ""
        return f"ValueMesh({self.sizes}, {{{inner}{more}}})"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ValueMesh):
            return NotImplemented
        that = cast("ValueMesh[object]", other)
        return self.extent == that.extent and self._values == that._values

    __hash__: ClassVar[None] = None  # type: ignore[assignment]  # unhashable, like a list
