"""Checks of values against annotations msgspec cannot describe.

An annotation msgspec cannot describe (a union of two dataclasses, an enum
of mixed values, a class holding one) makes its value travel untyped: it
arrives exactly as sent, and is checked here against the annotation, with
isinstance at every level that can be seen (unions, Literal, the items of
builtin containers, the fields of dataclasses, attrs classes, Structs,
NamedTuples and TypedDicts, msgspec.Meta constraints); nothing converted.
:func:`check_for` builds the check (:mod:`._schema` runs it where a value
arrives); a value that does not fit raises :class:`Mismatch`.
"""

# (annotations are walked as the typing module gives them: untyped objects)
# pyright: reportUnknownMemberType=false, reportUnknownVariableType=false
# pyright: reportUnknownArgumentType=false

from __future__ import annotations

import collections
import dataclasses
import datetime
import operator
import re
import reprlib
import types
import typing
from collections import abc
from collections.abc import Callable
from typing import Any

import msgspec

from .._transport._serial import type_name

__all__ = ("Check", "Mismatch", "check_for", "describe", "expected", "items_of", "mapping_of",
           "why")


def why(e: BaseException) -> str:
    """The cause of a failure to encode or decode, for a message."""
    if isinstance(e, RecursionError):
        return f"nested too deeply ({e})"
    t = type(e)
    name = t.__qualname__ if t.__module__ == "builtins" else f"{t.__module__}.{t.__qualname__}"
    return f"{name}: {e}"


def describe(value: Any) -> str:
    """A short repr of ``value`` (a user's value: its ``__repr__`` may raise)."""
    try:
        return reprlib.repr(value)
    except Exception as e:
        return f"<unprintable: {why(e)}>"


class Mismatch(Exception):
    """A value does not fit its annotation: ``message`` at ``path`` (its
    parts innermost first); ``matched``: the value was of the annotation's
    kind, a part of it is wrong (a union reports that arm)."""

    def __init__(self, message: str, matched: bool = False) -> None:
        super().__init__(message)
        self.message = message
        self.matched = matched
        self.path: list[str] = []

    def within(self, part: str) -> Mismatch:
        self.path.append(part)
        self.matched = True
        return self

    def text(self, root: str) -> str:
        """The message as msgspec words one, its path from ``root``."""
        path = root + "".join(reversed(self.path))
        return self.message if path == "$" else f"{self.message} - at `{path}`"


#: checks a value; ``active``: the objects being checked further up (a
#: value that refers to itself is checked once)
Check = Callable[[Any, set[tuple[int, int]]], None]
_MISSING = object()
_SEQUENCES = frozenset({list, set, frozenset, collections.deque, abc.Sequence,
                        abc.MutableSequence, abc.Set, abc.MutableSet, abc.Collection})
_MAPPINGS = frozenset({dict, collections.OrderedDict, collections.defaultdict, abc.Mapping,
                       abc.MutableMapping})
#: containers whose items are checked (iterating another runs its own code)
_WALKED = (list, tuple, set, frozenset, collections.deque)
_WRAPPERS = frozenset({typing.ClassVar, typing.Final, typing.Required, typing.NotRequired})


def check_for(tp: Any) -> Check | None:
    """The check of a value annotated ``tp`` that travels untyped; None: no
    check (``Any``).  It raises :class:`Mismatch`."""
    return _Checks().of(tp)


class _Checks:
    """Builds the check of an annotation; a class that refers to itself
    gets one check."""

    def __init__(self) -> None:
        self._classes: dict[Any, Check | None] = {}

    def of(self, tp: Any) -> Check | None:
        if tp is Any or tp is object or isinstance(tp, (typing.TypeVar, str, typing.ForwardRef)):
            return None  # (a string or TypeVar left unresolved: not checked)
        if tp is None or tp is type(None):
            return _check_none
        if isinstance(tp, typing.NewType):
            return self.of(tp.__supertype__)
        if type(tp).__name__ == "TypeAliasType":  # (``type X = ...``, Python 3.12)
            return self.of(tp.__value__)
        origin, args = typing.get_origin(tp), typing.get_args(tp)
        if origin is typing.Annotated:
            return _constrained(args[0], self.of(args[0]), tp.__metadata__)
        if origin is typing.Union or origin is types.UnionType:
            arms = [self.of(a) for a in args]
            return None if None in arms else _union(tp, [a for a in arms if a is not None])
        if origin is typing.Literal:
            return _literal(tp, args)
        if origin in _WRAPPERS:
            return self.of(args[0]) if args else None
        if origin is tuple:
            if len(args) == 2 and args[1] is Ellipsis:
                return items_of(tuple, self.of(args[0]), tp)
            return _fixed(tp, [self.of(a) for a in args])
        if origin is type:
            return _subclass(tp, args[0] if args else Any)
        if origin in _SEQUENCES:
            return items_of(origin, self.of(args[0]) if args else None, tp)
        if origin in _MAPPINGS and len(args) == 2:
            return mapping_of(origin, self.of(args[0]), self.of(args[1]), tp)
        if isinstance(origin, type):
            return self._class(origin, args, tp)
        if isinstance(tp, type):
            return self._class(tp, (), tp)
        return None  # (another special form: not checked)

    def _class(self, cls: type, args: tuple[Any, ...], tp: Any) -> Check | None:
        if cls is bool:
            return _check_bool
        if cls is int:
            return _check_int
        if cls is float:
            return _check_float
        if getattr(cls, "_is_protocol", False) and not getattr(cls, "_is_runtime_protocol", False):
            return None  # (isinstance cannot check it)
        fields = _fields(cls, args)
        if fields is None:  # (a plain class; a generic one's arguments are not checked)
            return _instance(cls, tp)
        key: tuple[type, Any] = (cls, args)
        try:
            if key in self._classes:
                return self._classes[key]
        except TypeError:  # (unhashable arguments: it cannot refer to itself through them)
            key = (cls, id(tp))
        later: list[Check] = []
        self._classes[key] = lambda v, active: later[0](v, active)
        checks = [(name, check) for name, hint in fields if (check := self.of(hint)) is not None]
        if typing.is_typeddict(cls):
            made = _typed_dict(tp, checks, frozenset(getattr(cls, "__required_keys__", ())))
        else:
            made = _object(cls, tp, checks)
        later.append(made)
        self._classes[key] = made
        return made


def _fields(cls: type, args: tuple[Any, ...]) -> list[tuple[str, Any]] | None:
    """The fields of a class msgspec encodes by its fields (a dataclass, an
    attrs class, a Struct, a NamedTuple, a TypedDict) with their
    annotations (a generic one's type variables replaced by ``args``);
    None for another class."""
    if dataclasses.is_dataclass(cls):
        names = [f.name for f in dataclasses.fields(cls)]
    elif isinstance(cls, type) and issubclass(cls, msgspec.Struct):
        names = list(cls.__struct_fields__)
    elif hasattr(cls, "__attrs_attrs__"):
        names = [a.name for a in cls.__attrs_attrs__]
    elif issubclass(cls, tuple) and isinstance(named := getattr(cls, "_fields", None), tuple):
        names = list(named)  # (a NamedTuple)
    elif typing.is_typeddict(cls):
        names = None
    else:
        return None
    try:
        hints = typing.get_type_hints(cls, include_extras=True)
    except Exception:  # (unresolvable: the fields are not checked)
        hints = {}
    params = getattr(cls, "__parameters__", ())
    values = dict(zip(params, args)) if params else {}
    return [(name, _bound(hints.get(name, Any), values))
            for name in (list(hints) if names is None else names)]


def _bound(hint: Any, values: dict[Any, Any]) -> Any:
    """``hint``, its type variables replaced by ``values`` (unknown ones:
    ``Any``)."""
    if isinstance(hint, typing.TypeVar):
        return values.get(hint, Any)
    params = getattr(hint, "__parameters__", ())
    if not params:
        return hint
    try:
        return hint[tuple(values.get(p, Any) for p in params)]
    except TypeError:
        return Any


def expected(tp: Any) -> str:
    """An annotation as a message names it (``P | Q``, ``list[P | Q]``)."""
    if tp is None or tp is type(None):
        return "None"
    if tp is Ellipsis:
        return "..."
    if isinstance(tp, list):  # (a Callable's parameters)
        return f"[{', '.join(expected(a) for a in tp)}]"
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is typing.Union or origin is types.UnionType:
        return " | ".join(expected(a) for a in args)
    if origin is typing.Literal:
        return f"Literal[{', '.join(map(repr, args))}]"
    if origin is typing.Annotated:
        return expected(args[0])
    if origin is not None:
        inner = ", ".join(expected(a) for a in args)
        return f"{expected(origin)}[{inner}]" if args else expected(origin)
    if isinstance(tp, type):
        return tp.__qualname__ if tp.__module__ in ("builtins", "typing") else tp.__name__
    return repr(tp)


def _got(tp: Any, v: Any) -> Mismatch:
    return Mismatch(f"Expected `{expected(tp)}`, got `{type_name(type(v))}`")


def _check_none(v: Any, active: set[tuple[int, int]]) -> None:
    if v is not None:
        raise _got(None, v)


def _check_bool(v: Any, active: set[tuple[int, int]]) -> None:
    if type(v) is not bool:
        raise _got(bool, v)


def _check_int(v: Any, active: set[tuple[int, int]]) -> None:
    if not isinstance(v, int) or isinstance(v, bool):  # (as msgspec: a bool is no int)
        raise _got(int, v)


def _check_float(v: Any, active: set[tuple[int, int]]) -> None:
    if not isinstance(v, (int, float)) or isinstance(v, bool):  # (an int is a float)
        raise _got(float, v)


def _instance(cls: type, tp: Any) -> Check:
    def check(v: Any, active: set[tuple[int, int]]) -> None:
        if not isinstance(v, cls):
            raise _got(tp, v)
    return check


def _subclass(tp: Any, arg: Any) -> Check:
    """``type[X]``: a class, and a subclass of ``X`` (of an arm of a union)."""
    bases = typing.get_args(arg) if typing.get_origin(arg) in (typing.Union, types.UnionType) \
        else (arg,)
    bases = tuple(typing.get_origin(b) or b for b in bases)

    def check(v: Any, active: set[tuple[int, int]]) -> None:
        if not isinstance(v, type):
            raise _got(tp, v)
        if Any in bases or object in bases:
            return
        if not all(isinstance(b, type) for b in bases) or not issubclass(v, bases):
            raise Mismatch(f"Expected `{expected(tp)}`, got the class `{v.__qualname__}`")
    return check


def _union(tp: Any, arms: list[Check]) -> Check:
    def check(v: Any, active: set[tuple[int, int]]) -> None:
        deepest: Mismatch | None = None
        for arm in arms:
            try:
                arm(v, active)
                return
            except Mismatch as e:
                if e.matched and deepest is None:
                    deepest = e
        raise deepest if deepest is not None else _got(tp, v)
    return check


def _literal(tp: Any, values: tuple[Any, ...]) -> Check:
    def check(v: Any, active: set[tuple[int, int]]) -> None:
        # (the same type first: True is no 1 here, as for msgspec)
        if not any(type(v) is type(a) and v == a for a in values):
            raise Mismatch(f"Expected `{expected(tp)}`, got `{type_name(type(v))}` "
                            f"{describe(v)}")
    return check


def items_of(origin: type, item: Check | None, tp: Any) -> Check:
    def check(v: Any, active: set[tuple[int, int]]) -> None:
        if not isinstance(v, origin):
            raise _got(tp, v)
        if item is None or not isinstance(v, _WALKED) or _entered(v, check, active):
            return
        try:
            for i, x in enumerate(v):
                try:
                    item(x, active)
                except Mismatch as e:
                    raise e.within(f"[{i}]") from None
        finally:
            active.discard((id(v), id(check)))
    return check


def _fixed(tp: Any, items: list[Check | None]) -> Check:
    """``tuple[A, B]`` (``tuple[()]``: an empty one)."""
    n = len(items)

    def check(v: Any, active: set[tuple[int, int]]) -> None:
        if not isinstance(v, tuple):
            raise _got(tp, v)
        if len(v) != n:
            raise Mismatch(f"Expected `{expected(tp)}`, got a tuple of length {len(v)}",
                            matched=True)
        for i, (item, x) in enumerate(zip(items, v)):
            if item is not None:
                try:
                    item(x, active)
                except Mismatch as e:
                    raise e.within(f"[{i}]") from None
    return check


def mapping_of(origin: type, key: Check | None, value: Check | None, tp: Any) -> Check:
    def check(v: Any, active: set[tuple[int, int]]) -> None:
        if not isinstance(v, origin):
            raise _got(tp, v)
        if not isinstance(v, dict) or (key is None and value is None) \
                or _entered(v, check, active):
            return
        try:
            for k, x in v.items():
                where = f"[{describe(k)}]"
                if key is not None:
                    try:
                        key(k, active)
                    except Mismatch as e:
                        e.message += " (a key)"
                        raise e.within(where) from None
                if value is not None:
                    try:
                        value(x, active)
                    except Mismatch as e:
                        raise e.within(where) from None
        finally:
            active.discard((id(v), id(check)))
    return check


def _object(cls: type, tp: Any, fields: list[tuple[str, Check]]) -> Check:
    """An instance of ``cls``, its fields checked (one it lacks is not: its
    class allows that)."""
    def check(v: Any, active: set[tuple[int, int]]) -> None:
        if not isinstance(v, cls):
            raise _got(tp, v)
        if not fields or _entered(v, check, active):
            return
        try:
            for name, field in fields:
                x = getattr(v, name, _MISSING)
                if x is not _MISSING:
                    try:
                        field(x, active)
                    except Mismatch as e:
                        raise e.within(f".{name}") from None
        finally:
            active.discard((id(v), id(check)))
    return check


def _typed_dict(tp: Any, fields: list[tuple[str, Check]], required: frozenset[str]) -> Check:
    def check(v: Any, active: set[tuple[int, int]]) -> None:
        if not isinstance(v, dict):
            raise _got(tp, v)
        missing = sorted(required - v.keys())
        if missing:
            raise Mismatch(f"Object missing required field `{missing[0]}`", matched=True)
        for name, field in fields:
            if name in v:
                try:
                    field(v[name], active)
                except Mismatch as e:
                    raise e.within(f".{name}") from None
    return check


def _entered(v: Any, check: Check, active: set[tuple[int, int]]) -> bool:
    """Whether ``v`` is being checked by ``check`` further up (it refers to
    itself: checked there); else it is now (the caller leaves it)."""
    key = (id(v), id(check))
    if key in active:
        return True
    active.add(key)
    return False


_BOUNDS = (("gt", operator.gt, ">"), ("ge", operator.ge, ">="), ("lt", operator.lt, "<"),
           ("le", operator.le, "<="))
_SIZED = (str, bytes, bytearray, list, tuple, dict, set, frozenset)


def _constrained(tp: Any, base: Check | None, metadata: tuple[Any, ...]) -> Check | None:
    """``Annotated[tp, msgspec.Meta(...)]``: ``tp``'s check (``base``), then
    the constraints (bounds, ``multiple_of``, lengths, ``pattern``, ``tz``),
    worded as msgspec words them."""
    metas = [m for m in metadata if isinstance(m, msgspec.Meta)]
    if not metas:
        return base

    def check(v: Any, active: set[tuple[int, int]]) -> None:
        if base is not None:
            base(v, active)
        for meta in metas:
            why = _unmet(meta, v)
            if why is not None:
                raise Mismatch(f"Expected `{expected(tp)}` {why}", matched=True)
    return check


def _unmet(meta: msgspec.Meta, v: Any) -> str | None:
    """The constraint of ``meta`` that ``v`` does not meet, in words."""
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        for name, op, sign in _BOUNDS:
            bound = getattr(meta, name)
            if bound is not None and not op(v, bound):
                return f"{sign} {bound}"
        if meta.multiple_of is not None and v % meta.multiple_of != 0:
            return f"that's a multiple of {meta.multiple_of}"
    if isinstance(v, _SIZED):
        if meta.min_length is not None and len(v) < meta.min_length:
            return f"of length >= {meta.min_length}"
        if meta.max_length is not None and len(v) > meta.max_length:
            return f"of length <= {meta.max_length}"
    if isinstance(v, str) and meta.pattern is not None and re.search(meta.pattern, v) is None:
        return f"matching regex {meta.pattern!r}"
    if meta.tz is not None and isinstance(v, (datetime.datetime, datetime.time)) \
            and (v.tzinfo is not None) != meta.tz:
        return "with a timezone component" if meta.tz else "with no timezone component"
    return None
