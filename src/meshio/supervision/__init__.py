"""Supervision trees (OTP vocabulary): supervisors, strategies, restart
types, shutdown policies, events and clocks."""

from .._exceptions import ProcessStartError as ProcessStartError
from .._exceptions import SupervisionError as SupervisionError
from .._util import fixup_module_metadata as _fixup_module_metadata
from ._clocks import Clock as Clock
from ._clocks import ManualClock as ManualClock
from ._clocks import MonotonicClock as MonotonicClock
from ._events import SupervisionEvent as SupervisionEvent
from ._supervisor import RestartType as RestartType
from ._supervisor import ShutdownPolicy as ShutdownPolicy
from ._supervisor import Strategy as Strategy
from ._supervisor import Supervisor as Supervisor

__all__ = (
    "Clock",
    "ManualClock",
    "MonotonicClock",
    "ProcessStartError",
    "RestartType",
    "ShutdownPolicy",
    "Strategy",
    "SupervisionError",
    "SupervisionEvent",
    "Supervisor",
)

_fixup_module_metadata(__name__, globals())
