"""The ``meshio`` command."""

from __future__ import annotations

import argparse
import sys
from importlib.metadata import version

from ._bench import bench as run_bench
from ._demo import demo as run_demo
from ._doctor import CHECKS, doctor, report_json, report_text, unmet
from ._run import run
from .jobs._agent import main as agent_main

__all__ = ("main",)


def main(argv: list[str] | None = None) -> None:
    args_in = sys.argv[1:] if argv is None else argv
    if args_in[:1] == ["agent"]:  # its own parser: meshio agent --help
        agent_main(args_in[1:])
        return
    ap = argparse.ArgumentParser(prog="meshio", description="meshio command line")
    ap.add_argument("--version", action="version", version=f"meshio {version('meshio')}")
    sub = ap.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="spawn a mesh on this host and tour every adverb")
    demo.add_argument("--procs", type=int, default=2, help="worker processes (default 2)")
    bench = sub.add_parser("bench", help="measure per-call latency and throughput on this host")
    bench.add_argument("--calls", type=int, default=2000, help="sequential calls (default 2000)")
    bench.add_argument("--inflight", type=int, default=1000, help="concurrent calls (default 1000)")
    bench.add_argument("--procs", type=int, default=4, help="worker processes (default 4)")
    sub.add_parser("agent", help="serve this host's workers to a controller on another host "
                                 "(meshio agent --help)")
    check = sub.add_parser("doctor", help="say what this machine gives meshio (uvloop, torch, "
                                          "CUDA, RDMA backends, Slurm, Kubernetes, limits) "
                                          "and why anything is missing")
    check.add_argument("--json", action="store_true", help="print one JSON object")
    check.add_argument("--require", action="append", default=[], choices=CHECKS,
                       metavar="NAME", help="exit 1 when check NAME is missing (repeatable; "
                                            f"one of {', '.join(CHECKS)})")
    args = ap.parse_args(args_in)
    if args.command == "demo":
        run(run_demo(args.procs))
    elif args.command == "bench":
        run(run_bench(args.calls, args.inflight, args.procs))
    elif args.command == "doctor":
        checks = run(doctor())
        required: list[str] = args.require
        print(report_json(checks, required) if args.json else report_text(checks))
        if missing := unmet(checks, required):
            sys.exit("\n".join(f"meshio doctor: {c.name} is required but missing: {c.detail}"
                               for c in missing))


if __name__ == "__main__":
    main()
