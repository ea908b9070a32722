"""Checks of arguments that several public functions share."""

from __future__ import annotations

import math
import numbers
import sys

__all__ = ("check_count", "check_seconds")

def _as_seconds(value: object) -> float | None:
    """``value`` as a float if it is a real number and not a bool; else
    None.  Any real number is taken: an int, a float, a ``Fraction``, a
    NumPy scalar (``numpy.float32(0.5)``, ``numpy.int64(3)``: a timeout
    computed with NumPy); never a bool (``True`` is an int to Python, but
    as seconds it is a slip, never meant; ``numpy.bool_`` is no
    ``numbers.Real``), a complex, a str.  (A NaN is a float: compare it, as
    ``value > 0``, to refuse it.)

    Nor is an int too large for a float (``10**400``): every number of
    seconds becomes a float (a deadline, a timer) and that one would raise
    ``OverflowError`` there, after the argument was taken.  Where a site
    means "no limit" by ``math.inf``, that is how to say it."""
    if type(value) is float:  # (the usual type first, at once)
        return value
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return None
    try:
        return float(value)
    except OverflowError:  # (a huge int, or a Fraction of one)
        return None


def check_seconds(value: object, where: str, arg: str, *, zero: bool = False,
                  inf: bool = True, also: str = "") -> float:
    """``value``, given as ``where(arg=...)``, checked to be a number of
    seconds: a real number that is not a bool (an int, a float, a NumPy
    scalar such as ``numpy.float32(0.5)`` or ``numpy.int64(3)``), > 0
    (>= 0 with ``zero``), not NaN, finite unless ``inf`` (where
    ``math.inf`` means "no limit" to that function), and not a number no
    float holds.  ``also`` names what else the argument takes, for the
    message (``" or None"``: the caller lets None through).  Returns
    ``value`` as a float: callers keep that, not ``value`` (a NumPy scalar
    is no float to msgspec, nor to ``json``).

    Raises:
        TypeError: ``value`` is no real number: a str, None, a bool (or
            ``numpy.bool_``), a complex, ... (the message: ``Retry(backoff=...)
            must be a number of seconds, got 'abc' (str)``).
        ValueError: ``value`` is a number out of range: negative, 0 unless
            ``zero``, NaN, infinite unless ``inf``, or too large for a float
            (``Retry(backoff=...) must be seconds >= 0 and finite, got -1``).
    """
    seconds = _as_seconds(value)
    if seconds is not None and (seconds >= 0 if zero else seconds > 0) and (
            inf or seconds < math.inf):
        return seconds
    if seconds is None and not _beyond_float(value):
        raise TypeError(f"{where}({arg}=...) must be a number of seconds{also}, got {value!r} "
                        f"({type(value).__name__})")
    bound = f"seconds {'>= 0' if zero else '> 0'}{'' if inf else ' and finite'}"
    raise ValueError(f"{where}({arg}=...) must be {bound}{also}, got {value!r}"
                     f"{_too_large(value)}")


def check_count(value: object, what: str, least: int) -> int:
    """``value``, the argument ``what`` names (``"Retry(attempts=...)"``,
    ``"Supervisor: max_restarts"``), checked to be an int (not a bool, nor
    a float such as ``3.0``) of at least ``least``.

    Raises:
        TypeError: ``value`` is no int: a str, a float, a bool, ...
            (``Retry(attempts=...) must be an int >= 1, got float 2.5``).
        ValueError: ``value`` is an int below ``least``.
    """
    if type(value) is not int:
        raise TypeError(f"{what} must be an int >= {least}, got {type(value).__name__} "
                        f"{value!r}")
    if value < least:
        raise ValueError(f"{what} must be an int >= {least}, got {value!r}")
    return value


def _beyond_float(value: object) -> bool:
    """Whether ``value`` is a real number (not a bool) that no float holds:
    its magnitude is beyond ``sys.float_info.max`` (about ``1.8e308``)."""
    return (isinstance(value, numbers.Real) and not isinstance(value, bool)
            and _as_seconds(value) is None)


def _too_large(value: object) -> str:
    """What ends the message refusing ``value`` when it is an int no float
    holds: ``": too large, ..."``; else ``""``."""
    if not _beyond_float(value):
        return ""
    return f": too large, more than a float holds (at most {sys.float_info.max:.2g})"
