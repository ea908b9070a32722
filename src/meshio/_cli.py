"""The ``meshio`` command."""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import sys
from collections.abc import Callable
from typing import Any, TypeVar

from . import __version__
from ._bench import bench as run_bench
from ._constants import MAX_PER_HOST
from ._dashboard import ask_dashboard
from ._debug import debug_client
from ._demo import demo as run_demo
from ._doctor import CHECKS, doctor, report_json, report_text, unmet
from ._exceptions import MeshioError
from ._inspect import ANSWER_GRACE, ASK_TIMEOUT, Controller, ask_stacks, controllers, inspection_dir
from ._run import run
from ._stacks import STACKS_TIMEOUT, Stacks
from .jobs._agent import main as agent_main

__all__ = ("main",)

_V = TypeVar("_V")


def main(argv: list[str] | None = None) -> None:
    try:
        _main(sys.argv[1:] if argv is None else argv)
        sys.stdout.flush()
    except BrokenPipeError:
        # The reader went away (``meshio doctor --json | head``): end quietly,
        # as other tools do, and keep Python's exit from flushing again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(1)


def _main(args_in: list[str]) -> None:
    if args_in[:1] == ["agent"]:  # its own parser: meshio agent --help
        agent_main(args_in[1:])
        return
    ap = argparse.ArgumentParser(prog="meshio", description="meshio command line")
    ap.add_argument("--version", action="version", version=f"meshio {__version__}")
    sub = ap.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="spawn a mesh on this host and tour every adverb")
    demo.add_argument("--procs", type=_procs, default=2, help="worker processes (default 2)")
    bench = sub.add_parser("bench", help="measure per-call latency and throughput on this host")
    bench.add_argument("--calls", type=_count, default=2000,
                       help="sequential calls (default 2000)")
    bench.add_argument("--inflight", type=_count, default=1000,
                       help="concurrent calls (default 1000)")
    bench.add_argument("--procs", type=_procs, default=4, help="worker processes (default 4)")
    sub.add_parser("agent", help="serve this host's workers to a controller on another host "
                                 "(meshio agent --help)")
    stacks = _asking(
        sub, "stacks", "print what every actor of a running controller is doing: its Python "
                       "stacks, grouped when identical",
        "Ask a running meshio controller of this user (a process that started a proc mesh) "
        "for the current Python stacks of every actor of its proc meshes, and print them "
        "grouped when identical; those of each of its event loops when it runs several "
        "(--loop: one).")
    stacks.add_argument("--json", action="store_true", help="print JSON instead of text")
    stacks.add_argument("--timeout", type=_seconds, default=STACKS_TIMEOUT,
                        help=f"seconds each process has to answer (default {STACKS_TIMEOUT:g})")
    dash = _asking(
        sub, "dashboard", "have a running controller serve its live dashboard and print its URL",
        "Ask a running meshio controller of this user (a process that started a proc mesh) to "
        "serve its live dashboard (meshio.serve_dashboard) and print the page's URL, the job's "
        "token included.  It is served until that controller ends.")
    dash.add_argument("--port", type=_port, default=0,
                      help="the TCP port (default: any free one)")
    dash.add_argument("--host", default="127.0.0.1",
                      help="the address to listen on (default 127.0.0.1; any other address "
                           "requires the token of the printed URL)")
    _asking(sub, "debug", "attach to the actors of a running controller paused in "
                          "breakpoint() and drive their pdb sessions",
            "Attach to a running meshio controller of this user: list the actors paused in "
            "breakpoint() or pdb.set_trace(), `attach <actor> <rank>` to run one's pdb "
            "session (p, n, s, bt, c, ...), `detach`, `continue all`.")
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
    elif args.command == "stacks":
        sys.exit(run(_stacks(args.pid, args.loop, args.json, args.timeout)))
    elif args.command == "dashboard":
        sys.exit(run(_dashboard(args.pid, args.loop, args.port, args.host)))
    elif args.command == "debug":
        sys.exit(run(_debug(args.pid, args.loop)))


def _count(text: str) -> int:
    """A count option (``--procs``, ``--calls``): an int >= 1."""
    return _option(text, int, lambda n: n >= 1, "an int >= 1")


def _procs(text: str) -> int:
    """A ``--procs``: an int in 1.. :data:`MAX_PER_HOST` (what
    ``spawn_procs`` starts on one host)."""
    return _option(text, int, lambda n: 1 <= n <= MAX_PER_HOST, f"an int in 1..{MAX_PER_HOST}")


def _seconds(text: str) -> float:
    """A ``--timeout``: finite seconds > 0."""
    return _option(text, float, lambda t: 0 < t < math.inf, "finite seconds > 0")


def _port(text: str) -> int:
    """A ``--port``: an int in 0..65535."""
    return _option(text, int, lambda n: 0 <= n <= 65535, "an int in 0..65535")


def _option(text: str, parse: Callable[[str], _V], ok: Callable[[_V], bool], want: str) -> _V:
    """An option's value, ``text`` parsed, as argparse's ``type`` (so the
    subcommand's parser says what was wrong: it must be ``want``)."""
    try:
        value = parse(text)
    except ValueError:
        value = None
    if value is None or not ok(value):
        raise argparse.ArgumentTypeError(f"must be {want}, got {text!r}")
    return value


def _asking(sub: Any, name: str, help: str, description: str) -> argparse.ArgumentParser:
    """The parser of ``meshio <name>``, a client of a running controller
    (``--pid`` chooses which, ``--loop`` which of its event loops)."""
    parser: argparse.ArgumentParser = sub.add_parser(name, help=help, description=description)
    parser.add_argument("--pid", type=int, help="the controller's pid, when several run")
    parser.add_argument("--loop", type=_count,
                        help="which of the controller's event loops (the N of its 'loop N'), "
                             "when it runs several")
    return parser


async def _debug(pid: int | None, loop: int | None) -> int:
    """``meshio debug``: 0 once the user quits, 1 (with why, on stderr)
    when no controller was found, it did not answer, or it went away."""
    chosen = _choose_one("debug", pid, loop)
    if chosen is None:
        return 1
    try:
        return await debug_client(chosen, timeout=ASK_TIMEOUT)
    except TimeoutError as e:
        return _failed("debug", chosen, "did not answer", e, ASK_TIMEOUT)


def _choose(command: str, pid: int | None, loop: int | None) -> list[Controller] | None:
    """The event loops (oldest first) of the running controller ``meshio
    <command>`` talks to: the one process of this user that runs one (with
    ``pid``, when given); with ``loop``, that loop of it only.  None, with
    why on stderr, when there is none, several, or no such loop."""
    try:
        found = controllers()
    except PermissionError as e:
        print(f"meshio {command}: {e}", file=sys.stderr)
        return None
    chosen = [c for c in found if pid is None or c.pid == pid]
    if len({c.pid for c in chosen}) != 1:
        where = inspection_dir()
        if pid is not None:
            why = f"no running meshio controller of yours has pid {pid} (found in {where}:"
        elif not chosen:
            why = (f"no running meshio controller of yours found in {where} (a controller "
                   "publishes itself there once it starts a proc mesh")
        else:
            why = f"several meshio controllers run; choose one with --pid (found in {where}:"
        print(f"meshio {command}: {why}){_listing(found)}", file=sys.stderr)
        return None
    picked = [c for c in chosen if loop is None or c.loop == loop]
    if not picked:
        print(f"meshio {command}: controller pid {chosen[0].pid} runs no loop {loop}; its "
              f"event loops:{_listing(chosen)}", file=sys.stderr)
        return None
    return picked


def _choose_one(command: str, pid: int | None, loop: int | None) -> Controller | None:
    """The one event loop ``meshio <command>`` talks to (:func:`_choose`);
    None, with why on stderr, when the controller runs several and
    ``loop`` does not say which."""
    chosen = _choose(command, pid, loop)
    if chosen is None:
        return None
    if len(chosen) > 1:
        print(f"meshio {command}: controller pid {chosen[0].pid} runs {len(chosen)} event "
              f"loops with proc meshes; choose one with --loop:{_listing(chosen)}",
              file=sys.stderr)
        return None
    return chosen[0]


def _listing(found: list[Controller]) -> str:
    """``found`` as the lines of a message, or `` none``."""
    return "".join(f"\n  {c.describe()}" for c in found) or " none"


async def _stacks(pid: int | None, loop: int | None, as_json: bool, timeout: float) -> int:
    """``meshio stacks``: 0 once printed, 1 (with why, on stderr) when no
    controller answered; 1 too, once printed, when some processes did not
    answer (their error lines end the stacks) or some event loops of the
    controller did not (why on stderr).  The text of a controller with
    several loops heads each loop's stacks with its name; its JSON is one
    :class:`Stacks` of all their actors."""
    chosen = _choose("stacks", pid, loop)
    if chosen is None:
        return 1

    async def ask(controller: Controller) -> Stacks | None:
        try:
            return await ask_stacks(controller, timeout)
        except (MeshioError, TimeoutError) as e:
            _failed("stacks", controller, "did not answer", e, timeout + ANSWER_GRACE)
            return None

    answers = await asyncio.gather(*map(ask, chosen))
    answered = [(c, stacks) for c, stacks in zip(chosen, answers) if stacks is not None]
    if as_json and answered:
        print(Stacks(tuple(a for _, stacks in answered for a in stacks.actors),
                     tuple(e for _, stacks in answered for e in stacks.errors)).json())
    elif not as_json:
        for controller, stacks in answered:
            print(f"{controller.name()}:\n" if len(chosen) > 1 else "", stacks.text(), sep="",
                  end="")
    return 0 if len(answered) == len(chosen) and not any(s.errors for _, s in answered) else 1


async def _dashboard(pid: int | None, loop: int | None, port: int, host: str) -> int:
    """``meshio dashboard``: 0 once the URL is printed, 1 (with why, on
    stderr) when no controller serves it."""
    controller = _choose_one("dashboard", pid, loop)
    if controller is None:
        return 1
    try:
        url = await ask_dashboard(controller, port, host)
    except (MeshioError, TimeoutError) as e:
        return _failed("dashboard", controller, "did not serve it", e, ASK_TIMEOUT)
    print(url)
    return 0


def _failed(command: str, controller: Controller, what: str, error: Exception,
            timeout: float) -> int:
    """Say on stderr that ``controller`` ``what`` (``did not answer``) to
    ``meshio <command>``, and why (``error``; a TimeoutError: within
    ``timeout`` seconds); 1, the command's exit status."""
    why = (f" within {timeout:g} s" if isinstance(error, TimeoutError)
           else f": {str(error) or type(error).__name__}")
    print(f"meshio {command}: controller {controller.describe()} {what}{why}", file=sys.stderr)
    return 1


if __name__ == "__main__":
    main()
