"""The actor of ``test_bootstrap.py``, in a module of its own that the test
module does not import at its top: a worker imports it when it loads the
actor class, so what this module saw when it was imported shows whether the
process's ``bootstrap`` had run before."""

from __future__ import annotations

import os

from meshio import Actor, endpoint

#: the bootstrap's mark in this process's environment when this module was
#: imported (None: no bootstrap had run)
MARK_AT_IMPORT = os.environ.get("BOOTSTRAP_MARK")


class Probe(Actor):
    """Reports what its process was started with."""

    @endpoint
    def env(self, names: list[str]) -> dict[str, str | None]:
        return {name: os.environ.get(name) for name in names}

    @endpoint
    def mark_at_import(self) -> str | None:
        return MARK_AT_IMPORT

    @endpoint
    def pid(self) -> int:
        return os.getpid()
