"""Jobs: hosts from a scheduler as named host meshes, and the host agent.

``LocalJob`` (this host), ``ProcessJob`` (agents as local processes),
``SlurmJob`` and ``KubernetesJob`` share one protocol (:class:`Job`):
``apply()``, ``state()`` (a :class:`JobState`: ``state.trainers`` is a
:class:`~meshio.HostMesh`), ``kill()``.  ``meshio.attach`` reaches agents
started any other way.
"""

from .._transport._tls import TLSConfig as TLSConfig
from .._util import fixup_module_metadata as _fixup_module_metadata
from ._job import ClusterError as ClusterError
from ._job import Job as Job
from ._job import JobCacheError as JobCacheError
from ._job import JobState as JobState
from ._job import LocalJob as LocalJob
from ._job import ProcessJob as ProcessJob
from ._kubernetes import ClusterNotConfiguredError as ClusterNotConfiguredError
from ._kubernetes import KubernetesJob as KubernetesJob
from ._remote import attach as attach
from ._slurm import SlurmError as SlurmError
from ._slurm import SlurmJob as SlurmJob

__all__ = ("ClusterError", "ClusterNotConfiguredError", "Job", "JobCacheError", "JobState",
           "KubernetesJob", "LocalJob", "ProcessJob", "SlurmError", "SlurmJob", "TLSConfig",
           "attach")

_fixup_module_metadata(__name__, globals())
