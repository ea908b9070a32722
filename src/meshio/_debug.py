"""Debugging actors from the controller: ``breakpoint()`` in an endpoint,
``meshio debug`` to drive it.

In a worker, ``breakpoint()`` and ``pdb.set_trace()`` (:func:`install`
points ``sys.breakpointhook`` and ``pdb.set_trace`` here) start a pdb
session whose terminal is the controller's: the paused code waits where it
is (the actor's thread for a ``def`` endpoint, the worker's loop thread for
an ``async`` one), and pdb reads and writes through the process's *debug
link* (:class:`DebugLink`), a thread of its own with its own event loop and
connection to the controller.  So a session talks, and the process answers
heartbeats (the controller pings a paused process through its link too),
even while an ``async`` endpoint holds the worker's loop; a paused actor is
not "hung".  Its other actors go on unless that loop is held.

The controller (:class:`Debugger`) announces each pause once on its stderr
(actor, rank, host, file:line), keeps the paused sessions in the order they
paused, and serves ``meshio debug`` clients on its inspection listener
(:mod:`meshio._inspect`): ``list``, ``attach <actor> <rank>`` (the pdb
session's output and prompt reach that client only; the others' wait, so
sessions are queued, never interleaved; ``attach <actor>``: its only
paused rank), ``detach``, ``continue all``.
A client that attaches to a session another one left (by ``detach``, or
by dying: a lost client's session is free again) is shown where pdb
stands and its prompt again, as at a fresh attach (``"open"`` to the
session's link).  The client (:func:`debug_client`) is a plain terminal:
it shows what the controller sends and sends back the lines typed.  When
the controller's own stdin is a terminal (or ``MESHIO_DEBUG_TERMINAL=1``;
``0`` turns it off), the first pause opens that client on it, in the
controller's process: the user debugs where the program runs (each pause
announced there once), and once no actor is paused any more the terminal
is the program's again.
"""

from __future__ import annotations

import asyncio
import dis
import inspect
import itertools
import os
import pdb
import queue
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from types import FrameType
from typing import IO, Any, cast

from ._context import CallScope, Context, _context, _scope
from ._inspect import Controller, Inspection
from ._launcher import say
from ._transport._connection import Connection
from ._transport._messages import DebugIO, DebugIOKind, DebugPaused
from ._transport._runtime import Runtime, register_handler
from ._transport._serial import Buffers
from ._transport._tls import TLSConfig

__all__ = ("DebugLink", "Debugger", "breakpoint_hook", "debug_client", "debug_link", "install",
           "set_trace")

#: the prompt of ``meshio debug`` between pdb sessions
PROMPT = "(meshio debug) "
#: ``1``: the controller's own terminal debugs its paused actors even when
#: its stdin is not a terminal; ``0``: never (``meshio debug`` only)
TERMINAL_ENV = "MESHIO_DEBUG_TERMINAL"
#: modules pdb's ``step``/``next`` do not stop in (meshio's and the loop's own)
_SKIP = ("meshio", "meshio.*", "asyncio", "asyncio.*", "uvloop", "uvloop.*", "selectors",
         "concurrent.*", "threading", "contextvars", "queue", "pdb", "bdb")
_HELP = """\
commands:
  list                   the paused actors, oldest first
  attach <actor> <rank>  run the pdb session of that actor's rank (waits for it
                         to pause if it has not yet); then pdb's commands
                         (p, n, s, bt, c, ...) and detach
  attach <actor>         the same, for its paused rank (when only one is)
  attach                 the same, for the oldest paused actor
  detach                 in a pdb session: back here, the actor staying paused;
                         while waiting for an actor to pause: stop waiting
  continue all           continue every paused actor
  quit                   leave meshio debug (the actors stay paused)
"""
#: code flags of the frames whose return event may be a suspension
_SUSPENDS = inspect.CO_GENERATOR | inspect.CO_COROUTINE | inspect.CO_ASYNC_GENERATOR
_YIELD_VALUE, _RESUME = dis.opmap["YIELD_VALUE"], dis.opmap["RESUME"]


# ------------------------------------------------------------------ worker

class DebugLink:
    """A worker's connection to its controller for pdb sessions: a daemon
    thread running an event loop and a :class:`Runtime` of its own (the
    job's secret and TLS), so that a session paused on the worker's loop
    thread still reaches the controller, and the process still answers the
    pings the controller sends it there.  Made on the first breakpoint."""

    def __init__(self, controller: str, addr: str, secret: bytes, tls: TLSConfig | None) -> None:
        self.controller = controller
        self.addr = addr
        self.loop = asyncio.new_event_loop()
        self.numbers = itertools.count(1)
        #: sessions waiting for input, by number: their lines ("" once the
        #: controller is gone: pdb reads end of file and quits; None: a client
        #: attached again, pdb shows it where it stands and its prompt)
        self.inputs: dict[int, queue.SimpleQueue[str | None]] = {}
        self.lost = False
        self.rt = Runtime(self.loop, secret=secret, tls=tls)
        self.rt.on_lost[controller] = lambda conn: self._lost()
        threading.Thread(target=self.loop.run_forever, name="meshio debug link",
                         daemon=True).start()

    def open(self) -> tuple[int, queue.SimpleQueue[str | None]]:
        """A new session: its number and where its input lines arrive."""
        number = next(self.numbers)
        lines = self.inputs[number] = queue.SimpleQueue()
        if self.lost:
            lines.put("")
        return number, lines

    def close(self, number: int, how: str) -> None:
        """Session ``number`` is over: ``how`` ("continued", "quit")."""
        self.inputs.pop(number, None)
        self.send(DebugIO(number, "end", how))

    def send(self, msg: DebugPaused | DebugIO) -> None:
        """Send ``msg`` to the controller (from any thread)."""
        def send() -> None:
            self.rt.connect(self.controller).send_message(msg)
        self.loop.call_soon_threadsafe(send)

    def got(self, msg: DebugIO) -> None:
        lines = self.inputs.get(msg.session)
        if lines is not None and msg.kind == "input":
            lines.put(msg.text + "\n")
        elif lines is not None and msg.kind == "open":
            lines.put(None)

    def _lost(self) -> None:
        self.lost = True
        for lines in list(self.inputs.values()):
            lines.put("")


#: this worker's runtime and its controller's address (set by :func:`install`)
_worker: tuple[Runtime, str] | None = None
#: its debug link, once made
_link: DebugLink | None = None
_link_lock = threading.Lock()


def install(rt: Runtime, controller: str) -> None:
    """Make ``breakpoint()`` and ``pdb.set_trace()`` in this worker's
    actors pause them for ``meshio debug`` (not when ``PYTHONBREAKPOINT=0``
    turned breakpoints off)."""
    global _worker
    if os.environ.get("PYTHONBREAKPOINT") == "0":
        return
    _worker = (rt, controller)
    sys.breakpointhook = breakpoint_hook
    pdb.set_trace = set_trace


def _the_link() -> DebugLink | None:
    global _link
    with _link_lock:
        if _link is None and _worker is not None:
            rt, controller = _worker
            _link = DebugLink(controller, rt.addr, rt.secret, rt.tcp.tls)
        return _link


def breakpoint_hook(*args: Any, **kwargs: Any) -> None:
    """``sys.breakpointhook`` of a worker: pause the calling actor for
    ``meshio debug`` (outside an actor: plain pdb)."""
    _pause(sys._getframe(1))


def set_trace(*, header: str | None = None) -> None:
    """``pdb.set_trace`` of a worker: as :func:`breakpoint_hook`."""
    _pause(sys._getframe(1), header)


def _pause(frame: FrameType, header: str | None = None) -> None:
    ctx = _context.get(None)
    link = _the_link() if ctx is not None else None
    debugger = pdb.Pdb() if link is None or ctx is None else _RemotePdb(link, ctx)
    if _worker is not None and _on_loop(_worker[0]):  # paused on the loop: what it
        for conn in list(_worker[0].all_conns):        # batched goes now, not after
            conn.write_batched()
    if header is not None:
        debugger.message(header)
    debugger.set_trace(frame)


def _on_loop(rt: Runtime) -> bool:
    """Whether this thread runs ``rt``'s loop (not an actor's thread)."""
    try:
        return asyncio.get_running_loop() is rt.loop
    except RuntimeError:
        return False


class _Terminal:
    """A pdb session's stdin and stdout, over the debug link."""

    def __init__(self, link: DebugLink, again: Callable[[], None]) -> None:
        self.link = link
        #: writes where pdb stands and its prompt (for a client attached again)
        self.again = again
        self.session = 0
        self.lines: queue.SimpleQueue[str | None] = queue.SimpleQueue()
        self.out: list[str] = []

    def write(self, text: str) -> int:
        self.out.append(text)
        return len(text)

    def flush(self) -> None:
        if self.out and self.session:
            self._send("output")

    def readline(self) -> str:
        self._send("read")
        while (line := self.lines.get()) is None:
            self.again()
            self._send("read")
        return line

    def _send(self, kind: DebugIOKind) -> None:
        text, self.out = "".join(self.out), []
        self.link.send(DebugIO(self.session, kind, text))


class _RemotePdb(pdb.Pdb):
    """pdb whose terminal is the controller's (``meshio debug``): each time
    it stops after running freely it announces itself (a new session);
    ``continue`` or ``quit`` ends that session, and so does stepping out of
    the outermost frame of the user's code it stopped in (the endpoint's,
    into meshio's own frames, where pdb does not stop): the request is
    over, so the session is too, as after ``continue``."""

    def __init__(self, link: DebugLink, ctx: Context[Any]) -> None:
        self.terminal = _Terminal(link, self._again)
        self.ctx = ctx
        #: the call it paused (see :class:`~meshio._context.CallScope`)
        self.scope: CallScope | None = None
        #: the session's outermost frame of the user's code (the endpoint's)
        self.outer: FrameType | None = None
        io = cast(IO[str], self.terminal)  # (pdb uses write, flush and readline of its files)
        super().__init__(stdin=io, stdout=io, skip=_SKIP, nosigint=True, readrc=False)
        self.prompt = "(Pdb) "

    def interaction(self, frame: FrameType | None, traceback: Any) -> None:
        term = self.terminal
        if not term.session and frame is not None:
            self.scope = _scope.get()
            if self.scope is not None:  # its call is paused, not stalled
                self.scope.pause(True)
            self.outer = frame
            while self.outer.f_back is not None and not self._skipped(self.outer.f_back):
                self.outer = self.outer.f_back
            term.session, term.lines = term.link.open()
            ctx = self.ctx
            term.link.send(DebugPaused(
                term.session, ctx.actor_name, ctx.point.rank, ctx.proc.host, os.getpid(),
                term.link.addr, frame.f_code.co_qualname, frame.f_code.co_filename,
                frame.f_lineno))
        super().interaction(frame, traceback)

    def _again(self) -> None:
        """Show a client attached again where pdb stands, and its prompt."""
        self.print_stack_entry(self.stack[self.curindex])
        self.stdout.write(self.prompt)

    def dispatch_call(self, frame: FrameType, arg: None) -> Any:
        trace = super().dispatch_call(frame, arg)
        if frame is self.outer:  # (an async endpoint resumed) its return must be seen
            return self.trace_dispatch
        return trace

    def dispatch_return(self, frame: FrameType, arg: Any) -> Any:
        trace = super().dispatch_return(frame, arg)
        if frame is self.outer and not _suspends(frame):
            # stepped out of the user's code: pdb would stop next in whatever
            # this thread runs after (another call), or in no frame ever again
            self.set_continue()
        return trace

    def dispatch_exception(self, frame: FrameType, arg: Any) -> Any:
        if self._skipped(frame):  # (bdb stops at a StopIteration that ends a
            return self.trace_dispatch  # coroutine stepped in, even in a skipped module)
        return super().dispatch_exception(frame, arg)

    def _skipped(self, frame: FrameType) -> bool:
        return self.is_skipped_module(frame.f_globals.get("__name__", ""))

    def set_continue(self) -> None:
        super().set_continue()
        self._end("continued")

    def set_quit(self) -> None:
        super().set_quit()
        self._end("quit (its endpoint raises bdb.BdbQuit)")

    def _end(self, how: str) -> None:
        term = self.terminal
        self.outer = None
        if self.scope is not None:
            self.scope.pause(False)
        if term.session:
            term.flush()
            term.link.close(term.session, how)
            term.session = 0


def _suspends(frame: FrameType) -> bool:
    """Whether the return event of ``frame`` is its coroutine's (or
    generator's) suspension at an ``await`` or ``yield``, not its end: its
    last instruction is ``YIELD_VALUE`` (the ``RESUME`` after it, from
    Python 3.13 on)."""
    if not frame.f_code.co_flags & _SUSPENDS:
        return False
    code, at = frame.f_code.co_code, frame.f_lasti
    return code[at] == _YIELD_VALUE or (code[at] == _RESUME and at >= 2
                                        and code[at - 2] == _YIELD_VALUE)


def _on_debug_io(rt: Runtime, conn: Connection, msg: DebugIO, bufs: Buffers) -> None:
    if conn.job is not None and conn.job is rt.inspection:
        rt.state(Debugger).from_client(conn, msg)
    elif _link is not None and rt is _link.rt:
        _link.got(msg)
    elif rt.has_state(_Client):
        rt.state(_Client).got(msg)
    else:
        rt.state(Debugger).from_link(conn, msg)


def _on_terminal() -> bool:
    """Whether the controller's own terminal debugs its paused actors."""
    wanted = os.environ.get(TERMINAL_ENV, "")
    if wanted in ("0", "1"):
        return wanted == "1"
    try:
        return sys.stdin is not None and sys.stdin.isatty()
    except ValueError:  # stdin closed
        return False


def _on_paused(rt: Runtime, conn: Connection, msg: DebugPaused, bufs: Buffers) -> None:
    rt.state(Debugger).paused(conn, msg)


register_handler(DebugIO, _on_debug_io, inspection=True)
register_handler(DebugPaused, _on_paused)


# -------------------------------------------------------------- controller

@dataclass(eq=False)
class _Session:
    """A paused actor's pdb session, as the controller keeps it."""

    link: Connection
    paused: DebugPaused
    #: its output not shown yet (no client attached)
    pending: list[str] = field(default_factory=list[str])
    #: it waits for a line
    reading: bool = False
    client: Connection | None = None

    @property
    def name(self) -> str:
        p = self.paused
        return f"{p.actor} rank {p.rank}"

    def where(self) -> str:
        p = self.paused
        return f"{p.file}:{p.line} in {p.function} (pid {p.pid} on {p.host})"


class Debugger:
    """The controller's side of remote debugging (``rt.state(Debugger)``):
    the paused sessions in the order they paused, and the ``meshio debug``
    clients, each attached to one session or to none."""

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt
        self.sessions: dict[tuple[Connection, int], _Session] = {}
        #: client → the session it is attached to (None: at meshio debug's prompt)
        self.clients: dict[Connection, _Session | None] = {}
        #: worker address → its debug link, while it has a paused session
        self.links: dict[str, Connection] = {}
        #: client → the actor and rank it waits to attach to (``attach`` of
        #: an actor that has not paused yet)
        self.waiting: dict[Connection, tuple[str, str]] = {}
        #: the client on this controller's own terminal, while it runs
        self.console: asyncio.Task[int] | None = None
        self.terminal: Connection | None = None
        rt.on_any_lost.append(self._left)  # (a client killed: as if it had left)

    def close(self) -> None:
        """The controller ends: its connections are gone (clients see that)."""
        self.sessions.clear()
        self.clients.clear()
        self.links.clear()
        self.waiting.clear()

    # ------------------------------------------------ from the workers

    def paused(self, link: Connection, msg: DebugPaused) -> None:
        session = self.sessions[(link, msg.session)] = _Session(link, msg)
        if self.rt.controller is not None:
            then = "`meshio debug` does not reach it: its proc mesh was started by an actor"
        elif self.console is not None or _on_terminal():
            then = "debug it on this terminal (or with `meshio debug`)"
            if self.console is None:
                self.console = self.rt.tasks.start(self._console())
        else:
            then = "attach with `meshio debug`"
        say(f"{session.name} paused at {msg.file}:{msg.line} in {msg.function} (pid {msg.pid} "
            f"on {msg.host}); {then}")
        if self.links.get(msg.addr) is not link and link.peer is not None:
            self.links[msg.addr] = link
            # its heartbeats' answers count through its link, and its loss ends its sessions
            self.rt.watch.on_pong[link.peer] = lambda: self._pong(msg.addr)
            self.rt.on_lost[link.peer] = self._link_lost
        for client, awaited in list(self.waiting.items()):
            if client.closed or client not in self.clients:
                del self.waiting[client]
            elif awaited == (msg.actor, str(msg.rank)):
                del self.waiting[client]
                self._attach(client, list(awaited))
                break
        for client, attached in self.clients.items():  # (this terminal has the line above)
            if attached is None and client is not self.terminal and client not in self.waiting:
                self._say(client, f"meshio: {session.name} paused at {session.where()}\n")

    async def _console(self) -> int:
        """``meshio debug`` on this controller's own terminal, until the
        user quits or no actor is paused any more."""
        try:
            return await debug_client(self.rt.state(Inspection).controller, terminal=True)
        finally:
            self.console = self.terminal = None

    def _pong(self, addr: str) -> None:
        pong = self.rt.watch.on_pong.get(addr)
        if pong is not None:
            pong()

    def from_link(self, link: Connection, msg: DebugIO) -> None:
        session = self.sessions.get((link, msg.session))
        if session is None:
            return
        if msg.kind == "end":
            self._ended(session, msg.text)
            return
        session.pending.append(msg.text)
        session.reading = msg.kind == "read"
        if session.client is not None:
            self._show(session)

    def _link_lost(self, link: Connection) -> None:
        for session in [s for s in self.sessions.values() if s.link is link]:
            self._ended(session, "is gone (its process ended)")

    def _ended(self, session: _Session, how: str) -> None:
        del self.sessions[(session.link, session.paused.session)]
        if not any(s.link is session.link for s in self.sessions.values()):
            if self.links.get(session.paused.addr) is session.link:
                del self.links[session.paused.addr]
            peer = session.link.peer or ""
            self.rt.watch.on_pong.pop(peer, None)
            self.rt.on_lost.pop(peer, None)
        client = session.client
        if client is not None:
            self.clients[client] = None
            session.pending.append(f"meshio: {session.name} {how}\n")
            self._show(session)
            self._prompt(client)
        elif (self.terminal is not None and not self.sessions
              and self.clients.get(self.terminal, session) is None
              and self.terminal not in self.waiting):
            self._hand_back(self.terminal)  # at its prompt, and nothing is paused any more

    # ------------------------------------------------ from the clients

    def from_client(self, client: Connection, msg: DebugIO) -> None:
        if msg.kind == "open":
            if msg.text == "terminal":
                self.terminal = client
            self.clients[client] = None
            self._say(client, "meshio debug: `help` lists the commands\n")
            self._list(client)
            self._prompt(client)
            return
        if client not in self.clients:
            return
        attached = self.clients[client]
        if msg.kind == "end":
            self._left(client)
            return
        if msg.kind != "input":
            return
        line = msg.text.strip()
        awaited = self.waiting.get(client)
        if awaited is not None:  # a line typed while waiting for a pause
            if not line:
                client.send_message(DebugIO(0, "read", ""))  # (it waits on)
                return
            del self.waiting[client]
            self._say(client, f"meshio: stopped waiting for {awaited[0]} rank {awaited[1]}\n")
            if line == "detach":
                self._prompt(client)
                return
        if attached is not None and line != "detach":
            attached.reading = False
            attached.link.send_message(DebugIO(attached.paused.session, "input", msg.text))
            return
        self._command(client, attached, line)

    def _left(self, client: Connection) -> None:
        """``client`` left, or its connection is lost: the session it was
        attached to is free again."""
        attached = self.clients.pop(client, None)
        self.waiting.pop(client, None)
        if attached is not None:
            attached.client = None

    def _command(self, client: Connection, attached: _Session | None, line: str) -> None:
        words = line.split()
        if words == ["detach"] and attached is not None:
            attached.client = None
            self.clients[client] = None
            self._say(client, f"meshio: detached from {attached.name} (it stays paused)\n")
        elif words == ["detach"]:
            self._say(client, "meshio debug: not attached to any actor: `detach` leaves a pdb "
                              "session (`attach <actor> <rank>` starts one)\n")
        elif not words:
            pass
        elif words == ["list"]:
            self._list(client)
        elif words[0] == "attach" and len(words) in (1, 3):
            if self._attach(client, words[1:]):
                return
        elif words[0] == "attach" and len(words) == 2:
            if self._attach_actor(client, words[1]):
                return
        elif words == ["continue", "all"]:
            for session in self.sessions.values():
                session.link.send_message(DebugIO(session.paused.session, "input", "continue"))
            self._say(client, f"meshio: continuing {len(self.sessions)} paused actor(s)\n")
            if client is self.terminal:
                self._hand_back(client)
                return
        elif words == ["quit"]:
            del self.clients[client]
            client.send_message(DebugIO(0, "end"))
            return
        elif words == ["help"]:
            self._say(client, _HELP)
        else:
            self._say(client, f"meshio debug: unknown command {line!r}\n{_HELP}")
        self._prompt(client)

    def _attach(self, client: Connection, words: list[str]) -> bool:
        """Attach ``client`` to the oldest free session (of actor
        ``words[0]`` rank ``words[1]`` when given): True once attached, or
        waiting for that actor to pause; False (having said why) when the
        client gets its prompt back."""
        sessions = [s for s in self.sessions.values()
                    if not words or (s.paused.actor, str(s.paused.rank)) == tuple(words)]
        free = [s for s in sessions if s.client is None or s.client.closed]
        if free:
            session = free[0]
            session.client = client
            self.clients[client] = session
            self._say(client, f"meshio: attached to {session.name} at {session.where()}"
                              " (`detach` to leave it paused)\n")
            if session.reading and not session.pending:  # a client before it saw the prompt
                session.reading = False  # (pdb shows it again, then reads)
                session.link.send_message(DebugIO(session.paused.session, "open"))
            else:
                self._show(session)
            return True
        if sessions:
            self._say(client, f"meshio debug: {sessions[0].name} is attached to another "
                              "meshio debug\n")
        elif not words:
            self._say(client, "meshio debug: no paused actors\n")
        elif (unknown := self._unknown(words[0], words[1])) is not None:
            self._say(client, unknown)
        else:
            self.waiting[client] = (words[0], words[1])
            # (it reads on meanwhile: a line typed, or the end of its input, stops waiting)
            client.send_message(DebugIO(0, "read", f"meshio: waiting for {words[0]} rank "
                                                   f"{words[1]} to pause (`detach` stops "
                                                   "waiting)\n"))
            return True
        return False

    def _attach_actor(self, client: Connection, actor: str) -> bool:
        """``attach <actor>``: attach ``client`` to the paused rank of
        ``actor`` when only one of its ranks is paused (as :meth:`_attach`);
        else False, having said which of its ranks are paused (or that
        none is, or that it has no such actor mesh)."""
        ranks = sorted({s.paused.rank for s in self.sessions.values() if s.paused.actor == actor})
        if len(ranks) == 1:
            return self._attach(client, [actor, str(ranks[0])])
        if ranks:
            self._say(client, f"meshio debug: {len(ranks)} ranks of {actor!r} are paused "
                              f"({', '.join(map(str, ranks))}): `attach {actor} <rank>` picks "
                              "one\n")
        else:
            self._say(client, self._unknown(actor) or (
                f"meshio debug: no rank of {actor!r} is paused (`attach {actor} <rank>` "
                "waits for that rank)\n"))
        return False

    def _unknown(self, actor: str, rank: str | None = None) -> str | None:
        """Why ``attach <actor> <rank>`` can never attach: no actor mesh of
        that name in this controller's proc meshes, or none with that rank
        (None: it can, once that actor pauses; ``rank`` None: the actor
        mesh alone)."""
        sizes: dict[str, int] = {}
        procs = self.rt.state(Inspection).procs if self.rt.has_state(Inspection) else []
        for state in procs:
            for record in state.actors if not state.stopped else ():
                sizes[record.name] = max(sizes.get(record.name, 0), len(record.ranks))
        for session in self.sessions.values():  # (of a proc mesh that an actor started)
            paused = session.paused
            sizes[paused.actor] = max(sizes.get(paused.actor, 0), paused.rank + 1)

        def ranks(name: str) -> str:
            return "rank 0" if sizes[name] == 1 else f"ranks 0-{sizes[name] - 1}"
        if actor not in sizes:
            there = ", ".join(f"{name} ({ranks(name)})" for name in sorted(sizes))
            return (f"meshio debug: no actor mesh named {actor!r} in the proc meshes of this "
                    f"controller (pid {os.getpid()}); "
                    + (f"its actor meshes: {there}\n" if there else "it has none\n"))
        if rank is not None and (not rank.isdigit() or int(rank) >= sizes[actor]):
            return (f"meshio debug: actor mesh {actor!r} has no rank {rank} (it has "
                    f"{ranks(actor)})\n")
        return None

    def _list(self, client: Connection) -> None:
        if not self.sessions:
            self._say(client, "no paused actors\n")
            return
        lines = [f"  {s.name}: {s.where()}{' (attached)' if s.client is not None else ''}\n"
                 for s in self.sessions.values()]
        self._say(client, "paused actors, oldest first:\n" + "".join(lines))

    def _show(self, session: _Session) -> None:
        """Send ``session``'s pending output to its client."""
        client = session.client
        if client is None:
            return
        text, session.pending = "".join(session.pending), []
        reading = session.reading and self.clients.get(client) is session
        if text or reading:
            client.send_message(DebugIO(0, "read" if reading else "output", text))

    def _say(self, client: Connection, text: str) -> None:
        client.send_message(DebugIO(0, "output", text))

    def _prompt(self, client: Connection) -> None:
        if client is self.terminal and not self.sessions and client not in self.waiting:
            self._hand_back(client)  # nothing is paused
            return
        client.send_message(DebugIO(0, "read", PROMPT))

    def _hand_back(self, terminal: Connection) -> None:
        """End the session on the controller's own terminal: it is the
        program's again (the next pause opens another)."""
        del self.clients[terminal]
        self._say(terminal, "meshio: back to the program\n")
        terminal.send_message(DebugIO(0, "end"))


def debug_link(rt: Runtime, addr: str) -> Connection | None:
    """The debug link of the process at ``addr`` while it has a paused
    session (the controller pings it there too), else None."""
    return rt.state(Debugger).links.get(addr) if rt.has_state(Debugger) else None


# ------------------------------------------------------------------ client

class _Client:
    """``meshio debug``'s side: shows what the controller sends; reads a
    line from stdin (in a thread of its own) when asked."""

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt
        self.conn: Connection | None = None
        self.done: asyncio.Future[int] = rt.loop.create_future()
        #: done once the controller answered (or :attr:`done` is)
        self.answered: asyncio.Future[None] = rt.loop.create_future()
        #: a thread reads a line of stdin (one at a time: lines stay in order)
        self.reading = False

    def close(self) -> None:
        self._finish(1)

    def got(self, msg: DebugIO) -> None:
        self._answered()
        sys.stdout.write(msg.text)
        sys.stdout.flush()
        if msg.kind == "read" and not self.reading:
            self.reading = True
            threading.Thread(target=self._read, name="meshio debug stdin", daemon=True).start()
        elif msg.kind == "end":
            self._finish(0)

    def _read(self) -> None:
        line = sys.stdin.readline()
        try:
            self.rt.loop.call_soon_threadsafe(self._line, line)
        except RuntimeError:  # the loop is closed: we are leaving
            pass

    def _line(self, line: str) -> None:
        self.reading = False
        if self.conn is None:
            return
        if line:
            self.conn.send_message(DebugIO(0, "input", line.rstrip("\n")))
        else:  # end of file (Ctrl-D): leave
            self.conn.send_message(DebugIO(0, "end"))
            self._finish(0)

    def _finish(self, code: int) -> None:
        self._answered()
        if not self.done.done():
            self.done.set_result(code)

    def _answered(self) -> None:
        if not self.answered.done():
            self.answered.set_result(None)


async def debug_client(controller: Controller, *, terminal: bool = False,
                       timeout: float | None = None) -> int:
    """Run ``meshio debug`` against ``controller`` until the user quits
    (0) or the controller is gone (1); ``terminal``: in the controller's own
    process, on its terminal (it ends once no actor is paused).

    Args:
        timeout: seconds the controller has to answer at first (it answers
            at once unless it is stopped or its loop is blocked); None: no
            bound.

    Raises:
        TimeoutError: it did not answer within ``timeout`` seconds.
    """
    loop = asyncio.get_running_loop()
    rt = Runtime(loop, secret=controller.secret)
    try:
        client = rt.state(_Client)
        rt.pids[controller.address] = controller.pid  # the listener proves it is that process

        def lost(conn: Connection) -> None:
            if not terminal:  # (the program ends)
                sys.stderr.write(f"\nmeshio debug: lost the controller (pid {controller.pid})\n")
            client._finish(1)
        rt.on_lost[controller.address] = lost
        client.conn = rt.connect(controller.address)
        client.conn.send_message(DebugIO(0, "open", "terminal" if terminal else ""))
        async with asyncio.timeout(timeout):
            await client.answered
        return await client.done
    finally:
        del rt.on_lost[controller.address]  # (closing is not losing it)
        rt.close()
