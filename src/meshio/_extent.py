"""Named N-dimensional shapes: ``Extent``, ``Point`` and the region algebra
(``slice``/``flatten``/``rename``) shared by host, proc, actor and value meshes."""

from __future__ import annotations

import builtins
import functools
import itertools
import math
from collections.abc import Iterator, Mapping, Sequence
from keyword import iskeyword
from typing import Any, TypeVar

__all__ = ("Extent", "MeshShape", "Point", "Region")

_S = TypeVar("_S", bound="MeshShape")


class Extent(Mapping[str, int]):
    """Read-only mapping of dimension name → size, in dimension order.

    ``len(extent)`` is the number of dimensions; ``extent.nelem`` the number of
    points.
    """

    __slots__ = ("_labels", "_sizes")

    def __init__(self, labels: Sequence[str], sizes: Sequence[int]) -> None:
        if len(labels) != len(sizes):
            raise ValueError(f"extent: {len(labels)} labels for {len(sizes)} sizes")
        if len(set(labels)) != len(labels):
            raise ValueError(f"extent: duplicate dimension names in {list(labels)}")
        for label in labels:  # (``mesh.slice(gpus=0)`` takes them; point.rank: the flat index)
            if not isinstance(label, str) or not label.isidentifier() or iskeyword(label) \
                    or label == "rank":
                raise ValueError(f"extent: a dimension name must be a Python identifier (not a "
                                 f"keyword) other than 'rank', got {label!r} in {list(labels)}")
        for label, size in zip(labels, sizes):
            if not isinstance(size, int) or isinstance(size, bool) or size < 0:
                raise ValueError(f"extent: size of {label!r} must be an int >= 0, got {size!r}")
        self._labels = tuple(labels)
        self._sizes = tuple(sizes)

    @property
    def labels(self) -> tuple[str, ...]:
        return self._labels

    @property
    def sizes(self) -> tuple[int, ...]:
        return self._sizes

    @property
    def nelem(self) -> int:
        return math.prod(self._sizes)

    def __getitem__(self, key: str) -> int:
        try:
            return self._sizes[self._labels.index(key)]
        except ValueError:
            raise KeyError(key) from None

    def __iter__(self) -> Iterator[str]:
        return iter(self._labels)

    def __len__(self) -> int:
        return len(self._labels)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Extent):
            return self._labels == other._labels and self._sizes == other._sizes
        return super().__eq__(other)

    def __hash__(self) -> int:
        return hash((self._labels, self._sizes))

    def __repr__(self) -> str:
        return f"Extent({dict(zip(self._labels, self._sizes))})"


class Point(Mapping[str, int]):
    """A coordinate in a mesh: read-only mapping of dimension name → index.

    ``dict(point)`` gives the coordinates; ``point.rank`` is the flat
    (row-major) index of the point in its mesh.
    """

    __slots__ = ("_coords", "_extent", "_rank")

    def __init__(self, extent: Extent, coords: Sequence[int], rank: int) -> None:
        self._extent = extent
        self._coords = tuple(coords)
        self._rank = rank

    @property
    def rank(self) -> int:
        return self._rank

    @property
    def extent(self) -> Extent:
        return self._extent

    @property
    def coords(self) -> tuple[int, ...]:
        return self._coords

    def __getitem__(self, key: str) -> int:
        try:
            return self._coords[self._extent.labels.index(key)]
        except ValueError:
            raise KeyError(key) from None

    def __iter__(self) -> Iterator[str]:
        return iter(self._extent.labels)

    def __len__(self) -> int:
        return len(self._coords)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Point):
            return self._coords == other._coords and self._extent.labels == other._extent.labels
        return super().__eq__(other)

    def __hash__(self) -> int:
        return hash((self._extent.labels, self._coords))

    def __repr__(self) -> str:
        inner = "".join(f"{k}={v}, " for k, v in zip(self._extent.labels, self._coords))
        return f"Point({inner}rank={self._rank})"

    def __reduce__(self) -> tuple[Any, ...]:
        return (_point, (self._extent.labels, self._extent.sizes, self._coords, self._rank))


def _point(labels: Sequence[str], sizes: Sequence[int], coords: Sequence[int], rank: int) -> Point:
    return Point(Extent(labels, sizes), coords, rank)


class Region:
    """A view of a mesh: named dims over a row-major list of *global* ranks.

    Global ranks index the underlying proc mesh; slicing keeps them, so an
    actor keeps its identity whichever view it is reached through.
    """

    __slots__ = ("extent", "ranks")

    def __init__(self, extent: Extent, ranks: Sequence[int]) -> None:
        if len(ranks) != extent.nelem:
            raise ValueError(f"region: {len(ranks)} ranks for {extent}")
        self.extent: Extent = extent
        self.ranks: tuple[int, ...] = tuple(ranks)

    @classmethod
    def full(cls, labels: Sequence[str], sizes: Sequence[int]) -> Region:
        extent = Extent(labels, sizes)
        return cls(extent, shared_ranks(((0, extent.nelem),)))

    def _where(self, what: str) -> str:
        return f"{what} on a mesh with dims {dict(self.extent)}"

    def slice(self, dims: Mapping[str, int | builtins.slice]) -> Region:
        labels, sizes = self.extent.labels, self.extent.sizes
        unknown = [k for k in dims if k not in labels]
        if unknown:
            raise KeyError(self._where(f"slice: unknown dimension(s) {unknown}"))
        axes: list[range | list[int]] = []
        new_labels: list[str] = []
        new_sizes: list[int] = []
        for label, size in zip(labels, sizes):
            sel = dims.get(label)
            if sel is None or isinstance(sel, builtins.slice):
                axis = range(size) if sel is None else range(*sel.indices(size))
                axes.append(axis)
                new_labels.append(label)
                new_sizes.append(len(axis))
            elif isinstance(sel, int) and not isinstance(sel, bool):
                index = sel + size if sel < 0 else sel
                if not 0 <= index < size:
                    raise IndexError(self._where(f"slice: {label}={sel} out of range"))
                axes.append([index])
            else:
                raise TypeError(
                    self._where(f"slice: {label} must be an int or a slice, got {sel!r}")
                )
        strides = _strides(sizes)
        ranks = [
            self.ranks[sum(i * s for i, s in zip(idx, strides))]
            for idx in itertools.product(*axes)
        ]
        return Region(Extent(new_labels, new_sizes), ranks)

    def flatten(self, name: str) -> Region:
        return Region(Extent((name,), (len(self.ranks),)), self.ranks)

    def rename(self, names: Mapping[str, str]) -> Region:
        labels = self.extent.labels
        unknown = [k for k in names if k not in labels]
        if unknown:
            raise KeyError(self._where(f"rename: unknown dimension(s) {unknown}"))
        return Region(Extent([names.get(x, x) for x in labels], self.extent.sizes), self.ranks)

    def split(self, dim: str, sizes: Mapping[str, int]) -> Region:
        labels, old = self.extent.labels, self.extent.sizes
        if dim not in labels:
            raise KeyError(self._where(f"split: unknown dimension {dim!r}"))
        n = old[labels.index(dim)]
        if not sizes:
            raise ValueError(self._where(f"split {dim!r}: give the new dims, e.g. nodes=2"))
        clash = [k for k in sizes if k in labels and k != dim]
        if clash:
            raise ValueError(self._where(f"split {dim!r}: new dims {clash} already exist"))
        known = math.prod(v for v in sizes.values() if v != -1)
        wild = [k for k, v in sizes.items() if v == -1]
        bad = [k for k, v in sizes.items()
               if not isinstance(v, int) or isinstance(v, bool) or (v < 1 and v != -1)]
        if bad or len(wild) > 1 or known == 0 or n % known or (not wild and known != n):
            raise ValueError(self._where(
                f"split {dim!r} (size {n}) into {dict(sizes)}: sizes must be ints >= 1 whose "
                "product is the dim's size (one of them may be -1)"))
        new = {k: (n // known if v == -1 else v) for k, v in sizes.items()}
        i = labels.index(dim)
        return Region(Extent([*labels[:i], *new, *labels[i + 1:]],
                             [*old[:i], *new.values(), *old[i + 1:]]), self.ranks)

    def points(self) -> Iterator[Point]:
        extent = self.extent
        for rank, coords in enumerate(itertools.product(*(range(s) for s in extent.sizes))):
            yield Point(extent, coords, rank)

    def point(self, index: int) -> Point:
        coords: list[int] = []
        rest = index
        for stride in _strides(self.extent.sizes):
            coords.append(rest // stride)
            rest %= stride
        return Point(self.extent, coords, index)

    def index(self, coords: Mapping[str, int]) -> int:
        labels, sizes = self.extent.labels, self.extent.sizes
        unknown = [k for k in coords if k not in labels]
        missing = [k for k, s in zip(labels, sizes) if k not in coords and s != 1]
        if unknown or missing:
            raise KeyError(self._where(
                f"coordinates {dict(coords)}: unknown {unknown}, missing {missing}"))
        idx = [coords.get(k, 0) for k in labels]
        for k, i in zip(labels, idx):
            if not isinstance(i, int) or isinstance(i, bool):  # (as slice() has it)
                raise TypeError(self._where(
                    f"coordinates {dict(coords)}: {k} must be an int, got "
                    f"{type(i).__name__} {i!r}"))
        for d, (k, i, s) in enumerate(zip(labels, idx, sizes)):
            if not -s <= i < s:
                raise IndexError(self._where(f"coordinate {k}={i} out of range"))
            idx[d] = i + s if i < 0 else i  # (from the end, as slice() counts)
        return _flat(idx, sizes)


def _strides(sizes: Sequence[int]) -> list[int]:
    strides = [1] * len(sizes)
    for i in range(len(sizes) - 2, -1, -1):
        strides[i] = strides[i + 1] * sizes[i + 1]
    return strides


def _flat(coords: Sequence[int], sizes: Sequence[int]) -> int:
    return sum(c * s for c, s in zip(coords, _strides(sizes)))


class MeshShape:
    """Named-dimension operations shared by every kind of mesh.

    Subclasses hold a :class:`Region` in ``_region`` and implement
    ``_with_region`` to build the same kind of mesh over another view.
    """

    __slots__ = ()
    _region: Region

    def _with_region(self: _S, region: Region) -> _S:
        raise NotImplementedError

    @property
    def extent(self) -> Extent:
        """Dimension names and sizes of this mesh."""
        return self._region.extent

    @property
    def sizes(self) -> dict[str, int]:
        """``{dim: size}`` for every dimension."""
        return dict(self._region.extent)

    def size(self, dim: str | None = None) -> int:
        """Size of ``dim``, or the number of points when ``dim`` is omitted."""
        if dim is None:
            return len(self._region.ranks)
        try:
            return self._region.extent[dim]
        except KeyError:
            raise KeyError(self._region._where(f"size: unknown dimension {dim!r}")) from None

    def __len__(self) -> int:
        return len(self._region.ranks)

    def __iter__(self) -> Iterator[Point]:
        return self._region.points()

    def slice(self: _S, /, **dims: int | builtins.slice) -> _S:
        """Select along named dims: an int drops the dim, a ``slice`` keeps it."""
        return self._with_region(self._region.slice(dims))

    def flatten(self: _S, name: str) -> _S:
        """One dimension called ``name`` with every point, in row-major order."""
        return self._with_region(self._region.flatten(name))

    def rename(self: _S, /, **names: str) -> _S:
        """Rename dims: ``mesh.rename(gpus="workers")``."""
        return self._with_region(self._region.rename(names))

    def split(self: _S, dim: str, /, **sizes: int) -> _S:
        """Split one dim into several, row-major: ``mesh.split("gpus", nodes=2,
        local=4)`` on ``{"gpus": 8}`` gives ``{"nodes": 2, "local": 4}``; one
        size may be ``-1`` (inferred)."""
        return self._with_region(self._region.split(dim, sizes))


def rank_runs(ranks: Sequence[int]) -> tuple[tuple[int, int], ...]:
    """``ranks`` as runs of consecutive ranks, ``(first, count)`` each: a
    whole mesh's ``0 .. n-1`` is one run (what a mesh reference carries,
    so that it stays small however many points the mesh has)."""
    runs: list[tuple[int, int]] = []
    first = count = 0
    for r in ranks:
        if count and r == first + count:
            count += 1
            continue
        if count:
            runs.append((first, count))
        first, count = r, 1
    if count:
        runs.append((first, count))
    return tuple(runs)


@functools.lru_cache(maxsize=32)
def shared_ranks(runs: tuple[tuple[int, int], ...]) -> tuple[int, ...]:
    """The ranks of :func:`rank_runs`' ``runs``, made once per process:
    every reference to the same mesh decoded here (each actor's of its
    own mesh, in-process runtimes all in one process) shares the tuple."""
    return tuple(itertools.chain.from_iterable(range(f, f + c) for f, c in runs))
