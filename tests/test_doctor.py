"""issue 19 item 4: ``meshio doctor``, run as a user runs it (``python -m
meshio doctor``, a real child process), its answers checked against what
this machine really has: each assertion follows the machine's state (an
RDMA device, a GPU, Yama) rather than assuming it."""

from __future__ import annotations

import json
import os
import platform
import resource
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib.metadata import version
from pathlib import Path
from typing import Any

import pytest

import meshio
from layout_actors import (
    ADDR_NO_RANDOMIZE,
    no_randomization,
    personality,
    personality_refused,
)
from meshio._doctor import CHECKS
from meshio.rdma import available_backends
from meshio.rdma._buffer import backend_status

GUARD = 60.0


def doctor(*args: str, env: dict[str, str] | None = None, prefix: str = "",
           preexec_fn: Any = None) -> subprocess.CompletedProcess[str]:
    """``python -m meshio doctor ARGS`` (``prefix``: Python run first in the child)."""
    argv = ([sys.executable, "-m", "meshio"] if not prefix else
            [sys.executable, "-c", f"{prefix}\nfrom meshio._cli import main; main()"])
    child_env = {k: v for k, v in os.environ.items() if not k.startswith("KUBERNETES_")}
    return subprocess.run([*argv, "doctor", *args], capture_output=True, text=True,
                          timeout=GUARD, env={**child_env, **(env or {})},
                          preexec_fn=preexec_fn)


def doctor_json(*args: str, **kw: Any) -> tuple[int, dict[str, Any], str]:
    proc = doctor("--json", *args, **kw)
    return proc.returncode, json.loads(proc.stdout), proc.stderr


def test_a_reader_that_goes_away_ends_it_quietly() -> None:
    """``meshio doctor --json | head``: the reader has closed the pipe when
    the report is written; the command ends without a traceback."""
    read, write = os.pipe()
    os.close(read)  # (gone before anything is written)
    try:
        proc = subprocess.run([sys.executable, "-m", "meshio", "doctor", "--json"],
                              stdout=write, stderr=subprocess.PIPE, text=True, timeout=GUARD)
    finally:
        os.close(write)
    assert proc.returncode == 1 and proc.stderr == ""


def test_help_lists_doctor() -> None:
    out = subprocess.run([sys.executable, "-m", "meshio", "--help"], capture_output=True,
                         text=True, timeout=GUARD, check=True).stdout
    assert "doctor" in out
    sub = subprocess.run([sys.executable, "-m", "meshio", "doctor", "--help"],
                         capture_output=True, text=True, timeout=GUARD, check=True).stdout
    assert "--require NAME" in sub and "--json" in sub


def test_json_reports_every_check_as_this_machine_has_it() -> None:
    rc, report, _ = doctor_json()
    assert rc == 0
    assert report["meshio"] == version("meshio")
    assert report["host"] == platform.node()
    assert report["required"] == [] and report["required_missing"] == []
    assert list(report["checks"]) == list(CHECKS)
    for name, check in report["checks"].items():
        assert check["name"] == name
        assert check["status"] in ("ok", "missing", "warning"), check
        assert check["detail"], check
        assert isinstance(check["facts"], dict)
    checks = report["checks"]
    assert checks["python"]["facts"] == {"version": platform.python_version(),
                                         "implementation": platform.python_implementation(),
                                         "executable": sys.executable}
    assert checks["uvloop"]["status"] == "ok"
    assert checks["uvloop"]["facts"]["version"] == version("uvloop")
    # RDMA: the backends the runtime itself would use, each with its reason
    for backend, (usable, why) in backend_status().items():
        assert (checks[backend]["status"] != "missing") == usable, checks[backend]
        assert checks[backend]["detail"].startswith(why)
    assert checks["tcp"]["status"] == "ok"
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    assert checks["fds"]["facts"]["soft"] == (None if soft == resource.RLIM_INFINITY else soft)
    assert checks["fds"]["facts"]["hard"] == (None if hard == resource.RLIM_INFINITY else hard)
    assert checks["clock"]["facts"]["monotonic_resolution"] == pytest.approx(
        time.get_clock_info("monotonic").resolution)


def test_text_is_one_line_per_check() -> None:
    proc = doctor()
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].startswith(f"meshio {version('meshio')} on ")
    assert [line.split()[1] for line in lines[1:]] == list(CHECKS)
    for line in lines[1:]:
        assert line.split()[0] in ("ok", "missing", "warning"), line


def test_torch_and_cuda_as_torch_sees_them() -> None:
    torch = pytest.importorskip("torch")
    rc, report, err = doctor_json("--require", "cuda")
    checks = report["checks"]
    assert checks["torch"] == {"name": "torch", "status": "ok",
                               "detail": f"torch {torch.__version__}",
                               "facts": {"version": str(torch.__version__)}}
    cuda = checks["cuda"]
    if torch.cuda.is_available():
        assert rc == 0 and cuda["status"] == "ok"
        assert cuda["facts"]["devices"] == torch.cuda.device_count()
    else:
        assert rc == 1 and cuda["status"] == "missing"
        assert report["required_missing"] == ["cuda"]
        assert f"cuda is required but missing: {cuda['detail']}" in err
        if torch.version.cuda is None and torch.version.hip is None:
            assert "CPU-only build" in cuda["detail"]


def test_require_ibverbs_says_why_it_is_missing() -> None:
    rc, report, err = doctor_json("--require", "ibverbs")
    ib = report["checks"]["ibverbs"]
    if "ibverbs" in available_backends():
        assert rc == 0 and ib["status"] in ("ok", "warning")
        return
    assert rc == 1, err
    assert report["required_missing"] == ["ibverbs"]
    assert f"ibverbs is required but missing: {ib['detail']}" in err
    assert any(why in ib["detail"] for why in (
        "without its ibverbs binding", "no RDMA device", "has an active port",
        "cannot open RDMA device"))
    assert ib["facts"]["cap_ipc_lock"] in (True, False)


def test_require_ibverbs_when_meshio_was_built_without_the_binding() -> None:
    # what an install without libibverbs-dev gives: no meshio._ibverbs_ffi
    rc, report, err = doctor_json("--require", "ibverbs",
                                  prefix="import sys; sys.modules['meshio._ibverbs_ffi'] = None")
    assert rc == 1
    detail = report["checks"]["ibverbs"]["detail"]
    assert "installed without its ibverbs binding" in detail
    assert "libibverbs-dev" in detail
    assert "ibverbs is required but missing: meshio was installed without" in err


def test_require_same_host_follows_ptrace_scope() -> None:
    try:
        scope: int | None = int(Path("/proc/sys/kernel/yama/ptrace_scope").read_text())
    except FileNotFoundError:
        scope = None
    rc, report, err = doctor_json("--require", "same_host")
    same = report["checks"]["same_host"]
    assert same["facts"]["ptrace_scope"] == scope
    usable = scope in (None, 0, 1) or (scope == 2 and os.geteuid() == 0)
    assert rc == (0 if usable else 1), err
    assert same["status"] == ("missing" if not usable else "warning" if scope == 1 else "ok")
    if scope is None:
        assert "no Yama ptrace restriction" in same["detail"]
    else:
        assert f"ptrace_scope={scope}" in same["detail"]


@pytest.mark.parametrize(("scope", "cap", "usable", "says"), [
    (None, False, True, "no Yama ptrace restriction"),
    (0, False, True, "no Yama ptrace restriction"),
    (1, False, True, "PR_SET_PTRACER"),
    (2, True, True, "has CAP_SYS_PTRACE"),
    (2, False, False, "only processes with CAP_SYS_PTRACE"),
    (3, True, False, "forbids process_vm_readv between all processes"),
])
def test_same_host_reason_for_each_ptrace_scope(monkeypatch: pytest.MonkeyPatch,
                                                scope: int | None, cap: bool, usable: bool,
                                                says: str) -> None:
    # the machines here have no Yama: the decision, fed each scope
    from meshio.rdma import _same_host
    monkeypatch.setattr(_same_host, "ptrace_scope", lambda: scope)
    monkeypatch.setattr(_same_host, "capable", lambda cap_bit: cap)
    got, why = _same_host.status()
    assert got == usable
    assert says in why


def _nofile(soft: int) -> Any:
    def lower() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE,
                           (soft, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
    return lower


@pytest.mark.skipif(sys.platform != "linux", reason="personality(2) is Linux's")
def test_layout_check_says_whether_workers_share_one_layout() -> None:
    """issue 16: ``layout`` says what the workers started here get
    (docs/design.md); a real seccomp filter refusing ``personality(2)``, as a
    container's profile, is a warning, not missing."""
    _, report, _ = doctor_json()
    layout = report["checks"]["layout"]
    mine = personality(os.getpid()) & ADDR_NO_RANDOMIZE
    assert (layout["status"], layout["facts"]) == (
        "ok", {"sharing": "inherited" if mine else "shared"})
    _, report, _ = doctor_json(preexec_fn=no_randomization)
    layout = report["checks"]["layout"]
    assert (layout["status"], layout["facts"]) == ("ok", {"sharing": "inherited"})
    assert "setarch -R" in layout["detail"]
    if platform.machine() != "x86_64" or mine:
        return  # (the filter names x86_64's system call; a set flag is only asked about)
    rc, report, _ = doctor_json("--require", "layout", preexec_fn=personality_refused)
    layout = report["checks"]["layout"]
    assert rc == 0 and (layout["status"], layout["facts"]) == ("warning", {"sharing": "refused"})
    assert "personality(2) refused" in layout["detail"]


def test_low_fd_limit_is_a_warning() -> None:
    rc, report, _ = doctor_json("--require", "fds", preexec_fn=_nofile(256))
    fds = report["checks"]["fds"]
    assert rc == 0  # a warning is not missing
    assert fds["status"] == "warning"
    assert fds["facts"]["soft"] == 256
    assert fds["facts"]["procs"] == (256 - 64) // 5
    assert "Too many open files" in fds["detail"] and "ulimit -n" in fds["detail"]
    # and the machine's own limit, as it is
    _, report, _ = doctor_json()
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    enough = soft == resource.RLIM_INFINITY or (soft - 64) // 5 >= 1024
    assert report["checks"]["fds"]["status"] == ("ok" if enough else "warning")


def test_slurm_missing_from_path() -> None:
    proc = doctor("--require", "slurm", env={"PATH": "/nonexistent"})
    assert proc.returncode == 1
    line = next(s for s in proc.stdout.splitlines() if s.split()[1] == "slurm")
    assert line.split()[0] == "missing"
    assert "sinfo, sbatch, squeue, scancel not on PATH" in line
    assert "slurm is required but missing: sinfo, sbatch, squeue, scancel not on PATH" in (
        proc.stderr)


def _fake_slurm(tmp: Path, sinfo: str) -> str:
    """A PATH of stand-ins for Slurm's commands; ``sinfo`` runs ``sinfo``."""
    bin_dir = tmp / "bin"
    bin_dir.mkdir()
    for name, body in (("sinfo", sinfo), ("sbatch", "exit 1"), ("squeue", "exit 1"),
                       ("scancel", "exit 1")):
        path = bin_dir / name
        path.write_text(f"#!/bin/sh\n{body}\n")
        path.chmod(0o755)
    return f"{bin_dir}:{os.environ['PATH']}"


def test_slurm_answering(tmp_path: Path) -> None:
    path = _fake_slurm(tmp_path, 'echo "debug 2 up"; echo "gpu 8 down"')
    rc, report, _ = doctor_json("--require", "slurm", env={"PATH": path})
    assert rc == 0
    assert report["checks"]["slurm"]["status"] == "ok"
    assert report["checks"]["slurm"]["detail"] == (
        "sinfo answered: partitions debug (2 nodes, up), gpu (8 nodes, down)")


async def test_slurm_not_answering_in_time_is_killed(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    pid_file = tmp_path / "sinfo.pid"
    monkeypatch.setenv("PATH", _fake_slurm(tmp_path, f"echo $$ > {pid_file}; exec sleep 600"))
    checks = {c.name: c for c in await meshio.doctor(timeout=0.5)}
    assert checks["slurm"].status == "missing"
    assert checks["slurm"].detail == ("sinfo did not answer within 0.5 s: is slurmctld up and "
                                      "reachable from this host?")
    pid = int(pid_file.read_text())
    with pytest.raises(ProcessLookupError):  # killed and reaped, not left sleeping
        os.kill(pid, 0)


# ------------------------------------------------------------ Kubernetes

class _Api(BaseHTTPRequestHandler):
    """The one request ``meshio doctor`` makes of an API server."""

    def do_GET(self) -> None:
        if self.path.rstrip("/") != "/version":
            self.send_error(404)
            return
        body = json.dumps({"major": "1", "minor": "31", "gitVersion": "v1.31.4-test",
                           "gitCommit": "0", "gitTreeState": "clean",
                           "buildDate": "2025-01-01T00:00:00Z", "goVersion": "go1.23",
                           "compiler": "gc", "platform": "linux/amd64"}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def api_server() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Api)
    thread = threading.Thread(target=server.serve_forever)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        thread.join()
        server.server_close()


def _kubeconfig(tmp: Path, server: str) -> str:
    path = tmp / "kubeconfig"
    path.write_text(f"""apiVersion: v1
kind: Config
clusters:
- name: test
  cluster: {{server: "{server}"}}
users:
- name: test
  user: {{token: not-a-secret}}
contexts:
- name: test
  context: {{cluster: test, user: test}}
current-context: test
""")
    return str(path)


def test_kubernetes_answering(tmp_path: Path, api_server: str) -> None:
    pytest.importorskip("kubernetes")
    rc, report, _ = doctor_json("--require", "kubernetes",
                                env={"KUBECONFIG": _kubeconfig(tmp_path, api_server)})
    assert rc == 0
    assert report["checks"]["kubernetes"] == {
        "name": "kubernetes", "status": "ok", "facts": {},
        "detail": f"the API server at {api_server} answered: Kubernetes v1.31.4-test"}


def test_kubernetes_not_answering_or_not_configured(tmp_path: Path) -> None:
    pytest.importorskip("kubernetes")
    rc, report, err = doctor_json("--require", "kubernetes", env={
        "KUBECONFIG": _kubeconfig(tmp_path, "http://127.0.0.1:1")})
    assert rc == 1
    detail = report["checks"]["kubernetes"]["detail"]
    assert detail.startswith("the Kubernetes API server at http://127.0.0.1:1 did not answer")
    assert "kubernetes is required but missing" in err
    rc, report, _ = doctor_json("--require", "kubernetes",
                                env={"KUBECONFIG": str(tmp_path / "absent")})
    assert rc == 1
    assert report["checks"]["kubernetes"]["detail"].startswith(
        "no Kubernetes cluster is configured")


@pytest.mark.parametrize("content", ["hello\n", "a: [\n"])
def test_kubernetes_with_a_malformed_kubeconfig_is_missing_and_the_rest_reported(
        tmp_path: Path, content: str) -> None:
    """Before, the client's TypeError (or yaml error) ended the command with
    a traceback and no report."""
    pytest.importorskip("kubernetes")
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(content)
    rc, report, err = doctor_json(env={"KUBECONFIG": str(kubeconfig)})
    assert rc == 0 and "Traceback" not in err
    assert tuple(report["checks"]) == CHECKS
    check = report["checks"]["kubernetes"]
    assert check["status"] == "missing"
    assert check["detail"].startswith(f"the kubeconfig {kubeconfig} is not valid (")
    assert "\n" not in check["detail"]
    proc = doctor("--require", "kubernetes", env={"KUBECONFIG": str(kubeconfig)})
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert f"kubernetes  the kubeconfig {kubeconfig} is not valid (" in proc.stdout
    assert "kubernetes is required but missing" in proc.stderr


# ------------------------------------------------------------ the rest

def test_unknown_require_is_a_usage_error() -> None:
    proc = doctor("--require", "infiniband")
    assert proc.returncode == 2
    assert "argument --require: invalid choice: 'infiniband'" in proc.stderr


def test_several_requirements_each_say_why() -> None:
    rc, report, _ = doctor_json("--require", "uvloop", "--require", "tcp",
                                  env={"PATH": "/nonexistent"})
    assert rc == 0 and report["required"] == ["uvloop", "tcp"]
    proc = doctor("--require", "tcp", "--require", "slurm", "--require", "kubernetes",
                  env={"PATH": "/nonexistent", "KUBECONFIG": "/nonexistent"})
    assert proc.returncode == 1
    said = [line.split(":")[1].strip() for line in proc.stderr.splitlines()]
    assert said == ["slurm is required but missing", "kubernetes is required but missing"]


async def test_python_api() -> None:
    checks = await meshio.doctor()
    assert tuple(c.name for c in checks) == CHECKS
    by_name = {c.name: c for c in checks}
    assert by_name["python"].facts["version"] == platform.python_version()
    assert (by_name["same_host"].status != "missing") == ("same_host" in available_backends())


def test_readme_documents_doctor() -> None:
    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    section = readme[readme.index("## Checking a machine: `meshio doctor`"):]
    section = section[:section.index("\n## ", 1)]
    assert "--json" in section and "--require" in section
    for name in CHECKS:
        assert f"`{name}`" in section, name
    for key in ("required_missing", "status", "detail", "facts"):
        assert f'"{key}"' in section, key


async def test_ptrace_scope_1_is_a_same_host_warning(monkeypatch: pytest.MonkeyPatch) -> None:
    # the machines here have no Yama: what the doctor adds, fed scope 1
    if "same_host" not in available_backends():
        pytest.skip("same_host is not usable here")
    from meshio import _doctor
    monkeypatch.setattr(_doctor, "ptrace_scope", lambda: 1)
    monkeypatch.setattr(_doctor, "capable", lambda cap_bit: False)
    same = next(c for c in await meshio.doctor() if c.name == "same_host")
    assert same.status == "warning"
    assert same.facts["ptrace_scope"] == 1
    assert same.detail.endswith(
        "; but large message values travel over the socket, not by one copy, and a worker "
        "reading an RDMABuffer the controller owns fails (sysctl kernel.yama.ptrace_scope=0 "
        "lifts this)")
