"""Per-callable wire schema: argument binding, argument Struct, result type.

Built lazily (first use) so ``from __future__ import annotations`` and
forward references resolve once the defining module is complete.

Every way a value can fail to travel becomes a :class:`SchemaError` naming the
callable, the argument where known, and the cause: on the sender a value
that cannot be encoded, is nested too deeply or is over the message size
limit; on the receiver bad data, a pickle whose reconstruction raises or
names a class the receiver cannot import, a bad extension or buffer.
"""

from __future__ import annotations

import inspect
import reprlib
import sys
import types
import typing
from collections.abc import Awaitable, Callable, Coroutine, Iterable
from typing import Any, NoReturn

import msgspec

from .._exceptions import SchemaError
from .._transport._serial import Buffers, Packer, TypedDecoder, _Deferred, decoder_for

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
    __slots__ = ("_args", "_check", "_clashes", "_defaults", "_each", "_fields", "_hints",
                 "_keywords", "_none", "_npos", "_posonly", "_ready", "_result", "_sent",
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
            hints = self._hints if self._hints is not None else typing.get_type_hints(self.fn)
        except Exception:
            hints = None
        return (Schema, (self.fn, self.qualname, hints))

    def _build(self) -> None:
        sig = inspect.signature(self.fn)
        every = list(sig.parameters.values())
        params = every[1:]
        try:
            hints = self._hints if self._hints is not None else typing.get_type_hints(self.fn)
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
        #: by field of the argument Struct: its type (``*args``: a list of
        #: the annotation's type, ``**kwargs``: a map of names to it)
        self._types: dict[str, Any] = {}
        self._each: dict[str, TypedDecoder] = {}
        fields: list[tuple[str, Any, Any]] = []
        for p in params:
            tp, typed = decoder_for(hints.get(p.name, Any))
            self.typed[p.name] = typed
            if p.kind is p.VAR_POSITIONAL:
                tp = types.GenericAlias(list, (tp,))
            elif p.kind is p.VAR_KEYWORD:
                tp = types.GenericAlias(dict, (str, tp))
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
        self._args = TypedDecoder(struct)
        rtp = hints.get("return", Any)
        if _is_awaitable(rtp):
            rtp = typing.get_args(rtp)[-1] if typing.get_args(rtp) else Any
        self.result_type: Any
        self.result_typed: bool
        self.result_type, self.result_typed = decoder_for(rtp)
        self._result = TypedDecoder(self.result_type)
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
            return packer.pack_map(bound, self.typed)
        except SchemaError as e:  # over the message size limit
            raise SchemaError(f"{self.qualname}: arguments cannot be sent: {e} (largest "
                              f"argument: {max(bound.items(), key=_size_of)[0]!r})"
                              ) from None
        except Exception as e:  # the values' own pickling code may raise anything
            raise SchemaError(f"{self.qualname}: arguments cannot be sent: {_why(e)}") from e

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
        return packer.pack(value, self.result_typed)

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
            raise SchemaError(f"bad arguments for {self.qualname}: {e}") from None
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
            try:
                values[name] = self._decoder(name).decode(raw, bufs, lazy=True)
            except _Deferred:
                pickled.append(name)
            except msgspec.ValidationError as e:
                raise SchemaError(f"bad arguments for {q}: {_at(e, name)}") from None
            except Exception as e:
                raise SchemaError(f"undecodable argument {name!r} for {q}: {_why(e)}") from None
        for name in pickled:
            try:
                values[name] = self._decoder(name).decode(raws[name], bufs)
            except msgspec.ValidationError as e:
                raise SchemaError(f"bad arguments for {q}: {_at(e, name)}") from None
            except BaseException as e:  # the value's own reconstruction code raised
                raise SchemaError(f"argument {name!r} of {q} cannot be decoded in this "
                                  f"process: {_why(e)}") from None
        return self._spread(values) if self._spreads else ((), values)

    def _decoder(self, name: str) -> TypedDecoder:
        dec = self._each.get(name)
        if dec is None:
            dec = self._each[name] = TypedDecoder(self._types[name])
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


def _at(e: msgspec.ValidationError, name: str) -> str:
    """msgspec's message for one argument decoded alone, its path rooted at
    the argument (``$.name[0]``)."""
    msg = str(e)
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


def _is_awaitable(tp: Any) -> bool:
    origin = typing.get_origin(tp)
    return origin in (Awaitable, Coroutine)
