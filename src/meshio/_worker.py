"""What a worker does once its runtime is up: serve the controller until it
shuts the worker down or its connection is lost, then stop the worker's
actors.  A worker process (:mod:`meshio.worker`) runs it on its own loop;
the in-process transport (:mod:`meshio.testing`) on the test's.

A worker of a proc mesh spawned with ``keep_alive=s`` outlives a lost
controller for ``s`` seconds: its actors keep their state and serve each
other, and a new controller that re-attaches (``this_host().reattach``)
sends it :class:`~._transport._messages.Adopt`, after which it serves that
one as it served the first.  Nobody within ``s`` seconds: it stops as a
worker without ``keep_alive`` does at once.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable

from ._constants import MSGPACK_NIL
from ._exceptions import SupervisionError
from ._transport import _serial
from ._transport._connection import Connection
from ._transport._messages import Adopt, ErrorInfo, Fail, Reply, Restored, Shutdown
from ._transport._runtime import Runtime, register_handler, tell_held
from ._transport._serial import Buffers

__all__ = ("serve",)


class _Keeper:
    """A worker runtime's controller: whom it serves, and whether it has
    lost it (``rt.state(_Keeper)``)."""

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt
        #: seconds to wait for a new controller once this one is lost (None: none)
        self.keep_alive: float | None = None
        #: called once when the controller is lost and the worker waits for another
        self.orphaned: Callable[[], None] | None = None
        #: 0: shut down by the controller; 1: lost it (and nobody re-attached)
        self.done: asyncio.Future[int] = rt.loop.create_future()
        #: while the worker has no controller: the end of its wait for one
        self.expiry: asyncio.TimerHandle | None = None
        #: it serves a controller that re-attached to it (not the one that spawned it)
        self.reattached = False

    def serve(self, controller: str) -> None:
        """Serve the controller at ``controller`` from now on."""
        rt = self.rt
        rt.controller = controller
        rt.on_lost[controller] = self._lost
        rt.connect(controller)

    def loop_held(self, what: str, held: bool) -> None:
        """Tell the controller that meshio's own ``what`` holds (``held``)
        or no longer holds our loop (:data:`_serial.loop_held`): at once,
        before the loop is held.  Only from the loop's thread (one decoding
        a large value holds no loop)."""
        rt = self.rt
        try:
            if asyncio.get_running_loop() is not rt.loop:
                return
        except RuntimeError:
            return
        tell_held(rt, what, held)

    def _finish(self, code: int) -> None:
        if not self.done.done():
            self.done.set_result(code)

    def _lost(self, conn: Connection) -> None:
        if self.keep_alive is None:
            self._finish(1)
            return
        self.rt.on_lost.pop(conn.peer or "", None)
        self.expiry = self.rt.loop.call_later(self.keep_alive, self._finish, 1)
        if self.orphaned is not None:
            self.orphaned()

    def adopt(self, conn: Connection, msg: Adopt) -> None:
        """A new controller re-attaches (on ``conn``, already proven a process of this job)."""
        if self.expiry is None:
            if self.keep_alive is None:
                kind, why = "SupervisionError", "it was not spawned with keep_alive"
            else:
                served = "a controller that re-attached to it" if self.reattached \
                    else "the controller that spawned it"
                kind, why = "ProcMeshTakenError", (
                    f"it serves {served}, at {self.rt.controller}, still connected")
            conn.send_message(Fail(msg.req, ErrorInfo(
                "supervision", kind,
                f"worker {self.rt.worker} (pid {os.getpid()}) cannot be re-attached: {why}")))
            return
        if conn.peer != msg.controller:
            conn.send_message(Fail(msg.req, ErrorInfo(
                "protocol", "ProtocolError",
                f"Adopt names controller {msg.controller}, but came from {conn.peer}")))
            return
        self.expiry.cancel()
        self.expiry = None
        self.reattached = True
        self.rt.routes[msg.controller] = msg.listen  # a redial goes where it listens for us
        self.serve(msg.controller)
        conn.send_message(Reply(msg.req, MSGPACK_NIL))

    def close(self) -> None:
        if self.expiry is not None:
            self.expiry.cancel()


def _on_adopt(rt: Runtime, conn: Connection, msg: Adopt, bufs: Buffers) -> None:
    rt.state(_Keeper).adopt(conn, msg)


register_handler(Adopt, _on_adopt)


def _on_shutdown(rt: Runtime, conn: Connection, msg: Shutdown, bufs: Buffers) -> None:
    """The controller asks this worker to exit (its actors stopped first)."""
    if rt.has_state(_Keeper):
        rt.state(_Keeper)._finish(0)


def _on_restored(rt: Runtime, conn: Connection, msg: Restored, bufs: Buffers) -> None:
    """The controller rebuilt this replacement's actors (``msg.lost``: the
    temporary ones it did not)."""
    rt.incarnation.restoring = False
    rt.incarnation.lost.update(msg.lost)


register_handler(Shutdown, _on_shutdown)
register_handler(Restored, _on_restored)


async def serve(rt: Runtime, controller: str,
                before_close: Callable[[], None] | None = None, *,
                keep_alive: float | None = None,
                orphaned: Callable[[], None] | None = None) -> int:
    """Be a worker on ``rt`` until the controller at ``controller`` shuts
    it down (0) or its connection is lost (1: with ``keep_alive``, once no
    new controller re-attached within that many seconds; ``orphaned`` is
    called when the wait begins); then stop its actors (each
    ``__cleanup__``, in reverse spawn order, each one bounded), call
    ``before_close`` (the last messages out) and close ``rt``."""
    keeper = rt.state(_Keeper)
    keeper.keep_alive = keep_alive
    keeper.orphaned = orphaned
    keeper.serve(controller)
    told, _serial.loop_held = _serial.loop_held, keeper.loop_held
    try:
        code = await keeper.done
    finally:  # (a worker served in the caller's process, meshio.testing's, ends)
        _serial.loop_held = told
    exc = None if code == 0 else SupervisionError(
        f"worker {rt.worker} lost its controller's connection"
        + ("" if keep_alive is None else f" and no controller re-attached within "
           f"{keep_alive:g} s (keep_alive)") + "; its actors are stopped",
        cause="controller connection lost")
    for target, cell in reversed(list(rt.actors.items())):
        del rt.actors[target]
        await cell.stop(exc)
    if before_close is not None:
        before_close()
    rt.close()
    return code
