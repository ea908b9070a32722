"""Endpoints and their adverbs (``call``, ``call_one``, ``choose``, ``stream``, ``broadcast``)."""

from .._util import fixup_module_metadata as _fixup_module_metadata
from ._endpoint import Endpoint as Endpoint
from ._endpoint import EndpointDescriptor as EndpointDescriptor
from ._endpoint import endpoint as endpoint
from ._retry import Retry as Retry

__all__ = ("Endpoint", "EndpointDescriptor", "Retry", "endpoint")

_fixup_module_metadata(__name__, globals())
