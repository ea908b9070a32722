"""The README's first command and the examples, end to end, as a user runs them."""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _run(*args: str) -> str:
    proc = subprocess.run(args, capture_output=True, text=True, timeout=120, cwd=ROOT,
                          env={**os.environ, "PYTHONWARNINGS": "error"})
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_meshio_demo_runs_every_step() -> None:
    meshio_cmd = shutil.which("meshio") or os.path.join(os.path.dirname(sys.executable), "meshio")
    assert os.path.exists(meshio_cmd), "the meshio console script is not installed"
    out = _run(meshio_cmd, "demo")  # exactly what README.md tells a new user to run
    for step in ("call:", "call_one:", "choose:", "stream:", "broadcast:",
                 "actor to actor", "tensor", "ActorError", "RuntimeError: demo failure",
                 "round trip", "total"):
        assert step in out, f"{step!r} missing from demo output:\n{out}"


def test_readme_names_the_demo_command() -> None:
    readme = (ROOT / "README.md").read_text()
    assert "meshio demo" in readme
    assert "python -m pytest" in readme


def test_quickstart_example() -> None:
    out = _run(sys.executable, "examples/quickstart.py")
    assert "call      [0.0, 1.0, 2.0, 3.0]" in out
    assert out.count("stream ") == 4
    counts = eval(out.split("count     ")[1].splitlines()[0])
    assert sorted(counts) in ([3, 3, 3, 5], [3, 3, 4, 4]) or sum(counts) == 14, counts


def test_rl_loop_example() -> None:
    out = _run(sys.executable, "examples/rl_loop.py")
    assert "progress [1, 2, 3, 4, 5] final version 5" in out


def test_observe_example() -> None:
    """issue 19 §2: worker log records filtered by rank on the controller,
    stats() and a Prometheus scrape of the same numbers."""
    out = _run(sys.executable, "examples/observe.py")
    records = [line for line in out.splitlines() if line.startswith("record")]
    assert records == ["record  train trainers rank 1: loss 1.000 at step 1",
                       "record  train trainers rank 1: loss 0.500 at step 2"]
    assert out.count("failed   ValueError") == 1
    for rank in (0, 1):
        assert (f"stats    train proc {rank} trainers[{rank}] Trainer.step: calls 3 errors 1 "
                "p50 ok; restarts 0, cpu>0 True, rss>0 True") in out
        assert re.search(re.escape(
            'scraped  meshio_endpoint_calls_total{mesh="train",mesh_id="train-')
            + "[0-9a-f]{8}" + re.escape(
                f'",proc="{rank}",host="{socket.gethostname()}",actor="trainers",'
                f'rank="{rank}",endpoint="Trainer.step"}} 3'), out)


def test_supervised_example() -> None:
    out = _run(sys.executable, "examples/supervised.py")
    assert "failure  procs rank 1: killed by signal SIGKILL" in out
    assert "restart  procs rank 1" in out
    assert "w[0]" in out and "restored=False" in out
    assert "w[1]" in out and "restored=True" in out


def test_supervised_ddp_example() -> None:
    """issue 15 items 9 and 10: a DDP gang (gloo) loses a rank to SIGKILL,
    comes back under one_for_all with its torch.distributed settings, and
    resumes from the controller's checkpoint: the steps replayed from it
    give the same losses as before, and the loss goes down."""
    out = _run(sys.executable, "examples/supervised_ddp.py")
    assert "step 13 failed: killed by signal SIGKILL" in out
    assert "resumed from the checkpoint of step 10" in out
    losses: dict[int, list[float]] = {}
    for line in out.splitlines():
        if line.startswith("step ") and ": loss " in line:
            step, loss = line.removeprefix("step ").split(": loss ")
            losses.setdefault(int(step), []).append(float(loss))
    assert sorted(losses) == list(range(24))
    assert [len(losses[s]) for s in range(24)] == [1] * 10 + [2] * 3 + [1] * 11
    assert all(losses[s][0] == losses[s][1] for s in (10, 11, 12))  # the same weights again
    assert losses[23][0] < losses[0][0] / 10
    for kind in ("failure procs rank 1", "restart procs rank 0", "restart procs rank 1"):
        assert f"event {kind}" in out


def test_rdma_example() -> None:
    out = _run(sys.executable, "examples/rdma_weights.py")
    assert "backend ['same_host', 'same_host']" in out
    assert "pulled [3.0, 3.0]" in out


def test_weight_store_example() -> None:
    out = _run(sys.executable, "examples/weight_store.py")
    for step in (1, 2, 3):
        assert f"step {step}: generators used versions [({step}, {step}.0), ({step}, {step}.0)]" \
            in out, out
    assert "newest version 3" in out


def test_service_example() -> None:
    out = _run(sys.executable, "examples/service.py")
    assert out.startswith("alice -> replica 0: HI FROM ALICE\nbob   -> replica 1: HI FROM BOB\n"
                          "alice -> replica 0: HI FROM ALICE\nbob   -> replica 1: HI FROM BOB\n")
    assert "alice after the kill: served by a live process: True" in out
    assert "restart  procs rank 0" in out and "replicas 3 answers 3" in out
    stats = [line for line in out.splitlines() if line.startswith("replica ")]
    assert [s.split(":")[0] for s in stats] == ["replica 0", "replica 1", "replica 2"]
    assert all("alive=True in_flight=0" in s for s in stats)
    assert sum(int(s.split("completed=")[1]) for s in stats) == 12
    assert out.endswith("replicas 2\n")


def test_rl_grpo_example() -> None:
    """issue 17 §4: every step's rollouts used the version the learner
    published for it, none failed though a generator was SIGKILLed with a
    rollout in flight, the restarted replica serves later rollouts, and the
    policy's reward improves."""
    out = _run(sys.executable, "examples/rl_grpo.py", "--steps", "24", "--kill-at", "8")
    steps = [line for line in out.splitlines()
             if line.startswith("step ") and " versions " in line]
    assert len(steps) == 24, out
    rewards, pids = [], []
    for step, line in enumerate(steps):
        assert line.startswith(f"step {step}: versions [{step}, {step}] reward "), line
        rewards.append(float(line.split(" reward ")[1].split()[0]))
        pids.append(line.split(" pids ")[1])
    assert "step 8: killed generator process" in out
    back = out.split("generator replica back as process ")[1].split()[0]
    assert any(back in p for p in pids[9:]), out  # the restarted replica takes rollouts again
    killed = out.split("killed generator process ")[1].split()[0]
    assert not any(killed in p for p in pids[9:])
    assert sum(rewards[-5:]) / 5 > sum(rewards[:5]) / 5 + 0.4, rewards
    assert out.endswith("newest version 24\n")


def test_ft_training_example(tmp_path: Path) -> None:
    """issue 17 §4: data-parallel training over 3 gloo ranks loses rank 1 to
    SIGKILL during step 5.  The step is not applied, the 2 survivors (never
    restarted) redo it in a new process group, the replacement joins a few
    steps later with the weights of that step from a survivor's store, and
    every step is applied exactly once by every rank that was there: the
    losses are those of plain full-batch training, and they go down."""
    import importlib.util

    import torch

    steps, kill_at = 16, 5
    png = tmp_path / "ft.png"
    out = _run(sys.executable, "examples/ft_training.py", "--ranks", "3", "--steps", str(steps),
               "--kill-at", str(kill_at), "--kill-rank", "1", "--plot", str(png))
    lines = out.splitlines()
    assert f"step {kill_at}: SIGKILL rank 1" in lines, out
    assert any(line.startswith(f"step {kill_at}: aborted in generation 1 after ")
               and line.endswith("(rank 1 died): not applied, the 2 others redo it")
               for line in lines), out
    assert any(line.startswith(f"step {kill_at}: generation 2, ranks [0, 2] (") for line in lines)
    joined = [line for line in lines if "rank 1 joined with the weights of step" in line]
    assert len(joined) == 1, out
    rejoin = int(joined[0].split()[1].rstrip(":"))
    assert kill_at < rejoin <= kill_at + 5, out  # REJOIN_WAIT
    assert joined[0].startswith(f"step {rejoin}: generation 3, ranks [0, 1, 2], rank 1 joined "
                                f"with the weights of step {rejoin} (")
    # each step reported applied once, in order, by the world of that moment
    applied = [line.split() for line in lines if " loss " in line and " world " in line]
    assert [int(w[1].rstrip(":")) for w in applied] == list(range(steps)), out
    worlds = [int(w[5]) for w in applied]
    assert worlds == [3] * kill_at + [2] * (rejoin - kill_at) + [3] * (steps - rejoin)
    # every rank applied each step it was there for exactly once
    assert f"rank 0 applied steps {list(range(steps))}" in lines
    assert f"rank 2 applied steps {list(range(steps))}" in lines
    assert f"rank 1 applied steps {list(range(rejoin, steps))}" in lines
    assert "the same weights on every rank: True" in lines
    # the losses are those of full-batch SGD run here, step after step: no
    # step was lost or applied twice, and the replacement's weights were right
    spec = importlib.util.spec_from_file_location("ft_training",
                                                  ROOT / "examples" / "ft_training.py")
    assert spec is not None and spec.loader is not None
    ft = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ft)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(ft.FEATURES, ft.HIDDEN), torch.nn.Tanh(),
                                torch.nn.Linear(ft.HIDDEN, 1))
    expected = []
    for step in range(steps):
        x, y = ft.batch(step)
        model.zero_grad()
        loss = ((model(x) - y) ** 2).mean()
        loss.backward()
        with torch.no_grad():
            for param in model.parameters():
                param.sub_(ft.LR * param.grad)
        expected.append(float(loss.detach()))
    losses = [float(w[3]) for w in applied]
    assert losses == pytest.approx(expected, abs=2e-4), (losses, expected)
    assert sum(losses[-3:]) < sum(losses[kill_at - 3:kill_at]) < sum(losses[:3])
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_elastic_example() -> None:
    out = _run(sys.executable, "examples/elastic.py")
    assert "steps [2, 2] holes [{'gpus': 1}]\n" in out
    assert "after replace [3, 1, 3]\n" in out  # rank 1 rebuilt from step=0
    assert "after grow {'gpus': 5} [4, 2, 4, 1, 1] world [5, 5, 5, 5, 5]\n" in out
    assert "after shrink {'gpus': 2} [5, 3]" in out


def test_meshio_bench_prints_its_measurements() -> None:
    out = _run(sys.executable, "-m", "meshio._cli", "bench", "--calls", "300",
               "--inflight", "200", "--procs", "2")
    assert "round trip, one call at a time" in out and "us" in out
    assert "throughput, 200 calls in flight" in out and "calls/s" in out
    assert "call on 2 actors + gather" in out


def test_meshio_demo_table_has_no_torch_numpy_warning(tmp_path: Path) -> None:
    """issue 8 item 7: with torch but without numpy (torch then warns "Failed
    to initialize NumPy" in the controller and in every worker that receives
    a tensor), the demo's output, stderr included, is its table and nothing
    else."""
    no_numpy = tmp_path / "no_numpy" / "numpy"
    no_numpy.mkdir(parents=True)
    (no_numpy / "__init__.py").write_text(
        'raise ModuleNotFoundError("No module named \'numpy\'", name="numpy")\n')
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(no_numpy.parent), *filter(None, [os.environ.get("PYTHONPATH")])])}
    proc = subprocess.run([sys.executable, "-m", "meshio._cli", "demo"], cwd=ROOT, env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stdout
    header, *table = proc.stdout.splitlines()
    assert header.startswith("meshio demo: controller pid"), proc.stdout
    assert "Warning" not in proc.stdout and "NumPy" not in proc.stdout, proc.stdout
    assert all(line.startswith("  ") and ("ms" in line or "us/call" in line
                                          or "(no reply)" in line) for line in table), proc.stdout
    assert table[-1].startswith("  total (procs stopped)"), proc.stdout


def test_reattach_example() -> None:
    """issue 18 §8: a SIGKILLed controller's trainers, re-attached with their state."""
    out = _run(sys.executable, "examples/reattach.py")
    assert out.splitlines() == [
        "first controller killed",
        "reattached gpus=0: step 3 weight 1.5", "reattached gpus=1: step 3 weight 1.5",
        "trained on gpus=0: step 5 weight 2.5", "trained on gpus=1: step 5 weight 2.5"]


def test_the_demo_table_stays_aligned_without_torch() -> None:
    """Without torch the row "send a list of floats (install torch for
    tensors)" was wider than the label column, and pushed its time out of
    line with the others."""
    out = _run(sys.executable, "-c", "import meshio, meshio._demo as demo; "
               "demo._import_torch = lambda: None; meshio.run(demo.demo())")
    assert "install torch for tensors" in out, out
    rows = [line for line in out.splitlines()[1:] if re.search(r" (ms|us/call)\b", line)]
    assert len(rows) > 10, out
    ends = {m.start() for line in rows if (m := re.search(r"\d (ms|us/call)\b", line))}
    assert len(ends) == 1, out
