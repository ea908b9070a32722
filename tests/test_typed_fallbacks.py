"""Annotated values never change type on the way: annotations msgspec cannot
describe, ``Any`` inside a typed annotation, subclasses of the builtins
(``np.float64`` for a ``float``) and ints msgpack cannot carry.

Most tests pack and unpack through :class:`~meshio.endpoints._schema.Schema`
as the wire does (its buffers copied); one runs through a worker process."""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import enum
import re
import typing
from collections.abc import AsyncIterator, Callable, Sequence
from collections.abc import Set as AbstractSet
from typing import Annotated, Any

import msgspec
import numpy as np
import pytest
import pytest_asyncio
import torch
from hypothesis import given
from hypothesis import strategies as st

import meshio
from fuzz import FUZZ
from meshio import Actor, ActorMesh, SchemaError, endpoint
from meshio._transport._serial import KIND_BYTES, Packer
from meshio.endpoints._schema import Schema

# -------------------------------------------------------------- value types


@dataclasses.dataclass
class P:
    x: int


@dataclasses.dataclass
class Q:
    y: str


class Mixed(enum.Enum):
    """Values of two types: msgspec cannot describe it."""

    A = 1
    B = "b"


@dataclasses.dataclass
class Cfg:
    """Holds a :class:`Mixed`: msgspec cannot describe it either."""

    lr: float
    mode: Mixed = Mixed.A


@dataclasses.dataclass
class Node:
    """Refers to itself; with a :class:`Mixed` field, untyped."""

    name: str
    mode: Mixed
    parent: Node | None = None
    kids: list[Node] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class Metrics:
    loss: float
    names: list[str]


@dataclasses.dataclass
class Wider(Metrics):
    """A subclass with a field of its own: msgspec would send it as a
    :class:`Metrics`, that field dropped."""

    extra: int = 0


class Row(msgspec.Struct):
    a: int


class WideRow(Row):
    b: str = ""


@dataclasses.dataclass
class Envelope:
    """A typed dataclass with an untyped field."""

    n: int
    payload: Any


class Point(typing.NamedTuple):
    x: float
    y: float


class MyStr(str):
    pass


class MyBytes(bytes):
    pass


class MyInt(int):
    pass


class Opaque:
    """Travels pickled."""


# ------------------------------------------------------------- signatures


class Target:
    def items(self, items: list[P | Q]) -> list[P | Q]:
        raise NotImplementedError

    def pair(self, t: tuple[int, P | Q]) -> tuple[int, P | Q]:
        raise NotImplementedError

    def one(self, u: P | Q) -> P | Q:
        raise NotImplementedError

    def mixed(self, m: Mixed) -> Mixed:
        raise NotImplementedError

    def cfg(self, c: Cfg) -> Cfg:
        raise NotImplementedError

    def node(self, n: Node) -> None:
        raise NotImplementedError

    def arrays(self, a: torch.Tensor | np.ndarray) -> None:
        raise NotImplementedError

    def spread(self, *us: P | Q, **named: P | Q) -> None:
        raise NotImplementedError

    def by_name(self, d: dict[str, P | Q]) -> dict[str, P | Q]:
        raise NotImplementedError

    def anys(self, xs: list[Any]) -> dict[str, Any]:
        raise NotImplementedError

    def envelope(self, e: Envelope) -> Envelope:
        raise NotImplementedError

    def f(self, x: float) -> float:
        raise NotImplementedError

    def s(self, x: str) -> str:
        raise NotImplementedError

    def b(self, x: bytes) -> bytes:
        raise NotImplementedError

    def i(self, x: int) -> int:
        raise NotImplementedError

    def flag(self, x: bool) -> bool:
        raise NotImplementedError

    def np_own(self, x: np.int64) -> np.int64:
        raise NotImplementedError

    def floats(self, xs: list[float], by: dict[str, float], pair: tuple[float, str],
               maybe: float | None = None) -> list[float]:
        raise NotImplementedError

    def metrics(self, m: Metrics) -> Metrics:
        raise NotImplementedError

    def many(self, ms: list[Metrics], *rest: Metrics,
             maybe: Metrics | None = None) -> list[Metrics]:
        raise NotImplementedError

    def row(self, r: Row) -> Row:
        raise NotImplementedError

    def seq(self, xs: Sequence[int], keys: AbstractSet[str]) -> Sequence[int]:
        raise NotImplementedError

    def point(self, p: Point) -> None:
        raise NotImplementedError

    def own(self, x: MyStr) -> MyStr:
        raise NotImplementedError

    def bounded(self, n: Annotated[int, msgspec.Meta(ge=0)],
                u: Annotated[int, msgspec.Meta(le=9)] | P | Q,
                f: Callable[[int], int] | P) -> None:
        raise NotImplementedError

    def big(self, small: int, big: int) -> int:
        raise NotImplementedError

    def bigs(self, xs: list[int], c: Metrics) -> list[int]:
        raise NotImplementedError


def schema(name: str) -> Schema:
    return Schema(getattr(Target, name), f"Target.{name}")


def wire(packer: Packer) -> list[Any]:
    """The buffers of ``packer`` as a receiver gets them (copied)."""
    return [bytes(memoryview(b)) if k == KIND_BYTES else bytearray(b) for b, k in packer]


def round_trip(name: str, *args: Any, **kwargs: Any) -> dict[str, Any]:
    s = schema(name)
    packer = Packer()
    body = s.pack_call(args, kwargs, packer)
    got_args, got = s.unpack_args(body, wire(packer))
    assert got_args == ()
    return got


def result_trip(name: str, value: Any) -> Any:
    s = schema(name)
    packer = Packer()
    body = s.pack_result(value, packer)
    return s.unpack_result(body, wire(packer))


def same(a: Any, b: Any) -> bool:
    """Equal, and of the same types all the way down."""
    if type(a) is not type(b):
        return False
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(x, b[k]) for k, x in a.items())
    if dataclasses.is_dataclass(a):
        return all(same(getattr(a, f.name), getattr(b, f.name)) for f in dataclasses.fields(a))
    return bool(a == b)


# -------------------------------------- annotations msgspec cannot describe


@pytest.mark.parametrize(("name", "value"), [
    ("items", [P(1), Q("a")]),
    ("pair", (1, P(2))),
    ("one", Q("b")),
    ("mixed", Mixed.B),
    ("cfg", Cfg(0.1, Mixed.B)),
    ("by_name", {"p": P(3), "q": Q("c")}),
])
def test_a_value_of_an_annotation_msgspec_cannot_describe_arrives_as_sent(
        name: str, value: Any) -> None:
    """A dataclass in a ``list[P | Q]`` arrived as a dict (``{'x': 1}``), a
    ``tuple[int, P | Q]``'s as well: msgspec cannot describe the union, and
    the annotation fell back to its origin (``list``)."""
    (got,) = round_trip(name, value).values()
    assert same(got, value), got
    assert same(result_trip(name, value), value)


def test_a_value_that_refers_to_itself_is_checked_once() -> None:
    root = Node("root", Mixed.A)
    root.kids.append(Node("kid", Mixed.B, parent=root))
    got = round_trip("node", root)["n"]
    assert type(got) is Node and got.kids[0].parent is got


def test_arrays_of_either_kind_arrive_as_themselves() -> None:
    for a in (torch.arange(3), np.arange(3)):
        got = round_trip("arrays", a)["a"]
        assert type(got) is type(a) and np.array_equal(np.asarray(got), np.asarray(a))
    with pytest.raises(SchemaError, match=r"Expected `Tensor \| ndarray`, got `list` - at `\$\.a`"):
        round_trip("arrays", [1, 2])


@pytest.mark.parametrize(("name", "value", "message"), [
    ("items", [P(1), 1, "junk"], r"Expected `P \| Q`, got `int` - at `\$\.items\[1\]`"),
    ("items", (P(1),), r"Expected `list\[P \| Q\]`, got `tuple` - at `\$\.items`"),
    ("pair", (1, 2), r"Expected `P \| Q`, got `int` - at `\$\.t\[1\]`"),
    ("pair", (1, P(1), 3), r"Expected `tuple\[int, P \| Q\]`, got a tuple of length 3"),
    ("one", 42, r"Expected `P \| Q`, got `int` - at `\$\.u`"),
    ("one", P("x"), r"Expected `int`, got `str` - at `\$\.u\.x`"),  # type: ignore[arg-type]
    ("mixed", "zzz", r"Expected `Mixed`, got `str` - at `\$\.m`"),
    ("cfg", Cfg("oops"), r"Expected `float`, got `str` - at `\$\.c\.lr`"),  # type: ignore[arg-type]
    ("cfg", {"lr": 0.1}, r"Expected `Cfg`, got `dict` - at `\$\.c`"),
    ("cfg", Cfg(True), r"Expected `float`, got `bool` - at `\$\.c\.lr`"),
    ("by_name", {"p": P(1), "q": 2}, r"Expected `P \| Q`, got `int` - at `\$\.d\['q'\]`"),
    ("by_name", {1: P(1)}, r"Expected `str`, got `int` \(a key\) - at `\$\.d\[1\]`"),
])
def test_a_wrong_value_is_a_schema_error_naming_its_path(name: str, value: Any,
                                                         message: str) -> None:
    """These were accepted unchecked (a dict for ``c: Cfg`` arrived as a
    dict, and the endpoint failed with AttributeError)."""
    with pytest.raises(SchemaError, match=f"bad arguments for Target.{name}: {message}"):
        round_trip(name, value)


def test_constraints_and_callables_are_checked() -> None:
    """``msgspec.Meta`` constraints were dropped with ``Annotated`` (the
    annotations were read without their extras): ``n: Annotated[int,
    Meta(ge=0)]`` took -1."""
    assert round_trip("bounded", 0, 9, abs) == {"n": 0, "u": 9, "f": abs}
    for args, message in (((-1, 0, abs), r"Expected `int` >= 0 - at `\$\.n`"),
                          ((0, 10, abs), r"Expected `int` <= 9 - at `\$\.u`"),
                          ((0, 0, 3), r"Expected `Callable\[\[int\], int\] \| P`, got `int` "
                                      r"- at `\$\.f`")):
        with pytest.raises(SchemaError, match=message):
            round_trip("bounded", *args)


def test_variadic_arguments_of_such_an_annotation_are_checked() -> None:
    s = schema("spread")
    packer = Packer()
    body = s.pack_call((P(1), Q("a")), {"k": P(2)}, packer)
    assert s.unpack_args(body, wire(packer)) == ((P(1), Q("a")), {"k": P(2)})
    for args, kwargs, where in (((P(1), 2), {}, r"\$\.us\[1\]"),
                                ((), {"k": "v"}, r"\$\.named\['k'\]")):
        packer = Packer()
        body = s.pack_call(args, kwargs, packer)
        with pytest.raises(SchemaError, match=f"Expected `P \\| Q`, got `\\w+` - at `{where}`"):
            s.unpack_args(body, wire(packer))


def test_a_wrong_result_is_a_schema_error_naming_its_path() -> None:
    with pytest.raises(SchemaError, match=r"result of Target.items does not match its "
                                          r"annotation: Expected `P \| Q`, got `dict` - at "
                                          r"`\$\[1\]`"):
        result_trip("items", [P(1), {"x": 1}])


# ---------------------------------------- Any inside a typed annotation


def test_any_inside_a_typed_annotation_keeps_python_types() -> None:
    """A dataclass in a ``list[Any]`` arrived as a dict, a tuple as a list,
    a date as a str; an int beyond 2**64 could not be sent at all."""
    value = [P(1), (1, 2), {1, 2}, {1: "a"}, datetime.date(2024, 5, 1), np.float64(0.5),
             2**70, MyStr("s"), [Q("q")]]
    assert same(round_trip("anys", value)["xs"], value)
    result = {"p": P(1), "t": (1, "a"), "big": -(2**80)}
    assert same(result_trip("anys", result), result)
    envelope = Envelope(3, payload=(P(2), frozenset({1})))
    assert same(round_trip("envelope", envelope)["e"], envelope)
    assert same(result_trip("envelope", envelope), envelope)


# --------------------------------------------------- builtins' subclasses


@pytest.mark.parametrize(("name", "value", "expected"), [
    ("f", np.float64(2.5), 2.5),
    ("f", MyInt(3), 3.0),  # (as an int for a float does)
    ("s", MyStr("ab"), "ab"),
    ("b", MyBytes(b"ab"), b"ab"),
    ("b", MyBytes(b"x" * (1 << 16)), b"x" * (1 << 16)),  # (out of band)
    ("i", MyInt(-4), -4),
])
def test_a_subclass_of_the_annotated_builtin_arrives_as_the_builtin(
        name: str, value: Any, expected: Any) -> None:
    """``np.float64`` (what ``np.mean`` returns) for ``x: float`` was refused
    with "Expected `float`, got `ext`"."""
    assert same(round_trip(name, value)["x"], expected)
    assert same(result_trip(name, value), expected)


def test_subclasses_in_containers_and_fields_arrive_as_the_builtin() -> None:
    got = round_trip("floats", [np.float64(1.5), 2.0], {MyStr("k"): np.float64(3)},
                     (np.float64(4), MyStr("t")), maybe=np.float64(5))
    assert same(got, {"xs": [1.5, 2.0], "by": {"k": 3.0}, "pair": (4.0, "t"), "maybe": 5.0})
    m = Metrics(np.float64(0.25), [MyStr("a"), "b"])
    assert same(round_trip("metrics", m)["m"], Metrics(0.25, ["a", "b"]))
    assert same(result_trip("metrics", m), Metrics(0.25, ["a", "b"]))
    assert type(m.loss) is np.float64  # (the caller's own value is left as it was)
    assert same(round_trip("point", Point(np.float64(1), 2.0))["p"], Point(1.0, 2.0))
    assert same(result_trip("floats", (np.float64(1), MyInt(2))), [1.0, 2.0])


@pytest.mark.parametrize(("name", "value", "expected"), [
    ("i", np.int64(-3), -3),
    ("i", np.uint8(200), 200),
    ("f", np.float32(0.5), 0.5),
    ("f", np.int32(2), 2.0),
    ("flag", np.bool_(True), True),
])
def test_a_numpy_number_arrives_as_the_annotated_builtin(
        name: str, value: Any, expected: Any) -> None:
    """``np.int64`` (what ``argmax`` or ``len`` of an array's shape gives)
    for ``x: int`` was refused with "Expected `int`, got `pickle`"."""
    assert same(round_trip(name, value)["x"], expected)
    assert same(result_trip(name, value), expected)


def test_numpy_numbers_in_containers_and_where_the_annotation_names_them() -> None:
    got = round_trip("floats", [np.float32(1.5), np.int16(2)], {"k": np.int64(3)},
                     (np.float32(4), "t"), maybe=np.uint32(5))
    assert same(got, {"xs": [1.5, 2.0], "by": {"k": 3.0}, "pair": (4.0, "t"), "maybe": 5.0})
    assert same(round_trip("anys", [np.int64(1)])["xs"], [np.int64(1)])  # (untyped: as sent)
    assert same(round_trip("np_own", np.int64(7))["x"], np.int64(7))


def test_a_class_of_its_own_keeps_its_subclass() -> None:
    """``x: MyStr`` names the subclass itself: it is not made a ``str``."""
    assert same(round_trip("own", MyStr("a"))["x"], MyStr("a"))
    assert same(result_trip("own", MyStr("b")), MyStr("b"))


def test_a_refused_subclass_is_named_by_its_type_never_ext() -> None:
    s = schema("i")
    with pytest.raises(SchemaError, match=r"Expected `int`, got `str` - at `\$\.x`"):
        round_trip("i", MyStr("3"))
    # a pickle where the annotation allows none: arguments are not unpickled
    packer = Packer()
    body = packer.pack_map({"x": Opaque()}, {"x": False})
    with pytest.raises(SchemaError) as info:
        s.unpack_args(body, wire(packer))
    assert str(info.value) == "bad arguments for Target.i: Expected `int`, got `pickle` - at `$.x`"
    packer = Packer()
    body = packer.pack_map({"x": torch.ones(2)}, {"x": False})
    with pytest.raises(SchemaError, match=r"Expected `int`, got `Tensor` - at `\$\.x`"):
        s.unpack_args(body, wire(packer))
    # a result is unpickled to name it: a str subclass, which msgspec takes for a str
    for value, name in ((MyStr("a"), "MyStr"), (np.float64(1), "numpy.float64")):
        packer = Packer()
        body = packer.pack(value, False)
        with pytest.raises(SchemaError) as info:
            schema("s" if name == "MyStr" else "i").unpack_result(body, wire(packer))
        assert str(info.value).endswith(f"got `{name}`"), info.value
        assert "ext" not in str(info.value)


def test_a_range_and_dict_views_travel_where_the_annotation_admits_them() -> None:
    """``Sequence[int]`` admits a ``range``, ``AbstractSet[str]`` a dict's
    keys: they arrive as msgspec gives those annotations (a list, a set).
    They were pickled and refused ("Expected `array`, got `pickle`")."""
    got = round_trip("seq", range(3), {"a": 1, "b": 2}.keys())
    assert same(got, {"xs": [0, 1, 2], "keys": {"a", "b"}})
    assert same(result_trip("seq", range(2, 4)), [2, 3])
    assert same(round_trip("floats", range(2), {"k": 1.0}, (1.0, "t"))["xs"], [0.0, 1.0])
    with pytest.raises(SchemaError, match=r"Expected `int`, got `pickle` - at `\$\.x`"):
        round_trip("i", range(2))  # (where no array is admitted: refused, as before)


# ------------------------------------------ subclasses of dataclasses, Structs


def test_a_subclass_of_the_annotated_dataclass_arrives_as_itself() -> None:
    """It arrived as the annotated class, its own field dropped, silently."""
    wide = Wider(1.5, ["a"], extra=3)
    assert same(round_trip("metrics", wide)["m"], wide)
    assert same(result_trip("metrics", wide), wide)
    assert same(round_trip("row", WideRow(1, "x"))["r"], WideRow(1, "x"))
    assert same(result_trip("row", WideRow(2, "y")), WideRow(2, "y"))
    # at any depth: in a list, a union's arm, *args; the value that holds one
    # arrives as sent (an int for a float stays an int), the others fitted
    s = schema("many")
    packer = Packer()
    body = s.pack_call(([Metrics(1.0, []), Wider(2.0, [], 5)], Wider(3.0, [], 1), Metrics(4, [])),
                       {"maybe": Wider(0.0, ["m"], 9)}, packer)
    args, kwargs = s.unpack_args(body, wire(packer))
    assert same(args, ([Metrics(1.0, []), Wider(2.0, [], 5)], Wider(3.0, [], 1),
                       Metrics(4, [])))
    assert same(kwargs, {"maybe": Wider(0.0, ["m"], 9)})
    assert same(result_trip("many", [Wider(2.0, [], 5)]), [Wider(2.0, [], 5)])
    # the annotated class itself still travels natively, fitted (an int for a float)
    assert same(round_trip("metrics", Metrics(1, ["a"]))["m"], Metrics(1.0, ["a"]))


def test_a_pickle_where_a_dataclass_is_annotated_is_checked() -> None:
    s = schema("metrics")
    for value, message in (
            (Opaque(), "Expected `Metrics`, got `Opaque` - at `$.m`"),
            (Wider(1.0, [3], 1), "Expected `str`, got `int` - at `$.m.names[0]`")):
        packer = Packer()
        body = packer.pack_map({"m": value}, {"m": False})  # (sent untyped: pickled whole)
        with pytest.raises(SchemaError) as info:
            s.unpack_args(body, wire(packer))
        assert str(info.value) == f"bad arguments for Target.metrics: {message}"
    packer = Packer()
    body = packer.pack(Opaque(), False)
    with pytest.raises(SchemaError) as info:
        s.unpack_result(body, wire(packer))
    assert str(info.value) == ("result of Target.metrics does not match its annotation: "
                               "Expected `Metrics`, got `Opaque`")
    # an annotation holding no such class takes no pickle (none is unpickled)
    packer = Packer()
    body = packer.pack_map({"x": Opaque()}, {"x": False})
    with pytest.raises(SchemaError, match=r"Expected `int`, got `pickle` - at `\$\.x`"):
        schema("i").unpack_args(body, wire(packer))


metrics_like = st.builds(
    lambda cls, loss, names, extra: cls(loss, names) if cls is Metrics else cls(loss, names, extra),
    st.sampled_from([Metrics, Wider]), st.floats(allow_nan=False),
    st.lists(st.text(max_size=2) | st.integers(-9, 9), max_size=2), st.integers(-9, 9))


@FUZZ
@given(ms=st.lists(metrics_like, max_size=4))
def test_lists_of_a_dataclass_and_its_subclass_arrive_as_sent_or_are_refused(
        ms: list[Metrics]) -> None:
    """Whatever mix of the class and its subclass, right or wrong inside:
    each arrives as itself, or the call is refused naming a wrong part."""
    fine = all(type(n) is str for m in ms for n in m.names)
    s = schema("many")
    packer = Packer()
    body = s.pack_call((ms,), {}, packer)
    try:
        got, _ = s.unpack_args(body, wire(packer))
    except SchemaError as e:
        assert not fine and "Expected `str`, got `int`" in str(e), e
        return
    assert fine and same(got[0], ms), (ms, got)


# ------------------------------------------------ ints msgpack cannot carry


def test_an_int_msgpack_cannot_carry_is_refused_naming_its_path() -> None:
    """It was "arguments cannot be sent: OverflowError: can't serialize
    ints < -2**63 or > 2**64 - 1", naming no argument."""
    cases: list[tuple[str, tuple[Any, ...], str]] = [
        ("big", (1, 2**64), "$.big"), ("big", (1, MyInt(-(2**63) - 1)), "$.big"),
        ("bigs", ([1, 2, 2**70], Metrics(0, [])), "$.xs[2]")]
    for name, args, where in cases:
        with pytest.raises(SchemaError) as info:
            round_trip(name, *args)
        assert str(info.value).startswith("Target.")
        assert f"outside the range a typed int travels in (-2**63 to 2**64 - 1) - at `{where}`" \
            in str(info.value)
    for name, value, where in (("big", 2**64, "$"), ("bigs", [0, -(2**64)], "$[1]")):
        with pytest.raises(SchemaError, match=re.escape(f"- at `{where}`; return it as")):
            result_trip(name, value)
    assert round_trip("big", 1, 2**64 - 1)["big"] == 2**64 - 1


# ------------------------------------------------------------ through a worker


class Typed(Actor):
    @endpoint
    async def kinds(self, items: list[P | Q]) -> list[str]:
        return [type(i).__name__ for i in items]

    @endpoint
    async def mean(self, xs: list[float]) -> float:
        return np.mean(xs)  # type: ignore[return-value]  # (an np.float64)

    @endpoint
    async def seen(self, x: float) -> str:
        return type(x).__name__

    @endpoint
    async def widen(self, m: Metrics) -> Metrics:
        return Wider(m.loss, [type(m).__name__], extra=len(m.names))


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def typed() -> AsyncIterator[ActorMesh[Typed]]:
    async with meshio.this_host().spawn_procs(per_host={"procs": 1}, name="fallbacks") as pm:
        yield await pm.spawn("typed", Typed)  # type: ignore[misc]


@pytest.mark.asyncio(loop_scope="module")
async def test_through_a_worker(typed: ActorMesh[Typed]) -> None:
    assert await asyncio.wait_for(typed.kinds.call_one([P(1), Q("a")]), 60) == ["P", "Q"]
    mean = await asyncio.wait_for(typed.mean.call_one([1.0, 2.0]), 60)
    assert type(mean) is float and mean == 1.5
    assert await asyncio.wait_for(typed.seen.call_one(np.float64(2.5)), 60) == "float"
    widened = await asyncio.wait_for(typed.widen.call_one(Wider(1.0, ["a", "b"], 7)), 60)
    assert same(widened, Wider(1.0, ["Wider"], 2))
    with pytest.raises(SchemaError, match=r"\$\.items\[0\]"):
        await asyncio.wait_for(typed.kinds.call_one([3]), 60)


# ------------------------------------------------------------------- fuzz

members = (st.builds(P, st.integers(-5, 5)) | st.builds(Q, st.text(max_size=3))
           | st.integers(-5, 5) | st.text(max_size=3) | st.none() | st.sampled_from(Mixed)
           | st.builds(P, st.text(max_size=2)))  # (a P holding a str: wrong inside)


def fits(v: Any) -> bool:
    """Whether ``v`` fits ``P | Q`` (the reference the checks must agree with)."""
    return (type(v) is P and type(v.x) is int) or (type(v) is Q and type(v.y) is str)


@FUZZ
@given(value=st.lists(members, max_size=4) | st.tuples(members, members) | members
       | st.dictionaries(st.text(max_size=2) | st.integers(0, 2), members, max_size=3))
def test_values_of_an_undescribable_annotation_arrive_as_sent_or_are_refused(value: Any) -> None:
    """Each of ``list[P | Q]``, ``tuple[int, P | Q]``, ``P | Q`` and
    ``dict[str, P | Q]`` accepts exactly the values that fit it, and
    those arrive as sent, types and all."""
    cases = (("items", type(value) is list and all(map(fits, value))),
             ("pair", type(value) is tuple and len(value) == 2 and type(value[0]) is int
              and fits(value[1])),
             ("one", fits(value)),
             ("by_name", type(value) is dict and all(type(k) is str and fits(x)
                                                     for k, x in value.items())))
    for name, ok in cases:
        try:
            (got,) = round_trip(name, value).values()
        except SchemaError as e:
            assert not ok, (name, e)
            assert " - at `$." in str(e), e
        else:
            assert ok, (name, got)
            assert same(got, value)


plain = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=4)
    | st.binary(max_size=4) | st.builds(P, st.integers(-2, 2)) | st.dates()
    | st.floats(allow_nan=False).map(np.float64) | st.text(max_size=3).map(MyStr),
    lambda inner: st.lists(inner, max_size=3) | st.tuples(inner, inner)
    | st.frozensets(st.integers(), max_size=3)
    | st.dictionaries(st.text(max_size=3), inner, max_size=3),
    max_leaves=8)


@FUZZ
@given(xs=st.lists(plain, max_size=4), payload=plain)
def test_any_inside_a_typed_annotation_arrives_as_sent(xs: list[Any], payload: Any) -> None:
    assert same(round_trip("anys", xs)["xs"], xs)
    assert same(round_trip("envelope", Envelope(1, payload))["e"], Envelope(1, payload))


def subclassed(base: type, value: Any) -> Any:
    return {float: np.float64, str: MyStr, int: MyInt, bytes: MyBytes}[base](value)


@FUZZ
@given(xs=st.lists(st.tuples(st.floats(allow_nan=False), st.booleans()), max_size=4),
       by=st.dictionaries(st.tuples(st.text(max_size=3), st.booleans()),
                          st.tuples(st.integers(-(2**63), 2**64 - 1), st.booleans()), max_size=3),
       pair=st.tuples(st.floats(allow_nan=False), st.text(max_size=3), st.booleans()))
def test_subclasses_of_builtins_arrive_as_the_builtin(
        xs: list[tuple[float, bool]], by: dict[tuple[str, bool], tuple[int, bool]],
        pair: tuple[float, str, bool]) -> None:
    sent_xs = [subclassed(float, x) if sub else x for x, sub in xs]
    sent_by = {subclassed(str, k) if ks else k: subclassed(int, v) if vs else v
               for (k, ks), (v, vs) in by.items()}
    sent_pair = (subclassed(float, pair[0]), subclassed(str, pair[1])) if pair[2] \
        else pair[:2]
    got = round_trip("floats", sent_xs, sent_by, sent_pair)
    assert same(got["xs"], [float(x) for x, _ in xs])
    assert same(got["by"], {k: float(v) for (k, _), (v, _) in by.items()})
    assert same(got["pair"], (float(pair[0]), pair[1]))


CHECKED = [schema(name) for name in ("items", "pair", "one", "mixed", "cfg", "node", "spread",
                                     "by_name", "anys", "envelope")]


@FUZZ
@given(body=st.binary(max_size=256), bufs=st.lists(st.binary(max_size=32), max_size=2))
def test_any_bytes_give_checked_values_or_a_schema_error(body: bytes, bufs: list[bytes]) -> None:
    """The decoders of checked annotations: any bytes give arguments and a
    result that fit their annotations, or a SchemaError."""
    for s in CHECKED:
        try:
            s.unpack_args(body, list(bufs))
        except SchemaError:
            pass
        try:
            result = s.unpack_result(body, list(bufs))
        except SchemaError:
            continue
        if s is CHECKED[0]:
            assert type(result) is list and all(map(fits, result)), result


def test_msgspec_cannot_describe_these_annotations() -> None:
    """(What the tests above rely on: should msgspec learn to describe one,
    it travels typed and these tests test something else.)"""
    for tp in (P | Q, Mixed, Cfg, Node, torch.Tensor | np.ndarray):
        with pytest.raises(TypeError):
            msgspec.msgpack.Decoder(tp, dec_hook=lambda t, obj: obj)
