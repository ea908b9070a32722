"""Named-dimension meshes: Extent, Point, slicing/flattening/renaming, and the
same operations on real proc, actor and value meshes (incl. two-dim meshes)."""

from __future__ import annotations

import os
import pickle
from collections.abc import Mapping

import pytest

import meshio
from meshio import Actor, Extent, Point, ValueMesh, current_rank, endpoint
from meshio._extent import Region

#: these tests hold on both transports: worker processes and in-process
pytestmark = pytest.mark.meshio_transports()

def vm(values: list[object] | None = None, **dims: int) -> ValueMesh[object]:
    """A ValueMesh over a fresh row-major region with ``dims``."""
    region = Region.full(list(dims), list(dims.values()))
    if values is None:
        values = list(range(region.extent.nelem))
    return ValueMesh(region, values)


# ------------------------------------------------------------------ Extent


def test_extent_is_a_mapping_in_dim_order() -> None:
    e = Extent(["hosts", "gpus"], [2, 3])
    assert isinstance(e, Mapping)
    assert list(e) == ["hosts", "gpus"]
    assert dict(e) == {"hosts": 2, "gpus": 3}
    assert e["gpus"] == 3
    assert len(e) == 2
    assert e.nelem == 6
    assert e.labels == ("hosts", "gpus")
    assert e.sizes == (2, 3)
    with pytest.raises(KeyError):
        e["nope"]


def test_extent_equality_and_hash() -> None:
    a = Extent(["x", "y"], [2, 3])
    assert a == Extent(["x", "y"], [2, 3])
    assert a != Extent(["y", "x"], [3, 2])  # order matters
    assert a != Extent(["x", "y"], [2, 4])
    assert hash(a) == hash(Extent(("x", "y"), (2, 3)))
    assert Extent([], []).nelem == 1


@pytest.mark.parametrize(
    ("labels", "sizes", "match"),
    [
        (["x", "x"], [1, 2], "duplicate"),
        (["x"], [1, 2], "labels"),
        (["x"], [-1], "x"),
        (["x"], [1.5], "x"),
        (["x"], [True], "x"),
        # names slice(name=i) cannot take, or that point.rank would hide
        (["x", "rank"], [1, 2], "other than 'rank', got 'rank'"),
        ([""], [1], "identifier"), (["a b"], [1], "identifier"), (["class"], [1], "keyword"),
    ],
)
def test_extent_rejects_bad_shapes(labels: list[str], sizes: list[object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        Extent(labels, sizes)  # type: ignore[arg-type]


# ------------------------------------------------------------------- Point


def test_point_is_a_read_only_mapping_with_rank() -> None:
    e = Extent(["x", "y"], [2, 3])
    p = Point(e, (1, 2), 5)
    assert isinstance(p, Mapping)
    assert dict(p) == {"x": 1, "y": 2}
    assert p["y"] == 2
    assert list(p) == ["x", "y"]
    assert len(p) == 2
    assert p.rank == 5
    assert p.coords == (1, 2)
    assert p.extent == e
    with pytest.raises(KeyError):
        p["z"]
    with pytest.raises(TypeError):
        p["x"] = 0  # type: ignore[index]
    with pytest.raises(AttributeError):
        p.rank = 3  # type: ignore[misc]
    assert "x=1" in repr(p) and "rank=5" in repr(p)


def test_point_equality_hash_and_pickle() -> None:
    e = Extent(["x", "y"], [2, 3])
    p = Point(e, (1, 2), 5)
    assert p == Point(e, (1, 2), 5)
    assert p != Point(e, (1, 1), 4)
    assert p == {"x": 1, "y": 2}  # a Mapping compares with dicts
    assert len({p, Point(e, (1, 2), 5)}) == 1
    q = pickle.loads(pickle.dumps(p))
    assert q == p and q.rank == 5 and q.extent == e


# ------------------------------------------------- region algebra (ValueMesh)


def test_iteration_yields_points_in_row_major_order() -> None:
    m = vm(x=2, y=3)
    points = list(m)
    assert all(isinstance(p, Point) for p in points)
    assert [p.rank for p in points] == list(range(6))
    assert [dict(p) for p in points] == [
        {"x": x, "y": y} for x in range(2) for y in range(3)]


def test_size_sizes_extent_len() -> None:
    m = vm(x=2, y=3)
    assert m.size() == 6
    assert m.size("x") == 2
    assert m.size("y") == 3
    assert m.sizes == {"x": 2, "y": 3}
    assert m.extent == Extent(["x", "y"], [2, 3])
    assert len(m) == 6
    with pytest.raises(KeyError, match="nope"):
        m.size("nope")


def test_slice_int_drops_dim_and_slice_keeps_it() -> None:
    m = vm(x=2, y=3)  # values == flat ranks
    row = m.slice(x=1)
    assert row.sizes == {"y": 3}
    assert row.values() == [3, 4, 5]
    col = m.slice(y=2)
    assert col.sizes == {"x": 2}
    assert col.values() == [2, 5]
    kept = m.slice(x=slice(1, 2))
    assert kept.sizes == {"x": 1, "y": 3}
    assert kept.values() == [3, 4, 5]
    stepped = m.slice(y=slice(None, None, 2))
    assert stepped.sizes == {"x": 2, "y": 2}
    assert stepped.values() == [0, 2, 3, 5]
    one = m.slice(x=0, y=1)
    assert one.sizes == {} and len(one) == 1 and one.values() == [1]
    assert m.slice().values() == m.values()


def test_slice_negative_ints_and_slices() -> None:
    m = vm(x=2, y=3)
    assert m.slice(y=-1).values() == m.slice(y=2).values() == [2, 5]
    assert m.slice(x=-2).values() == m.slice(x=0).values() == [0, 1, 2]
    assert m.slice(y=slice(-2, None)).values() == [1, 2, 4, 5]
    assert m.slice(y=slice(None, None, -1)).values() == [2, 1, 0, 5, 4, 3]


def test_slice_of_slice_composes() -> None:
    m = vm(a=2, b=3, c=4)
    sub = m.slice(b=slice(1, 3)).slice(a=1).slice(c=-1)
    assert sub.sizes == {"b": 2}
    # flat index = a*12 + b*4 + c
    assert sub.values() == [1 * 12 + 1 * 4 + 3, 1 * 12 + 2 * 4 + 3]
    # points of a view are renumbered from 0
    assert [p.rank for p in sub] == [0, 1]
    assert [dict(p) for p in sub] == [{"b": 0}, {"b": 1}]


@pytest.mark.parametrize("bad", [2, -3, 100])
def test_slice_out_of_range_is_a_clear_error(bad: int) -> None:
    m = vm(x=2, y=3)
    with pytest.raises(IndexError, match=rf"x={bad} out of range"):
        m.slice(x=bad)


def test_slice_unknown_dim_names_it_and_the_dims() -> None:
    m = vm(x=2, y=3)
    with pytest.raises(KeyError) as info:
        m.slice(z=0)
    msg = str(info.value)
    assert "'z'" in msg and "'x': 2" in msg and "'y': 3" in msg


@pytest.mark.parametrize("bad", ["0", 1.0, True])
def test_slice_rejects_non_int_selectors(bad: object) -> None:
    m = vm(x=2, y=3)
    with pytest.raises(TypeError, match="int or a slice"):
        m.slice(x=bad)  # type: ignore[arg-type]


def test_flatten() -> None:
    m = vm(x=2, y=3)
    flat = m.flatten("all")
    assert flat.sizes == {"all": 6}
    assert flat.values() == list(range(6))
    assert flat.item(all=4) == 4
    # flattening a strided view keeps its row-major order
    assert m.slice(y=slice(0, 3, 2)).flatten("z").values() == [0, 2, 3, 5]
    assert flat.slice(all=slice(1, 3)).values() == [1, 2]


def test_rename() -> None:
    m = vm(x=2, y=3)
    r = m.rename(x="hosts")
    assert r.sizes == {"hosts": 2, "y": 3}
    assert r.values() == m.values()
    assert r.item(hosts=1, y=0) == 3
    assert m.rename(x="y", y="x").sizes == {"y": 2, "x": 3}  # a swap is fine
    with pytest.raises(KeyError, match="nope"):
        m.rename(nope="z")
    with pytest.raises(ValueError, match="duplicate"):
        m.rename(x="y")


def test_split() -> None:
    m = vm(x=2, gpus=8)
    s = m.split("gpus", nodes=2, local=4)
    assert s.sizes == {"x": 2, "nodes": 2, "local": 4}
    assert s.values() == m.values()  # row-major: same order
    assert s.item(x=1, nodes=1, local=0) == m.item(x=1, gpus=4)
    assert m.split("gpus", nodes=-1, local=2).sizes == {"x": 2, "nodes": 4, "local": 2}
    assert s.slice(nodes=1).sizes == {"x": 2, "local": 4}
    assert s.flatten("all").values() == m.values()
    with pytest.raises(KeyError, match="unknown dimension 'nope'"):
        m.split("nope", a=1)
    with pytest.raises(ValueError, match="product"):
        m.split("gpus", nodes=3, local=3)
    with pytest.raises(ValueError, match="product"):
        m.split("gpus", nodes=-1, local=-1)
    with pytest.raises(ValueError, match="already exist"):
        m.split("gpus", x=2, local=4)
    with pytest.raises(ValueError, match="give the new dims"):
        m.split("gpus")


async def test_a_dim_named_self_is_taken_by_name_everywhere(
        meshio_host: meshio.HostMesh) -> None:
    """``self`` is a name like any other (it was a TypeError "multiple values
    for argument 'self'" in slice, rename, item, grow and a Service)."""
    async with meshio_host.spawn_procs(per_host={"self": 2}) as pm:
        actors = await pm.spawn("ranks", Where)
        assert await actors.slice(self=1).rank.call_one() == 1
        assert (await actors.rank.call()).item(self=1) == 1
        assert actors.rename(self="x").sizes == {"x": 2}
        assert len(await meshio.Service(actors).rank.call()) == 2


async def test_pids_read_before_the_start_say_to_await_it(
        meshio_host: meshio.HostMesh) -> None:
    """They were a bare ``KeyError: 0``."""
    pm = meshio_host.spawn_procs(per_host={"gpus": 2})
    try:
        with pytest.raises(RuntimeError, match=r"proc mesh 'procs' is still starting: await it"):
            pm.pids  # noqa: B018
        assert len((await pm).pids) == 2
    finally:
        await pm.stop()


async def test_split_on_a_real_actor_mesh(meshio_host: meshio.HostMesh) -> None:
    pm = await meshio_host.spawn_procs(per_host={"gpus": 4})
    try:
        actors = await pm.spawn("ranks", Where)
        grid = actors.split("gpus", nodes=2, local=2)
        assert grid.sizes == {"nodes": 2, "local": 2}
        got = await grid.slice(local=1).rank.call()
        assert got.sizes == {"nodes": 2}
        assert got.values() == [1, 3]
    finally:
        await pm.stop()


def test_value_mesh_values_items_item() -> None:
    m = vm(["a", "b", "c", "d", "e", "f"], x=2, y=3)
    assert m.values() == ["a", "b", "c", "d", "e", "f"]
    items = m.items()
    assert [(dict(p), v) for p, v in items][:2] == [({"x": 0, "y": 0}, "a"),
                                                   ({"x": 0, "y": 1}, "b")]
    assert [p.rank for p, _ in items] == list(range(6))
    assert m.item(x=1, y=2) == "f"
    assert m.item(x=0, y=1) == "b"
    # values() is a copy
    m.values().append("zzz")
    assert len(m.values()) == 6
    with pytest.raises(KeyError, match="missing"):
        m.item(x=1)
    with pytest.raises(KeyError, match="unknown"):
        m.item(x=1, y=0, z=0)
    with pytest.raises(IndexError, match="out of range"):
        m.item(x=2, y=0)
    # from the end, as slice() counts (and as Python indexes)
    assert m.item(x=-1, y=-1) == "f" == m.slice(x=-1, y=-1).item()
    assert m.item(x=-2, y=-3) == "a"
    with pytest.raises(IndexError, match=r"y=-4 out of range"):
        m.item(x=0, y=-4)


@pytest.mark.parametrize("bad", [True, False, 1.0, "1"])
def test_value_mesh_item_refuses_a_coordinate_that_is_not_an_int(bad: object) -> None:
    """As slice() does: a TypeError naming the dim and the value (a bool is
    not a coordinate, though it is an int to Python)."""
    m = vm(["a", "b", "c", "d", "e", "f"], x=2, y=3)
    with pytest.raises(TypeError, match=rf"x must be an int, got {type(bad).__name__} "):
        m.item(x=bad, y=0)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"x must be an int or a slice"):
        m.slice(x=bad)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=rf"y must be an int, got {type(bad).__name__} "):
        vm(["p", "q"], x=1, y=2).item(y=bad)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"x must be an int, got NoneType None"):
        m.item(x=None, y=0)  # type: ignore[arg-type]


def test_value_mesh_item_may_omit_size_one_dims() -> None:
    m = vm(["p", "q"], hosts=1, gpus=2)
    assert m.item(gpus=1) == "q"
    assert m.slice(gpus=0).item() == "p"


def test_value_mesh_slicing_keeps_values_with_their_points() -> None:
    m = vm([f"v{i}" for i in range(6)], x=2, y=3)
    s = m.slice(y=slice(1, None))
    assert s.items()[0][1] == "v1"
    assert s.item(x=1, y=0) == "v4"
    assert s.item(x=1, y=1) == "v5"
    assert s.slice(x=0).values() == ["v1", "v2"]
    assert s == vm(["v1", "v2", "v4", "v5"], x=2, y=2)
    assert s != vm(["v1", "v2", "v4", "v5"], a=2, b=2)
    with pytest.raises(ValueError):
        vm([1, 2, 3], x=2)


def test_host_mesh_has_one_point_and_no_dims() -> None:
    host = meshio.this_host()
    assert len(host) == 1
    assert host.sizes == {}
    assert host.size() == 1
    points = list(host)
    assert len(points) == 1 and dict(points[0]) == {} and points[0].rank == 0


def test_spawn_procs_validates_dims() -> None:
    with pytest.raises(ValueError, match="per_host"):
        meshio.this_host().spawn_procs(per_host={"gpus": 0})
    with pytest.raises(TypeError, match="per_host"):  # (a wrong type, as documented)
        meshio.this_host().spawn_procs(per_host={"gpus": "2"})  # type: ignore[dict-item]
    with pytest.raises(ValueError, match="'rank'"):  # (before any process starts)
        meshio.this_host().spawn_procs(per_host={"x": 2, "rank": 2})


# ------------------------------------------------------- real meshes


class Where(Actor):
    def __init__(self, tag: str = "") -> None:
        self.tag = tag

    @endpoint
    async def point(self) -> dict[str, int]:
        return dict(current_rank())

    @endpoint
    async def rank(self) -> int:
        return current_rank().rank

    @endpoint
    def pid(self) -> int:
        return os.getpid()

    @endpoint
    def cuda(self) -> str:
        return os.environ.get("CUDA_VISIBLE_DEVICES", "")


async def test_proc_mesh_shape_and_slices(procs: meshio.ProcMesh, meshio_transport: str
                                          ) -> None:
    assert procs.sizes == {"procs": 2}
    assert len(procs) == 2 and procs.size("procs") == 2
    assert [dict(p) for p in procs] == [{"procs": 0}, {"procs": 1}]
    pids = procs.pids
    if meshio_transport == "processes":  # in-process workers share the test's pid
        assert len(set(pids)) == 2 and os.getpid() not in pids
    assert procs.slice(procs=1).pids == [pids[1]]
    assert procs.slice(procs=-1).pids == [pids[1]]
    assert procs.slice(procs=slice(None, None, -1)).pids == pids[::-1]
    assert procs.rename(procs="workers").sizes == {"workers": 2}
    with pytest.raises(IndexError):
        procs.slice(procs=2)
    with pytest.raises(KeyError, match="gpus"):
        procs.slice(gpus=0)


async def test_actor_mesh_shape_slices_and_value_mesh(procs: meshio.ProcMesh) -> None:
    w = await procs.spawn("where", Where)
    assert w.sizes == {"procs": 2} and len(w) == 2 and w.size() == 2
    assert w.extent == procs.extent
    pids = await w.pid.call()
    assert isinstance(pids, ValueMesh)
    assert pids.values() == procs.pids
    assert pids.sizes == {"procs": 2}
    assert pids.item(procs=1) == procs.pids[1]
    assert pids.slice(procs=0).values() == [procs.pids[0]]
    # a slice of the actor mesh reaches exactly that actor
    one = w.slice(procs=1)
    assert len(one) == 1 and one.sizes == {}
    assert await one.pid.call_one() == procs.pids[1]
    assert (await one.pid.call()).values() == [procs.pids[1]]
    # the actor keeps its own coordinates whatever the view it is reached through
    assert await one.point.call_one() == {"procs": 1}
    assert await w.slice(procs=-2).point.call_one() == {"procs": 0}
    rev = await w.slice(procs=slice(None, None, -1)).rank.call()
    assert rev.values() == [1, 0]
    renamed = await w.rename(procs="workers").pid.call()
    assert renamed.sizes == {"workers": 2} and renamed.item(workers=0) == procs.pids[0]
    flat = await w.flatten("all").rank.call()
    assert flat.sizes == {"all": 2} and flat.values() == [0, 1]


async def test_spawn_on_a_proc_slice_uses_the_slice_shape(procs: meshio.ProcMesh) -> None:
    w = await procs.slice(procs=slice(1, 2)).spawn("where", Where)
    assert w.sizes == {"procs": 1}
    assert (await w.pid.call()).values() == [procs.pids[1]]
    # the actor's coordinates are in the mesh it was spawned as
    assert await w.point.call_one() == {"procs": 0}


async def test_two_dim_mesh(meshio_host: meshio.HostMesh, meshio_transport: str) -> None:
    async with meshio_host.spawn_procs(per_host={"hosts_x": 2, "gpus": 2}) as pm:
        assert pm.sizes == {"hosts_x": 2, "gpus": 2} and len(pm) == 4
        w = await pm.spawn("where", Where, tag="t")
        assert w.sizes == {"hosts_x": 2, "gpus": 2}

        points = await w.point.call()
        assert points.sizes == {"hosts_x": 2, "gpus": 2}
        for h in range(2):
            for g in range(2):
                assert points.item(hosts_x=h, gpus=g) == {"hosts_x": h, "gpus": g}
        assert [p.rank for p, _ in points.items()] == [0, 1, 2, 3]
        assert (await w.rank.call()).values() == [0, 1, 2, 3]

        pids = await w.pid.call()
        assert pids.values() == pm.pids
        if meshio_transport == "processes":  # one process each, its own environment
            assert len(set(pm.pids)) == 4
            # the gpus dim assigns devices
            assert (await w.cuda.call()).values() == ["0", "1", "0", "1"]

        g1 = w.slice(gpus=1)
        assert len(g1) == 2 and g1.sizes == {"hosts_x": 2}
        r = await g1.point.call()
        assert r.sizes == {"hosts_x": 2}
        assert r.values() == [{"hosts_x": 0, "gpus": 1}, {"hosts_x": 1, "gpus": 1}]
        assert (await g1.pid.call()).values() == [pm.pids[1], pm.pids[3]]
        assert (await w.slice(gpus=-1).pid.call()).values() == [pm.pids[1], pm.pids[3]]
        assert (await w.slice(hosts_x=1).pid.call()).values() == pm.pids[2:]

        assert await w.slice(hosts_x=1, gpus=0).point.call_one() == {"hosts_x": 1, "gpus": 0}
        with pytest.raises(meshio.MeshShapeError, match="call_one"):
            await g1.pid.call_one()

        # slicing the ValueMesh agrees with slicing the actor mesh
        assert pids.slice(gpus=1).values() == (await g1.pid.call()).values()
        assert pids.slice(hosts_x=0).item(gpus=1) == pm.pids[1]

        flat = await w.flatten("ranks").point.call()
        assert flat.sizes == {"ranks": 4}
        assert flat.item(ranks=2) == {"hosts_x": 1, "gpus": 0}

        sub = w.slice(hosts_x=slice(1, 2), gpus=slice(0, 1))
        assert sub.sizes == {"hosts_x": 1, "gpus": 1}
        assert (await sub.pid.call()).item() == pm.pids[2]

        renamed = w.rename(hosts_x="nodes")
        assert (await renamed.pid.call()).item(nodes=1, gpus=1) == pm.pids[3]

        # proc mesh slices line up with actor mesh slices
        assert pm.slice(gpus=1).pids == [pm.pids[1], pm.pids[3]]
        half = await pm.slice(hosts_x=0).spawn("half", Where)
        assert half.sizes == {"gpus": 2}
        assert (await half.point.call()).values() == [{"gpus": 0}, {"gpus": 1}]
        assert (await half.pid.call()).values() == pm.pids[:2]
