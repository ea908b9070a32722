"""A gate holding a worker's event loop in a blocking call until the test
opens it: proves a transfer needs none of the owner's Python (no timing)."""

from __future__ import annotations

import asyncio
import os


def hold(ready: str, release: str) -> None:
    """Inside an ``async def`` endpoint (blocking its loop): say so through
    the FIFO ``ready``, then block until the test writes to the FIFO ``release``."""
    fd = os.open(ready, os.O_WRONLY)  # until the test opens it
    os.close(fd)
    fd = os.open(release, os.O_RDONLY)  # until the test writes
    os.read(fd, 1)
    os.close(fd)


class Gate:
    """The test's side: two FIFOs in ``tmp``."""

    def __init__(self, tmp: os.PathLike[str] | str) -> None:
        self.ready = os.path.join(tmp, "ready")
        self.release = os.path.join(tmp, "release")
        os.mkfifo(self.ready)
        os.mkfifo(self.release)

    async def wait_held(self, timeout: float) -> None:
        """Wait until the endpoint is inside :func:`hold`."""
        fd = await asyncio.wait_for(asyncio.to_thread(os.open, self.ready, os.O_RDONLY),
                                    timeout)
        os.close(fd)

    async def open(self) -> None:
        def write() -> None:
            fd = os.open(self.release, os.O_WRONLY)
            os.write(fd, b"x")
            os.close(fd)

        await asyncio.to_thread(write)
