"""The in-process transport: proc meshes whose "processes" are runtimes on
the caller's own event loop (httpx's ``MockTransport`` is the model).

:func:`in_process_host` is a :class:`~meshio.HostMesh` like
:func:`~meshio.this_host`, but ``spawn_procs`` starts no process: each
worker is a :class:`~meshio._transport._runtime.Runtime` of this process,
served by :func:`meshio._worker.serve` on the running loop, reached over
in-memory connections (:mod:`meshio._transport._memory`).  Everything a
message goes through between processes happens here too — frames, schema
validation, pickling, ordering, ports, errors, adverbs — so tests of those
run in milliseconds, with no process to start or leak.

What it cannot be is separate processes: one pid, one ``sys.modules``, one
``os.environ`` (the per-worker environment, ``CUDA_VISIBLE_DEVICES``
included, is not applied), no output forwarding, and a signal "kills" a
worker by dropping its connections.  Test process faults, supervision,
heartbeats and RDMA on the ``"processes"`` transport.
"""

from __future__ import annotations

import asyncio
import os
import signal
from typing import Literal

from .._extent import Region
from .._launcher import WorkerSpec
from .._proc_mesh import HostMesh
from .._transport._credentials import Credentials
from .._transport._roles import Incarnation
from .._transport._runtime import Runtime
from .._worker import serve

__all__ = ("TRANSPORTS", "InProcessLauncher", "InProcessWorker", "Transport", "in_process_host")

#: what a proc mesh runs on: worker processes on this host, or runtimes on
#: the running loop of this process
Transport = Literal["processes", "in-process"]
TRANSPORTS: tuple[Transport, ...] = ("processes", "in-process")


class InProcessWorker:
    """A worker of the in-process transport: its runtime and the task serving it."""

    def __init__(self, rt: Runtime, controller: str) -> None:
        self.pid: int = os.getpid()
        self.host: str = rt.host
        self.start_failure: str | None = None
        self.downed: str | None = None  # nothing is between it and its controller
        self._rt = rt
        # served in the runtime's own context: its actors see it as runtime()
        self._task: asyncio.Task[int] = rt.context.run(rt.tasks.start, serve(rt, controller))
        self._signal: int | None = None

    @property
    def returncode(self) -> int | None:
        if self._signal is not None:
            return -self._signal
        return self._task.result() if self._task.done() else None

    async def wait(self) -> int:
        code = await asyncio.shield(self._task)
        return -self._signal if self._signal is not None else code

    def send_signal(self, sig: int) -> None:
        """A signal that ends a process (SIGKILL, SIGTERM, ...) drops the
        worker's connections, as the death of its process would; its actors
        are then stopped as after a lost controller.  Others do nothing."""
        if self._task.done() or sig in (signal.SIGCONT, signal.SIGSTOP, 0):
            return
        if self._signal is None:
            self._signal = sig
        self._rt.close()


#: why ``reattach`` finds nothing to re-attach to on the in-process transport
_NO_REATTACH = ("the in-process transport keeps no proc mesh alive for another controller "
                "(test reattach on the 'processes' transport)")


class InProcessLauncher:
    """Starts workers as runtimes on the running event loop (a
    :class:`~meshio._launcher.ProcLauncher`)."""

    def __init__(self) -> None:
        self.host: str = os.uname().nodename

    def reach(self, secret: bytes) -> tuple[Credentials, str]:
        raise ValueError(_NO_REATTACH)

    async def adopt(self, spec: WorkerSpec, pid: int) -> InProcessWorker:
        raise ValueError(_NO_REATTACH)

    async def launch(self, spec: WorkerSpec) -> InProcessWorker:
        if spec.bootstrap:
            raise ValueError("spawn_procs(bootstrap=...) runs in a new process; the in-process "
                             "transport starts none (test it on the 'processes' transport)")
        rt = Runtime(asyncio.get_running_loop(), addr=spec.listen, worker=spec.worker,
                     secret=spec.secret, in_process=True, name=spec.addr or None)
        rt.incarnation = Incarnation(restart=spec.restart, worker=spec.worker)
        return InProcessWorker(rt, spec.controller)


def in_process_host() -> HostMesh:
    """This host, for the in-process transport: ``spawn_procs`` on it runs
    the workers on the running event loop of this process (no processes;
    see :mod:`meshio.testing`).  For tests; the ``meshio_procs`` fixture
    uses it where ``meshio_transport`` is ``"in-process"``."""
    return HostMesh([InProcessLauncher()], Region.full((), ()))
