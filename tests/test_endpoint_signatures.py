"""Endpoints take what their signature takes: ``*args`` and ``**kwargs``
(their items checked against the annotation), positional-only parameters
(refused by keyword at the caller, as Python refuses them), and a ``-> None``
result is checked like any other."""

from __future__ import annotations

import asyncio
import inspect
from typing import Any

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

import meshio
from fuzz import FUZZ
from meshio import Actor, SchemaError, endpoint
from meshio._transport._serial import KIND_BYTES, Packer
from meshio.endpoints._schema import Schema

#: these tests hold on both transports: worker processes and in-process
pytestmark = pytest.mark.meshio_transports()

GUARD = 60.0


class Sig(Actor):
    @endpoint
    async def var(self, *a: int, **k: int) -> tuple[list[int], dict[str, int]]:
        assert all(type(x) is int for x in (*a, *k.values()))
        return list(a), k

    @endpoint
    async def kw(self, **k: float) -> dict[str, float]:
        return k

    @endpoint
    def dvar(self, x: int, *rest: int) -> tuple[int, list[int]]:
        return x, list(rest)

    @endpoint
    async def mixed(self, a: int, /, b: int = 2, *rest: str, c: int = 0,
                    **k: object) -> tuple[int, int, list[str], int, dict[str, str]]:
        return a, b, list(rest), c, {name: repr(v) for name, v in k.items()}

    @endpoint
    async def untyped(self, *a, **k):  # type: ignore[no-untyped-def]
        return [type(x).__name__ for x in a], {n: type(v).__name__ for n, v in k.items()}

    @endpoint
    async def po(self, x: int, /) -> int:
        return x

    @endpoint
    def po_defaults(self, a: int, b: int = 2, /, *, c: int = 3) -> tuple[int, int, int]:
        return a, b, c

    @endpoint
    async def po_kw(self, x: int, /, **k: int) -> tuple[int, dict[str, int]]:
        return x, k

    @endpoint
    async def nothing(self) -> None:
        return None

    @endpoint
    async def says_nothing(self, value: Any) -> None:
        return value  # type: ignore[no-any-return]

    @endpoint
    def def_says_nothing(self, value: Any) -> None:
        return value  # type: ignore[no-any-return]


def within(aw: Any) -> Any:
    return asyncio.wait_for(aw, GUARD)


@pytest.fixture
async def sig(procs: meshio.ProcMesh) -> Sig:
    return (await procs.spawn("sig", Sig)).slice(procs=0)


# ------------------------------------------------------------ *args, **kwargs


async def test_variadic_endpoints_take_their_arguments(sig: Sig) -> None:
    """*args and **kwargs endpoints used to fail every call ("Expected
    `array`, got `ext` - at `$.args`")."""
    assert await within(sig.var.call_one()) == ([], {})
    assert await within(sig.var.call_one(1, 2)) == ([1, 2], {})
    assert await within(sig.var.call_one(1, z=3, y=4)) == ([1], {"z": 3, "y": 4})
    assert await within(sig.kw.call_one(z=1.5)) == {"z": 1.5}
    assert await within(sig.kw.call_one()) == {}
    assert await within(sig.dvar.call_one(1)) == (1, [])
    assert await within(sig.dvar.call_one(1, 2, 3)) == (1, [2, 3])
    assert await within(sig.dvar.call_one(x=1)) == (1, [])
    assert await within(sig.mixed.call_one(1)) == (1, 2, [], 0, {})
    assert await within(sig.mixed.call_one(1, 5, "r", "s", c=7, a=8, deep=[{1}])) == (
        1, 5, ["r", "s"], 7, {"a": "8", "deep": "[{1}]"})
    assert await within(sig.mixed.call_one(1, b=6)) == (1, 6, [], 0, {})


async def test_variadic_items_are_checked_against_their_annotation(sig: Sig) -> None:
    with pytest.raises(SchemaError, match=r"Sig\.var.*Expected `int`, got `str` - at `\$\.a\[1\]`"):
        await within(sig.var.call_one(1, "two"))  # type: ignore[arg-type]
    with pytest.raises(SchemaError, match=r"Sig\.var.*Expected `int`, got `str` - at `\$\.k"):
        await within(sig.var.call_one(z="three"))  # type: ignore[arg-type]
    with pytest.raises(SchemaError, match=r"Sig\.mixed.*Expected `str`, got `int`"):
        await within(sig.mixed.call_one(1, 2, "r", 4))  # type: ignore[arg-type]
    assert await within(sig.var.call_one(5)) == ([5], {})  # the actor is fine


async def test_untyped_variadic_arguments_keep_their_python_types(sig: Sig) -> None:
    got = await within(sig.untyped.call_one(1, (2,), {3}, b"x" * 70_000, t=(4,), s="y"))
    assert got == (["int", "tuple", "set", "bytes"], {"t": "tuple", "s": "str"})


async def test_variadic_binding_errors_are_raised_at_the_caller(sig: Sig) -> None:
    with pytest.raises(SchemaError, match=r"missing required argument\(s\) \['x'\]"):
        sig.dvar.call_one()  # type: ignore[call-arg]
    with pytest.raises(SchemaError, match="multiple values for argument 'x'"):
        sig.dvar.call_one(1, x=2)  # type: ignore[misc]
    with pytest.raises(SchemaError, match=r"takes 0 positional argument\(s\) but 1 were given"):
        sig.kw.call_one(1.5)  # type: ignore[call-arg]


# ---------------------------------------------------------- positional-only


async def test_positional_only_parameters(sig: Sig) -> None:
    """They used to fail every call on the actor ("positional-only arguments
    passed as keyword arguments")."""
    assert await within(sig.po.call_one(1)) == 1
    assert await within(sig.po_defaults.call_one(1)) == (1, 2, 3)
    assert await within(sig.po_defaults.call_one(1, 5, c=7)) == (1, 5, 7)
    # Beside **kwargs, a positional-only parameter's name is a key like any other.
    assert await within(sig.po_kw.call_one(1, x=2)) == (1, {"x": 2})


async def test_positional_only_by_keyword_is_a_type_error_at_the_caller(sig: Sig) -> None:
    """As Python: the caller used to send it, the actor then failed."""
    with pytest.raises(TypeError, match=r"Sig\.po\(\) got some positional-only arguments "
                                        r"passed as keyword arguments: 'x'"):
        sig.po.call_one(x=1)  # type: ignore[call-arg]
    with pytest.raises(TypeError, match=r"positional-only.*'b'"):
        sig.po_defaults.call_one(1, b=2)  # type: ignore[call-arg]
    with pytest.raises(SchemaError, match=r"takes 1 positional argument\(s\) but 2 were given"):
        sig.po.call_one(1, 2)  # type: ignore[call-arg]


# -------------------------------------------------------------- -> None


async def test_a_none_result_is_checked(sig: Sig, procs: meshio.ProcMesh) -> None:
    """A ``-> None`` endpoint's result used to arrive unchecked."""
    assert await within(sig.nothing.call_one()) is None
    assert await within(sig.says_nothing.call_one(None)) is None
    for ep in (sig.says_nothing, sig.def_says_nothing):
        with pytest.raises(SchemaError, match=r"result of Sig\.(def_)?says_nothing .*"
                                              r"`-> None`: got `dict` \{'oops': 1\}"):
            await within(ep.call_one({"oops": 1}))
        with pytest.raises(SchemaError, match=r"`-> None`: got `int` 5"):
            await within(ep.call_one(5))
    mesh = await procs.spawn("sig2", Sig)
    with pytest.raises(SchemaError, match=r"(?s)failed on 2 of 2 ranks.*`-> None`: got `list`"):
        await within(mesh.says_nothing.call([1]))
    with pytest.raises(SchemaError) as info:  # one line for both ranks: the same mistake
        await within(mesh.says_nothing.call([1]))
    lines = str(info.value).splitlines()
    assert lines[1].startswith("  ranks 0-1: SchemaError: result of Sig.says_nothing "), lines
    assert lines[2] == "", lines
    assert await within(sig.nothing.call_one()) is None  # the actor is fine


def test_failures_naming_their_rank_as_spawned_group_in_a_slice() -> None:
    """A slice's points are its own (0, 1...), the errors name the ranks
    as spawned (``[g rank 5]``): they group all the same."""
    from meshio.endpoints._endpoint import _summary  # (the grouping key)

    assert _summary(SchemaError("bad arguments for G.f: x [g rank 5]")) == \
        _summary(SchemaError("bad arguments for G.f: x [g rank 4]")) == "bad arguments for G.f: x"
    assert _summary(SchemaError("result of G.f: y (from g rank 7)")) == "result of G.f: y"


# ------------------------------------------------------- the wire (no actor)


class Target:
    def var(self, *a: int, **k: int) -> None:
        raise NotImplementedError

    def untyped(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError

    def mixed(self, a: int, /, b: int = 2, *rest: str, c: int = 0, **k: Any) -> None:
        raise NotImplementedError

    def po(self, x: int, y: str = "", /) -> None:
        raise NotImplementedError


VAR = Schema(Target.var, "Target.var")
UNTYPED = Schema(Target.untyped, "Target.untyped")
MIXED = Schema(Target.mixed, "Target.mixed")
PO = Schema(Target.po, "Target.po")


def round_trip(schema: Schema, args: tuple[Any, ...], kwargs: dict[str, Any]
               ) -> tuple[tuple[Any, ...], dict[str, Any]]:
    packer = Packer()
    body = schema.pack_call(args, kwargs, packer)
    bufs = [bytes(memoryview(b)) if k == KIND_BYTES else bytearray(b) for b, k in packer]
    return schema.unpack_args(body, bufs)


values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False)
    | st.text(st.characters(codec="utf-8"))
    | st.binary() | st.complex_numbers(allow_nan=False),
    lambda inner: st.lists(inner, max_size=3) | st.tuples(inner, inner)
    | st.frozensets(st.integers(), max_size=3)
    | st.dictionaries(st.text(st.characters(codec="utf-8"), max_size=4), inner, max_size=3),
    max_leaves=8)
names = st.text(st.characters(codec="utf-8"), max_size=6).filter(lambda n: n != "self")


@FUZZ
@given(args=st.lists(values, max_size=4), kwargs=st.dictionaries(names, values, max_size=4))
def test_untyped_variadic_arguments_round_trip(args: list[Any], kwargs: dict[str, Any]) -> None:
    assert round_trip(UNTYPED, tuple(args), kwargs) == (tuple(args), kwargs)


@FUZZ
@given(args=st.lists(values, max_size=4), kwargs=st.dictionaries(names, values, max_size=4))
def test_typed_variadic_items_arrive_or_are_refused(args: list[Any],
                                                    kwargs: dict[str, Any]) -> None:
    """Every item an ``int`` (not a bool) msgpack can carry: they arrive as
    sent; else a SchemaError names the endpoint (and the item that is not,
    where it could be sent)."""
    ints = all(type(v) is int and -(1 << 63) <= v < 1 << 64 for v in (*args, *kwargs.values()))
    try:
        got = round_trip(VAR, tuple(args), kwargs)
    except SchemaError as e:
        assert not ints, e
        assert "Target.var" in str(e), e
        assert "cannot be sent" in str(e) or "$.a[" in str(e) or "$.k" in str(e), e
    else:
        assert ints and got == (tuple(args), kwargs)


@FUZZ
@given(body=st.binary(max_size=256), bufs=st.lists(st.binary(max_size=32), max_size=2))
def test_spread_arguments_decode_or_are_refused(body: bytes, bufs: list[bytes]) -> None:
    """Any bytes, and any map of fields, give a call that fits the
    signature or a SchemaError: never a call the endpoint would refuse."""
    for schema, fn in ((VAR, Target.var), (MIXED, Target.mixed), (PO, Target.po)):
        try:
            args, kwargs = schema.unpack_args(body, list(bufs))
        except SchemaError:
            continue
        inspect.signature(fn).bind(Target(), *args, **kwargs)  # (as the actor calls it)


@FUZZ
@given(fields=st.dictionaries(st.sampled_from(["a", "b", "rest", "c", "k", "self", "x", "y"]),
                              st.integers(0, 3) | st.lists(st.text(max_size=2), max_size=2)
                              | st.dictionaries(st.sampled_from(["a", "b", "z", "self"]),
                                                st.integers(0, 3), max_size=2),
                              max_size=6))
def test_any_field_map_gives_a_fitting_call_or_a_schema_error(fields: dict[str, Any]) -> None:
    body = msgspec.msgpack.encode(fields)
    for schema, fn in ((MIXED, Target.mixed), (PO, Target.po)):
        try:
            args, kwargs = schema.unpack_args(body, [])
        except SchemaError:
            continue
        inspect.signature(fn).bind(Target(), *args, **kwargs)


def test_positional_only_arguments_travel_by_name_and_arrive_by_position() -> None:
    assert round_trip(PO, (1,), {}) == ((1,), {})
    assert round_trip(PO, (1, "y"), {}) == ((1, "y"), {})
    assert round_trip(MIXED, (1, 2, "r"), {"c": 3, "a": 4}) == ((1, 2, "r"), {"c": 3, "a": 4})
    with pytest.raises(TypeError, match=r"positional-only.*'x', 'y'"):
        PO.pack_call((), {"x": 1, "y": ""}, Packer())


def test_a_kwargs_key_naming_a_parameter_is_refused() -> None:
    """As Python: ``self`` (bound already) or a parameter given twice."""
    with pytest.raises(SchemaError, match="multiple values for argument 'self'"):
        VAR.pack_call((), {"self": 1}, Packer())
    with pytest.raises(SchemaError, match="multiple values for argument 'b'"):
        MIXED.pack_call((1, 2), {"b": 3}, Packer())
    # (A frame that does so anyway fails as a SchemaError, not in the call.)
    with pytest.raises(SchemaError, match=r"'k' names parameter\(s\) \['self'\]"):
        VAR.unpack_args(msgspec.msgpack.encode({"a": [], "k": {"self": 2, "z": 3}}), [])
    with pytest.raises(SchemaError, match=r"'k' names parameter\(s\) \['b', 'c'\]"):
        MIXED.unpack_args(msgspec.msgpack.encode(
            {"a": 1, "rest": [], "k": {"b": 1, "c": 2, "self": 3}}), [])
    # ``self`` is positional-only where ``a`` is: a key like any other, as in Python.
    assert round_trip(MIXED, (1,), {"self": 3}) == ((1,), {"self": 3})
