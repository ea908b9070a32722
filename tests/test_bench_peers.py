"""The peer benchmark's meshio backend (``benchmarks/peers/``), end to end at
a tiny size so it cannot rot: the harness's whole measurement run on this
test's standard loop, the payload sweep on uvloop (``meshio.run``) in its
own process, then ``run.py``'s table and plot from what they wrote.  No
timing is asserted, only that every measurement came back."""

from __future__ import annotations

import argparse
import ast
import importlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

PEERS_DIR = Path(__file__).resolve().parent.parent / "benchmarks" / "peers"


def _module(name: str) -> ModuleType:
    return importlib.import_module(name)


@pytest.fixture
def peers(monkeypatch: pytest.MonkeyPatch) -> Path:
    """The harness on sys.path and, for the worker processes and the cold-start
    child, on PYTHONPATH, with the meshio backend beside it."""
    monkeypatch.syspath_prepend(str(PEERS_DIR))
    try:
        harness = Path(_module("run").find_peers())
    except SystemExit:
        pytest.skip("the shared peer harness (shared/bench-peers) is not on this machine")
    monkeypatch.syspath_prepend(str(harness))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
        [str(harness), str(PEERS_DIR), *filter(None, [os.environ.get("PYTHONPATH")])]))
    monkeypatch.setenv("MESHIO_BENCH_PEERS", str(harness))
    return harness


def test_a_ratio_meets_its_goal_unrounded(monkeypatch: pytest.MonkeyPatch) -> None:
    """The table says whether each goal is met from the ratio itself: 0.104x
    prints as 0.10x, and misses a goal of 0.1x."""
    monkeypatch.syspath_prepend(str(PEERS_DIR))
    ratio = _module("run").ratio
    assert ratio(118.0, 1126.0, "≤ 0.1x") == "0.10x (goal ≤ 0.1x: **missed**, 0.105x)"
    assert ratio(112.0, 1154.0, "≤ 0.1x") == "0.10x (goal ≤ 0.1x: met)"
    assert ratio(18036.0, 10076.0, "≥ 1.0x") == "1.79x (goal ≥ 1.0x: met)"
    assert ratio(170.0, 167.0, "< 1.0x") == "1.02x (goal < 1.0x: **missed**, 1.018x)"
    assert ratio(3.0, 2.0) == "1.50x" and ratio(None, 2.0, "≥ 1.0x") == "—"


@pytest.mark.timeout(240)  # a hang guard: 4 proc meshes whose workers import torch
async def test_meshio_backend_runs_through_the_harness_on_both_loops(
        peers: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    harness, bench, run = _module("harness"), _module("bench_meshio"), _module("run")
    monkeypatch.setenv("MESHIO_BENCH_LOOP", "asyncio")
    args = argparse.Namespace(reps=1, calls=5, warmup=1, inflight=10, batches=1, bcast_calls=3,
                              sizes_mib=[1], cold_timeout=120)
    res = await harness.run_all(bench.MeshioBackend(), args, bench.__file__)
    assert res["backend"] == "meshio-asyncio"
    assert set(res["payload"]) == {f"{k} 1 MiB" for k in ("bytes", "torch.Tensor",
                                                           "numpy.ndarray")}
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "meshio-asyncio.json").write_text(json.dumps(res))

    out = tmp_path / "sweep" / "meshio-uvloop.json"
    proc = subprocess.run(
        [sys.executable, str(PEERS_DIR / "sweep.py"), "bench_meshio:MeshioBackend",
         "--kinds", "bytes", "torch.Tensor", "--max-bytes", "65536", "--out", str(out)],
        env={**os.environ, "MESHIO_BENCH_LOOP": "uvloop"}, capture_output=True, text=True,
        timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    sweep = json.loads(out.read_text())
    assert sweep["backend"] == "meshio-uvloop"
    assert {k: sorted(v) for k, v in sweep["points"].items()} == {
        k: ["4096", "65536"] for k in ("bytes", "torch.Tensor")}
    assert all("MiB_per_s" in p for v in sweep["points"].values() for p in v.values())

    table = run.table(str(tmp_path), {})
    row = next(line for line in table.splitlines() if line.startswith("| 64 MiB `bytes`"))
    assert row.split(" | ")[1] == "—"  # this run moved 1 MiB only: no 64 MiB cell
    latency = next(line for line in table.splitlines() if line.startswith("| int→int latency, "
                                                                            "median"))
    assert latency.split(" | ")[1].replace(",", "").isdigit(), latency  # meshio-asyncio
    plot = tmp_path / "plot.png"  # in a process of its own: matplotlib keeps its fonts open
    subprocess.run([sys.executable, "-c", f"import run; run.plot({str(tmp_path)!r}, "
                    f"{str(plot)!r})"], check=True, timeout=120)
    assert plot.stat().st_size > 0


def test_bench_workloads_meshio_side_and_table_at_a_tiny_size() -> None:
    """``benchmarks/bench_workloads.py``: the meshio side of the RL workload
    (a generator killed mid-rollout included) and its table, Ray reported as
    not measured; no timing asserted."""
    bench = Path(__file__).resolve().parent.parent / "benchmarks" / "bench_workloads.py"
    p = subprocess.run([sys.executable, "-c", (
        "import json, runpy, sys; sys.argv = ['bench_workloads.py'];"
        f"g = runpy.run_path({str(bench)!r}, run_name='bench');"
        "import meshio; m = meshio.run(g['measure_meshio'](8, 4, [1], 1));"
        "print(g['table'](m, 'skipped in the test')); print(json.dumps(m))")],
        capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    m = json.loads(p.stdout.strip().splitlines()[-1])
    assert m["step_ms"] > 0 and m["sync_ms"]["1"] > 0 and m["reward_last5"] >= 0
    assert "| time per RL step" in p.stdout and "Ray not measured: skipped in the test" in p.stdout


@pytest.mark.timeout(240)
def test_bench_small_with_its_floor_at_a_tiny_size(peers: Path) -> None:
    """``benchmarks/bench_small.py``: meshio, the plain-asyncio baseline and
    the bare-transport floor side by side on the standard loop; every row
    (the call on 4 too) comes back with a number for each side (no timing
    asserted)."""
    bench = Path(__file__).resolve().parent.parent / "benchmarks" / "bench_small.py"
    p = subprocess.run([sys.executable, str(bench), "--reps", "1", "--calls", "50",
                        "--warmup", "10", "--inflight", "50", "--batches", "1",
                        "--bcast-calls", "10"], capture_output=True, text=True, timeout=200)
    assert p.returncode == 0, p.stderr
    rows = {line.split(" | ")[0].strip("| "): line for line in p.stdout.splitlines()
            if line.startswith("| ") and "---" not in line}
    assert set(rows) == {"measurement", "latency median us", "latency p99 us",
                         "50 in flight calls/s", "call on 4 + gather median us",
                         "call on 4 + gather p99 us"}, p.stdout
    for key, line in rows.items():
        if key != "measurement":  # meshio, plain asyncio, the floor: each a number
            cells = line.strip("| ").split(" | ")
            for cell in (cells[1], cells[2], cells[4]):
                assert float(cell.split(" ")[0].replace(",", "")) > 0, line


@pytest.mark.timeout(240)
def test_bench_bulk_measures_every_row_on_both_loops() -> None:
    """``benchmarks/bench_bulk.py`` (the large-value rows of benchmarks/README)
    at a tiny size: memcpy, clone, a tensor argument and a tensor result,
    each loop in a process of its own, every row with a rate (no timing
    asserted)."""
    bench = Path(__file__).resolve().parent.parent / "benchmarks" / "bench_bulk.py"
    p = subprocess.run([sys.executable, str(bench), "--mib", "2", "--reps", "2"],
                       capture_output=True, text=True, timeout=200)
    assert p.returncode == 0, p.stderr
    rows = {(line.split()[0], line.split()[3]): line for line in p.stdout.splitlines()}
    assert set(rows) == {(loop, name) for loop in ("std", "uvloop")
                         for name in ("memcpy", "clone", "argument", "result")}, p.stdout
    for line in rows.values():
        assert float(line.split("median")[1].split()[0]) > 0, line


def test_bench_fanout_controller_cost_measured_alone_and_floor() -> None:
    """``benchmarks/bench_fanout.py``'s in-process part (the controller's CPU
    per actor of a gathered call) runs against the current internals, and
    its floor (bare echo processes) measures."""
    bench = Path(__file__).resolve().parent.parent / "benchmarks" / "bench_fanout.py"
    p = subprocess.run([sys.executable, "-c", (
        "import runpy; g = runpy.run_path(" + repr(str(bench)) + ", run_name='bench');"
        "print(g['controller_cost_hot'](16, 3)); print(g['floor'](3, 2))")],
        capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    hot, floor = map(float, p.stdout.strip().splitlines()[-2:])
    assert hot > 0 and floor > 0


@pytest.mark.timeout(600)
def test_bench_instructions_counts_a_worker_under_callgrind(peers: Path) -> None:
    """``benchmarks/bench_instructions.py``: a worker started through its
    callgrind wrapper is counted (its start-up taken out by the two runs'
    difference), with its calls in flight and one after another (each then
    a turn of the loop and a read of its own: more per call).  No count is
    asserted beyond that.  Needs valgrind, which CI installs."""
    if shutil.which("valgrind") is None:
        pytest.skip("valgrind is not installed (apt-get install valgrind)")
    bench = Path(__file__).resolve().parent.parent / "benchmarks" / "bench_instructions.py"
    counts = {}
    for pattern in ("inflight", "lone"):
        p = subprocess.run([sys.executable, str(bench), "--sides", "meshio", "--where", "worker",
                            "--batches", "1", "--pattern", pattern],
                           capture_output=True, text=True, timeout=280)
        assert p.returncode == 0, p.stderr
        row = next(line for line in p.stdout.splitlines() if line.startswith("| worker |"))
        counts[pattern] = int(row.strip("| ").split(" | ")[1].replace(",", ""))
    assert 1000 < counts["inflight"] < counts["lone"], counts  # (thousands a call)


@pytest.mark.parametrize(("args", "error"), [
    (["--hosts", "2", "--per-host", "2", "--calls", "3"], "--hosts 2: give at least two"),
    (["--hosts", "4"], "--hosts 4: give at least two"),
    (["--hosts", "4", "4"], "--hosts 4 4: give at least two"),
    (["--hosts", "2", "4", "--per-host", "1", "--calls", "1"], "--per-host 1: give at least 2")])
def test_bench_fanout_refuses_what_its_model_cannot_fit(args: list[str], error: str) -> None:
    """``benchmarks/bench_fanout.py`` refuses, before measuring anything,
    sizes its model cannot fit (one host count: a line through one point;
    one process per host: no relay to time) instead of measuring them all
    and then dividing by zero."""
    bench = Path(__file__).resolve().parent.parent / "benchmarks" / "bench_fanout.py"
    p = subprocess.run([sys.executable, str(bench), *args], capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 2, p.stdout + p.stderr
    assert p.stdout == "", p.stdout  # nothing measured
    assert f"bench_fanout.py: error: {error}" in p.stderr, p.stderr


@pytest.mark.timeout(120)
def test_bench_small_baseline_workers_run_uvloop_with_it(peers: Path, tmp_path: Path) -> None:
    """``benchmarks/bench_small.py --loop uvloop`` starts the plain-asyncio
    baseline's workers with ``peers/uvloop_site`` on their ``PYTHONPATH``:
    each has uvloop loaded (its ``sitecustomize`` imports it and makes it
    asyncio's loop), which a standard-loop worker never imports."""
    bench = Path(__file__).resolve().parent.parent / "benchmarks" / "bench_small.py"
    for f in peers.glob("*.py"):  # the harness writes beside its scripts: a copy
        shutil.copy(f, tmp_path)
    p = subprocess.run([sys.executable, "-c", (
        "import asyncio, runpy, sys;"
        f"g = runpy.run_path({str(bench)!r}, run_name='bench')\n"
        f"sys.path.insert(0, {str(tmp_path)!r})\n"
        "import bench_rawasyncio\n"
        "async def main():\n"
        "    for loop in ('asyncio', 'uvloop'):\n"
        "        group = await g['spawn_baseline'](bench_rawasyncio.RawBackend(), 1,\n"
        "                                          g['baseline_pythonpath'](loop))\n"
        "        try:\n"
        "            with open(f'/proc/{group.conns[0].proc.pid}/maps') as f:\n"
        "                print(loop, '/uvloop/' in f.read())\n"
        "        finally:\n"
        "            await group.stop()\n"
        "asyncio.run(main())")], capture_output=True, text=True, timeout=100)
    assert p.returncode == 0, p.stderr
    assert p.stdout.split() == ["asyncio", "False", "uvloop", "True"], p.stdout


@pytest.mark.parametrize("script", sorted(
    f.name for f in (Path(__file__).resolve().parent.parent / "benchmarks").glob("*.py")
    if "description=" in f.read_text() and "__doc__" in f.read_text()))
def test_bench_help_describes_with_the_docstring_first_paragraph(script: str) -> None:
    """A benchmark's ``--help`` describes it with its docstring's whole first
    paragraph, not a line cut mid-sentence."""
    bench = Path(__file__).resolve().parent.parent / "benchmarks" / script
    p = subprocess.run([sys.executable, str(bench), "--help"], capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 0, p.stderr
    doc = ast.get_docstring(ast.parse(bench.read_text()), clean=False) or ""
    # (compared without white space: argparse wraps at hyphens too)
    assert "".join(doc.split("\n\n")[0].split()) in "".join(p.stdout.split()), p.stdout


def test_peers_run_report_keeps_failures_and_no_stale_plot(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``benchmarks/peers/run.py``: ``--no-sweep`` over all systems leaves no
    plot of an earlier sweep beside a table that measured none, and the
    systems a run could not measure are still listed when ``--report-only``
    writes the section again."""
    monkeypatch.syspath_prepend(str(PEERS_DIR))
    run = _module("run")
    plot, readme = tmp_path / "payload_throughput.png", tmp_path / "README.md"
    plot.write_bytes(b"an earlier sweep's plot")
    readme.write_text("# benchmarks\n")
    for name, value in (("BENCH", str(tmp_path)), ("PLOT", str(plot)), ("README", str(readme)),
                        ("find_peers", lambda: str(tmp_path))):
        monkeypatch.setattr(run, name, value)
    monkeypatch.setattr(run, "measure", lambda *a: {"ray": "virtualenv venv-ray could not "
                                                           "be made (no network)"})
    for args in (["--no-sweep"], ["--report-only"]):
        monkeypatch.setattr(sys, "argv", ["run.py", *args])
        run.main()
        text = readme.read_text()
        assert "Not measured in this run:\n- ray: virtualenv venv-ray could not be made" in text
        assert "(payload_throughput.png)" not in text and "no plot" in text, text
        assert not plot.exists()


@pytest.mark.timeout(300)
def test_bench_flame_writes_both_graphs(tmp_path: Path) -> None:
    """``benchmarks/bench_flame.py`` samples the controller and its worker
    with py-spy under 1,000 calls in flight and writes both flame graphs,
    titled with the commit and the loop."""
    bench = Path(__file__).resolve().parent.parent / "benchmarks" / "bench_flame.py"
    p = subprocess.run([sys.executable, str(bench), "--seconds", "1", "--out", str(tmp_path)],
                       capture_output=True, text=True, timeout=280)
    assert p.returncode == 0, p.stdout + p.stderr
    # each side's own frames: the caller's call_one, the worker's actor serving
    for side, frame in (("controller", "Endpoint.call_one ("), ("worker", "Runtime.dispatch (")):
        svg = (tmp_path / f"flame_small_calls_{side}.svg").read_text()
        assert f"the {side}, 1,000 calls in flight, uvloop</text>" in svg
        assert f"<title>{frame}" in svg
