"""Checks of arguments that several public functions share."""

from __future__ import annotations

import sys
from typing import TypeGuard

__all__ = ("beyond_float", "is_number", "too_large")


def is_number(value: object) -> TypeGuard[int | float]:
    """Whether ``value`` is an int or a float, and not a bool: ``True`` is an
    int to Python, but as seconds or a count it is a slip, never meant.  (A
    NaN is a float: compare it, as ``value > 0``, to refuse it.)

    Nor is an int too large for a float (:func:`beyond_float`, ``10**400``):
    every number of seconds becomes a float (a deadline, a timer) and that
    one would raise ``OverflowError`` there, after the argument was taken.
    Where a site means "no limit" by ``math.inf``, that is how to say it."""
    if isinstance(value, float):
        return True
    return isinstance(value, int) and not isinstance(value, bool) and not beyond_float(value)


def beyond_float(value: object) -> bool:
    """Whether ``value`` is an int (not a bool) that no float holds: its
    magnitude is beyond ``sys.float_info.max`` (about ``1.8e308``)."""
    if not isinstance(value, int) or isinstance(value, bool):
        return False
    try:
        float(value)
    except OverflowError:
        return True
    return False


def too_large(value: object) -> str:
    """What ends the message refusing ``value`` as seconds when it is an int
    no float holds (:func:`beyond_float`): ``": too large, ..."``; else ``""``."""
    if not beyond_float(value):
        return ""
    return f": too large, more than a float holds (at most {sys.float_info.max:.2g})"
