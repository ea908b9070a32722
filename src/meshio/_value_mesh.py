"""``ValueMesh``: the gathered results of a call, one value per point."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import ClassVar, Generic, TypeVar, cast

from ._exceptions import SupervisionError
from ._extent import MeshShape, Point, Region

__all__ = ("ValueMesh",)

R = TypeVar("R")


class ValueMesh(MeshShape, Generic[R]):
    """One value per point of a mesh, with the mesh's named dims.

    Slicing, flattening and renaming work as on any mesh.

    A point whose process died with nothing to restart it is a *hole*
    (see "Elastic meshes" in the README): it has no value.  :attr:`holes`
    lists them; :meth:`item` on one raises its :class:`SupervisionError`;
    :meth:`values` and :meth:`items` give the points that answered.
    """

    __slots__ = ("_holes", "_region", "_values")

    def __init__(self, region: Region, values: Sequence[R],
                 holes: Mapping[int, SupervisionError] | None = None) -> None:
        if len(values) != len(region.ranks):
            raise ValueError(f"ValueMesh: {len(values)} values for {len(region.ranks)} points")
        self._region = region
        self._values: list[R] = list(values)
        #: global rank → why it has no value (its value in ``_values`` is a placeholder)
        self._holes: dict[int, SupervisionError] = dict(holes or {})

    def _with_region(self, region: Region) -> ValueMesh[R]:
        by_rank = dict(zip(self._region.ranks, self._values))
        return ValueMesh(region, [by_rank[r] for r in region.ranks],
                         {r: e for r, e in self._holes.items() if r in region.ranks})

    @property
    def holes(self) -> list[Point]:
        """The points without a value, in row-major order: their processes
        died and nothing restarts them (``procs.replace(point)`` fills one),
        or, with no supervisor, their actors were ended by the
        ``SystemExit``/``KeyboardInterrupt`` an endpoint raised."""
        if not self._holes:
            return []
        return [p for p, r in zip(self._region.points(), self._region.ranks) if r in self._holes]

    def values(self) -> list[R]:
        """The values, in row-major point order (holes left out)."""
        if not self._holes:
            return list(self._values)
        return [v for r, v in zip(self._region.ranks, self._values) if r not in self._holes]

    def items(self) -> list[tuple[Point, R]]:
        """``(point, value)`` pairs, in row-major point order (holes left out)."""
        return [(p, v) for p, r, v in zip(self._region.points(), self._region.ranks, self._values)
                if r not in self._holes]

    def item(self, /, **coords: int) -> R:
        """The value at ``coords`` (dims of size 1 may be left out; a
        negative coordinate counts from the end, as in ``slice``).

        Raises:
            SupervisionError: the point is a hole (the error names its rank
                and why its process is gone).
        """
        index = self._region.index(coords)
        hole = self._holes.get(self._region.ranks[index])
        if hole is not None:
            raise hole
        return self._values[index]

    def __repr__(self) -> str:
        shown = [f"{dict(p)}: {'<hole>' if r in self._holes else repr(v)}" for p, r, v
                 in zip(self._region.points(), self._region.ranks, self._values[:8])]
        more = ", ..." if len(self) > 8 else ""
        return f"ValueMesh({self.sizes}, {{{', '.join(shown)}{more}}})"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ValueMesh):
            return NotImplemented
        that = cast("ValueMesh[object]", other)
        return (self.extent == that.extent and self.holes == that.holes
                and self.values() == that.values())

    __hash__: ClassVar[None] = None  # type: ignore[assignment]  # unhashable, like a list
