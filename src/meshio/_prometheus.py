"""``meshio.serve_metrics``: :func:`meshio.stats` as Prometheus metrics.

A small HTTP server on the controller's loop answers ``GET /metrics`` by
gathering :func:`~meshio.stats` from every process (each scrape asks them
afresh, each given :data:`SCRAPE_TIMEOUT` seconds) and writing it in the
Prometheus text format (:func:`render`: each label value escaped once, the
loop let run between slices).  The metrics (labels: ``mesh``, the proc
mesh's name; ``mesh_id``, its id, unique in the job where names may repeat
(two ``spawn_procs`` of the default name ``"procs"``): the name and 8 hex
digits, as ``procs-1a2b3c4d``; ``proc``, the process's rank in it;
``host``; and for actors ``actor``, the actor mesh, ``rank``, the actor's
rank, and ``endpoint``, its qualified name; each value made UTF-8 by
:func:`~._util.utf8`):

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
import math
from collections.abc import Iterator

from ._http import HTTPServer, Request, response_head, start
from ._metrics import Stats, stats
from ._util import utf8

__all__ = ("SCRAPE_TIMEOUT", "SLICE", "MetricsServer", "prometheus_text", "render",
           "serve_metrics", "write_metrics")

#: seconds each process has to answer a scrape
SCRAPE_TIMEOUT = 5.0
#: what a scrape answers (metric names meshio picks need no escaping): the
#: text format every Prometheus reads
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
#: :func:`render` lets the event loop run after about this many endpoints
#: and processes written (some milliseconds each)
SLICE = 1000

#: each family: its name, type and help, in the order written; a counter's
#: samples (and its name in the text) end in ``_total``
_FAMILIES = (
    ("meshio_endpoint_calls_total", "counter", "Calls of the endpoint that ended."),
    ("meshio_endpoint_errors_total", "counter", "Calls of the endpoint that raised."),
    ("meshio_endpoint_queued", "gauge", "Calls of the endpoint waiting in the actor's mailbox."),
    ("meshio_endpoint_running", "gauge", "Calls of the endpoint under way."),
    ("meshio_endpoint_latency_seconds", "summary",
     "Run time of the endpoint's calls (quantiles over the last 1024)."),
    ("meshio_process_up", "gauge", "1 if the process answered, else 0."),
    ("meshio_process_cpu_seconds_total", "counter", "CPU time of the process."),
    ("meshio_process_resident_memory_bytes", "gauge", "Resident memory of the process."),
    ("meshio_process_restarts_total", "counter", "Times a supervisor replaced the process."),
    ("meshio_process_log_records_dropped_total", "counter",
     "Logging records the process dropped (too many waited)."),
)


def _label(value: str) -> str:
    """``value`` as a label value between the double quotes of the text
    format: UTF-8 (:func:`~._util.utf8`), backslash, newline and double
    quote escaped."""
    return utf8(value).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _number(value: float) -> str:
    """``value`` as the text format writes a sample's value."""
    if math.isfinite(value):
        return repr(value)
    return "NaN" if math.isnan(value) else "+Inf" if value > 0 else "-Inf"


def _write(snapshot: Stats, lines: tuple[list[str], ...]) -> Iterator[None]:
    """Append the samples of ``snapshot`` to ``lines`` (one list per family
    of :data:`_FAMILIES`), each label value escaped once; yield after about
    every :data:`SLICE` endpoints and processes (see :func:`render`)."""
    calls, errors, queued, running, latency, up, cpu, rss, restarts, dropped = lines
    endpoints: dict[str, str] = {}  # qualified name -> escaped (actors share them)
    done = 0
    for pm in snapshot.proc_meshes:
        mesh = f'mesh="{_label(pm.name)}",mesh_id="{_label(pm.id)}",proc="'
        for p in pm.processes:
            where = f'{mesh}{p.rank}",host="{_label(p.host)}"'
            up.append(f"meshio_process_up{{{where}}} {1 if p.error is None else 0}\n")
            restarts.append(f"meshio_process_restarts_total{{{where}}} {p.restarts}\n")
            if p.error is None:
                cpu.append(f'meshio_process_cpu_seconds_total{{{where},mode="user"}} '
                           f"{_number(p.cpu_user)}\n")
                cpu.append(f'meshio_process_cpu_seconds_total{{{where},mode="system"}} '
                           f"{_number(p.cpu_system)}\n")
                rss.append(f"meshio_process_resident_memory_bytes{{{where}}} {p.rss}\n")
                dropped.append(f"meshio_process_log_records_dropped_total{{{where}}} "
                               f"{p.log_records_dropped}\n")
            done += 1
            for a in p.actors:
                actor = f'{where},actor="{_label(a.actor)}",rank="{a.rank}",endpoint="'
                for e in a.endpoints:
                    name = endpoints.get(e.endpoint)
                    if name is None:
                        name = endpoints[e.endpoint] = _label(e.endpoint)
                    labels = f'{actor}{name}"'
                    calls.append(f"meshio_endpoint_calls_total{{{labels}}} {e.calls}\n")
                    errors.append(f"meshio_endpoint_errors_total{{{labels}}} {e.errors}\n")
                    queued.append(f"meshio_endpoint_queued{{{labels}}} {e.queued}\n")
                    running.append(f"meshio_endpoint_running{{{labels}}} {e.running}\n")
                    for q, v in (("0.5", e.p50), ("0.9", e.p90), ("0.99", e.p99)):
                        if v is not None:
                            latency.append(f'meshio_endpoint_latency_seconds{{{labels},'
                                           f'quantile="{q}"}} {_number(v)}\n')
                    latency.append(f"meshio_endpoint_latency_seconds_sum{{{labels}}} "
                                   f"{_number(e.seconds)}\n")
                    latency.append(f"meshio_endpoint_latency_seconds_count{{{labels}}} "
                                   f"{e.calls}\n")
                done += len(a.endpoints)
                if done >= SLICE:
                    done = 0
                    yield
            if done >= SLICE:  # (many processes of few actors)
                done = 0
                yield


def _text(lines: tuple[list[str], ...]) -> bytes:
    """The families' samples after their ``HELP`` and ``TYPE`` lines."""
    parts: list[str] = []
    for (name, kind, help_), samples in zip(_FAMILIES, lines):
        parts.append(f"# HELP {name} {help_}\n# TYPE {name} {kind}\n")
        parts.extend(samples)
    return "".join(parts).encode()


def prometheus_text(snapshot: Stats) -> bytes:
    """``snapshot`` in the Prometheus text format (see the module's
    docstring), at once (:func:`render` lets the event loop run meanwhile)."""
    lines: tuple[list[str], ...] = tuple([] for _ in _FAMILIES)
    for _ in _write(snapshot, lines):
        pass
    return _text(lines)


async def render(snapshot: Stats) -> bytes:
    """:func:`prometheus_text`, letting the event loop run after each
    :data:`SLICE` endpoints and processes: a job of thousands of actor
    meshes holds the loop some milliseconds at a time, not for the whole
    text."""
    lines: tuple[list[str], ...] = tuple([] for _ in _FAMILIES)
    for _ in _write(snapshot, lines):
        await asyncio.sleep(0)
    return _text(lines)


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
    body = await render(await stats(timeout=SCRAPE_TIMEOUT))
    writer.write(response_head("200 OK", CONTENT_TYPE, len(body)) + body)


def serve_metrics(port: int = 0, host: str = "127.0.0.1") -> MetricsServer:
    """Serve :func:`meshio.stats` as Prometheus metrics at
    ``http://host:port/metrics``, from this controller's event loop (call it
    there), each scrape gathering them afresh; the metric names are in the
    README ("Metrics").  Listens on loopback by default; on another address
    it answers whoever reaches it, as Prometheus exporters do (the
    dashboard's ``/metrics`` asks for the job's token there).

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
