"""One-sided RDMA buffers: ``RDMABuffer``, backends ``same_host``,
``ibverbs`` and ``tcp``."""

from .._exceptions import RDMAError as RDMAError
from .._exceptions import RDMAFallbackWarning as RDMAFallbackWarning
from .._exceptions import RDMASizeError as RDMASizeError
from .._util import fixup_module_metadata as _fixup_module_metadata
from ._buffer import RDMABuffer as RDMABuffer
from ._buffer import available_backends as available_backends
from ._buffer import backend_for as backend_for
from ._registry import BACKENDS as BACKENDS
from ._registry import Backend as Backend
from ._registry import Handle as Handle

__all__ = (
    "BACKENDS",
    "Backend",
    "Handle",
    "RDMABuffer",
    "RDMAError",
    "RDMAFallbackWarning",
    "RDMASizeError",
    "available_backends",
    "backend_for",
)

_fixup_module_metadata(__name__, globals())
