"""How a process's address space is laid out, as the layout tests read it
(tests/test_worker_layout.py, tests/test_hosts.py): ``personality(2)``'s
flags and where the Python executable is mapped, from ``/proc``."""

from __future__ import annotations

import os
import subprocess
import sys

from meshio import Actor, endpoint

#: personality(2): no randomization of the address space (``setarch -R``)
ADDR_NO_RANDOMIZE = 0x0040000


def personality(pid: int) -> int:
    with open(f"/proc/{pid}/personality") as f:
        return int(f.read(), 16)


def python_at(pid: int) -> str:
    """Where the process maps the Python executable (its first mapping)."""
    exe = os.path.realpath(f"/proc/{pid}/exe")
    with open(f"/proc/{pid}/maps") as f:
        return next(line.split()[0] for line in f if line.rstrip().endswith(exe))


class Layout(Actor):
    @endpoint
    async def layout(self) -> tuple[int, str]:
        """This worker's personality flags and where its Python is mapped."""
        return personality(os.getpid()), python_at(os.getpid())

    @endpoint
    async def child_personality(self) -> int:
        """The personality flags of a process this worker starts."""
        out = subprocess.run([sys.executable, "-c", "print(open('/proc/self/personality')"
                              ".read())"], capture_output=True, text=True, check=True).stdout
        return int(out, 16)
