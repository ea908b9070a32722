"""OpenTelemetry spans per call (issue 19 §2, the ``otel`` extra): a span on
both sides of every call, the trace context carried in the call message,
one trace from the controller through actors across hosts; nothing
imported or wrapped when the extra is absent.

Each test runs a controller script in a process of its own: a tracer
provider is global to a process, and this one must not trace the rest of
the suite.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from hypothesis import given
from hypothesis import strategies as st
from opentelemetry import trace

from meshio._tracing import parent

ROOT = Path(__file__).resolve().parent.parent
#: a guard against hangs (three host agents start in a few seconds)
GUARD = 180


def _run(args: list[str], cwd: Path, env: dict[str, str] | None = None) -> str:
    proc = subprocess.run([sys.executable, *args], capture_output=True, text=True,
                          timeout=GUARD, cwd=cwd, env={**os.environ, **(env or {})})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def test_example_one_trace_from_the_controller_through_actors_across_hosts() -> None:
    out = _run(["examples/tracing.py", "--hosts", "3"], ROOT)
    assert "plan: 27" in out
    assert "traces: 1" in out, out
    assert out.split("traces: 1\n", 1)[1].splitlines() == [
        "Planner.plan call_one (client, controller)",
        "  Planner.plan (server, process 0)",
        "    Worker.step call (client, process 0)",
        "      Worker.step (server, process 0)",
        "      Worker.step (server, process 1)",
        "      Worker.step (server, process 2)"]


SCRIPT = '''
import asyncio, json, sys
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import meshio
from meshio import Actor, endpoint


class Memory(TracerProvider):
    def __init__(self):
        super().__init__()
        self.exporter = InMemorySpanExporter()
        self.add_span_processor(SimpleSpanProcessor(self.exporter))


def setup():
    trace.set_tracer_provider(Memory())


def finished():
    return [{"name": s.name, "kind": s.kind.name, "trace": f"{s.context.trace_id:032x}",
             "id": f"{s.context.span_id:016x}",
             "parent": f"{s.parent.span_id:016x}" if s.parent else None,
             "error": s.status.status_code.name == "ERROR"}
            for s in trace.get_tracer_provider().exporter.get_finished_spans()]


class Echo(Actor):
    def __init__(self):
        self.seen = 0

    @endpoint
    async def echo(self, x: int) -> int:
        return x

    @endpoint
    def echo_in_thread(self, x: int) -> int:
        return x

    @endpoint
    async def fail(self) -> None:
        raise ValueError("no")

    @endpoint
    async def note(self) -> None:
        self.seen += 1

    @endpoint
    async def seen_notes(self) -> int:
        return self.seen

    @endpoint
    async def spans(self) -> list:
        return finished()


async def main():
    setup()
    async with meshio.this_host().spawn_procs({"procs": 2}, bootstrap=setup) as procs:
        echo = await procs.spawn("echo", Echo)
        one = echo.slice(procs=0)
        assert await one.echo.call_one(1) == 1
        assert await one.echo_in_thread.call_one(2) == 2
        assert await echo.echo.choose(3) == 3
        assert sorted([v async for _, v in echo.echo.stream(4)]) == [4, 4]
        try:
            await one.fail.call_one()
        except meshio.ActorError:
            pass
        one.note.broadcast()
        assert await one.seen_notes.call_one() == 1
        assert await meshio.Service(echo).echo.route(5) == 5
        workers = [s for spans in (await echo.spans.call()).values() for s in spans]
    print(json.dumps({"controller": finished(), "workers": workers}))


asyncio.run(main())
'''


def _spans(tmp_path: Path) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    (tmp_path / "traced.py").write_text(SCRIPT)
    found = json.loads(_run(["traced.py"], tmp_path).splitlines()[-1])
    return found["controller"], [s for s in found["workers"] if s["name"] != "Echo.spans"]


def test_every_adverb_has_a_client_span_parent_of_the_server_span(tmp_path: Path) -> None:
    controller, workers = _spans(tmp_path)
    clients = {s["id"]: s for s in controller if s["name"] != "Echo.spans call"}
    assert sorted(s["name"] for s in clients.values()) == sorted([
        "Echo.echo call_one", "Echo.echo_in_thread call_one", "Echo.echo choose",
        "Echo.echo stream", "Echo.fail call_one", "Echo.note broadcast",
        "Echo.seen_notes call_one", "Echo.echo route"])
    assert all(s["kind"] == "CLIENT" and s["parent"] is None for s in clients.values())
    # each server span is the child of its caller's span, in the caller's trace
    served: dict[str, list[str]] = {}
    for s in workers:
        assert s["kind"] == "SERVER"
        parent = clients[s["parent"]]
        assert s["trace"] == parent["trace"]
        served.setdefault(parent["name"], []).append(s["name"])
    assert served["Echo.echo stream"] == ["Echo.echo", "Echo.echo"]
    assert served["Echo.echo_in_thread call_one"] == ["Echo.echo_in_thread"]
    assert served["Echo.note broadcast"] == ["Echo.note"]
    assert served["Echo.echo route"] == ["Echo.echo"]
    # a failing endpoint: both its spans say so; the others do not
    errors = {s["name"] for s in controller + workers if s["error"]}
    assert errors == {"Echo.fail call_one", "Echo.fail"}


PASS_THROUGH = SCRIPT.rsplit("async def main():", 1)[0] + '''
class Relay(Actor):
    @endpoint
    async def relay(self, echo: Echo) -> bool:
        assert await echo.echo.call_one(7) == 7
        return isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)


async def main():
    setup()
    async with meshio.this_host().spawn_procs({"procs": 1}) as plain, \\
            meshio.this_host().spawn_procs({"procs": 1}, bootstrap=setup) as recording:
        relay = await plain.spawn("relay", Relay)
        echo = await recording.spawn("echo", Echo)
        assert await relay.relay.call_one(echo)  # (no provider there)
        workers = (await echo.spans.call()).values()[0]
    print(json.dumps({"controller": finished(), "workers": workers}))


asyncio.run(main())
'''


def test_a_process_without_a_tracer_provider_passes_the_trace_on(tmp_path: Path) -> None:
    """Controller (recording) → an actor in a process with no tracer
    provider (nothing recorded there, no span made) → an actor in a
    recording process: its server span is the child of the controller's
    client span, in the controller's trace."""
    (tmp_path / "through.py").write_text(PASS_THROUGH)
    found = json.loads(_run(["through.py"], tmp_path).splitlines()[-1])
    client, = [s for s in found["controller"] if s["name"] == "Relay.relay call_one"]
    served, = [s for s in found["workers"] if s["name"] == "Echo.echo"]
    assert served["kind"] == "SERVER"
    assert (served["trace"], served["parent"]) == (client["trace"], client["id"])


LATE = SCRIPT.rsplit("async def main():", 1)[0] + '''
from meshio._tracing import sending
from meshio.endpoints import Endpoint


async def main():
    assert not hasattr(Endpoint.call_one, "__wrapped__")  # tested inline, never wrapped
    async with meshio.this_host().spawn_procs({"procs": 2}) as procs:
        echo = await procs.spawn("echo", Echo)
        one = echo.slice(procs=0)
        assert await one.echo.call_one(1) == 1  # no provider yet: no span
        if sys.argv[1] == "noop":
            trace.set_tracer_provider(trace.NoOpTracerProvider())
        else:
            setup()
        # the same handles, once a provider is set
        assert await one.echo.call_one(2) == 2
        assert (await echo.echo.call(3)).values() == [3, 3]
        assert await echo.echo.choose(4) == 4
        await echo.note.broadcast()
        try:
            await one.fail.call_one()
        except meshio.ActorError:
            pass
        else:
            raise AssertionError("the failing endpoint's call did not raise")
        assert not sending.get()
        names = [] if sys.argv[1] == "noop" else [s["name"] for s in finished()]
    print(json.dumps(sorted(names)))


asyncio.run(main())
'''


def test_a_provider_set_later_traces_the_handles_made_before(tmp_path: Path) -> None:
    """The plain adverbs test for a provider on every call (inline, not
    through a wrapper): one set after a handle was made traces its next
    calls, not the one before; a no-op provider records nothing and every
    adverb still answers (a failure still raises)."""
    (tmp_path / "late.py").write_text(LATE)
    spans = json.loads(_run(["late.py", "sdk"], tmp_path).splitlines()[-1])
    assert spans == ["Echo.echo call", "Echo.echo call_one", "Echo.echo choose",
                     "Echo.fail call_one", "Echo.note broadcast"]
    assert json.loads(_run(["late.py", "noop"], tmp_path).splitlines()[-1]) == []


BLOCK = "import sys\nsys.modules['opentelemetry'] = None  # as if the extra were absent\n"

WITHOUT = '''
import asyncio, sys
import meshio
from meshio import Actor, endpoint
from meshio.endpoints import Endpoint


def loaded():
    return [m for m, module in sys.modules.items()
            if m.startswith("opentelemetry") and module is not None]


class Probe(Actor):
    @endpoint
    async def otel_modules(self) -> list[str]:
        from meshio import _tracing
        assert not _tracing.ENABLED
        return loaded()


async def main():
    from meshio import _tracing
    assert not _tracing.ENABLED
    assert not hasattr(Endpoint.call, "__wrapped__")  # the adverbs are not wrapped
    async with meshio.this_host().spawn_procs({"procs": 1}) as procs:
        probe = await procs.spawn("probe", Probe)
        assert await probe.otel_modules.call_one() == []
    assert loaded() == []
    print("untraced")


asyncio.run(main())
'''


def test_without_the_extra_nothing_is_imported_or_wrapped(tmp_path: Path) -> None:
    """The extra's absence, on the controller and in its workers (which
    inherit ``PYTHONPATH``, and with it this ``sitecustomize``)."""
    (tmp_path / "sitecustomize.py").write_text(BLOCK)
    (tmp_path / "untraced.py").write_text(WITHOUT)
    path = os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")]))
    assert "untraced" in _run(["untraced.py"], tmp_path, {"PYTHONPATH": path})


@given(st.text(max_size=80) | st.from_regex(
    r"\A00-[0-9a-fA-Fx_+]{32}-[0-9a-fA-Fx_+]{16}-[0-9a-fA-Fx_+]{2}\Z"))
def test_any_traceparent_a_peer_sends_is_a_parent_or_none(sent: str) -> None:
    """The ``trace`` of a call message is a peer's text: anything but a
    valid W3C ``traceparent`` is no parent, never an error."""
    ctx = parent(sent)
    if ctx is None:
        return
    span = trace.get_current_span(ctx).get_span_context()
    assert span.is_valid and span.is_remote
    assert sent == f"00-{span.trace_id:032x}-{span.span_id:016x}-{span.trace_flags:02x}"


@given(st.integers(1, 2**128 - 1), st.integers(1, 2**64 - 1), st.sampled_from([0, 1]))
def test_a_sent_traceparent_comes_back_as_the_same_span(trace_id: int, span_id: int,
                                                        flags: int) -> None:
    sent = f"00-{trace_id:032x}-{span_id:016x}-{flags:02x}"
    ctx = parent(sent)
    assert ctx is not None
    span = trace.get_current_span(ctx).get_span_context()
    assert (span.trace_id, span.span_id, int(span.trace_flags)) == (trace_id, span_id, flags)
