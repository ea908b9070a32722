"""The ``meshio`` command."""

from __future__ import annotations

import argparse

__all__ = ("main",)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="meshio", description="meshio command line")
    sub = ap.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="spawn a mesh on this host and tour every adverb")
    demo.add_argument("--procs", type=int, default=2, help="worker processes (default 2)")
    args = ap.parse_args(argv)
    if args.command == "demo":
        from . import run
        from ._demo import demo as run_demo

        run(run_demo(args.procs))


if __name__ == "__main__":
    main()
