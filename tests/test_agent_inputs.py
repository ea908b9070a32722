"""Bad input to ``meshio agent`` and :func:`meshio.attach` is refused at
once, naming it: an empty TLS path (an unset shell variable) never means
"no TLS", a host name with an empty or over-long DNS label is no
``UnicodeError`` traceback, a FIFO as the secret file never blocks the
caller waiting for a writer, and ``--advertise`` is a host, not an
address with a port."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

import meshio
from meshio.jobs._agent import main
from meshio.jobs._remote import not_a_host


def usage_error(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    """The one error line of ``meshio agent ARGV``, which must exit with
    status 2 before it serves (``--idle-timeout``: an agent that does serve
    ends, and the test fails)."""
    with pytest.raises(SystemExit) as exit_:
        main([*argv, "--idle-timeout", "0.5"])
    err = capsys.readouterr().err
    assert exit_.value.code == 2, err
    last = err.strip().splitlines()[-1]
    assert last.startswith("meshio agent: error: "), err
    return last


@pytest.mark.parametrize("empty", ["--tls-cert", "--tls-key", "--tls-ca", "all"])
def test_agent_refuses_an_empty_tls_path(capsys: pytest.CaptureFixture[str],
                                         secret_file: Path, empty: str) -> None:
    """``--tls-cert "$CERT"`` with CERT unset served plain TCP."""
    flags = ("--tls-cert", "--tls-key", "--tls-ca")
    tls = [x for flag in flags for x in (flag, "" if empty in (flag, "all") else "x.pem")]
    last = usage_error(capsys, "--listen", "127.0.0.1:0", "--secret-file", str(secret_file),
                       *tls)
    assert f"{flags[0] if empty == 'all' else empty} '': names no file" in last


@pytest.mark.parametrize("host", ["a" * 64, "a..b"])
def test_agent_refuses_a_listen_host_with_a_bad_dns_label(
        capsys: pytest.CaptureFixture[str], secret_file: Path, host: str) -> None:
    last = usage_error(capsys, "--listen", f"{host}:0", "--secret-file", str(secret_file))
    assert f"--listen '{host}:0': '{host}' is not a host name" in last


@pytest.mark.parametrize("advertise", ["10.0.0.5:1234", "[::1]", "not a host", ""])
def test_agent_advertise_is_a_host_name_or_an_ip_address(
        capsys: pytest.CaptureFixture[str], secret_file: Path, advertise: str) -> None:
    last = usage_error(capsys, "--listen", "127.0.0.1:0", "--secret-file", str(secret_file),
                       "--advertise", advertise)
    assert f"--advertise {advertise!r} is neither a host name nor an IP address" in last


def test_what_is_a_host() -> None:
    for host in ("10.0.0.5", "::1", "node-7.cluster.local", "node-7.", "bücher.example"):
        assert not_a_host(host) is None, host
    assert not_a_host("a" * 64) == "is not a host name (label too long)"
    assert not_a_host(".".join(["a" * 63] * 5)) \
        == "is not a host name (longer than 253 characters)"


def test_a_fifo_as_secret_file_is_refused_without_waiting_for_a_writer(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """Opening a FIFO for reading waits for a writer: the agent hung, and
    ``attach`` (a synchronous call) blocked the controller's loop."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo, 0o600)
    last = usage_error(capsys, "--listen", "127.0.0.1:0", "--secret-file", str(fifo))
    assert f"--secret-file '{fifo}': the file is no regular file (a FIFO" in last
    refused = re.escape(f"secret_file '{fifo}': the file is no regular file (a FIFO")
    with pytest.raises(ValueError, match=refused):
        meshio.attach(["tcp://127.0.0.1:1"], secret_file=fifo)


@pytest.mark.parametrize("address", ["tcp://" + "a" * 64 + ":4000", "a..b:4000"])
def test_attach_refuses_a_host_with_a_bad_dns_label(address: str) -> None:
    """It was a ``UnicodeError`` from ``spawn_procs``, documented as
    ValueError (malformed) or SupervisionError (unreachable)."""
    host = address.removeprefix("tcp://").rpartition(":")[0]
    with pytest.raises(ValueError, match=re.escape(f"'{host}' is not a host name")):
        meshio.attach([address], secret=b"s" * 16)


def test_attach_checks_the_types_of_addresses_and_tls() -> None:
    """Both failed later, in ``spawn_procs``, with an AttributeError."""
    with pytest.raises(TypeError, match=r"addresses\[1\] must be a 'tcp://HOST:PORT' "
                                        "string, got int"):
        meshio.attach(["tcp://h:1", 1], secret=b"s" * 16)  # type: ignore[list-item]
    for tls in ("x", 1):
        with pytest.raises(TypeError, match=r"tls= takes a meshio\.TLSConfig or None, got"):
            meshio.attach(["tcp://h:1"], secret=b"s" * 16, tls=tls)  # type: ignore[arg-type]
