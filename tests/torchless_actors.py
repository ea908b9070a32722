"""An actor whose module never imports torch (as a user's class shipped by
value often is): its worker imports torch only when a value holding a
tensor first arrives (``tests/test_loop_held.py``)."""

from __future__ import annotations

import sys

from meshio import Actor, endpoint


class Sizer(Actor):
    @endpoint
    async def has_torch(self) -> bool:
        return "torch" in sys.modules

    @endpoint
    async def length(self, value: object) -> int:
        return len(value)  # type: ignore[arg-type]
