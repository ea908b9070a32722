"""The records of kept-alive proc meshes: how a new controller finds the
workers of ``spawn_procs(name=..., keep_alive=...)`` after the controller
that started them is gone, and proves it may talk to them.

A controller publishes one file per kept-alive proc mesh,
``<inspection dir>/procs/<name>.json`` (the directory of ``meshio stacks``'
files, :func:`~meshio._inspect.inspection_dir`: mode 0700, the file 0600,
so only this user reads it): the mesh's name, id and shape, its job secret,
each worker's address, listening name and pid, its ``spawn_procs`` options,
and per actor mesh its name, class and constructor arguments (to rebuild its
actors when a supervisor replaces a process), and the actor meshes whose
spawn is under way.  It is rewritten as the mesh changes (spawns,
restarts, grow/shrink) and removed when the mesh is stopped normally.

The name is the mesh's from the moment ``spawn_procs`` is called
(:func:`claim` writes the record then, with no workers yet) until the mesh
is stopped, or until its controller and its workers are all gone: a second
spawn of the name is refused meanwhile.  Records are checked and written
under a ``flock`` of their directory (:func:`_records_locked`), so that a
check of who has a name and the write that follows are one step: two spawns
at once never both take it, and a controller rewrites its record only while
the name is still its mesh's (:func:`publish`).

Re-attaches of one mesh take turns (:func:`reattaching`: ``<name>.lock``
beside the record, locked with ``flock``, there while one holds it or waits
for it), so that two controllers, or two tasks of one, never each adopt
some of its workers: the one that waited finds it taken
(:class:`~meshio.ProcMeshTakenError`), or, the other's re-attach failed,
tries in its turn.

Here too the check of a proc mesh's name (:func:`check_name`), for every
``spawn_procs`` and ``reattach``: it is part of its workers' socket
addresses, and a kept-alive one's file name.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import reprlib
import time
from collections.abc import AsyncGenerator, Generator
from pathlib import Path
from typing import Final

import msgspec

from ._exceptions import ProcMeshTakenError, UnknownProcMeshError
from ._flock import flocked_file
from ._inspect import private_dir
from ._transport._sockets import sockaddr

__all__ = ("KeptActor", "KeptMesh", "KeptOptions", "KeptWorker", "check_name", "claim",
           "forget", "lookup", "publish", "reattaching", "started_at")

log = logging.getLogger("meshio")


class KeptWorker(msgspec.Struct, frozen=True):
    """One process of a kept-alive proc mesh."""

    rank: int
    worker: str
    #: the address it answers to, and where it listens (differs for a replacement)
    addr: str
    listen: str
    pid: int
    host: str


class KeptActor(msgspec.Struct, frozen=True):
    """One actor mesh spawned on a kept-alive proc mesh."""

    name: str
    target: str
    #: its class, as ``module`` and ``qualname`` (to check the class the new
    #: controller names) and pickled (to rebuild its actors)
    module: str
    qualname: str
    cls: bytes
    #: the packed constructor arguments (None: they held out-of-band
    #: buffers, which the record does not keep; its actors are not rebuilt)
    body: bytes | None
    labels: list[str]
    sizes: list[int]
    ranks: list[int]
    restart: str
    stall_after: float


class KeptOptions(msgspec.Struct, frozen=True):
    """The ``spawn_procs`` options of a kept-alive proc mesh, which a
    re-attach keeps (the heartbeats' are a supervisor's if one watched it)."""

    restart: str | None
    #: seconds, or ``"brutal_kill"``
    shutdown: float | str
    heartbeat_interval: float
    heartbeat_timeout: float
    partition_timeout: float


class KeptMesh(msgspec.Struct, frozen=True):
    """What a new controller needs to re-attach to a proc mesh."""

    name: str
    id: str
    #: the secret its processes on this host prove, hex (a job's hosts prove
    #: the job's own credentials); the record is this user's only
    secret: str
    labels: list[str]
    sizes: list[int]
    keep_alive: float
    env: dict[str, str]
    bootstrap: bytes
    log_records: bool
    log_dir: str | None
    #: the controller that wrote it last, and when (wall clock)
    controller_pid: int
    written: float
    #: its processes (none yet: its controller is starting them, :func:`claim`)
    workers: list[KeptWorker]
    actors: list[KeptActor]
    #: actor meshes spawned on it so far (:meth:`ProcState.new_target`)
    spawns: int = 0
    #: its options (None: a record of an older meshio, which kept none; the
    #: defaults apply)
    options: KeptOptions | None = None
    #: the targets of actor meshes whose spawn is under way (a re-attach
    #: stops their actors: the spawn never returned them to anyone)
    spawning: list[str] = []
    #: when the controller that wrote it started (:func:`started_at`; 0: a
    #: record of an older meshio, whose controller does not count)
    controller_started: int = 0


_decode = msgspec.json.Decoder(KeptMesh).decode


def _dir() -> Path:
    path = private_dir() / "procs"
    path.mkdir(mode=0o700, exist_ok=True)
    return path


def _path(name: str) -> Path:
    return _dir() / f"{name}.json"


#: seconds a check or write of the records waits for another process's
#: (:func:`_records_locked`) before it gives up
RECORDS_WAIT: Final = 5.0

#: ``sizeof(sockaddr_un.sun_path)`` on Linux: the bytes of a Unix socket
#: address (an abstract name's leading NUL counts; a path needs a NUL after it)
SUN_PATH: Final = 108


def _longest_worker_addr(namespace: str, name: str) -> str:
    """The longest Unix address a worker of the proc mesh ``name`` listens at,
    made as :meth:`ProcState._spec` makes it, ``<namespace>/<mesh id>-<rank>``
    (the mesh id is ``<name>-<8 hex>``; ``g<n>`` after the n-th grow), and
    for a replacement as :meth:`WorkerSpec.restarted` does, ``.<16 hex>``
    after it; with room for ranks below 10**6 and 999 grows."""
    return f"{namespace}/{name}-{'0' * 8}-999999g999.{'0' * 16}"


def name_limit(namespace: str) -> int:
    """The most bytes (UTF-8) a proc mesh's name may have, for the Unix
    addresses of its workers, whose runtimes' names begin with ``namespace``
    (``runtime().namespace``), to fit in :data:`SUN_PATH`."""
    addr = os.fsencode(sockaddr(_longest_worker_addr(namespace, "")))
    return SUN_PATH - len(addr) - (0 if addr.startswith(b"\0") else 1)


def check_name(name: object, where: str, namespace: str, *, kept: bool) -> str:
    """``name`` checked as the name of a proc mesh (``spawn_procs(name=...)``,
    ``reattach(name)``; ``where`` names the function): it is part of its
    workers' Unix socket addresses (under ``namespace``: :func:`name_limit`),
    and, ``kept`` alive, the name of a file.

    Raises:
        TypeError: not a ``str``.
        ValueError: with a NUL, too long for the socket addresses; ``kept``:
            empty, with ``/``, or with a leading dot.
    """
    if not isinstance(name, str):
        raise TypeError(f"{where}: name must be a str, got {type(name).__name__} {name!r}")
    if "\0" in name:
        raise ValueError(f"{where}: a proc mesh's name cannot have a NUL character, got {name!r}")
    try:
        size = len(name.encode())
    except UnicodeEncodeError as e:  # (a lone surrogate: os.fsdecode of bytes not UTF-8)
        raise ValueError(f"{where}: a proc mesh's name must be text UTF-8 can encode, got "
                         f"{name!r}: {e.reason}") from None
    limit = name_limit(namespace)
    if size > limit:
        raise ValueError(
            f"{where}: proc mesh name {reprlib.repr(name)} is {size} bytes long; at most "
            f"{limit} fit (UTF-8 bytes: one per ASCII character), since its workers listen "
            f"at Unix socket addresses of at most {SUN_PATH} bytes that hold it "
            f"({_longest_worker_addr(namespace, '<name>')!r} at the longest); choose a "
            f"shorter name")
    if kept and (not name or "/" in name or name.startswith(".")):
        raise ValueError(f"{where}: a kept-alive proc mesh's name is a file name: "
                         f"non-empty, without '/' or NUL, not starting with '.'; got {name!r}")
    return name


@contextlib.contextmanager
def _records_locked() -> Generator[Path]:
    """Hold the ``flock`` of the records' directory (given): the checks and
    writes of records take turns, so that each is one step with the write or
    removal that follows it.  Waited for without the event loop (a holder
    only reads and writes a few small files), :data:`RECORDS_WAIT` seconds
    at most: a holder stopped (SIGSTOP, Ctrl-Z) does not hold every other
    controller's loop.

    Raises:
        OSError: another process held it all that time.
    """
    folder = _dir()
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        until, pause = time.monotonic() + RECORDS_WAIT, 0.001
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= until:
                    raise OSError(errno.EWOULDBLOCK, f"another process has held the lock of "
                                  f"the kept-alive records ({folder}) for {RECORDS_WAIT:g} s "
                                  f"(is it stopped?)") from None
                time.sleep(pause)
                pause = min(2 * pause, 0.05)
        yield folder
    finally:
        os.close(fd)  # (lets the lock go)


def started_at(pid: int) -> int | None:
    """When process ``pid`` started (clock ticks after boot, as
    ``/proc/<pid>/stat`` says: with the pid, it names one process, not
    another that reused the pid); None if it does not run."""
    try:
        # (the fields after the command's closing parenthesis: state is the
        # 3rd field of the line, starttime the 22nd)
        fields = Path(f"/proc/{pid}/stat").read_bytes().rpartition(b")")[2].split()
    except OSError:
        return None
    return None if fields[0] == b"Z" else int(fields[19])  # (a zombie has exited)


def _alive(record: KeptMesh) -> bool:
    """Whether the mesh of ``record`` still lives: the controller that wrote
    it runs (it may be starting the workers, or replacing them), or a worker
    of it does (its pid runs ``meshio.worker`` as that worker, not a process
    that reused the pid)."""
    if record.controller_started and started_at(record.controller_pid) == \
            record.controller_started:
        return True
    for w in record.workers:
        try:
            cmdline = Path(f"/proc/{w.pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"meshio.worker" in cmdline and w.worker.encode() in cmdline:
            return True
    return False


def _read(path: Path) -> KeptMesh | None:
    try:
        return _decode(path.read_bytes())
    except (OSError, msgspec.ValidationError, msgspec.DecodeError):
        return None  # gone meanwhile, being replaced, or not ours to read


def _live() -> dict[str, KeptMesh]:
    """The kept-alive proc meshes of this user on this host, by name; the
    records of meshes gone (:func:`_alive`) are removed."""
    found: dict[str, KeptMesh] = {}
    with _records_locked() as folder:
        for path in sorted(folder.glob("*.json")):
            record = _read(path)
            if record is None:
                continue
            if _alive(record):
                found[record.name] = record
            else:
                path.unlink(missing_ok=True)
    return found


def _by(record: KeptMesh) -> str:
    """The controller that wrote ``record``, as errors name it."""
    return "this process" if record.controller_pid == os.getpid() \
        else f"the controller with pid {record.controller_pid}"


def lookup(name: str) -> KeptMesh:
    """The record of the kept-alive proc mesh ``name``.

    Raises:
        UnknownProcMeshError: there is none (the message lists those there are).
        ProcMeshTakenError: a controller is starting it.
    """
    live = _live()
    record = live.get(name)
    if record is not None and not record.workers:
        raise ProcMeshTakenError(
            f"reattach({name!r}): proc mesh {name!r} is being started by {_by(record)}; it "
            f"serves that controller once started. Re-attach once that controller is gone, "
            f"or stop the mesh from there", actor=name, cause="being started")
    if record is None:
        names = ", ".join(repr(n) for n in live) or "none"
        raise UnknownProcMeshError(
            f"reattach({name!r}): no proc mesh named {name!r} is kept alive on this host "
            f"for this user (kept-alive proc meshes: {names}); spawn it with "
            f"spawn_procs(name={name!r}, keep_alive=...), and re-attach before its "
            f"keep_alive runs out")
    return record


@contextlib.asynccontextmanager
async def reattaching(record: KeptMesh) -> AsyncGenerator[KeptMesh]:
    """Hold the re-attach lock of the kept-alive proc mesh of ``record``
    (what :func:`lookup` found), waiting while another re-attach of it (of
    another controller, or another task of this one) holds it; give its
    record as it is then.  Held until the re-attach has published the
    record anew, or given up (its workers left waiting for another).

    Raises:
        ProcMeshTakenError: the record changed meanwhile: another
            controller re-attached to the mesh (and serves it now).
        UnknownProcMeshError: the mesh was stopped meanwhile (its workers
            are gone).
        OSError: the lock file cannot be opened.
    """
    name = record.name
    path = _dir() / f"{name}.lock"
    async with flocked_file(path, lambda: log.info(
            "meshio: reattach(%r): another re-attach of this proc mesh holds %s; waiting for "
            "it", name, path)):
        now = lookup(name)
        if now != record:  # (only a controller serving it rewrites it)
            by = "another task of this process" if now.controller_pid == os.getpid() \
                else f"the controller with pid {now.controller_pid}"
            raise ProcMeshTakenError(
                f"reattach({name!r}): proc mesh {name!r} was re-attached by {by} while this "
                f"re-attach waited for it; it serves that controller now. Re-attach once that "
                f"controller is gone, or stop the mesh from there", actor=name,
                cause="re-attached by another controller")
        yield now


def _holder(record: KeptMesh, replacing: KeptMesh | None) -> KeptMesh | None:
    """The record that has the name of ``record`` (of a kept-alive mesh this
    controller serves), if another does (records locked): that of another
    mesh, or of this one written by another controller (that re-attached to
    it), while it lives.  None: the name is free, or this controller's, or
    the record there is ``replacing`` (the one a re-attach took over)."""
    current = _read(_path(record.name))
    if current is None or current == replacing or not _alive(current):
        return None
    if current.id == record.id and current.controller_pid == record.controller_pid:
        return None
    return current


def claim(record: KeptMesh) -> None:
    """Take the name of the new kept-alive mesh of ``record`` (no workers
    yet: they are being started) by writing its record: while this
    controller lives, or the mesh's workers do, a second claim of the name
    is refused (:func:`_holder`): its first :func:`publish`.

    Raises:
        ValueError: another live proc mesh has the name.
        OSError: the record cannot be written.
    """
    other = publish(record)
    if other is None:
        return
    name = record.name
    if not other.workers:
        raise ValueError(
            f"spawn_procs(name={name!r}, keep_alive=...): a proc mesh named {name!r} is being "
            f"started on this host by {_by(other)}; wait for that spawn and stop its mesh, "
            f"or choose another name")
    raise ValueError(
        f"spawn_procs(name={name!r}, keep_alive=...): a proc mesh named {name!r} is "
        f"kept alive on this host already (controller pid {other.controller_pid}); "
        f"re-attach to it with this_host().reattach({name!r}) and stop it, or choose "
        f"another name")


def publish(record: KeptMesh, replacing: KeptMesh | None = None) -> KeptMesh | None:
    """Rewrite ``record`` (this controller's, as its mesh changes), if the
    name is still its mesh's (``replacing``: the record a re-attach took
    over, written by the controller it replaces).

    Returns:
        None, written; or the record that has the name now (nothing written).

    Raises:
        OSError: the record cannot be written.
    """
    with _records_locked():
        other = _holder(record, replacing)
        if other is None:
            _write(record)
        return other


def _write(record: KeptMesh) -> None:
    """Write ``record`` (records locked), readable by this user only."""
    path = _path(record.name)
    tmp = path.with_name(f".{record.name}.{os.getpid()}.{time.monotonic_ns()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(msgspec.json.encode(record))
    os.replace(tmp, path)


def forget(name: str, mesh_id: str) -> None:
    """Remove the record of ``name`` if this controller wrote it for the
    mesh ``mesh_id`` (not if another re-attached to the mesh meanwhile)."""
    try:
        with _records_locked():
            path = _path(name)
            record = _read(path)
            if record is not None and record.id == mesh_id and \
                    record.controller_pid == os.getpid():
                path.unlink(missing_ok=True)
    except OSError as e:  # (left: once its workers are gone, the next look removes it)
        log.warning("meshio: cannot remove the reattach record of proc mesh %r (%s)", name, e)
