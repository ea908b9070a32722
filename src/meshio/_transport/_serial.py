"""Values on the wire: msgspec msgpack with out-of-band buffers.

A message body is msgpack; large buffers (tensor storage, big ``bytes``,
every ``bytearray``/``memoryview``) travel beside it as separate frame
buffers, sent with vectored writes and received into preallocated memory.

Typed values (a parameter or result with a precise annotation) are encoded
natively and validated on decode against the annotation.  Untyped values
(no annotation or ``Any``) keep their Python type: plain JSON-like data goes
natively, anything else is pickled with cloudpickle inside an extension
type, tensor storage still out of band.  Where a typed value's annotation
has untyped parts (``dict[str, Any]``, a dataclass with an ``Any`` field),
those parts travel as untyped values do (:func:`travel`).  An annotation
msgspec cannot describe at all makes the value untyped (:func:`decoder_for`).

msgpack carries ``int``, ``float``, ``str`` and ``bytes`` natively, but not
their subclasses (``np.float64``): the encoder refuses those in a typed
value (:class:`Refit`), and the value is packed again fitted to its
annotation (:func:`refitter`): a subclass becomes its builtin where the
annotation wants that builtin.

Large values of every kind travel out of band: ``bytes`` and ``str`` from
:data:`OOB_THRESHOLD` bytes on, and pickles of that size.  An ASCII ``str``
travels without a copy on either side: it is sent from its own memory and
received straight into a new ``str`` (:data:`KIND_ASCII`), checked as its
bytes arrive, so even a huge one costs its receiver's loop no decoding.

A message whose in-band part and buffers together exceed the message size
limit (:func:`set_limits`) is refused by the sender with a
:class:`~meshio.SchemaError` before anything is sent.

Decoding never runs the value's own code before the structure is checked:
pickles are unpickled only after every natively typed value validated, and
whatever goes wrong while decoding reaches the caller as an exception (the
:class:`~meshio.endpoints._schema.Schema` turns it into a ``SchemaError``).
"""

# cloudpickle ships no type information, and this module walks arbitrary
# user values (``Any``): pyright's strict "unknown type" checks do not apply.
# pyright: reportUnknownMemberType=false, reportUnknownVariableType=false
# pyright: reportUnknownArgumentType=false, reportUnknownLambdaType=false

from __future__ import annotations

import contextlib
import copy
import ctypes
import enum
import inspect
import io
import linecache
import os
import pickle
import sys
import threading
import types
import typing
import weakref
from collections.abc import Callable, Generator, Iterable, Mapping
from typing import Any, Final

import cloudpickle
import msgspec
import msgspec.inspect
import msgspec.structs

from .._checks import check_seconds
from .._exceptions import SchemaError
from ._pool import owned_view, pin_for_cuda, pool_view

__all__ = ("Buffers", "Handing", "Limits", "OutBuffers", "Packer", "Refit", "Unfit",
           "Unsendable", "ascii_memory", "decoder_for", "dumps", "hands_port", "lenient",
           "limits", "loads", "refitter", "set_limits", "travel", "type_name",
           "unpicklable_part")

#: buffers received with a frame: ``bytes``, ``bytearray`` or ``str``
Buffers = list[Any]
#: buffers to send with a frame: ``(buffer, kind)`` with kind 0 = receive as
#: ``bytearray`` (writable), 1 = receive as ``bytes``, 2 = receive as ``str``
#: (ASCII text; a part that is not arrives as ``bytes``), 3 = receive as any
#: writable buffer (tensor storage, pickle buffers, ``memoryview`` values: a
#: large one may alias shared memory, see :mod:`._bulk`)
OutBuffers = list[tuple[Any, int]]

KIND_BYTEARRAY: Final = 0
KIND_BYTES: Final = 1
KIND_ASCII: Final = 2
KIND_BUFFER: Final = 3

EXT_PICKLE: Final = 1
EXT_BUFFER: Final = 2
EXT_TENSOR: Final = 3

#: ``bytes``, ``str`` and pickles at least this large travel out of band
OOB_THRESHOLD: Final = 32 * 1024
#: the most a frame's in-band part (its msgpack body) may hold: large values
#: travel out of band, so only huge native containers come near it
MAX_BODY: Final = 1 << 30
#: room left under the message size limit for the control message around
#: the packed values (target, method, ...)
_ENVELOPE: Final = 1 << 16

_AS_BYTES, _AS_BYTEARRAY, _AS_MEMORYVIEW, _AS_STR = 0, 1, 2, 3
_PLAIN: Final = frozenset({int, float, str, bool, type(None)})
#: ints msgpack can carry natively; untyped ones beyond are pickled
_INT_MIN: Final = -(1 << 63)
_INT_MAX: Final = (1 << 64) - 1


class _HookState(threading.local):
    """What the msgspec hooks of this thread work with: the buffers of the
    frame being encoded (``out``) or decoded (``bufs``), and whether a lazy
    decoding met a pickle (``later``).  Class attributes are the defaults,
    so reading one never fails."""

    out: OutBuffers | None = None
    bufs: Buffers | None = None
    later: bool = False
    #: a builtin's subclass in a typed value is pickled as it is, not
    #: refused with :class:`Refit` (:func:`lenient`)
    lenient: bool = False
    #: the first tensor or NumPy array of the frame being encoded and its
    #: reference (a frame of one makes no more: :func:`_tensor_ext`,
    #: :func:`_array_ext`)
    first: tuple[Any, bytes] | None = None
    #: the tensors and arrays of the frame being encoded, once it holds two
    sent: _Sent | None = None
    #: what the decodings of the last frame decoded here that held tagged
    #: values made (:class:`_Frame`)
    frame: _Frame | None = None


_tls = _HookState()


# ------------------------------------------------------------------ limits


#: per limit of :func:`set_limits`: the types it takes, how an error names
#: them, and whether 0 is allowed (else it must be positive)
_KINDS: Final[dict[str, tuple[tuple[type, ...], str, bool]]] = {
    "max_message": ((int,), "an int (bytes)", False),
    "receive_budget": ((int,), "an int (bytes)", False),
    "frame_timeout": ((int, float), "a number of seconds", False),
    "fanout_width": ((int,), "an int (a number of messages)", True),
    "busy_poll": ((int, float), "a number of seconds", True),
}


def _allowed(value: float, zero: bool) -> bool:
    return value >= 0 if zero else value > 0


def _env_number(arg: str, default: Any, kind: Callable[[str], Any]) -> Any:
    """Limit ``arg`` from its environment variable (``MESHIO_<ARG>``): a
    positive number (or 0 where the limit allows it)."""
    name = f"MESHIO_{arg.upper()}"
    zero = _KINDS[arg][2]
    text = os.environ.get(name)
    if not text:
        return default
    try:
        value = kind(text)
    except ValueError:
        value = -1
    if not _allowed(value, zero):
        what = f"{kind.__name__} >= 0" if zero else f"positive {kind.__name__}"
        raise ValueError(f"meshio: environment variable {name}={text!r} must be a {what} "
                         f"(unset it for the default, {default})")
    return value


class Limits:
    """What one process accepts on the wire; see :func:`set_limits`."""

    __slots__ = ("busy_poll", "fanout_width", "frame_timeout", "max_message", "receive_budget")

    def __init__(self) -> None:
        self.max_message = _env_number("max_message", 4 << 30, int)
        self.receive_budget = _env_number("receive_budget", 8 << 30, int)
        self.frame_timeout = _env_number("frame_timeout", 60.0, float)
        self.fanout_width = _env_number("fanout_width", 16, int)
        self.busy_poll = _env_number("busy_poll", 200e-6, float)


#: this process's limits (workers inherit them through the environment)
limits = Limits()


def set_limits(*, max_message: int | None = None, receive_budget: int | None = None,
               frame_timeout: float | None = None, fanout_width: int | None = None,
               busy_poll: float | None = None) -> None:
    """Set the wire limits of this process and of the workers it starts later.

    Each limit is also exported as an environment variable (which a worker
    reads when it starts), so call this before ``spawn_procs``; setting the
    variables in the shell does the same for every process.

    Args:
        max_message: the largest message, in bytes, counting the in-band part
            and every out-of-band buffer (``MESHIO_MAX_MESSAGE``, default
            4 GiB).  A sender refuses a bigger one with ``SchemaError``; a
            receiver skips it without reading it into memory and fails that
            call (or port value) with ``SchemaError``.
        receive_budget: bytes a process reserves at most, over all its
            connections, for messages not yet fully received
            (``MESHIO_RECEIVE_BUDGET``, default 8 GiB).  A connection whose
            next message does not fit pauses reading until others finish; a
            message alone may exceed it.
        frame_timeout: seconds without data after which a message begun but
            not finished drops its connection with a warning
            (``MESHIO_FRAME_TIMEOUT``, default 60).
        fanout_width: the most messages a caller (and each relay) sends for
            one ``call``/``stream``/``broadcast`` to a mesh spanning several
            hosts (``MESHIO_FANOUT_WIDTH``, default 16): one message per host
            up to this many hosts, a tree of hosts beyond.  0: no tree, one
            message per actor.
        busy_poll: seconds a process keeps its event loop polling, rather
            than sleeping, after a message from another process arrived
            within that long of the one before (``MESHIO_BUSY_POLL``,
            default 0.0002).  Waking a sleeping process costs more than the
            rest of a small call: back-to-back calls are answered about 3x
            sooner, for up to this much CPU time per message (the loop
            yields the core to any other runnable process meanwhile).  A
            process that hears nothing that often never polls.  0: never.

    Raises:
        TypeError: a limit is not an ``int`` (the timeout and ``busy_poll``:
            not a number).
        ValueError: a limit is not positive (``fanout_width``, ``busy_poll``:
            negative), or seconds are NaN or an int no float holds.
    """
    new = {"max_message": max_message, "receive_budget": receive_budget,
           "frame_timeout": frame_timeout, "fanout_width": fanout_width,
           "busy_poll": busy_poll}
    for arg, value in new.items():
        if value is None:
            continue
        kinds, what, zero = _KINDS[arg]
        if float in kinds:  # seconds
            check_seconds(value, "set_limits", arg, zero=zero, also=" or None")
            continue
        if isinstance(value, bool) or not isinstance(value, kinds):
            raise TypeError(f"set_limits: {arg} must be {what}, "
                            f"got {type(value).__name__} {value!r}")
        if not _allowed(value, zero):
            raise ValueError(f"set_limits: {arg} must be "
                             f"{'>= 0' if zero else 'positive'}, got {value!r}")
    for arg, value in new.items():  # (all checked first: a bad one changes nothing)
        if value is not None:
            os.environ[f"MESHIO_{arg.upper()}"] = str(value)
            setattr(limits, arg, value)


def _out() -> OutBuffers:
    out = _tls.out
    if out is None:
        raise RuntimeError("meshio: encoding outside of a frame")
    return out


def _in() -> Buffers:
    bufs = _tls.bufs
    return [] if bufs is None else bufs


# ---------------------------------------------------------------- tensors


def _tensor_memory(t: Any) -> tuple[Any, Any, str]:
    """``(contiguous cpu tensor, writable byte view of its storage, device)``:
    ``device`` is ``""`` for a CPU tensor, else where it lives (``"cuda:0"``)."""
    t = t.detach()
    if t.is_conj() or t.is_neg():  # a lazy view: its storage holds other values
        t = t.resolve_conj().resolve_neg()
    device = "" if t.device.type == "cpu" else str(t.device)
    if device:
        t = _to_host(t)
    if not t.is_contiguous():
        t = t.contiguous()
    nbytes = t.numel() * t.element_size()
    if nbytes == 0:
        return t, bytearray(), device
    # (the storage kept alive while the bytes are in flight)
    return t, owned_view(t.data_ptr(), nbytes, t), device


def _to_host(t: Any) -> Any:
    """A contiguous copy of the accelerator tensor ``t`` in pooled memory:
    already mapped, and page-locked for CUDA, so the device copies into it
    at the bus's speed (``t.cpu()`` faults fresh pages in as it goes: 40x
    slower for 64 MiB on an H200 VM); back in the pool once sent."""
    import torch  # (imported already: ``t`` is a tensor)

    nbytes = t.numel() * t.element_size()
    if nbytes == 0:
        return t.cpu()
    memory = pool_view(nbytes)
    if t.device.type == "cuda":
        pin_for_cuda(memory)
    return torch.frombuffer(memory, dtype=t.dtype).view(t.shape).copy_(t)


def _strided_tensor(torch: Any, obj: Any) -> bool:
    """``obj`` is a tensor meshio sends as its bytes: a strided
    ``torch.Tensor``, or one of a subclass that torch pickles as a tensor
    and its attributes (a ``Parameter``; :func:`_plain_subclass`), which
    arrives as its class.  A sparse or otherwise laid out one, or one of a
    subclass with a pickling or dispatch of its own (a wrapper), is pickled
    as torch pickles it (its parts are strided)."""
    if torch is None:
        return False
    if type(obj) is not torch.Tensor and not (isinstance(obj, torch.Tensor)
                                              and _plain_subclass(torch, type(obj))):
        return False
    return bool(obj.layout is torch.strided)


def _plain_subclass(torch: Any, cls: type) -> bool:
    """The ``torch.Tensor`` subclass ``cls`` keeps its elements in its own
    storage, and is pickled as torch pickles a tensor (or a ``Parameter``)
    and its attributes: it travels as a tensor, its class beside it
    (:func:`_tensor_class`)."""
    reduce = getattr(cls, "__reduce_ex__", None)
    return ((reduce is torch.Tensor.__reduce_ex__ or reduce is torch.nn.Parameter.__reduce_ex__)
            and getattr(cls, "__torch_dispatch__", None) is torch.Tensor.__torch_dispatch__)


def _tensor_class(torch: Any, obj: Any, out: OutBuffers) -> int | bytes:
    """How the class of the tensor ``obj`` travels (:attr:`_TensorRef.cls`):
    0, a ``torch.Tensor``; 1, a ``Parameter`` without attributes; else its
    class and attributes pickled (a :class:`_PickleRef`)."""
    cls = type(obj)
    if cls is torch.Tensor:
        return 0
    state = torch._utils._get_obj_state(obj)
    if cls is torch.nn.Parameter and not state:
        return 1
    return _pickle_ext((cls, state), out, -1)


def _say_nothing(what: str, held: bool) -> None:
    """(:data:`loop_held` in a process that is no worker.)"""


#: told ``(what, True)`` before meshio holds this thread's event loop for
#: seconds perhaps (``what``: ``"import torch"``), ``(what, False)`` after; a
#: worker tells its controller, whose heartbeats then do not judge it (a
#: worker's :func:`meshio._worker.serve` sets it)
loop_held: Callable[[str, bool], None] = _say_nothing


def import_torch() -> Any:
    """``torch``, imported on first use (optional and heavy: only a value
    holding a tensor needs it).  That first import takes seconds on a loaded
    host, on an event loop's thread where the value is decoded there, so it
    is said first (:data:`loop_held`)."""
    if "torch" not in sys.modules:
        loop_held("import torch", True)
        try:
            import torch
        finally:
            loop_held("import torch", False)
    import torch

    return torch


def _rebuild_tensor(buf: Any, dtype: str, shape: list[int], strides: list[int],
                    device: str, requires_grad: bool = False, cls: Any = None,
                    state: Any = None) -> Any:
    torch = import_torch()
    dt = _dtype(torch, dtype)
    if len(buf) == 0:
        t = torch.empty(shape, dtype=dt)
    else:
        t = torch.frombuffer(buf, dtype=dt).as_strided(shape, strides)
    return _as_sent(torch, _to_device(torch, t, buf, device), requires_grad, cls, state)


def _as_sent(torch: Any, t: Any, requires_grad: bool, cls: Any, state: Any) -> Any:
    """``t``, rebuilt, as it was sent: a leaf that requires grad where it
    did (as pickle makes it), of its class ``cls`` (None: ``torch.Tensor``),
    with its Python ``state`` (its attributes), as torch's unpickling sets
    it: a ``Parameter`` arrives as a ``Parameter``."""
    if cls is None:
        return t.requires_grad_() if requires_grad else t
    if not (isinstance(cls, type) and issubclass(cls, torch.Tensor)):
        raise ValueError(f"a tensor's class must be a torch.Tensor subclass, got {cls!r}")
    made = torch.Tensor._make_subclass(cls, t, requires_grad)  # (as Parameter() makes one)
    if state:
        if getattr(cls, "__setstate__", torch.Tensor.__setstate__) is not torch.Tensor.__setstate__:
            made.__setstate__(state)
        else:
            made = torch._utils._set_obj_state(made, state)
    return made


def _dtype(torch: Any, dtype: str) -> Any:
    dt = getattr(torch, dtype.removeprefix("torch."), None)
    if not isinstance(dt, torch.dtype):
        raise ValueError(f"unknown tensor dtype {dtype!r}")
    return dt


def _to_device(torch: Any, t: Any, buf: Any, device: str) -> Any:
    """``t``, rebuilt on the CPU from ``buf``, on the accelerator ``device``
    it was sent from, where this process has it (else where it is)."""
    if device and _device_here(torch, device):
        if device.startswith("cuda"):
            pin_for_cuda(buf)  # a large value arrived in pooled memory
        t = t.to(device)
    return t


def _device_here(torch: Any, device: str) -> bool:
    """Whether this process has the accelerator ``device`` (``"cuda:1"``):
    a tensor sent from there is rebuilt on it, else on the CPU."""
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):
        raise ValueError(f"unknown tensor device {device!r}") from None
    backend: Any = getattr(torch, dev.type, None)
    available = getattr(backend, "is_available", None)
    if available is None or not available():
        return False
    return dev.index is None or bool(dev.index < backend.device_count())


# A frame keeps the identity of its tensors and NumPy arrays, as pickle
# does: one held twice travels once and arrives as one object, and tensors
# that view one storage arrive as views of one storage.  The encoder notes
# them in a first pass (:class:`_Sent`); only a frame that holds such values
# is encoded again, knowing them all: each storage that several tensors view
# is sent once, its bytes from the lowest any of them reaches to the highest,
# and each such tensor, and each array held twice, carries a tag, by which
# its receiver keeps it (:class:`_Frame`).  Every other tensor travels as its
# own elements, compact, and every other array as its own pickle.


class _Sent:
    """The tensors and arrays of the frame being encoded (:func:`_tensor_ext`,
    :func:`_array_ext`): in the first pass, what shows that the frame must be
    encoded again (``again``); in the second (``final``), what that pass
    found.  (Class attributes are the first pass's defaults: a frame of one
    tensor makes little.)"""

    again = False
    final = False
    tags = 0
    #: by storage several tensors view: ``[lo, hi, index of its buffer or -1]``,
    #: the bytes ``[lo, hi)`` of it that they view, ``lo`` aligned down (the
    #: second pass's)
    shared: dict[tuple[Any, int], list[int]]

    def __init__(self, first: tuple[Any, bytes] | None = None) -> None:
        #: by ``id``: the tensor or array (kept alive: its id stays its own)
        #: and its reference
        self.exts: dict[int, tuple[Any, bytes]] = {}
        #: by storage (``(device, address)``): the tensors seen that view it
        self.views: dict[tuple[Any, int], list[Any]] = {}
        #: ids of the tensors and arrays the frame holds more than once
        self.keep: set[int] = set()
        if first is not None:
            t = first[0]
            self.exts[id(t)] = first
            if not _is_array(t):
                self.views[t.device, t.untyped_storage().data_ptr()] = [t]

    def second(self) -> _Sent:
        """The state of the second pass, from what this first one found."""
        sent = _Sent()
        sent.final = True
        sent.keep = self.keep
        sent.shared = {}
        for key, views in self.views.items():
            spans = [_span(t) for t in views if _shareable(t)]
            if len(spans) > 1:
                lo = min(lo for lo, _ in spans)
                sent.shared[key] = [lo - lo % _ALIGN, max(hi for _, hi in spans), -1]
        return sent


#: where a storage sent for several tensors starts, in bytes, is a multiple of
#: this (of every element size): each tensor's offset in it is in its elements
_ALIGN: Final = 16


def _shareable(t: Any) -> bool:
    """Whether ``t`` may travel as a view of a storage it shares with other
    tensors of the frame: not an empty one, nor a lazy conjugate or negation
    (its storage holds other values: it is sent resolved)."""
    return bool(t.numel()) and not (t.is_conj() or t.is_neg())


def _span(t: Any) -> tuple[int, int]:
    """The bytes ``[lo, hi)`` of its storage that ``t`` (not empty) views."""
    size = t.element_size()
    lo = t.storage_offset() * size
    reach = sum((n - 1) * stride for n, stride in zip(t.shape, t.stride()))
    return lo, lo + (reach + 1) * size


def _tensor_ext(torch: Any, obj: Any, out: OutBuffers) -> bytes:
    """How the strided tensor ``obj`` travels in the frame whose buffers are
    ``out``: its reference (:class:`_TensorRef`), its bytes added to ``out``
    unless the frame sent them already."""
    sent = _frame_sent()
    if sent is None:  # the frame's first tensor: noted, no more
        ext = _compact_ext(torch, obj, out, -1)
        _tls.first = (obj, ext)
        return ext
    known = _again(sent, obj)
    if known is not None:
        return known
    key = (obj.device, obj.untyped_storage().data_ptr())
    if not sent.final:
        views = sent.views.get(key)
        if views is None:
            sent.views[key] = [obj]
        else:  # another tensor views its storage
            sent.again = True
            views.append(obj)
        ext = _compact_ext(torch, obj, out, -1)
    else:
        region = sent.shared.get(key)
        if region is not None and _shareable(obj):
            ext = _view_ext(torch, obj, out, region, sent.tags)
            sent.tags += 1
        elif id(obj) in sent.keep:
            ext = _compact_ext(torch, obj, out, sent.tags)
            sent.tags += 1
        else:
            ext = _compact_ext(torch, obj, out, -1)
    sent.exts[id(obj)] = (obj, ext)
    return ext


def _frame_sent() -> _Sent | None:
    """The record of the tensors and arrays of the frame being encoded,
    made when its second comes; None for its first, which its caller
    encodes alone and notes in ``_tls.first`` (a frame of one makes no
    more)."""
    sent = _tls.sent
    if sent is None:
        first = _tls.first
        if first is None:
            return None
        sent = _tls.sent = _Sent(first)
    return sent


def _again(sent: _Sent, obj: Any) -> bytes | None:
    """The reference of ``obj`` if the frame holds it already (then it
    arrives as one object: the frame is encoded again, ``obj`` tagged)."""
    known = sent.exts.get(id(obj))
    if known is None:
        return None
    if not sent.final:
        sent.again = True
        sent.keep.add(id(obj))
    return known[1]


def _array_ext(obj: Any, out: OutBuffers) -> bytes:
    """How the NumPy array ``obj`` travels in the frame whose buffers are
    ``out``: pickled (:func:`_pickle_ext`), once however often the frame
    holds it, tagged where it holds it more than once.  (Views of one array
    still travel apart: a pickle sends a view's own elements.)"""
    sent = _frame_sent()
    if sent is None:  # the frame's first array (or tensor): noted, no more
        ext = _pickle_ext(obj, out, -1)
        _tls.first = (obj, ext)
        return ext
    known = _again(sent, obj)
    if known is not None:
        return known
    if sent.final and id(obj) in sent.keep:
        ext = _pickle_ext(obj, out, sent.tags)
        sent.tags += 1
    else:
        ext = _pickle_ext(obj, out, -1)
    sent.exts[id(obj)] = (obj, ext)
    return ext


def _is_array(obj: Any) -> bool:
    """``obj`` is a NumPy array (of a subclass too)."""
    np = sys.modules.get("numpy")
    return np is not None and isinstance(obj, np.ndarray)


def _pickle_ext(obj: Any, out: OutBuffers, tag: int) -> bytes:
    """``obj`` pickled as a part of the frame whose buffers are ``out``
    (:class:`_PickleRef`; tagged where ``tag`` >= 0)."""
    start, data = _dump_part(obj, out)
    payload: bytes | int = data
    if len(data) >= OOB_THRESHOLD:
        out.append((data, KIND_BYTES))
        payload = len(out) - 1
    return _small.encode((start, payload, tag) if tag >= 0 else (start, payload))


def _compact_ext(torch: Any, obj: Any, out: OutBuffers, tag: int) -> bytes:
    """``obj`` as its own elements, contiguous (tagged where ``tag`` >= 0)."""
    t, mem, device = _tensor_memory(obj)
    index = len(out)
    out.append((mem, KIND_BUFFER))
    ref = (str(t.dtype), list(t.shape), list(t.stride()), index, device)
    if type(obj) is not torch.Tensor:  # (a subclass: its class travels beside it)
        return _small.encode((*ref, obj.requires_grad, 0, tag, _tensor_class(torch, obj, out)))
    if tag >= 0:
        return _small.encode((*ref, obj.requires_grad, 0, tag))
    return _small.encode((*ref, True) if obj.requires_grad else ref)


def _view_ext(torch: Any, obj: Any, out: OutBuffers, region: list[int], tag: int) -> bytes:
    """``obj`` as a view of the bytes ``region`` (``[lo, hi, index]``) of its
    storage, which several tensors of the frame view: those bytes are added
    to ``out`` once (``index``, -1 until then)."""
    lo, hi, index = region
    if index < 0:
        whole = torch.empty(0, dtype=torch.uint8, device=obj.device)
        _, mem, _ = _tensor_memory(whole.set_(obj.untyped_storage(), lo, (hi - lo,), (1,)))
        index = region[2] = len(out)
        out.append((mem, KIND_BUFFER))
    size = obj.element_size()
    device = "" if obj.device.type == "cpu" else str(obj.device)
    ref = (str(obj.dtype), list(obj.shape), list(obj.stride()), index, device,
           obj.requires_grad, (obj.storage_offset() * size - lo) // size, tag)
    if type(obj) is not torch.Tensor:  # (a subclass: its class travels beside it)
        return _small.encode((*ref, _tensor_class(torch, obj, out)))
    return _small.encode(ref)


class _Frame:
    """What decoding a frame's tagged values (:func:`_tensor_ext`,
    :func:`_array_ext`) made, so that every decoding of the frame (an
    argument's value decoded lazily, then in full; each argument alone)
    finds the same objects, while the frame's list of buffers stays as it
    came.  The last such frame of a thread is kept (``_tls.frame``), known by
    that list, which it references until every object it made is gone (so
    the list's ``id`` stays its own): one made again then meets none before
    it."""

    __slots__ = ("bases", "bufs", "live", "objects")

    def __init__(self, bufs: Buffers) -> None:
        #: the frame's buffers; None once every object made is gone
        self.bufs: Buffers | None = bufs
        #: by buffer index: the buffer as bytes on the device its tensors
        #: live on, once made (the storage they view)
        self.bases: dict[int, Any] = {}
        #: by tag: the object made (weakly: the frame keeps none alive)
        self.objects: dict[int, weakref.ref[Any]] = {}
        self.live = 0

    def made(self, tag: int) -> Any:
        """The object of ``tag`` if one is made and alive, else None."""
        ref = self.objects.get(tag)
        return None if ref is None else ref()

    def keep(self, tag: int, obj: Any) -> None:
        self.objects[tag] = weakref.ref(obj, self._gone)
        self.live += 1

    def _gone(self, _: weakref.ref[Any]) -> None:
        """(Run where an object made is freed, in any thread.)"""
        self.live -= 1
        if not self.live:
            self.bufs = None
            self.bases.clear()
            self.objects.clear()

    def base(self, bufs: Buffers, ref: _TensorRef) -> Any:
        """The bytes the tensors of buffer ``ref.index`` view, on their device."""
        base = self.bases.get(ref.index)
        if base is None:
            torch = import_torch()
            buf = _buffer(bufs, ref.index)
            base = (torch.frombuffer(buf, dtype=torch.uint8) if len(buf)
                    else torch.empty(0, dtype=torch.uint8))
            base = self.bases[ref.index] = _to_device(torch, base, buf, ref.device)
        return base


def _frame(bufs: Buffers) -> _Frame:
    """The :class:`_Frame` of the frame whose buffers are ``bufs``."""
    frame = _tls.frame
    if frame is None or frame.bufs is not bufs:
        frame = _tls.frame = _Frame(bufs)
    return frame


def _tensor(bufs: Buffers, ref: _TensorRef) -> Any:
    """The tensor ``ref`` describes, from the frame's buffers ``bufs``."""
    if ref.tag < 0:
        return _rebuild_tensor(_buffer(bufs, ref.index), ref.dtype, ref.shape, ref.strides,
                               ref.device, ref.requires_grad, *_sent_class(bufs, ref.cls))
    frame = _frame(bufs)
    t = frame.made(ref.tag)
    if t is None:
        cls, state = _sent_class(bufs, ref.cls)
        torch = import_torch()
        base = frame.base(bufs, ref)
        t = torch.empty(0, dtype=_dtype(torch, ref.dtype), device=base.device).set_(
            base.untyped_storage(), ref.offset, ref.shape, ref.strides)
        t = _as_sent(torch, t, ref.requires_grad, cls, state)
        frame.keep(ref.tag, t)
    return t


def _sent_class(bufs: Buffers, sent: int | bytes) -> tuple[Any, Any]:
    """``(class, attributes)`` of a tensor as :func:`_tensor_class` sent
    them (``(None, None)``: a ``torch.Tensor``)."""
    if not sent:
        return None, None
    if type(sent) is bytes:
        pickled = _unpickled(bufs, _pickle_ref.decode(sent))
        if type(pickled) is not tuple or len(pickled) != 2:
            raise ValueError(f"a tensor's class must travel as (class, state), got {pickled!r}")
        return pickled
    if sent == 1:
        return import_torch().nn.Parameter, None
    raise ValueError(f"unknown tensor class code {sent!r}")


def _frame_tensor(ext: bytes) -> Any:
    """A tensor pickled as a part of a frame (:func:`_dump_part`)."""
    return _tensor(_in(), _tensor_ref.decode(ext))


_utf8 = ctypes.pythonapi.PyUnicode_AsUTF8AndSize
_utf8.restype = ctypes.c_void_p
_utf8.argtypes = (ctypes.py_object, ctypes.POINTER(ctypes.c_ssize_t))


def ascii_memory(s: str) -> Any:
    """The bytes of the ASCII string ``s``: its own memory (no copy)."""
    n = ctypes.c_ssize_t()
    return owned_view(_utf8(s, ctypes.byref(n)), len(s), s)


#: attributes msgspec sets on a class it decodes (a dataclass, an enum, a
#: ``TypedDict``, a ``NamedTuple``, an attrs class): a cache of its own,
#: which cannot be pickled; a class shipped by value travels without it
#: (the receiver's msgspec makes its own)
_CLASS_CACHES: Final = ("__msgspec_cache__",)
_STRUCT_CONFIG: Final = ("frozen", "eq", "order", "array_like", "gc", "omit_defaults",
                         "forbid_unknown_fields", "repr_omit_defaults", "cache_hash", "dict",
                         "weakref", "tag", "tag_field")
_by_reference = getattr(cloudpickle.cloudpickle, "_should_pickle_by_reference",
                        lambda obj: obj.__module__ != "__main__")
#: cloudpickle's registry keeps one class per definition across messages
_tracker_id = getattr(cloudpickle.cloudpickle, "_get_or_create_tracker_id", lambda cls: None)
_track = getattr(cloudpickle.cloudpickle, "_lookup_class_or_track", lambda tid, cls: cls)


def _reduce_struct_class(cls: Any) -> Any:
    """A ``msgspec.Struct`` class pickled by value (defined in ``__main__`` or
    a notebook).  cloudpickle's empty skeleton + attribute setting loses the
    fields, which ``StructMeta`` reads once, at class creation; so the class is
    re-created from its annotations, defaults and config, and its methods
    (which may refer to the class) are set afterwards."""
    own = dict(vars(cls).get("__annotations__", {}))
    ns: dict[str, Any] = {"__module__": cls.__module__, "__qualname__": cls.__qualname__,
                          "__doc__": cls.__doc__, "__annotations__": own}
    rename, factories = {}, {}
    for f in msgspec.structs.fields(cls):
        if f.name not in own:
            continue
        if f.default is not msgspec.NODEFAULT:
            ns[f.name] = f.default
        elif f.default_factory is not msgspec.NODEFAULT:
            factories[f.name] = f.default_factory  # msgspec.field() does not pickle
        if f.encode_name != f.name:
            rename[f.name] = f.encode_name
    config = cls.__struct_config__
    kwargs = {k: getattr(config, k) for k in _STRUCT_CONFIG}
    mine = [p for p in inspect.signature(cls).parameters.values() if p.name in own]
    kwargs["kw_only"] = bool(mine) and all(p.kind is p.KEYWORD_ONLY for p in mine)
    kwargs["rename"] = rename or None
    if "__post_init__" in vars(cls):  # read by StructMeta at creation too
        ns["__post_init__"] = vars(cls)["__post_init__"]
    skip = {*ns, *cls.__struct_fields__, *_CLASS_CACHES, "__slots__", "__dict__", "__weakref__"}
    later = {k: v for k, v in vars(cls).items() if k not in skip}  # methods, class vars
    later["__annotations__"] = _resolved_annotations(cls)
    return (_make_struct_class,
            (type(cls), cls.__name__, cls.__bases__, ns, factories, kwargs, _tracker_id(cls)),
            later, None, None, _set_class_attrs)


def _make_struct_class(meta: Any, name: str, bases: tuple[type, ...], ns: dict[str, Any],
                       factories: dict[str, Any], kwargs: dict[str, Any],
                       tracker_id: str | None) -> Any:
    for k, factory in factories.items():
        ns[k] = msgspec.field(default_factory=factory)
    return _track(tracker_id, meta(name, bases, ns, **kwargs))


def _set_class_attrs(cls: Any, attrs: dict[str, Any]) -> None:
    for k, v in attrs.items():
        setattr(cls, k, v)


_cloudpickle_code = getattr(cloudpickle.cloudpickle, "_code_reduce", None)


def _reduce_code(code: types.CodeType) -> Any:
    """The code of a function shipped by value (defined in ``__main__``, a
    notebook cell, a function) keeps its file name and carries its own
    source lines, which the receiver adds to its :mod:`linecache`: a remote
    traceback through it shows the real file, line and source (cloudpickle
    names every such file ``<dynamic-code>``, which has no source)."""
    assert _cloudpickle_code is not None
    make, args = _cloudpickle_code(code)
    args = tuple(code.co_filename if isinstance(a, str) and a == "<dynamic-code>" else a
                 for a in args)
    first = code.co_firstlineno
    last = max((line for *_, line in code.co_lines() if line is not None), default=first)
    return _code_with_source, (make, args, first,
                               linecache.getlines(code.co_filename)[first - 1:last])


def _code_with_source(make: Callable[..., types.CodeType], args: tuple[Any, ...], first: int,
                      source: list[str]) -> types.CodeType:
    code = make(*args)
    if source:
        name = code.co_filename
        entry = linecache.cache.get(name)
        lines = list(entry[2]) if entry is not None and len(entry) == 4 else []
        lines += ["\n"] * (first - 1 + len(source) - len(lines))
        lines[first - 1:first - 1 + len(source)] = source
        # no mtime: kept by linecache.checkcache, like a notebook cell's lines
        linecache.cache[name] = (sum(map(len, lines)), None, lines, name)
    return code


class _Pickler(cloudpickle.Pickler):  # type: ignore[misc]
    """cloudpickle as meshio's messages use it: a tensor's storage and a
    ``memoryview`` as buffers, a class shipped by value without its caches,
    and an object whose class has a ``_meshio_reduce`` method reduced by it
    (an actor, which travels as a reference to itself; a plain pickle of
    it, as ``copy.deepcopy`` or a process pool makes, is left alone)."""

    #: the buffers of the frame this pickle is a part of (None: a blob of its own)
    out: OutBuffers | None = None

    def reducer_override(self, obj: Any) -> Any:
        if isinstance(obj, types.CodeType) and _cloudpickle_code is not None:
            return _reduce_code(obj)
        torch: Any = sys.modules.get("torch")
        tensor: Any = obj
        if _strided_tensor(torch, tensor):
            if self.out is not None:  # a part of a frame: its storage sent once for the frame
                return _frame_tensor, (_tensor_ext(torch, tensor, self.out),)
            t, mem, device = _tensor_memory(tensor)
            cls = type(tensor)
            kind = () if cls is torch.Tensor else (cls, torch._utils._get_obj_state(tensor))
            return _rebuild_tensor, (pickle.PickleBuffer(mem), str(t.dtype), list(t.shape),
                                     list(t.stride()), device, tensor.requires_grad, *kind)
        if isinstance(obj, type) and not _by_reference(obj):
            if issubclass(obj, msgspec.Struct) and obj is not msgspec.Struct:
                return _reduce_struct_class(obj)
            return _as_shipped(obj, super().reducer_override(obj))
        if type(obj) is memoryview:
            return _reduce_view(obj) or super().reducer_override(obj)
        own = getattr(type(obj), "_meshio_reduce", None)
        if own is not None:  # travels otherwise in a message than in a plain pickle (an actor)
            return own(obj)
        return super().reducer_override(obj)


def _reduce_view(view: memoryview) -> Any:
    """How a ``memoryview`` inside a pickled value travels (cloudpickle's own
    reduction makes it ``bytes``): its bytes as a pickle buffer (in a frame,
    out of band as a NumPy array's: :func:`_dump_part`), rebuilt with its
    format and shape (:func:`_view`), read-only where it was; None where
    they cannot be rebuilt from bytes (a format such as ``">i"``, an empty
    view of another format than ``"B"``): it travels as ``bytes`` then."""
    flat = view if view.c_contiguous else (bytes if view.readonly else bytearray)(view)
    if view.format == "B" and view.ndim == 1:
        return _view, (pickle.PickleBuffer(flat),)
    shape = list(view.shape or ())
    try:
        _view(flat, view.format, shape)
    except ValueError:
        return None
    return _view, (pickle.PickleBuffer(flat), view.format, shape)


def _as_shipped(cls: type, reduced: Any) -> Any:
    """cloudpickle's reduction of ``cls``, a class shipped by value
    (``(make, args, (class dict, slots), ...)``, its class dict a copy),
    less :data:`_CLASS_CACHES` (msgspec's cache of a dataclass used in an
    annotation once made every later pickling of the class fail), its
    annotations resolved (:func:`_resolved_annotations`)."""
    if (type(reduced) is tuple and len(reduced) > 2 and type(reduced[2]) is tuple
            and reduced[2] and type(reduced[2][0]) is dict):
        state = reduced[2][0]
        for name in _CLASS_CACHES:
            state.pop(name, None)
        if "__annotations__" in state:
            state["__annotations__"] = _resolved_annotations(cls)
    return reduced


#: the class dict cloudpickle ships of a class by value: ``(dict, slots)``
_class_state: Callable[[type], tuple[dict[str, Any], Any]] = getattr(
    cloudpickle.cloudpickle, "_class_getstate", lambda cls: (dict(vars(cls)), {}))


def unpicklable_part(cls: type) -> str | None:
    """What ``cls``, a class shipped by value that :func:`dumps` failed to
    pickle, refers to that cannot be pickled: ``"the global 'LOCK' that
    L.locked uses"``, ``"the variable 'guard' that L.locked captures"``,
    ``"a value that L.locked refers to"`` or ``"the class attribute
    L.pool"``; None where no one part fails alone.  (For the error that
    says so only: it pickles the class's values one by one.)"""
    shipped = [k for k in cls.__mro__ if not _by_reference(k)]
    failing = [(f"{klass.__qualname__}.{attr}", _functions(value))
               for klass in shipped for attr, value in _class_state(klass)[0].items()
               if attr not in _CLASS_CACHES and not _pickles(value, shipped)]
    # (methods first: meshio's own attributes hold the endpoints too)
    failing.sort(key=lambda f: not f[1])
    for where, functions in failing:
        for fn in functions:
            code = fn.__code__
            for name in sorted(_global_names(code) & fn.__globals__.keys()):
                if not _pickles(fn.__globals__[name], shipped):
                    return f"the global {name!r} that {where} uses"
            for var, cell in zip(code.co_freevars, fn.__closure__ or ()):
                with contextlib.suppress(ValueError):  # (an empty cell)
                    if not _pickles(cell.cell_contents, shipped):
                        return f"the variable {var!r} that {where} captures"
    if failing:
        where, functions = failing[0]
        return f"a value that {where} refers to" if functions else f"the class attribute {where}"
    return None


def _pickles(value: Any, classes: list[type]) -> bool:
    """Whether :func:`dumps` pickles ``value``, ``classes`` (those being
    explained, which fail as a whole) standing for themselves: a method
    that names its own class, or calls ``super()``, is not the culprit."""
    try:
        _Probe({id(k) for k in classes}).dump(value)
    except Exception:
        return False
    return True


class _Probe(_Pickler):
    """:func:`dumps`'s pickler, the objects of ``standing`` (ids) pickled as
    a mere mention of themselves."""

    def __init__(self, standing: set[int]) -> None:
        super().__init__(io.BytesIO(), protocol=5)
        self.standing = standing

    def persistent_id(self, obj: Any) -> Any:
        return id(obj) if id(obj) in self.standing else None


def _functions(value: Any) -> list[types.FunctionType]:
    """The functions a class attribute holds: a method, the function of a
    static or class method, a property's accessors, a decorated function
    (``functools.wraps``: an endpoint)."""
    if isinstance(value, (staticmethod, classmethod)):
        value = value.__func__
    found = [value.fget, value.fset, value.fdel] if isinstance(value, property) else [
        value, getattr(value, "__wrapped__", None)]
    return [f for f in found if isinstance(f, types.FunctionType)]


def _global_names(code: types.CodeType) -> set[str]:
    """The names ``code`` and the code nested in it (a comprehension, a
    function defined inside) may read as globals (cloudpickle ships those)."""
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _global_names(const)
    return names


def _resolved_annotations(cls: type) -> dict[str, Any]:
    """The annotations ``cls`` declares, each a str (as ``from __future__
    import annotations`` makes them, or a forward reference such as
    ``"list[Tree]"``) resolved where its module can resolve it.  A class
    shipped by value arrives without its module: where it is decoded, its
    ``__module__`` (``__main__``: the worker's own) does not define the
    names its annotations refer to.  (Set on the class once it exists, as
    pickle's state: an annotation may refer to the class itself.)  Where
    one cannot be resolved here, they are shipped as they are; the
    receiver's schema names the name it cannot resolve."""
    own: dict[str, Any] = dict(vars(cls).get("__annotations__", {}))
    if any(isinstance(v, str) for v in own.values()):
        try:
            hints = typing.get_type_hints(cls, include_extras=True)
        except Exception:
            return own
        own = {name: hints.get(name, v) for name, v in own.items()}
    return own


def _ship_mp_main_by_value() -> None:
    """In a ``multiprocessing`` child started by ``spawn`` or
    ``forkserver``, the user's main script runs as module ``__mp_main__``:
    cloudpickle would send what it defines by reference, which no worker
    can import (``No module named '__mp_main__'``); it is sent by value, as
    ``__main__``'s is.  (Once: the registration is for good.)"""
    global _mp_main_shipped
    if "__mp_main__" in sys.modules:
        cloudpickle.register_pickle_by_value(sys.modules["__mp_main__"])
        _mp_main_shipped = True


#: whether :func:`_ship_mp_main_by_value` has registered ``__mp_main__``
_mp_main_shipped = False


def dumps(obj: Any) -> bytes:
    """cloudpickle ``obj`` into a blob of its own (kept and sent on its own,
    e.g. an actor class shipped by value with the tensors it refers to):
    tensor storages go into the pickle.  (A part of a frame is
    :func:`_dump_part`.)"""
    if not _mp_main_shipped:
        _ship_mp_main_by_value()
    f = io.BytesIO()
    _Pickler(f, protocol=5).dump(obj)
    return f.getvalue()


def _dump_part(obj: Any, out: OutBuffers) -> tuple[int, bytes]:
    """``(start, pickle)``: ``obj`` pickled as a part of a frame whose
    buffers are ``out``.  A tensor's storage joins ``out`` as the frame's
    other tensors do (:func:`_tensor_ext`: once, however often the frame
    holds it); the pickle's own out-of-band buffers (a NumPy array's) are
    ``out[start:]`` after it, in the order :func:`loads` takes them."""
    if not _mp_main_shipped:
        _ship_mp_main_by_value()
    f = io.BytesIO()
    own: list[pickle.PickleBuffer] = []
    pickler = _Pickler(f, protocol=5, buffer_callback=own.append)
    pickler.out = out
    pickler.dump(obj)
    start = len(out)
    out += [(pb.raw(), KIND_BUFFER) for pb in own]
    return start, f.getvalue()


def loads(data: bytes | memoryview, bufs: Buffers, start: int) -> Any:
    """Unpickle what :func:`dumps` made, its buffers being ``bufs[start:]``."""
    if not 0 <= start <= len(bufs):
        raise ValueError(f"pickle buffers start at {start}, but the frame has {len(bufs)}")
    return pickle.loads(data, buffers=bufs[start:])


# ----------------------------------------------------------- msgspec hooks


class _OOB:
    __slots__ = ("buf",)

    def __init__(self, buf: bytes | bytearray | memoryview | str) -> None:
        self.buf = buf


class _Pickled:
    __slots__ = ("obj",)

    def __init__(self, obj: Any) -> None:
        self.obj = obj


_small = msgspec.msgpack.Encoder()
#: ``_small.encode``, bound once (see ``meshio._context.enter_scope``)
encode_small: Callable[[Any], bytes] = _small.encode


def _enc_hook(obj: Any) -> Any:
    out = _out()
    if type(obj) is _OOB:
        buf = obj.buf
        if type(buf) is str:
            as_ = _AS_STR
            kind, buf = ((KIND_ASCII, ascii_memory(buf)) if buf.isascii()
                         else (KIND_BYTES, buf.encode()))
        elif type(buf) is bytes:
            as_, kind = _AS_BYTES, KIND_BYTES
        else:
            as_, kind = ((_AS_BYTEARRAY, KIND_BYTEARRAY) if type(buf) is bytearray
                         else (_AS_MEMORYVIEW, KIND_BUFFER))
            if type(buf) is memoryview:
                view = buf
                if not view.c_contiguous:
                    buf = view.tobytes()
                if view.format != "B" or view.ndim != 1:  # rebuilt as it reads
                    out.append((buf, kind))
                    return msgspec.msgpack.Ext(EXT_BUFFER, _small.encode(
                        (len(out) - 1, as_, view.format, list(view.shape or ()))))
        index = len(out)
        out.append((buf, kind))
        return msgspec.msgpack.Ext(EXT_BUFFER, _small.encode((index, as_)))
    torch = sys.modules.get("torch")
    if _strided_tensor(torch, obj):
        return msgspec.msgpack.Ext(EXT_TENSOR, _tensor_ext(torch, obj, out))
    if type(obj) is _Pickled:
        obj = obj.obj
    elif not _tls.lenient and (_subclassed(obj) or _numpy_number(obj)
                               or type(obj) in _AS_ARRAYS):
        raise Refit  # (msgspec encodes the builtins themselves: this is a subclass)
    if _is_array(obj):
        return msgspec.msgpack.Ext(EXT_PICKLE, _array_ext(obj, out))
    return msgspec.msgpack.Ext(EXT_PICKLE, _pickle_ext(obj, out, -1))


class _Deferred(Exception):
    """A value validated lazily holds pickles, none of them unpickled yet."""


class _Later:
    """Stands for a pickle, not unpickled, while the value around it is
    validated lazily: where the annotation allows no pickle, msgspec says so
    ("Expected `int`, got `pickle`"); where it expects a class, validation
    stops (:func:`_dec_hook`): an instance can be checked once unpickled."""

    __slots__ = ()


_Later.__name__ = _Later.__qualname__ = "pickle"
_LATER: Final = _Later()
#: msgspec's words for a pickle (or, decoding typed, any extension value)
#: where the annotation allows none
_REFUSED: Final = ("got `pickle`", "got `ext`")


def _refused(e: msgspec.ValidationError) -> bool:
    """``e`` is msgspec's refusal of a pickle (see :data:`_REFUSED`)."""
    return any(r in str(e) for r in _REFUSED)


class _BufferRef(msgspec.Struct, array_like=True):
    """How a ``bytes``-like value travels: its bytes are buffer ``index``
    of the frame; a ``memoryview`` of another format or shape says which."""

    index: int
    as_: int
    format: str = "B"
    shape: list[int] | None = None


_buffer_ref = msgspec.msgpack.Decoder(_BufferRef)
class _TensorRef(msgspec.Struct, array_like=True):
    """How a tensor travels: its bytes are buffer ``index`` of the frame
    (from element ``offset`` on); ``tag`` >= 0: one the frame keeps by
    identity (:func:`_tensor_ext`); ``cls``: its class, where it is a
    subclass's (:func:`_tensor_class`)."""

    dtype: str
    shape: list[int]
    strides: list[int]
    index: int
    device: str
    requires_grad: bool = False  # (the last four sent only when not the default)
    offset: int = 0
    tag: int = -1
    cls: int | bytes = 0


_tensor_ref = msgspec.msgpack.Decoder(_TensorRef)


class _PickleRef(msgspec.Struct, array_like=True):
    """How a pickled value travels: its pickle (``data``: inline, or the
    index of the buffer holding it), its own buffers from buffer ``start`` on;
    ``tag`` >= 0: one the frame keeps by identity (:func:`_array_ext`)."""

    start: int
    data: bytes | int
    tag: int = -1  # (sent only when not the default)


_pickle_ref = msgspec.msgpack.Decoder(_PickleRef)


def _buffer(bufs: Buffers, index: int) -> Any:
    if not 0 <= index < len(bufs):
        raise ValueError(f"buffer index {index} out of range (the frame has {len(bufs)})")
    return bufs[index]


def _ext_hook(code: int, data: memoryview) -> Any:
    bufs = _in()
    if code == EXT_BUFFER:
        ref = _buffer_ref.decode(data)
        as_, buf = ref.as_, _buffer(bufs, ref.index)
        if as_ == _AS_STR:  # received as a str when it is ASCII
            return buf if type(buf) is str else str(buf, "utf-8")
        if as_ == _AS_MEMORYVIEW:
            return _view(buf, ref.format, ref.shape)
        return buf
    if code == EXT_TENSOR:
        return _tensor(bufs, _tensor_ref.decode(data))
    if code == EXT_PICKLE:
        pickled = _pickle_ref.decode(data)
        if pickled.tag < 0:
            return _unpickled(bufs, pickled)
        frame = _frame(bufs)
        obj = frame.made(pickled.tag)
        if obj is None:
            obj = _unpickled(bufs, pickled)
            frame.keep(pickled.tag, obj)
        return obj
    raise ValueError(f"unknown msgpack extension code {code}")


def _view(buf: Any, format: str = "B", shape: list[int] | None = None) -> memoryview:
    """``buf``'s bytes as a ``memoryview`` of ``format`` and ``shape`` (None:
    of bytes, as ``buf`` holds them); read-only where ``buf`` is.  (A
    ``memoryview`` value, sent as such or inside a pickle: :func:`_reduce_view`.)"""
    view = memoryview(buf)
    if shape is None:
        return view
    try:
        flat: Any = view.cast("B")  # (typeshed knows only the struct formats' letters)
        shaped: memoryview = flat.cast(format, shape)
    except (TypeError, ValueError) as e:
        raise ValueError(f"memoryview of format {format!r} and shape "
                         f"{shape} does not fit its {view.nbytes} bytes: {e}") from None
    return shaped


def _unpickled(bufs: Buffers, ref: _PickleRef) -> Any:
    """The value pickled as ``ref`` says, unpickled."""
    data = ref.data
    return loads(data if isinstance(data, bytes) else _buffer(bufs, data), bufs, ref.start)


def _lazy_ext_hook(code: int, data: memoryview) -> Any:
    """:func:`_ext_hook`, but a pickle is not unpickled: it is checked, noted
    (:func:`_pickles_met`) and stood for by ``_LATER``; so is a tensor whose
    class travels pickled (:func:`_tensor_class`)."""
    if code == EXT_TENSOR:
        ref = _tensor_ref.decode(data)
        if type(ref.cls) is not bytes:
            return _tensor(_in(), ref)
    elif code != EXT_PICKLE:
        return _ext_hook(code, data)
    else:
        _pickle_ref.decode(data)
    _tls.later = True
    return _LATER


def _pickles_met() -> bool:
    """Whether the lazy decoding just done met a pickle (then forgotten)."""
    if _tls.later:
        _tls.later = False
        return True
    return False


def _dec_hook(tp: Any, obj: Any) -> Any:
    if obj is _LATER:
        raise _Deferred
    if isinstance(obj, getattr(tp, "__origin__", tp)):
        return obj
    raise TypeError(f"Expected `{getattr(tp, '__qualname__', tp)}`, got `{type(obj).__name__}`")


def _lazy_dec_hook(tp: Any, obj: Any) -> Any:
    """:func:`_dec_hook`, taking a pickle not unpickled where a class is
    expected (:meth:`TypedDecoder.explain_lazily`: another part is wrong)."""
    return obj if obj is _LATER else _dec_hook(tp, obj)


_HEAPTYPE: Final = 1 << 9


def type_name(t: type) -> str:
    """``t`` as msgspec names a type in its messages (CPython's ``tp_name``:
    ``numpy.float64``, ``MyStr``)."""
    if t.__flags__ & _HEAPTYPE or t.__module__ == "builtins":
        return t.__name__
    return f"{t.__module__}.{t.__name__}"


#: stand-ins made by :func:`_named` (a few: only messages need them)
_stand_ins: dict[type, Any] = {}


def _named(t: type) -> Any:
    """A stand-in msgspec names as ``t`` in its messages, but takes for no
    builtin (:func:`_naming_ext_hook`)."""
    stand_in = _stand_ins.get(t)
    if stand_in is None:
        if len(_stand_ins) >= 64:
            _stand_ins.clear()
        stand_in = _stand_ins[t] = type(type_name(t), (), {"__slots__": ()})()
    return stand_in


def _naming_ext_hook(code: int, data: memoryview) -> Any:
    """:func:`_ext_hook`, but a pickled instance of a builtin's subclass is
    stood for by :func:`_named` (msgspec would take a ``str`` subclass for a
    ``str``; the annotation refused it pickled)."""
    value = _ext_hook(code, data)
    if code == EXT_PICKLE and _subclassed(value):
        return _named(type(value))
    return value


# ---------------------------------------------------------------- walkers


def _prep_typed(v: Any) -> Any:
    """Move big buffers out of band; msgspec does the rest."""
    t = type(v)
    if t in _PLAIN:
        return v if t is not str or len(v) < OOB_THRESHOLD else _OOB(v)
    if t is bytes:
        return _OOB(v) if len(v) >= OOB_THRESHOLD else v
    if t is bytearray or t is memoryview:
        return _OOB(v)
    if t is list:
        return [_prep_typed(x) for x in v]
    if t is tuple:
        return tuple(_prep_typed(x) for x in v)
    if t is dict:
        return {k: _prep_typed(x) for k, x in v.items()}
    return v


def _prep_untyped(v: Any) -> Any:
    """Keep the Python type: plain data natively, the rest pickled."""
    t = type(v)
    if t in _PLAIN:
        if t is str:
            return v if len(v) < OOB_THRESHOLD else _OOB(v)
        return v if t is not int or _INT_MIN <= v <= _INT_MAX else _Pickled(v)
    if t is bytes:
        return _OOB(v) if len(v) >= OOB_THRESHOLD else v
    if t is bytearray or t is memoryview:
        return _OOB(v)
    if t is list:
        return [_prep_untyped(x) for x in v]
    if t is dict and all(type(k) is str for k in v):
        return {k: _prep_untyped(x) for k, x in v.items()}
    torch = sys.modules.get("torch")
    if (torch is not None and t is torch.Tensor) or t is _Pickled:  # (_Pickled: _escaped's)
        return v
    return _Pickled(v)


def _prep_escaped(v: Any) -> Any:
    """:func:`_prep_untyped`, where encoding met a str UTF-8 cannot encode
    (:func:`_escaped`)."""
    return _prep_untyped(_escaped(v))


def _escaped(v: Any) -> Any:
    """``v``, an untyped value whose encoding met a str that UTF-8 cannot
    encode (one holding a lone surrogate, ``"\\ud800"``: msgpack's str is
    UTF-8), with each such str pickled (as pickle and Ray send it), and each
    map with such a key; the rest as it is.  (Only on that error: the
    ordinary str pays nothing for it.)"""
    t = type(v)
    if t is str:
        return v if _encodes_utf8(v) else _Pickled(v)
    if t is list:
        return [_escaped(x) for x in v]
    if t is dict and all(type(k) is str for k in v):
        if all(map(_encodes_utf8, v)):
            return {k: _escaped(x) for k, x in v.items()}
        return _Pickled(v)
    return v


def _encodes_utf8(s: str) -> bool:
    """Whether UTF-8 encodes ``s`` (it holds no lone surrogate)."""
    try:
        s.encode()
    except UnicodeEncodeError:
        return False
    return True


# ---------------------------------------------------------------- fitting

#: the builtins msgpack carries natively, though not their subclasses
_BUILTINS: Final = (int, float, str, bytes)
#: the exact types among :data:`_BUILTINS` (and ``bool``, an ``int``)
_EXACT: Final = frozenset({int, float, str, bytes, bool})
#: what msgspec hands a class of its own (a ``CustomType``) to check, where
#: the value was sent natively: a class that admits one of these cannot tell
#: from it what was sent (``object``, ``Hashable``: a tuple arrives a list)
_NATIVE: Final = (dict, list, str, bytes, int, float, bool, type(None))
#: what msgpack carries as an array only once made a list: a ``range``, a
#: dict's views (``Sequence[int]`` admits a ``range``, ``AbstractSet[str]``
#: a ``dict_keys``); a typed value holding one is fitted (:class:`Refit`)
_AS_ARRAYS: Final[frozenset[type[Iterable[Any]]]] = frozenset(
    {range, type({}.keys()), type({}.values()), type({}.items())})
_ARRAYS: Final[tuple[type[Iterable[Any]], ...]] = (list, tuple, set, frozenset, *_AS_ARRAYS)
_MI: Final = msgspec.inspect
_ARRAY_TYPES: Final = (_MI.ListType, _MI.SetType, _MI.FrozenSetType, _MI.VarTupleType)
_MAP_TYPES: Final = (_MI.DictType, _MI.FrozenDictType)
_OBJECT_TYPES: Final = (_MI.DataclassType, _MI.StructType)
#: a function that prepares a value to travel as its type says (:func:`travel`,
#: :func:`refitter`)
Fit = Callable[[Any], Any]
#: a field a value lacks (:func:`_fit_object`)
_MISSING: Final = object()


class Refit(Exception):
    """The encoder met an instance of a subclass of ``int``, ``float``,
    ``str`` or ``bytes`` (``np.float64``, which ``np.mean`` returns), or a
    ``range`` or a dict's view (:data:`_AS_ARRAYS`), in a typed value:
    msgpack carries one only pickled, which its annotation may not allow.
    The schema packs the value again with :func:`refitter`'s function,
    under :func:`lenient`."""


class Subclassed(Exception):
    """A typed value holds an instance of a subclass of a dataclass, attrs
    class or Struct its annotation names: msgspec would send it as the class
    named, its type lost and its own fields dropped.  The schema packs the
    value again with :func:`refitter`'s function, which pickles it whole;
    the receiver checks it against its annotation (:func:`is_pickle`)."""


class Unfit(Exception):
    """A typed value cannot travel as its annotation says: ``value``, an int
    outside the range msgpack carries (the schema names where it is)."""

    def __init__(self, value: int) -> None:
        self.value = value
        bits = value.bit_length()
        shown = int.__repr__(value) if bits <= 256 else f"of {bits} bits"
        super().__init__(f"the int {shown} is outside the range a typed int travels in "
                         "(-2**63 to 2**64 - 1)")


class Unsendable(TypeError):
    """Raised by the ``__reduce__`` of an object that stays in its process
    (a channel's receiver, a service, an actor not spawned): ``what`` it
    is and what to send ``instead``; ``value`` is the object itself, so
    that the schema names where it is in the arguments (:meth:`at`)."""

    def __init__(self, value: object, what: str, instead: str) -> None:
        super().__init__(f"{what} cannot be sent: {instead}")
        self.value = value
        self.what = what
        self.instead = instead

    def at(self, where: str) -> str:
        """The message, ``where`` (`` - at `$.inbox` ``) after what it is."""
        return f"{self.what} cannot be sent{where}: {self.instead}"


@contextlib.contextmanager
def lenient() -> Generator[None, None, None]:
    """Within: a builtin's subclass in a typed value is pickled as it is
    (where :func:`refitter` left it: its annotation names a class of its
    own), not refused with :class:`Refit`."""
    _tls.lenient = True
    try:
        yield
    finally:
        _tls.lenient = False


def _builtin(v: Any) -> Any:
    """``v``, an instance of a subclass of a builtin of :data:`_BUILTINS`, as
    that builtin, by the builtin's own conversion (the subclass's
    ``__str__`` or ``__float__`` is not asked)."""
    if isinstance(v, str):
        return str.__str__(v)
    if isinstance(v, bytes):
        return bytes.__bytes__(v)
    if isinstance(v, float):
        return float.__float__(v)
    return int.__int__(v)


def _subclassed(v: Any) -> bool:
    """``v`` is an instance of a subclass of a builtin of :data:`_BUILTINS`
    (not an enum member: msgspec encodes those by value)."""
    return type(v) not in _EXACT and isinstance(v, _BUILTINS) and not isinstance(v, enum.Enum)


def _numpy_number(v: Any) -> bool:
    """``v`` is a NumPy number or bool no builtin is a base of (``np.int64``,
    ``np.float32``, ``np.bool_``; ``np.float64`` is a ``float``)."""
    np = sys.modules.get("numpy")
    return (np is not None and isinstance(v, (np.integer, np.floating, np.bool_))
            and not isinstance(v, float))


def _fit_leaf(v: Any) -> Any:
    """A value where the annotation wants a builtin (or no class of its own):
    a builtin's subclass becomes the builtin, a NumPy number the builtin its
    ``item()`` gives (``np.int64`` an ``int``); an int msgpack cannot carry
    raises :class:`Unfit`."""
    fitted = _builtin(v) if _subclassed(v) else v.item() if _numpy_number(v) else v
    if type(fitted) is int and not _INT_MIN <= fitted <= _INT_MAX:
        raise Unfit(v)  # (the value as sent: the schema finds it by identity)
    return _prep_typed(fitted)


def _fit_custom(v: Any) -> Any:
    """A value where the annotation names a class of its own (checked with
    ``isinstance`` on arrival): a builtin's subclass, or an int msgpack
    cannot carry, travels pickled, as it is."""
    if _subclassed(v) or (type(v) is int and not _INT_MIN <= v <= _INT_MAX):
        return _Pickled(v)
    return _prep_typed(v)


def _open_class(cls: Any) -> bool:
    """Whether a value sent natively (a tuple, a dataclass: as a list, a
    map) could pass for an instance of ``cls`` on arrival."""
    try:
        return any(issubclass(t, cls) for t in _NATIVE)
    except TypeError:  # (a Protocol isinstance cannot check: msgspec's check fails alike)
        return False


class _Fitting:
    """Builds the function that fits values to a msgspec type (its
    ``msgspec.inspect`` description).  ``full``: every part (:func:`refitter`);
    else only the untyped parts (:func:`travel`), the others as
    :func:`_prep_typed` prepares them.  ``escape``: the untyped parts' strs
    UTF-8 cannot encode are pickled (:func:`_escaped`)."""

    def __init__(self, full: bool, escape: bool = False) -> None:
        self.full = full
        #: how an untyped part travels
        self.untyped: Fit = _prep_escaped if escape else _prep_untyped
        self._fits: dict[int, Fit] = {}
        self._open: dict[int, bool] = {}

    def open(self, info: Any) -> bool:
        """Whether a part of ``info`` needs fitting: msgspec decodes it as
        plain data (``Any``, or a class that admits it: :func:`_open_class`),
        or it is a dataclass, attrs class or Struct (a subclass's instance
        cannot travel natively: :class:`Subclassed`)."""
        key = id(info)
        known = self._open.get(key)
        if known is not None:
            return known
        self._open[key] = False  # (while in progress: a type that refers to itself)
        if isinstance(info, (_MI.AnyType, *_OBJECT_TYPES)):  # (an object: its class is checked)
            found = True
        elif isinstance(info, _MI.CustomType):
            found = _open_class(info.cls)
        else:
            found = any(self.open(part) for part in _parts(info))
        self._open[key] = found
        return found

    def fit(self, info: Any) -> Fit | None:
        """The function for ``info``; None where a partial one leaves it to
        :func:`_prep_typed`."""
        if not self.full and not self.open(info):
            return None
        key = id(info)
        known = self._fits.get(key)
        if known is not None:
            return known
        later: list[Fit] = []  # (a type that refers to itself: its function, once made)
        self._fits[key] = lambda v: later[0](v)
        made = self._make(info)
        later.append(made)
        self._fits[key] = made
        return made

    def part(self, info: Any) -> Fit:
        return self.fit(info) or _prep_typed

    def _make(self, info: Any) -> Fit:
        if isinstance(info, _MI.AnyType):
            return self.untyped
        if isinstance(info, _MI.CustomType):
            return self.untyped if _open_class(info.cls) else _fit_custom
        if isinstance(info, _MI.Metadata):
            return self.part(info.type)
        if isinstance(info, _ARRAY_TYPES):
            return _fit_array(self.part(info.item_type))
        if isinstance(info, _MI.TupleType):
            return _fit_tuple([self.part(t) for t in info.item_types])
        if isinstance(info, _MAP_TYPES):
            return _fit_map(self.part(info.key_type), self.part(info.value_type))
        if isinstance(info, _MI.TypedDictType):
            return _fit_typed_dict({f.encode_name: self.part(f.type) for f in info.fields})
        if isinstance(info, _MI.NamedTupleType):
            return _fit_tuple([self.part(f.type) for f in info.fields], longer=True)
        if isinstance(info, _OBJECT_TYPES):
            fields = [(f.name, f.encode_name, fit) for f in info.fields
                      if (fit := self.fit(f.type)) is not None]
            return _fit_object(info.cls, fields, isinstance(info, _MI.StructType))
        if isinstance(info, _MI.UnionType):
            return self._union(info.types)
        return _fit_leaf

    def _union(self, arms: tuple[Any, ...]) -> Fit:
        classes: list[tuple[type, Fit]] = []
        arrays: Fit | None = None
        maps: Fit | None = None
        for arm in arms:
            fit = self.part(arm)
            inner = arm.type if isinstance(arm, _MI.Metadata) else arm
            if isinstance(inner, (_MI.CustomType, _MI.NamedTupleType, *_OBJECT_TYPES)):
                classes.append((getattr(inner.cls, "__origin__", inner.cls), fit))
            if isinstance(inner, (*_ARRAY_TYPES, _MI.TupleType)) and arrays is None:
                arrays = fit
            if isinstance(inner, (*_MAP_TYPES, _MI.TypedDictType)) and maps is None:
                maps = fit
        for arm in arms:  # a dataclass or Struct is also sent as a map
            if isinstance(arm, _OBJECT_TYPES) and maps is None:
                maps = self.part(arm)
        return _fit_union(classes, arrays, maps)


def _parts(info: Any) -> list[Any]:
    """The types ``info`` is made of (its items, fields, arms)."""
    if isinstance(info, _MI.Metadata):
        return [info.type]
    if isinstance(info, _ARRAY_TYPES):
        return [info.item_type]
    if isinstance(info, _MI.TupleType):
        return list(info.item_types)
    if isinstance(info, _MAP_TYPES):
        return [info.key_type, info.value_type]
    if isinstance(info, (_MI.TypedDictType, _MI.NamedTupleType, *_OBJECT_TYPES)):
        return [f.type for f in info.fields]
    if isinstance(info, _MI.UnionType):
        return list(info.types)
    return []


def _fit_array(item: Fit) -> Fit:
    def fit(v: Any) -> Any:
        if isinstance(v, _ARRAYS):
            return [item(x) for x in v]
        return _fit_leaf(v)
    return fit


def _fit_tuple(items: list[Fit], longer: bool = False) -> Fit:
    """A fixed-length array (``longer``: a NamedTuple's, which may be sent
    short of its defaults; items past its fields are fitted as leaves)."""
    n = len(items)

    def fit(v: Any) -> Any:
        if isinstance(v, (list, tuple)) and (len(v) == n or longer):
            return [items[i](x) if i < n else _fit_leaf(x) for i, x in enumerate(v)]
        return _fit_leaf(v)
    return fit


def _fit_map(key: Fit, value: Fit) -> Fit:
    def fit(v: Any) -> Any:
        if isinstance(v, dict):
            return {k if type(k) is str else _fit_key(key, k): value(x) for k, x in v.items()}
        return _fit_leaf(v)
    return fit


def _fit_key(key: Fit, k: Any) -> Any:
    """A map key: fitted, but never out of band (msgpack keys are in band)."""
    fitted = key(k)
    return fitted.buf if type(fitted) is _OOB else fitted


def _fit_typed_dict(fields: dict[str, Fit]) -> Fit:
    def fit(v: Any) -> Any:
        if isinstance(v, dict):
            return {k: fields[k](x) if k in fields else _fit_leaf(x) for k, x in v.items()}
        return _fit_leaf(v)
    return fit


def _fit_object(cls: Any, fields: list[tuple[str, str, Fit]], struct: bool) -> Fit:
    """A dataclass, attrs class or Struct: an instance whose fitted fields
    differ from its own travels as a shallow copy holding them (its class's
    code does not run: no ``__init__`` or ``__post_init__``); a subclass's
    instance raises :class:`Subclassed`; a map sent for one is fitted as
    its fields."""
    origin = getattr(cls, "__origin__", cls)  # (a generic one: Box[float])
    by_key = {key: fit for _, key, fit in fields}

    def fit(v: Any) -> Any:
        if type(v) is origin:
            changed: dict[str, Any] = {}
            for name, _, fit_field in fields:
                x = getattr(v, name, _MISSING)  # (missing: msgspec says so)
                if x is not _MISSING:
                    y = fit_field(x)
                    if y is not x:
                        changed[name] = y
            return _replaced(v, changed, struct) if changed else v
        if isinstance(v, origin):
            raise Subclassed
        if isinstance(v, dict):
            return {k: by_key[k](x) if k in by_key else _fit_leaf(x) for k, x in v.items()}
        return _fit_leaf(v)
    return fit


def _replaced(v: Any, changed: dict[str, Any], struct: bool) -> Any:
    new = copy.copy(v)
    for name, x in changed.items():
        if struct:
            msgspec.structs.force_setattr(new, name, x)
        else:
            object.__setattr__(new, name, x)  # (a frozen dataclass too)
    return new


def _fit_union(classes: list[tuple[type, Fit]], arrays: Fit | None, maps: Fit | None) -> Fit:
    """An arm by the value's kind: an instance of an arm's class, an array,
    a map; else a leaf (msgspec allows one arm of each kind)."""
    def fit(v: Any) -> Any:
        for cls, fit_arm in classes:
            if isinstance(v, cls):
                return fit_arm(v)
        if arrays is not None and isinstance(v, _ARRAYS):
            return arrays(v)
        if maps is not None and isinstance(v, dict):
            return maps(v)
        return _fit_leaf(v)
    return fit


def travel(tp: Any) -> bool | Fit:
    """How a value of the type ``tp`` (one :func:`decoder_for` accepted)
    travels: True, natively (:func:`_prep_typed`); or, where msgspec would
    decode a part as plain data (``Any``, ``object``: a dataclass would
    arrive a dict, a tuple a list), a function that prepares the value so
    that those parts travel as untyped values do, keeping their Python type."""
    try:
        fit = _Fitting(full=False).fit(msgspec.inspect.type_info(tp))
    except Exception:  # (msgspec describes every type it decodes: not expected)
        return True
    return True if fit is None else fit


def refitter(tp: Any, escape: bool = False) -> Fit:
    """The function that prepares a value of the type ``tp`` to travel
    when the encoder refused it (:class:`Refit`, :class:`Unfit`,
    ``OverflowError``): as :func:`travel` prepares it, and in every typed
    part, a builtin's subclass becomes the builtin (a ``str`` subclass a
    ``str``), except where the annotation names a class of its own (it then
    travels pickled, as it is); an int msgpack cannot carry raises
    :class:`Unfit`; a value holding a subclass's instance where a dataclass,
    attrs class or Struct is named travels pickled whole (:class:`Subclassed`).
    ``escape`` (the encoder met a str UTF-8 cannot encode,
    ``UnicodeEncodeError``): such strs in the untyped parts (``Any``) are
    pickled too, as untyped values' are; in a typed part, one still raises
    ``UnicodeEncodeError`` (its annotation sends a str as UTF-8)."""
    try:
        fit = _Fitting(full=True, escape=escape).part(msgspec.inspect.type_info(tp))
    except Exception:  # (as in travel)
        return _fit_leaf

    def refit(v: Any) -> Any:
        try:
            return fit(v)
        except Subclassed:
            return _Pickled(v)
    return refit


def holds_objects(tp: Any) -> bool:
    """Whether a value of the type ``tp`` (one :func:`decoder_for` accepted)
    may hold a dataclass, attrs class or Struct, and so may travel pickled
    whole (:class:`Subclassed`)."""
    try:
        return _holds_objects(msgspec.inspect.type_info(tp), set())
    except Exception:  # (as in travel)
        return False


def _holds_objects(info: Any, seen: set[int]) -> bool:
    if isinstance(info, _OBJECT_TYPES):
        return True
    if id(info) in seen:  # (a type that refers to itself)
        return False
    seen.add(id(info))
    return any(_holds_objects(part, seen) for part in _parts(info))


_root_ext: Final = msgspec.msgpack.Decoder(msgspec.msgpack.Ext)


def is_pickle(data: Any) -> bool:
    """Whether ``data`` encodes one pickled value (a typed value sent
    pickled whole: :class:`Subclassed`), without unpickling it."""
    try:
        return _root_ext.decode(data).code == EXT_PICKLE
    except msgspec.DecodeError:  # (another value, or bad data)
        return False


def unpickle(data: Any, bufs: Buffers) -> Any:
    """The value ``data`` encodes (:func:`is_pickle`), unpickled: its own
    reconstruction code runs, and may raise anything."""
    _tls.bufs = bufs
    try:
        return _any_decoder.decode(data)
    finally:
        _tls.bufs = None


# ------------------------------------------------------------------ packer

_encoder = msgspec.msgpack.Encoder(enc_hook=_enc_hook)
_any_decoder = msgspec.msgpack.Decoder(ext_hook=_ext_hook)
_lazy_any_decoder = msgspec.msgpack.Decoder(ext_hook=_lazy_ext_hook)
_naming_decoder = msgspec.msgpack.Decoder(ext_hook=_naming_ext_hook)


def _inline(v: Any) -> bool:
    """A plain value msgpack carries as is, in the message body."""
    t = type(v)
    if t is int:
        n: int = v
        return _INT_MIN <= n <= _INT_MAX
    if t is str:
        return len(v) < OOB_THRESHOLD
    return t in _PLAIN


def _prepped(values: dict[str, Any], typed: Mapping[str, bool | Fit]) -> dict[str, Any]:
    """:meth:`Packer.pack_map`'s values, big buffers out of band and untyped
    ones pickled.  (Apart from it: its comprehension would make a closure
    cell on each call of it.)"""
    return {k: v if _inline(v) else _prep_typed(v) if typed[k] is True
            else _prep_untyped(v) if typed[k] is False else typed[k](v)  # type: ignore[operator]
            for k, v in values.items()}


class Packer(list[tuple[Any, int]]):
    """Encodes values for one frame; the list of its out-of-band buffers
    (its ``OutBuffers``; a list, made without a Python ``__init__``: one is
    made per call sent).

    ``pack`` and ``pack_map`` raise :class:`~meshio.SchemaError` when the
    message would exceed the size limit (:func:`set_limits`); for a typed
    value, :class:`Refit`, :class:`Unfit` or ``OverflowError`` when it
    cannot travel as it is prepared (:func:`refitter` prepares it anew),
    and ``UnicodeEncodeError`` when it holds a str UTF-8 cannot encode (a
    lone surrogate: ``refitter(tp, escape=True)`` prepares it anew, each
    value then encoded with :meth:`encode`); ``pack`` pickles such a str
    in an untyped value itself.

    How a value travels (``typed``): False, untyped; True, typed
    (natively); or a function that prepares it (:func:`travel`,
    :func:`refitter`).
    """

    __slots__ = ("ports",)
    #: set once it becomes a :class:`Handing` (unset on a plain Packer)
    ports: list[tuple[str, int]]

    def pack(self, value: Any, typed: bool | Fit) -> bytes:
        try:
            if _inline(value):
                return _small.encode(value)
            prepped = (_prep_typed(value) if typed is True else _prep_untyped(value)
                       if typed is False else typed(value))
            return self.encode(prepped)
        except UnicodeEncodeError:  # a str with a lone surrogate: untyped, it is pickled
            if typed is not False:
                raise
            self.clear()
            return self.encode(_prep_escaped(value))

    def pack_map(self, values: dict[str, Any], typed: Mapping[str, bool | Fit]) -> bytes:
        """``values`` by name; ``typed``: how each travels."""
        for v in values.values():  # (a loop: all(map(...)) calls _inline from C, 2x the cost)
            if not _inline(v):
                return self.encode(_prepped(values, typed))
        return _small.encode(values)  # the common case: nothing to prepare

    def clear(self) -> None:
        """Forget what an encoding of the frame noted (its buffers, and a
        :class:`Handing`'s ports), to encode it anew."""
        del self[:]
        if type(self) is Handing:
            self.ports.clear()

    def encode(self, prepped: Any) -> bytes:
        _tls.out = self
        try:
            body = _encoder.encode(prepped)
            sent = _tls.sent
            if sent is not None and sent.again:  # a tensor held twice, or views of one storage
                self.clear()
                _tls.sent = sent.second()
                body = _encoder.encode(prepped)
        finally:
            _tls.out = None
            _tls.first = None
            _tls.sent = None
        self.check(len(body))
        return body

    def check(self, body_len: int) -> None:
        """Refuse a message over the limits before anything is sent."""
        size = body_len + sum(memoryview(b).nbytes for b, _ in self)
        if size > limits.max_message - _ENVELOPE:
            raise SchemaError(
                f"the message would be {size} bytes, over the message size limit of "
                f"{limits.max_message} bytes; raise it with meshio.set_limits(max_message=...)"
                " (or MESHIO_MAX_MESSAGE), or send less at a time")
        if body_len > MAX_BODY:
            raise SchemaError(
                f"the message's in-band part would be {body_len} bytes, over the "
                f"{MAX_BODY}-byte wire limit for data that is not bytes, str, a tensor or a "
                "pickle; pass large data as bytes or a tensor")


class Handing(Packer):
    """A :class:`Packer` whose value holds ports: ``ports``, the address
    and id of each (:func:`hands_port`).  The connection that sends it
    counts its peer among the holders of those of them opened in this
    process (:meth:`~._connection.Connection.call`).  (A class of its own,
    so that a frame without ports pays one type check for this.)"""

    __slots__ = ()


def hands_port(addr: str, port_id: int) -> None:
    """A port (opened at ``addr``) is being encoded: note it in the frame's
    :class:`Packer`, which becomes a :class:`Handing` (no frame being
    encoded in this thread: a port pickled for another use, not noted)."""
    out = _tls.out
    if type(out) is Packer:
        out.__class__ = Handing
        out.ports = [(addr, port_id)]
    elif type(out) is Handing:
        out.ports.append((addr, port_id))


def decoder_for(tp: Any) -> tuple[Any, bool]:
    """``(decodable type, typed)`` for an annotation: ``(Any, False)`` for one
    msgspec cannot describe (a union of two dataclasses, an enum of mixed
    values, a class holding one): such a value travels untyped, keeping its
    Python type, and the schema checks it against the annotation.  (Never
    the annotation's origin, ``list`` for ``list[A | B]``: its items would
    arrive as plain data, a dataclass as a dict.)"""
    if tp is Any or tp is object:
        return Any, False
    try:
        msgspec.msgpack.Decoder(tp, dec_hook=_dec_hook, ext_hook=_ext_hook)
    except TypeError:
        return Any, False
    return tp, True


class TypedDecoder:
    """Decodes msgpack into ``tp`` with validation; buffers via ``bufs``.

    Any exception may come out of :meth:`decode` (msgspec's errors for bad
    data, whatever a pickled value's reconstruction raises, ``RecursionError``
    for deep nesting): callers turn them into typed errors.
    """

    __slots__ = ("_dec", "_lazy", "_tp", "plain")

    def __init__(self, tp: Any) -> None:
        self._tp = tp
        self._dec = msgspec.msgpack.Decoder(tp, dec_hook=_dec_hook, ext_hook=_ext_hook)
        self._lazy = msgspec.msgpack.Decoder(tp, dec_hook=_dec_hook, ext_hook=_lazy_ext_hook)
        #: :meth:`decode` of a value with no buffers, not lazily, in one C
        #: call (None where a subclass checks more)
        self.plain: Callable[[Any], Any] | None = self._dec.decode

    def decode(self, data: Any, bufs: Buffers, lazy: bool = False) -> Any:
        """The value; with ``lazy``, no pickle is unpickled (the value's own
        code does not run): a pickle where the annotation allows none is a
        ``ValidationError``, and ``_Deferred`` says that the value holds
        pickles, validated as far as can be before they are unpickled."""
        if not bufs:  # the common case: no buffer for the hooks to find
            if not lazy:
                return self._dec.decode(data)
            return self._validated(self._lazy.decode, data)
        _tls.bufs = bufs
        try:
            # Extension values cannot stand where msgspec expects a builtin
            # (a big ``bytes``), so decode loosely first, then validate.
            if not lazy:
                return msgspec.convert(_any_decoder.decode(data), self._tp, dec_hook=_dec_hook)
            return self._validated(self._convert_lazily, data)
        finally:
            _tls.bufs = None

    def explain(self, data: Any, bufs: Buffers, error: msgspec.ValidationError) -> str:
        """msgspec's message for ``error``, met decoding ``data`` (not
        lazily), naming the Python type of a pickled value where it says
        only that an extension value arrived ("Expected `int`, got `ext`"):
        the error path alone decodes ``data`` again, unpickling it as a
        ``decode`` where the annotation allows a pickle would (where that
        raises, the message says so).  A builtin's subclass, which msgspec
        would take for the builtin, is named by its own type too."""
        message = str(error)
        if "got `ext`" not in message:
            return message
        _tls.bufs = bufs
        try:
            msgspec.convert(_naming_decoder.decode(data), self._tp, dec_hook=_dec_hook)
        except msgspec.ValidationError as e:
            return str(e)
        except BaseException as e:  # its reconstruction raised
            try:
                why = f"{type(e).__name__}: {e}"
            except BaseException:  # (its __str__ too)
                why = type(e).__name__
            return message.replace(
                "got `ext`", f"got a pickle, which cannot be unpickled here ({why})", 1)
        finally:
            _tls.bufs = None
        return message.replace("got `ext`", "got a pickle", 1)

    def explain_lazily(self, data: Any, bufs: Buffers, message: str) -> str:
        """msgspec's ``message``, met decoding ``data`` lazily, naming what
        arrived where it says only that an extension value did ("got
        `ext`"), without unpickling anything: a tensor or a buffer by its
        type, a pickle as ``pickle`` (as a lazy decoding with buffers says)."""
        if "got `ext`" not in message:
            return message
        _tls.bufs = bufs
        try:
            msgspec.convert(_lazy_any_decoder.decode(data), self._tp, dec_hook=_lazy_dec_hook)
        except msgspec.ValidationError as e:
            message = str(e)
        except Exception:  # (bad data: msgspec's first word stands)
            pass
        finally:
            _tls.bufs = None
            _tls.later = False
        return message.replace("got `ext`", "got `pickle`", 1)

    def _convert_lazily(self, data: Any) -> Any:
        """:meth:`decode` with buffers, lazily.  (A method, not a closure: a
        function whose frame makes closure cells pays for them on each call,
        even where it makes no closure; :meth:`decode` runs per call.)"""
        return msgspec.convert(_lazy_any_decoder.decode(data), self._tp, dec_hook=_dec_hook)

    @staticmethod
    def _validated(decode: Callable[[Any], Any], data: Any) -> Any:
        """``decode(data)`` with a lazy hook: its value, or ``_Deferred`` if
        pickles are still to be unpickled."""
        try:
            value = decode(data)
        except _Deferred:  # a pickle where a class is expected
            _pickles_met()
            raise
        except msgspec.ValidationError as e:
            # Stand-ins about: this may be user code (a ``__post_init__``)
            # that saw one; only msgspec's refusal of a pickle is certain.
            if _pickles_met() and not _refused(e):
                raise _Deferred from None
            raise
        except Exception:
            if _pickles_met():
                raise _Deferred from None
            raise
        except BaseException:  # (not a decoding failure: it goes on as it is)
            _pickles_met()
            raise
        if _tls.later:  # (_pickles_met, inline: this runs per call)
            _tls.later = False
            raise _Deferred
        return value


