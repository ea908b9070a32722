"""The fan-out tree: one message per host for a call to a mesh spanning
many hosts, relayed down a tree of hosts and answered back up it.

The tree is fixed by the proc mesh, not by the view called: the hosts of a
proc mesh, ``0 .. H-1``, are split into at most ``width`` ranges of
neighbouring hosts; the first process of a range's first host (its relay)
calls the actors on its own host and splits the rest of its range the same
way.  So every message from one caller to one host takes the same path, and
messages through the tree keep their order.

A direct message (``call_one``, a one-host view) takes another path than
one through the tree, and either may overtake the other.  So the calls of
one caller to one actor of a mesh spanning hosts are numbered
(``Call.seq``) and the receiving process runs them in that order
(:class:`Order`): a call arriving early waits for those before it, for at
most :data:`HOLD_TIMEOUT` seconds (one may be lost with a relay that died).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .._constants import MSGPACK_NIL
from .._exceptions import CallTimeout, SchemaError, SupervisionError
from ._connection import Connection, Pending, lost_with_relay
from ._credit import Gate
from ._messages import (
    Answers,
    Call,
    Cancel,
    ErrorInfo,
    ErrorKind,
    Fail,
    Fanout,
    PortSend,
    Reply,
    encode_message,
)
from ._serial import KIND_ASCII, KIND_BYTEARRAY, KIND_BYTES, Buffers, OutBuffers, ascii_memory

if TYPE_CHECKING:
    from ._runtime import Runtime

__all__ = ("GATHER_DELAY", "HOLD_TIMEOUT", "FanoutState", "Order", "malformed", "relay", "split")

log = logging.getLogger("meshio")

#: seconds a relay holds the answers of a ``call`` for the last ones
GATHER_DELAY = 0.05

#: seconds a direct message waits for the tree message it must follow (that
#: one was lost with a relay, or the actor restarted since)
HOLD_TIMEOUT = 5.0


def split(lo: int, hi: int, width: int) -> list[tuple[int, int]]:
    """Hosts ``lo .. hi-1`` as at most ``width`` ranges of neighbours, the
    first ones one longer when they do not divide evenly."""
    n = hi - lo
    if n <= 0:
        return []
    parts = min(width, n)
    size, extra = divmod(n, parts)
    ranges: list[tuple[int, int]] = []
    start = lo
    for k in range(parts):
        end = start + size + (k < extra)
        ranges.append((start, end))
        start = end
    return ranges


def out_buffers(bufs: Buffers) -> OutBuffers:
    """Received out-of-band buffers as buffers to send on (same kinds)."""
    return [(b, KIND_BYTES) if type(b) is bytes else (ascii_memory(b), KIND_ASCII)
            if type(b) is str else (b, KIND_BYTEARRAY) for b in bufs]


class FanoutState:
    """A runtime's side of the tree: as a caller, the number of its last
    call to each actor of a mesh spanning hosts; as a relay, the calls it
    relays (so that a caller's ``Cancel`` follows them down)."""

    __slots__ = ("gates", "numbers", "relayed", "ups")

    def __init__(self) -> None:
        #: target → this process's bounded calls to that mesh's actors
        self.gates: dict[str, Gate] = {}
        #: as a relay, (target, origin) → the connection that origin's tree
        #: calls came on: where the credit for them goes back up
        self.ups: dict[tuple[str, str], Connection] = {}
        #: (target, address) → the number of the last call sent there
        self.numbers: dict[tuple[str, str], int] = {}
        #: (upstream connection, its request) → (downstream connection,
        #: request, target)
        self.relayed: dict[tuple[Connection, int], tuple[Connection, int, str]] = {}

    def number(self, target: str, addr: str) -> int:
        """The number of the next call to the actor of ``target`` at ``addr``."""
        key = (target, addr)
        n = self.numbers[key] = self.numbers.get(key, 0) + 1
        return n

    def forget(self, target: str) -> None:
        """The actor mesh ``target`` is stopped: drop its numbers (its
        calls still waiting for room go, to be refused)."""
        for key in [k for k in self.numbers if k[0] == target]:
            del self.numbers[key]
        for up in [k for k in self.ups if k[0] == target]:
            del self.ups[up]
        gate = self.gates.pop(target, None)
        if gate is not None:
            for addr in list(gate.used):
                gate.give(addr, -1)

    def cancel(self, up: Connection, req: int, expired: bool = False) -> bool:
        """The caller of relayed request ``req`` gave up (``expired``: its
        deadline passed): pass it down."""
        down = self.relayed.pop((up, req), None)
        if down is None:
            return False
        conn, down_req, target = down
        p = conn.pending.pop(down_req, None)
        if p is not None:
            p.cancel()
        conn.send_cancel(Cancel(down_req, target, expired))
        return True

    def lost(self, up: Connection) -> None:
        """The connection ``up`` is gone: cancel what it had relayed here."""
        for key in [k for k in self.relayed if k[0] is up]:
            self.cancel(*key)
        for origin in [k for k, conn in self.ups.items() if conn is up]:
            del self.ups[origin]

    def gone(self, addr: str) -> None:
        """The process at ``addr`` is gone (its connection was lost): the
        calls of ours its actors held went with it; those waiting for room
        there go on (to fail, or to its replacement)."""
        for gate in self.gates.values():
            if addr in gate.used:
                gate.give(addr, -1)


def _as_is(raw: Any, bufs: Buffers) -> tuple[Any, Buffers]:
    return raw, bufs


_KINDS: dict[type[BaseException], ErrorKind] = {SupervisionError: "supervision",
                                                 SchemaError: "schema", CallTimeout: "timeout"}


class _Answers:
    """The answers a relay sends up for one tree message, in
    :class:`Answers` messages: all at once when ``gather`` (a ``call``; but
    no later than :data:`GATHER_DELAY` after the first is in, so that one
    slow actor does not hold back the others), else as they come, at most
    one message per loop iteration.  A reply with out-of-band buffers (a
    tensor) goes up alone."""

    __slots__ = ("fails", "gather", "left", "replies", "timer", "up")

    def __init__(self, up: Connection, gather: bool) -> None:
        self.up = up
        self.gather = gather
        self.left = 0  # answers still to come (one more per call relayed)
        self.replies: list[tuple[int, Any]] = []
        self.fails: list[tuple[int, ErrorInfo]] = []
        self.timer: asyncio.TimerHandle | asyncio.Handle | None = None

    def add(self, req: int, value: Any, bufs: Buffers) -> None:
        self.left -= 1
        if isinstance(value, ErrorInfo):
            self.fails.append((req, value))
        elif bufs:
            self.up.send(encode_message(Reply(req, value)), out_buffers(bufs))
        else:
            self.replies.append((req, value))
        if not self.left:
            self.flush()
        elif self.timer is None:
            loop = self.up.rt.loop
            self.timer = (loop.call_later(GATHER_DELAY, self.flush) if self.gather
                          else loop.call_soon(self.flush))

    def flush(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        if self.replies or self.fails:
            self.up.send_message(Answers(self.replies, self.fails))
            self.replies, self.fails = [], []


class _Handed:
    """The ports opened in the caller that a tree message it sent here holds
    (:attr:`Fanout.ports`): the caller counts this relay among their
    holders for the processes it passes the message on to (not its own),
    until each call is answered or not (its process, or a relay below,
    gone before it answered); then the relay tells the caller which of
    them hold the ports from now on (:attr:`PortSend.released`): those that
    answered (or were passed a broadcast, which has no answers to wait
    for), whether they read the ports or not.  The caller counts those
    itself then, until they die, as the processes it hands a port to."""

    __slots__ = ("held", "left", "ports", "up")

    def __init__(self, up: Connection, ports: tuple[int, ...]) -> None:
        self.up = up
        self.ports = ports
        self.left = 0  # calls relayed still to answer
        self.held: list[str] = []  # the processes passed on to that hold the ports now

    def settle(self, callee: str, unanswered: bool) -> None:
        self.left -= 1
        if not unanswered:
            self.held.append(callee)
        if not self.left:
            self.release()

    def release(self) -> None:
        holders = tuple(self.held)
        for port in self.ports:
            self.up.send_message(PortSend(port, MSGPACK_NIL, released=True, holders=holders))


class Relayed(Pending):
    """A call this process relays to the actor at ``addr`` (through a relay
    of its host, or to it): its answer goes back up as it came (and settles
    ``handed``, if its message holds ports)."""

    __slots__ = ("answers", "handed", "rt", "up", "up_req")

    def __init__(self, rt: Runtime, up: Connection, up_req: int, target: str, addr: str,
                 answers: _Answers, handed: _Handed | None) -> None:
        fut: asyncio.Future[Any] = rt.loop.create_future()
        super().__init__(fut, _as_is, "a call relayed by the fan-out tree", target, addr)
        self.rt = rt
        self.up = up
        self.up_req = up_req
        self.answers = answers
        answers.left += 1
        self.handed = handed
        if handed is not None:
            handed.left += 1
        fut.add_done_callback(self._answer)

    @property
    def callee(self) -> str:
        addr: str = self.point
        return addr

    @property
    def target(self) -> str:
        # (so that a process found not responding is told to cancel it:
        # Connection.fail_all(cancel=True))
        return self.mesh

    def fail(self, info: ErrorInfo) -> None:
        if not self.done():
            self.set_result(info)

    def _answer(self, fut: asyncio.Future[Any]) -> None:
        self.rt.fanout.relayed.pop((self.up, self.up_req), None)
        if self.handed is not None:
            self.handed.settle(self.callee, _unanswered(fut))
        if fut.cancelled():  # its caller gave up
            self.answers.left -= 1
            return
        exc = fut.exception()
        if exc is not None:
            self.answers.add(self.up_req, ErrorInfo(
                _KINDS.get(type(exc), "protocol"), type(exc).__name__, str(exc),
                actor=getattr(exc, "actor", "") or "", rank=getattr(exc, "rank", -1)), [])
        elif isinstance(result := fut.result(), ErrorInfo):
            self.answers.add(self.up_req, result, [])
        else:
            raw, bufs = result
            self.answers.add(self.up_req, raw, bufs)


def _unanswered(fut: asyncio.Future[Any]) -> bool:
    """Whether a relayed call ended without an answer of its actor: its
    process, or a relay below, gone (a supervision error).  A call given
    up by its caller counts as answered: its process may have read it."""
    if fut.cancelled():
        return False
    exc = fut.exception()
    if exc is not None:
        return isinstance(exc, SupervisionError)
    result = fut.result()
    return isinstance(result, ErrorInfo) and result.kind == "supervision"


def malformed(msg: Fanout) -> str | None:
    """What is wrong with a tree message whose parts do not fit together
    (None: nothing).  Only a faulty or hostile peer sends one."""
    if msg.width < 1:
        return f"fan-out width {msg.width} (at least 1)"
    if msg.lo < 0 or msg.first_req < 0:
        return f"negative host {msg.lo} or request {msg.first_req}"
    if not any(msg.relays):
        return "no relay for any of its hosts"
    hosts = [host for host, _ in msg.groups]
    if any(not msg.lo <= h < msg.lo + len(msg.relays) for h in hosts):
        return f"hosts {hosts} outside its range {msg.lo}..{msg.lo + len(msg.relays) - 1}"
    if any(a >= b for a, b in itertools.pairwise(hosts)):
        return f"hosts {hosts} not in increasing order"
    return None


def refuse(up: Connection, msg: Fanout, why: str) -> None:
    """Fail every call of the tree message ``msg`` back to its sender with a
    ``ProtocolError`` saying ``why`` (a broadcast's is reported, and the
    sender logs it).  A call this relay already answered is not failed
    again: its caller has its answer."""
    info = ErrorInfo("protocol", "ProtocolError", why)
    if msg.first_req:
        n = sum(len(addrs) for _, addrs in msg.groups)
        up.send_message(Answers([], [(msg.first_req + k, info) for k in range(n)]))
    else:
        up.send_message(Fail(0, info))


def relay(rt: Runtime, up: Connection, msg: Fanout, bufs: Buffers,
          post: Callable[[Connection, Call, Buffers], None]) -> None:
    """Serve a tree message: call the actors of this host (``post`` delivers
    to the one in this process) and hand each range of the other hosts down
    to its relay.  A malformed one fails each of its calls with a
    ``ProtocolError``; the connection serves on.

    The call of this process's own actor is posted last: a call that finds
    its actor idle runs at once (:meth:`meshio._cell.ActorCell.post`), and
    an endpoint computing without an ``await`` would otherwise hold back
    the calls of every other process of the subtree until it returned."""
    why = malformed(msg)
    if why is not None:
        why = f"malformed fan-out message for {msg.target}.{msg.method}: {why}"
        log.warning("meshio: %s, from %s", why, up.who)
        refuse(up, msg, why)
        if msg.ports:  # (passed on to none)
            _Handed(up, msg.ports).release()
        return
    origin = msg.origin or up.peer or ""
    if msg.bounded:
        rt.fanout.ups[msg.target, origin] = up
    answers = _Answers(up, msg.gather)
    handed = _Handed(up, msg.ports) if msg.ports else None
    # (a broadcast's: the processes it is passed on to hold its ports from the send on)
    broadcast = handed if handed is not None and not msg.first_req else None
    lo, relays = msg.lo, msg.relays
    own = lo + next(i for i, r in enumerate(relays) if r)  # the parent sent it here
    out = out_buffers(bufs)
    offsets: dict[int, int] = {}  # host → position of its first call in the message
    pos = 0
    for host, addrs in msg.groups:
        offsets[host] = pos
        pos += len(addrs)

    def up_req(k: int) -> int:
        return msg.first_req + k if msg.first_req else 0

    def call(req: int, seq: int) -> Call:
        # (the deadline as it came: this relay's own delay is microseconds)
        return Call(req, msg.target, msg.method, msg.args, msg.chain, seq=seq, origin=origin,
                    deadline=msg.deadline, bounded=msg.bounded, trace=msg.trace)

    mine: Call | None = None
    for host, calls in msg.groups:
        if host != own:
            continue
        for k, (addr, seq) in enumerate(calls, offsets[host]):
            if addr == relays[own - lo]:
                mine = call(up_req(k), seq)
                continue
            conn = _live(rt, up, addr, [up_req(k)], [addr], msg.target, answers, handed)
            if conn is not None:
                req = _relayed(rt, up, conn, up_req(k), msg.target, addr, answers, handed)
                conn.call(call(req, seq), out)
                if broadcast is not None:
                    broadcast.held.append(addr)
    for a, b in split(lo, own, msg.width) + split(own + 1, lo + len(relays), msg.width):
        part = [(host, addrs) for host, addrs in msg.groups if a <= host < b]
        if not part:
            continue
        reqs = [up_req(k) for k in range(offsets[part[0][0]],
                                         offsets[part[0][0]] + sum(len(g) for _, g in part))]
        child = next((r for r in relays[a - lo:b - lo] if r), "")
        callees = [addr for _, calls in part for addr, _ in calls]
        conn = _live(rt, up, child, reqs, callees, msg.target, answers, handed)
        if conn is None:
            continue
        first = 0
        for r, callee in zip(reqs, callees) if msg.first_req else ():
            req = _relayed(rt, up, conn, r, msg.target, callee, answers, handed)
            first = first or req
        conn.send(encode_message(Fanout(
            msg.target, msg.method, msg.args, msg.chain, origin, first, a,
            relays[a - lo:b - lo], part, msg.width, msg.gather, msg.deadline,
            msg.trace, msg.bounded)), out)
        if broadcast is not None:
            broadcast.held.extend(callees)
    if broadcast is not None:
        broadcast.release()  # (no answers to wait for)
    if mine is not None:
        post(up, mine, bufs)


def _relayed(rt: Runtime, up: Connection, conn: Connection, up_req: int, target: str,
             addr: str, answers: _Answers, handed: _Handed | None) -> int:
    """A request on ``conn`` whose answer goes up as ``up_req`` (0: none wanted)."""
    if not up_req:
        return 0
    req = conn.next_req(Relayed(rt, up, up_req, target, addr, answers, handed))
    rt.fanout.relayed[(up, up_req)] = (conn, req, target)
    return req


def _live(rt: Runtime, up: Connection, addr: str, up_reqs: list[int], callees: list[str],
          target: str, answers: _Answers, handed: _Handed | None) -> Connection | None:
    """The connection to ``addr``, which carries the calls ``up_reqs`` to
    the actors at ``callees``; None if it is known dead (or no process of
    a range is left: ``addr`` empty), its calls then answered with why."""
    dead = rt.dead.get(addr) if addr else None
    if addr and dead is None:
        return rt.conns.get(addr) or rt.connect(addr)
    for r, callee in zip(up_reqs, callees):
        if r:
            p = Relayed(rt, up, r, target, callee, answers, handed)
            if dead is None:
                error = SupervisionError(
                    f"{target}: no process left on the hosts of this part of the fan-out "
                    "tree", actor=target, cause="no process left")
            else:  # (the relay's failure, not the callee's)
                error = dead(p) if callee == addr else lost_with_relay(p, dead(p), addr,
                                                                        callee in rt.dead)
            p.set_exception(error)
    return None


class Order:
    """Numbered calls (``Call.seq``) run in their order, by (target, caller)."""

    __slots__ = ("held", "next", "rt")

    def __init__(self, rt: Runtime) -> None:
        self.rt: Runtime = rt
        #: the number of the next call to run, by (target, caller)
        self.next: dict[tuple[str, str], int] = {}
        #: calls that came early, by (target, caller), by number
        self.held: dict[tuple[str, str], dict[int, tuple[Connection, Call, Buffers]]] = {}

    def admit(self, conn: Connection, msg: Call, bufs: Buffers,
              post: Callable[[Connection, Call, Buffers], None]) -> None:
        """Run ``msg`` now with ``post`` if its turn has come (then the held
        calls that follow it), or hold it until then."""
        key = (msg.target, msg.origin or conn.peer or "")
        expected = self.next.get(key)
        if expected is None and (msg.seq == 1 or self.rt.incarnation.replacement):
            # the first call from this caller; in a replacement process, the
            # first since the restart: the count starts here
            expected = msg.seq
        elif expected is None:
            expected = 1
        if msg.seq <= expected:  # its turn (or behind it, after a lost call: no waiting)
            if msg.seq == expected:
                self.next[key] = msg.seq + 1
            post(conn, msg, bufs)
            held = self.held.get(key)
            if held is not None:
                self._release(key, held, post)
            return
        self.next[key] = expected
        held = self.held.get(key)
        if held is None:
            held = self.held[key] = {}
            self.rt.loop.call_later(HOLD_TIMEOUT, self._give_up, key, held, post)
        held[msg.seq] = (conn, msg, bufs)

    def _release(self, key: tuple[str, str], held: dict[int, tuple[Connection, Call, Buffers]],
                 post: Callable[[Connection, Call, Buffers], None]) -> None:
        n = self.next[key]
        while n in held:
            post(*held.pop(n))
            n += 1
        self.next[key] = n
        if not held:
            del self.held[key]

    def _give_up(self, key: tuple[str, str], held: dict[int, tuple[Connection, Call, Buffers]],
                 post: Callable[[Connection, Call, Buffers], None]) -> None:
        if self.held.get(key) is not held:
            return
        log.warning("meshio: calls %s from %s to %s did not arrive within %g s (lost with a "
                    "relay of the fan-out tree that failed?); the calls after them run without "
                    "them", f"{self.next[key]}..{min(held) - 1}", key[1], key[0], HOLD_TIMEOUT)
        del self.held[key]
        for n in sorted(held):
            post(*held[n])
        self.next[key] = max(held) + 1

    def forget(self, target: str) -> None:
        """The actor ``target`` of this process is stopped: drop its counts."""
        for key in [k for k in self.next if k[0] == target]:
            del self.next[key]
            self.held.pop(key, None)
