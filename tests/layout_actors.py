"""How a process's address space is laid out, as the layout tests read it
(tests/test_worker_layout.py, tests/test_hosts.py, tests/test_doctor.py):
``personality(2)``'s flags and where the Python executable is mapped, from
``/proc``; and ``preexec_fn`` functions that start a program without randomization
or with ``personality(2)`` refused."""

from __future__ import annotations

import ctypes
import errno
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


def no_randomization() -> None:
    """A ``preexec_fn``: the program runs as under ``setarch -R``."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.personality(libc.personality(0xFFFFFFFF) | ADDR_NO_RANDOMIZE)


class _Filter(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint16), ("jt", ctypes.c_uint8), ("jf", ctypes.c_uint8),
                ("k", ctypes.c_uint32)]


class _Program(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(_Filter))]


#: x86_64's number of personality(2)
_NR_PERSONALITY = 135


def personality_refused() -> None:
    """A ``preexec_fn``: a real seccomp filter, as a container's profile
    (Docker's refuses ``ADDR_NO_RANDOMIZE``), lets ``personality(2)`` only
    ask (0xFFFFFFFF) and fails any change with ``EPERM``.  x86_64 only."""
    ld_w_abs, jeq_k, ret_k = 0x20, 0x15, 0x06
    program = (_Filter * 6)(
        _Filter(ld_w_abs, 0, 0, 0),                   # the system call's number
        _Filter(jeq_k, 0, 3, _NR_PERSONALITY),        # personality? else allow
        _Filter(ld_w_abs, 0, 0, 16),                  # its argument (low 32 bits)
        _Filter(jeq_k, 1, 0, 0xFFFFFFFF),             # only asking? allow
        _Filter(ret_k, 0, 0, 0x00050000 | errno.EPERM),  # SECCOMP_RET_ERRNO
        _Filter(ret_k, 0, 0, 0x7FFF0000))             # SECCOMP_RET_ALLOW
    prog = _Program(len(program), program)
    libc = ctypes.CDLL(None, use_errno=True)
    pr_set_no_new_privs, pr_set_seccomp, seccomp_mode_filter = 38, 22, 2
    if libc.prctl(pr_set_no_new_privs, 1, 0, 0, 0) != 0 or libc.prctl(
            pr_set_seccomp, seccomp_mode_filter, ctypes.byref(prog), 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "installing the seccomp filter failed")
