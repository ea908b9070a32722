"""``meshio doctor``: what this machine gives meshio, and why anything is
missing.

:func:`doctor` runs every check of :data:`CHECKS` (the slow ones, torch's
import, Slurm and Kubernetes, at the same time) and returns one
:class:`DoctorCheck` each.  Whether a backend or a cluster works is decided
where meshio uses it (:func:`meshio.rdma._buffer.backend_status`,
:func:`meshio.jobs._slurm.probe`, :func:`meshio.jobs._kubernetes.probe`);
this module only asks and adds the limits that make a working thing fail
later (locked memory, file descriptors).
"""

from __future__ import annotations

import asyncio
import ctypes
import importlib
import os
import platform
import resource
import sys
import time
from importlib.metadata import PackageNotFoundError, version
from typing import Final, Literal

import msgspec

from ._checks import check_seconds
from ._launcher import layout_sharing
from ._transport._bulk import CAP_IPC_LOCK, CAP_SYS_PTRACE, capable, ptrace_scope
from .jobs._kubernetes import ClusterError, ClusterNotConfiguredError
from .jobs._kubernetes import probe as kubernetes_probe
from .jobs._slurm import SlurmError
from .jobs._slurm import probe as slurm_probe
from .rdma._buffer import backend_status

__all__ = ("CHECKS", "DoctorCheck", "Fact", "doctor", "report_json", "report_text", "unmet")

#: every check :func:`doctor` runs, in the order it reports them
CHECKS: Final = ("python", "uvloop", "torch", "cuda", "same_host", "ibverbs", "tcp", "slurm",
                 "kubernetes", "clock", "fds", "layout")

#: a value of :attr:`DoctorCheck.facts`
Fact = str | int | float | bool | list[str] | None

#: file descriptors a controller holds per worker process it starts on its
#: host (its connection, the worker's output pipes; measured: 42 for 8)
_FDS_PER_PROC: Final = 5
#: worker processes a controller should be able to start before the soft
#: ``RLIMIT_NOFILE`` limit stops it; fewer is a warning
_FDS_ENOUGH_PROCS: Final = 1024
#: a monotonic clock coarser than this (seconds) is a warning
_COARSE_CLOCK: Final = 1e-3
#: ``adjtimex`` returns this when the kernel's clock is not synchronised
_TIME_ERROR: Final = 5


class DoctorCheck(msgspec.Struct, frozen=True, kw_only=True):
    """One check of :func:`doctor`.

    Attributes:
        name: one of ``python``, ``uvloop``, ``torch``, ``cuda``,
            ``same_host``, ``ibverbs``, ``tcp``, ``slurm``, ``kubernetes``,
            ``clock``, ``fds``, ``layout``.
        status: ``"ok"``; ``"missing"`` (not usable here: ``detail`` says
            why); or ``"warning"`` (usable, with a limit that will bite:
            ``detail`` says which and what to do).
        detail: what was found, or the reason, in one line.
        facts: the numbers and names behind ``detail`` (see :func:`doctor`).
    """

    name: str
    status: Literal["ok", "missing", "warning"]
    detail: str
    facts: dict[str, Fact]


async def doctor(*, timeout: float = 5.0) -> tuple[DoctorCheck, ...]:
    """Check what this machine gives meshio: one :class:`DoctorCheck` per
    name of ``CHECKS`` (``meshio doctor`` prints them).

    Nothing is started or left behind: Slurm is asked with ``sinfo`` and
    Kubernetes with one request for its version, each given ``timeout``
    seconds.  The checks and their ``facts``:

    - ``python``: ``version``, ``implementation``, ``executable``.
    - ``uvloop``: the event loop ``meshio.run`` and the workers use;
      ``version`` (None: missing, asyncio's default loop is used).
    - ``torch``: ``version`` (None: not installed).
    - ``cuda``: ``build`` (torch's CUDA or ROCm version, None for a CPU
      build), ``devices`` (visible devices), ``names``.
    - ``same_host``, ``ibverbs``, ``tcp``: the RDMA backends, as
      :func:`meshio.rdma.available_backends` decides; ``same_host`` has
      ``ptrace_scope`` (None: no Yama), ``ibverbs`` has ``memlock`` (the
      soft ``ulimit -l`` in bytes, None: unlimited) and ``cap_ipc_lock``.
    - ``slurm``: ``sinfo`` and the commands ``SlurmJob`` runs, answering.
    - ``kubernetes``: the ``kubernetes`` client, a kubeconfig or in-cluster
      account, and the API server answering.
    - ``clock``: ``monotonic_resolution`` (seconds), ``synchronised`` (the
      wall clock, per ``adjtimex``; None: unknown), ``max_error_us``.
    - ``fds``: ``soft`` and ``hard`` ``RLIMIT_NOFILE`` (None: unlimited),
      ``procs`` (worker processes a controller can start here before the
      soft limit stops it).
    - ``layout``: whether the workers a controller starts here share one
      address layout (docs/design.md): ``sharing`` is ``shared``,
      ``inherited`` (this process runs without randomization: its workers
      get its layout), ``refused`` (``personality(2)`` refused: a seccomp
      profile; a warning) or ``unavailable`` (not Linux).

    Args:
        timeout: seconds Slurm and the Kubernetes API server get to answer.

    Returns:
        The checks, in the order of ``CHECKS``.

    Raises:
        TypeError: ``timeout`` is not a number (a str, a bool).
        ValueError: ``timeout`` is not finite seconds > 0 (NaN, or an int
            no float holds).
    """
    timeout = check_seconds(timeout, "doctor", "timeout", inf=False)
    async with asyncio.TaskGroup() as tg:
        torch_cuda = tg.create_task(asyncio.to_thread(_torch_and_cuda))
        rdma = tg.create_task(asyncio.to_thread(_rdma))
        slurm = tg.create_task(_slurm(timeout))
        kubernetes = tg.create_task(asyncio.to_thread(_kubernetes, timeout))
    return (_python(), _uvloop(), *torch_cuda.result(), *rdma.result(), slurm.result(),
            kubernetes.result(), _clock(), _fds(), _layout())


# ------------------------------------------------------------ the checks

def _python() -> DoctorCheck:
    impl = platform.python_implementation()
    return DoctorCheck(name="python", status="ok",
                       detail=f"{platform.python_version()} ({impl}) {sys.executable}",
                       facts={"version": platform.python_version(), "implementation": impl,
                              "executable": sys.executable})


def _uvloop() -> DoctorCheck:
    try:
        importlib.import_module("uvloop")  # as meshio.run and the workers do
    except ImportError as e:
        return DoctorCheck(name="uvloop", status="missing", facts={"version": None},
                           detail=f"not importable ({e}): meshio.run and the workers use "
                                  "asyncio's default loop, slower (pip install uvloop)")
    v = version("uvloop")
    return DoctorCheck(name="uvloop", status="ok", facts={"version": v},
                       detail=f"uvloop {v}: meshio.run and the workers use it")


def _torch_and_cuda() -> tuple[DoctorCheck, DoctorCheck]:
    try:
        import torch  # deferred: heavy and optional
    except Exception as e:  # a broken install (a missing CUDA library) too
        why = ("not installed (pip install 'meshio[torch]')" if isinstance(e, ImportError)
               and e.name == "torch" else f"does not import: {type(e).__name__}: {e}")
        missing: dict[str, Fact] = {"build": None, "devices": 0, "names": []}
        return (DoctorCheck(name="torch", status="missing", detail=why,
                            facts={"version": None}),
                DoctorCheck(name="cuda", status="missing", detail=f"torch {why}",
                            facts=missing))
    tv = str(torch.__version__)
    torch_check = DoctorCheck(name="torch", status="ok", detail=f"torch {tv}",
                              facts={"version": tv})
    build: str | None = torch.version.cuda or torch.version.hip
    if build is None:
        return torch_check, DoctorCheck(
            name="cuda", status="missing", facts={"build": None, "devices": 0, "names": []},
            detail=f"torch {tv} is a CPU-only build (torch.version.cuda is None): install "
                   "a CUDA build of torch")
    kind = "CUDA" if torch.version.cuda else "ROCm"
    if not torch.cuda.is_available():
        try:
            torch.cuda.init()  # type: ignore[no-untyped-call]  # unannotated in torch
            why = "torch.cuda.is_available() is False"
        except Exception as e:  # the reason is what we report
            why = str(e).strip().splitlines()[0]
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        if visible is not None:
            why += f" (CUDA_VISIBLE_DEVICES={visible!r})"
        return torch_check, DoctorCheck(
            name="cuda", status="missing", facts={"build": build, "devices": 0, "names": []},
            detail=f"no {kind} device: {why}")
    names = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    return torch_check, DoctorCheck(
        name="cuda", status="ok", facts={"build": build, "devices": len(names), "names": names},
        detail=f"{kind} {build}, {len(names)} device{'s' * (len(names) != 1)}: "
               f"{', '.join(sorted(set(names)))}")


def _rdma() -> list[DoctorCheck]:
    checks: list[DoctorCheck] = []
    for backend, (usable, detail) in backend_status().items():
        facts: dict[str, Fact] = {}
        warn = False
        if backend == "same_host":
            facts["ptrace_scope"] = scope = ptrace_scope()
            if usable and scope == 1:
                warn = True
                detail += "; but large message values travel over the socket, not by one copy"
                if not capable(CAP_SYS_PTRACE):  # the controller declares no tracer
                    detail += (", and a worker reading an RDMABuffer the controller owns "
                               "fails")
                detail += " (sysctl kernel.yama.ptrace_scope=0 lifts this)"
        elif backend == "ibverbs":
            soft, _ = resource.getrlimit(resource.RLIMIT_MEMLOCK)
            memlock = None if soft == resource.RLIM_INFINITY else soft
            lifted = capable(CAP_IPC_LOCK)
            facts.update(memlock=memlock, cap_ipc_lock=lifted)
            if memlock is not None and not lifted:
                limit = f"ulimit -l is {_size(memlock)}, and this process lacks CAP_IPC_LOCK"
                if usable:
                    warn = True
                    detail += (f"; but {limit}: registering more than that (all RDMABuffers "
                               "together) fails, raise it: ulimit -l unlimited (memlock in "
                               "limits.conf, LimitMEMLOCK= for systemd services)")
                else:
                    detail += f"; also {limit}"
        status: Literal["ok", "missing", "warning"] = (
            "missing" if not usable else "warning" if warn else "ok")
        checks.append(DoctorCheck(name=backend, status=status, detail=detail, facts=facts))
    return checks


async def _slurm(timeout: float) -> DoctorCheck:
    try:
        found = await slurm_probe(timeout)
    except SlurmError as e:
        return DoctorCheck(name="slurm", status="missing", detail=str(e), facts={})
    return DoctorCheck(name="slurm", status="ok", detail=found, facts={})


def _kubernetes(timeout: float) -> DoctorCheck:
    try:
        found = kubernetes_probe(timeout)
    except (ClusterNotConfiguredError, ClusterError) as e:
        return DoctorCheck(name="kubernetes", status="missing", detail=str(e), facts={})
    return DoctorCheck(name="kubernetes", status="ok", detail=found, facts={})


def _clock() -> DoctorCheck:
    info = time.get_clock_info("monotonic")
    facts: dict[str, Fact] = {"monotonic_resolution": info.resolution,
                              "synchronised": None, "max_error_us": None}
    detail = f"monotonic: {info.implementation}, resolution {_seconds(info.resolution)}"
    warnings: list[str] = []
    if info.resolution > _COARSE_CLOCK:
        warnings.append("the monotonic clock is coarse: timeouts and latencies are "
                        "measured no finer")
    synced = _wall_clock_synchronised()
    if synced is not None:
        facts["synchronised"], facts["max_error_us"] = synced
        if synced[0]:
            detail += f"; wall clock synchronised (max error {_seconds(synced[1] / 1e6)})"
        else:
            warnings.append("the wall clock is not synchronised (adjtimex: TIME_ERROR): "
                            "timestamps of different hosts (logs, traces) may disagree; "
                            "meshio's deadlines and heartbeats do not depend on it (run "
                            "chronyd or systemd-timesyncd)")
    return DoctorCheck(name="clock", status="warning" if warnings else "ok",
                       detail="; ".join([detail, *warnings]), facts=facts)


def _wall_clock_synchronised() -> tuple[bool, int] | None:
    """Whether the kernel says the wall clock is synchronised (``adjtimex``,
    read-only), and its maximum error in microseconds; None off Linux."""
    if sys.platform != "linux":
        return None
    timex = _Timex()  # modes 0: read only
    state = ctypes.CDLL(None, use_errno=True).adjtimex(ctypes.byref(timex))
    if state < 0:
        return None
    return state != _TIME_ERROR, timex.maxerror


class _Timex(ctypes.Structure):
    """The head of ``struct timex`` (``sys/timex.h``), room for the rest."""

    _fields_ = [("modes", ctypes.c_uint), ("offset", ctypes.c_long), ("freq", ctypes.c_long),
                ("maxerror", ctypes.c_long), ("rest", ctypes.c_char * 256)]


def _fds() -> DoctorCheck:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    inf = resource.RLIM_INFINITY
    procs = None if soft == inf else max(0, (soft - 64) // _FDS_PER_PROC)
    facts: dict[str, Fact] = {"soft": None if soft == inf else soft,
                              "hard": None if hard == inf else hard, "procs": procs}
    limits = (f"open files: soft limit {'unlimited' if soft == inf else soft}, hard "
              f"{'unlimited' if hard == inf else hard}")
    if procs is None or procs >= _FDS_ENOUGH_PROCS:
        return DoctorCheck(name="fds", status="ok", facts=facts, detail=limits + (
            "" if procs is None else f" (about {procs} worker processes per controller)"))
    fix = (f"raise it: ulimit -n {'unlimited' if hard == inf else hard}" if hard != soft
           else "the hard limit too: nofile in /etc/security/limits.conf")
    return DoctorCheck(
        name="fds", status="warning", facts=facts,
        detail=f"{limits}: a controller holds about {_FDS_PER_PROC} per worker process it "
               f"starts here, so about {procs} processes before 'Too many open files'; {fix}")


def _layout() -> DoctorCheck:
    sharing = layout_sharing()
    facts: dict[str, Fact] = {"sharing": sharing}
    if sharing == "shared":
        return DoctorCheck(name="layout", status="ok", facts=facts,
                           detail="the workers started here share one address layout")
    if sharing == "inherited":
        return DoctorCheck(name="layout", status="ok", facts=facts, detail=(
            "this process runs without address randomization (setarch -R): the workers it "
            "starts here share its layout"))
    if sharing == "refused":
        return DoctorCheck(name="layout", status="warning", facts=facts, detail=(
            "personality(2) refused (a seccomp profile?): workers start with random address "
            "layouts, so where processes outnumber cores, calls to several actors are slower "
            "(docs/howto/tuning.md)"))
    return DoctorCheck(name="layout", status="missing", facts=facts,
                       detail=f"no personality(2) on {platform.system()}: random layouts")


# ---------------------------------------------------------------- report

def _size(n: int) -> str:
    for unit in ("bytes", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:g} {unit}"
        n //= 1024
    raise AssertionError  # pragma: no cover


def _seconds(s: float) -> str:
    return f"{s * 1e9:g} ns" if s < 1e-6 else f"{s * 1e6:g} us" if s < 1e-3 else f"{s:g} s"


def _version() -> str:
    try:
        return version("meshio")
    except PackageNotFoundError:  # pragma: no cover - a source tree on sys.path
        return "unknown"


def report_text(checks: tuple[DoctorCheck, ...]) -> str:
    """The checks for a terminal: a header and one line per check."""
    lines = [f"meshio {_version()} on {platform.node()} ({platform.system()} "
             f"{platform.release()})"]
    width = max(len(c.name) for c in checks)
    lines += [f"{c.status:<8} {c.name:<{width}}  {c.detail}" for c in checks]
    return "\n".join(lines)


class _Report(msgspec.Struct):
    meshio: str
    host: str
    checks: dict[str, DoctorCheck]
    required: list[str]
    required_missing: list[str]


def report_json(checks: tuple[DoctorCheck, ...], required: list[str]) -> str:
    """The checks as the JSON object ``meshio doctor --json`` prints (see
    the README): ``meshio``, ``host``, ``checks`` by name (each with
    ``name``, ``status``, ``detail``, ``facts``), ``required`` and
    ``required_missing``."""
    report = _Report(_version(), platform.node(), {c.name: c for c in checks}, required,
                     [c.name for c in unmet(checks, required)])
    return msgspec.json.format(msgspec.json.encode(report).decode(), indent=2)


def unmet(checks: tuple[DoctorCheck, ...], required: list[str]) -> list[DoctorCheck]:
    """The checks in ``required`` that are missing."""
    return [c for c in checks if c.name in required and c.status == "missing"]
