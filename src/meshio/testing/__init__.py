"""Helpers for testing meshio programs (leak checks, waiting on exits)."""

from .._testing import child_pids as child_pids
from .._testing import wait_exited as wait_exited

__all__ = ("child_pids", "wait_exited")
