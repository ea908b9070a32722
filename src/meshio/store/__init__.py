"""A versioned weight store: ``WeightStore`` (publish a state dict, read
whole versions from any process, never a mix of two)."""

from .._util import fixup_module_metadata as _fixup_module_metadata
from ._store import WeightStore as WeightStore

__all__ = ("WeightStore",)

_fixup_module_metadata(__name__, globals())
