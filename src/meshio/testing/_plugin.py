"""meshio's pytest plugin, loaded through the ``pytest11`` entry point in
every pytest run where meshio is installed (``-p no:meshio`` turns it off;
where the ini file sets ``meshio_leak_check`` and ``filterwarnings = error``,
with ``-W "ignore:Unknown config option:pytest.PytestConfigWarning"`` too,
or pytest stops at the option it no longer knows).

It adds nothing to a test that does not ask for it:

- ``meshio_procs``: a proc mesh for the test, stopped after it (two
  processes on this host; other ``spawn_procs`` arguments through the
  ``meshio_procs`` marker or an indirect parameter).
- ``meshio_host``: the host mesh ``meshio_procs`` spawns on, for tests that
  call ``spawn_procs`` themselves: ``this_host()``, or
  ``in_process_host()`` on the in-process transport.
- ``meshio_transport``: what ``meshio_procs`` and ``meshio_host`` run on:
  ``"processes"`` (the default: worker processes on this host) or
  ``"in-process"`` (workers on the test's own loop, no processes; see
  :mod:`meshio.testing`). Parametrise it, like anyio's ``anyio_backend``, to
  run the same tests on both with the ``meshio_transports`` marker (on a
  test, a class or a module's ``pytestmark``; it parametrises the tests
  there that use these fixtures and leaves the others alone), or override
  the fixture.
- ``meshio_runtime_cleanup``: stops the proc meshes still running on the
  test's loop, then closes its meshio runtime (its listening socket and
  connections) after the test; ``meshio_procs`` uses it.
- ``meshio_leak_check``: fails a test that leaves proc meshes not stopped,
  child processes or open file descriptors (sockets, pipes, files) behind,
  and cleans up after it (stops those meshes, kills those processes,
  collects what the test dropped without closing, so the next test does not
  inherit its warnings). On for every test with the
  ini option ``meshio_leak_check = true``, or per test/module with the
  ``meshio_leak_check`` marker.

Async fixtures need pytest-asyncio, with per-test event loops (see
docs/guide.md, "Testing your meshio program").
"""

from __future__ import annotations

import gc
import os
import signal
import warnings
from collections.abc import AsyncIterator, Generator, Iterator
from typing import Any

import pytest

from .._inspect import Inspection
from .._proc_mesh import HostMesh, ProcMesh, this_host
from .._proc_state import ProcState
from .._transport._runtime import close_runtime, existing_runtime
from ._helpers import child_pids
from ._inprocess import TRANSPORTS, InProcessLauncher, Transport, in_process_host
from ._leaks import open_fds

try:
    from pytest_asyncio import fixture as _async_fixture
except ImportError:  # async fixtures then run only where another plugin runs them
    _async_fixture = pytest.fixture  # type: ignore[assignment]

__all__ = ()

DEFAULT_PER_HOST = {"procs": 2}

#: set on a test the leak check watches (from its setup on)
_CHECKED = pytest.StashKey[bool]()
#: what the leak check found: failed by :func:`pytest_runtest_teardown`
_LEAKED = pytest.StashKey[str]()
#: the proc meshes the test left running, as the leak check names them
#: (found by :func:`meshio_runtime_cleanup`, which stops them)
_UNSTOPPED = pytest.StashKey[list[str]]()


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addini("meshio_leak_check", type="bool", default=False,
                  help="meshio: fail every test that leaves child processes or open "
                       "file descriptors behind (default: only tests marked "
                       "meshio_leak_check)")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "meshio_leak_check: fail the test if it leaves child processes or "
                   "open file descriptors (sockets, pipes, files) behind")
    config.addinivalue_line(
        "markers", "meshio_procs(**spawn_procs_kwargs): arguments of the meshio_procs "
                   "fixture's this_host().spawn_procs(...), e.g. per_host={'procs': 4}")
    config.addinivalue_line(
        "markers", "meshio_transports(*transports): run each test here that uses "
                   "meshio_procs, meshio_host or meshio_transport once per transport "
                   "(default: all of meshio.testing.TRANSPORTS)")


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    marker = metafunc.definition.get_closest_marker("meshio_transports")
    if marker is None or "meshio_transport" not in metafunc.fixturenames:
        return
    transports = marker.args or TRANSPORTS
    unknown = [t for t in transports if t not in TRANSPORTS]
    if unknown:
        raise ValueError(f"meshio_transports: unknown transports {unknown}; this meshio has "
                         f"{list(TRANSPORTS)}")
    metafunc.parametrize("meshio_transport", transports)


@pytest.fixture(autouse=True)
def _meshio_autouse_leak_check(request: pytest.FixtureRequest) -> None:
    if (request.config.getini("meshio_leak_check")
            or request.node.get_closest_marker("meshio_leak_check") is not None):
        request.getfixturevalue("meshio_leak_check")


@pytest.fixture
def meshio_leak_check(request: pytest.FixtureRequest) -> None:
    """Fail the test if, once its function-scoped fixtures are torn down, it
    left proc meshes running on its loop (stopped then, before its loop's
    meshio runtime closes), or, once that runtime is closed, child processes
    (killed then) or file descriptors open that were not open before it. What
    fixtures of wider scope set up before it is not counted. A test on a
    loop of wider scope (``loop_scope="module"``) shares that loop's runtime
    and sockets with its neighbours: only its child processes are checked."""
    request.getfixturevalue("_meshio_leaks")  # first up, so checked last
    if _own_loop(request.node):
        request.getfixturevalue("meshio_runtime_cleanup")


def _own_loop(node: pytest.Item) -> bool:
    """Whether the test runs on a loop of its own (pytest-asyncio's
    function loop scope)."""
    marker = node.get_closest_marker("asyncio")
    if marker is not None and "loop_scope" in marker.kwargs:
        return bool(marker.kwargs["loop_scope"] == "function")
    try:
        scope = node.config.getini("asyncio_default_test_loop_scope")
    except ValueError:  # no pytest-asyncio
        return True
    return scope in (None, "", "function")


@pytest.fixture
def _meshio_leaks(request: pytest.FixtureRequest) -> Iterator[None]:
    check_fds = _own_loop(request.node)
    pids, fds = child_pids(), open_fds() if check_fds else {}
    request.node.stash[_CHECKED] = True
    yield
    leaked_pids = sorted(child_pids() - pids)
    for pid in leaked_pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    now = open_fds() if check_fds else {}
    leaked_fds = [f"fd {fd}: {what}" for fd, what in sorted(now.items())
                  if fds.get(fd) != what]
    problems: list[str] = []
    unstopped = request.node.stash.get(_UNSTOPPED, [])
    if unstopped:
        problems.append(f"proc mesh{'es' * (len(unstopped) > 1)} {', '.join(unstopped)}, "
                        f"never stopped (now stopped)")
    if leaked_pids:
        problems.append(f"child processes {leaked_pids} (now killed)")
    if leaked_fds:
        problems.append("open file descriptors:\n    " + "\n    ".join(leaked_fds))
    if problems:  # (failed once the whole teardown is done: see pytest_runtest_teardown)
        request.node.stash[_LEAKED] = (
            "meshio_leak_check: the test left behind " + "; ".join(problems)
            + "\nStop proc meshes (async with / await procs.stop()) and close "
              "sockets and files before the test ends.")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item) -> Generator[None, None, None]:
    """The teardown of a test the leak check watches.  What a leaking test
    left open is finalized during it (the test loop's close drops the pipe
    transports of a worker nobody stopped; the garbage collector the rest):
    the ``ResourceWarning``s that raises are held back until the leak check
    has spoken.  If it found leaks, they are that leak's echo: dropped, with
    what the test left behind collected here, so that no later test inherits
    them (under ``filterwarnings = error`` each would fail whichever test ran
    when it came), and the leak check fails this test.  Otherwise they are
    given back, as the test's own."""
    if not item.stash.get(_CHECKED, False):
        return (yield)
    failed: Exception | None = None
    with warnings.catch_warnings(record=True) as held:
        warnings.simplefilter("always", ResourceWarning)  # (held, not raised: see below)
        try:
            result = yield
        except Exception as e:  # another fixture's teardown failed: raised below
            failed, result = e, None
        leaked = item.stash.get(_LEAKED, None)
        if leaked is not None:
            del item.stash[_LEAKED]
            held[:] = [w for w in held if not issubclass(w.category, ResourceWarning)]
            _collect_quietly()
    errors: list[Warning] = []
    for w in held:  # under the test's own warning filters again
        try:
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno, source=w.source)
        except Warning as e:  # (filterwarnings = error)
            errors.append(e)
    del held
    if failed is not None:
        if leaked is not None:
            failed.add_note(leaked)
        raise failed
    if leaked is not None:
        pytest.fail(leaked, pytrace=False)
    if len(errors) == 1:
        raise errors[0]
    if errors:
        raise ExceptionGroup("warnings while tearing the test down", errors)
    return result


def _collect_quietly() -> None:
    """Collect what a leaking test left behind while its leaks are being
    reported, without their finalizers' ``ResourceWarning``s (an unclosed
    pipe or socket, a subprocess "still running")."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        for _ in range(5):  # (what one pass's finalizers let go of needs another)
            if not gc.collect():
                break


@_async_fixture
async def meshio_runtime_cleanup(request: pytest.FixtureRequest) -> AsyncIterator[None]:
    """After the test, stop the proc meshes it left running on its loop
    (the leak check, if on, names them), then close the loop's meshio
    runtime (listening socket, connections), with its loop.  Stopped first,
    not only dropped with the runtime's connections: their workers have
    exited when the leak check counts child processes."""
    yield
    try:
        rt = existing_runtime()
        if rt is None or not rt.has_state(Inspection):  # (it watches every proc mesh started)
            return
        running = [state for state in rt.state(Inspection).procs if not state.stopped]
        # (a mesh whose every process failed with nothing to restart it holds none)
        leaked = [_named(state) for state in running
                  if not set(state.region.ranks) <= state.failures.keys()]
        if leaked and request.node.stash.get(_CHECKED, False):
            request.node.stash[_UNSTOPPED] = leaked
        for state in running:
            await ProcMesh(state, None).stop()
    finally:
        close_runtime()


def _named(state: ProcState) -> str:
    """A proc mesh as the leak check names it: ``'procs' (pids [...])``."""
    if all(isinstance(launcher, InProcessLauncher) for launcher in state.launchers):
        return f"{state.name!r} (in-process)"
    return f"{state.name!r} (pids {[w.handle.pid for w in state.workers]})"


@pytest.fixture
def meshio_transport() -> Transport:
    """The transport ``meshio_procs`` and ``meshio_host`` run on:
    ``"processes"`` unless parametrised (``TRANSPORTS`` lists them all)."""
    return "processes"


@pytest.fixture
def meshio_host(meshio_transport: str) -> HostMesh:
    """The host mesh of ``meshio_transport``: ``this_host()`` for
    ``"processes"``, ``in_process_host()`` for ``"in-process"``."""
    if meshio_transport == "processes":
        return this_host()
    if meshio_transport == "in-process":
        return in_process_host()
    raise ValueError(f"meshio_transport is {meshio_transport!r}; this meshio has the "
                     f"transports {list(TRANSPORTS)}")


@_async_fixture
async def meshio_procs(request: pytest.FixtureRequest, meshio_host: HostMesh,
                       meshio_runtime_cleanup: None) -> AsyncIterator[ProcMesh]:
    """A proc mesh for the test, stopped after it: ``this_host().spawn_procs``
    with ``per_host={"procs": 2}`` unless the ``meshio_procs`` marker
    (``@pytest.mark.meshio_procs(per_host={"procs": 4})``) or an indirect
    parameter (a dict of ``spawn_procs`` keyword arguments) says otherwise."""
    if not _own_loop(request.node):
        raise RuntimeError("meshio_procs runs on the test's own event loop, but this test "
                           "runs on a loop of wider scope (loop_scope); spawn a mesh of that "
                           "scope in a fixture of your own, or give the test its own loop")
    kwargs: dict[str, Any] = {"per_host": DEFAULT_PER_HOST}
    marker = request.node.get_closest_marker("meshio_procs")
    if marker is not None:
        if marker.args:
            raise TypeError("the meshio_procs marker takes keyword arguments of "
                            "spawn_procs, e.g. meshio_procs(per_host={'procs': 4})")
        kwargs.update(marker.kwargs)
    kwargs.update(getattr(request, "param", {}))
    async with meshio_host.spawn_procs(**kwargs) as procs:
        yield procs
