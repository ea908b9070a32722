"""The runtime underneath (issue 18): the runtime reaches its peers through
one backend interface (its sockets; memory for the in-process transport),
the transport's dispatch handles only
the transport's own messages (the layers above register handlers for
theirs), and a runtime's state by role is an object of its own: ``watch``
(the workers it started) and ``incarnation`` (a worker's restart)."""

from __future__ import annotations

import ast
import inspect

import meshio._transport._runtime as runtime_module
from meshio._transport._memory import MemoryBackend
from meshio._transport._messages import SpawnActor, StopActor
from meshio._transport._roles import Incarnation
from meshio._transport._runtime import Runtime
from meshio._transport._sockets import Backend, SocketBackend

#: what the transport itself does: deliver calls (direct, numbered, through
#: the tree) and their flow control, name peers, carry ports, heartbeats,
#: faults, and which peers are down or moved
TRANSPORT = {"Call", "Calls", "Cancel", "Credit", "Fanout", "Fault", "Hello", "Moved", "PeerDown",
             "PeerUp", "Ping", "Pong", "PortSend", "Started"}


def test_the_dispatch_handles_only_transport_messages() -> None:
    tree = ast.parse(inspect.getsource(runtime_module))
    (dispatch,) = [f for c in ast.walk(tree) if isinstance(c, ast.ClassDef) and c.name == "Runtime"
                   for f in c.body if isinstance(f, ast.FunctionDef) and f.name == "dispatch"]
    cases = {ast.unparse(case.pattern.cls) for node in ast.walk(dispatch)
             if isinstance(node, ast.Match) for case in node.cases
             if isinstance(case.pattern, ast.MatchClass)}
    assert cases == TRANSPORT
    # the actor layer's messages are its handlers' (registered on import of meshio)
    assert {StopActor, SpawnActor} <= set(Runtime.handlers)


def test_an_incarnation_says_why_an_actor_is_missing() -> None:
    first = Incarnation()
    assert not first.replacement and first.missing("procs/w") is None
    again = Incarnation(restart=True)
    assert again.replacement and again.missing("procs/w") == "is being rebuilt after a restart"
    again.restoring = False
    again.lost.add("procs/t")
    assert again.missing("procs/w") is None
    assert again.missing("procs/t") == "was temporary and not rebuilt after a restart"


def test_sockets_and_memory_are_one_backend_interface() -> None:
    wanted = {name for name in vars(Backend) if not name.startswith("_")}
    assert wanted == {"dial", "dialled", "close"}
    for backend in (SocketBackend, MemoryBackend):
        assert all(callable(getattr(backend, name)) for name in wanted), backend
    # the runtime itself neither listens nor dials: its backends do
    assert not [name for name in vars(Runtime)
                if name.lstrip("_").startswith(("listen", "dial", "serve", "connect_"))]
