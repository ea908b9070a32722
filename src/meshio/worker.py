"""Worker process entry point: ``python -m meshio.worker``.

Started by a launcher, never by hand.  The worker listens on its own Unix
socket for peers, reports to the controller, hosts actors, and dies with
its parent (``PR_SET_PDEATHSIG``) or when the controller's connection is lost
(with ``--keep-alive S``: not with the controller; it waits ``S`` seconds for
another one to re-attach, see :mod:`meshio._worker`; one a host agent started
still dies with its agent).
The job secret and the pickled ``spawn_procs(bootstrap=...)`` arrive on stdin
(never on the command line or in the environment, which other processes of
the user can read); stdin is then ``/dev/null``.

The bootstrap runs first, before the worker connects to anyone or loads any
actor class, in the main thread (a coroutine function: on an asyncio loop of
its own, closed before the worker's uvloop loop starts).  If it raises, its
traceback goes to stderr, one line to the launcher (the ``ProcessStartError``
of ``spawn_procs``), and the worker exits with ``BOOTSTRAP_FAILED``.

On the controller's ``Shutdown`` it stops its actors (their ``__cleanup__``
hooks run, in reverse spawn order), closes its runtime and exits normally, so
``atexit`` handlers and finalizers of user code run; the controller kills it
if that takes longer than the proc mesh's shutdown grace.  A lost controller
connection runs the hooks too, then leaves with ``os._exit(1)``.

It leads a process group of its own, made by its launcher, so a terminal's
Ctrl-C and Jupyter's interrupt (both signal the controller's group) never
reach it, not even while it starts; what its actors start is in its group
and is killed with it, or once it has exited (:mod:`meshio._launcher`), and
the workers it starts itself (a nested proc mesh) join its group.  A keeper
in its group (:func:`_keep_group`) kills the group once it has exited even
where nobody is left to (its controller or host agent SIGKILLed).  It
ignores SIGINT and SIGTERM (``timeout`` signals the controller's group,
Slurm every process of the job step): the controller stops it; what its
actors start takes them as usual.
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import inspect
import json
import os
import signal
import sys
import traceback
from collections.abc import Awaitable
from typing import Any

from ._constants import KEEPER, PR_SET_PDEATHSIG, PR_SET_PTRACER
from ._debug import install as install_debugger
from ._launcher import (
    BOOTSTRAP_FAILED,
    PAYLOAD_HEADER,
    default_sigchld,
    group_nested_workers,
    random_layouts_for_children,
)
from ._logs import install as install_log_records
from ._transport._roles import Incarnation
from ._transport._runtime import Runtime, _runtimes
from ._transport._serial import loads
from ._transport._tls import TLSConfig
from ._worker import serve

__all__ = ("main",)


def _die_with_parent(parent: int, keep_alive: float | None) -> None:
    """Die with the parent (the controller), unless kept alive (then the
    lost connection starts the keep-alive wait instead)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if keep_alive is None:
            libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        # Yama (ptrace_scope=1) lets only ancestors read our memory; RDMA
        # buffers' same-host backend needs sibling workers to (process_vm_readv).
        # Declaring the parent lets it and its descendants (our siblings) in,
        # and no other process of this user.
        libc.prctl(PR_SET_PTRACER, ctypes.c_ulong(parent))
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent and keep_alive is None:  # it died before prctl took effect
        os._exit(1)


#: the keeper of a worker's process group (:func:`_keep_group`), run by a
#: bare interpreter (``-I -S``: a few MB, not a copy of the worker)
_KEEPER = f"""{KEEPER}
import os, select, signal, sys
for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
    signal.signal(sig, signal.SIG_IGN)
worker = int(sys.argv[1])
try:
    exited = os.pidfd_open(worker)
except ProcessLookupError:  # gone (reaped) already
    pass
else:
    select.select([exited], [], [])
os.killpg(worker, signal.SIGKILL)
"""


def _keep_group() -> None:
    """Where this worker leads a process group of its own (its launcher
    made one): start a keeper in it, a process that does nothing but wait
    for our exit, however it comes (SIGKILL by ``PR_SET_PDEATHSIG`` as our
    parent dies, the OOM killer's, a kept-alive wait that ended with nobody
    re-attached), then SIGKILLs the group, itself with it.  So what our
    actors started goes with us even where no controller or host agent is
    left to kill it (they kill the group too, as they reap us).  The group's
    id, our pid, names no other process while the keeper, a member, lives.
    Started before user code runs; it holds none of our descriptors (our
    output pipes end with us) and ignores the stop signals."""
    me = os.getpid()
    if os.getpgrp() != me or not hasattr(os, "pidfd_open"):
        return  # a nested worker, in its worker's group (that one's keeper); no pidfds
    to_null = [(os.POSIX_SPAWN_OPEN, fd, os.devnull, os.O_RDWR, 0) for fd in (0, 1, 2)]
    try:
        os.posix_spawn(sys.executable, [sys.executable, "-I", "-S", "-c", _KEEPER, str(me)],
                       os.environ, file_actions=to_null)
    except OSError:  # (the controller's or agent's reaper alone, as before)
        pass


def _orphaned() -> None:
    """The controller is gone, the worker waits for another: its stdout and
    stderr (pipes the controller read) go to ``/dev/null``, so that a
    ``print`` in an actor does not raise ``BrokenPipeError``."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    for fd in (1, 2):
        os.dup2(devnull, fd)
    os.close(devnull)


def _ignore_stop_signals() -> None:
    """SIGINT and SIGTERM do nothing here: the controller decides when we
    stop (`timeout` signals the controller's process group, Slurm every
    process of the step; the controller stops us gracefully; a terminal's
    Ctrl-C does not reach our group).  By a handler that does nothing, not
    ``SIG_IGN``, which the programs our actors start would inherit (a
    ``Popen(...).terminate()`` of theirs did nothing); an ``os.fork()`` child
    (``multiprocessing``'s) gets Python's defaults back.  System calls the
    signals interrupt restart, as they did when ignored."""
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, _do_nothing)
        signal.siginterrupt(sig, False)
    os.register_at_fork(after_in_child=_default_stop_signals)


def _do_nothing(signum: int, frame: object) -> None:
    """(:func:`_ignore_stop_signals`' handler.)"""


def _default_stop_signals() -> None:
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def _read_payload() -> tuple[bytes, bytes, int]:
    """The job secret and the pickled bootstrap, as the launcher writes them
    to our stdin (``_launcher.start_payload``) before closing it for writing;
    and a private descriptor of that socket, to report a failed bootstrap
    on.  Stdin is ``/dev/null`` from then on."""
    chunks: list[bytes] = []
    while chunk := os.read(0, 1 << 16):
        chunks.append(chunk)
    data = b"".join(chunks)
    head = PAYLOAD_HEADER.size
    n_secret, n_blob = PAYLOAD_HEADER.unpack_from(data) if len(data) >= head else (0, 0)
    if n_secret < 16 or len(data) != head + n_secret + n_blob:
        sys.exit("meshio.worker: no job secret on stdin; workers are started by a "
                 "launcher (meshio.this_host().spawn_procs), not by hand")
    report = os.dup(0)  # not inheritable: user code's children do not get it
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    return data[head:head + n_secret], data[head + n_secret:], report


def _bootstrap(blob: bytes, report: int) -> None:
    """Run ``spawn_procs(bootstrap=...)`` (``blob``, pickled), awaiting what it
    returns if that is awaitable.  If it raises: its traceback on stderr, one
    line on ``report`` for the controller, and exit ``BOOTSTRAP_FAILED``."""
    what = "bootstrap function could not be unpickled:"
    try:
        if blob:
            fn = loads(blob, [], 0)
            what = f"bootstrap {_name_of(fn)}() raised"
            result = fn()
            if inspect.isawaitable(result):
                asyncio.run(_wait(result))
    except BaseException as e:  # SystemExit too: the worker would not start
        tb = e.__traceback__
        traceback.print_exception(type(e), e, tb.tb_next if tb is not None else None)
        line = f"{what} {_type_name(e)}: {e}".strip()
        try:
            os.write(report, line[:2000].encode(errors="replace"))  # fits the socket buffer
        except OSError:
            pass
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(BOOTSTRAP_FAILED)  # not sys.exit: threads it started must not keep us
    os.close(report)


async def _wait(result: Awaitable[Any]) -> None:
    await result


def _name_of(fn: Any) -> str:
    qualname = getattr(fn, "__qualname__", None)
    module = getattr(fn, "__module__", None)
    return f"{module}.{qualname}" if qualname and module else repr(fn)


def _type_name(e: BaseException) -> str:
    cls = type(e)
    return cls.__qualname__ if cls.__module__ == "builtins" else \
        f"{cls.__module__}.{cls.__qualname__}"


async def _serve(args: argparse.Namespace, secret: bytes) -> int:
    loop = asyncio.get_running_loop()
    tls = (TLSConfig(args.tls_cert, args.tls_key, args.tls_ca, mutual=not args.tls_no_mutual,
                     check_hostname=not args.tls_no_check_hostname) if args.tls_cert else None)
    rt = Runtime(loop, addr=args.listen, worker=args.worker, secret=secret, tls=tls,
                 name=args.addr)
    _runtimes[loop] = rt
    rt.incarnation = Incarnation(restart=args.restart, worker=args.worker)
    install_debugger(rt, args.controller)  # breakpoint() pauses for `meshio debug`
    forwarder = install_log_records(rt, args.controller)  # the user's logging, to the controller
    return await serve(rt, args.controller, forwarder.finish if forwarder is not None else None,
                       keep_alive=args.keep_alive,
                       # (a host agent, our parent, still reads our output)
                       orphaned=None if _by_agent(args) else _orphaned)


def _by_agent(args: argparse.Namespace) -> bool:
    """Whether a host agent started us (the controller is reached over TCP)."""
    return bool(args.controller.startswith("tcp://"))


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m meshio.worker")
    ap.add_argument("--controller", required=True)
    ap.add_argument("--listen", required=True)
    ap.add_argument("--worker", required=True)
    ap.add_argument("--parent", type=int, required=True)
    ap.add_argument("--restart", action="store_true")
    # started with its host's workers' shared layout (_launcher._one_layout)
    ap.add_argument("--one-layout", action="store_true")
    ap.add_argument("--addr")  # a replacement answers to its predecessor's address
    ap.add_argument("--keep-alive", type=float)  # spawn_procs(keep_alive=...)
    ap.add_argument("--tls-cert")  # TLS of a worker on another host (its agent's files)
    ap.add_argument("--tls-key")
    ap.add_argument("--tls-ca")
    ap.add_argument("--tls-no-mutual", action="store_true")
    ap.add_argument("--tls-no-check-hostname", action="store_true")
    args = ap.parse_args(argv)
    if args.one_layout:
        random_layouts_for_children()
    group_nested_workers()
    # A host agent, our parent on a job's host, outlives the controller: we
    # die with it, kept alive or not; the controller (this host) we outlive.
    _die_with_parent(args.parent, None if _by_agent(args) else args.keep_alive)
    secret, blob, report = _read_payload()
    _keep_group()
    _ignore_stop_signals()
    default_sigchld()
    for p in json.loads(os.environ.get("MESHIO_SYS_PATH", "[]")):
        if p not in sys.path:
            sys.path.append(p)
    _bootstrap(blob, report)
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency
        code = asyncio.run(_serve(args, secret))
    else:
        code = uvloop.run(_serve(args, secret))
    if code == 0:  # a graceful shutdown: a normal exit, so atexit handlers and finalizers run
        sys.exit(0)
    sys.stdout.flush()  # the controller is gone: leave at once
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    main()
