"""Worker ``logging`` records, delivered to the controller as records.

In a worker process (``python -m meshio.worker``), :func:`install` puts one
handler on the root logger, so every record that reaches it (any logger,
at the levels the worker's logging lets through: WARNING and up unless
the user configures more, e.g. ``logging.basicConfig(level=logging.INFO)``
in ``spawn_procs(bootstrap=...)``) is stamped with where it comes from
(:class:`_Stamp`: ``actor``, ``rank``, ``mesh``, ``host``, ``pid``) and
then, per ``spawn_procs(log_records=..., log_dir=...)``:

- sent to the controller (the default): batched, on the worker's loop,
  never blocking the code that logs (:class:`_Forwarder`); at most
  :data:`LOG_BACKLOG` records wait to be sent, later ones are dropped and
  counted (the controller says so once per process; ``meshio.stats()``
  counts them).  The controller re-emits each through the logger of the
  same name (:func:`_on_log_records`), so its handlers and filters see a
  real ``LogRecord`` (``record.rank == 3``); with no handler configured
  there, it is printed as the worker's output is, after its label;
- written to the file ``<log_dir>/<proc mesh>-<rank>.log`` on the worker's
  host, and not sent;
- left alone (``log_records=False``): the worker's logging writes to its
  stderr, forwarded as text like any output.

Handlers that wrote to the worker's stderr or stdout (``basicConfig`` in a
bootstrap) are removed, so a record is not also forwarded as text.
"""

from __future__ import annotations

import json
import logging
import os
import pickle
import sys
import threading
import weakref
from collections.abc import Mapping
from typing import Any, Final, cast

from ._context import _context
from ._exceptions import ClosedResourceError
from ._launcher import forward_text
from ._transport._connection import Connection
from ._transport._messages import LogEntry, LogRecords
from ._transport._runtime import Runtime, register_handler
from ._transport._serial import Buffers

__all__ = ("LOGS_ENV", "LOG_BACKLOG", "install", "log_file", "logs_env", "records_dropped")

log = logging.getLogger("meshio")

#: the environment variable that tells a worker what to do with its records
LOGS_ENV: Final = "MESHIO_LOGS"
#: records a worker keeps waiting to be sent at most; later ones are dropped
LOG_BACKLOG: Final = 10_000
#: seconds before a worker looks again whether it may send its records
RETRY: Final = 0.05
#: records per message at most (a flood goes in several)
LOG_BATCH: Final = 1000

#: the record attributes meshio adds
STAMPS: Final = ("actor", "rank", "mesh", "host", "pid")


def log_file(log_dir: str, mesh: str, rank: int) -> str:
    """The file of the records of process ``rank`` of proc mesh ``mesh``."""
    return os.path.join(log_dir, f"{mesh.replace(os.sep, '_')}-{rank}.log")


def logs_env(log_records: bool, log_dir: str | None, mesh: str, rank: int, label: str) -> str:
    """The value of :data:`LOGS_ENV` for process ``rank`` of proc mesh
    ``mesh`` (``label``: its output's prefix)."""
    mode = "off" if not log_records else "forward" if log_dir is None else "file"
    return json.dumps({"mode": mode, "mesh": mesh, "rank": rank, "label": label,
                       "file": log_file(log_dir, mesh, rank) if log_dir is not None else ""})


class _Stamp(logging.Filter):
    """Adds where a record comes from: ``actor`` (the actor mesh's name;
    None outside an actor's code), ``rank`` (the actor's rank; outside an
    actor, the process's rank in its proc mesh), ``mesh`` (the proc mesh's
    name), ``host`` and ``pid``: each one the record does not have
    already.  So a record forwarded from a proc mesh an actor of this
    process started keeps its own (it has all five), and a user's ``extra``
    of one of those names is kept, the other four stamped all the same."""

    def __init__(self, mesh: str, rank: int, host: str) -> None:
        super().__init__()
        self.mesh = mesh
        self.rank = rank
        self.host = host

    def filter(self, record: logging.LogRecord) -> bool:
        d = record.__dict__
        ctx = _context.get(None)
        d.setdefault("actor", None if ctx is None else ctx.actor_name)
        d.setdefault("rank", self.rank if ctx is None else ctx.point.rank)
        d.setdefault("mesh", self.mesh)
        d.setdefault("host", self.host)
        d.setdefault("pid", record.process)
        return True


_formatter = logging.Formatter()


def _message(record: logging.LogRecord) -> tuple[str, bool]:
    """The record's message, and whether it printed; if it did not
    (``msg % args`` failed, or ``str()`` of one of them), what there was,
    as text: ``'x=%s' % (<unprintable Bad>,) (RuntimeError: no str)``."""
    try:
        return record.getMessage(), True
    except Exception as e:
        args = record.args
        shown = (f"({', '.join(_repr(a) for a in args)}{',' if len(args) == 1 else ''})"
                 if isinstance(args, tuple) else _repr(args))
        what = f"{_repr(record.msg)} % {shown}" if args else _repr(record.msg)
        return f"{what} ({type(e).__name__}: {_str(e)})", False


def _text(record: logging.LogRecord) -> tuple[str, str | None]:
    """The record's message with its traceback and stack, as text; and,
    if its message does not print, what is sent as its ``msg`` instead
    (:func:`_message`)."""
    message, printed = _message(record)
    if record.exc_info and not record.exc_text:
        record.exc_text = _formatter.formatException(record.exc_info)
    text = "\n".join(part for part in (message, record.exc_text, record.stack_info) if part)
    return text, None if printed else message


def _entry(record: logging.LogRecord) -> LogEntry:
    """``record`` for the wire: its ``__dict__`` pickled; if that fails,
    with its message formatted to text and what else cannot be pickled as
    its ``repr``.  A message that does not print goes as the text saying
    what there was (:func:`_message`), so the controller's handlers can
    print it."""
    text, unprintable = _text(record)
    d = dict(record.__dict__, exc_info=None)  # (its traceback is in exc_text)
    if unprintable is not None:
        d.update(msg=unprintable, args=None)
    try:
        blob = pickle.dumps(d, pickle.HIGHEST_PROTOCOL)
    except Exception:
        message = text.split("\n", 1)[0] if record.exc_text or record.stack_info else text
        d.update(msg=message, args=None)
        for k, v in d.items():
            try:
                pickle.dumps(v, pickle.HIGHEST_PROTOCOL)
            except Exception:
                d[k] = _repr(v)
        try:
            blob = pickle.dumps(d, pickle.HIGHEST_PROTOCOL)
        except Exception:  # (a str subclass, say): the text is all there is
            blob = b""
    return LogEntry(record.name, record.levelno, text, blob)


def _repr(v: object) -> str:
    try:
        return repr(v)
    except Exception:
        return f"<unprintable {type(v).__name__}>"


def _str(v: object) -> str:
    try:
        return str(v)
    except Exception:
        return f"<unprintable {type(v).__name__}>"


class _Forwarder(logging.Handler):
    """The root handler of a worker that sends its records to the
    controller at ``controller``.  :meth:`emit` runs in whichever thread
    logs (under the handler's lock): it queues the record and, once per
    batch, schedules :meth:`ship` on the loop, which sends what waits in
    :class:`LogRecords` messages of up to :data:`LOG_BATCH` records (the
    drops, which only a full backlog makes, with the first), unless the
    connection's writing is paused (the controller reads slower than this
    worker logs; then it looks again after :data:`RETRY` seconds, and
    past :data:`LOG_BACKLOG` waiting records they are dropped).  After
    :meth:`finish`, or while it is sending (a record meshio logs
    meanwhile), records go to stderr as text."""

    def __init__(self, rt: Runtime, controller: str, label: str, stamp: _Stamp) -> None:
        super().__init__()
        self.addFilter(stamp)
        self.rt = rt
        self.controller = controller
        self.label = label
        self.pending: list[LogEntry] = []
        #: dropped since the last batch; in all
        self.dropped = 0
        self.dropped_total = 0
        self.scheduled = False
        self.shipping = False
        self.finished = False
        self.loop_thread = threading.get_ident()
        self.fallback = logging.StreamHandler(sys.stderr)

    def emit(self, record: logging.LogRecord) -> None:
        if self.finished or (self.shipping and threading.get_ident() == self.loop_thread):
            self.fallback.handle(record)
            return
        if len(self.pending) >= LOG_BACKLOG:
            self.dropped += 1
            self.dropped_total += 1
            return
        try:
            self.pending.append(_entry(record))
        except Exception:
            self.handleError(record)
            return
        if self.scheduled:
            return
        self.scheduled = True
        try:
            if threading.get_ident() == self.loop_thread:
                self.rt.loop.call_soon(self.ship)
            else:
                self.rt.loop.call_soon_threadsafe(self.ship)
        except RuntimeError:  # the loop is closed: the worker is exiting
            self.finished = True

    def ship(self) -> None:
        """Send what waits (on the loop)."""
        if self.finished:
            return
        try:
            # (the controller it serves now: another one may have re-attached)
            conn = self.rt.connect(self.rt.controller or self.controller)
        except ClosedResourceError:  # the runtime closed before finish(): nowhere to send
            self.finished = True
            return
        if conn.writing_paused:  # the controller reads slower: no more piles up here
            self.rt.loop.call_later(RETRY, self.ship)
            return
        self.acquire()  # (emit holds it: the batch is taken whole)
        try:
            batch, self.pending = self.pending, []
            dropped, self.dropped = self.dropped, 0
            self.scheduled = False
        finally:
            self.release()
        self.shipping = True
        try:
            for i in range(0, len(batch), LOG_BATCH):
                conn.send_message(LogRecords(self.label, batch[i:i + LOG_BATCH],
                                             dropped if i == 0 else 0))
        finally:
            self.shipping = False

    def finish(self) -> None:
        """Send what waits now; from now on records go to stderr (the
        worker is exiting: on the loop, before its runtime closes)."""
        if not self.finished:
            self.ship()
            self.finished = True


#: the forwarder installed in this (worker) process, if any
_installed: list[_Forwarder] = []


def records_dropped() -> int:
    """Records this process dropped so far (too many waited to be sent)."""
    return _installed[0].dropped_total if _installed else 0


class _FileFormatter(logging.Formatter):
    """``2024-05-01 12:00:00,123 WARNING mine trainers[3]: text``; a
    message that does not print is written as what there was
    (:func:`_message`)."""

    def format(self, record: logging.LogRecord) -> str:
        message, printed = _message(record)
        if not printed:
            record = logging.makeLogRecord(dict(record.__dict__, msg=message, args=None))
        return super().format(record)

    def formatMessage(self, record: logging.LogRecord) -> str:
        actor: str | None = getattr(record, "actor", None)
        rank = getattr(record, "rank", "?")
        where = f"{actor}[{rank}]" if actor else f"proc {getattr(record, 'mesh', '?')}[{rank}]"
        return f"{self.formatTime(record)} {record.levelname} {record.name} {where}: " \
               f"{record.message}"


def _writes_to_std_streams(h: logging.Handler) -> bool:
    """``h`` is a plain ``StreamHandler`` of ``sys.stderr`` or ``sys.stdout``."""
    stream: object = getattr(h, "stream", None)
    return type(h) is logging.StreamHandler and stream in (sys.stderr, sys.stdout)


def install(rt: Runtime, controller: str, env: Mapping[str, str] = os.environ
            ) -> _Forwarder | None:
    """In a worker process: handle its ``logging`` records as the
    controller asked in :data:`LOGS_ENV` (see the module's docstring).
    The forwarder, when records are sent (call its ``finish`` before the
    runtime closes)."""
    raw = env.get(LOGS_ENV)
    if not raw:
        return None
    config: dict[str, Any] = json.loads(raw)
    if config["mode"] == "off":
        return None
    stamp = _Stamp(str(config["mesh"]), int(config["rank"]), rt.host)
    root = logging.getLogger()
    for h in list(root.handlers):  # (basicConfig in a bootstrap): not twice as text
        if _writes_to_std_streams(h):
            root.removeHandler(h)
    if config["mode"] == "file":
        path = str(config["file"])
        try:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            handler = logging.FileHandler(path, encoding="utf-8")
        except OSError as e:
            print(f"meshio.worker: cannot write log records to {path} ({e}); they are sent "
                  "to the controller instead", file=sys.stderr, flush=True)
        else:
            handler.setFormatter(_FileFormatter())
            handler.addFilter(stamp)
            root.addHandler(handler)
            return None
    forwarder = _Forwarder(rt, controller, str(config["label"]), stamp)
    root.addHandler(forwarder)
    _installed[:] = [forwarder]
    return forwarder


# ------------------------------------------------------------ controller

def _rebuild(entry: LogEntry) -> logging.LogRecord:
    """The record of ``entry``; if it cannot be unpickled here (a class
    this process cannot import), one with its text as message."""
    try:
        d: Any = pickle.loads(entry.record) if entry.record else None
    except Exception:
        d = None
    if isinstance(d, dict):
        return logging.makeLogRecord(cast(dict[str, Any], d))
    return logging.makeLogRecord({"name": entry.name, "levelno": entry.levelno,
                                  "levelname": logging.getLevelName(entry.levelno),
                                  "msg": entry.message, "args": None})


class _DropWarnings:
    """Per runtime: the worker connections whose dropped records were told."""

    def __init__(self, rt: Runtime) -> None:
        self.told: weakref.WeakSet[Connection] = weakref.WeakSet()

    def close(self) -> None:
        self.told.clear()


def _on_log_records(rt: Runtime, conn: Connection, msg: LogRecords, bufs: Buffers) -> None:
    if msg.dropped:
        told = rt.state(_DropWarnings).told
        if conn not in told:
            told.add(conn)
            log.warning("meshio: %s (pid %d) dropped %d logging records: more than %d "
                        "waited to be sent to the controller; later drops are only counted "
                        "(meshio.stats(): log_records_dropped)", msg.label, conn.peer_pid,
                        msg.dropped, LOG_BACKLOG)
    for entry in msg.records:
        logger = logging.getLogger(entry.name)
        if not logger.isEnabledFor(entry.levelno):
            continue
        if logger.hasHandlers():
            logger.handle(_rebuild(entry))
        elif logging.lastResort is not None and entry.levelno >= logging.lastResort.level:
            prefix = f"{msg.label} "  # (no handler here: as the worker's output was)
            forward_text("stderr", "".join(f"{prefix}{line}\n"
                                           for line in entry.message.split("\n")))


register_handler(LogRecords, _on_log_records)
