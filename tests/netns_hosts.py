"""Simulated hosts for tests: Linux network namespaces joined by a bridge.

Each host is a namespace with its own private address on a /24 (no
default route: nothing leaves the machine), attached by a veth pair to a
bridge whose address in the root namespace is the controller's side.  A
host agent runs inside each namespace (``ip netns exec``); taking a host's
veth down partitions it, bringing it up heals it.  Needs root (CI runs as
root); tests skip without it.
"""

from __future__ import annotations

import fcntl
import os
import random
import secrets
import shutil
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

AGENT_START = 30.0


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=30)


#: held while a bridge picks its subnet and takes its address: test runs on
#: one machine (and two host sets of one run) never share a subnet, whose
#: routes would send a controller to another set's agents
SUBNET_LOCK = Path("/run/lock/meshio-netns-subnets") if Path("/run/lock").is_dir() \
    else Path("/tmp/meshio-netns-subnets.lock")


def _free_subnet() -> int:
    """A ``10.<n>.0.0/24`` no address of this machine is in (call with
    :data:`SUBNET_LOCK` held)."""
    used = subprocess.run(["ip", "-o", "-4", "addr", "show"], check=True, capture_output=True,
                          text=True, timeout=30).stdout
    free = [n for n in range(100, 250) if f" 10.{n}.0." not in used]
    if not free:
        raise RuntimeError("no free 10.<n>.0.0/24 subnet for namespace hosts (100-249 in use)")
    return random.choice(free)


def can_make_namespaces() -> bool:
    return os.geteuid() == 0 and shutil.which("ip") is not None


requires_netns = pytest.mark.skipif(not can_make_namespaces(),
                                    reason="network namespaces need root and iproute2")


@dataclass
class Host:
    """One namespace host: its namespace, address, veth (root side) and agent."""

    netns: str
    addr: str
    veth: str
    agent: subprocess.Popen[bytes] | None = None
    agent_addr: str = ""

    def partition(self) -> None:
        """Cut the host off the bridge (its processes keep running)."""
        _ip("link", "set", self.veth, "down")

    def heal(self) -> None:
        _ip("link", "set", self.veth, "up")

    def start_agent(self, secret_file: Path, agent_args: tuple[str, ...] = ()) -> None:
        """Start ``meshio agent`` in the namespace, on port 29500 of its
        address (again, once the last one has exited: a restarted agent at
        the same address); :meth:`agent_listening` waits for it."""
        if self.agent is not None:
            self.agent.wait(AGENT_START)
            if self.agent.stdout is not None:
                self.agent.stdout.close()
        self.agent = subprocess.Popen(
            ["ip", "netns", "exec", self.netns, sys.executable, "-m", "meshio", "agent",
             "--listen", f"{self.addr}:29500", "--secret-file", str(secret_file),
             *agent_args], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE)

    def agent_listening(self) -> None:
        """Wait until the agent listens (its first line); note its address."""
        assert self.agent is not None and self.agent.stdout is not None
        line = self.agent.stdout.readline().decode()
        assert line.startswith("meshio agent listening on "), line
        self.agent_addr = line.split()[-1]


@contextmanager
def netns_hosts(n: int, secret_file: Path, *, agent_args: tuple[str, ...] = ()
                ) -> Iterator[list[Host]]:
    """``n`` namespace hosts, each running ``meshio agent`` on port 29500 of
    its own address; everything is removed afterwards."""
    tag = secrets.token_hex(3)
    bridge = f"mbr{tag}"
    hosts: list[Host] = []
    _ip("link", "add", bridge, "type", "bridge")
    try:
        with open(SUBNET_LOCK, "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            subnet = _free_subnet()
            _ip("addr", "add", f"10.{subnet}.0.1/24", "dev", bridge)
        _ip("link", "set", bridge, "up")
        for i in range(n):
            host = Host(f"mh{tag}{i}", f"10.{subnet}.0.{10 + i}", f"mv{tag}{i}")
            hosts.append(host)
            _ip("netns", "add", host.netns)
            _ip("link", "add", host.veth, "type", "veth", "peer", "name", f"mp{tag}{i}")
            _ip("link", "set", f"mp{tag}{i}", "netns", host.netns)
            _ip("link", "set", host.veth, "master", bridge)
            _ip("link", "set", host.veth, "up")
            inside = ("netns", "exec", host.netns, "ip")
            _ip(*inside, "addr", "add", f"{host.addr}/24", "dev", f"mp{tag}{i}")
            _ip(*inside, "link", "set", f"mp{tag}{i}", "up")
            _ip(*inside, "link", "set", "lo", "up")
        for host in hosts:
            host.start_agent(secret_file, agent_args)
        for host in hosts:
            host.agent_listening()
        yield hosts
    finally:
        for host in hosts:
            if host.agent is not None:
                host.agent.terminate()
                try:
                    host.agent.wait(AGENT_START)
                except subprocess.TimeoutExpired:
                    host.agent.kill()
                    host.agent.wait()
                if host.agent.stdout is not None:
                    host.agent.stdout.close()
            subprocess.run(["ip", "netns", "del", host.netns], capture_output=True)
            subprocess.run(["ip", "link", "del", host.veth], capture_output=True)
        subprocess.run(["ip", "link", "del", bridge], capture_output=True)
