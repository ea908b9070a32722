"""What a supervisor reports: one :class:`SupervisionEvent` per failure,
restart, escalation or stop."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, TypeAlias

__all__ = ("EventKind", "SupervisionEvent")

#: what a :class:`SupervisionEvent` is about
EventKind: TypeAlias = Literal["failure", "restart", "escalation", "stopped", "stall",
                               "poison"]


@dataclass(frozen=True)
class SupervisionEvent:
    """One thing a supervisor saw or did.

    Attributes:
        kind: ``"failure"``, ``"restart"`` (a replacement is up and its actors
            rebuilt), ``"escalation"`` (intensity exceeded: gave up),
            ``"stopped"`` (a process or child supervisor was stopped: by
            the strategy's restart, by a shrink, or as the supervisor gave
            up, before its ``"escalation"``) or
            ``"stall"`` (a call has run longer than its actor's
            ``stall_after``; ``cause`` names actor, endpoint, duration and
            holds the call's stack; nothing is restarted) or ``"poison"``
            (a call killed its actor's process ``poison_after`` times in a
            row and is not delivered again; those crashes counted as one
            failure).
        timestamp: wall-clock time (``time.time()``).
        supervisor: the supervisor's name.
        mesh: the proc mesh (or child supervisor) concerned.
        rank: the process's rank in that mesh (-1: the whole child).
        cause: what happened, in words.
        pid: the process id (-1 when not about one process).
        host: the host of the process.
    """

    kind: EventKind
    timestamp: float
    supervisor: str
    mesh: str
    rank: int
    cause: str
    pid: int = -1
    host: str = ""
