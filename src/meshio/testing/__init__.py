"""Helpers for testing meshio programs (leak checks, waiting on exits).

meshio's pytest plugin (``meshio.testing._plugin``, loaded by pytest through
its ``pytest11`` entry point) gives the fixtures ``meshio_procs``,
``meshio_transport``, ``meshio_runtime_cleanup`` and ``meshio_leak_check``.
"""

from .._util import fixup_module_metadata as _fixup_module_metadata
from ._helpers import child_pids as child_pids
from ._helpers import wait_exited as wait_exited
from ._leaks import open_fds as open_fds

__all__ = ("child_pids", "open_fds", "wait_exited")

_fixup_module_metadata(__name__, globals())
