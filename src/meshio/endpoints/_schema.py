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
import sys
import typing
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, cast

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

    def __init__(self, fn: Callable[..., Any], qualname: str,
                 hints: dict[str, Any] | None = None) -> None:
        self.fn = fn
        self.qualname = qualname
        self._hints = hints
        self._ready = False

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
        params = list(sig.parameters.values())[1:]
        try:
            hints = self._hints if self._hints is not None else typing.get_type_hints(self.fn)
        except Exception as e:  # unresolvable forward reference: stay untyped
            raise SchemaError(
                f"{self.qualname}: cannot resolve annotations ({e}); define the "
                "referenced types at module level") from e
        self.loose: bool = any(p.kind in _VARIADIC for p in params)
        self.positional: tuple[str, ...] = tuple(
            p.name for p in params
            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD))
        self.names: frozenset[str] = frozenset(p.name for p in params if p.kind not in _VARIADIC)
        self.required: frozenset[str] = frozenset(
            p.name for p in params if p.kind not in _VARIADIC and p.default is p.empty)
        #: some parameter has a default (an argument may be left out)
        self._defaults = self.required != self.names
        #: how many positional arguments bind alone (-1: none do)
        self._npos = len(self.positional) if (
            not self.loose and self.names == frozenset(self.positional)) else -1
        self.typed: dict[str, bool] = {}
        self._types: dict[str, Any] = (
            {"args": list[Any], "kwargs": dict[str, Any]} if self.loose else {})
        self._each: dict[str, TypedDecoder] = {}
        fields: list[tuple[str, Any, Any]] = []
        for p in params:
            if p.kind in _VARIADIC:
                continue
            tp, typed = decoder_for(hints.get(p.name, Any))
            self.typed[p.name] = typed
            if not self.loose:
                self._types[p.name] = tp
            if p.default is p.empty:
                fields.append((p.name, tp, msgspec.NODEFAULT))
            else:
                fields.append((p.name, tp | msgspec.UnsetType if typed else tp, msgspec.UNSET))
        struct = msgspec.defstruct(
            f"{self.qualname}.args", fields, kw_only=True, forbid_unknown_fields=True)
        self._args = TypedDecoder(Any if self.loose else struct)
        rtp = hints.get("return", Any)
        if rtp is type(None):
            rtp = None
        if _is_awaitable(rtp):
            rtp = typing.get_args(rtp)[-1] if typing.get_args(rtp) else Any
        self.result_type: Any
        self.result_typed: bool
        self.result_type, self.result_typed = decoder_for(rtp)
        self._result = TypedDecoder(self.result_type)
        self._ready = True

    # ------------------------------------------------------------- sender

    def pack_call(self, args: tuple[Any, ...], kwargs: dict[str, Any], packer: Packer) -> bytes:
        """A call's arguments, encoded by name (positional ones bound to
        their parameters, the names checked cheaply).

        Raises:
            SchemaError: they do not fit the signature, or cannot be sent.
        """
        if not self._ready:
            self._build()
        if self.loose:
            bound = {"args": args, "kwargs": kwargs}
        elif not kwargs and len(args) == self._npos:  # every parameter, by position
            # (one: a display, 4x cheaper than dict(zip()) per call)
            bound = ({self.positional[0]: args[0]} if self._npos == 1
                     else dict(zip(self.positional, args)))
        else:
            bound = self._bind(args, kwargs)
        try:
            if self.loose:
                return packer.pack(bound, False)
            return packer.pack_map(bound, self.typed)
        except SchemaError as e:  # over the message size limit
            raise SchemaError(f"{self.qualname}: arguments cannot be sent: {e} (largest "
                              f"argument: {max(bound.items(), key=_size_of)[0]!r})"
                              ) from None
        except Exception as e:  # the values' own pickling code may raise anything
            raise SchemaError(f"{self.qualname}: arguments cannot be sent: {_why(e)}") from e

    def _bind(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
        """Arguments by name, checked against the signature."""
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
            unknown = sorted(bound.keys() - self.names)
            raise SchemaError(
                f"{self.qualname}() got unexpected keyword argument(s) {unknown}; "
                f"it accepts {sorted(self.names)}")
        if not self.required <= bound.keys():
            missing = sorted(self.required - bound.keys())
            raise SchemaError(f"{self.qualname}() missing required argument(s) {missing}")
        return bound

    def pack_result(self, value: Any, packer: Packer) -> bytes:
        if not self._ready:
            self._build()
        return packer.pack(value, self.result_typed)

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
        if self.loose:
            return self._variadic(value)
        kwargs: dict[str, Any] = msgspec.structs.asdict(value)
        if self._defaults:  # a parameter not sent keeps its default (UNSET: left out)
            kwargs = {name: v for name, v in kwargs.items() if v is not msgspec.UNSET}
        return (), kwargs

    def _unpack_each(self, data: Any, bufs: Buffers) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """The slow path: each argument alone, so errors name it; those that
        need no unpickling first."""
        q = self.qualname
        try:
            raws = _raw_map.decode(data)
        except Exception as e:
            raise SchemaError(f"undecodable arguments for {q}: {_why(e)}") from None
        names = {"args", "kwargs"} if self.loose else self.names
        if not raws.keys() <= names:
            raise SchemaError(f"bad arguments for {q}: unknown argument(s) "
                              f"{sorted(raws.keys() - names)}")
        missing = (names if self.loose else self.required) - raws.keys()
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
        return self._variadic(values) if self.loose else ((), values)

    def _decoder(self, name: str) -> TypedDecoder:
        dec = self._each.get(name)
        if dec is None:
            dec = self._each[name] = TypedDecoder(self._types[name])
        return dec

    def _variadic(self, value: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
        fields = cast("dict[str, Any]", value) if type(value) is dict else {}
        args, kwargs = fields.get("args"), fields.get("kwargs")
        if (type(args) is not list or type(kwargs) is not dict
                or not all(type(k) is str for k in fields["kwargs"])):
            raise SchemaError(f"bad arguments for {self.qualname}: expected a map of "
                              "'args' (an array) and 'kwargs' (a map with string keys)")
        return tuple(fields["args"]), fields["kwargs"]

    def unpack_result(self, data: Any, bufs: Buffers) -> Any:
        if not self._ready:
            self._build()
        try:
            return self._result.decode(data, bufs)
        except msgspec.ValidationError as e:
            raise SchemaError(
                f"result of {self.qualname} does not match its annotation: {e}") from None
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
