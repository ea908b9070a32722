"""meshio, Monarch 0.7.0, Ray 2.60.0 and plain asyncio through the shared
peer harness, in one run; the table with ratios goes into
``benchmarks/README.md`` and a plot of payload size against throughput
into ``benchmarks/payload_throughput.png``.

    python benchmarks/peers/run.py            # everything (~15 min on 2 cores)
    python benchmarks/peers/run.py --quick    # fewer repetitions, sweep to 256 MiB
    python benchmarks/peers/run.py --only meshio-uvloop raw-uvloop

Run it with meshio's interpreter (its virtualenv, or ``PYTHONPATH`` on the
checkout's ``src``): meshio and the plain-asyncio baseline run there.  The
harness (``MESHIO_BENCH_PEERS``, default ``shared/bench-peers`` above the
checkout) runs from a copy in a short temporary folder (Ray puts its
sockets beside the scripts, and a Unix socket's path has at most 107
bytes); every result and log lands in ``benchmarks/results/peers/``
(git-ignored).  Monarch and Ray run in their own
virtualenvs, created on first use under ``~/.cache/meshio-bench``
(``MESHIO_BENCH_VENVS``); a system whose virtualenv cannot be made, or
whose run fails, is reported as not measured rather than failing the run.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
BENCH = os.path.dirname(HERE)
README = os.path.join(BENCH, "README.md")
PLOT = os.path.join(BENCH, "payload_throughput.png")
BEGIN, END = "<!-- peers:begin (python benchmarks/peers/run.py) -->", "<!-- peers:end -->"
MiB = 1 << 20
#: on ``PYTHONPATH``, its ``sitecustomize`` runs asyncio on uvloop in every
#: interpreter started (the plain-asyncio baseline's uvloop column)
UVLOOP_SITE = os.path.join(HERE, "uvloop_site")


@dataclass
class System:
    name: str  #: its results' name, ``backend.name`` in the harness
    label: str
    script: str  #: the harness backend script
    backend: str  #: module:class, for the sweep
    array: str | None  #: its array payload kind, None if it has none
    venv: str | None = None  #: virtualenv under the cache; None: this interpreter
    env: dict[str, str] = field(default_factory=dict)
    args: list[str] = field(default_factory=list)


SYSTEMS = [
    System("meshio-asyncio", "meshio, asyncio.run", "bench_meshio.py",
           "bench_meshio:MeshioBackend", "torch.Tensor", args=["--loop", "asyncio"],
           env={"MESHIO_BENCH_LOOP": "asyncio"}),
    System("meshio-uvloop", "meshio, meshio.run (uvloop)", "bench_meshio.py",
           "bench_meshio:MeshioBackend", "torch.Tensor", args=["--loop", "uvloop"],
           env={"MESHIO_BENCH_LOOP": "uvloop"}),
    System("raw-asyncio", "plain asyncio + pickle", "bench_rawasyncio.py",
           "bench_rawasyncio:RawBackend", None),
    System("raw-uvloop", "plain asyncio + pickle, uvloop", "bench_rawasyncio.py",
           "bench_rawasyncio:RawBackend", None,
           env={"PYTHONPATH": UVLOOP_SITE}),
    System("monarch", "Monarch 0.7.0", "bench_monarch.py", "bench_monarch:MonarchBackend",
           "torch.Tensor", venv="venv-monarch"),
    System("ray", "Ray 2.60.0", "bench_ray.py", "bench_ray:RayBackend", "numpy.ndarray",
           venv="venv-ray"),
]
#: each virtualenv: pip steps in order (torch pinned first: an unpinned torch
#: is a multi-GB CUDA build), then a check that it is complete
VENVS = {
    "venv-monarch": ([["torch==2.13.0"], ["torchmonarch==0.7.0"]], "import monarch.actor"),
    "venv-ray": ([["ray==2.60.0", "numpy"]], "import ray, numpy"),
}


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] run.py: {msg}", flush=True)


def find_peers() -> str:
    if "MESHIO_BENCH_PEERS" in os.environ:
        return os.environ["MESHIO_BENCH_PEERS"]
    d = BENCH
    while d != os.path.dirname(d):
        d = os.path.dirname(d)
        if os.path.exists(os.path.join(d, "shared", "bench-peers", "harness.py")):
            return os.path.join(d, "shared", "bench-peers")
    raise SystemExit("run.py: the peer harness was not found; set MESHIO_BENCH_PEERS")


def ensure_venv(name: str) -> str:
    """The virtualenv's python, made on first use; raises if it cannot be."""
    cache = os.environ.get("MESHIO_BENCH_VENVS",
                           os.path.join(os.path.expanduser("~"), ".cache", "meshio-bench"))
    venv = os.path.join(cache, name)
    python = os.path.join(venv, "bin", "python")
    steps, check = VENVS[name]
    if os.path.exists(python) and subprocess.run([python, "-c", check]).returncode == 0:
        return python
    log(f"creating {venv}")
    subprocess.run([sys.executable, "-m", "venv", "--clear", venv], check=True)
    for pkgs in steps:
        subprocess.run([python, "-m", "pip", "install", "-q", *pkgs], check=True)
    subprocess.run([python, "-c", check], check=True)
    return python


def pythonpath(*paths: str | None) -> str:
    """``paths``, then the ``PYTHONPATH`` this process was started with."""
    return os.pathsep.join(p for p in (*paths, os.environ.get("PYTHONPATH")) if p)


def run_logged(cmd: list[str], env: dict[str, str], cwd: str, logfile: str,
               timeout: float) -> str | None:
    """Run ``cmd``, its output to ``logfile``; None, or why it failed."""
    log(" ".join(os.path.basename(c) if c.startswith("/") else c for c in cmd))
    with open(logfile, "w") as f:
        try:
            p = subprocess.run(cmd, env=env, cwd=cwd, stdout=f, stderr=subprocess.STDOUT,
                               timeout=timeout)
        except subprocess.TimeoutExpired:
            return f"stopped after {timeout:.0f} s"
    return None if p.returncode == 0 else f"exit status {p.returncode}"


def measure(systems: list[System], peers: str, work: str, harness_args: list[str],
            sweep_max: int, sweep: bool) -> dict[str, str]:
    """Every system in turn, the harness copied from ``peers`` into a
    temporary folder; returns {name: why it is missing} for failures."""
    with tempfile.TemporaryDirectory(prefix="meshio-peers-", dir="/tmp") as tmp:
        for name in os.listdir(peers):
            if name.endswith((".py", ".sh", ".md")):
                shutil.copyfile(os.path.join(peers, name), os.path.join(tmp, name))
        return _measure(systems, tmp, work, harness_args, sweep_max, sweep)


def _measure(systems: list[System], harness: str, work: str, harness_args: list[str],
             sweep_max: int, sweep: bool) -> dict[str, str]:
    failed: dict[str, str] = {}
    for s in systems:
        try:
            python = ensure_venv(s.venv) if s.venv else sys.executable
        except (subprocess.CalledProcessError, OSError) as e:
            failed[s.name] = f"virtualenv {s.venv} could not be made ({e})"
            log(failed[s.name])
            continue
        env = dict(os.environ)
        env.update(s.env, MESHIO_BENCH_PEERS=harness,
                   PYTHONPATH=pythonpath(s.env.get("PYTHONPATH"), harness, HERE))
        script = os.path.join(HERE if s.script == "bench_meshio.py" else harness, s.script)
        out = f"{work}/results/{s.name}.json"
        why = run_logged([python, script, *s.args, "--out", out, *harness_args], env, harness,
                         f"{work}/logs/{s.name}.log", 900)
        if why:
            failed[s.name] = f"harness run: {why}, see results/peers/logs/{s.name}.log"
            log(failed[s.name])
        elif (res := load(out)) and res["backend"] != s.name:  # raw-uvloop: report.py's label
            res["backend"] = s.name
            with open(out, "w") as f:
                json.dump(res, f, indent=1)
        if sweep:
            kinds = ["bytes", *([s.array] if s.array else [])]
            why = run_logged([python, os.path.join(HERE, "sweep.py"), s.backend,
                              "--kinds", *kinds, "--max-bytes", str(sweep_max),
                              "--out", f"{work}/sweep/{s.name}.json"],
                             env, harness, f"{work}/logs/sweep-{s.name}.log", 420)
            if why:
                log(f"sweep {s.name}: {why} (what it measured is kept)")
    return failed


# ---------------------------------------------------------------- the table
def load(path: str) -> dict[str, Any] | None:
    try:
        with open(path) as f:
            data: dict[str, Any] = json.load(f)
            return data
    except (OSError, ValueError):
        return None


def med(res: dict[str, Any] | None, *path: str) -> float | None:
    d: Any = res
    for p in path:
        if not isinstance(d, dict) or p not in d:
            return None
        d = d[p]
    return float(d["median"]) if isinstance(d, dict) else float(d)


def fmt(x: float | None) -> str:
    return "—" if x is None else f"{x:,.0f}"


def ratio(a: float | None, b: float | None, goal: str | None = None) -> str:
    """``a ÷ b`` as ``0.29x``, and with ``goal`` (``"≤ 0.1x"``, ``"≥ 12x"``,
    ``"< 1.0x"``) whether the unrounded ratio meets it."""
    if a is None or b is None or b == 0:
        return "—"
    r = a / b
    text = f"{r:.2f}x" if r < 10 else f"{r:.1f}x"
    if goal is None:
        return text
    op, bound = goal.split()
    limit = float(bound.rstrip("x"))
    met = {"≥": r >= limit, "≤": r <= limit, "<": r < limit, ">": r > limit}[op]
    return f"{text} (goal {goal}: {'met' if met else f'**missed**, {r:.3f}x'})"


#: (row label, value getter, better when higher, goal per peer)
Getter = Callable[[dict[str, Any] | None, System], float | None]


def tensor_row(res: dict[str, Any] | None, s: System) -> float | None:
    return None if s.array is None else med(res, "payload", f"{s.array} 64 MiB", "MiB_per_s")


ROWS: list[tuple[str, Getter, dict[str, str]]] = [
    ("64 MiB tensor as an argument (numpy for Ray), MiB/s", tensor_row,
     {"monarch": "≥ 12x", "ray": "≥ 1.0x"}),
    ("64 MiB numpy array as an argument (meshio: annotated `object`), MiB/s",
     lambda r, s: med(r, "payload", "numpy.ndarray 64 MiB", "MiB_per_s")
     if s.name.startswith("meshio") or s.name == "ray" else None, {}),
    ("64 MiB `bytes` argument, MiB/s",
     lambda r, s: med(r, "payload", "bytes 64 MiB", "MiB_per_s"), {}),
    ("1,000 calls in flight, calls/s", lambda r, s: med(r, "throughput_cps"),
     {"raw": "≥ 1.0x", "monarch": "≥ 20x"}),
    ("int→int latency, median µs", lambda r, s: med(r, "latency", "median_us"),
     {"raw": "≤ 0.5x", "monarch": "≤ 0.1x"}),
    ("int→int latency, p99 µs", lambda r, s: med(r, "latency", "p99_us"), {}),
    ("call on 4 actors + gather, median µs", lambda r, s: med(r, "broadcast4", "median_us"),
     {"raw": "< 1.0x", "monarch": "≤ 0.1x"}),
]


def table(work: str, failed: dict[str, str]) -> str:
    res = {s.name: load(f"{work}/results/{s.name}.json") for s in SYSTEMS}
    out = ["| | " + " | ".join(s.label for s in SYSTEMS) + " |",
           "|---|" + "---|" * len(SYSTEMS)]
    for label, get, _ in ROWS:
        out.append(f"| {label} | " + " | ".join(fmt(get(res[s.name], s)) for s in SYSTEMS)
                   + " |")
    out += ["", "Ratios, meshio ÷ peer (the baseline on the same loop; higher is better for "
            "MiB/s and calls/s, lower for µs), and the issue's goals:", "",
            "| | loop | ÷ plain asyncio (same loop) | ÷ Monarch | ÷ Ray |",
            "|---|---|---|---|---|"]
    by = {s.name: s for s in SYSTEMS}
    for label, get, goals in ROWS:
        for loop in ("asyncio", "uvloop"):
            m = get(res[f"meshio-{loop}"], by[f"meshio-{loop}"])
            cells = []
            for peer, key in ((f"raw-{loop}", "raw"), ("monarch", "monarch"), ("ray", "ray")):
                cells.append(ratio(m, get(res[peer], by[peer]), goals.get(key)))
            out.append(f"| {label} | {loop} | " + " | ".join(cells) + " |")
    p99 = [(loop, med(res[f"meshio-{loop}"], "latency", "p99_us"),
            med(res[f"meshio-{loop}"], "latency", "median_us")) for loop in ("asyncio", "uvloop")]
    out += ["", "meshio's latency p99 ÷ median: " + ", ".join(
        f"{loop} {ratio(a, b, '≤ 2x')}" for loop, a, b in p99) + "."]
    if failed:
        out += ["", "Not measured in this run:"] + [f"- {k}: {v}" for k, v in failed.items()]
    return "\n".join(out)


def src_revision() -> str:
    """The last commit of meshio's ``src/``, and whether it had changes."""
    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", os.path.dirname(BENCH), *args],
                              capture_output=True, text=True, check=False).stdout.strip()
    rev = git("log", "-1", "--format=%h, %ci", "--", "src")
    return f"{rev}{' (+ uncommitted changes)' if git('status', '--porcelain', 'src') else ''}"


def run_info(work: str) -> str:
    try:
        with open(os.path.join(work, "REVISION")) as f:
            rev = f.read().strip()
    except OSError:
        rev = "?"
    lines = [f"- meshio `src/` measured: {rev}"]
    for s in SYSTEMS:
        r = load(f"{work}/results/{s.name}.json")
        if r:
            e = r["env"]
            v = ", ".join(f"{k} {val}" for k, val in e["versions"].items()
                          if val != "not installed")
            lines.append(f"- {s.label}: {r['reps']} repetitions, {e['started']} - "
                         f"{e.get('finished', '?')}; Python {e['python']}, {v}")
    return "\n".join(lines)


# ---------------------------------------------------------------- the plot
def sweep_notes(work: str) -> list[str]:
    notes = []
    for s in SYSTEMS:
        r = load(f"{work}/sweep/{s.name}.json")
        if r is None:
            notes.append(f"{s.label}: no sweep (see benchmarks/results/peers/logs/"
                         f"sweep-{s.name}.log)")
        for kind, pts in (r or {}).get("points", {}).items():
            notes += [f"{s.label}, {kind}, {int(n) // MiB} MiB: {p['error']}"
                      for n, p in pts.items() if "error" in p]
    return notes


def plot(work: str, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(13, 5), sharey=True)
    ticks = [4 << 10, 64 << 10, MiB, 16 * MiB, 64 * MiB, 256 * MiB, 1024 * MiB]
    for ax, title, pick in (
            (axes[0], "`bytes` argument", lambda s: "bytes"),
            (axes[1], "tensor argument (numpy.ndarray for Ray)", lambda s: s.array)):
        for i, s in enumerate(SYSTEMS):
            kind = pick(s)
            r = load(f"{work}/sweep/{s.name}.json")
            pts = ((r or {}).get("points") or {}).get(kind or "", {})
            ok = sorted((int(n), p["MiB_per_s"]) for n, p in pts.items() if "MiB_per_s" in p)
            bad = sorted(int(n) for n, p in pts.items() if "error" in p)
            if not ok and not bad:
                continue
            color = f"C{i}"  # one color per system in both panels
            ax.plot([n for n, _ in ok], [v for _, v in ok], marker="o", color=color,
                    label=s.label if not bad else f"{s.label} (x not measured)",
                    linestyle="-" if s.name.startswith("meshio") else "--")
            if bad:
                ax.plot(bad, [ok[-1][1] if ok else 1.0] * len(bad), marker="x", markersize=10,
                        linestyle="none", color=color)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xticks(ticks, ["4 KiB", "64 KiB", "1 MiB", "16 MiB", "64 MiB", "256 MiB",
                              "1 GiB"])
        ax.set_title(title)
        ax.set_xlabel("payload size (one call, the actor returns its length)")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    axes[0].set_ylabel("MiB/s (median call time)")
    fig.suptitle("Payload throughput, one run, every system on the same machine")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_readme(section: str) -> None:
    with open(README) as f:
        text = f.read()
    block = f"{BEGIN}\n{section}\n{END}"
    if BEGIN in text and END in text:
        text = text[:text.index(BEGIN)] + block + text[text.index(END) + len(END):]
    else:
        text = text.rstrip("\n") + "\n\n" + block + "\n"
    with open(README, "w") as f:
        f.write(text)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true",
                    help="3 repetitions, fewer calls, sweep up to 256 MiB (~8 min)")
    ap.add_argument("--only", nargs="+", choices=[s.name for s in SYSTEMS],
                    help="measure only these; the others' results of an earlier run are kept")
    ap.add_argument("--no-sweep", action="store_true",
                    help="no payload sweep (without --only: no plot, an earlier one removed)")
    ap.add_argument("--report-only", action="store_true",
                    help="measure nothing: table and plot from the results already there")
    args = ap.parse_args()

    work = os.path.join(BENCH, "results", "peers")
    peers = find_peers()
    for d in ("results", "logs", "sweep"):
        os.makedirs(os.path.join(work, d), exist_ok=True)
    systems = [s for s in SYSTEMS if not args.only or s.name in args.only]
    harness_args = ["--reps", "3", "--calls", "1000", "--bcast-calls", "200"] if args.quick else []
    sweep_max = (256 if args.quick else 1024) * MiB
    # {name: why it is missing}, kept for --report-only and for the systems --only leaves
    failures = os.path.join(work, "failed.json")
    failed: dict[str, str] = load(failures) or {}
    if not args.report_only:
        if not args.only:  # a result of an earlier run must not pass for this one's
            for d in ("results", "sweep"):
                for name in os.listdir(os.path.join(work, d)):
                    os.remove(os.path.join(work, d, name))
        t0 = time.monotonic()
        with open(os.path.join(work, "REVISION"), "w") as f:
            f.write(src_revision())
        failed = {k: v for k, v in failed.items() if k not in {s.name for s in systems}}
        failed.update(measure(systems, peers, work, harness_args, sweep_max, not args.no_sweep))
        with open(failures, "w") as f:
            json.dump(failed, f, indent=1)
        log(f"measured in {time.monotonic() - t0:.0f} s")
    results = [f"{work}/results/{s.name}.json" for s in SYSTEMS
               if os.path.exists(f"{work}/results/{s.name}.json")]
    with open(os.path.join(work, "TABLE.md"), "w") as f:  # the harness's own table
        subprocess.run([sys.executable, os.path.join(peers, "report.py"), *results], stdout=f,
                       check=False)
    sweeps = os.path.join(work, "sweep")
    if os.path.isdir(sweeps) and os.listdir(sweeps):  # this run's, or kept from an earlier one
        plot(work, PLOT)
        notes = sweep_notes(work)
        sweep = ["![payload size against throughput](payload_throughput.png)",
                 "Sizes the plot marks x (not measured):\n" + "\n".join(f"- {n}" for n in notes)
                 if notes else "Every size of the plot was measured for every system."]
    else:
        sweep = ["No payload sweep in these results (`--no-sweep`, or every sweep failed: "
                 "see `benchmarks/results/peers/logs/`), so no plot."]
        if os.path.exists(PLOT):  # an earlier run's: not what the table above measured
            os.remove(PLOT)
            log(f"removed {os.path.relpath(PLOT)}: no sweep in these results")
    section = "\n\n".join([table(work, failed), *sweep, "Runs:\n" + run_info(work)])
    write_readme(section)
    print(section)
    log(f"wrote {os.path.relpath(README)}"
        + (f" and {os.path.relpath(PLOT)}" if os.path.exists(PLOT) else "")
        + f"; all results in {os.path.relpath(work)}")


if __name__ == "__main__":
    main()
