"""Exception classes only worker processes import (an endpoint of
``test_errors.py`` imports this module when it raises one): the test process
never has them loaded, as a controller has not a library's own errors."""

from __future__ import annotations


class BatchError(ValueError):
    pass


class BadBatch(BatchError):
    pass
