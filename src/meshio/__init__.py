"""meshio: many processes, GPUs and hosts driven as one program from a
single asyncio controller.

The public sub-packages (``meshio.endpoints``, ``meshio.rdma``,
``meshio.supervision``, ``meshio.testing``) are usable after ``import meshio``.
"""

__version__ = "0.1.0"  #: (the package's version: pyproject.toml reads it here)

from . import endpoints as endpoints
from . import jobs as jobs
from . import rdma as rdma
from . import store as store
from . import supervision as supervision
from . import testing as testing
from ._actor import Actor as Actor
from ._actor import context as context
from ._actor import current_rank as current_rank
from ._actor_mesh import ActorMesh as ActorMesh
from ._context import Context as Context
from ._context import ProcInfo as ProcInfo
from ._dashboard import DashboardServer as DashboardServer
from ._dashboard import serve_dashboard as serve_dashboard
from ._doctor import DoctorCheck as DoctorCheck
from ._doctor import doctor as doctor
from ._exceptions import ActorError as ActorError
from ._exceptions import AuthenticationError as AuthenticationError
from ._exceptions import CallTimeout as CallTimeout
from ._exceptions import ClosedResourceError as ClosedResourceError
from ._exceptions import DeadlockError as DeadlockError
from ._exceptions import MeshioError as MeshioError
from ._exceptions import MeshShapeError as MeshShapeError
from ._exceptions import NotInActorError as NotInActorError
from ._exceptions import Overloaded as Overloaded
from ._exceptions import PoisonMessageError as PoisonMessageError
from ._exceptions import ProcessStartError as ProcessStartError
from ._exceptions import ProcMeshTakenError as ProcMeshTakenError
from ._exceptions import ProtocolError as ProtocolError
from ._exceptions import RDMAError as RDMAError
from ._exceptions import RDMAFallbackWarning as RDMAFallbackWarning
from ._exceptions import RDMASizeError as RDMASizeError
from ._exceptions import SchemaError as SchemaError
from ._exceptions import SupervisionError as SupervisionError
from ._exceptions import UnknownActorError as UnknownActorError
from ._exceptions import UnknownEndpointError as UnknownEndpointError
from ._exceptions import UnknownProcMeshError as UnknownProcMeshError
from ._exceptions import WrongLoopError as WrongLoopError
from ._extent import Extent as Extent
from ._extent import Point as Point
from ._metrics import ActorStats as ActorStats
from ._metrics import EndpointStats as EndpointStats
from ._metrics import ProcessStats as ProcessStats
from ._metrics import ProcMeshStats as ProcMeshStats
from ._metrics import Stats as Stats
from ._metrics import stats as stats
from ._monitor import ActorDown as ActorDown
from ._monitor import Monitor as Monitor
from ._monitor import monitor as monitor
from ._port import Channel as Channel
from ._port import Port as Port
from ._port import PortReceiver as PortReceiver
from ._proc_mesh import HostMesh as HostMesh
from ._proc_mesh import ProcMesh as ProcMesh
from ._proc_mesh import this_host as this_host
from ._prometheus import MetricsServer as MetricsServer
from ._prometheus import serve_metrics as serve_metrics
from ._run import run as run
from ._service import ReplicaStats as ReplicaStats
from ._service import Service as Service
from ._stacks import ActorStacks as ActorStacks
from ._stacks import StackFrame as StackFrame
from ._stacks import Stacks as Stacks
from ._stacks import TaskStack as TaskStack
from ._torch_dist import setup_torch_distributed as setup_torch_distributed
from ._transport._serial import set_limits as set_limits
from ._transport._tls import TLSConfig as TLSConfig
from ._util import fixup_module_metadata as _fixup_module_metadata
from ._value_mesh import ValueMesh as ValueMesh
from .endpoints._endpoint import Endpoint as Endpoint
from .endpoints._endpoint import EndpointDescriptor as EndpointDescriptor
from .endpoints._endpoint import endpoint as endpoint
from .endpoints._retry import Retry as Retry
from .jobs._remote import attach as attach
from .rdma._buffer import RDMABuffer as RDMABuffer
from .supervision._events import SupervisionEvent as SupervisionEvent
from .supervision._supervisor import Supervisor as Supervisor

__all__ = (
    "Actor",
    "ActorDown",
    "ActorError",
    "ActorMesh",
    "ActorStacks",
    "ActorStats",
    "AuthenticationError",
    "CallTimeout",
    "Channel",
    "ClosedResourceError",
    "Context",
    "DashboardServer",
    "DeadlockError",
    "DoctorCheck",
    "Endpoint",
    "EndpointDescriptor",
    "EndpointStats",
    "Extent",
    "HostMesh",
    "MeshShapeError",
    "MeshioError",
    "MetricsServer",
    "Monitor",
    "NotInActorError",
    "Overloaded",
    "Point",
    "PoisonMessageError",
    "Port",
    "PortReceiver",
    "ProcInfo",
    "ProcMesh",
    "ProcMeshStats",
    "ProcMeshTakenError",
    "ProcessStartError",
    "ProcessStats",
    "ProtocolError",
    "RDMABuffer",
    "RDMAError",
    "RDMAFallbackWarning",
    "RDMASizeError",
    "ReplicaStats",
    "Retry",
    "SchemaError",
    "Service",
    "StackFrame",
    "Stacks",
    "Stats",
    "SupervisionError",
    "SupervisionEvent",
    "Supervisor",
    "TaskStack",
    "TLSConfig",
    "UnknownActorError",
    "UnknownProcMeshError",
    "UnknownEndpointError",
    "ValueMesh",
    "WrongLoopError",
    "attach",
    "context",
    "current_rank",
    "doctor",
    "endpoint",
    "monitor",
    "run",
    "serve_dashboard",
    "serve_metrics",
    "set_limits",
    "setup_torch_distributed",
    "stats",
    "this_host",
)

_fixup_module_metadata(__name__, globals())
