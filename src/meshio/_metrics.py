"""What a running job has done and costs, as numbers: ``await meshio.stats()``.

Each actor cell counts its calls as they end (:class:`Meter`, one per
endpoint: calls, errors, run time, the run times of the last
:data:`WINDOW` calls), on its loop, without a lock or an allocation beyond
the call's run time.  A worker's runtime answers a
:class:`~meshio._transport._messages.GetStats` request on its event loop,
not through the actors' mailboxes (as for stacks), with a
:class:`ProcessReport`: its CPU time and resident memory, and per actor
its meters and what waits in its mailbox.  The controller adds what only
it knows (each process's rank and restarts) and builds one
:class:`Stats` tree: proc mesh → process → actor → endpoint.
"""

from __future__ import annotations

import math
import os
import resource
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

import msgspec

from ._inspect import Inspection
from ._stacks import PrettyPrinter
from ._transport._messages import GetStats
from ._transport._runtime import (
    Runtime,
    _runtimes,
    ask_each,
    existing_runtime,
    not_its_loop,
    runtime,
)
from ._transport._serial import Buffers

if TYPE_CHECKING:
    from ._cell import ActorCell
    from ._proc_state import ProcState

__all__ = ("STATS_TIMEOUT", "WINDOW", "ActorStats", "EndpointStats", "Meter", "ProcMeshStats",
           "ProcessReport", "ProcessStats", "Stats", "actor_stats", "decode_report",
           "encode_report", "process_report", "stats")

#: seconds ``stats()`` waits for a process's answer by default
STATS_TIMEOUT = 10.0
#: the latency percentiles are over the run times of this many last calls
#: of an endpoint (a power of two: the ring's index is masked)
WINDOW: Final = 1024
#: a :class:`Meter`'s ``calls`` masked: its index in ``window``
METER_MASK: Final = WINDOW - 1


class Meter:
    """One endpoint of one actor: its calls so far, counted on the actor's
    loop as each ends (:meth:`record`; a call that returned, by
    ``ActorCell._run`` inline)."""

    __slots__ = ("calls", "errors", "seconds", "window")

    def __init__(self) -> None:
        self.calls = 0
        self.errors = 0
        self.seconds = 0.0
        #: run times of the last WINDOW calls, a ring indexed by ``calls``
        self.window: list[float] = [0.0] * WINDOW

    def record(self, seconds: float, error: bool) -> None:
        """A call ran ``seconds`` and ended (``error``: it raised)."""
        n = self.calls
        self.window[n & METER_MASK] = seconds
        self.calls = n + 1
        self.errors += error
        self.seconds += seconds

    def percentiles(self) -> tuple[float, float, float] | None:
        """p50, p90, p99 of the last calls' run times (None: no call yet)."""
        times = sorted(self.window[:min(self.calls, WINDOW)])
        if not times:
            return None
        n = len(times)

        def at(q: float) -> float:  # nearest rank
            return times[max(math.ceil(q * n) - 1, 0)]

        return at(0.5), at(0.9), at(0.99)


@dataclass(frozen=True)
class EndpointStats:
    """One endpoint of one actor.

    Attributes:
        endpoint: its qualified name (``Trainer.step``).
        calls: calls that ended so far (returned or raised).
        errors: those of them that raised (a cancelled call is not an error).
        queued: calls of it waiting their turn now: in the actor's mailbox,
            or for a slot of an ``@endpoint(concurrent=N)`` (N run at once).
        running: calls of it under way now.
        seconds: the run time of all ended calls, in seconds.
        p50: median run time in seconds over the last :data:`WINDOW` calls
            (None: no call has ended yet); ``p90`` and ``p99`` likewise.
    """

    endpoint: str
    calls: int
    errors: int
    queued: int
    running: int
    seconds: float
    p50: float | None
    p90: float | None
    p99: float | None


@dataclass(frozen=True)
class ActorStats:
    """One actor.

    Attributes:
        actor: the actor mesh's name (given to ``procs.spawn``).
        rank: the actor's rank in that mesh; ``point`` its coordinates.
        queued: calls waiting their turn now (all endpoints): in its mailbox,
            or for a slot of an ``@endpoint(concurrent=N)``.
        expired: calls dropped so far without running because their
            deadline passed while they waited.
        endpoints: one entry per endpoint of its class, by name.
    """

    actor: str
    rank: int
    point: dict[str, int]
    queued: int
    expired: int
    endpoints: tuple[EndpointStats, ...]


@dataclass(frozen=True)
class ProcessStats:
    """One process of a proc mesh.

    Attributes:
        rank: its rank in the proc mesh; ``point`` its coordinates.
        host: its host; ``pid`` its process id (the current incarnation's).
        restarts: how many times a supervisor replaced it.
        cpu_user: CPU seconds it has run in user mode (all its threads);
            ``cpu_system`` in the kernel on its behalf.
        rss: its resident memory in bytes.
        log_records_dropped: ``logging`` records it dropped because more
            than the forwarding backlog waited to be sent.
        actors: its actors, by actor mesh name then rank.
        error: why it did not answer (gone, hung, its loop blocked); the
            numbers it would have told are then 0 and ``actors`` empty.
    """

    rank: int
    point: dict[str, int]
    host: str
    pid: int
    restarts: int
    cpu_user: float
    cpu_system: float
    rss: int
    log_records_dropped: int
    actors: tuple[ActorStats, ...]
    error: str | None = None

    @property
    def cpu_seconds(self) -> float:
        """User plus system CPU seconds."""
        return self.cpu_user + self.cpu_system


@dataclass(frozen=True)
class ProcMeshStats:
    """One proc mesh: its ``name``, its processes, by rank, and its ``id``
    (unique in the job where names repeat, as two ``spawn_procs`` of the
    default name do: the name and 8 hex digits)."""

    name: str
    processes: tuple[ProcessStats, ...]
    id: str = ""


@dataclass(frozen=True)
class Stats:
    """Every process of every proc mesh this controller started:
    ``await meshio.stats()``.  ``str(stats)`` is :meth:`text`, and so is
    what IPython (a notebook) shows for it.

    Attributes:
        proc_meshes: by start order.
    """

    proc_meshes: tuple[ProcMeshStats, ...]

    def __str__(self) -> str:
        return self.text()

    def _repr_pretty_(self, p: PrettyPrinter, cycle: bool) -> None:
        p.text(self.text().rstrip("\n"))

    def text(self) -> str:
        """The tree, one line per proc mesh, process, actor and endpoint::

            proc mesh 'procs' (procs-1a2b3c4d)
              rank 0 (pid 4242 on node7): cpu 1.20 s, rss 45.6 MiB
                greeters rank 0
                  Greeter.hello: 10 calls, 1 raised, p50 0.12 ms, p90 0.3 ms, p99 0.5 ms

        Counts that are 0 (errors: ``raised``, queued, running, restarts,
        expired, dropped log records) are left out; a process that did not
        answer shows its error instead of its numbers."""
        lines: list[str] = []
        for pm in self.proc_meshes:
            lines.append(f"proc mesh {pm.name!r}" + (f" ({pm.id})" if pm.id else ""))
            for p in pm.processes:
                head = f"  rank {p.rank} (pid {p.pid} on {p.host}): "
                if p.error is not None:
                    lines.append(f"{head}error: {p.error}")
                    continue
                more = {"restarts": p.restarts, "log records dropped": p.log_records_dropped}
                lines.append(head + ", ".join([
                    f"cpu {p.cpu_seconds:.2f} s", f"rss {p.rss / 2**20:.1f} MiB",
                    *(f"{name} {n}" for name, n in more.items() if n)]))
                for a in p.actors:
                    lines.append(", ".join([f"    {a.actor} rank {a.rank}",
                                            *_counts(queued=a.queued, expired=a.expired)]))
                    for e in a.endpoints:
                        lines.append(f"      {e.endpoint}: " + ", ".join([
                            f"{e.calls} call{'s' * (e.calls != 1)}",
                            *_counts(raised=e.errors, queued=e.queued, running=e.running),
                            *(f"{q} {_duration(t)}" for q, t in
                              (("p50", e.p50), ("p90", e.p90), ("p99", e.p99))
                              if t is not None)]))
        return "\n".join(lines) + "\n" if lines else "no proc meshes\n"

    def endpoints(self) -> Iterator[tuple[ProcMeshStats, ProcessStats, ActorStats,
                                          EndpointStats]]:
        """Every endpoint of every actor, with where it is."""
        for pm in self.proc_meshes:
            for p in pm.processes:
                for a in p.actors:
                    for e in a.endpoints:
                        yield pm, p, a, e

    def json(self) -> str:
        """The tree as JSON (the fields of the dataclasses)."""
        return msgspec.json.encode(self).decode()


def _counts(**counts: int) -> list[str]:
    """``3 queued`` for each count that is not 0."""
    return [f"{n} {name}" for name, n in counts.items() if n]


def _duration(seconds: float) -> str:
    """``0.123 ms``, ``45.6 ms``, ``1.2 s``: three significant digits."""
    return f"{seconds * 1e3:.3g} ms" if seconds < 1 else f"{seconds:.3g} s"


class ProcessReport(msgspec.Struct, frozen=True, array_like=True):
    """What a worker answers to ``GetStats``: its own numbers and its actors'."""

    pid: int
    host: str
    cpu_user: float
    cpu_system: float
    rss: int
    log_records_dropped: int
    actors: list[ActorStats]


def _rss() -> int:
    """This process's resident memory in bytes (its peak where ``/proc`` is missing)."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def actor_stats(cell: ActorCell) -> ActorStats:
    """The numbers of the actor of ``cell``, on its process's loop."""
    queued: dict[str, int] = {}
    for _, msg in cell.waiting():
        queued[msg.method] = queued.get(msg.method, 0) + 1
    running: dict[str, int] = {}
    if cell.serving is not None:
        running[cell.serving.qualname] = 1
    for task in cell.tasks:  # concurrent calls under way, named by their endpoint
        if not task.done():
            running[task.get_name()] = running.get(task.get_name(), 0) + 1
    endpoints: list[EndpointStats] = []
    for name, meter in sorted(cell.meters.items()):
        qualname = cell.endpoints[name].qualname
        p = meter.percentiles()
        endpoints.append(EndpointStats(
            qualname, meter.calls, meter.errors, queued.get(name, 0), running.get(qualname, 0),
            meter.seconds, *(p if p is not None else (None, None, None))))
    ctx = cell.ctx
    return ActorStats(ctx.actor_name, ctx.point.rank, dict(ctx.point), sum(queued.values()),
                      cell.expired, tuple(endpoints))


def process_report(host: str, cells: list[ActorCell], dropped: int) -> ProcessReport:
    """This process's answer to ``GetStats`` (``dropped``: its log records dropped)."""
    times = os.times()
    return ProcessReport(os.getpid(), host, times.user, times.system, _rss(), dropped,
                         sorted((actor_stats(c) for c in cells), key=lambda a: (a.actor, a.rank)))


_encoder = msgspec.msgpack.Encoder()
_report_decoder = msgspec.msgpack.Decoder(ProcessReport)


def encode_report(report: ProcessReport) -> msgspec.Raw:
    """The body of the reply to a ``GetStats``."""
    return msgspec.Raw(_encoder.encode(report))


def decode_report(raw: Any, bufs: Buffers) -> ProcessReport:
    """The report of a reply to ``GetStats`` (a malformed one raises
    ``msgspec.DecodeError``, a ``ValueError``)."""
    return _report_decoder.decode(raw)


async def stats(*, timeout: float = STATS_TIMEOUT) -> Stats:
    """What every process of every proc mesh this controller started has
    done and costs, now: per process its CPU time, resident memory and
    restarts; per actor, per endpoint, its calls, errors, queue and run-time
    percentiles.  Each process answers on its event loop, not through the
    actors' mailboxes, so a busy actor is counted too.

    Args:
        timeout: seconds to wait for each process; one that has not
            answered by then, or is gone, has its ``ProcessStats.error`` set.

    Raises:
        TypeError: ``timeout`` is not a number (a str, a bool).
        ValueError: ``timeout`` is not seconds > 0 (NaN, or an int no float
            holds; ``math.inf``: no bound).
        WrongLoopError: asked on an event loop that started no proc mesh
            while another loop of this process has some (they answer on
            their own loop only; it said "none" before).
    """
    states = _live_meshes(existing_runtime())
    if not states:  # (none here: a loop of this process that has some is named)
        elsewhere = next((other for other in list(_runtimes.values())
                          if not other.closed and _live_meshes(other)), None)
        if elsewhere is not None:
            raise not_its_loop(elsewhere, "meshio.stats(): each proc mesh")
    rt = runtime()
    workers = [(state, w) for state in states for w in state.workers]
    answers = await ask_each(rt, [(w.addr, GetStats, f"proc mesh {state.name!r}",
                                   state.region.point(w.rank)) for state, w in workers],
                             decode_report, "stats()", timeout)
    processes: dict[str, list[ProcessStats]] = {state.id: [] for state in states}
    for (state, w), answer in zip(workers, answers):
        point = dict(state.region.point(w.rank))
        if isinstance(answer, str):
            p = ProcessStats(w.rank, point, w.handle.host, w.handle.pid, w.incarnation,
                             0.0, 0.0, 0, 0, (), answer)
        else:
            p = ProcessStats(w.rank, point, answer.host, answer.pid, w.incarnation,
                             answer.cpu_user, answer.cpu_system, answer.rss,
                             answer.log_records_dropped, tuple(answer.actors))
        processes[state.id].append(p)
    return Stats(tuple(ProcMeshStats(state.name, tuple(sorted(processes[state.id],
                                                                key=lambda p: p.rank)), state.id)
                       for state in states))


def _live_meshes(rt: Runtime | None) -> list[ProcState]:
    """The proc meshes started on ``rt`` that serve (none without ``rt``)."""
    if rt is None or not rt.has_state(Inspection):
        return []
    return [state for state in rt.state(Inspection).procs
            if state.ready.done() and not state.stopped]
