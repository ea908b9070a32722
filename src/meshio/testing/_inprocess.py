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
``os.environ`` (meshio's per-worker variables, ``CUDA_VISIBLE_DEVICES``
included, are not applied), no output forwarding, and SIGKILL "kills" a
worker by cancelling its tasks and dropping its connections (its calls in
flight fail and its exit status reads -9, as a process's; SIGSTOP does
nothing; a supervisor restarts it).  ``spawn_procs`` refuses what only
processes honour (``env=``, ``bootstrap=``).  Test other process faults
(heartbeats) and RDMA on the ``"processes"`` transport.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from typing import Literal

from .._extent import Region
from .._launcher import WorkerSpec
from .._proc_mesh import HostMesh
from .._transport._credentials import Credentials
from .._transport._roles import Incarnation
from .._transport._runtime import Runtime
from .._transport._tasks import TaskOwner
from .._worker import serve

log = logging.getLogger("meshio")

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
        self._signal: int | None = None
        # Served in a copy of the runtime's own context (its actors see it as
        # runtime()), by a task of this worker's: serve's own rt.close() at
        # its end cancels the runtime's tasks, which would lose its status.
        self._tasks = TaskOwner(f"in-process worker {rt.worker}")
        self._task: asyncio.Task[int] = self._tasks.start(serve(rt, controller),
                                                          context=rt.context.copy())
        self._exit: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._task.add_done_callback(self._ended)

    def _ended(self, task: asyncio.Task[int]) -> None:
        """Its "process" exited: killed by the signal sent (-sig), or with
        serve's status; 1 where serve failed, whose traceback is logged as a
        worker process prints its own.  (Cancelled unsignalled, only as the
        loop ends: as if killed.)"""
        if self._signal is not None or task.cancelled():
            code = -(self._signal or signal.SIGKILL)
        elif (exc := task.exception()) is not None:
            log.error("meshio: in-process worker %s failed", self._rt.worker, exc_info=exc)
            code = 1
        else:
            code = task.result()
        self._exit.set_result(code)

    @property
    def returncode(self) -> int | None:
        return self._exit.result() if self._exit.done() else None

    async def wait(self) -> int:
        # (shielded: a waiter cancelled leaves the exit status to the others)
        return await asyncio.shield(self._exit)

    def send_signal(self, sig: int) -> None:
        """A signal that ends a process ends the worker as the death of its
        process would: its connections drop and its tasks, actors' included,
        are cancelled (no ``__cleanup__`` runs); :meth:`wait` then returns
        ``-sig``.  Those a worker process ignores (SIGINT, SIGTERM: its
        controller stops it) or that stop no process do nothing, as does
        any once it is ending."""
        if self._task.done() or self._signal is not None or sig in _NOT_ENDING:
            return
        self._signal = sig
        self._task.cancel()
        self._rt.close()


#: signals after which a worker process lives on (:mod:`meshio.worker`
#: ignores SIGINT and SIGTERM)
_NOT_ENDING = frozenset({0, signal.SIGINT, signal.SIGTERM, signal.SIGSTOP, signal.SIGCONT,
                         signal.SIGCHLD, signal.SIGWINCH, signal.SIGURG})


#: why ``reattach`` finds nothing to re-attach to on the in-process transport
_NO_REATTACH = ("the in-process transport keeps no proc mesh alive for another controller "
                "(test reattach on the 'processes' transport)")


class InProcessLauncher:
    """Starts workers as runtimes on the running event loop (a
    :class:`~meshio._launcher.ProcLauncher`)."""

    in_process = True

    def __init__(self) -> None:
        self.host: str = os.uname().nodename

    def reach(self, secret: bytes) -> tuple[Credentials, str]:
        raise ValueError(_NO_REATTACH)

    async def adopt(self, spec: WorkerSpec, pid: int) -> InProcessWorker:
        raise ValueError(_NO_REATTACH)

    async def launch(self, spec: WorkerSpec) -> InProcessWorker:
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
