"""``meshio.serve_metrics``: :func:`meshio.stats` as Prometheus metrics.

A small HTTP server on the controller's loop answers ``GET /metrics`` by
gathering :func:`~meshio.stats` from every process (each scrape asks them
afresh, each given :data:`SCRAPE_TIMEOUT` seconds) and writing it in the
Prometheus text format (``prometheus_client`` renders it).  The metrics
(labels: ``mesh``, the proc mesh's name; ``mesh_id``, its id, unique in
the job where names may repeat (two ``spawn_procs`` of the default name
``"procs"``): the name and 8 hex digits, as ``procs-1a2b3c4d``; ``proc``,
the process's rank in it; ``host``; and for actors ``actor``, the actor
mesh, ``rank``, the actor's rank, and ``endpoint``, its qualified name;
each value made UTF-8 by :func:`~._util.utf8`):

=============================================  =======  =======================================
``meshio_endpoint_calls_total``                counter  calls that ended
``meshio_endpoint_errors_total``               counter  calls that raised
``meshio_endpoint_queued``                     gauge    calls waiting in the mailbox
``meshio_endpoint_running``                    gauge    calls under way
``meshio_endpoint_latency_seconds``            summary  run time: ``quantile`` 0.5, 0.9, 0.99
                                                        of the last 1024 calls; ``_sum``,
                                                        ``_count`` of all
``meshio_process_up``                          gauge    1 if the process answered, else 0
``meshio_process_cpu_seconds_total``           counter  CPU time, ``mode`` "user" or "system"
``meshio_process_resident_memory_bytes``       gauge    resident memory
``meshio_process_restarts_total``              counter  replacements by a supervisor
``meshio_process_log_records_dropped_total``   counter  ``logging`` records dropped (a flood)
=============================================  =======  =======================================
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

from prometheus_client.exposition import generate_latest
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry

from ._http import HTTPServer, Request, response_head, start
from ._metrics import Stats, stats
from ._util import utf8

__all__ = ("SCRAPE_TIMEOUT", "MetricsServer", "prometheus_text", "serve_metrics", "write_metrics")

#: seconds each process has to answer a scrape
SCRAPE_TIMEOUT = 5.0
#: what ``generate_latest`` writes (metric names meshio picks need no
#: escaping): the text format every Prometheus reads
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

_PROC = ["mesh", "mesh_id", "proc", "host"]
_ENDPOINT = [*_PROC, "actor", "rank", "endpoint"]


class _Families(Collector):
    def __init__(self, families: list[Metric]) -> None:
        self.families = families

    def collect(self) -> Iterable[Metric]:
        return self.families


def prometheus_text(snapshot: Stats) -> bytes:
    """``snapshot`` in the Prometheus text format (see the module's docstring)."""
    calls = CounterMetricFamily("meshio_endpoint_calls", "Calls of the endpoint that ended.",
                                labels=_ENDPOINT)
    errors = CounterMetricFamily("meshio_endpoint_errors", "Calls of the endpoint that raised.",
                                 labels=_ENDPOINT)
    queued = GaugeMetricFamily("meshio_endpoint_queued",
                               "Calls of the endpoint waiting in the actor's mailbox.",
                               labels=_ENDPOINT)
    running = GaugeMetricFamily("meshio_endpoint_running", "Calls of the endpoint under way.",
                                labels=_ENDPOINT)
    latency = Metric("meshio_endpoint_latency_seconds",
                     "Run time of the endpoint's calls (quantiles over the last 1024).",
                     "summary")
    up = GaugeMetricFamily("meshio_process_up", "1 if the process answered, else 0.",
                           labels=_PROC)
    cpu = CounterMetricFamily("meshio_process_cpu_seconds", "CPU time of the process.",
                              labels=[*_PROC, "mode"])
    rss = GaugeMetricFamily("meshio_process_resident_memory_bytes",
                            "Resident memory of the process.", labels=_PROC)
    restarts = CounterMetricFamily("meshio_process_restarts",
                                   "Times a supervisor replaced the process.", labels=_PROC)
    dropped = CounterMetricFamily("meshio_process_log_records_dropped",
                                  "Logging records the process dropped (too many waited).",
                                  labels=_PROC)
    for pm in snapshot.proc_meshes:
        for p in pm.processes:
            where = [utf8(pm.name), utf8(pm.id), str(p.rank), utf8(p.host)]
            up.add_metric(where, 1 if p.error is None else 0)
            restarts.add_metric(where, p.restarts)
            if p.error is None:
                cpu.add_metric([*where, "user"], p.cpu_user)
                cpu.add_metric([*where, "system"], p.cpu_system)
                rss.add_metric(where, p.rss)
                dropped.add_metric(where, p.log_records_dropped)
            for a in p.actors:
                for e in a.endpoints:
                    values = [*where, utf8(a.actor), str(a.rank), utf8(e.endpoint)]
                    calls.add_metric(values, e.calls)
                    errors.add_metric(values, e.errors)
                    queued.add_metric(values, e.queued)
                    running.add_metric(values, e.running)
                    labels = dict(zip(_ENDPOINT, values))
                    for q, v in (("0.5", e.p50), ("0.9", e.p90), ("0.99", e.p99)):
                        if v is not None:
                            latency.add_sample(latency.name, {**labels, "quantile": q}, v)
                    latency.add_sample(f"{latency.name}_sum", labels, e.seconds)
                    latency.add_sample(f"{latency.name}_count", labels, e.calls)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Families([calls, errors, queued, running, latency, up, cpu, rss,
                                 restarts, dropped]))
    return generate_latest(registry)


class MetricsServer(HTTPServer):
    """The HTTP server of :func:`serve_metrics`, listening from its start.
    Stop it with :meth:`aclose`, or use it as ``async with``.

    Attributes:
        host: the address it listens on.
        port: the port it listens on (the one picked, if asked for 0).
    """

    @property
    def url(self) -> str:
        """``http://HOST:PORT/metrics``."""
        return f"{self._base()}/metrics"

    def __repr__(self) -> str:
        return f"<MetricsServer {self.url}{' closed' if self._closed else ''}>"

    async def _respond(self, request: Request, writer: asyncio.StreamWriter) -> None:
        if request.path != "/metrics":
            writer.write(response_head("404 Not Found", "text/plain", 13) + b"see /metrics\n")
            return
        await write_metrics(writer)


async def write_metrics(writer: asyncio.StreamWriter) -> None:
    """Answer a ``GET /metrics``: :func:`~meshio.stats` gathered afresh, as
    Prometheus text."""
    body = prometheus_text(await stats(timeout=SCRAPE_TIMEOUT))
    writer.write(response_head("200 OK", CONTENT_TYPE, len(body)) + body)


def serve_metrics(port: int = 0, host: str = "127.0.0.1") -> MetricsServer:
    """Serve :func:`meshio.stats` as Prometheus metrics at
    ``http://host:port/metrics``, from this controller's event loop (call it
    there), each scrape gathering them afresh; the metric names are in the
    README ("Metrics").  Listens on loopback by default.

    Args:
        port: the TCP port (0: any free one, see :attr:`MetricsServer.port`).
        host: the address to listen on.

    Raises:
        TypeError: ``port`` is not an int or ``host`` not a str.
        ValueError: ``port`` is not in 0..65535.
        OSError: the address cannot be listened on (in use, not this host's).
        RuntimeError: no event loop is running here.
    """
    return start(MetricsServer, port, host, "serve_metrics")
