"""``setup_torch_distributed``: the environment ``torch.distributed`` reads,
set in every process of a proc mesh."""

from __future__ import annotations

import fcntl
import os
import socket
import struct
import uuid

from ._actor import Actor, context, current_rank
from ._constants import SIOCGIFADDR
from ._proc_mesh import ProcMesh
from ._transport._runtime import tcp_endpoint
from .endpoints._endpoint import endpoint

__all__ = ("setup_torch_distributed",)


class _TorchEnv(Actor):
    """Sets the variables in its process (internal)."""

    @endpoint
    def rendezvous(self) -> tuple[str, int]:
        """An address and a free port on this (rank 0's) host: the address
        its other hosts reach it at (its TCP address, when it has one)."""
        tcp = tcp_endpoint(context().proc.addr)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("", 0))
            port: int = s.getsockname()[1]
        return tcp[0] if tcp is not None else socket.gethostbyname(socket.gethostname()), port

    @endpoint
    def apply(self, world: int, addr: str, port: int, local_world: int) -> dict[str, str]:
        rank = current_rank().rank
        env = {"RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank % local_world),
               "LOCAL_WORLD_SIZE": str(local_world), "MASTER_ADDR": addr,
               "MASTER_PORT": str(port)}
        # gloo's own choice of interface resolves the host name, which on
        # many clusters and containers names no address of the host: use the
        # one the other hosts reach this process at (unless the user chose)
        tcp = tcp_endpoint(context().proc.addr)
        if tcp is not None and "GLOO_SOCKET_IFNAME" not in os.environ:
            name = _interface_of(tcp[0])
            if name is not None:
                env["GLOO_SOCKET_IFNAME"] = name
        os.environ.update(env)
        return env


def _interface_of(addr: str) -> str | None:
    """The name of this host's network interface holding IPv4 ``addr``."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for _, name in socket.if_nameindex():
            try:
                request = struct.pack("256s", name.encode()[:15])
                packed = fcntl.ioctl(s.fileno(), SIOCGIFADDR, request)
            except OSError:  # no IPv4 address on it
                continue
            if socket.inet_ntoa(packed[20:24]) == addr:
                return name
    return None


async def setup_torch_distributed(procs: ProcMesh, *, master_port: int | None = None) -> None:
    """Set ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``,
    ``MASTER_ADDR`` and ``MASTER_PORT`` in every process of ``procs``, so
    actors there can call ``torch.distributed.init_process_group()`` (gloo on
    CPU, NCCL on GPU; the ``gpus`` dim already set ``CUDA_VISIBLE_DEVICES``).
    On hosts reached over TCP, also ``GLOO_SOCKET_IFNAME`` (unless set): the
    interface holding the address other hosts reach the process at.

    Ranks follow the mesh's row-major order; the rendezvous is on the host of
    rank 0, on ``master_port`` or a port free there.
    """
    env = await procs.spawn(f"_meshio_torch_env_{uuid.uuid4().hex[:8]}", _TorchEnv)
    try:
        first = env.slice(**{dim: 0 for dim in procs.extent})
        addr, port = await first.rendezvous.call_one()
        per_host = procs._state.per_host
        await env.apply.call(len(procs), addr, master_port or port, per_host)
    finally:
        await env.stop()
