"""Supervision trees (OTP vocabulary).  Filled in by the supervision work;
today a dead process surfaces as :class:`meshio.SupervisionError`."""

from .._exceptions import SupervisionError as SupervisionError

__all__ = ("SupervisionError",)
