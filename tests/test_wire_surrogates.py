"""A ``str`` holding a lone surrogate (what ``os.fsdecode`` makes of a file
name's undecodable bytes: ``"\\udcff"``), which msgpack's UTF-8 str cannot
carry, inside a typed annotation: in an ``Any`` part it travels as an
untyped value does (pickled); where the annotation says ``str`` it is a
:class:`~meshio.SchemaError` naming the argument or the result, and where.

Most tests pack and unpack through :class:`~meshio.endpoints._schema.Schema`
as the wire does (its buffers copied); the last ones run through a worker
process, with each adverb."""

from __future__ import annotations

import asyncio
import dataclasses
import os
from collections.abc import AsyncIterator
from typing import Any

import numpy as np
import pytest
import pytest_asyncio
from hypothesis import given
from hypothesis import strategies as st

import meshio
from fuzz import FUZZ
from meshio import Actor, ActorMesh, SchemaError, endpoint
from meshio._transport._serial import KIND_BYTES, OOB_THRESHOLD, Packer
from meshio.endpoints._schema import Schema

#: a file name's undecodable byte, as Python decodes it (``surrogateescape``)
NAME = os.fsdecode(b"caf\xff.txt")


@dataclasses.dataclass
class Entry:
    path: str
    meta: Any


class Target:
    def mapping(self, d: dict[str, Any]) -> dict[str, Any]:
        raise NotImplementedError

    def items(self, xs: list[Any]) -> list[Any]:
        raise NotImplementedError

    def pair(self, p: tuple[int, Any]) -> tuple[int, Any]:
        raise NotImplementedError

    def entry(self, e: Entry) -> Entry:
        raise NotImplementedError

    def names(self, ns: list[str]) -> list[str]:
        raise NotImplementedError

    def by_name(self, d: dict[str, str]) -> dict[str, str]:
        raise NotImplementedError

    def both(self, x: float, d: dict[str, Any]) -> tuple[float, dict[str, Any]]:
        raise NotImplementedError

    def spread(self, *xs: Any, **kw: Any) -> None:
        raise NotImplementedError


def schema(name: str) -> Schema:
    return Schema(getattr(Target, name), f"Target.{name}")


def wire(packer: Packer) -> list[Any]:
    """The buffers of ``packer`` as a receiver gets them (copied)."""
    return [bytes(memoryview(b)) if k == KIND_BYTES else bytearray(b) for b, k in packer]


def round_trip(name: str, *args: Any, **kwargs: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
    s = schema(name)
    packer = Packer()
    body = s.pack_call(args, kwargs, packer)
    return s.unpack_args(body, wire(packer))


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


# ------------------------------------------------------------ in Any parts

IN_ANY = [
    ("mapping", {"k": NAME, "n": 1}),
    ("mapping", {"deep": {"a": [1, "\ud800"], "\udcff key": 2}, "t": ("x", "\udfff")}),
    ("mapping", {"big": "x\ud800" * (OOB_THRESHOLD // 2 + 1)}),  # (out of band, were it UTF-8)
    ("items", ["ok", NAME, b"\xff"]),
    ("pair", (1, NAME)),
    ("entry", Entry("ok", {"name": NAME})),
]


@pytest.mark.parametrize(("name", "value"), IN_ANY)
def test_in_an_any_part_it_travels_as_an_untyped_value(name: str, value: Any) -> None:
    _, got = round_trip(name, value)
    assert same(got[next(iter(got))], value)
    assert same(result_trip(name, value), value)


def test_with_a_value_that_is_refitted_too() -> None:
    """An ``np.float64`` for a ``float`` (refitted) beside a surrogate in an
    ``Any`` part: both travel, whichever the encoder meets first."""
    _, got = round_trip("both", np.float64(1.5), {"k": NAME})
    assert same(got, {"x": 1.5, "d": {"k": NAME}})
    assert same(result_trip("both", (np.float64(2.5), {"k": NAME})), (2.5, {"k": NAME}))
    assert same(result_trip("both", (2.5, {"k": NAME, "n": np.float64(1.0)})),
                (2.5, {"k": NAME, "n": np.float64(1.0)}))


def test_variadic_untyped_arguments_travel() -> None:
    args, kwargs = round_trip("spread", NAME, [NAME], key=NAME)
    assert same(args, (NAME, [NAME])) and same(kwargs, {"key": NAME})


# ------------------------------------------------------ where it says str


@pytest.mark.parametrize(("name", "value", "path"), [
    ("names", ["ok", NAME], r"'ns' .* - at `\$\.ns\[1\]`"),
    ("by_name", {"k": NAME}, r"'d' .* - at `\$\.d\['k'\]`"),
    ("mapping", {NAME: 1}, r"'d' .* - at `\$\.d\['caf\\udcff\.txt'\]`"),  # (a key is a str)
    ("entry", Entry(NAME, None), r"'e' .* - at `\$\.e\.path`"),
])
def test_where_it_says_str_an_argument_is_refused_naming_it(name: str, value: Any,
                                                            path: str) -> None:
    with pytest.raises(SchemaError, match=(
            rf"^Target\.{name}: arguments cannot be sent: {path}.*annotate it `Any`")):
        round_trip(name, value)


@pytest.mark.parametrize(("name", "value", "path"), [
    ("names", ["ok", NAME], r"\$\[1\]"),
    ("by_name", {"k": NAME}, r"\$\['k'\]"),
    ("entry", Entry(NAME, None), r"\$\.path"),
    ("both", (np.float64(1.0), {NAME: 1}), r"\$\[1\]\['caf\\udcff\.txt'\]"),
])
def test_where_it_says_str_a_result_is_refused_naming_it(name: str, value: Any,
                                                         path: str) -> None:
    with pytest.raises(SchemaError, match=(
            rf"^the result holds a str UTF-8 cannot encode .* - at `{path}`.*annotate it `Any`")):
        result_trip(name, value)


# -------------------------------------------------------------------- fuzz

#: strs, some holding lone surrogates
texts = st.text(st.sampled_from("aé€\ud800\udcff\udfff"), max_size=4)
untyped = st.recursive(
    st.none() | st.integers(-3, 3) | texts,
    lambda inner: (st.lists(inner, max_size=3) | st.tuples(inner, inner)
                   | st.dictionaries(texts, inner, max_size=3)),
    max_leaves=8)


def utf8(s: str) -> bool:
    return not any(0xD800 <= ord(c) < 0xE000 for c in s)


@FUZZ
@given(value=st.dictionaries(texts, untyped, max_size=3))
def test_fuzz_any_values_travel_and_str_keys_are_checked(value: dict[str, Any]) -> None:
    if all(map(utf8, value)):
        assert same(round_trip("mapping", value)[1]["d"], value)
        assert same(result_trip("mapping", value), value)
    else:
        with pytest.raises(SchemaError, match=r"'d' holds a str UTF-8 cannot encode"):
            round_trip("mapping", value)
        with pytest.raises(SchemaError, match=r"the result holds a str UTF-8 cannot encode"):
            result_trip("mapping", value)


@FUZZ
@given(value=st.lists(texts, max_size=4))
def test_fuzz_strs_where_it_says_str(value: list[str]) -> None:
    if all(map(utf8, value)):
        assert same(round_trip("names", value)[1]["ns"], value)
    else:
        bad = next(i for i, s in enumerate(value) if not utf8(s))
        with pytest.raises(SchemaError, match=rf"- at `\$\.ns\[{bad}\]`"):
            round_trip("names", value)


# ------------------------------------------------------------ through a worker


class Files(Actor):
    @endpoint
    async def echo(self, d: dict[str, Any]) -> dict[str, Any]:
        return d

    @endpoint
    async def listing(self, n: int) -> dict[str, Any]:
        return {"names": [os.fsdecode(b"caf\xff.txt")] * n}

    @endpoint
    async def names(self, n: int) -> list[str]:
        return ["ok", os.fsdecode(b"caf\xff.txt")][:n]

    @endpoint
    async def count(self, ns: list[str]) -> int:
        return len(ns)


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def files() -> AsyncIterator[ActorMesh[Files]]:
    async with meshio.this_host().spawn_procs(per_host={"procs": 1}, name="surrogates") as pm:
        yield await pm.spawn("files", Files)  # type: ignore[misc]


ADVERBS = ("call_one", "call", "stream")


async def values_of(endpoint_: Any, adverb: str, *args: Any) -> list[Any]:
    """What the ``adverb`` of ``endpoint_`` returns for ``args``, as a list."""
    if adverb == "call_one":
        return [await asyncio.wait_for(endpoint_.call_one(*args), 60)]
    if adverb == "call":
        return list((await asyncio.wait_for(endpoint_.call(*args), 60)).values())

    async def streamed() -> list[Any]:
        return [v async for _, v in endpoint_.stream(*args)]
    return await asyncio.wait_for(streamed(), 60)


@pytest.mark.asyncio(loop_scope="module")
@pytest.mark.parametrize("adverb", ADVERBS)
async def test_through_a_worker(files: ActorMesh[Files], adverb: str) -> None:
    value = {"name": NAME, "more": [NAME, ("\ud800",)]}
    assert same(await values_of(files.echo, adverb, value), [value])
    assert same(await values_of(files.listing, adverb, 2), [{"names": [NAME, NAME]}])
    assert await values_of(files.names, adverb, 1) == [["ok"]]
    with pytest.raises(SchemaError, match=(
            r"result of Files\.names could not be encoded: the result holds a str UTF-8 "
            r"cannot encode .* - at `\$\[1\]`")):
        await values_of(files.names, adverb, 2)
    with pytest.raises(SchemaError, match=(
            r"^Files\.count: arguments cannot be sent: 'ns' holds a str UTF-8 cannot "
            r"encode .* - at `\$\.ns\[0\]`")):
        await values_of(files.count, adverb, [NAME])
    assert await values_of(files.count, adverb, ["a", "b"]) == [2]  # (it serves on)
