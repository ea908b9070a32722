"""The memory an RDMA transfer touches in this process: a buffer-like object
or a CPU tensor turned into a contiguous byte range (address, size) and the
object that keeps that memory alive, with clear errors for what cannot be
used.

What is kept is the memory, not the object it came from: a tensor's storage
(not the tensor, whose ``.data =`` or ``set_()`` gives it other storage and
would free the registered one), a buffer's export (a ``memoryview``, which
also refuses to resize a ``bytearray`` or a NumPy array while it lives).  A
tensor grown past its storage by ``resize_()`` moves to new memory all the
same: torch offers no way to lock a storage's size.  :meth:`Memory.moved`
tells, where the owner's code serves a transfer (``tcp``)."""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeAlias

from .._exceptions import RDMAError, RDMASizeError
from .._transport._bulk import address_of

if TYPE_CHECKING:
    import torch
    from typing_extensions import Buffer

#: a field's name in a buffer's format (``T{<d:x:O:y:}``), which may hold
#: any letter: not a type code
_FIELD_NAME = re.compile(r":[^:]*:")

#: memory an ``RDMABuffer`` registers or copies to or from: an object with the
#: buffer protocol (``bytearray``, ``memoryview``, numpy array...) or a CPU tensor
BufferLike: TypeAlias = "Buffer | torch.Tensor"


@dataclass(frozen=True)
class Memory:
    """A contiguous byte range in this process, and what keeps it alive."""

    keep: Any  # a tensor's storage, or a buffer's memoryview
    addr: int
    size: int
    writable: bool

    def moved(self) -> bool:
        """Whether the range is no longer inside the memory kept: a tensor
        grown by ``resize_()`` past its storage (torch moved the storage to
        new memory and freed this range) or its storage resized smaller.  A
        buffer's export never moves."""
        if isinstance(self.keep, memoryview):
            return False
        start: int = self.keep.data_ptr()
        return not start <= self.addr <= self.addr + self.size <= start + self.keep.nbytes()


def memory_of(obj: Any, what: str, *, writable: bool, empty: bool = False) -> Memory:
    """The bytes behind a tensor or buffer object, with clear errors; an
    empty one is refused unless ``empty`` (a read of 0 bytes lands
    nowhere): then it is 0 bytes at address 0, whatever its layout."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(obj, torch.Tensor):
        if obj.device.type == "meta":
            raise RDMAError(f"{what}: a meta tensor has no data, so no memory to register or "
                            "copy; use a tensor on the CPU")
        if obj.device.type != "cpu":
            raise RDMAError(
                f"{what}: a tensor on {obj.device}; meshio RDMA reaches host (CPU) memory "
                "only: registering GPU or other device memory (GPUDirect RDMA through "
                "nvidia-peermem or dma-buf) is not implemented in this version, whatever "
                "the hardware. Copy it to a CPU tensor first: t.cpu(), or cpu.copy_(t) into a "
                "tensor made with pin_memory=True (faster copies)")
        if empty and obj.numel() == 0:
            return Memory(obj, 0, 0, True)
        if obj.layout != torch.strided:
            raise RDMAError(f"{what}: the tensor's layout is {obj.layout} (sparse), not one "
                            "range of bytes; call .to_dense() first")
        if obj.is_conj():
            raise RDMAError(f"{what}: the tensor has a lazy conjugate bit (a .conj() view of a "
                            "complex tensor: its bytes are not its values); call "
                            ".resolve_conj() first")
        if obj.is_neg():
            raise RDMAError(f"{what}: the tensor has a lazy negative bit (a view such as "
                            ".conj().imag: its bytes are not its values); call .resolve_neg() "
                            "first")
        if not obj.is_contiguous():
            raise RDMASizeError(f"{what}: the tensor is not contiguous; call .contiguous() first")
        size = obj.numel() * obj.element_size()
        if size == 0:
            raise RDMASizeError(f"{what}: the tensor is empty")
        return Memory(obj.untyped_storage(), obj.data_ptr(), size, True)
    try:
        view = memoryview(obj)
    except TypeError:
        raise TypeError(f"{what}: expected a CPU torch.Tensor, bytearray, memoryview or "
                        f"another buffer object, got {type(obj).__name__}") from None
    if empty and view.nbytes == 0:
        return Memory(obj, 0, 0, True)
    if not view.c_contiguous:
        raise RDMASizeError(f"{what}: the buffer is not contiguous")
    if "O" in _FIELD_NAME.sub("", view.format):  # (another process writing them crashes this one)
        raise RDMAError(f"{what}: the buffer holds Python objects (format {view.format!r}: a "
                        "NumPy dtype=object array?), whose bytes are pointers to them; use a "
                        "numeric dtype")
    if view.nbytes == 0:
        raise RDMASizeError(f"{what}: the buffer is empty")
    if writable and view.readonly:
        raise RDMAError(f"{what}: the buffer is read-only ({type(obj).__name__}); use a "
                        "bytearray, a writable memoryview or a tensor")
    return Memory(view, address_of(view, writable=writable), view.nbytes, not view.readonly)
