"""``fixup_module_metadata``: public objects name their public home.

Modelled on trio's ``trio._util.fixup_module_metadata``.
"""

from __future__ import annotations

import inspect
import typing
from collections.abc import Mapping
from typing import Any, cast

__all__ = ("fixup_module_metadata", "utf8")


def _private(module: str) -> bool:
    """``module`` is one of meshio's private modules (``meshio._cell``,
    ``meshio.testing._leaks``)."""
    parts = module.split(".")
    return parts[0] == "meshio" and any(p.startswith("_") for p in parts[1:])


def _resolve_annotations(cls: type) -> None:
    """Evaluate ``cls``'s own string annotations (``from __future__ import
    annotations``) while its ``__module__`` still names the module that
    defines them: ``typing.get_type_hints`` and msgspec (a dataclass as an
    endpoint argument) look names up in ``sys.modules[cls.__module__]``.
    Annotations that cannot be evaluated there either are left as they are."""
    own = vars(cls).get("__annotations__")
    if not own or not any(isinstance(a, str) for a in own.values()):
        return
    try:
        hints = typing.get_type_hints(cls, include_extras=True)
    except Exception:  # names imported only for type checkers: nothing to keep working
        return
    cls.__annotations__ = {name: hints.get(name, a) for name, a in own.items()}


def fixup_module_metadata(module_name: str, namespace: Mapping[str, Any]) -> None:
    """Make the public objects of the facade ``module_name`` report it as
    their ``__module__``, so that reprs and tracebacks say
    ``meshio.ActorError``, not ``meshio._exceptions.ActorError``.

    Called at the end of each public package's ``__init__``.  Only objects
    defined in a private meshio module change (the methods, properties and
    nested classes defined in a public class too); the top-level ``meshio``
    facade runs last and also claims what a sub-package claimed first
    (``meshio.SupervisionError``, not ``meshio.supervision.SupervisionError``).
    Names are not changed (every facade re-exports ``X as X``), so pickling
    by reference (``__module__`` + ``__qualname__``) finds the same object.

    Args:
        module_name: the facade's ``__name__``.
        namespace: its ``globals()``; the names in its ``__all__`` are fixed.
    """
    seen: set[int] = set()

    def claim(module: object) -> bool:
        if not isinstance(module, str):
            return False
        return _private(module) or (
            module_name == "meshio" and module.startswith("meshio.") and module != module_name)

    def fix(obj: object, owner: str) -> None:
        """Fix ``obj``; inside a class, ``owner`` is the class's qualname."""
        if isinstance(obj, (classmethod, staticmethod)):
            obj = cast("classmethod[Any, ..., Any] | staticmethod[..., Any]", obj).__func__
        elif isinstance(obj, property):
            for f in (obj.fget, obj.fset, obj.fdel):
                fix(f, owner)
            return
        if not (isinstance(obj, type) or inspect.isroutine(obj)):
            return  # a constant, a type alias, a module
        if id(obj) in seen or not claim(getattr(obj, "__module__", None)):
            return
        qualname = getattr(obj, "__qualname__", None)
        if owner and not (isinstance(qualname, str) and qualname.startswith(owner + ".")):
            return  # an attribute defined elsewhere (an alias): its home is its own
        seen.add(id(obj))
        if isinstance(obj, type):
            _resolve_annotations(obj)
        obj.__module__ = module_name
        if isinstance(obj, type):
            for value in list(vars(obj).values()):
                fix(value, obj.__qualname__)

    for name in namespace["__all__"]:
        fix(namespace[name], "")


def utf8(text: str) -> str:
    """``text`` as UTF-8 can carry it (msgpack and JSON strings must be):
    a lone surrogate standing for a byte that was not UTF-8 (Python's
    ``surrogateescape``: ``sys.argv``, a file name, an environment
    variable) shows that byte (``caf\\xe9.py``), any other its escape
    (``\\ud800``)."""
    if text.isascii():
        return text
    try:
        text.encode()
    except UnicodeEncodeError:
        try:
            return text.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
        except UnicodeEncodeError:
            return text.encode("utf-8", "backslashreplace").decode()
    return text
