"""What the TCP connections of one job prove: its secret, under its TLS
settings.

A controller may drive several jobs at once (a ``ProcessJob`` beside a set
of attached agents, a Slurm allocation for a learner and another for
generators), each with a secret and TLS settings of its own: its runtime
listens once per job (:meth:`~._runtime.Runtime.listen_tcp`) and dials each
job's processes with that job's :class:`Credentials`.  A worker or an agent
belongs to one job and uses its own for every TCP connection.
"""

from __future__ import annotations

import functools
import ssl
from dataclasses import dataclass, field

from ._tls import TLSConfig

__all__ = ("Credentials",)


@dataclass(frozen=True)
class Credentials:
    """A job's secret and TLS settings (None: plain TCP); equal when both
    are.  The secret never appears in a repr."""

    secret: bytes = field(repr=False)
    tls: TLSConfig | None = None

    @functools.cached_property
    def server_context(self) -> ssl.SSLContext | None:
        """The TLS context of a listener of this job (None: plain TCP)."""
        return None if self.tls is None else self.tls.server_context()

    @functools.cached_property
    def client_context(self) -> ssl.SSLContext | None:
        """The TLS context of a dialler of this job (None: plain TCP)."""
        return None if self.tls is None else self.tls.client_context()
