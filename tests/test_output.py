"""Forwarded worker output and the controller's own output, in a real
controller process: neither splits a line of the other."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pexpect
import pytest

#: the controller's rounds: the stream it leaves a line unfinished on while
#: its workers print to the other one, or to the same
ROUNDS = (("stdout", "stdout"), ("stdout", "stdout"), ("stderr", "stderr"),
          ("stdout", "stderr"), ("stderr", "stdout"))

CONTROLLER = f"ROUNDS = {ROUNDS!r}\n" + """
import asyncio
import sys

import meshio
from meshio import Actor, endpoint
from meshio import _launcher

# The controller finishes its partial lines only once the workers' lines have
# reached it: the forwarder's data_received is watched for them.
received: dict[str, int] = {}
waiters: list[tuple[str, int, asyncio.Future[None]]] = []
forward = _launcher.Forward.data_received


def watched(self, data: bytes) -> None:
    forward(self, data)
    key = f"{id(self)}"
    seen = received.get(key + "buf", b"") + data  # markers may straddle chunks
    *done, rest = seen.split(b"\\n")
    received[key + "buf"] = rest
    for line in done:
        marker = (self._prefix + line).split(b" #")[0].decode()
        received[marker] = received.get(marker, 0) + 1
    for marker, n, fut in waiters:
        if received.get(marker, 0) >= n and not fut.done():
            fut.set_result(None)


_launcher.Forward.data_received = watched


async def lines_arrived(marker: str, n: int) -> None:
    fut = asyncio.get_running_loop().create_future()
    waiters.append((marker, n, fut))
    if received.get(marker, 0) >= n:
        fut.set_result(None)
    await asyncio.wait_for(fut, 30)


class Talker(Actor):
    @endpoint
    def say(self, marker: str, n: int, stream: str) -> None:
        for i in range(n):
            print(f"{marker} #{i}", file=getattr(sys, stream))


async def main() -> None:
    procs = await meshio.this_host().spawn_procs(per_host={"procs": 2})
    talkers = await procs.spawn("talkers", Talker)
    for rnd, (stream, worker_stream) in enumerate(ROUNDS):
        out = getattr(sys, stream)
        print(f"controller {stream} line {rnd} begins", end="", file=out, flush=True)
        marker = f"worker {worker_stream} round {rnd}"
        await talkers.say.call(marker, 3, worker_stream)
        await lines_arrived(f"[procs procs=0] {marker}", 3)
        await lines_arrived(f"[procs procs=1] {marker}", 3)
        print(" ... and ends", file=out, flush=True)
    print("last controller line, no newline", end="", flush=True)
    await talkers.say.call("worker stdout late", 2, "stdout")
    await lines_arrived("[procs procs=0] worker stdout late", 2)
    await lines_arrived("[procs procs=1] worker stdout late", 2)
    await procs.stop()


meshio.run(main())
"""


def controller_script(tmp_path: Path) -> Path:
    script = tmp_path / "controller.py"
    script.write_text(textwrap.dedent(CONTROLLER))
    return script


#: the controller's environment
ENV = {**os.environ, "PYTHONWARNINGS": "error"}


@pytest.fixture(scope="module")
def controller(tmp_path_factory: pytest.TempPathFactory) -> subprocess.CompletedProcess[str]:
    """CONTROLLER's run, in a fresh interpreter, its stdout and stderr apart."""
    tmp_path = tmp_path_factory.mktemp("output")
    return subprocess.run([sys.executable, str(controller_script(tmp_path))], cwd=tmp_path,
                          capture_output=True, text=True, timeout=60,
                          stdin=subprocess.DEVNULL, env=ENV)


def assert_whole_lines(text: str, streams: tuple[str, ...]) -> None:
    """In ``text`` (what CONTROLLER wrote to ``streams``), each controller
    line and each worker line is whole."""
    lines = text.splitlines()
    ours = [line for line in lines if not line.startswith("[procs ")]
    theirs = [line for line in lines if line.startswith("[procs ")]
    for rnd, (_, worker_stream) in enumerate(ROUNDS):
        if worker_stream in streams:
            for rank in (0, 1):
                for i in range(3):
                    assert (f"[procs procs={rank}] worker {worker_stream} round {rnd} #{i}"
                            in theirs), text
    for line in theirs:
        assert line.count("[procs ") == 1 and " #" in line, text
    expected = {f"controller {stream} line {rnd} begins ... and ends"
                for rnd, (stream, _) in enumerate(ROUNDS) if stream in streams}
    if "stdout" in streams:
        expected.add("last controller line, no newline")
    assert set(ours) == expected, text


def test_forwarded_lines_never_split_a_controller_line(
        controller: subprocess.CompletedProcess[str]) -> None:
    """issue 8 item 7: while the controller is in the middle of a line
    (``print(..., end="")``), workers' lines wait for it to end; each
    controller line and each worker line comes out whole, on stdout and
    stderr."""
    proc = controller
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert_whole_lines(proc.stdout, ("stdout",))
    assert_whole_lines(proc.stderr, ("stderr",))


def test_on_one_pipe_forwarded_lines_never_split_a_controller_line(tmp_path: Path) -> None:
    """issue 8 item 7, with the controller's stdout and stderr one pipe
    (``2>&1 | ...``): worker lines on either stream wait behind a partial
    controller line on either."""
    proc = subprocess.run([sys.executable, str(controller_script(tmp_path))], cwd=tmp_path,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=60, stdin=subprocess.DEVNULL, env=ENV)
    assert proc.returncode == 0, proc.stdout
    assert_whole_lines(proc.stdout, ("stdout", "stderr"))


def test_on_a_terminal_forwarded_lines_never_split_a_controller_line(tmp_path: Path) -> None:
    """issue 8 item 7, with the controller's stdout and stderr one terminal."""
    child = pexpect.spawn(sys.executable, [str(controller_script(tmp_path))], cwd=str(tmp_path),
                          env=ENV, encoding="utf-8", timeout=60)
    try:
        child.expect(pexpect.EOF)
    finally:
        child.close(force=True)
    assert child.exitstatus == 0, child.before
    assert_whole_lines(child.before.replace("\r\n", "\n"), ("stdout", "stderr"))


def test_worker_lines_held_behind_a_partial_line_come_out_at_exit(
        controller: subprocess.CompletedProcess[str]) -> None:
    """issue 8 item 7: worker lines held behind a controller line that never
    ends still come out, on their own line, when the controller exits."""
    proc = controller
    assert proc.returncode == 0, proc.stdout + proc.stderr
    last, tail = proc.stdout.split("last controller line, no newline")
    assert last.endswith("\n"), proc.stdout
    assert tail.startswith("\n") and tail.endswith("\n"), proc.stdout
    assert sorted(tail.splitlines()[1:]) == [
        f"[procs procs={r}] worker stdout late #{i}" for r in (0, 1) for i in (0, 1)], proc.stdout


#: the longest piece of an unfinished line the controller holds (bytes):
#: ``Forward.LINE_LIMIT``
LINE_LIMIT = 1 << 16

LONG_LINES = """
import asyncio
import sys

import meshio
from meshio import Actor, endpoint
from meshio._launcher import Forward

LIMIT = 1 << 16
PREFIX = "[procs procs=0] "


def text_of(n: int) -> str:
    '''n characters, of 1 to 4 bytes each in UTF-8.'''
    unit = "abcd\\u00e9\\u20ac\\U0001d11exyz0123456789"
    return (unit * (n // len(unit) + 1))[:n]


class Recorder:
    '''The controller's stdout: what worker output reached it.'''

    def __init__(self) -> None:
        self.parts: list[str] = []
        self.grew = asyncio.Event()

    def write(self, text: str) -> int:
        self.parts.append(text)
        self.grew.set()
        return len(text)

    def flush(self) -> None:
        pass

    def content(self) -> str:
        '''the text forwarded so far, without prefixes and newlines'''
        text = "".join(self.parts)
        return "".join(line.removeprefix(PREFIX) for line in text.split("\\n"))

    async def until(self, test) -> None:
        async with asyncio.timeout(30):
            while not test():
                self.grew.clear()
                await self.grew.wait()


class Writer(Actor):
    @endpoint
    def unfinished(self, n: int) -> None:
        text = text_of(n)
        for i in range(0, n, 1000):
            sys.stdout.write(text[i:i + 1000])
            sys.stdout.flush()

    @endpoint
    def end_line(self) -> None:
        print(flush=True)

    @endpoint
    def progress(self, steps: int) -> None:
        for i in range(steps):  # as tqdm redraws its bar
            sys.stdout.write(f"\\r{i:>6} of {steps} " + "#" * (i % 80))
            sys.stdout.flush()
        sys.stdout.write(f"\\rall {steps} done\\n")
        sys.stdout.write("crlf line\\r\\n")
        sys.stdout.flush()

    @endpoint
    def draw(self, n: int) -> None:
        for i in range(n):  # a line redrawn, not ended
            sys.stdout.write(f"\\rframe {i}")
            sys.stdout.flush()


async def main() -> None:
    n = 5 * LIMIT + 1001
    total = len(text_of(n).encode())
    out = sys.stdout
    rec = sys.stdout = Recorder()
    Forward.REDRAW_EVERY = float("inf")  # (however slow this machine is)
    try:
        async with meshio.this_host().spawn_procs(per_host={"procs": 1}) as procs:
            writer = await procs.spawn("writer", Writer)
            await writer.unfinished.call_one(n)
            # the line is not finished: all of it but what one piece holds comes out
            try:
                await rec.until(lambda: len(rec.content().encode()) >= total - LIMIT)
            except TimeoutError:
                print(f"held back: {total - len(rec.content().encode())} bytes", file=out)
            await writer.end_line.call_one()
            await rec.until(lambda: rec.content() == text_of(n))
            await writer.progress.call_one(3000)
            await rec.until(lambda: "crlf line" in rec.content())
            Forward.REDRAW_EVERY = 0.0  # every drawing goes out once redrawn
            await writer.draw.call_one(4)
            await rec.until(lambda: "frame 2" in rec.content())
            await writer.end_line.call_one()
            await rec.until(lambda: "frame 3" in rec.content())
    finally:
        sys.stdout = out
    with open("forwarded.txt", "w", encoding="utf-8", newline="") as f:
        f.write("".join(rec.parts))


meshio.run(main())
"""


@pytest.fixture(scope="module")
def long_lines(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    """LONG_LINES's run: its output and what worker output it forwarded."""
    tmp_path = tmp_path_factory.mktemp("long_lines")
    script = tmp_path / "controller.py"
    script.write_text(textwrap.dedent(LONG_LINES))
    proc = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120, stdin=subprocess.DEVNULL,
                          env={**os.environ, "PYTHONWARNINGS": "error"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    with open(tmp_path / "forwarded.txt", encoding="utf-8", newline="") as f:
        return proc.stdout + proc.stderr, f.read()


def test_an_unfinished_line_is_forwarded_in_bounded_pieces(long_lines: tuple[str, str]) -> None:
    """A worker line without a newline (here 5 x 64 KiB and more) is not
    held whole by the controller (memory without bound, quadratic time):
    pieces of at most 64 KiB go out while it is still unfinished (the
    controller saw all but the last before the newline), each on a line of
    its own, and put together they are the worker's text exactly, no
    character cut in two."""
    output, forwarded = long_lines
    assert "held back" not in output, output
    lines = forwarded.split("\n")
    assert lines[-1] == "" and all(line.startswith("[procs procs=0] ") for line in lines[:-1])
    pieces = [line.removeprefix("[procs procs=0] ")
              for line in lines[:lines.index("[procs procs=0] all 3000 done")]]
    assert len(pieces) >= 6
    assert all(0 < len(p.encode()) <= LINE_LIMIT for p in pieces), [len(p) for p in pieces]
    unit = "abcd\u00e9\u20ac\U0001d11exyz0123456789"
    n = 5 * LINE_LIMIT + 1001
    assert "".join(pieces) == (unit * (n // len(unit) + 1))[:n]
    assert "\ufffd" not in forwarded


def test_a_line_redrawn_with_carriage_returns_goes_out_as_it_last_looked(
        long_lines: tuple[str, str]) -> None:
    """A progress bar (3000 redraws after ``\\r``, some 160 KB, one line)
    is held as its last drawing only, and goes out once, as a terminal
    would show it at its end; ``\\r\\n`` ends a line as ``\\n`` does.
    While a line is redrawn, its drawings go out every ``REDRAW_EVERY``
    seconds (here 0: each once the next begins), before the line ends."""
    _, forwarded = long_lines
    assert forwarded.split("\n")[-7:] == [
        "[procs procs=0] all 3000 done", "[procs procs=0] crlf line",
        *(f"[procs procs=0] frame {i}" for i in range(4)), ""]
    assert "\r" not in forwarded


STALLED = """
import sys

import meshio
from meshio import Actor, endpoint

LINES = 40_000


class Chatty(Actor):
    @endpoint
    def chat(self) -> int:
        line = "x" * 999
        for _ in range(LINES):
            print(line)
        return LINES

    @endpoint
    def ping(self) -> str:
        return "pong"


async def main() -> None:
    procs = await meshio.this_host().spawn_procs(per_host={"procs": 1})
    chatty = await procs.spawn("chatty", Chatty)
    await chatty.chat.call()
    print("answered", await chatty.ping.call_one(), file=sys.stderr, flush=True)
    sys.stdin.readline()  # (the test reads stdout from now on)
    await procs.stop()


meshio.run(main())
"""


@pytest.mark.timeout(240)
def test_a_stdout_nobody_reads_does_not_stall_the_controller(tmp_path: Path) -> None:
    """A controller whose stdout is not read (a pipe into a stalled
    consumer) while a worker prints 40 MB: the controller's loop goes on
    (the call returns, another is answered) rather than blocking on the
    write; what waited beyond ``_LineGate.BACKLOG`` is dropped, and a line
    in its place counts it: the lines written and those counted are all
    40,000 the worker printed."""
    script = tmp_path / "controller.py"
    script.write_text(textwrap.dedent(STALLED))
    answered = threading.Event()
    err: list[str] = []
    with subprocess.Popen([sys.executable, str(script)], cwd=tmp_path, text=True,
                          stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE) as proc:
        assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
        stderr = proc.stderr

        def read_stderr() -> None:
            for line in stderr:
                err.append(line)
                if line == "answered pong\n":
                    answered.set()

        reader = threading.Thread(target=read_stderr, daemon=True)
        reader.start()
        try:
            assert answered.wait(180), "".join(err)
            proc.stdin.write("\n")
            proc.stdin.flush()
            out = proc.stdout.read()
            assert proc.wait(60) == 0, "".join(err)
        finally:
            proc.kill()
            reader.join(60)
    lines = out.splitlines()
    written = lines.count("[procs procs=0] " + "x" * 999)
    dropped = [int(m[1]) for m in re.finditer(
        r"^meshio: (\d+) lines of worker output dropped here: more than 16,777,216 "
        r"characters of it waited for this stream to be read$", out, re.MULTILINE)]
    assert dropped and written > 16_000, (len(lines), dropped, "".join(err))
    assert written + sum(dropped) == 40_000
    assert len(lines) == written + len(dropped), [
        line[:80] for line in lines if not line.startswith("[procs procs=0] x")]
