"""``meshio.Retry``: when a failed call is sent again (``@endpoint(retry=...)``)."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

from .._checks import check_count, check_seconds
from .._exceptions import ActorError, SupervisionError

__all__ = ("PROCESS_DEATH", "Retry")


@dataclass(frozen=True)
class Retry:
    """A retry policy for an endpoint: ``@endpoint(retry=meshio.Retry(...))``.

    A call that fails with one of the exception types in ``on`` is sent
    again, up to ``attempts`` times in all, waiting ``backoff`` seconds
    before the second attempt and twice as long before each next one (at
    most a second).  ``on`` matches the exception the endpoint raised, by
    its type (a remote ``ValueError`` matches ``ValueError``; one whose
    class the caller cannot import, by its qualified name), and the
    failures seen by the caller: :class:`~meshio.SupervisionError` (the
    actor's process died or the connection to it was lost; the call then
    goes to the restarted incarnation once its supervisor has rebuilt it).
    Retrying stops where the next attempt would come after the call's
    deadline (``options(timeout=...)``): the caller then gets the last
    failure, not a :class:`~meshio.CallTimeout` that hides it.  The
    endpoint must be safe to run more than once: a call is re-executed
    only where such a policy is declared.

    Attributes:
        attempts: how many times the call is sent at most (1: no retry).
        on: the exception types that are retried.
        backoff: seconds before the first retry (doubled for each next one).

    Raises:
        TypeError: ``attempts`` is not an int (a float, a bool), ``on`` is
            not a tuple of exception types, or ``backoff`` is not a number
            (a str, a bool).
        ValueError: ``attempts`` is below 1, ``on`` holds
            ``CancelledError``, or ``backoff`` is not finite seconds >= 0
            (NaN, or an int no float holds).
    """

    attempts: int = 3
    on: tuple[type[BaseException], ...] = (SupervisionError,)
    backoff: float = 0.1

    def __post_init__(self) -> None:
        check_count(self.attempts, "Retry(attempts=...)", 1)
        if not isinstance(self.on, tuple) or not all(
                isinstance(t, type) and issubclass(t, BaseException) for t in self.on):
            raise TypeError(f"Retry(on=...) must be a tuple of exception types, got {self.on!r}")
        if any(issubclass(t, asyncio.CancelledError) for t in self.on):
            raise ValueError("Retry(on=...) cannot retry CancelledError: a cancelled call is "
                             "given up, not failed")
        # (kept as the float checked: a NumPy scalar is no float on the wire)
        object.__setattr__(self, "backoff",
                           check_seconds(self.backoff, "Retry", "backoff", zero=True, inf=False))

    def matches(self, error: BaseException) -> bool:
        """Whether a call that failed with ``error`` is retried."""
        if isinstance(error, asyncio.CancelledError):
            return False
        if isinstance(error, self.on):
            return True
        return isinstance(error, ActorError) and any(
            error.remote_type in (t.__qualname__, f"{t.__module__}.{t.__qualname__}")
            for t in self.on)

    def sends_again(self, error: BaseException, attempt: int, deadline: float | None,
                    wait: float) -> bool:
        """Whether a call whose ``attempt``-th send (from 1) failed with
        ``error`` is sent again after ``wait`` seconds: attempts are left,
        ``error`` matches and its deadline (``time.monotonic()``; None:
        none) has not passed by then.  (A send the deadline would overtake
        is not waited for: the caller gets ``error``, not a timeout that
        hides it.)"""
        return attempt < self.attempts and self.matches(error) and (
            deadline is None or time.monotonic() + wait < deadline)

    def delay(self, attempt: int) -> float:
        """Seconds to wait after failed attempt number ``attempt`` (from 1)."""
        return min(self.backoff * 2.0 ** (attempt - 1), 1.0)


#: what ``@endpoint(retryable=True)`` means: retry on process death, through
#: several restarts
PROCESS_DEATH = Retry(attempts=10, on=(SupervisionError,), backoff=0.1)
