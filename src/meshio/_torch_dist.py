"""``setup_torch_distributed``: the environment ``torch.distributed`` reads,
set in every process of a proc mesh."""

from __future__ import annotations

import fcntl
import os
import socket
import struct
import uuid
from collections.abc import Sequence

from ._actor import Actor, context, current_rank
from ._constants import SIOCGIFADDR
from ._exceptions import SupervisionError
from ._extent import Extent, Point, Region
from ._proc_mesh import ProcMesh, _ProcMeshRef
from ._transport._sockets import tcp_endpoint
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
    def apply(self, addr: str, port: int, local: list[tuple[int, int]]) -> dict[str, str]:
        """Set the variables of this rank (its index in the world, ``local``:
        each rank's local rank and local world size)."""
        rank = current_rank().rank
        env = {"RANK": str(rank), "WORLD_SIZE": str(len(local)),
               "LOCAL_RANK": str(local[rank][0]), "LOCAL_WORLD_SIZE": str(local[rank][1]),
               "MASTER_ADDR": addr, "MASTER_PORT": str(port)}
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


class _World:
    """The settings of one torch.distributed world (ranks of a proc mesh),
    which a supervisor's replacements get again: a ``ProcState.restart_env``
    hook."""

    def __init__(self, envs: dict[int, dict[str, str]], master: int, fixed_port: bool) -> None:
        #: proc mesh rank → its variables
        self.envs = envs
        self.master = master
        self.fixed_port = fixed_port

    def __call__(self, granks: Sequence[int]) -> dict[int, dict[str, str]]:
        if self.master in granks and not self.fixed_port:
            # the old rank 0's port may still be held (by a child of its
            # process, or a store not torn down): a fresh one for the new
            # rank 0 and for every rank that meets it from now on
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                s.bind(("", 0))
                port = str(s.getsockname()[1])
            for env in self.envs.values():
                env["MASTER_PORT"] = port
        return {grank: dict(self.envs[grank]) for grank in granks if grank in self.envs}


async def setup_torch_distributed(procs: ProcMesh, *,
                                  master_port: int | None = None) -> list[Point]:
    """Set ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``,
    ``MASTER_ADDR`` and ``MASTER_PORT`` in every process of ``procs``, so
    actors there can call ``torch.distributed.init_process_group()`` (gloo on
    CPU, NCCL on GPU; the ``gpus`` dim already set ``CUDA_VISIBLE_DEVICES``).
    On hosts reached over TCP, also ``GLOO_SOCKET_IFNAME`` (unless set): the
    interface holding the address other hosts reach the process at.

    Ranks follow the mesh's row-major order; the rendezvous is on the host of
    rank 0, on ``master_port`` or a port free there (a fresh one each call).

    Holes (:attr:`ProcMesh.holes`) are left out: the live processes are the
    world, ranked in row-major order (``LOCAL_RANK`` among the live ones of
    their host).  Call it again once the mesh changed (a rank died and is a
    hole, :meth:`ProcMesh.replace` filled one, it grew or shrank): the
    processes get the settings of a new world, on a fresh port, and destroy
    and init their process group again (see ``examples/ft_training.py``).

    A supervisor's replacement for one of these processes starts with the
    same variables in its environment (before its ``bootstrap`` and
    actors), so its actors can join a new process group; with rank 0
    replaced (as ``one_for_all`` does), ``MASTER_PORT`` is a fresh port free
    on the controller's host, for the new rank 0 and every rank restarted
    with it or later, unless ``master_port`` was given.

    Returns:
        The points of ``procs`` in the world, in the order of their ``RANK``
        (every point, unless there are holes).

    Raises:
        TypeError: ``procs`` is not a :class:`ProcMesh` (an actor mesh, a
            host mesh), or ``master_port`` is not an int (a str, a bool).
        RuntimeError: ``procs`` is a reference (a proc mesh passed to an
            actor): only the controller that started its processes can set
            them up, as it spawns helper actors there and keeps the settings
            for replacements.
        ValueError: ``master_port`` is not a TCP port, 1..65535.
        SupervisionError: every process of ``procs`` is a hole, or a process
            died meanwhile.
    """
    if not isinstance(procs, ProcMesh):
        raise TypeError(f"setup_torch_distributed: expected a ProcMesh (the processes of the "
                        f"world), got {type(procs).__name__} {procs!r}")
    if isinstance(procs, _ProcMeshRef):
        raise RuntimeError(f"setup_torch_distributed: proc mesh {procs._name!r} is a reference "
                           f"(passed on by the controller that started its processes); call "
                           f"it in that controller")
    if master_port is not None:
        if isinstance(master_port, bool) or not isinstance(master_port, int):
            raise TypeError(f"setup_torch_distributed(master_port=...) must be an int TCP port "
                            f"or None (a free one), got {type(master_port).__name__} "
                            f"{master_port!r}")
        if not 0 < master_port < 65536:
            raise ValueError(f"setup_torch_distributed(master_port=...) must be a TCP port, "
                             f"1..65535, or None (a free one), got {master_port}")
    state = procs._state
    await procs._wait_ready()
    holes = set(state.holes)
    points = [p for p, r in zip(procs._region.points(), procs._region.ranks) if r not in holes]
    ranks = [r for r in procs._region.ranks if r not in holes]
    if not ranks:
        raise SupervisionError(f"setup_torch_distributed: every process of proc mesh "
                               f"{state.name!r} is a hole; replace one first",
                               actor=state.name, cause="no live process")
    # one helper actor on each live process, ranked among them
    live = procs if not holes else procs._with_region(Region(Extent(("live",), (len(ranks),)),
                                                             ranks))
    name = f"_meshio_torch_env_{uuid.uuid4().hex[:8]}"
    env = await live.spawn(name, _TorchEnv)
    try:
        addr, port = await env.slice(**{dim: 0 for dim in live.extent}).rendezvous.call_one()
        by_host: dict[int, list[int]] = {}
        for rank in ranks:
            by_host.setdefault(rank // state.per_host, []).append(rank)
        local = [(by_host[r // state.per_host].index(r), len(by_host[r // state.per_host]))
                 for r in ranks]
        envs = (await env.apply.call(addr, master_port or port, local)).values()
    finally:
        await env.stop()
        state.forget(name)  # (not rebuilt when a process is replaced)
    world = _World(dict(zip(ranks, envs)), ranks[0], master_port is not None)
    state.restart_env[:] = [  # a new world of these ranks replaces the old one
        hook for hook in state.restart_env
        if not (isinstance(hook, _World) and set(hook.envs) & set(procs._region.ranks))
    ] + [world]
    return points
