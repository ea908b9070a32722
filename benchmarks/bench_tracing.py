"""The per-call cost of the OpenTelemetry extra (issue 19 §2), side by side.

Runs ``meshio bench`` (one call at a time, 1,000 in flight, a call on 4
actors) in interleaved repetitions under three set-ups, each in fresh
processes (the controller and its workers alike, through a
``sitecustomize`` on ``PYTHONPATH``, which workers inherit):

- ``absent``: ``opentelemetry`` cannot be imported (as without the extra);
- ``no provider``: the extra installed, no tracer provider set (what a user
  gets who installed it and set nothing up: OpenTelemetry's no-op spans);
- ``sdk``: the SDK's tracer provider in every process, spans recorded and
  dropped by a processor that does nothing (the cost of real spans without
  an exporter's).

Prints the median of each row per set-up and its ratio to ``absent``.

Usage: python benchmarks/bench_tracing.py [--reps 5] [--calls 2000]
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

SETUPS = {
    "absent": "import sys\nsys.modules['opentelemetry'] = None\n",
    "no provider": "",
    "sdk": ("from opentelemetry import trace\n"
            "from opentelemetry.sdk.trace import TracerProvider, SpanProcessor\n"
            "provider = TracerProvider()\n"
            "provider.add_span_processor(SpanProcessor())\n"
            "trace.set_tracer_provider(provider)\n"),
}
ROWS = {
    "latency, us": re.compile(r"one call at a time\s+median\s+([\d.]+) us"),
    "1000 in flight, calls/s": re.compile(r"calls in flight\s+(\d+) calls/s"),
    "call on 4 + gather, us": re.compile(r"\+ gather\s+median\s+([\d.]+) us"),
}


def run(code: str, where: Path, calls: int) -> dict[str, float]:
    (where / "sitecustomize.py").write_text(code)
    path = os.pathsep.join(filter(None, [str(where), os.environ.get("PYTHONPATH")]))
    out = subprocess.run(
        [sys.executable, "-m", "meshio", "bench", "--calls", str(calls), "--procs", "4"],
        capture_output=True, text=True, check=True, timeout=600,
        env={**os.environ, "PYTHONPATH": path}).stdout
    found: dict[str, float] = {}
    for row, pattern in ROWS.items():
        m = pattern.search(out)
        assert m is not None, f"{row!r} not in:\n{out}"
        found[row] = float(m.group(1))
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--calls", type=int, default=2000)
    args = parser.parse_args()
    results: dict[str, dict[str, list[float]]] = {
        name: {row: [] for row in ROWS} for name in SETUPS}
    with tempfile.TemporaryDirectory() as tmp:
        dirs = {name: Path(tmp, str(i)) for i, name in enumerate(SETUPS)}
        for d in dirs.values():
            d.mkdir()
        for rep in range(args.reps):
            for name, code in SETUPS.items():  # interleaved: drift hits all alike
                for row, value in run(code, dirs[name], args.calls).items():
                    results[name][row].append(value)
            print(f"repetition {rep + 1}/{args.reps} done", file=sys.stderr)
    print(f"{'':26}" + "".join(f"{name:>22}" for name in SETUPS))
    for row in ROWS:
        base = statistics.median(results["absent"][row])
        cells = []
        for name in SETUPS:
            med = statistics.median(results[name][row])
            cells.append(f"{med:>12.1f} ({med / base:4.2f}x)")
        print(f"{row:26}" + "".join(f"{c:>22}" for c in cells))


if __name__ == "__main__":
    main()
