"""Frames on a meshio connection (little endian)::

    u32 body_len | u32 nbufs | nbufs x u64 (kind << 56 | length) | body | buffers

The header codec, the receive targets allocated for a frame's parts, and a
peek at a message's tag and request id before its body is decoded.

A part of kind ``KIND_ASCII`` is received straight into a new ``str``, whose
bytes are checked as they arrive (:func:`is_ascii`); one that is not ASCII
after all is delivered as ``bytes`` (:func:`text_part`), so no ``str`` ever
holds anything else."""

from __future__ import annotations

import ctypes
import struct
import sys
from typing import Any, Final

from ._pool import owned_view
from ._serial import KIND_ASCII, KIND_BYTES, OutBuffers

_HDR: Final = struct.Struct("<II")
#: ``_HDR.unpack_from``, bound once (see ``meshio._context.enter_scope``)
read_header: Final = _HDR.unpack_from
_LEN_MASK: Final = (1 << 56) - 1
MAX_BUFS: Final = 1 << 16
#: the scratch receive buffer's normal size; frames up to this size are not
#: counted against the receive budget
_SCRATCH: Final = 1 << 18
#: an in-memory connection's first scratch buffer (it doubles as frames need):
#: a 1,024-point in-process mesh opens thousands of connections, and glibc
#: keeps their freed 256 KiB buffers in its heap (below its mmap threshold,
#: raised by earlier frees), so the process grew with each mesh stopped
_MEMORY_SCRATCH: Final = 1 << 12
#: parts (body or buffer) from this size on are received straight into their
#: own object; smaller ones wait in the scratch buffer
_DIRECT: Final = 1 << 16
#: bytes of an oversized message's body read to learn which request it is
_PEEK: Final = 32

_bytes_alloc = ctypes.pythonapi.PyBytes_FromStringAndSize
_bytes_alloc.restype = ctypes.py_object
_bytes_alloc.argtypes = (ctypes.c_void_p, ctypes.c_ssize_t)
_bytearray_alloc = ctypes.pythonapi.PyByteArray_FromStringAndSize
_bytearray_alloc.restype = ctypes.py_object
_bytearray_alloc.argtypes = (ctypes.c_void_p, ctypes.c_ssize_t)
_BYTES_DATA_OFFSET: Final = bytes.__basicsize__ - 1
_str_alloc = ctypes.pythonapi.PyUnicode_New
_str_alloc.restype = ctypes.py_object
_str_alloc.argtypes = (ctypes.c_ssize_t, ctypes.c_uint32)
#: where the characters of a compact ASCII ``str`` start (its header, as in
#: ``sys.getsizeof("")`` less the terminating NUL)
_ASCII_DATA_OFFSET: Final = sys.getsizeof("") - 1


def _allocate(kind: int, n: int) -> tuple[Any, memoryview]:
    """A receive target of ``n`` bytes (``n > 0``) and a writable view of
    it.  Its memory is not touched (not zeroed), so it is committed only as
    data arrives.  A ``str`` target (``KIND_ASCII``) must not be used before
    every byte written into it passed :func:`is_ascii`."""
    if kind == KIND_ASCII:
        # A new str filled in place (its bytes checked as they arrive): text
        # received without a decoding pass over it.
        s = _str_alloc(n, 127)
        return s, owned_view(id(s) + _ASCII_DATA_OFFSET, n, s)
    if kind == KIND_BYTES:
        # A bytes object filled in place: zero-copy receive of ``bytes``.
        b = _bytes_alloc(None, n)
        array = (ctypes.c_char * n).from_address(id(b) + _BYTES_DATA_OFFSET)
        return b, memoryview(array).cast("B")
    target = _bytearray_alloc(None, n)
    return target, memoryview(target)


def is_ascii(view: memoryview) -> bool:
    """Whether ``view`` holds only ASCII bytes."""
    return view.tobytes().isascii()


def text_part(view: memoryview) -> str | bytes:
    """A ``KIND_ASCII`` part received whole in the scratch buffer: a ``str``,
    or ``bytes`` where it is not ASCII."""
    data = view.tobytes()
    return data.decode("ascii") if data.isascii() else data


def _peek(prefix: bytes) -> tuple[int, int] | None:
    """``(tag, first field)`` of a message body from its first bytes: an
    array whose first two items are unsigned ints (``[tag, req, ...]``)."""
    if not prefix:
        return None
    first = prefix[0]
    pos = 1 if 0x90 <= first <= 0x9F else {0xDC: 3, 0xDD: 5}.get(first)
    if pos is None:
        return None
    items: list[int] = []
    for _ in range(2):
        if pos >= len(prefix):
            return None
        b = prefix[pos]
        if b <= 0x7F:
            items.append(b)
            pos += 1
        elif 0xCC <= b <= 0xCF:
            n = 1 << (b - 0xCC)
            if pos + 1 + n > len(prefix):
                return None
            items.append(int.from_bytes(prefix[pos + 1:pos + 1 + n], "big"))
            pos += 1 + n
        else:
            return None
    return items[0], items[1]


def frame_header(body_len: int, out: OutBuffers) -> bytes:
    if not out:
        return _HDR.pack(body_len, 0)
    lens = [(kind << 56) | memoryview(buf).nbytes for buf, kind in out]
    return _HDR.pack(body_len, len(out)) + struct.pack(f"<{len(out)}Q", *lens)
