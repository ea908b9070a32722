"""Ordinary bad input to the ``meshio`` command (``agent``, ``bench``,
``demo``) is one line naming it and exit status 2, as argparse gives for
bad arguments: never a Python traceback, and never an agent that runs on
with a setting that cannot work (``--idle-timeout nan`` spun a CPU
forever; ``0`` exited before any controller could reach it)."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import trustme

from meshio._constants import MAX_PER_HOST
from meshio.jobs._remote import not_private

DEADLINE = 60.0


def meshio_cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """``python -m meshio ARGS``: it must end by itself (a command that does
    not is killed at DEADLINE, and the test fails)."""
    return subprocess.run([sys.executable, "-m", "meshio", *args], capture_output=True,
                          text=True, timeout=DEADLINE, cwd=cwd)


def assert_usage_error(out: subprocess.CompletedProcess[str], *named: str) -> None:
    assert out.returncode == 2, out.stderr
    assert "Traceback" not in out.stderr, out.stderr
    last = out.stderr.strip().splitlines()[-1]
    assert "error:" in last
    for what in named:
        assert what in last, last


@pytest.mark.parametrize(("listen", "named"), [
    ("127.0.0.1", "HOST:PORT"), ("127.0.0.1:99999", "0..65535"),
    ("no-such-host.invalid:0", "cannot resolve 'no-such-host.invalid'")])
def test_agent_bad_listen_address(tmp_path: Path, secret_file: Path, listen: str,
                                  named: str) -> None:
    out = meshio_cli("agent", "--listen", listen, "--secret-file", str(secret_file),
                     cwd=tmp_path)
    assert_usage_error(out, "--listen", named)


@pytest.mark.parametrize("seconds", ["nan", "0", "-5", "soon"])
def test_agent_idle_timeout_must_be_seconds_above_zero(tmp_path: Path, secret_file: Path,
                                                      seconds: str) -> None:
    out = meshio_cli("agent", "--listen", "127.0.0.1:0", "--secret-file", str(secret_file),
                     "--idle-timeout", seconds, cwd=tmp_path)
    assert_usage_error(out, "--idle-timeout", repr(seconds))
    assert "listening" not in out.stdout


def test_agent_missing_or_short_secret_file(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-secret"
    out = meshio_cli("agent", "--listen", "127.0.0.1:0", "--secret-file", str(missing),
                     cwd=tmp_path)
    assert_usage_error(out, "--secret-file", str(missing), "No such file")
    short = tmp_path / "short"
    short.write_bytes(b"abc")
    short.chmod(0o600)
    out = meshio_cli("agent", "--listen", "127.0.0.1:0", "--secret-file", str(short),
                     cwd=tmp_path)
    assert_usage_error(out, "--secret-file", "at least 16 bytes")


@pytest.mark.parametrize("mode", [0o644, 0o606])
def test_agent_refuses_a_secret_file_others_may_read(tmp_path: Path, secret_file: Path,
                                                     mode: int) -> None:
    """A secret file every user may read or write is refused, as the job
    caches refuse it; the agent served with it before."""
    secret_file.chmod(mode)
    out = meshio_cli("agent", "--listen", "127.0.0.1:0", "--secret-file", str(secret_file),
                     cwd=tmp_path)
    assert_usage_error(out, "--secret-file", str(secret_file), f"(mode {mode:o})", "chmod 600")
    assert "listening" not in out.stdout


def test_a_private_secret_file_is_its_users_or_roots_shared_with_its_group() -> None:
    """What the agent's ``--secret-file`` check (``private=True``) and the
    job caches' refuse: a file of root's may be shared with its group (how
    Kubernetes mounts the job's Secret: root's, mode 0440, for the pod's
    ``fsGroup``), one of the user's may not; nobody's may be every user's."""
    def st(mode: int, uid: int) -> os.stat_result:
        return os.stat_result((mode, 0, 0, 1, uid, 0, 32, 0, 0, 0))

    me, file = os.getuid(), stat.S_IFREG
    for root_group in (False, True):
        assert not_private(st(file | 0o600, me), root_group=root_group) is None
        assert "mode 644" in str(not_private(st(file | 0o644, me), root_group=root_group))
        assert not_private(st(stat.S_IFIFO | 0o600, me), root_group=root_group) \
            == "is no regular file (a FIFO, a device, a directory, a socket)"
    assert not_private(st(file | 0o640, me)) == "is readable or writable by others (mode 640)"
    assert not_private(st(file | 0o400, me + 1)) \
        == f"belongs to uid {me + 1}, not to you (uid {me})"
    assert not_private(st(file | 0o440, 0), root_group=True) is None
    assert not_private(st(file | 0o444, 0), root_group=True) \
        == "is readable or writable by every user (mode 444)"


def test_agent_tls_files_that_are_not_pem(tmp_path: Path, secret_file: Path) -> None:
    ca = trustme.CA()
    ca.issue_cert("agent.example").private_key_and_cert_chain_pem.write_to_path(
        tmp_path / "agent.pem")
    ca.cert_pem.write_to_path(tmp_path / "ca.pem")
    base = ["agent", "--listen", "127.0.0.1:0", "--secret-file", str(secret_file)]
    garbage = str(secret_file)
    out = meshio_cli(*base, "--tls-cert", garbage, "--tls-key", garbage, "--tls-ca",
                     str(tmp_path / "ca.pem"), cwd=tmp_path)
    assert_usage_error(out, "--tls-cert", "--tls-key", "not a PEM certificate")
    out = meshio_cli(*base, "--tls-cert", str(tmp_path / "agent.pem"), "--tls-key",
                     str(tmp_path / "agent.pem"), "--tls-ca", garbage, cwd=tmp_path)
    assert_usage_error(out, "--tls-ca", "not a PEM CA bundle")


@pytest.mark.parametrize("args", [["bench", "--calls", "0"], ["bench", "--inflight", "-1"]])
def test_counts_below_one_are_refused(tmp_path: Path, args: list[str]) -> None:
    out = meshio_cli(*args, cwd=tmp_path)
    assert_usage_error(out, args[1], "must be an int >= 1", repr(args[2]))


@pytest.mark.parametrize("args", [["bench", "--procs", "0"], ["demo", "--procs", "0"],
                                  ["demo", "--procs", "two"],
                                  ["demo", "--procs", str(MAX_PER_HOST + 1)],
                                  ["bench", "--procs", "5000"]])
def test_procs_beyond_what_one_host_starts_are_refused(tmp_path: Path, args: list[str]) -> None:
    """``--procs`` is 1 to what ``spawn_procs`` starts on one host; more was a
    ValueError traceback from ``spawn_procs`` once the command had started."""
    out = meshio_cli(*args, cwd=tmp_path)
    assert_usage_error(out, "--procs", f"must be an int in 1..{MAX_PER_HOST}", repr(args[2]))
    assert out.stdout == ""
