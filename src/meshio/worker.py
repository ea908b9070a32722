"""Worker process entry point: ``python -m meshio.worker``.

Started by a launcher, never by hand.  The worker listens on its own Unix
socket for peers, reports to the controller, hosts actors, and dies with
its parent (``PR_SET_PDEATHSIG``) or when the controller's connection is lost.
The job secret arrives on stdin (never on the command line or in the
environment, which other processes of the user can read); stdin is then at
end of file.

On the controller's ``Shutdown`` it stops its actors (their ``__cleanup__``
hooks run, in reverse spawn order), closes its runtime and exits normally, so
``atexit`` handlers and finalizers of user code run; the controller kills it
if that takes longer than the proc mesh's shutdown grace.  A lost controller
connection runs the hooks too, then leaves with ``os._exit(1)``.
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import json
import os
import signal
import sys

from ._constants import PR_SET_PDEATHSIG, PR_SET_PTRACER
from ._transport._runtime import Runtime, _runtimes
from ._worker import serve

__all__ = ("main",)


def _die_with_parent(parent: int) -> None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        # Yama (ptrace_scope=1) lets only ancestors read our memory; RDMA
        # buffers' same-host backend needs sibling workers to (process_vm_readv).
        # Declaring the parent lets it and its descendants (our siblings) in,
        # and no other process of this user.
        libc.prctl(PR_SET_PTRACER, ctypes.c_ulong(parent))
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent:  # the parent died before prctl took effect
        os._exit(1)


def _read_secret() -> bytes:
    """The job secret the launcher writes to our stdin before closing it."""
    chunks: list[bytes] = []
    while chunk := os.read(0, 4096):
        chunks.append(chunk)
    secret = b"".join(chunks)
    if len(secret) < 16:
        sys.exit("meshio.worker: no job secret on stdin; workers are started by a "
                 "launcher (meshio.this_host().spawn_procs), not by hand")
    return secret


async def _serve(args: argparse.Namespace, secret: bytes) -> int:
    loop = asyncio.get_running_loop()
    rt = Runtime(loop, addr=args.listen, worker=args.worker, secret=secret)
    _runtimes[loop] = rt
    rt.restoring = args.restart
    return await serve(rt, args.controller)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m meshio.worker")
    ap.add_argument("--controller", required=True)
    ap.add_argument("--listen", required=True)
    ap.add_argument("--worker", required=True)
    ap.add_argument("--parent", type=int, required=True)
    ap.add_argument("--restart", action="store_true")
    args = ap.parse_args(argv)
    _die_with_parent(args.parent)
    secret = _read_secret()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the controller decides when we stop
    for p in json.loads(os.environ.get("MESHIO_SYS_PATH", "[]")):
        if p not in sys.path:
            sys.path.append(p)
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
