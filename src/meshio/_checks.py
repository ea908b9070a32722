"""Checks of arguments that several public functions share."""

from __future__ import annotations

import math
import sys
from typing import TypeGuard

__all__ = ("check_seconds",)

#: the least int magnitude no float holds: ``float()`` of one at least this
#: large (``2**1024`` less half the last step of a float) raises OverflowError
_BEYOND_FLOAT = 2**1024 - 2**970


def _is_number(value: object) -> TypeGuard[int | float]:
    """Whether ``value`` is an int or a float, and not a bool: ``True`` is an
    int to Python, but as seconds or a count it is a slip, never meant.  (A
    NaN is a float: compare it, as ``value > 0``, to refuse it.)

    Nor is an int too large for a float (``10**400``): every number of
    seconds becomes a float (a deadline, a timer) and that one would raise
    ``OverflowError`` there, after the argument was taken.  Where a site
    means "no limit" by ``math.inf``, that is how to say it."""
    if type(value) is float:  # (the usual types first, at once)
        return True
    if type(value) is int:
        return -_BEYOND_FLOAT < value < _BEYOND_FLOAT
    if isinstance(value, float):  # a subclass (numpy.float64)
        return True
    return (isinstance(value, int) and not isinstance(value, bool)
            and -_BEYOND_FLOAT < value < _BEYOND_FLOAT)


def check_seconds(value: object, where: str, arg: str, *, zero: bool = False,
                  inf: bool = True, also: str = "") -> float:
    """``value``, given as ``where(arg=...)``, checked to be a number of
    seconds: an int or a float, > 0 (>= 0 with ``zero``), not NaN, finite
    unless ``inf`` (where ``math.inf`` means "no limit" to that function),
    and not an int no float holds.  ``also`` names what else the argument
    takes, for the message (``" or None"``: the caller lets None through).
    Returns ``value`` as given.

    Raises:
        TypeError: ``value`` is no number: a str, None, a bool, ... (the
            message: ``Retry(backoff=...) must be a number of seconds, got
            'abc' (str)``).
        ValueError: ``value`` is a number out of range: negative, 0 unless
            ``zero``, NaN, infinite unless ``inf``, or an int too large for
            a float (``Retry(backoff=...) must be seconds >= 0 and finite,
            got -1``).
    """
    if _is_number(value) and (value >= 0 if zero else value > 0) and (inf or value < math.inf):
        return value
    if not (_is_number(value) or _beyond_float(value)):
        raise TypeError(f"{where}({arg}=...) must be a number of seconds{also}, got {value!r} "
                        f"({type(value).__name__})")
    bound = f"seconds {'>= 0' if zero else '> 0'}{'' if inf else ' and finite'}"
    raise ValueError(f"{where}({arg}=...) must be {bound}{also}, got {value!r}"
                     f"{_too_large(value)}")


def _beyond_float(value: object) -> bool:
    """Whether ``value`` is an int (not a bool) that no float holds: its
    magnitude is beyond ``sys.float_info.max`` (about ``1.8e308``)."""
    return (isinstance(value, int) and not isinstance(value, bool)
            and not -_BEYOND_FLOAT < value < _BEYOND_FLOAT)


def _too_large(value: object) -> str:
    """What ends the message refusing ``value`` when it is an int no float
    holds: ``": too large, ..."``; else ``""``."""
    if not _beyond_float(value):
        return ""
    return f": too large, more than a float holds (at most {sys.float_info.max:.2g})"
