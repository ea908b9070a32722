"""A ``memoryview`` inside a value that is pickled (a dataclass or a plain
object, under ``object``, ``Any`` or no annotation) arrives as a
``memoryview`` of the same format, shape and bytes, read-only where it was,
as one sent at top level does; not as ``bytes``."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

import meshio
from meshio import Actor, endpoint

MiB = 1 << 20


@dataclasses.dataclass
class Box:
    mv: Any


class Plain:
    def __init__(self, mv: Any) -> None:
        self.mv = mv


class Echo(Actor):
    @endpoint
    async def echo_object(self, v: object) -> object:
        return v

    @endpoint
    async def echo_any(self, v: Any) -> Any:
        return v

    @endpoint
    async def echo_bare(self, v):  # type: ignore[no-untyped-def]
        return v

    @endpoint
    async def make(self, kind: str, form: str, size: int, readonly: bool) -> object:
        return _wrapped(kind, _view(form, size, readonly))


def _view(form: str, size: int, readonly: bool) -> memoryview[Any]:
    """``size`` bytes of a pattern as a view of ``form`` (``"2-D i"``: 4 rows
    of ``"i"``), read-only (over ``bytes``) or not."""
    data = bytes(i % 251 for i in range(size))
    mv = memoryview(data if readonly else bytearray(data))
    if form == "2-D i":
        return mv.cast("i", [4, size // 16])
    return mv.cast("d") if form == "d" else mv


def _wrapped(kind: str, mv: memoryview[Any]) -> object:
    return {"dataclass": Box(mv), "plain": Plain(mv), "tuple": Box((1, mv))}[kind]


def _unwrapped(kind: str, v: Any) -> Any:
    return v.mv[1] if kind == "tuple" else v.mv


def _same(got: Any, sent: memoryview[Any]) -> None:
    assert type(got) is memoryview
    assert (got.format, got.shape, got.itemsize, got.readonly) == (
        sent.format, sent.shape, sent.itemsize, sent.readonly)
    assert got.tobytes() == sent.tobytes()


FORMS = [(form, size) for form in ("2-D i", "d", "B") for size in (16, 2 * MiB)]
KINDS = ["dataclass", "plain", "tuple"]


@pytest.fixture
async def echo(procs: meshio.ProcMesh) -> Echo:
    return (await procs.spawn("echo", Echo)).slice(procs=0)


@pytest.mark.parametrize("kind", KINDS)
async def test_a_nested_memoryview_argument_keeps_format_and_shape(echo: Echo, kind: str) -> None:
    for form, size in FORMS:
        for readonly in (False, True):
            sent = _view(form, size, readonly)
            for ep in (echo.echo_object, echo.echo_any, echo.echo_bare):
                _same(_unwrapped(kind, await ep.call_one(_wrapped(kind, sent))), sent)


@pytest.mark.parametrize("kind", KINDS)
async def test_a_nested_memoryview_result_keeps_format_and_shape(echo: Echo, kind: str) -> None:
    for form, size in FORMS:
        for readonly in (False, True):
            got = await echo.make.call_one(kind, form, size, readonly)
            _same(_unwrapped(kind, got), _view(form, size, readonly))


async def test_a_strided_nested_memoryview_arrives_compact(echo: Echo) -> None:
    whole = memoryview(bytearray(range(64))).cast("i")
    got = (await echo.echo_any.call_one(Box(whole[::2]))).mv
    assert type(got) is memoryview and (got.format, got.shape) == ("i", (8,))
    assert got.tolist() == whole.tolist()[::2]
