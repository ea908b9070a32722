"""Typed retry policies (issue 18 item 3): ``@endpoint(retry=meshio.Retry(...))``
re-sends a call that failed with an exception the endpoint raised (matched by
type) or because its process died (to the restarted incarnation), within its
attempts and the call's deadline; nothing else is ever re-executed."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

import pytest
from supervision_helpers import DEADLINE, supervised

import meshio
from meshio import Actor, ActorError, CallTimeout, Retry, SupervisionError, endpoint
from meshio._exceptions import new_actor_error


def runs(path: str) -> int:
    with open(path, "a") as f:
        f.write(f"{os.getpid()}\n")
    return len(Path(path).read_text().split())


class Flaky(Actor):
    @endpoint(retry=Retry(attempts=3, on=(ConnectionError,), backoff=0.01))
    async def fetch(self, path: str, fails: int) -> int:
        """Raise ConnectionError the first ``fails`` times; then answer the run count."""
        n = runs(path)
        if n <= fails:
            raise ConnectionResetError(f"attempt {n}")  # (a subclass: matched by type)
        return n

    @endpoint(retry=Retry(attempts=3, on=(ConnectionError,), backoff=0.01))
    def wrong(self, path: str) -> None:
        runs(path)
        raise ValueError("not retried: ValueError is not in on")

    @endpoint(retry=Retry(attempts=50, on=(ConnectionError,), backoff=0.2))
    async def always_fails(self, path: str) -> None:
        runs(path)
        raise ConnectionError("down")

    @endpoint(retry=Retry(attempts=3, on=(SupervisionError,), backoff=0.01))
    async def die_once(self, path: str) -> int:
        if runs(path) == 1:
            os.kill(os.getpid(), signal.SIGKILL)
        return os.getpid()

    @endpoint
    async def pid(self) -> int:
        return os.getpid()


async def test_an_error_the_endpoint_raises_is_retried_by_type(tmp_path: Path) -> None:
    async with meshio.this_host().spawn_procs(per_host={"procs": 1}) as procs:
        f = await procs.spawn("f", Flaky)
        ok = str(tmp_path / "ok")
        assert await asyncio.wait_for(f.fetch.call_one(ok, 2), DEADLINE) == 3
        out = str(tmp_path / "out")  # three attempts, all failing: the last error
        with pytest.raises(ConnectionResetError, match="attempt 3") as info:
            await asyncio.wait_for(f.fetch.call_one(out, 5), DEADLINE)
        assert isinstance(info.value, ActorError)
        assert len(Path(out).read_text().split()) == 3
        gathered = str(tmp_path / "gathered")  # the same through call() on the mesh
        assert (await asyncio.wait_for(f.fetch.call(gathered, 1), DEADLINE)).values() == [2]


async def test_other_errors_are_not_retried(tmp_path: Path) -> None:
    async with meshio.this_host().spawn_procs(per_host={"procs": 1}) as procs:
        f = await procs.spawn("f", Flaky)
        path = str(tmp_path / "runs")
        with pytest.raises(ValueError, match="not retried"):
            await asyncio.wait_for(f.wrong.call_one(path), DEADLINE)
        assert len(Path(path).read_text().split()) == 1


async def test_retrying_stops_at_the_deadline(tmp_path: Path) -> None:
    async with meshio.this_host().spawn_procs(per_host={"procs": 1}) as procs:
        f = await procs.spawn("f", Flaky)
        path = str(tmp_path / "runs")
        with pytest.raises((CallTimeout, ConnectionError)):
            await asyncio.wait_for(f.always_fails.options(timeout=1.0).call_one(path), DEADLINE)
        assert 1 <= len(Path(path).read_text().split()) < 50


async def test_process_death_is_retried_on_the_restarted_incarnation(tmp_path: Path) -> None:
    path = str(tmp_path / "runs")
    async with supervised() as s:
        f = await s.procs.spawn("f", Flaky)
        answer = await asyncio.wait_for(f.slice(procs=1).die_once.call_one(path), DEADLINE)
        _, restart = await s.restarted(1)
        assert answer == restart.pid != s.old[1]
        assert Path(path).read_text().split() == [str(s.old[1]), str(restart.pid)]


def test_a_policy_matches_by_type_or_by_the_remote_type_name() -> None:
    policy = Retry(on=(ConnectionError, SupervisionError))
    assert policy.matches(ConnectionResetError()) and policy.matches(SupervisionError("x"))
    assert not policy.matches(ValueError()) and not policy.matches(asyncio.CancelledError())
    unknown = new_actor_error("x", remote_type="elsewhere.Unimportable", remote_message="x",
                              remote_traceback="", actor="a", rank=0, endpoint="e")
    assert not policy.matches(unknown)
    by_name = type("Unimportable", (Exception,), {"__module__": "elsewhere"})
    assert Retry(on=(by_name,)).matches(unknown)
    assert [policy.delay(k) for k in (1, 2, 3)] == [0.1, 0.2, 0.4]
    assert Retry(backoff=0.9).delay(5) == 1.0


@pytest.mark.parametrize(("kwargs", "error"), [
    ({"attempts": 0}, ValueError), ({"attempts": -1}, ValueError),
    ({"attempts": 1.5}, TypeError), ({"attempts": 2.0}, TypeError),
    ({"attempts": True}, TypeError), ({"attempts": "3"}, TypeError),
    ({"on": (int,)}, TypeError), ({"on": ValueError}, TypeError),
    ({"on": (asyncio.CancelledError,)}, ValueError), ({"backoff": -1}, ValueError),
    ({"backoff": float("nan")}, ValueError)])
def test_bad_policies_are_refused(kwargs: dict[str, object], error: type[Exception]) -> None:
    with pytest.raises(error, match="Retry"):
        Retry(**kwargs)  # type: ignore[arg-type]


def test_retry_and_retryable_together_are_refused() -> None:
    with pytest.raises(TypeError, match="not both"):
        endpoint(retry=Retry(), retryable=True)(lambda self: None)
    with pytest.raises(TypeError, match=r"must be a meshio\.Retry"):
        endpoint(retry=3)(lambda self: None)  # type: ignore[call-overload]
