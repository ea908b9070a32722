"""One OpenTelemetry trace across a mesh: controller -> Planner -> Workers
(`pip install 'meshio[otel]'`).

Each process sends its spans to its own tracer provider, set up by the
`bootstrap` function every worker runs first (here an in-memory exporter,
so that the example can print the trace; in a real job an OTLP exporter
to your collector).  meshio carries the trace context in each call
message, so the spans of all processes form one tree.

    python examples/tracing.py            # one host, two processes
    python examples/tracing.py --hosts 3  # three hosts (host agents on this machine)
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
from collections.abc import AsyncGenerator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import cast

from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import meshio
from meshio import Actor, endpoint
from meshio.jobs import ProcessJob


class InMemoryProvider(TracerProvider):
    """A tracer provider keeping its process's finished spans in memory."""

    def __init__(self) -> None:
        super().__init__()
        self.exporter = InMemorySpanExporter()
        self.add_span_processor(SimpleSpanProcessor(self.exporter))


def setup_tracing() -> None:
    """Every process's tracer provider (the controller's, and each worker's
    through ``spawn_procs(bootstrap=...)``)."""
    trace.set_tracer_provider(InMemoryProvider())


@dataclass
class Span:
    name: str
    kind: str
    trace_id: str  # (hex: a 128-bit int is beyond msgpack's)
    span_id: str
    parent_id: str | None
    where: str


def _spans(where: str) -> list[Span]:
    def one(s: ReadableSpan) -> Span:
        assert s.context is not None
        return Span(s.name, s.kind.name, f"{s.context.trace_id:032x}", f"{s.context.span_id:016x}",
                    f"{s.parent.span_id:016x}" if s.parent is not None else None, where)
    provider = cast(InMemoryProvider, trace.get_tracer_provider())
    return [one(s) for s in provider.exporter.get_finished_spans()]


class Worker(Actor):
    @endpoint
    async def step(self, n: int) -> int:
        return n * n


class Planner(Actor):
    @endpoint
    async def plan(self, workers: Worker, n: int) -> int:
        squares = await workers.step.call(n)  # a child span of this call's
        return sum(squares.values())


class Spans(Actor):
    @endpoint
    async def finished(self) -> list[Span]:
        return _spans(f"process {meshio.current_rank().rank}")


@asynccontextmanager
async def hosts(count: int) -> AsyncGenerator[meshio.HostMesh]:
    if count == 1:
        yield meshio.this_host()
        return
    with tempfile.TemporaryDirectory() as cache:
        job = ProcessJob(meshes={"hosts": count}, cache_dir=cache)
        try:
            yield (await job.state()).hosts
        finally:
            await job.kill()


def tree(spans: list[Span]) -> list[str]:
    """The trace as indented lines, children in the order of their parents'."""
    children: dict[str | None, list[Span]] = {}
    for s in spans:
        children.setdefault(s.parent_id, []).append(s)
    lines: list[str] = []

    def walk(parent: str | None, depth: int) -> None:
        for s in sorted(children.get(parent, []), key=lambda s: (s.name, s.where)):
            lines.append(f"{'  ' * depth}{s.name} ({s.kind.lower()}, {s.where})")
            walk(s.span_id, depth + 1)
    walk(None, 0)
    return lines


async def main(count: int) -> None:
    setup_tracing()
    per_host = {"procs": 2} if count == 1 else {"procs": 1}
    async with hosts(count) as host_mesh, \
            host_mesh.spawn_procs(per_host, bootstrap=setup_tracing) as procs:
        workers = await procs.spawn("workers", Worker)
        planner = await procs.slice(**dict.fromkeys(procs.sizes, 0)).spawn("planner", Planner)
        spans = await procs.spawn("spans", Spans)
        print("plan:", await planner.plan.call_one(workers, 3))
        everything = _spans("controller")
        for found in (await spans.finished.call()).values():
            everything += found
    print("traces:", len({s.trace_id for s in everything if s.name.startswith(("Planner",
                                                                                 "Worker"))}))
    print("\n".join(tree([s for s in everything if "finished" not in s.name])))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="one OpenTelemetry trace across a mesh")
    parser.add_argument("--hosts", type=int, default=1)
    asyncio.run(main(parser.parse_args().hosts))
