"""``spawn_procs(env=..., bootstrap=...)`` with real processes: the
environment and the set-up function reach every new process (a supervisor's
replacement too) before any actor module is imported; a failing bootstrap
fails the start naming it; bad arguments fail before any process starts.

The actor lives in ``bootstrap_probe``, imported here only inside tests, so
that a worker imports it only when it loads the actor class.  Nothing sleeps
to wait for something: tests wait on calls, supervisor events and forwarded
output, each under a generous ``asyncio.wait_for`` guard.
"""

from __future__ import annotations

import asyncio
import functools
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from supervision_helpers import DEADLINE, Events, Supervised, manual_sup, until

import meshio
from meshio.testing import child_pids
from script_run import run_script


def record_boot(path: str) -> None:
    """A bootstrap (module-level: pickled by reference): appends this
    process's pid, and whether the actor's module was loaded already, to
    ``path``; leaves a mark in the environment for that module to see."""
    with open(path, "a") as f:
        f.write(f"{os.getpid()} {'bootstrap_probe' in sys.modules}\n")
    os.environ["BOOTSTRAP_MARK"] = str(os.getpid())


def boots(path: Path) -> list[tuple[int, str]]:
    """What :func:`record_boot` wrote: (pid, actor module loaded already)."""
    return [(int(pid), loaded) for pid, loaded in
            (line.split() for line in path.read_text().splitlines())]


async def test_env_reaches_every_worker_and_meshio_keys_win() -> None:
    """Every worker has ``env`` in its environment; the ``gpus`` dim gives
    each process one of the devices ``CUDA_VISIBLE_DEVICES`` in ``env``
    lists, and a ``PYTHONPATH`` in ``env`` is kept after meshio's own entry."""
    from bootstrap_probe import Probe

    extra = os.path.join(os.sep, "opt", "extra-site")
    env = {"NCCL_DEBUG": "INFO", "NCCL_SOCKET_IFNAME": "lo", "CUDA_VISIBLE_DEVICES": "7,5",
           "PYTHONPATH": extra}
    async with meshio.this_host().spawn_procs(per_host={"gpus": 2}, env=env) as procs:
        probe = await procs.spawn("probe", Probe)
        seen = (await asyncio.wait_for(probe.env.call(
            ["NCCL_DEBUG", "NCCL_SOCKET_IFNAME", "CUDA_VISIBLE_DEVICES", "PYTHONPATH",
             "MESHIO_WORKER"]), DEADLINE)).values()
    assert [(s["NCCL_DEBUG"], s["NCCL_SOCKET_IFNAME"], s["CUDA_VISIBLE_DEVICES"])
            for s in seen] == [("INFO", "lo", "7"), ("INFO", "lo", "5")]
    for s in seen:
        path = s["PYTHONPATH"]
        assert path is not None and path.split(os.pathsep)[1:] == [extra]
        assert s["MESHIO_WORKER"] is not None and s["MESHIO_WORKER"].startswith("procs-")


async def test_a_gpus_dim_maps_onto_the_devices_its_host_makes_visible(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Under a scheduler that gave the job devices 4 and 6 (the controller's
    own ``CUDA_VISIBLE_DEVICES``), ``gpus`` 0 and 1 are devices 4 and 6, not
    0 and 1 (another job's); a dim longer than the list fails to start,
    naming it, and leaves no process."""
    from bootstrap_probe import Probe

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4, 6")
    async with meshio.this_host().spawn_procs(per_host={"gpus": 2}) as procs:
        probe = await procs.spawn("probe", Probe)
        seen = (await asyncio.wait_for(probe.env.call(["CUDA_VISIBLE_DEVICES", "MESHIO_GPU"]),
                                       DEADLINE)).values()
    assert [(s["CUDA_VISIBLE_DEVICES"], s["MESHIO_GPU"]) for s in seen] == [("4", None),
                                                                            ("6", None)]
    before = set(child_pids())
    with pytest.raises(meshio.ProcessStartError) as ei:
        await meshio.this_host().spawn_procs(per_host={"gpus": 3})
    assert ei.value.rank == 2 and str(ei.value).endswith(
        "failed to start: its gpus index 2 is beyond the 2 device(s) that "
        f"CUDA_VISIBLE_DEVICES='4, 6' lists on {ei.value.host}; make the gpus dim at most 2 "
        "long there, or set CUDA_VISIBLE_DEVICES in spawn_procs(env=...)"), ei.value
    await until(lambda: set(child_pids()) <= before)


async def test_bootstrap_runs_once_per_process_before_actor_modules(tmp_path: Path) -> None:
    """The bootstrap runs once in each process, before the actor's module is
    imported there (the module's top-level code sees its mark, and it was not
    loaded when the bootstrap ran)."""
    from bootstrap_probe import Probe

    path = tmp_path / "boots"
    async with meshio.this_host().spawn_procs(
            per_host={"procs": 3},
            bootstrap=functools.partial(record_boot, str(path))) as procs:
        probe = await procs.spawn("probe", Probe)
        marks = (await asyncio.wait_for(probe.mark_at_import.call(), DEADLINE)).values()
        pids = procs.pids
    assert marks == [str(pid) for pid in pids]
    assert sorted(boots(path)) == sorted((pid, "False") for pid in pids)


async def test_restarted_process_gets_env_and_runs_bootstrap_again(tmp_path: Path) -> None:
    """A supervisor's replacement for a SIGKILLed process is a new process:
    it has ``env`` and runs the bootstrap again (once), before its actors'
    module is imported; the other processes do not run it again."""
    from bootstrap_probe import Probe

    path = tmp_path / "boots"
    sup, _ = manual_sup()
    async with Events(sup) as events, meshio.this_host().spawn_procs(
            per_host={"procs": 2}, supervisor=sup, env={"RUN_ID": "r42"},
            bootstrap=functools.partial(record_boot, str(path))) as procs:
        s = Supervised(sup, events, procs, procs.pids)
        probe = await procs.spawn("probe", Probe)
        os.kill(s.old[1], signal.SIGKILL)
        _, restart = await s.restarted(1)
        seen = (await asyncio.wait_for(probe.env.call(["RUN_ID"]), DEADLINE)).values()
        marks = (await asyncio.wait_for(probe.mark_at_import.call(), DEADLINE)).values()
        assert procs.pids == [s.old[0], restart.pid]
    assert seen == [{"RUN_ID": "r42"}] * 2
    assert marks == [str(s.old[0]), str(restart.pid)]
    assert sorted(boots(path)) == sorted(
        (pid, "False") for pid in (*s.old, restart.pid))


async def test_coroutine_bootstrap_is_awaited_on_a_plain_asyncio_loop() -> None:
    """A coroutine function (defined here, so pickled by value) is awaited
    to completion in each process, on an asyncio loop of its own (not the
    worker's uvloop loop, which is not running yet)."""
    from bootstrap_probe import Probe

    async def setup() -> None:
        await asyncio.sleep(0)  # really suspends: the loop runs it to the end
        loop = asyncio.get_running_loop()
        os.environ["BOOT_LOOP"] = f"{type(loop).__module__} {os.getpid()}"

    async with meshio.this_host().spawn_procs(per_host={"procs": 2},
                                              bootstrap=setup) as procs:
        probe = await procs.spawn("probe", Probe)
        seen = (await asyncio.wait_for(probe.env.call(["BOOT_LOOP"]), DEADLINE)).values()
        pids = procs.pids
    assert seen == [{"BOOT_LOOP": f"asyncio.unix_events {pid}"} for pid in pids]


async def test_bootstrap_larger_than_a_socket_buffer_by_value() -> None:
    """A bootstrap defined in a test (pickled by value) with 8 MiB of data
    in its closure, far more than a socket buffer holds, reaches every
    process (the controller writes it as the processes read it)."""
    from bootstrap_probe import Probe

    weights = bytes(range(256)) * (32 << 10)

    def setup() -> None:
        os.environ["BOOT_DATA"] = f"{len(weights)} {sum(weights[:1024])}"

    async with meshio.this_host().spawn_procs(per_host={"procs": 2},
                                              bootstrap=setup) as procs:
        probe = await procs.spawn("probe", Probe)
        seen = (await asyncio.wait_for(probe.env.call(["BOOT_DATA"]), DEADLINE)).values()
    assert seen == [{"BOOT_DATA": f"{8 << 20} {sum(weights[:1024])}"}] * 2


async def test_raising_bootstrap_fails_the_start_naming_it(
        capsys: pytest.CaptureFixture[str]) -> None:
    """A bootstrap that raises fails ``spawn_procs`` with ProcessStartError
    naming the function and the exception; its traceback reaches the
    controller's stderr with the process's label; no process is left (the
    leak check too)."""
    before = child_pids()

    def needs_gpu() -> None:
        raise RuntimeError("no GPU 3 here")

    with pytest.raises(meshio.ProcessStartError) as ei:
        async with meshio.this_host().spawn_procs(per_host={"procs": 2},
                                                  bootstrap=needs_gpu):
            pass
    e = ei.value
    name = f"{__name__}.{needs_gpu.__qualname__}"
    assert e.cause == f"bootstrap {name}() raised RuntimeError: no GPU 3 here"
    assert f"worker rank {e.rank} (pid {e.pid} on " in str(e)
    assert f"failed to start: {e.cause}; its traceback is in the process's stderr" in str(e)
    assert child_pids() - before == set()
    err = ""

    def traceback_forwarded() -> bool:
        nonlocal err
        err += capsys.readouterr().err
        return f"[procs procs={e.rank}] RuntimeError: no GPU 3 here" in err

    await until(traceback_forwarded)
    assert f"[procs procs={e.rank}] Traceback (most recent call last):" in err
    assert 'raise RuntimeError("no GPU 3 here")' in err  # by value, with its source


def test_a_failed_start_leaves_no_task_behind(tmp_path: Path) -> None:
    """A bootstrap raising in one of several processes: ``spawn_procs``
    raises ProcessStartError and the other processes' starts end with it
    (they were left running, their coroutines closed under them: "cannot
    reuse already awaited coroutine" at the loop's shutdown)."""
    out = run_script(tmp_path, """
        import asyncio
        import meshio

        def needs_gpu() -> None:
            raise RuntimeError("no GPU here")

        reported = []

        async def main() -> None:
            asyncio.get_running_loop().set_exception_handler(
                lambda loop, context: reported.append(context["message"]))
            try:
                async with meshio.this_host().spawn_procs(per_host={"procs": 3},
                                                          bootstrap=needs_gpu):
                    pass
            except meshio.ProcessStartError as e:
                print(e.cause)

        asyncio.run(main())
        print("reported:", reported)
        """)
    assert out == ["bootstrap __main__.needs_gpu() raised RuntimeError: no GPU here",
                   "reported: []"]


async def test_worker_dying_before_reading_its_stdin(capsys: pytest.CaptureFixture[str]) -> None:
    """A process that dies before it reads its stdin (its Python cannot
    start) while a bootstrap bigger than the socket buffer is being written
    to it: the start fails with its exit status, nothing hangs or leaks."""
    big = bytes(8 << 20)

    def setup() -> None:
        assert len(big) > 0

    with pytest.raises(meshio.ProcessStartError, match="failed to start: exited with code 1"):
        async with meshio.this_host().spawn_procs(
                env={"PYTHONHOME": os.path.join(os.sep, "nonexistent")}, bootstrap=setup):
            pass
    capsys.readouterr()  # Python's own complaint


def _lock_holder() -> Callable[[], None]:
    lock = threading.Lock()

    def setup() -> None:
        with lock:
            pass

    return setup


def _needs_a_rank(rank: int) -> None:
    os.environ["RANK"] = str(rank)


def _set_up_lazily() -> Iterator[None]:
    os.environ["SET_UP"] = "1"  # (never runs: calling a generator function runs nothing)
    yield


@pytest.mark.parametrize(("kwargs", "error", "match"), [
    ({"env": {"NCCL_DEBUG": 1}}, TypeError, r"env\['NCCL_DEBUG'\] must be a str, got int"),
    ({"env": {1: "x"}}, TypeError, r"env keys must be str, got int 1"),
    ({"env": [("A", "b")]}, TypeError, r"env must be a mapping of str to str, got list"),
    ({"env": {"": "x"}}, ValueError, r"env\[''\]: a variable name must be non-empty"),
    ({"env": {"A=B": "x"}}, ValueError, r"env\['A=B'\]: a variable name must be non-empty "
                                        r"without '='"),
    ({"env": {"A": "x\0y"}}, ValueError, r"env\['A'\]: .*, and its value without NUL"),
    ({"env": {"MESHIO_WORKER": "w"}}, ValueError,
     r"env\['MESHIO_WORKER'\]: variables MESHIO_\* are meshio's own"),
    ({"bootstrap": "setup"}, TypeError,
     r"bootstrap must be a function of no arguments, got str 'setup'"),
    ({"bootstrap": _lock_holder()}, TypeError,
     r"bootstrap <function _lock_holder.<locals>.setup at .*> cannot be pickled .*lock"),
    ({"bootstrap": _needs_a_rank}, TypeError,
     r"bootstrap <function _needs_a_rank at .*> must be callable with no arguments "
     r"\(missing a required argument: 'rank'\); bind them first"),
    ({"bootstrap": _set_up_lazily}, TypeError,
     r"bootstrap <function _set_up_lazily at .*> is a generator function: calling it would "
     r"run none of its body"),
])
async def test_bad_env_or_bootstrap_fails_before_any_process_starts(
        kwargs: dict[str, Any], error: type[Exception], match: str) -> None:
    """Bad ``env`` entries and a bootstrap that is not callable or cannot be
    pickled raise at the ``spawn_procs`` call, naming the culprit, before any
    process starts."""
    before = child_pids()
    with pytest.raises(error, match=f"^spawn_procs: {match}"):
        meshio.this_host().spawn_procs(**kwargs)
    assert child_pids() == before
