"""Checks of arguments that several public functions share."""

from __future__ import annotations

from typing import TypeGuard

__all__ = ("is_number",)


def is_number(value: object) -> TypeGuard[int | float]:
    """Whether ``value`` is an int or a float, and not a bool: ``True`` is an
    int to Python, but as seconds or a count it is a slip, never meant.  (A
    NaN is a float: compare it, as ``value > 0``, to refuse it.)"""
    return isinstance(value, (int, float)) and not isinstance(value, bool)
