"""meshio's pytest plugin (meshio.testing._plugin, a pytest11 entry point),
run the way a user's suite runs it: small suites in a pytest subprocess."""

from __future__ import annotations

import pytest

pytest_plugins = ["pytester"]

SETTINGS = """
[pytest]
asyncio_mode = auto
asyncio_default_fixture_loop_scope = function
asyncio_default_test_loop_scope = function
timeout = 60
"""


def run(pytester: pytest.Pytester, source: str, *, leak_check: bool = True
        ) -> pytest.RunResult:
    pytester.makeini(SETTINGS + ("meshio_leak_check = true\n" if leak_check else ""))
    pytester.makepyfile(test_user=source)
    # A subprocess: what a test leaks stays out of this test's process.
    return pytester.runpytest_subprocess("-p", "no:cacheprovider", "-ra")


def test_meshio_procs_fixture_spawns_and_stops(pytester: pytest.Pytester) -> None:
    """issue 9: the plugin's meshio_procs fixture gives a proc mesh of two
    processes, or what its marker or an indirect parameter asks for, and
    stops it after the test: with the leak check on, all pass."""
    result = run(pytester, """
import pytest
import meshio

class Echo(meshio.Actor):
    @meshio.endpoint
    async def rank(self) -> int:
        return meshio.current_rank().rank

async def test_default(meshio_procs):
    echo = await meshio_procs.spawn("echo", Echo)
    assert sorted((await echo.rank.call()).values()) == [0, 1]

@pytest.mark.meshio_procs(per_host={"procs": 3})
async def test_marker(meshio_procs):
    assert meshio_procs.extent.sizes == (3,)

@pytest.mark.parametrize("meshio_procs", [{"per_host": {"gpus": 1}}], indirect=True)
async def test_indirect(meshio_procs):
    assert meshio_procs.extent.labels == ("gpus",)

async def test_by_hand():
    async with meshio.this_host().spawn_procs(per_host={"procs": 1}) as procs:
        echo = await procs.spawn("echo", Echo)
        assert await echo.rank.call_one() == 0

def test_transport(meshio_transport):
    assert meshio_transport == "processes"
""")
    result.assert_outcomes(passed=5)


def test_leaked_worker_process_fails_the_test(pytester: pytest.Pytester) -> None:
    """issue 9: a test that leaves a child process running fails its leak
    check, which names the pid and kills it; the next test is unaffected."""
    result = run(pytester, """
import subprocess, sys
children = []

def test_leaks_a_child():
    children.append(subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"]))
    with open("pid", "w") as f:
        f.write(str(children[0].pid))

def test_after():
    children[0].wait(timeout=30)  # killed by the leak check, not by this test
    assert children[0].returncode == -9
""")
    result.assert_outcomes(passed=2, errors=1)
    pid = (pytester.path / "pid").read_text()
    result.stdout.fnmatch_lines([
        "*ERROR at teardown of test_leaks_a_child*",
        f"*meshio_leak_check: the test left behind child processes [[]{pid}[]] (now killed)*",
    ])


def test_proc_mesh_never_stopped_fails_the_test(pytester: pytest.Pytester) -> None:
    """issue 9: a proc mesh the test (or a fixture of its own) started and
    never stopped fails its leak check, every time: it is named, with its
    pids, before the test's runtime closes (which would let its workers exit
    on their own), then stopped, so the next test finds no process of it.
    The same on the in-process transport.  A fixture's mesh stopped in its
    teardown (meshio_procs) is no leak."""
    result = run(pytester, """
import os
import pytest
import meshio
from meshio.testing import child_pids, in_process_host

class Counter(meshio.Actor):
    @meshio.endpoint
    async def add(self, n: int) -> int:
        return n

async def test_forgets_to_stop():
    procs = await meshio.this_host().spawn_procs(per_host={"procs": 2})
    c = await procs.spawn("c", Counter)
    assert (await c.add.call(1)).values() == [1, 1]
    with open("pids", "w") as f:
        f.write(", ".join(map(str, procs.pids)))
    # forgot: await procs.stop()

def test_next_finds_no_worker():
    assert not child_pids()

@pytest.fixture
async def sloppy_procs():
    procs = await meshio.this_host().spawn_procs(per_host={"procs": 1}, name="sloppy")
    yield procs  # and never stopped

async def test_fixture_forgets_to_stop(sloppy_procs):
    pass

async def test_forgets_to_stop_in_process():
    await in_process_host().spawn_procs(per_host={"procs": 2}, name="memory")

async def test_stops(meshio_procs):
    async with meshio.this_host().spawn_procs(per_host={"procs": 1}):
        pass
""")
    result.assert_outcomes(passed=5, errors=3)
    pids = (pytester.path / "pids").read_text()
    result.stdout.fnmatch_lines([
        "*ERROR at teardown of test_forgets_to_stop *",
        "*meshio_leak_check: the test left behind proc mesh 'procs' "
        f"(pids [[]{pids}[]]), never stopped (now stopped)*",
        "*ERROR at teardown of test_fixture_forgets_to_stop*",
        "*the test left behind proc mesh 'sloppy' (pids [[]*[]]), never stopped*",
        "*ERROR at teardown of test_forgets_to_stop_in_process*",
        "*the test left behind proc mesh 'memory' (in-process), never stopped*",
    ])
    result.stdout.no_fnmatch_line("*child processes*")


def test_leaked_socket_and_fd_fail_the_test(pytester: pytest.Pytester) -> None:
    """issue 9: a test that leaves a socket or an open file behind fails its
    leak check, which says what each leaked descriptor is."""
    result = run(pytester, """
import os, socket
kept = []

def test_leaks_a_socket():
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(os.path.abspath("leaked.sock"))
    kept.append(server)

async def test_leaks_a_file():
    kept.append(open("leaked.txt", "w"))

def test_leaks_a_pipe():
    kept.append(os.pipe())

def test_closes_what_it_opens():
    with socket.socket() as s, open("closed.txt", "w"):
        s.bind(("127.0.0.1", 0))
""")
    result.assert_outcomes(passed=4, errors=3)
    sock = pytester.path / "leaked.sock"
    result.stdout.fnmatch_lines([
        "*ERROR at teardown of test_leaks_a_socket*",
        "*meshio_leak_check: the test left behind open file descriptors:*",
        f"*fd *: socket AF_UNIX SOCK_STREAM {sock} (socket:[[]*[]])*",
        "*ERROR at teardown of test_leaks_a_file*",
        f"*fd *: {pytester.path / 'leaked.txt'}*",
        "*ERROR at teardown of test_leaks_a_pipe*",
        "*fd *: pipe:*",
    ])


def test_a_leaking_test_leaves_the_next_one_alone(pytester: pytest.Pytester) -> None:
    """A test that forgets to stop a proc mesh fails its leak check, and
    only it: the pipes and sockets of the mesh it dropped are finalized in
    its own teardown, so under ``filterwarnings = error`` (as the docs
    advise) no ResourceWarning of theirs fails a later, innocent test. A
    ResourceWarning of a test with no leak still fails that test."""
    pytester.makeini(SETTINGS + "filterwarnings = error\nmeshio_leak_check = true\n")
    pytester.makepyfile(test_user="""
import os
import pytest
import meshio

class Echo(meshio.Actor):
    @meshio.endpoint
    async def rank(self) -> int:
        return meshio.current_rank().rank

async def test_1_leaks():
    procs = await meshio.this_host().spawn_procs(per_host={"procs": 1})
    echo = await procs.spawn("echo", Echo)
    assert await echo.rank.call_one() == 0  # and forgets procs.stop()

def test_2_innocent():
    pass

async def test_3_innocent():
    pass

@pytest.fixture
def sloppy():
    yield
    f = open(os.devnull)
    del f  # never closed: its own ResourceWarning, in its own teardown

def test_4_sloppy(sloppy):
    pass

def test_5_innocent():
    pass
""")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-rA")
    result.stdout.fnmatch_lines(["*ERROR at teardown of test_4_sloppy*", "*ResourceWarning*"])
    result.stdout.fnmatch_lines(["PASSED test_user.py::test_2_innocent",
                                 "PASSED test_user.py::test_3_innocent",
                                 "PASSED test_user.py::test_5_innocent"], consecutive=False)
    result.stdout.no_fnmatch_line("ERROR test_user.py::test_*_innocent*")
    result.stdout.fnmatch_lines(["*ERROR at teardown of test_1_leaks*",
                                 "*meshio_leak_check: the test left behind proc mesh 'procs'*"])
    result.assert_outcomes(passed=5, errors=2)


def test_leak_check_is_opt_in_by_ini_or_marker(pytester: pytest.Pytester) -> None:
    """issue 9: without the ini option the plugin checks only tests marked
    meshio_leak_check, so installing meshio changes no other suite."""
    result = run(pytester, """
import os
import pytest
kept = []

def test_unchecked():
    kept.append(os.pipe())

@pytest.mark.meshio_leak_check
def test_checked():
    kept.append(os.pipe())
""", leak_check=False)
    result.assert_outcomes(passed=2, errors=1)
    result.stdout.fnmatch_lines(["*ERROR at teardown of test_checked*"])


def test_the_plugin_turns_off_under_the_guide_settings(pytester: pytest.Pytester) -> None:
    """The guide's settings set meshio_leak_check under filterwarnings =
    error: there, -p no:meshio alone stops pytest at the option it no longer
    knows (as the guide says); with that warning ignored, as the guide says
    to, the suite runs without the plugin; -o meshio_leak_check=false keeps
    the plugin and turns off its leak check."""
    pytester.makeini(SETTINGS + "filterwarnings = error\nmeshio_leak_check = true\n")
    pytester.makepyfile(test_user="""
def test_plain(request):
    on = request.config.pluginmanager.has_plugin("meshio")
    print("meshio:", on, on and request.config.getini("meshio_leak_check"))
""")
    alone = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-p", "no:meshio")
    assert alone.ret == pytest.ExitCode.INTERNAL_ERROR
    alone.stdout.fnmatch_lines(["*Unknown config option: meshio_leak_check*"])
    off = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "-s", "-p", "no:meshio",
        "-W", "ignore:Unknown config option:pytest.PytestConfigWarning")
    off.assert_outcomes(passed=1)
    off.stdout.fnmatch_lines(["*meshio: False False*"])
    unchecked = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-s",
                                              "-o", "meshio_leak_check=false")
    unchecked.assert_outcomes(passed=1)
    unchecked.stdout.fnmatch_lines(["*meshio: True False*"])


def test_unknown_transport_is_refused(pytester: pytest.Pytester) -> None:
    """issue 9: meshio_transport is the seam for more transports; a value
    meshio does not have is an error that lists the ones it has."""
    result = run(pytester, """
import pytest

@pytest.fixture
def meshio_transport():
    return "carrier-pigeon"

async def test_procs(meshio_procs):
    pass
""")
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(
        ["*ValueError: meshio_transport is 'carrier-pigeon'; this meshio has the "
         "transports [[]'processes', 'in-process'[]]*"])


def test_meshio_transports_marker_runs_tests_on_each_transport(pytester: pytest.Pytester
                                                               ) -> None:
    """issue 9: the meshio_transports marker runs each test that uses the
    plugin's mesh fixtures once per transport (the others once); on
    "in-process" the workers are this process, with no child process, and
    the leak check (on) passes; a transport meshio lacks is refused."""
    result = run(pytester, """
import os
import pytest
import meshio
from meshio.testing import child_pids

pytestmark = pytest.mark.meshio_transports()

class Echo(meshio.Actor):
    @meshio.endpoint
    async def where(self) -> tuple[int, str]:
        return os.getpid(), meshio.context().proc.addr

async def test_procs(meshio_procs, meshio_transport):
    echo = await meshio_procs.spawn("echo", Echo)
    found = (await echo.where.call()).values()
    assert len({addr for _, addr in found}) == 2
    in_process = {pid for pid, _ in found} == {os.getpid()}
    assert in_process == (meshio_transport == "in-process")
    assert in_process == (not child_pids())

async def test_host(meshio_host, meshio_transport):
    async with meshio_host.spawn_procs(per_host={"procs": 3}) as procs:
        assert len(procs) == 3

def test_plain():
    pass

@pytest.mark.meshio_transports("in-process")
def test_one(meshio_transport):
    assert meshio_transport == "in-process"
""")
    result.assert_outcomes(passed=6)
    bad = run(pytester, """
import pytest

@pytest.mark.meshio_transports("smoke-signals")
def test_x(meshio_transport):
    pass
""")
    bad.assert_outcomes(errors=1)
    bad.stdout.fnmatch_lines(["*meshio_transports: unknown transports [[]'smoke-signals'[]]*"])


def test_test_on_a_shared_loop_is_checked_for_processes_only(pytester: pytest.Pytester) -> None:
    """issue 9: a test on a module-scoped loop shares that loop's runtime and
    sockets with its neighbours, so the leak check counts only its child
    processes there; meshio_procs, which lives on the test's own loop,
    refuses such a test with a message saying why."""
    result = run(pytester, """
import os, subprocess, sys
import pytest
pytestmark = pytest.mark.asyncio(loop_scope="module")
kept = []

async def test_keeps_a_pipe_for_the_module():
    kept.append(os.pipe())

async def test_leaks_a_child():
    kept.append(subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"]))

async def test_procs(meshio_procs):
    pass
""")
    result.assert_outcomes(passed=2, errors=2)
    result.stdout.fnmatch_lines([
        "*ERROR at teardown of test_leaks_a_child*",
        "*meshio_leak_check: the test left behind child processes*",
        "*ERROR at setup of test_procs*",
        "*RuntimeError: meshio_procs runs on the test's own event loop, but this test runs "
        "on a loop of wider scope*",
    ])
