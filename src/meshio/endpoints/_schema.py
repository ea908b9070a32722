"""Per-callable wire schema: argument binding, argument Struct, result type.

Built lazily (first use) so ``from __future__ import annotations`` and
forward references resolve once the defining module is complete.

Every way a value can fail to travel becomes a :class:`SchemaError` naming the
callable, the argument where known, and the cause: on the sender a value
that cannot be encoded, is nested too deeply or is over the message size
limit; on the receiver bad data, a pickle whose reconstruction raises or
names a class the receiver cannot import, a bad extension or buffer.

A parameter or result whose annotation msgspec cannot describe (a union of
two dataclasses, an enum of mixed values, a class holding one) travels
untyped, exactly as sent, and is checked here against its annotation
(:func:`_check_for`); nothing ever arrives as another type than the one
sent or annotated (a dataclass as a dict).
"""

# The checks of untyped annotations walk arbitrary user values (``Any``):
# pyright's strict "unknown type" checks do not apply to them.
# pyright: reportUnknownMemberType=false, reportUnknownVariableType=false
# pyright: reportUnknownArgumentType=false

from __future__ import annotations

import collections
import dataclasses
import datetime
import inspect
import operator
import re
import reprlib
import sys
import types
import typing
from collections import abc
from collections.abc import Awaitable, Callable, Coroutine, Iterable
from typing import Any, NoReturn

import msgspec

from .._exceptions import SchemaError
from .._transport._serial import (
    Buffers,
    Fit,
    Packer,
    Refit,
    TypedDecoder,
    Unfit,
    _Deferred,
    decoder_for,
    lenient,
    refitter,
    travel,
    type_name,
)

__all__ = ("Schema",)

_VARIADIC = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
#: an argument map, each value left encoded (no extension hook runs)
_raw_map = msgspec.msgpack.Decoder(dict[str, msgspec.Raw])


class Schema:
    """How the arguments and result of ``fn`` travel and are validated.

    ``fn`` is an unbound method; its first parameter (``self``) is skipped.
    """

    # Slots: the calls read these attributes (a dict would do too, until a
    # process makes more schemas than CPython's shared instance keys allow
    # for: reading one from a dict that no longer shares them costs more).
    __slots__ = ("_args", "_check", "_checks", "_clashes", "_defaults", "_each", "_fields",
                 "_hints", "_how", "_keywords", "_none", "_npos", "_posonly", "_ready",
                 "_refit", "_result", "_result_how", "_result_refit", "_sent",
                 "_spreads", "_types", "_varkw", "_varpos", "fn", "names", "positional",
                 "qualname", "required", "result_type", "result_typed", "typed")

    def __init__(self, fn: Callable[..., Any], qualname: str,
                 hints: dict[str, Any] | None = None) -> None:
        self.fn: Callable[..., Any] = fn
        self.qualname: str = qualname
        self._hints: dict[str, Any] | None = hints
        self._ready: bool = False
        #: whether :meth:`pack_result` checks a result (until built: builds)
        self._check: bool = True

    def __reduce__(self) -> tuple[Any, ...]:
        # Ship resolved annotations: a class pickled by value (defined in
        # __main__ or a notebook) loses the module globals that string
        # annotations (``from __future__ import annotations``) refer to.
        try:
            hints = self._hints if self._hints is not None else _hints(self.fn)
        except Exception:
            hints = None
        return (Schema, (self.fn, self.qualname, hints))

    def _build(self) -> None:
        sig = inspect.signature(self.fn)
        every = list(sig.parameters.values())
        params = every[1:]
        try:
            hints = self._hints if self._hints is not None else _hints(self.fn)
        except Exception as e:  # unresolvable forward reference: stay untyped
            raise SchemaError(
                f"{self.qualname}: cannot resolve annotations ({e}); define the "
                "referenced types at module level") from e
        kinds = {p.kind: p.name for p in params}
        #: the names of the ``*args`` and ``**kwargs`` parameters (None: no such)
        self._varpos: str | None = kinds.get(inspect.Parameter.VAR_POSITIONAL)
        self._varkw: str | None = kinds.get(inspect.Parameter.VAR_KEYWORD)
        named = [p for p in params if p.kind not in _VARIADIC]
        self.positional: tuple[str, ...] = tuple(
            p.name for p in named if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD))
        self._posonly: tuple[str, ...] = tuple(
            p.name for p in named if p.kind is p.POSITIONAL_ONLY)
        #: the call is not ``fn(self, **fields)``: it is rebuilt from the
        #: fields received (:meth:`_spread`)
        self._spreads = bool(self._posonly) or self._varpos is not None or self._varkw is not None
        self.names: frozenset[str] = frozenset(p.name for p in named)
        #: the parameters an argument may be passed to by name (``self`` too,
        #: unless positional-only: a ``**kwargs`` key of that name is a clash)
        self._keywords = self.names - frozenset(self._posonly)
        self._clashes = self._keywords | frozenset(
            p.name for p in every[:1] if p.kind is not p.POSITIONAL_ONLY)
        self.required: frozenset[str] = frozenset(
            p.name for p in named if p.default is p.empty)
        #: some parameter has a default (an argument may be left out)
        self._defaults = self.required != self.names
        #: how many positional arguments bind alone (-1: none do)
        self._npos = len(self.positional) if (
            self._varpos is None and self._varkw is None
            and self.names == frozenset(self.positional)) else -1
        self.typed: dict[str, bool] = {}
        #: how each argument travels (:meth:`Packer.pack_map`)
        self._how: dict[str, bool | Fit] = {}
        #: by field of the argument Struct: its type (``*args``: a list of
        #: the annotation's type, ``**kwargs``: a map of names to it)
        self._types: dict[str, Any] = {}
        self._each: dict[str, TypedDecoder] = {}
        #: by argument whose annotation msgspec cannot describe: its check
        self._checks: dict[str, _Check] = {}
        fields: list[tuple[str, Any, Any]] = []
        for p in params:
            hint = hints.get(p.name, Any)
            tp, typed = decoder_for(hint)
            self.typed[p.name] = typed
            check = None if typed else _check_for(hint)
            if p.kind is p.VAR_POSITIONAL:
                tp = types.GenericAlias(list, (tp,))
                check = check and _items(list, check, types.GenericAlias(list, (hint,)))
            elif p.kind is p.VAR_KEYWORD:
                tp = types.GenericAlias(dict, (str, tp))
                check = check and _mapping(dict, None, check,
                                           types.GenericAlias(dict, (str, hint)))
            if check is not None:
                self._checks[p.name] = check
            self._how[p.name] = travel(tp) if typed else False
            self._types[p.name] = tp
            if p.default is p.empty:
                fields.append((p.name, tp, msgspec.NODEFAULT))
            else:
                fields.append((p.name, tp | msgspec.UnsetType if typed else tp, msgspec.UNSET))
        #: the argument Struct's fields (``*args`` and ``**kwargs``: always sent)
        self._fields = frozenset(self._types)
        self._sent = self.required | (self._fields - self.names)
        struct = msgspec.defstruct(
            f"{self.qualname}.args", fields, kw_only=True, forbid_unknown_fields=True)
        self._args = (_Checked(struct, list(self._checks.items())) if self._checks
                      else TypedDecoder(struct))
        #: by argument: how it travels where it cannot as :attr:`_how` says (made
        #: when first needed: :meth:`_pack_refitted`)
        self._refit: dict[str, bool | Fit] | None = None
        rtp = hints.get("return", Any)
        if _is_awaitable(rtp):
            rtp = typing.get_args(rtp)[-1] if typing.get_args(rtp) else Any
        self.result_type: Any
        self.result_typed: bool
        self.result_type, self.result_typed = decoder_for(rtp)
        self._result_how = travel(self.result_type) if self.result_typed else False
        self._result_refit: Fit | None = None
        check = None if self.result_typed else _check_for(rtp)
        self._result = (TypedDecoder(self.result_type) if check is None
                        else _Checked(self.result_type, [(None, check)]))
        #: ``-> None``: a result is checked on the actor (:meth:`pack_result`)
        self._none = rtp is type(None) or rtp is None
        self._check = self._none
        self._ready = True

    # ------------------------------------------------------------- sender

    def pack_call(self, args: tuple[Any, ...], kwargs: dict[str, Any], packer: Packer) -> bytes:
        """A call's arguments, encoded by name (positional ones bound to
        their parameters, the names checked cheaply; ``*args`` as a list,
        ``**kwargs`` as a map, each by its parameter's name).

        Raises:
            SchemaError: they do not fit the signature, or cannot be sent.
            TypeError: a positional-only parameter is given by keyword (as
                Python raises).
        """
        if not self._ready:
            self._build()
        if not kwargs and len(args) == self._npos:  # every parameter, by position
            # (one: a display, 4x cheaper than dict(zip()) per call)
            bound = ({self.positional[0]: args[0]} if self._npos == 1
                     else dict(zip(self.positional, args)))
        else:
            bound = self._bind(args, kwargs)
        try:
            return packer.pack_map(bound, self._how)
        except (Refit, Unfit, OverflowError):  # (a typed value msgpack cannot carry as it is)
            return self._pack_refitted(bound, packer)
        except SchemaError as e:  # over the message size limit
            raise self._unsendable(e, bound) from None
        except Exception as e:  # the values' own pickling code may raise anything
            raise self._unsendable(e, bound) from e

    def _pack_refitted(self, bound: dict[str, Any], packer: Packer) -> bytes:
        """:meth:`pack_call` again, each typed value fitted to its
        annotation (:func:`refitter`: a builtin's subclass becomes the
        builtin), where it could not travel as it was."""
        if self._refit is None:
            self._refit = {name: refitter(tp) for name, tp in self._types.items()}
        del packer[:]
        try:
            with lenient():
                return packer.pack_map(bound, self._refit)
        except Unfit as e:
            raise SchemaError(
                f"{self.qualname}: arguments cannot be sent: {e}{_where(bound, e.value, '$.')}"
                "; send it as a float or a str, or annotate it `Any` (an untyped int "
                "travels pickled, whatever its size)") from None
        except SchemaError as e:
            raise self._unsendable(e, bound) from None
        except Exception as e:
            raise self._unsendable(e, bound) from e

    def _unsendable(self, e: Exception, bound: dict[str, Any]) -> SchemaError:
        if isinstance(e, SchemaError):  # over the message size limit
            return SchemaError(f"{self.qualname}: arguments cannot be sent: {e} (largest "
                               f"argument: {max(bound.items(), key=_size_of)[0]!r})")
        return SchemaError(f"{self.qualname}: arguments cannot be sent: {_why(e)}")

    def _bind(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
        """Arguments by name, checked against the signature."""
        if self._spreads:
            return self._bind_spread(args, kwargs)
        if args:
            if len(args) > len(self.positional):
                raise SchemaError(
                    f"{self.qualname}() takes {len(self.positional)} positional "
                    f"argument(s) but {len(args)} were given")
            bound = dict(zip(self.positional, args))
            for k in kwargs:
                if k in bound:
                    raise SchemaError(f"{self.qualname}() got multiple values for argument {k!r}")
            bound.update(kwargs)
        else:
            bound = kwargs
        if not bound.keys() <= self.names:
            self._unexpected(bound.keys() - self.names)
        if not self.required <= bound.keys():
            self._missing(bound.keys())
        return bound

    def _bind_spread(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
        """:meth:`_bind` for a signature with positional-only parameters,
        ``*args`` or ``**kwargs``: bound as Python binds them, the extra
        positional arguments a list, the extra keyword ones a map."""
        npos = len(self.positional)
        if len(args) > npos and self._varpos is None:
            raise SchemaError(f"{self.qualname}() takes {npos} positional argument(s) but "
                              f"{len(args)} were given")
        bound = dict(zip(self.positional, args))
        if self._varpos is not None:
            bound[self._varpos] = list(args[npos:])
        extra: dict[str, Any] = {}
        unknown: list[str] = []
        for k, v in kwargs.items():
            if k in self._keywords:
                if k in bound:
                    raise SchemaError(f"{self.qualname}() got multiple values for argument {k!r}")
                bound[k] = v
            elif self._varkw is None:
                unknown.append(k)
            elif k in self._clashes:  # (``self``)
                raise SchemaError(f"{self.qualname}() got multiple values for argument {k!r}")
            else:
                extra[k] = v
        if unknown:
            by_position = [k for k in unknown if k in self.names]
            if by_position:
                raise TypeError(
                    f"{self.qualname}() got some positional-only arguments passed as keyword "
                    f"arguments: {', '.join(map(repr, by_position))}; pass them by position")
            self._unexpected(unknown)
        if self._varkw is not None:
            bound[self._varkw] = extra
        if not self.required <= bound.keys():
            self._missing(bound.keys())
        return bound

    def _unexpected(self, names: Iterable[str]) -> NoReturn:
        raise SchemaError(
            f"{self.qualname}() got unexpected keyword argument(s) {sorted(names)}; "
            f"it accepts {sorted(self._keywords)}")

    def _missing(self, given: Iterable[str]) -> NoReturn:
        missing = sorted(self.required.difference(given))
        raise SchemaError(f"{self.qualname}() missing required argument(s) {missing}")

    def pack_result(self, value: Any, packer: Packer) -> bytes:
        """A result, encoded.

        Raises:
            SchemaError: ``fn`` is annotated ``-> None`` and ``value`` is not
                None, or the result is over the message size limit.
        """
        if self._check:  # not built yet, or ``-> None``
            self._check_result(value)
        try:
            return packer.pack(value, self._result_how)
        except (Refit, Unfit, OverflowError):  # (as in pack_call)
            return self._pack_result_refitted(value, packer)

    def _pack_result_refitted(self, value: Any, packer: Packer) -> bytes:
        """:meth:`pack_result` again, fitted (as :meth:`_pack_refitted`)."""
        if self._result_refit is None:
            self._result_refit = refitter(self.result_type)
        del packer[:]
        try:
            with lenient():
                return packer.pack(value, self._result_refit)
        except Unfit as e:
            raise SchemaError(f"{e}{_where({'': value}, e.value, '$')}; return it as a float "
                              "or a str, or annotate the result `Any` (an untyped int travels "
                              "pickled, whatever its size)") from None

    def _check_result(self, value: Any) -> None:
        if not self._ready:
            self._build()
        if self._none and value is not None:
            raise SchemaError(
                f"it does not match its annotation `-> None`: got `{type(value).__qualname__}` "
                f"{_describe(value)}; return None, or annotate the type it returns")

    # ----------------------------------------------------------- receiver

    def unpack_args(self, data: Any, bufs: Buffers) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """Decode and validate; raises :class:`SchemaError` naming the path,
        whatever goes wrong.  Nothing is unpickled before every argument that
        needs no unpickling has validated."""
        if not self._ready:
            self._build()
        try:
            value = self._args.decode(data, bufs, lazy=True)
        except msgspec.ValidationError as e:
            raise SchemaError(f"bad arguments for {self.qualname}: "
                              f"{self._args.explain_lazily(data, bufs, str(e))}") from None
        except Exception:  # a pickle to run, or bad data: argument by argument
            return self._unpack_each(data, bufs)
        kwargs: dict[str, Any] = msgspec.structs.asdict(value)
        if self._defaults:  # a parameter not sent keeps its default (UNSET: left out)
            kwargs = {name: v for name, v in kwargs.items() if v is not msgspec.UNSET}
        if self._spreads:
            return self._spread(kwargs)
        return (), kwargs

    def _unpack_each(self, data: Any, bufs: Buffers) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """The slow path: each argument alone, so errors name it; those that
        need no unpickling first."""
        q = self.qualname
        try:
            raws = _raw_map.decode(data)
        except Exception as e:
            raise SchemaError(f"undecodable arguments for {q}: {_why(e)}") from None
        if not raws.keys() <= self._fields:
            raise SchemaError(f"bad arguments for {q}: unknown argument(s) "
                              f"{sorted(raws.keys() - self._fields)}")
        missing = self._sent - raws.keys()
        if missing:
            raise SchemaError(f"bad arguments for {q}: missing argument(s) {sorted(missing)}")
        values: dict[str, Any] = {}
        pickled: list[str] = []
        for name, raw in raws.items():
            dec = self._decoder(name)
            try:
                values[name] = dec.decode(raw, bufs, lazy=True)
            except _Deferred:
                pickled.append(name)
            except msgspec.ValidationError as e:
                why = dec.explain_lazily(raw, bufs, str(e))
                raise SchemaError(f"bad arguments for {q}: {_at(why, name)}") from None
            except Exception as e:
                raise SchemaError(f"undecodable argument {name!r} for {q}: {_why(e)}") from None
        for name in pickled:
            try:
                values[name] = self._decoder(name).decode(raws[name], bufs)
            except msgspec.ValidationError as e:
                raise SchemaError(f"bad arguments for {q}: {_at(str(e), name)}") from None
            except BaseException as e:  # the value's own reconstruction code raised
                raise SchemaError(f"argument {name!r} of {q} cannot be decoded in this "
                                  f"process: {_why(e)}") from None
        return self._spread(values) if self._spreads else ((), values)

    def _decoder(self, name: str) -> TypedDecoder:
        dec = self._each.get(name)
        if dec is None:
            check = self._checks.get(name)
            dec = self._each[name] = (TypedDecoder(self._types[name]) if check is None
                                      else _Checked(self._types[name], [(None, check)]))
        return dec

    def _spread(self, fields: dict[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """The call's ``(args, kwargs)`` from the fields received (``fields``
        itself becomes ``kwargs``): positional-only parameters by position,
        and every positional one where there is an ``*args``; the keys of
        ``**kwargs`` by name beside the other parameters."""
        by_position = self.positional if self._varpos is not None else self._posonly
        args: list[Any] = []
        for name in by_position:
            if name not in fields:  # left out: it keeps its default, and those after it
                break
            args.append(fields.pop(name))
        if self._varpos is not None:
            rest: list[Any] = fields.pop(self._varpos)
            if rest and len(args) < len(by_position):
                raise SchemaError(f"bad arguments for {self.qualname}: {self._varpos!r} "
                                  f"holds values, but {by_position[len(args)]!r} was left out")
            args += rest
        if not fields.keys().isdisjoint(by_position):
            raise SchemaError(f"bad arguments for {self.qualname}: "
                              f"{by_position[len(args)]!r} was left out, but not those after it")
        if self._varkw is not None:
            extra: dict[str, Any] = fields.pop(self._varkw)
            if not self._clashes.isdisjoint(extra):
                raise SchemaError(f"bad arguments for {self.qualname}: {self._varkw!r} "
                                  f"names parameter(s) {sorted(self._clashes & extra.keys())}")
            fields.update(extra)
        return tuple(args), fields

    def unpack_result(self, data: Any, bufs: Buffers) -> Any:
        if not self._ready:
            self._build()
        try:
            return self._result.decode(data, bufs)
        except msgspec.ValidationError as e:
            raise SchemaError(f"result of {self.qualname} does not match its annotation: "
                              f"{self._result.explain(data, bufs, e)}") from None
        except BaseException as e:  # bad data, or the value's reconstruction code raised
            raise SchemaError(f"result of {self.qualname} cannot be decoded in this "
                              f"process: {_why(e)}") from None


def _hints(fn: Callable[..., Any]) -> dict[str, Any]:
    """``fn``'s annotations, resolved, ``Annotated`` kept: its
    ``msgspec.Meta`` constraints are checked too."""
    return typing.get_type_hints(fn, include_extras=True)


def _why(e: BaseException) -> str:
    """The cause of a failure to encode or decode, for a message."""
    if isinstance(e, RecursionError):
        return f"nested too deeply ({e})"
    t = type(e)
    name = t.__qualname__ if t.__module__ == "builtins" else f"{t.__module__}.{t.__qualname__}"
    return f"{name}: {e}"


def _describe(value: Any) -> str:
    """A short repr of ``value`` (a user's value: its ``__repr__`` may raise)."""
    try:
        return reprlib.repr(value)
    except Exception as e:
        return f"<unprintable: {_why(e)}>"


def _at(msg: str, name: str) -> str:
    """msgspec's message for one argument decoded alone, its path rooted at
    the argument (``$.name[0]``)."""
    if " - at `$" in msg:
        return msg.replace(" - at `$", f" - at `$.{name}", 1)
    return f"{msg} - at `$.{name}`"


def _size_of(item: tuple[str, Any]) -> int:
    """A cheap estimate of the size of an argument's value (``(name,
    value)``), to name the largest argument."""
    value = item[1]
    nbytes = getattr(value, "nbytes", None)
    if isinstance(nbytes, int):
        return nbytes
    try:
        return sys.getsizeof(value)
    except Exception:
        return 0


def _where(values: dict[str, Any], target: Any, root: str) -> str:
    """`` - at `$.big[2].n` ``: where ``target`` (by identity) is in one of
    ``values`` (by name, after ``root``), a value that cannot travel (``""``
    if it is not found)."""
    for name, value in values.items():
        path = _path_to(value, target, set())
        if path is not None:
            return f" - at `{root}{name}{path}`"
    return ""


def _path_to(v: Any, target: Any, seen: set[int]) -> str | None:
    if v is target:
        return ""
    if id(v) in seen:
        return None
    seen.add(id(v))
    parts: Iterable[tuple[str, Any]]
    if isinstance(v, dict):
        parts = [(f"[{_describe(k)}]", x) for k, x in v.items()]
        parts += [(f"[{_describe(k)}]", k) for k in v]  # (a key)
    elif isinstance(v, (list, tuple, set, frozenset)):
        parts = ((f"[{i}]", x) for i, x in enumerate(v))
    elif dataclasses.is_dataclass(v) and not isinstance(v, type):
        parts = ((f".{f.name}", getattr(v, f.name, None)) for f in dataclasses.fields(v))
    elif isinstance(v, msgspec.Struct):
        parts = ((f".{name}", getattr(v, name, None)) for name in v.__struct_fields__)
    else:
        return None
    for part, x in parts:
        path = _path_to(x, target, seen)
        if path is not None:
            return part + path
    return None


class _Checked(TypedDecoder):
    """A :class:`TypedDecoder` whose values are also checked against
    annotations msgspec cannot describe (the values travel untyped: its
    type holds ``Any`` for them): ``checks``, by field of the argument
    Struct (None: the whole value)."""

    __slots__ = ("_checks",)

    def __init__(self, tp: Any, checks: list[tuple[str | None, _Check]]) -> None:
        super().__init__(tp)
        self._checks = checks

    def decode(self, data: Any, bufs: Buffers, lazy: bool = False) -> Any:
        value = super().decode(data, bufs, lazy)
        for name, check in self._checks:
            part = value if name is None else getattr(value, name)
            if part is msgspec.UNSET:  # (left out: it keeps its default)
                continue
            try:
                check(part, set())
            except _Mismatch as e:
                raise msgspec.ValidationError(e.text("$" if name is None else f"$.{name}")
                                              ) from None
        return value


def _is_awaitable(tp: Any) -> bool:
    origin = typing.get_origin(tp)
    return origin in (Awaitable, Coroutine)


# ------------------------------------------------------ checked annotations
#
# An annotation msgspec cannot describe (a union of two dataclasses, an enum
# of mixed values, a class holding one) makes its value travel untyped: it
# arrives exactly as sent, and is checked here against the annotation, with
# isinstance at every level that can be seen (unions, Literal, the items of
# builtin containers, the fields of dataclasses, attrs classes, Structs,
# NamedTuples and TypedDicts, msgspec.Meta constraints); nothing converted.


class _Mismatch(Exception):
    """A value does not fit its annotation: ``message`` at ``path`` (its
    parts innermost first); ``matched``: the value was of the annotation's
    kind, a part of it is wrong (a union reports that arm)."""

    def __init__(self, message: str, matched: bool = False) -> None:
        super().__init__(message)
        self.message = message
        self.matched = matched
        self.path: list[str] = []

    def within(self, part: str) -> _Mismatch:
        self.path.append(part)
        self.matched = True
        return self

    def text(self, root: str) -> str:
        """The message as msgspec words one, its path from ``root``."""
        path = root + "".join(reversed(self.path))
        return self.message if path == "$" else f"{self.message} - at `{path}`"


#: checks a value; ``active``: the objects being checked further up (a
#: value that refers to itself is checked once)
_Check = Callable[[Any, set[tuple[int, int]]], None]
_MISSING = object()
_SEQUENCES = frozenset({list, set, frozenset, collections.deque, abc.Sequence,
                        abc.MutableSequence, abc.Set, abc.MutableSet, abc.Collection})
_MAPPINGS = frozenset({dict, collections.OrderedDict, collections.defaultdict, abc.Mapping,
                       abc.MutableMapping})
#: containers whose items are checked (iterating another runs its own code)
_WALKED = (list, tuple, set, frozenset, collections.deque)
_WRAPPERS = frozenset({typing.ClassVar, typing.Final, typing.Required, typing.NotRequired})


def _check_for(tp: Any) -> _Check | None:
    """The check of a value annotated ``tp`` that travels untyped; None: no
    check (``Any``).  It raises :class:`_Mismatch`."""
    return _Checks().of(tp)


class _Checks:
    """Builds the check of an annotation; a class that refers to itself
    gets one check."""

    def __init__(self) -> None:
        self._classes: dict[Any, _Check | None] = {}

    def of(self, tp: Any) -> _Check | None:
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
                return _items(tuple, self.of(args[0]), tp)
            return _fixed(tp, [self.of(a) for a in args])
        if origin is type:
            return _subclass(tp, args[0] if args else Any)
        if origin in _SEQUENCES:
            return _items(origin, self.of(args[0]) if args else None, tp)
        if origin in _MAPPINGS and len(args) == 2:
            return _mapping(origin, self.of(args[0]), self.of(args[1]), tp)
        if isinstance(origin, type):
            return self._class(origin, args, tp)
        if isinstance(tp, type):
            return self._class(tp, (), tp)
        return None  # (another special form: not checked)

    def _class(self, cls: type, args: tuple[Any, ...], tp: Any) -> _Check | None:
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
        later: list[_Check] = []
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


def _expected(tp: Any) -> str:
    """An annotation as a message names it (``P | Q``, ``list[P | Q]``)."""
    if tp is None or tp is type(None):
        return "None"
    if tp is Ellipsis:
        return "..."
    if isinstance(tp, list):  # (a Callable's parameters)
        return f"[{', '.join(_expected(a) for a in tp)}]"
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is typing.Union or origin is types.UnionType:
        return " | ".join(_expected(a) for a in args)
    if origin is typing.Literal:
        return f"Literal[{', '.join(map(repr, args))}]"
    if origin is typing.Annotated:
        return _expected(args[0])
    if origin is not None:
        inner = ", ".join(_expected(a) for a in args)
        return f"{_expected(origin)}[{inner}]" if args else _expected(origin)
    if isinstance(tp, type):
        return tp.__qualname__ if tp.__module__ in ("builtins", "typing") else tp.__name__
    return repr(tp)


def _got(tp: Any, v: Any) -> _Mismatch:
    return _Mismatch(f"Expected `{_expected(tp)}`, got `{type_name(type(v))}`")


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


def _instance(cls: type, tp: Any) -> _Check:
    def check(v: Any, active: set[tuple[int, int]]) -> None:
        if not isinstance(v, cls):
            raise _got(tp, v)
    return check


def _subclass(tp: Any, arg: Any) -> _Check:
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
            raise _Mismatch(f"Expected `{_expected(tp)}`, got the class `{v.__qualname__}`")
    return check


def _union(tp: Any, arms: list[_Check]) -> _Check:
    def check(v: Any, active: set[tuple[int, int]]) -> None:
        deepest: _Mismatch | None = None
        for arm in arms:
            try:
                arm(v, active)
                return
            except _Mismatch as e:
                if e.matched and deepest is None:
                    deepest = e
        raise deepest if deepest is not None else _got(tp, v)
    return check


def _literal(tp: Any, values: tuple[Any, ...]) -> _Check:
    def check(v: Any, active: set[tuple[int, int]]) -> None:
        # (the same type first: True is no 1 here, as for msgspec)
        if not any(type(v) is type(a) and v == a for a in values):
            raise _Mismatch(f"Expected `{_expected(tp)}`, got `{type_name(type(v))}` "
                            f"{_describe(v)}")
    return check


def _items(origin: type, item: _Check | None, tp: Any) -> _Check:
    def check(v: Any, active: set[tuple[int, int]]) -> None:
        if not isinstance(v, origin):
            raise _got(tp, v)
        if item is None or not isinstance(v, _WALKED) or _entered(v, check, active):
            return
        try:
            for i, x in enumerate(v):
                try:
                    item(x, active)
                except _Mismatch as e:
                    raise e.within(f"[{i}]") from None
        finally:
            active.discard((id(v), id(check)))
    return check


def _fixed(tp: Any, items: list[_Check | None]) -> _Check:
    """``tuple[A, B]`` (``tuple[()]``: an empty one)."""
    n = len(items)

    def check(v: Any, active: set[tuple[int, int]]) -> None:
        if not isinstance(v, tuple):
            raise _got(tp, v)
        if len(v) != n:
            raise _Mismatch(f"Expected `{_expected(tp)}`, got a tuple of length {len(v)}",
                            matched=True)
        for i, (item, x) in enumerate(zip(items, v)):
            if item is not None:
                try:
                    item(x, active)
                except _Mismatch as e:
                    raise e.within(f"[{i}]") from None
    return check


def _mapping(origin: type, key: _Check | None, value: _Check | None, tp: Any) -> _Check:
    def check(v: Any, active: set[tuple[int, int]]) -> None:
        if not isinstance(v, origin):
            raise _got(tp, v)
        if not isinstance(v, dict) or (key is None and value is None) \
                or _entered(v, check, active):
            return
        try:
            for k, x in v.items():
                where = f"[{_describe(k)}]"
                if key is not None:
                    try:
                        key(k, active)
                    except _Mismatch as e:
                        e.message += " (a key)"
                        raise e.within(where) from None
                if value is not None:
                    try:
                        value(x, active)
                    except _Mismatch as e:
                        raise e.within(where) from None
        finally:
            active.discard((id(v), id(check)))
    return check


def _object(cls: type, tp: Any, fields: list[tuple[str, _Check]]) -> _Check:
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
                    except _Mismatch as e:
                        raise e.within(f".{name}") from None
        finally:
            active.discard((id(v), id(check)))
    return check


def _typed_dict(tp: Any, fields: list[tuple[str, _Check]], required: frozenset[str]) -> _Check:
    def check(v: Any, active: set[tuple[int, int]]) -> None:
        if not isinstance(v, dict):
            raise _got(tp, v)
        missing = sorted(required - v.keys())
        if missing:
            raise _Mismatch(f"Object missing required field `{missing[0]}`", matched=True)
        for name, field in fields:
            if name in v:
                try:
                    field(v[name], active)
                except _Mismatch as e:
                    raise e.within(f".{name}") from None
    return check


def _entered(v: Any, check: _Check, active: set[tuple[int, int]]) -> bool:
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


def _constrained(tp: Any, base: _Check | None, metadata: tuple[Any, ...]) -> _Check | None:
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
                raise _Mismatch(f"Expected `{_expected(tp)}` {why}", matched=True)
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
