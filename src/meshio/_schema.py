"""Per-callable wire schema: argument binding, argument Struct, result type.

Built lazily (first use) so ``from __future__ import annotations`` and
forward references resolve once the defining module is complete.
"""

from __future__ import annotations

import inspect
import typing
from collections.abc import Callable
from typing import Any

import msgspec

from ._exceptions import SchemaError
from ._serial import Buffers, Packer, TypedDecoder, decoder_for

__all__ = ("Schema",)

_VARIADIC = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)


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
        self.loose = any(p.kind in _VARIADIC for p in params)
        self.positional = tuple(
            p.name for p in params
            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD))
        self.names = frozenset(p.name for p in params if p.kind not in _VARIADIC)
        self.required = frozenset(
            p.name for p in params if p.kind not in _VARIADIC and p.default is p.empty)
        self.typed: dict[str, bool] = {}
        fields: list[tuple[str, Any, Any]] = []
        for p in params:
            if p.kind in _VARIADIC:
                continue
            tp, typed = decoder_for(hints.get(p.name, Any))
            self.typed[p.name] = typed
            if p.default is p.empty:
                fields.append((p.name, tp, msgspec.NODEFAULT))
            else:
                fields.append((p.name, tp | msgspec.UnsetType if typed else tp, msgspec.UNSET))
        struct = msgspec.defstruct(
            f"{self.qualname}.args", fields, kw_only=True, forbid_unknown_fields=True)
        self._args = TypedDecoder(Any if self.loose else struct)
        self._fields = tuple(f[0] for f in fields)
        rtp = hints.get("return", Any)
        if rtp is type(None):
            rtp = None
        if _is_awaitable(rtp):
            rtp = typing.get_args(rtp)[-1] if typing.get_args(rtp) else Any
        self.result_type, self.result_typed = decoder_for(rtp)
        self._result = TypedDecoder(self.result_type)
        self._ready = True

    # ------------------------------------------------------------- sender

    def bind(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
        """Map positional arguments to names; check names cheaply."""
        if not self._ready:
            self._build()
        if self.loose:
            return {"args": args, "kwargs": kwargs}
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

    def pack_args(self, bound: dict[str, Any], packer: Packer) -> bytes:
        try:
            if self.loose:
                return packer.pack(bound, False)
            return packer.pack_map(bound, self.typed.__getitem__)
        except (OverflowError, TypeError, ValueError, msgspec.EncodeError) as e:
            raise SchemaError(f"{self.qualname}: arguments cannot be sent: "
                              f"{type(e).__name__}: {e}") from e

    def pack_result(self, value: Any, packer: Packer) -> bytes:
        if not self._ready:
            self._build()
        return packer.pack(value, self.result_typed)

    # ----------------------------------------------------------- receiver

    def unpack_args(self, data: Any, bufs: Buffers) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """Decode and validate; raises :class:`SchemaError` naming the path."""
        if not self._ready:
            self._build()
        try:
            value = self._args.decode(data, bufs)
        except msgspec.ValidationError as e:
            raise SchemaError(f"bad arguments for {self.qualname}: {e}") from None
        except msgspec.DecodeError as e:
            raise SchemaError(f"undecodable arguments for {self.qualname}: {e}") from None
        if self.loose:
            return tuple(value["args"]), value["kwargs"]
        kwargs = {}
        for name in self._fields:
            v = getattr(value, name)
            if v is not msgspec.UNSET:
                kwargs[name] = v
        return (), kwargs

    def unpack_result(self, data: Any, bufs: Buffers) -> Any:
        if not self._ready:
            self._build()
        try:
            return self._result.decode(data, bufs)
        except msgspec.ValidationError as e:
            raise SchemaError(
                f"result of {self.qualname} does not match its annotation: {e}") from None


def _is_awaitable(tp: Any) -> bool:
    import collections.abc

    origin = typing.get_origin(tp)
    return origin in (collections.abc.Awaitable, collections.abc.Coroutine)
