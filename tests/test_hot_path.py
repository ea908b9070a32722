"""The functions every small call runs make no closure cells.

A Python function that defines a closure anywhere in its body makes the
closure's cells each time it is called, whether or not the closure itself is
made: ``ActorMesh._send`` once made 13 per call for a closure only calls to
meshes spanning hosts use (~4k instructions of ~70k per call; see
``benchmarks/bench_instructions.py``).  Speed is measured there, not here:
this pins the shape that keeps that cost out, naming the function that
regrew one."""

from __future__ import annotations

import dis
import importlib
import inspect
import itertools
import types
from typing import Any

import pytest

#: module -> the functions on the path of one call and its answer, both ends
HOT = {
    "meshio._actor_mesh": ["_Route.request", "_Route.runtime", "_Route.send",
                           "_Route.dead", "_Route.down", "_Route.pending",
                           "_Request.set_result", "_Request._settled"],
    "meshio.endpoints._endpoint": ["Endpoint.call_one", "Endpoint._deadline", "Endpoint._encode"],
    "meshio.endpoints._schema": ["Schema.pack_call", "Schema.pack_result", "Schema.unpack_args",
                                 "Schema.unpack_result"],
    "meshio._transport._serial": ["Packer.pack", "Packer.pack_map", "Packer.encode",
                                  "TypedDecoder.decode", "TypedDecoder._validated", "_inline"],
    "meshio._transport._connection": ["Connection.call", "Connection.reply",
                                      "Connection._merge", "Connection.deliver",
                                      "Connection._reply", "Connection.next_req",
                                      "Connection.send", "Connection.flush",
                                      "Connection.buffer_updated", "Connection._parse",
                                      "Connection.cancel_follows",
                                      "Pending.__init__"],
    "meshio._transport._runtime": ["Runtime.dispatch", "Runtime.admit", "Runtime.admit_calls",
                                   "Runtime.post",
                                   "Runtime.batching", "Runtime.end_turn", "Runtime.heard"],
    "meshio._transport._credit": ["took", "budget"],
    "meshio._cell": ["ActorCell.post", "ActorCell.post_run", "ActorCell._begin", "ActorCell._serve",
                     "ActorCell._run", "ActorCell._done"],
    "meshio._metrics": ["Meter.record"],
    "meshio._context": ["CallScope.chain", "CallScope.wait_for"],
}


def _function(module: str, qualname: str) -> Any:
    obj: Any = importlib.import_module(module)
    for part in qualname.split("."):
        obj = vars(obj)[part]  # (the class's own, not an inherited or wrapped one)
    if isinstance(obj, property):
        obj = obj.fget
    return inspect.unwrap(obj)  # (a wrapped function: the function itself)


@pytest.mark.parametrize(("module", "qualname"),
                         [(m, q) for m, names in HOT.items() for q in names])
def test_no_closure_cells_on_the_call_path(module: str, qualname: str) -> None:
    code = _function(module, qualname).__code__
    assert code.co_cellvars == (), (
        f"{module}.{qualname} makes closure cells {code.co_cellvars} on every call: move "
        "the closure that needs them into a function of its own")


def test_a_closure_is_seen() -> None:
    """The check above sees a closure that is only defined on a path not taken."""
    def rarely(flag: bool, x: int) -> int:
        if flag:
            return (lambda: x)()
        return x

    assert rarely.__code__.co_cellvars == ("x",)


#: the adverbs take the endpoint's own arguments as they come
TAKES_ANY = {"Endpoint.call_one"}


@pytest.mark.parametrize(("module", "qualname"),
                         [(m, q) for m, names in HOT.items() for q in names
                          if q not in TAKES_ANY])
def test_calls_on_the_call_path_can_be_specialized(module: str, qualname: str) -> None:
    """CPython 3.11 specializes a call (the interpreter sets up the
    callee's frame itself) only to a function without keyword-only
    parameters, ``*args`` or ``**kwargs``; a call to one goes the generic
    way: ``_Route.request``'s keyword-only ``once`` cost ~400 instructions
    a call (``benchmarks/bench_instructions.py``)."""
    code = _function(module, qualname).__code__
    assert code.co_kwonlyargcount == 0, f"{module}.{qualname} has keyword-only parameters"
    assert not code.co_flags & (inspect.CO_VARARGS | inspect.CO_VARKEYWORDS), (
        f"{module}.{qualname} takes *args or **kwargs")


def _methods_read_as_attributes(fn: Any) -> list[str]:
    """``name.method`` read with LOAD_ATTR in ``fn``, ``name`` a global
    that is neither a module nor a class."""
    ins = list(dis.get_instructions(fn))
    found = []
    for load, attr in itertools.pairwise(ins):
        if load.opname == "LOAD_GLOBAL" and attr.opname == "LOAD_ATTR":
            obj = fn.__globals__.get(load.argval)
            if obj is not None and not isinstance(obj, (types.ModuleType, type)) \
                    and callable(getattr(obj, attr.argval, None)):
                found.append(f"{load.argval}.{attr.argval}")
    return found


@pytest.mark.parametrize(("module", "qualname"),
                         [(m, q) for m, names in HOT.items() for q in names])
def test_no_method_of_an_imported_object_is_read_as_an_attribute(module: str,
                                                                 qualname: str) -> None:
    """CPython 3.11 compiles ``name.method()`` to LOAD_ATTR, not
    LOAD_METHOD, when ``name`` is bound by an import in that module (as
    for ``os.path.join()``); on an object that is no module (a ContextVar,
    an Encoder) that read is never specialized and makes a bound method on
    each call: ~400 instructions each (``bench_instructions.py``).  Such a
    method is bound once, at import (``meshio._context.enter_scope``).
    (Plain attributes, a ``threading.local``'s or ``limits``', are not
    methods.)"""
    found = _methods_read_as_attributes(_function(module, qualname))
    assert not found, (f"{module}.{qualname} reads {found} anew on each call; bind each "
                       "once at import")


def test_a_method_of_an_imported_object_is_seen() -> None:
    """The check above: an imported ContextVar's ``get()`` (3.11)."""
    namespace: dict[str, Any] = {}
    exec(compile("from meshio._context import _scope\n"
                 "def scoped():\n    return _scope.get()\n", "<check>", "exec"), namespace)
    assert _methods_read_as_attributes(namespace["scoped"]) == ["_scope.get"]


@pytest.mark.parametrize("adverb", ["call", "call_one", "choose", "broadcast"])
def test_the_plain_adverbs_are_not_wrapped(adverb: str) -> None:
    """With the ``otel`` extra installed (as here), a wrapper around an
    adverb (its frame, its arguments packed again) cost ~4% of a small
    call's CPU in the caller: each tests for a tracer provider inline
    instead (``meshio._tracing.in_span``; its spans: ``tests/test_tracing.py``)."""
    from meshio import _tracing
    from meshio.endpoints import Endpoint

    assert _tracing.ENABLED
    assert not hasattr(vars(Endpoint)[adverb], "__wrapped__")
