"""Testing meshio programs: the in-process transport, leak checks, waiting
on exits.

``in_process_host()`` is a host whose ``spawn_procs`` runs workers on the
running event loop, with no processes (same frames, schemas, errors,
ordering, ports and adverbs as between processes); ``TRANSPORTS`` names the
transports, ``"processes"`` and ``"in-process"``.  meshio's pytest plugin
(``meshio.testing._plugin``, loaded by pytest through its ``pytest11`` entry
point) gives the fixtures ``meshio_procs``, ``meshio_host``,
``meshio_transport``, ``meshio_runtime_cleanup`` and ``meshio_leak_check``.
"""

from .._util import fixup_module_metadata as _fixup_module_metadata
from ._helpers import WorkerProcess as WorkerProcess
from ._helpers import actor_target as actor_target
from ._helpers import child_pids as child_pids
from ._helpers import cut_connection as cut_connection
from ._helpers import forged_mesh as forged_mesh
from ._helpers import job_record as job_record
from ._helpers import proc_mesh as proc_mesh
from ._helpers import process_address as process_address
from ._helpers import wait_exited as wait_exited
from ._helpers import worker_processes as worker_processes
from ._inprocess import TRANSPORTS as TRANSPORTS
from ._inprocess import Transport as Transport
from ._inprocess import in_process_host as in_process_host
from ._leaks import open_fds as open_fds

__all__ = ("TRANSPORTS", "Transport", "WorkerProcess", "actor_target", "child_pids",
           "cut_connection", "forged_mesh", "in_process_host", "job_record", "open_fds",
           "proc_mesh", "process_address", "wait_exited", "worker_processes")

_fixup_module_metadata(__name__, globals())
