"""What every actor is doing right now: its Python stacks, as data.

:func:`capture` reads one actor's stacks in its own process: the stack of
each task of its cell (the mailbox task running its current call, one task
per ``concurrent`` call under way) and, when a plain ``def`` endpoint runs,
the frames of the actor's thread; :func:`capture_construction` those of an
actor whose constructor still runs (``__init__`` in its thread, or an
``on_restart`` hook).  Every string is made one UTF-8 can carry (a file
name that is not: ``caf\\xe9.py``), so no frame keeps the others from
being sent.  The worker's runtime answers a
:class:`~meshio._transport._messages.GetStacks` request with them on its
event loop, not through the actor's mailbox, so a busy actor (a ``def``
endpoint blocked in its thread, an ``async`` one awaiting forever) is seen
where it is.  An ``async`` endpoint that blocks the event loop itself
(``time.sleep`` in an ``async def``) keeps its process from answering:
the request then ends in an error naming that process.

:func:`gather` asks many processes and makes one :class:`Stacks`: the
result of ``await actor_mesh.stacks()`` and ``await proc_mesh.stacks()``,
printable grouped (``Stacks.text()``) and as JSON (``Stacks.json()``).
"""

from __future__ import annotations

import functools
import linecache
import os
import sys
import sysconfig
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from types import FrameType
from typing import TYPE_CHECKING, Any, Protocol

import msgspec

from ._transport._messages import GetStacks
from ._transport._runtime import Runtime, ask_each
from ._transport._serial import Buffers
from ._util import utf8

if TYPE_CHECKING:
    import asyncio

    from ._cell import ActorCell, Construction

__all__ = ("ActorStacks", "PrettyPrinter", "StackFrame", "Stacks", "TaskStack", "capture",
           "capture_call", "capture_construction", "decode_actors", "encode_actors", "gather",
           "thread_frames")

#: seconds ``stacks()`` waits for a process's answer by default
STACKS_TIMEOUT = 10.0


class PrettyPrinter(Protocol):
    """What IPython passes to ``_repr_pretty_`` (its
    ``RepresentationPrinter``), as far as meshio uses it."""

    def text(self, obj: str) -> None: ...


@dataclass(frozen=True)
class StackFrame:
    """One frame of a Python stack.

    Attributes:
        file: the source file's path, as the running process sees it.
        line: the line being run.
        function: the function's qualified name (``Trainer.step``).
        code: that line of source, stripped ("" when the file cannot be read).
    """

    file: str
    line: int
    function: str
    code: str = ""

    def where(self) -> str:
        """``Trainer.step at train.py:41``."""
        return f"{self.function} at {os.path.basename(self.file)}:{self.line}"


@dataclass(frozen=True)
class TaskStack:
    """The stack of one asyncio task of an actor, outermost frame first,
    starting at the actor's own code (meshio's frames that call it are left
    out).

    Attributes:
        name: what the task runs: the endpoint of the call under way
            (``Trainer.step``), or ``"mailbox"`` for the task that runs the
            actor's calls one at a time.
        frames: the stack, outermost first.
    """

    name: str
    frames: tuple[StackFrame, ...]


@dataclass(frozen=True)
class ActorStacks:
    """The stacks of one actor, captured in its process.

    Attributes:
        actor: the actor mesh's name (given to ``procs.spawn``).
        rank: the actor's rank in that mesh.
        point: its coordinates in that mesh (``{"gpus": 3}``).
        host: the host of its process.
        pid: the pid of its process.
        endpoint: the endpoint of the mailbox call under way
            (``Trainer.step``); None when the actor is idle.
        running_for: seconds that call has been running (None when idle).
        tasks: the stack of each of the actor's tasks that is running its
            code (the mailbox call, ``concurrent`` calls).
        thread: the stack of the actor's thread (outermost first) while a
            plain ``def`` endpoint or hook runs in it, or its constructor,
            else empty.
        queued: calls waiting their turn: in the actor's mailbox, or for a
            slot of an ``@endpoint(concurrent=N)``.
        expired: calls dropped so far without running, because their
            deadline (``options(timeout=...)``) passed while they waited.
        constructing: the actor is still being built: its ``__init__`` (in
            ``thread``) or, rebuilt by a supervisor, its ``on_restart``
            hook (in ``thread``, or an ``async`` one in the task named
            ``constructor``) runs; ``running_for`` counts from the start of
            its construction.
            It takes no calls yet (``endpoint`` is None).
    """

    actor: str
    rank: int
    point: dict[str, int]
    host: str
    pid: int
    endpoint: str | None
    running_for: float | None
    tasks: tuple[TaskStack, ...]
    thread: tuple[StackFrame, ...]
    queued: int = 0
    expired: int = 0
    constructing: bool = False

    @property
    def idle(self) -> bool:
        """Whether none of the actor's code is running (an actor being
        built is not idle)."""
        return not self.tasks and not self.thread and not self.constructing

    def innermost(self) -> StackFrame | None:
        """The frame the actor is in, as a user reads it: the innermost
        frame of its own code (not meshio's or the standard library's) in
        the thread, else in its first task; None when idle."""
        for frames in (self.thread, *(t.frames for t in self.tasks)):
            if frames:
                return next((f for f in reversed(frames) if not _internal(f.file)), frames[-1])
        return None


@dataclass(frozen=True)
class Stacks:
    """The stacks of many actors: ``await actor_mesh.stacks()`` (one entry
    per rank) or ``await proc_mesh.stacks()`` (every actor of those
    processes).  ``str(stacks)`` is :meth:`text`, and so is what IPython
    (a notebook) shows for it.

    Attributes:
        actors: one entry per actor, by actor mesh name then rank.
        errors: one line per process that could not answer (gone, hung,
            or its event loop blocked), saying which and why.
    """

    actors: tuple[ActorStacks, ...]
    errors: tuple[str, ...] = ()

    def __str__(self) -> str:
        return self.text()

    def _repr_pretty_(self, p: PrettyPrinter, cycle: bool) -> None:
        p.text(self.text().rstrip("\n"))

    def text(self) -> str:
        """The stacks grouped: actors of one mesh with identical stacks are
        one group, headed ``trainers ranks 0-3: in Trainer.step at
        train.py:41 (for 1.2-1.5 s)``, then that stack once; idle actors
        are one line; actors being built are headed ``constructing, in
        load at model.py:12 (for 3.0 s)``; then the errors."""
        lines: list[str] = []
        for group in _groups(self.actors):
            first = group[0]
            lines.append(f"{first.actor} {_ranks([a.rank for a in group])}: {_headline(group)}")
            for task in first.tasks:
                lines.append(f"  task {task.name}:")
                lines.extend(_frame_lines(task.frames))
            if first.thread:
                lines.append("  thread:")
                lines.extend(_frame_lines(first.thread))
        lines.extend(f"error: {e}" for e in self.errors)
        return "\n".join(lines) + "\n" if lines else "no actors\n"

    def json(self) -> str:
        """The stacks as JSON (an object with ``actors`` and ``errors``,
        the fields of the dataclasses); :meth:`from_json` reads it back."""
        return msgspec.json.encode(self).decode()

    @classmethod
    def from_json(cls, data: str | bytes) -> Stacks:
        """The stacks that :meth:`json` wrote.

        Raises:
            ValueError: ``data`` is not such JSON (``msgspec.DecodeError``,
                a ``ValueError``, says where).
        """
        return msgspec.json.decode(data, type=cls)


# ------------------------------------------------------------- capturing

def _stdlib_dirs() -> tuple[str, ...]:
    paths = sysconfig.get_paths()
    return tuple(os.path.join(paths[k], "") for k in ("stdlib", "platstdlib"))


def _site_dirs() -> tuple[str, ...]:
    paths = sysconfig.get_paths()
    return tuple(os.path.join(paths[k], "") for k in ("purelib", "platlib"))


_MESHIO = os.path.join(os.path.dirname(os.path.abspath(__file__)), "")
_STDLIB = _stdlib_dirs()
_SITE = _site_dirs()


def _internal(file: str) -> bool:
    """``file`` is meshio's or the standard library's (not the user's)."""
    if file.startswith(_MESHIO) or file.startswith("<frozen "):
        return True
    return file.startswith(_STDLIB) and not file.startswith(_SITE)


def _frame(frame: FrameType) -> StackFrame:
    code = frame.f_code
    line = frame.f_lineno or code.co_firstlineno
    return StackFrame(utf8(code.co_filename), line, utf8(code.co_qualname),
                      utf8(linecache.getline(code.co_filename, line).strip()))


def _from_user_code(frames: list[FrameType]) -> tuple[StackFrame, ...]:
    """``frames`` (outermost first) without the leading ones that are
    meshio's or the standard library's: the runtime's calling frames."""
    start = next((i for i, f in enumerate(frames) if not _internal(f.f_code.co_filename)),
                 len(frames))
    return tuple(_frame(f) for f in frames[start:])


def _awaited(coro: Any) -> Iterator[FrameType]:
    """The frames of a suspended coroutine and of what it awaits, outermost
    first (``cr_await`` down to a future or a C awaitable)."""
    while coro is not None:
        frame = getattr(coro, "cr_frame", None) or getattr(coro, "gi_frame", None) \
            or getattr(coro, "ag_frame", None)
        if frame is not None:  # (None: a future, or an awaitable on the way to a coroutine)
            yield frame
        coro = getattr(coro, "cr_await", None) or getattr(coro, "gi_yieldfrom", None) \
            or getattr(coro, "ag_await", None)


def thread_frames() -> dict[int, FrameType]:
    """The innermost frame of every thread of this process, by thread id:
    taken once for all the actors of a reply (``sys._current_frames()``
    makes a dict of every thread, and each actor has one of its own)."""
    return sys._current_frames()


def _thread_frames(ident: int | None, current: dict[int, FrameType]) -> list[FrameType]:
    frame = current.get(ident) if ident is not None else None
    frames: list[FrameType] = []
    while frame is not None:
        frames.append(frame)
        frame = frame.f_back
    frames.reverse()
    return frames


def capture(cell: ActorCell, current: dict[int, FrameType] | None = None) -> ActorStacks:
    """The current stacks of the actor of ``cell``, on its process's loop
    (its tasks are suspended there, its thread may be running); its
    thread's frames from ``current`` (:func:`thread_frames`), or taken now."""
    ctx = cell.ctx
    tasks: list[TaskStack] = []
    for task in (cell.task, *cell.tasks):
        if task.done():
            continue
        frames = _from_user_code(list(_awaited(task.get_coro())))
        if frames:
            tasks.append(TaskStack(utf8(task.get_name()), frames))
    thread = cell.thread.thread
    serving = cell.serving
    return ActorStacks(
        utf8(ctx.actor_name), ctx.point.rank, dict(ctx.point), ctx.proc.host, ctx.proc.pid,
        utf8(serving.qualname) if serving is not None else None,
        time.monotonic() - cell.since if serving is not None else None,
        tuple(tasks),
        _from_user_code(_thread_frames(thread.ident if thread is not None else None,
                                       thread_frames() if current is None else current)),
        sum(1 for _ in cell.waiting()),
        cell.expired)


def capture_call(cell: ActorCell, task: asyncio.Task[Any], endpoint: str,
                 running_for: float) -> ActorStacks:
    """The stack of one ``concurrent`` call of the actor of ``cell`` (its
    ``task``, a call of ``endpoint`` running for ``running_for`` seconds),
    on its process's loop, as its stall report shows it: that task's
    alone (each stalled call is reported, with an actor's thousands of
    calls under way too)."""
    ctx = cell.ctx
    frames = _from_user_code(list(_awaited(task.get_coro())))
    return ActorStacks(
        utf8(ctx.actor_name), ctx.point.rank, dict(ctx.point), ctx.proc.host, ctx.proc.pid,
        utf8(endpoint), running_for,
        (TaskStack(utf8(task.get_name()), frames),) if frames else (), ())


def capture_construction(building: Construction,
                         current: dict[int, FrameType]) -> ActorStacks:
    """The current stacks of an actor being built (on its process's loop):
    its thread's frames (from ``current``, :func:`thread_frames`) while its
    ``__init__`` (or a ``def on_restart``) runs there; an ``async``
    ``on_restart``'s in the task ``constructor``."""
    ctx = building.ctx
    task = building.task
    frames = (_from_user_code(list(_awaited(task.get_coro())))
              if task is not None and not task.done() else ())
    thread = building.thread.thread
    return ActorStacks(
        utf8(ctx.actor_name), ctx.point.rank, dict(ctx.point), ctx.proc.host, ctx.proc.pid,
        None, time.monotonic() - building.since,
        (TaskStack("constructor", frames),) if frames else (),
        _from_user_code(_thread_frames(thread.ident if thread is not None else None, current)),
        constructing=True)


_encoder = msgspec.msgpack.Encoder()
_actors_decoder = msgspec.msgpack.Decoder(list[ActorStacks])


def encode_actors(actors: Sequence[ActorStacks]) -> msgspec.Raw:
    """The body of the reply to a :class:`GetStacks`."""
    return msgspec.Raw(_encoder.encode(actors))


def decode_actors(raw: Any, bufs: Buffers) -> list[ActorStacks]:
    """The actors of a reply to :class:`GetStacks` (a malformed one raises
    ``msgspec.DecodeError``, a ``ValueError``)."""
    return _actors_decoder.decode(raw)


# ------------------------------------------------------------- gathering

async def gather(rt: Runtime, asks: Sequence[tuple[str, str, str, Any]],
                 timeout: float) -> Stacks:
    """The stacks from several processes, asked at once: ``asks`` holds,
    per process, its address, the actor mesh target wanted there (empty:
    every actor), and how to name it in an error: a mesh (``proc mesh
    'p'``) and a point in it (as for a call: :class:`Pending`).  A process
    that fails or has not answered within ``timeout`` seconds adds an error
    line instead of its actors.

    Raises:
        ValueError: ``timeout`` is not a positive number.
    """
    answers = await ask_each(
        rt, [(addr, functools.partial(GetStacks, target=target), mesh, point)
             for addr, target, mesh, point in asks], decode_actors, "stacks()", timeout)
    actors: list[ActorStacks] = []
    errors: list[str] = []
    for answer in answers:
        if isinstance(answer, str):
            errors.append(answer)
        else:
            actors.extend(answer)
    actors.sort(key=lambda a: (a.actor, a.rank))
    return Stacks(tuple(actors), tuple(errors))


# ------------------------------------------------------------- rendering

def _groups(actors: Sequence[ActorStacks]) -> list[list[ActorStacks]]:
    """Actors of one mesh with the same endpoint and stacks, in order of
    first appearance."""
    groups: dict[tuple[Any, ...], list[ActorStacks]] = {}
    for a in actors:
        groups.setdefault((a.actor, a.constructing, a.endpoint, a.tasks, a.thread),
                          []).append(a)
    return list(groups.values())


def _ranks(ranks: Sequence[int]) -> str:
    """``rank 3``, ``ranks 0-3``, ``ranks 0-1,4,6-7``."""
    spans: list[list[int]] = []
    for r in sorted(ranks):
        if spans and r == spans[-1][1] + 1:
            spans[-1][1] = r
        else:
            spans.append([r, r])
    text = ",".join(str(a) if a == b else f"{a}-{b}" for a, b in spans)
    return f"rank {text}" if len(ranks) == 1 else f"ranks {text}"


def _headline(group: Sequence[ActorStacks]) -> str:
    first = group[0]
    at = first.innermost()
    times = [a.running_for for a in group if a.running_for is not None]
    took = ""
    if times:
        lo, hi = min(times), max(times)
        took = f"{lo:.1f} s" if f"{lo:.1f}" == f"{hi:.1f}" else f"{lo:.1f}-{hi:.1f} s"
    if first.constructing:
        where = f", in {at.where()}" if at is not None else ""
        return f"constructing{where}" + (f" (for {took})" if took else "")
    if at is None:
        return "idle"
    where = f"in {at.where()}"
    if first.endpoint is None or not times:
        return where
    return f"{where} (endpoint {first.endpoint}, running for {took})"


def _frame_lines(frames: Sequence[StackFrame]) -> list[str]:
    lines: list[str] = []
    for f in frames:
        lines.append(f'    File "{f.file}", line {f.line}, in {f.function}')
        if f.code:
            lines.append(f"      {f.code}")
    return lines
