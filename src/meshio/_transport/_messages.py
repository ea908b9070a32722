"""Control messages: frozen, tagged msgspec Structs in one union, one decoder.

Payload fields (arguments, results) are ``msgspec.Raw``: encoded once by the
sender with the endpoint's schema and decoded by the receiver with its own
typed decoder, so the control decoder never looks inside them.
"""

from __future__ import annotations

from typing import Literal, TypeAlias

import msgspec

from .._constants import MAX_QUEUED, STALL_AFTER

__all__ = (
    "ActorStopped",
    "Adopt",
    "AgentBeat",
    "AgentBeatAck",
    "Answers",
    "Call",
    "Cancel",
    "Credit",
    "DebugIO",
    "DebugIOKind",
    "DebugPaused",
    "ErrorInfo",
    "ErrorKind",
    "Fail",
    "Fanout",
    "Fault",
    "Fill",
    "Filled",
    "GetStacks",
    "GetStats",
    "Hello",
    "JobStacks",
    "LaunchWorker",
    "LogEntry",
    "LogRecords",
    "LoopHeld",
    "Message",
    "Moved",
    "PeerDown",
    "PeerUp",
    "Ping",
    "Pong",
    "PortSend",
    "Probe",
    "RdmaOp",
    "RdmaOpName",
    "Reply",
    "Reshaped",
    "ServeDashboard",
    "Restored",
    "Shutdown",
    "SignalWorker",
    "SpawnActor",
    "Stalled",
    "Started",
    "StopActor",
    "Stream",
    "Transfer",
    "WatchWorker",
    "WorkerExited",
    "WorkerOutput",
    "decode_message",
    "encode_message",
)


class _Msg(msgspec.Struct, frozen=True, array_like=True, tag=True, gc=False):
    """Base of control messages.  Subclasses repeat ``frozen=True`` (msgspec
    inherits it, but mypy's dataclass_transform needs it on each class)."""


class Hello(_Msg, frozen=True, tag=1):
    """First message on every connection: who is speaking.  ``listen``:
    where it listens when not at ``addr`` (a replacement worker)."""

    addr: str
    pid: int
    worker: str = ""
    listen: str = ""


class Call(_Msg, frozen=True, tag=2):
    """Invoke ``method`` on the actor of mesh ``target`` hosted by the receiver.

    ``req`` 0 means no reply is wanted (broadcast).  ``chain`` names the
    actors waiting on this call, outermost first (``"<target>[<rank>]"``,
    with ``"#<n>"`` when the waiting call holds that actor's mailbox: its
    n-th mailbox call); the callee fails a call that would deadlock.

    ``seq`` numbers the calls from the caller at ``origin`` (empty: the
    connection's peer) to this actor when they may take different paths
    (direct, or through the fan-out tree: :mod:`._fanout`); the receiver
    runs them in that order.  0: not numbered (a one-host mesh).

    ``deadline``: seconds the caller still waits for the answer, as sent
    (None: no deadline); a duration, not a time, so hosts need no common
    clock.  The callee drops the call if that passed before it ran.

    ``bounded``: the caller counted this call against the actor's mailbox
    bound; the callee gives it back (:class:`Credit`) once it has left the
    mailbox (:mod:`._credit`).

    ``trace``: the caller's span as a W3C ``traceparent`` ("" : none; see
    :mod:`meshio._tracing`, the ``otel`` extra).
    """

    req: int
    target: str
    method: str
    args: msgspec.Raw
    chain: tuple[str, ...] = ()
    seq: int = 0
    origin: str = ""
    deadline: float | None = None
    bounded: bool = False
    trace: str = ""


class Reply(_Msg, frozen=True, tag=3):
    req: int
    value: msgspec.Raw


#: what went wrong remotely; each kind is one exception type at the caller
#: (``error_from_info``); a frame with any other kind does not decode
ErrorKind: TypeAlias = Literal["actor", "schema", "unknown_actor", "unknown_endpoint",
                               "deadlock", "rdma", "supervision", "protocol", "timeout"]
#: the two directions of a one-sided transfer
Transfer: TypeAlias = Literal["read", "write"]
#: what an :class:`RdmaOp` asks of the buffer's owner
RdmaOpName: TypeAlias = Literal["read", "write", "drop", "connect"]


class ErrorInfo(msgspec.Struct, frozen=True, array_like=True, gc=False):
    """What went wrong remotely; the caller turns it into an exception."""

    kind: ErrorKind
    type_name: str
    message: str
    traceback: str = ""
    actor: str = ""
    rank: int = -1
    #: qualified names of the remote exception's base classes, nearest first,
    #: without ``Exception``, ``BaseException`` and ``object``: the caller's
    #: error is an instance of the first it has loaded (kind "actor"; a
    #: default, so an older peer's frames still decode)
    bases: tuple[str, ...] = ()


class Fail(_Msg, frozen=True, tag=4):
    req: int
    error: ErrorInfo


class SpawnActor(_Msg, frozen=True, tag=5):
    """Create the actor of mesh ``target`` at ``rank`` of a mesh shaped
    ``labels``/``sizes``; ``mesh`` is the pickled full-mesh reference."""

    req: int
    target: str
    name: str
    cls: bytes
    rank: int
    labels: list[str]
    sizes: list[int]
    mesh: bytes
    args: msgspec.Raw
    #: rebuilt by a supervisor after a failure (runs the ``on_restart`` hook)
    restart: bool = False
    #: the hosting process's rank in its proc mesh (``context().proc.rank``);
    #: -1: same as ``rank``
    proc_rank: int = -1
    #: seconds a call may run before the actor reports it stalled
    stall_after: float = STALL_AFTER
    #: calls each caller may have waiting in the actor's mailbox
    max_queued: int = MAX_QUEUED


class StopActor(_Msg, frozen=True, tag=6):
    """Stop the actor of mesh ``target`` here (``req`` 0: no answer is
    awaited); ``whole``: every actor of the mesh is stopped with it, so
    nothing of the mesh stays in the receiver (its own calls' windows)."""

    req: int
    target: str
    whole: bool = False


class PortSend(_Msg, frozen=True, tag=7):
    """A value for the port ``port`` owned by the receiver; ``close`` ends it;
    ``held``: no value, the sender now holds the port (it can send: once
    every process that held it is gone, ``recv`` stops waiting);
    ``released``: no value, the sender, a relay of the fan-out tree, no
    longer answers for the processes it passed one tree message holding
    the port on to (:attr:`Fanout.ports`): those of them at ``holders``
    hold it from now on, as if the receiver had handed it to them itself
    (each answered a call, or was passed a broadcast); the others are gone
    without answering."""

    port: int
    value: msgspec.Raw
    close: bool = False
    held: bool = False
    released: bool = False
    holders: tuple[str, ...] = ()


class Fault(_Msg, frozen=True, tag=8):
    """An actor failed with no caller to tell (broadcast, failing hook), or
    was ended by what an endpoint raised (``stopped``: ``SystemExit``,
    ``KeyboardInterrupt``; its process goes on serving its other actors)."""

    error: ErrorInfo
    stopped: bool = False


class Shutdown(_Msg, frozen=True, tag=9):
    pass


class Ping(_Msg, frozen=True, tag=10):
    """Heartbeat from a supervising controller; answered with Pong at once."""

    seq: int


class Pong(_Msg, frozen=True, tag=11):
    seq: int


class Restored(_Msg, frozen=True, tag=12):
    """A restarted worker has all its actors back; ``lost`` names temporary
    actors that were not rebuilt."""

    lost: list[str]


class RdmaOp(_Msg, frozen=True, tag=13):
    """A transfer on a registered buffer, served by the owner's runtime (not
    its actors): ``op`` is "read" (reply carries ``length`` bytes from
    ``offset``), "write" (the frame's buffer goes to ``offset``), "drop", or
    "connect" (ibverbs queue-pair set-up, ``info`` holds the peer's side)."""

    req: int
    op: RdmaOpName
    buf: int
    token: int
    offset: int = 0
    length: int = 0
    info: bytes = b""


class Cancel(_Msg, frozen=True, tag=14):
    """The caller of ``req`` (a Call to the actor of mesh ``target`` on this
    connection) gave up: drop it if still queued, cancel it if running.  No
    reply.  ``expired``: it gave up because the call's deadline passed."""

    req: int
    target: str
    expired: bool = False


class Probe(_Msg, frozen=True, tag=47):
    """A deadlock probe (edge chasing), for the actor of mesh ``target``
    here.  Searching (not ``found``): the mailbox call ``waiter``
    (``"<target>[<rank>]#<n>"``) waits for a call to this actor; ``path``
    lists the mailbox calls the probe passed, each waiting for the next
    (``addrs``: the address of each one's process), from the actor where a
    call with chain ``goal`` queued behind the first.  If ``waiter``'s call
    is queued here or under way and this actor's mailbox call is in
    ``goal``, the probe went round a cycle: it goes, ``found``, to one
    actor of ``path``, which breaks the cycle.  No reply."""

    target: str
    waiter: str
    goal: tuple[str, ...]
    path: tuple[str, ...]
    addrs: tuple[str, ...]
    found: bool = False


class PeerDown(_Msg, frozen=True, tag=15):
    """From the process running the heartbeats of ``addr``'s proc mesh: the
    process at ``addr`` (rank ``rank`` of proc mesh ``mesh``, pid ``pid`` on
    ``host``) has left heartbeats unanswered for ``silent`` seconds (more than
    ``timeout``); calls to it fail until :class:`PeerUp`.

    ``gone``: it is gone, not merely silent, for this reason (its host was
    downed: cut off past ``partition_timeout``, so nothing closes the
    connections to it): the receiver also drops its connections to it, failing
    the calls in flight there."""

    addr: str
    mesh: str
    rank: int
    pid: int
    host: str
    silent: float
    timeout: float
    gone: str = ""


class PeerUp(_Msg, frozen=True, tag=16):
    """The process at ``addr`` is no longer "not responding" (it answers
    again, or it is gone and its connection says so)."""

    addr: str


class LaunchWorker(_Msg, frozen=True, tag=17):
    """Controller → host agent: start a worker process (answered with its
    pid), listening on a TCP port the agent picks.  ``addr``: the address it
    answers to (a replacement: its predecessor's; empty: where it listens).
    ``bootstrap`` is the pickled setup function (empty: none)."""

    req: int
    worker: str
    addr: str
    controller: str
    env: dict[str, str]
    restart: bool = False
    label: str = ""
    bootstrap: bytes = b""
    #: seconds the agent keeps the worker while it has no contact with this
    #: controller (:class:`AgentBeat`) before it kills it (self-fencing);
    #: None: never (``spawn_procs(partition_timeout=...)``)
    partition_timeout: float | None = None
    #: ``spawn_procs(keep_alive=...)``: seconds it outlives a lost controller
    keep_alive: float | None = None


class SignalWorker(_Msg, frozen=True, tag=18):
    """Controller → host agent: send ``sig`` to the worker ``worker``."""

    worker: str
    sig: int


#: which stream of a worker a :class:`WorkerOutput` carries
Stream: TypeAlias = Literal["stdout", "stderr"]


class WorkerOutput(_Msg, frozen=True, tag=19):
    """Host agent → controller: bytes its worker ``worker`` wrote."""

    worker: str
    stream: Stream
    data: bytes


class WorkerExited(_Msg, frozen=True, tag=20):
    """Host agent → controller: the worker ``worker`` ended with ``code``
    (negative: killed by that signal); ``start_failure``: what it reported
    when it could not start (its bootstrap raised)."""

    worker: str
    code: int
    start_failure: str = ""


class Fanout(_Msg, frozen=True, tag=21):
    """Call ``method`` on many actors of mesh ``target`` through the fan-out
    tree (:mod:`._fanout`).  The receiver relays for the hosts ``lo ..
    lo+len(relays)-1`` (``relays``: the address relaying for each, empty if
    none is left; the receiver is the first non-empty one).  ``groups``
    lists, by host in order, the processes to call there: address and the
    call's number (``Call.seq``).  The n-th of them (counting across groups)
    answers as request ``first_req + n`` on the connection this came in
    (``first_req`` 0: no answers, a broadcast).  ``origin`` is the caller
    (empty: the connection's peer); ``width`` bounds the messages each relay
    sends on.  The answers go back up in :class:`Answers`: all of a relay's
    at once when ``gather`` (a ``call``), else as they come (a ``stream``).
    ``deadline``, ``trace`` and ``bounded``: as in :class:`Call` (each
    actor gives the credit of a bounded call back to ``origin``).
    ``ports``: the ports opened in the sender that ``args`` holds, sent by
    their owner: the receiver answers for the processes it passes the
    message on to (not its own) until each call is answered or gone (at
    once for a broadcast), then tells the owner which of them hold the
    ports from now on (:attr:`PortSend.released`); it passes none on."""

    target: str
    method: str
    args: msgspec.Raw
    chain: tuple[str, ...]
    origin: str
    first_req: int
    lo: int
    relays: list[str]
    groups: list[tuple[int, list[tuple[str, int]]]]
    width: int
    gather: bool
    deadline: float | None = None
    trace: str = ""
    bounded: bool = False
    ports: tuple[int, ...] = ()


class Answers(_Msg, frozen=True, tag=22):
    """Answers to several requests made on this connection, sent together by
    a relay of the fan-out tree: ``replies`` as :class:`Reply` (without
    out-of-band buffers), ``fails`` as :class:`Fail`."""

    replies: list[tuple[int, msgspec.Raw]]
    fails: list[tuple[int, ErrorInfo]]


class Calls(_Msg, frozen=True, tag=43):
    """Calls made on this connection one after another in a turn of the
    sender's loop, after its first frame, sent together (each without
    out-of-band buffers): as many :class:`Call` messages, in order."""

    calls: list[Call]


class Moved(_Msg, frozen=True, tag=23):
    """From the controller: the process answering to ``addr`` now listens
    at ``listen`` (a replacement worker listens on a fresh name, never its
    predecessor's, which another user may have bound); dial it there.
    ``pid``: its pid, where ``listen`` is a Unix socket of the controller's
    host (0: unknown)."""

    addr: str
    listen: str
    pid: int = 0


class Fill(_Msg, frozen=True, tag=24):
    """From the receiver of a frame whose large parts travelled as
    descriptors (:mod:`._bulk`): write export ``export``'s parts, in order,
    at the addresses ``to`` in the receiver's memory, then say
    :class:`Filled`; ``to`` empty: the frame was refused, write nothing.
    Sent ahead of frames waiting behind the sender's own exports."""

    export: int
    to: list[int]


class Filled(_Msg, frozen=True, tag=44):
    """From the sender: export ``export``'s parts are written where
    :class:`Fill` asked; its frame may be delivered.  Nothing but ``Fill``,
    ``Ping`` and ``Pong`` comes between that frame and this."""

    export: int


#: what a reader asks of a weight store's owner (:class:`StoreOp`)
StoreOpName: TypeAlias = Literal["acquire", "release", "wait", "cancel"]


class StoreOp(_Msg, frozen=True, tag=25):
    """A request to the weight store ``store``, served by its owner's runtime
    (:mod:`meshio.store`): "acquire" the newest version (one from
    ``version`` on, waiting up to ``timeout`` seconds for it; < 0: no bound)
    and hold it until "release" of lease ``version``; "wait" until a
    version from ``version`` on exists and answer its number; "cancel":
    the reader gave request ``version`` (an "acquire" or "wait" on this
    connection) up, which, still waiting, is answered at once as timed
    out.  ``req`` 0: no answer.  ``host``: the reader's host (:data:`~._bulk.HOST_ID`);
    ``relay``: the reader's runtime address when it
    may relay the version to the other readers of its host ("": answer with
    a lease, never with another reader to read from)."""

    req: int
    op: StoreOpName
    store: str
    version: int = 0
    timeout: float = -1.0
    host: str = ""
    relay: str = ""


class GetStacks(_Msg, frozen=True, tag=26):
    """A request for the current Python stacks of the actors the receiver
    hosts (of actor mesh ``target``; empty: all of them), served by its
    runtime on its loop, not through the actors' mailboxes, so a busy
    actor answers too (:mod:`meshio._stacks`).  Answered with a
    :class:`Reply` holding a list of ``meshio.ActorStacks``."""

    req: int
    target: str = ""


class JobStacks(_Msg, frozen=True, tag=27):
    """From a ``meshio stacks`` client, on a controller's inspection
    listener (:meth:`~._runtime.Runtime.listen_inspection`): the stacks of
    every actor of the controller's proc meshes, each process given
    ``timeout`` seconds to answer.  Answered with a :class:`Reply` holding
    a ``meshio.Stacks`` (:mod:`meshio._inspect`)."""

    req: int
    timeout: float


class Stalled(_Msg, frozen=True, tag=28):
    """From a worker to the controller that started it: the call of
    ``endpoint`` on actor ``actor`` rank ``rank`` has run ``running_for``
    seconds, past its actor's ``stall_after``; ``stack``: where it is, as
    text.  Sent once per call."""

    actor: str
    rank: int
    endpoint: str
    running_for: float
    stall_after: float
    stack: str


class LoopHeld(_Msg, frozen=True, tag=45):
    """From a worker to the controller that started it: work that may hold
    its event loop for seconds (``what``: an actor being built,
    ``"w.__init__"``, whose constructor may hold the GIL; meshio's first
    ``import torch``, which a value holding a tensor needs) is about to
    begin (``held``), or is done (``held`` False).  Heartbeats judge it
    after ``HELD_TIMEOUTS`` timeouts meanwhile, not one."""

    held: bool
    what: str


class ActorStopped(_Msg, frozen=True, tag=46):
    """From a worker to the controller that started it: its actor of mesh
    ``target`` was stopped through a reference held elsewhere (an actor's,
    another controller's), so that the controller's record of the mesh
    says so (a restart does not rebuild it; the last one frees its name).
    Answered (``req``) once noted: the stop is answered after that."""

    req: int
    target: str


class GetStats(_Msg, frozen=True, tag=29):
    """A request for the metrics of the receiver's process and of the
    actors it hosts (CPU, memory, per endpoint calls, errors, queue and
    latency), served by its runtime on its loop like :class:`GetStacks`:
    a busy actor answers too (:mod:`meshio._metrics`).  Answered with a
    :class:`Reply` holding a ``meshio._metrics.ProcessReport``."""

    req: int


class Started(_Msg, frozen=True, tag=31):
    """Call ``req`` (on this connection) has started running in its actor:
    sent for calls of endpoints with a retry policy, so that a caller whose
    callee's process dies knows whether the call was running then (see
    ``Supervisor(poison_after=...)``)."""

    req: int


class Reshaped(_Msg, frozen=True, tag=32):
    """The actor mesh ``target`` grew or shrank (its proc mesh did): the
    actor in the receiving process is now at ``rank`` of a mesh shaped
    ``labels``/``sizes``; ``mesh`` is the pickled full-mesh reference."""

    target: str
    rank: int
    labels: list[str]
    sizes: list[int]
    mesh: bytes


class Credit(_Msg, frozen=True, tag=33):
    """From the process hosting the actor of mesh ``target`` (at ``addr``):
    ``n`` of the bounded calls (``Call.bounded``) of the receiver (or, with
    ``origin``, of the process that made them, the fan-out tree's relays
    passing it up) have left its mailbox, so it may send ``n`` more
    (:mod:`._credit`); ``n`` -1: the actor is stopped (a call found none),
    and the receiver's window for it goes."""

    target: str
    n: int
    origin: str = ""
    addr: str = ""


class LogEntry(msgspec.Struct, frozen=True, array_like=True, gc=False):
    """One ``logging`` record of a worker: its logger ``name`` and level,
    its ``message`` as text (``getMessage()`` and the formatted traceback:
    what is shown if ``record`` cannot be rebuilt), and ``record``, the
    pickled ``__dict__`` of the ``LogRecord`` (its ``msg``/``args`` formatted
    to text first when they cannot be pickled; empty when nothing could)."""

    name: str
    levelno: int
    message: str
    record: bytes


class LogRecords(_Msg, frozen=True, tag=30):
    """From a worker to the controller that started it: ``logging`` records
    emitted in it, in order (:mod:`meshio._logs`); ``label`` names the
    worker as its forwarded output does (``[trainers gpus=1]``);
    ``dropped``: records it dropped since its last batch because too many
    waited to be sent."""

    label: str
    records: list[LogEntry]
    dropped: int = 0


class ServeDashboard(_Msg, frozen=True, tag=42):
    """From a ``meshio dashboard`` client, on a controller's inspection
    listener: serve the controller's dashboard on ``host``:``port`` (0: any
    free port; one served already there for such a client is reused).
    Answered with a :class:`Reply` holding its URL, token included
    (:mod:`meshio._dashboard`)."""

    req: int
    port: int
    host: str


class DebugPaused(_Msg, frozen=True, tag=39):
    """From a worker's debug link to its controller (:mod:`meshio._debug`):
    ``breakpoint()`` paused actor ``actor`` rank ``rank`` (pid ``pid`` on
    ``host``, the process answering to ``addr``) at ``file``:``line`` in
    ``function``; the pdb session is ``session`` (numbered per process)."""

    session: int
    actor: str
    rank: int
    host: str
    pid: int
    addr: str
    function: str
    file: str
    line: int


#: what a :class:`DebugIO` carries: "open" (a ``meshio debug`` client
#: starts), "output" (text to show), "read" (text to show, then a line is
#: awaited), "input" (that line), "end" (the session or client is over)
DebugIOKind: TypeAlias = Literal["open", "output", "read", "input", "end"]


class DebugIO(_Msg, frozen=True, tag=40):
    """A pdb session's terminal, between a worker's debug link and the
    controller (``session``: its number) and between the controller and a
    ``meshio debug`` client on its inspection listener (``session`` 0).
    ``"open"``: a client starts; from the controller to a session's link, a
    client attached to it again (pdb shows where it stands and its prompt)."""

    session: int
    kind: DebugIOKind
    text: str = ""


class AgentBeat(_Msg, frozen=True, tag=37):
    """Controller → host agent, each beat while it has workers there with a
    ``partition_timeout``: ``seq`` numbers the beat, ``heard`` is the last
    :class:`AgentBeatAck` the controller received (0: none yet).  The agent
    answers at once; it counts its contact with the controller from when it
    sent the answer now heard (so it fences before the controller downs it,
    even when only one direction is cut)."""

    seq: int
    heard: int


class AgentBeatAck(_Msg, frozen=True, tag=38):
    """Host agent → controller: the answer to :class:`AgentBeat` ``seq``."""

    seq: int


class WatchWorker(_Msg, frozen=True, tag=36):
    """Controller → host agent: from now on, tell this connection of the
    worker ``worker`` (its output, its exit): a controller re-attached to a
    kept-alive proc mesh that another controller launched there.  Answered
    with a :class:`Reply` of the worker's pid, or of None (nil) if the agent
    has it no more (it has exited, or the agent is a later incarnation); a
    :class:`Fail` (type ``ProcMeshTakenError``) while another controller
    that watches it is connected."""

    req: int
    worker: str
    #: seconds the agent keeps the worker while it has no contact with this
    #: controller before it kills it, as :attr:`LaunchWorker.partition_timeout`
    #: (counted from now); None: never
    partition_timeout: float | None = None


class Adopt(_Msg, frozen=True, tag=35):
    """From a controller re-attaching to a kept-alive proc mesh
    (``this_host().reattach``) to each of its workers: the controller is now
    the one at ``controller``, which listens for this job's processes at
    ``listen``.  Answered with a :class:`Reply`, or a :class:`Fail` when the
    worker is not kept alive, or its controller is still connected (type
    ``ProcMeshTakenError``)."""

    req: int
    controller: str
    listen: str


Message = (Hello | Call | Reply | Fail | SpawnActor | StopActor | PortSend | Fault | Shutdown
           | Ping | Pong | Restored | RdmaOp | Cancel | PeerDown | PeerUp | LaunchWorker
           | SignalWorker | WorkerOutput | WorkerExited | Fanout | Answers | Calls | Moved | Fill
           | StoreOp | GetStacks | JobStacks | Stalled | LoopHeld | GetStats | LogRecords | Started
           | Reshaped | ServeDashboard | DebugPaused | DebugIO | AgentBeat | AgentBeatAck
           | Adopt | WatchWorker | Credit | Filled | ActorStopped | Probe)

_decoder = msgspec.msgpack.Decoder(Message)
_encoder = msgspec.msgpack.Encoder()

decode_message = _decoder.decode
encode_message = _encoder.encode
