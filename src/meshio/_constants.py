"""Magic values of the wire and of the kernel, named once.

Errno names come from the standard :mod:`errno` module (``errno.ENOMEM``,
``errno.errorcode``), never as numbers.
"""

from __future__ import annotations

from typing import Final

import msgspec

__all__ = ("KEEPER", "MAX_QUEUED", "MSGPACK_NIL", "PR_SET_PDEATHSIG", "PR_SET_PTRACER",
           "PARTITION_TIMEOUT", "SIOCGIFADDR",
           "STALL_AFTER")

#: an encoded msgpack nil: the payload of a ``Reply`` that carries no value
#: (a write, a drop, a stop) or whose data travels in the frame's buffers
MSGPACK_NIL: Final = msgspec.Raw(b"\xc0")

#: default seconds an actor's call may run before it is reported stalled
#: (``procs.options(stall_after=...)``)
STALL_AFTER: Final = 60.0

#: default seconds a host may be unreachable before it is downed: its
#: processes count as failed, and its agent kills them
#: (``spawn_procs(partition_timeout=...)``)
PARTITION_TIMEOUT: Final = 60.0

#: default bound of an actor's mailbox: calls one caller may have waiting
#: in it (``procs.options(max_queued=...)``, :mod:`meshio._transport._credit`)
MAX_QUEUED: Final = 10_000

#: the most processes ``spawn_procs(per_host=...)`` starts on one host (the
#: product of its sizes): more than any host runs, and a typo such as
#: ``{"gpus": 10**9}`` must be an error, not the controller's memory filling
#: with the ranks of a mesh that can never start
MAX_PER_HOST: Final = 4096

#: ``prctl(2)`` options (``<linux/prctl.h>``): the signal this process gets
#: when its parent dies, and the process allowed to ptrace it (Yama)
PR_SET_PDEATHSIG: Final = 1
PR_SET_PTRACER: Final = 0x59616D61

#: ``ioctl(2)`` request (``<linux/sockios.h>``): the IPv4 address of a
#: network interface
SIOCGIFADDR: Final = 0x8915

#: the first line of the keeper of a worker's process group (``meshio.worker``),
#: in its command line: :func:`meshio.testing.child_pids` leaves keepers out
KEEPER: Final = "# meshio: the keeper of a worker's process group"
