"""Worker process entry point: ``python -m meshio.worker``.

Started by a launcher, never by hand.  The worker listens on its own Unix
socket for peers, reports to the controller, hosts actors, and dies with
its parent (``PR_SET_PDEATHSIG``) or when the controller's connection is lost.
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import json
import os
import signal
import sys

__all__ = ("main",)


def _die_with_parent(parent: int) -> None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        # Yama (ptrace_scope=1) lets only ancestors read our memory; RDMA
        # buffers' same-host backend needs sibling workers to (process_vm_readv).
        libc.prctl(0x59616D61, ctypes.c_ulong(-1 & 0xFFFFFFFFFFFFFFFF))  # PR_SET_PTRACER_ANY
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent:  # the parent died before prctl took effect
        os._exit(1)


async def _serve(args: argparse.Namespace) -> int:
    from ._runtime import Runtime, _runtimes

    loop = asyncio.get_running_loop()
    rt = Runtime(loop, addr=args.listen, worker=args.worker)
    _runtimes[loop] = rt
    rt.controller = args.controller
    rt.restoring = args.restart
    done: asyncio.Future[int] = loop.create_future()

    def finish(code: int) -> None:
        if not done.done():
            done.set_result(code)

    rt.on_shutdown = lambda: finish(0)
    rt.on_lost[args.controller] = lambda conn: finish(1)
    rt.connect(args.controller)
    code = await done
    for cell in list(rt.actors.values()):
        cell.stop()
    rt.close()
    return code


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m meshio.worker")
    ap.add_argument("--controller", required=True)
    ap.add_argument("--listen", required=True)
    ap.add_argument("--worker", required=True)
    ap.add_argument("--parent", type=int, required=True)
    ap.add_argument("--restart", action="store_true")
    args = ap.parse_args(argv)
    _die_with_parent(args.parent)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the controller decides when we stop
    for p in json.loads(os.environ.get("MESHIO_SYS_PATH", "[]")):
        if p not in sys.path:
            sys.path.append(p)
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency
        code = asyncio.run(_serve(args))
    else:
        code = uvloop.run(_serve(args))
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    main()
