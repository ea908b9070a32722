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
(:func:`check_for`); nothing ever arrives as another type than the one
sent or annotated (a dataclass as a dict).
"""

# The checks of untyped annotations walk arbitrary user values (``Any``):
# pyright's strict "unknown type" checks do not apply to them.
# pyright: reportUnknownMemberType=false, reportUnknownVariableType=false
# pyright: reportUnknownArgumentType=false

from __future__ import annotations

import dataclasses
import inspect
import os
import sys
import types
import typing
from collections.abc import Awaitable, Callable, Coroutine, Iterable
from typing import Any, NoReturn

import msgspec

from .._exceptions import SchemaError
from .._transport._serial import (
    Buffers,
    Fit,
    Packer,
    Refit,
    Subclassed,
    TypedDecoder,
    Unfit,
    Unsendable,
    _Deferred,
    _inline,
    decoder_for,
    encode_small,
    holds_objects,
    is_pickle,
    lenient,
    refitter,
    travel,
    unpickle,
)
from ._annotations import (
    Check,
    Mismatch,
    check_for,
    describe,
    expected,
    items_of,
    mapping_of,
    why,
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
                 "_refit", "_result", "_result_check", "_result_how", "_result_refit",
                 "_result_whole", "_sent", "_spreads", "_types", "_varkw", "_varpos",
                 "_whole", "fn", "names", "positional",
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
        self._checks: dict[str, Check] = {}
        #: by typed argument that may arrive pickled whole (:class:`Subclassed`):
        #: its check (None: none needed)
        self._whole: dict[str, Check | None] = {}
        fields: list[tuple[str, Any, Any]] = []
        for p in params:
            hint = hints.get(p.name, Any)
            tp, typed = self._decoder_for(hint, f"argument {p.name!r}")
            self.typed[p.name] = typed
            whole = typed and holds_objects(tp)
            check = check_for(hint) if whole or not typed else None
            if p.kind is p.VAR_POSITIONAL:
                tp = types.GenericAlias(list, (tp,))
                check = check and items_of(list, check, types.GenericAlias(list, (hint,)))
            elif p.kind is p.VAR_KEYWORD:
                tp = types.GenericAlias(dict, (str, tp))
                check = check and mapping_of(dict, None, check,
                                           types.GenericAlias(dict, (str, hint)))
            if whole:
                self._whole[p.name] = check
            elif check is not None:
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
        #: by whether a str UTF-8 cannot encode was met (``escape``), by
        #: argument: how it travels where it cannot as :attr:`_how` says
        #: (made when first needed: :meth:`_pack_refitted`)
        self._refit: dict[bool, dict[str, Fit]] = {}
        rtp = hints.get("return", Any)
        if _is_awaitable(rtp):
            rtp = typing.get_args(rtp)[-1] if typing.get_args(rtp) else Any
        self.result_type: Any
        self.result_typed: bool
        self.result_type, self.result_typed = self._decoder_for(rtp, "the result")
        self._result_how = travel(self.result_type) if self.result_typed else False
        #: by ``escape``: as :attr:`_refit`, for the result
        self._result_refit: dict[bool, Fit] = {}
        #: the result may arrive pickled whole (:class:`Subclassed`)
        self._result_whole = self.result_typed and holds_objects(self.result_type)
        check = check_for(rtp) if self._result_whole or not self.result_typed else None
        #: its check, where it arrives pickled whole
        self._result_check = check
        self._result = (TypedDecoder(self.result_type) if check is None or self.result_typed
                        else _Checked(self.result_type, [(None, check)]))
        #: ``-> None``: a result is checked on the actor (:meth:`pack_result`)
        self._none = rtp is type(None) or rtp is None
        self._check = self._none
        self._ready = True

    def _decoder_for(self, hint: Any, what: str) -> tuple[Any, bool]:
        """:func:`decoder_for` ``hint``, the annotation of ``what``; a
        ``SchemaError`` where a class it names has a field annotation this
        process cannot resolve."""
        try:
            return decoder_for(hint)
        except Exception as e:  # (msgspec resolves the fields' annotations)
            raise SchemaError(
                f"{self.qualname}: the annotation of {what} (`{expected(hint)}`) cannot be "
                f"resolved in pid {os.getpid()}: {why(e)}; define or import the types a "
                "class's field annotations name at the top level of its module") from e

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
        one = False
        if not kwargs and len(args) == self._npos:  # every parameter, by position
            if self._npos == 1:  # (a display, 4x cheaper than dict(zip()) per call)
                bound = {self.positional[0]: args[0]}
                one = True
            else:
                bound = dict(zip(self.positional, args))
        else:
            bound = self._bind(args, kwargs)
        try:
            if one and _inline(args[0]):  # (Packer.pack_map's common case, one frame less)
                return encode_small(bound)
            return packer.pack_map(bound, self._how)
        except (Refit, Unfit, OverflowError, Subclassed):  # (a typed value msgpack cannot
            return self._pack_refitted(bound, packer)          # carry as it is)
        except UnicodeEncodeError:  # a str with a lone surrogate
            return self._pack_refitted(bound, packer, escape=True)
        except SchemaError as e:  # over the message size limit
            raise self._unsendable(e, bound) from None
        except Exception as e:  # the values' own pickling code may raise anything
            raise self._unsendable(e, bound) from e

    def _pack_refitted(self, bound: dict[str, Any], packer: Packer, escape: bool = False) -> bytes:
        """:meth:`pack_call` again, each typed value fitted to its
        annotation (:func:`refitter`: a builtin's subclass becomes the
        builtin), where it could not travel as it was; ``escape``: where it
        held a str UTF-8 cannot encode (a lone surrogate), which travels
        pickled in an untyped part (``Any``) and is refused in a typed one."""
        fits = self._refit.get(escape)
        if fits is None:
            fits = self._refit[escape] = {
                name: refitter(tp, escape) for name, tp in self._types.items()}
        packer.clear()
        try:
            with lenient():
                if escape:  # (each value fitted: pack_map would send a short str as it is)
                    return packer.encode(_fitted(bound, fits))
                return packer.pack_map(bound, fits)
        except UnicodeEncodeError as e:
            if not escape:
                return self._pack_refitted(bound, packer, escape=True)
            raise SchemaError(f"{self.qualname}: arguments cannot be sent: "
                              f"{_not_utf8(e, bound, '$.')}") from None
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
        if isinstance(e, Unsendable):  # (a receiver, a service: it says what to send instead)
            return SchemaError(f"{self.qualname}: arguments cannot be sent: "
                               f"{e.at(_where(bound, e.value, '$.'))}")
        return SchemaError(f"{self.qualname}: arguments cannot be sent: {why(e)}")

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
        except (Refit, Unfit, OverflowError, Subclassed):  # (as in pack_call)
            return self._pack_result_refitted(value, packer)
        except UnicodeEncodeError:  # (as in pack_call)
            return self._pack_result_refitted(value, packer, escape=True)

    def _pack_result_refitted(self, value: Any, packer: Packer, escape: bool = False) -> bytes:
        """:meth:`pack_result` again, fitted (as :meth:`_pack_refitted`)."""
        fit = self._result_refit.get(escape)
        if fit is None:
            fit = self._result_refit[escape] = refitter(self.result_type, escape)
        packer.clear()
        try:
            with lenient():
                return packer.encode(fit(value)) if escape else packer.pack(value, fit)
        except UnicodeEncodeError as e:
            if not escape:
                return self._pack_result_refitted(value, packer, escape=True)
            raise SchemaError(_not_utf8(e, {"": value}, "$")) from None
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
                f"{describe(value)}; return None, or annotate the type it returns")

    # ----------------------------------------------------------- receiver

    def unpack_args(self, data: Any, bufs: Buffers) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """Decode and validate; raises :class:`SchemaError` naming the path,
        whatever goes wrong.  Nothing is unpickled before every argument that
        needs no unpickling has validated."""
        if not self._ready:
            self._build()
        try:
            # (lazy=True, by position: a call passing a keyword is not specialized)
            value = self._args.decode(data, bufs, True)
        except msgspec.ValidationError as e:
            if self._whole:  # (one may have arrived pickled whole)
                return self._unpack_each(data, bufs)
            reason = self._args.explain_lazily(data, bufs, str(e))
            raise SchemaError(f"bad arguments for {self.qualname}: "
                              f"{self._keyed(reason, data, bufs)}") from None
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
            raise SchemaError(f"undecodable arguments for {q}: {why(e)}") from None
        if not raws.keys() <= self._fields:
            raise SchemaError(f"bad arguments for {q}: unknown argument(s) "
                              f"{sorted(raws.keys() - self._fields)}")
        missing = self._sent - raws.keys()
        if missing:
            raise SchemaError(f"bad arguments for {q}: missing argument(s) {sorted(missing)}")
        values: dict[str, Any] = {}
        pickled: list[str] = []
        whole: set[str] = set()  # (of those: sent pickled whole, :class:`Subclassed`)
        for name, raw in raws.items():
            dec = self._decoder(name)
            try:
                values[name] = dec.decode(raw, bufs, lazy=True)
            except _Deferred:
                pickled.append(name)
            except msgspec.ValidationError as e:
                if name in self._whole and is_pickle(raw):
                    pickled.append(name)
                    whole.add(name)
                    continue
                reason = _at(dec.explain_lazily(raw, bufs, str(e)), name)
                raise SchemaError(f"bad arguments for {q}: "
                                  f"{self._keyed(reason, data, bufs)}") from None
            except Exception as e:
                raise SchemaError(f"undecodable argument {name!r} for {q}: {why(e)}") from None
        for name in pickled:
            try:
                values[name] = (_checked(unpickle(raws[name], bufs), self._whole[name], "$")
                                if name in whole else
                                self._decoder(name).decode(raws[name], bufs))
            except msgspec.ValidationError as e:
                raise SchemaError(f"bad arguments for {q}: {_at(str(e), name)}") from None
            except BaseException as e:  # the value's own reconstruction code raised
                raise SchemaError(f"argument {name!r} of {q} cannot be decoded in this "
                                  f"process: {why(e)}") from None
        return self._spread(values) if self._spreads else ((), values)

    def _keyed(self, reason: str, data: Any, bufs: Buffers) -> str:
        """``reason`` (why the arguments ``data`` are bad), where msgspec
        writes ``$.kw[...]`` for a value of the ``**kwargs`` map, naming its
        key (``$.kw['x']``): the first whose value does not validate."""
        at = f"`$.{self._varkw}[...]"
        if self._varkw is None or at not in reason:
            return reason
        dec = TypedDecoder(typing.get_args(self._types[self._varkw])[1])
        try:
            values = _raw_map.decode(_raw_map.decode(data)[self._varkw])
        except Exception:
            return reason
        for key, raw in values.items():
            try:
                dec.decode(raw, bufs, lazy=True)
            except msgspec.ValidationError:
                return reason.replace(at, f"`$.{self._varkw}[{describe(key)}]", 1)
            except Exception:  # (a pickle, validated when unpickled)
                continue
        return reason

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
        result = self._result
        try:
            if not bufs and result.plain is not None:  # (decode's common case, one frame less)
                return result.plain(data)
            return result.decode(data, bufs)
        except msgspec.ValidationError as e:
            if self._result_whole and is_pickle(data):
                return self._unpack_result_whole(data, bufs)
            raise SchemaError(f"result of {self.qualname} does not match its annotation: "
                              f"{self._result.explain(data, bufs, e)}") from None
        except BaseException as e:  # bad data, or the value's reconstruction code raised
            raise SchemaError(f"result of {self.qualname} cannot be decoded in this "
                              f"process: {why(e)}") from None

    def _unpack_result_whole(self, data: Any, bufs: Buffers) -> Any:
        """A result sent pickled whole (:class:`Subclassed`), checked."""
        try:
            return _checked(unpickle(data, bufs), self._result_check, "$")
        except msgspec.ValidationError as e:
            raise SchemaError(f"result of {self.qualname} does not match its annotation: "
                              f"{e}") from None
        except BaseException as e:  # the value's reconstruction code raised
            raise SchemaError(f"result of {self.qualname} cannot be decoded in this "
                              f"process: {why(e)}") from None


def _checked(value: Any, check: Check | None, root: str) -> Any:
    """``value`` if it passes ``check`` (None: none); else a
    ``ValidationError`` naming where it does not, its path from ``root``."""
    if check is not None:
        try:
            check(value, set())
        except Mismatch as e:
            raise msgspec.ValidationError(e.text(root)) from None
    return value


def _hints(fn: Callable[..., Any]) -> dict[str, Any]:
    """``fn``'s annotations, resolved, ``Annotated`` kept: its
    ``msgspec.Meta`` constraints are checked too."""
    return typing.get_type_hints(fn, include_extras=True)


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


def _fitted(values: dict[str, Any], fits: dict[str, Fit]) -> dict[str, Any]:
    """Each of ``values`` (by name) prepared by its function in ``fits``."""
    return {name: fits[name](v) for name, v in values.items()}


def _not_utf8(e: UnicodeEncodeError, values: dict[str, Any], root: str) -> str:
    """Why ``values`` (by name, after ``root``; ``""``: the result) cannot
    travel: one holds ``e``'s str, which UTF-8 cannot encode (a lone
    surrogate, as ``os.fsdecode`` makes of a file name's undecodable
    bytes), where its annotation says ``str`` (sent as UTF-8)."""
    found = _found(values, e.object)
    what = "a value" if found is None else repr(found[0]) if found[0] else "the result"
    where = "" if found is None else f" - at `{root}{found[0]}{found[1]}`"
    return (f"{what} holds a str UTF-8 cannot encode ({e.reason}: "
            f"{e.object[e.start:e.end]!r} at {e.start}){where}; its annotation sends a str "
            "as UTF-8: annotate it `Any` there to send it pickled")


def _where(values: dict[str, Any], target: Any, root: str) -> str:
    """`` - at `$.big[2].n` ``: where ``target`` (by identity) is in one of
    ``values`` (by name, after ``root``), a value that cannot travel (``""``
    if it is not found)."""
    found = _found(values, target)
    return "" if found is None else f" - at `{root}{found[0]}{found[1]}`"


def _found(values: dict[str, Any], target: Any) -> tuple[str, str] | None:
    """``(name, path)``: where ``target`` (by identity) is in one of
    ``values`` (by name); None if it is not found."""
    for name, value in values.items():
        path = _path_to(value, target, set())
        if path is not None:
            return name, path
    return None


def _path_to(v: Any, target: Any, seen: set[int]) -> str | None:
    if v is target:
        return ""
    if id(v) in seen:
        return None
    seen.add(id(v))
    parts: Iterable[tuple[str, Any]]
    if isinstance(v, dict):
        parts = [(f"[{describe(k)}]", x) for k, x in v.items()]
        parts += [(f"[{describe(k)}]", k) for k in v]  # (a key)
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

    def __init__(self, tp: Any, checks: list[tuple[str | None, Check]]) -> None:
        super().__init__(tp)
        self._checks = checks
        self.plain = None  # (decode checks)

    def decode(self, data: Any, bufs: Buffers, lazy: bool = False) -> Any:
        value = super().decode(data, bufs, lazy)
        for name, check in self._checks:
            part = value if name is None else getattr(value, name)
            if part is not msgspec.UNSET:  # (left out: it keeps its default)
                _checked(part, check, "$" if name is None else f"$.{name}")
        return value


def _is_awaitable(tp: Any) -> bool:
    origin = typing.get_origin(tp)
    return origin in (Awaitable, Coroutine)
