"""Workers on the controller's host share one address-space layout (issue
16: a call to 4 actors on 2 cores ran ~30% faster with the workers' code
at the same addresses, benchmarks/README.md); workers with a TCP port keep a
random one, and the controller's own is left alone.  Read from
``/proc/<pid>/personality`` and ``/proc/<pid>/maps`` of the real processes."""

from __future__ import annotations

import ast
import os
import platform
import subprocess
import sys

import pytest

import meshio
from layout_actors import (
    ADDR_NO_RANDOMIZE,
    Layout,
    personality,
    personality_refused,
    python_at,
)

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="personality(2) is Linux's")


async def test_workers_on_this_host_share_one_layout_and_nothing_else_does() -> None:
    """The workers alike; the controller keeps its own layout, and what a
    worker starts (a user's server, a tool) gets a random one again."""
    mine = personality(os.getpid())
    if mine & ADDR_NO_RANDOMIZE:
        pytest.skip("this test runs without address randomization already (setarch -R)")
    async with await meshio.this_host().spawn_procs(per_host={"procs": 3}) as procs:
        actors = await procs.spawn("layout", Layout)
        found = (await actors.layout.call()).values()
        assert [p for p, _ in found] == [personality(pid) for pid in procs.pids]
        children = (await actors.child_personality.call()).values()
    assert len({at for _, at in found}) == 1, found  # one layout: the same addresses
    assert python_at(os.getpid()) != found[0][1]  # the controller's is its own
    assert personality(os.getpid()) == mine  # (the flag was set only around each start)
    # the workers cleared it at once, so that what they start is random again
    assert not any(p & ADDR_NO_RANDOMIZE for p, _ in found), found
    assert not any(p & ADDR_NO_RANDOMIZE for p in children), children


REFUSED = """
import sys
sys.path.insert(0, sys.argv[1])
import meshio
from layout_actors import Layout

async def main() -> None:
    async with await meshio.this_host().spawn_procs(per_host={"procs": 2}) as procs:
        found = (await (await procs.spawn("layout", Layout)).layout.call()).values()
    print(sorted({at for _, at in found}))

meshio.run(main())
"""


@pytest.mark.skipif(platform.machine() != "x86_64", reason="the filter names x86_64's call")
def test_workers_start_randomized_where_personality_is_refused() -> None:
    """A controller under a real seccomp filter that refuses to change
    ``personality(2)`` (as a container's profile does) starts its workers
    as before, each with its own layout."""
    out = subprocess.run([sys.executable, "-c", REFUSED, os.path.dirname(__file__)],
                         capture_output=True, text=True, timeout=120,
                         preexec_fn=personality_refused)
    assert out.returncode == 0, out.stderr
    assert len(ast.literal_eval(out.stdout)) == 2, out.stdout  # two layouts, not one
