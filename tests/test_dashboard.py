"""The live dashboard over plain HTTP (issue 19 §3): ``meshio.serve_dashboard``
serves the page, its state, a server-sent event stream with supervision
events as they happen, every actor's stacks and ``/metrics``; off loopback
every request needs the job's token, and on loopback a client of another
user does too (but for ``/metrics``); ``meshio dashboard`` has a running
controller serve it.  The page itself, in a real browser:
``tests/test_dashboard_browser.py``."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import socket
import sys
import urllib.error
import urllib.request
from collections.abc import AsyncGenerator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families
from supervision_helpers import W, supervised

import meshio
from log_watch import loop_reports
from meshio import Actor, endpoint
from meshio._dashboard import tcp_peer_uid, token
from meshio._transport._runtime import runtime
from stacks_controller import meshio_cli, running

GUARD = 30.0


class Echo(Actor):
    @endpoint
    async def echo(self, x: int) -> int:
        return x


def get(url: str, headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
    """GET ``url`` (blocking): status, headers, body (also of an error status)."""
    req = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=GUARD) as answer:
            return answer.status, dict(answer.headers), answer.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()


async def aget(url: str, headers: dict[str, str] | None = None
               ) -> tuple[int, dict[str, str], bytes]:
    return await asyncio.to_thread(get, url, headers)


async def events(port: int, query: str = "") -> AsyncGenerator[tuple[str, Any], None]:
    """The server-sent events of ``/events``: (kind, decoded data)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(f"GET /events{query} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())
        head = await reader.readuntil(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200 OK\r\n"), head
        assert b"Content-Type: text/event-stream" in head
        while True:
            block = (await reader.readuntil(b"\n\n")).decode()
            fields = dict(line.split(": ", 1) for line in block.strip().split("\n"))
            yield fields["event"], json.loads(fields["data"])
    finally:
        writer.close()


async def test_page_state_stacks_metrics_and_stream_on_loopback(
        procs: meshio.ProcMesh) -> None:
    echo = await procs.spawn("echo", Echo)
    for i in range(3):
        assert await echo.slice(procs=0).echo.call_one(i) == i
    async with meshio.serve_dashboard() as server:
        assert isinstance(server, meshio.DashboardServer)
        assert server.host == "127.0.0.1" and server.port > 0
        assert server.url == f"http://127.0.0.1:{server.port}/?token={server.token}"
        assert server.token == token(runtime().secret)
        base = f"http://127.0.0.1:{server.port}"
        status, headers, page = await aget(base + "/")  # loopback: no token needed
        assert status == 200 and headers["Content-Type"].startswith("text/html")
        assert b"<title>meshio dashboard</title>" in page and b'id="stacks-button"' in page
        assert (await aget(base + "/", {"Host": f"localhost:{server.port}"}))[0] == 200
        # a page of another site whose name now points here (DNS rebinding): token needed
        rebound = {"Host": f"evil.example:{server.port}"}
        assert (await aget(base + "/api/state", rebound))[0] == 401
        assert (await aget(f"{base}/api/state?token={server.token}", rebound))[0] == 200
        status, _, body = await aget(base + "/api/state")
        assert status == 200
        state = json.loads(body)
        assert state["job"]["pid"] == os.getpid()
        [pm] = state["proc_meshes"]
        assert pm["name"] == "procs" and [p["rank"] for p in pm["processes"]] == [0, 1]
        assert pm["id"].startswith("procs-")
        assert [p["pid"] for p in pm["processes"]] == procs.pids
        assert all(p["rss"] > 1 << 20 and p["cpu_user"] > 0 for p in pm["processes"])
        [actor] = pm["processes"][0]["actors"]
        [ep] = actor["endpoints"]
        assert (actor["actor"], ep["endpoint"], ep["calls"]) == ("echo", "Echo.echo", 3)
        assert state["meshes"] == {pm["id"]: {"name": "procs", "supervisor": None,
                                              "strategy": None, "extent": {"procs": 2},
                                              "actor_meshes": ["echo"]}}
        status, headers, body = await aget(base + "/metrics")
        assert status == 200 and headers["Content-Type"].startswith("text/plain; version=0.0.4")
        calls = {s.labels["rank"]: s.value
                 for f in text_string_to_metric_families(body.decode())
                 if f.name == "meshio_endpoint_calls" for s in f.samples}
        assert calls == {"0": 3.0, "1": 0.0}
        status, _, body = await aget(base + "/api/stacks")
        stacks = json.loads(body)
        assert status == 200 and stacks["text"] == "echo ranks 0-1: idle\n"
        assert [a["rank"] for a in stacks["stacks"]["actors"]] == [0, 1]
        assert (await aget(base + "/nowhere"))[0] == 404
        stream = events(server.port)
        try:
            async with asyncio.timeout(GUARD):
                kind, first = await anext(stream)
                assert kind == "state" and first["proc_meshes"][0]["name"] == "procs"
                assert await echo.slice(procs=1).echo.call_one(7) == 7
                while True:  # the next states count the new call
                    kind, later = await anext(stream)
                    assert kind == "state" and later["time"] >= first["time"]
                    ranks = later["proc_meshes"][0]["processes"]
                    if ranks[1]["actors"][0]["endpoints"][0]["calls"] == 1:
                        break
        finally:
            await stream.aclose()
    assert "closed" in repr(server)
    with pytest.raises(urllib.error.URLError):
        get(base + "/")


async def test_supervision_events_stream_live() -> None:
    async with supervised(2) as s:
        await s.procs.spawn("w", W, 1)
        async with meshio.serve_dashboard() as server:
            stream = events(server.port)
            try:
                async with asyncio.timeout(GUARD):
                    assert (await anext(stream))[0] == "state"
                    os.kill(s.old[1], signal.SIGKILL)
                    seen: list[tuple[str, int, int]] = []
                    while ("restart", 1) not in [(k, r) for k, r, _ in seen]:
                        kind, data = await anext(stream)
                        if kind == "supervision":
                            assert data["supervisor"] == s.sup.name and data["mesh"] == "procs"
                            seen.append((data["kind"], data["rank"], data["pid"]))
                    assert seen[0] == ("failure", 1, s.old[1])
                    [(_, _, new_pid)] = [e for e in seen if e[0] == "restart"]
                    assert new_pid == s.procs.pids[1] != s.old[1]
                    while True:  # the state shows the restart too
                        kind, data = await anext(stream)
                        if kind == "state":
                            break
                    assert [p["restarts"] for p in data["proc_meshes"][0]["processes"]] == [0, 1]
                    mesh_id = data["proc_meshes"][0]["id"]
                    assert data["meshes"][mesh_id]["supervisor"] == s.sup.name
            finally:
                await stream.aclose()
            # a page opened later is told the past events first
            late = events(server.port)
            try:
                async with asyncio.timeout(GUARD):
                    kind, data = await anext(late)
                    assert (kind, data["kind"], data["rank"]) == ("supervision", "failure", 1)
            finally:
                await late.aclose()


async def test_off_loopback_every_request_needs_the_token(procs: meshio.ProcMesh) -> None:
    await procs.spawn("echo", Echo)
    async with meshio.serve_dashboard(host="0.0.0.0") as server:
        assert server.url == (f"http://{socket.gethostname()}:{server.port}/"
                              f"?token={server.token}")
        assert len(server.token) == 32 and server.token == token(runtime().secret)
        assert server.token != token(b"another job's secret")
        base = f"http://127.0.0.1:{server.port}"
        # One character off (never the same character: a token may start with "0").
        wrong = ("1" if server.token[0] == "0" else "0") + server.token[1:]
        for path in ("/", "/api/state", "/api/stacks", "/metrics", "/events", "/nowhere"):
            status, headers, body = await aget(base + path)
            assert status == 401 and headers["WWW-Authenticate"].startswith("Bearer"), path
            assert b"token" in body and b"meshio_" not in body
            assert (await aget(f"{base}{path}?token={wrong}"))[0] == 403, path
            assert (await aget(base + path, {"Authorization": "Bearer nope"}))[0] == 403, path
        for path in ("/", "/api/state", "/api/stacks", "/metrics"):
            assert (await aget(f"{base}{path}?token={server.token}"))[0] == 200, path
            assert (await aget(base + path,
                               {"Authorization": f"Bearer {server.token}"}))[0] == 200, path
        stream = events(server.port, f"?token={server.token}")
        try:
            async with asyncio.timeout(GUARD):
                assert (await anext(stream))[0] == "state"
        finally:
            await stream.aclose()


async def status_of(port: int, request: bytes, host: str = "127.0.0.1") -> str:
    """The status of the answer to ``request``, sent as it is."""
    reader, writer = await asyncio.open_connection(host, port)
    try:
        writer.write(request)
        async with asyncio.timeout(GUARD):
            head = await reader.readuntil(b"\r\n")
        return head.decode().removeprefix("HTTP/1.1 ").strip()
    finally:
        writer.close()


async def test_loopback_answers_local_clients_naming_no_host_or_localhost_in_any_case(
        procs: meshio.ProcMesh) -> None:
    await procs.spawn("echo", Echo)
    async with meshio.serve_dashboard() as server:
        port = server.port
        for host in (f"LOCALHOST:{port}", "LocalHost", f"localhost.:{port}", f"[::1]:{port}",
                     f"127.0.0.1:{port}", ""):
            request = f"GET /api/state HTTP/1.1\r\nHost: {host}\r\n\r\n".encode()
            assert await status_of(port, request) == "200 OK", host
        # HTTP/1.0 needs no Host; without one a request names no other host (a
        # browser always names one: it is no web page's trick)
        assert await status_of(port, b"GET /api/state HTTP/1.0\r\n\r\n") == "200 OK"
        for host in ("EVIL.example", "localhost.evil.example", "127.0.0.1.evil.example"):
            request = f"GET /api/state HTTP/1.1\r\nHost: {host}:{port}\r\n\r\n".encode()
            assert await status_of(port, request) == "401 Unauthorized", host
        # a Host that only begins as a loopback one names no host of ours
        for host in ("[::1]evil", f"[::1]evil:{port}", "[::1", "localhost:x",
                     "127.0.0.1:\uff18\uff10"):  # (fullwidth digits)
            request = f"GET /api/state HTTP/1.1\r\nHost: {host}\r\n\r\n".encode()
            assert await status_of(port, request) == "401 Unauthorized", host
    async with meshio.serve_dashboard(host="0.0.0.0") as server:  # off loopback: the token
        assert await status_of(server.port, b"GET /api/state HTTP/1.0\r\n\r\n") \
            == "401 Unauthorized"
        named = f"GET /api/state HTTP/1.1\r\nHost: LOCALHOST:{server.port}\r\n\r\n"
        assert await status_of(server.port, named.encode()) == "401 Unauthorized"


#: a client run as another user: GETs each target of argv[4:] from the
#: dashboard at argv[1]:argv[2] (Host: localhost), prints {target: [status line, body]}
OTHER_USER = r"""
import json, socket, sys
host, port = sys.argv[1], int(sys.argv[2])
answers = {}
for target in sys.argv[3:]:
    with socket.create_connection((host, port), timeout=30) as s:
        s.sendall(f"GET {target} HTTP/1.1\r\nHost: localhost:{port}\r\n\r\n".encode())
        answer = b""
        while b"\r\n\r\n" not in answer and (chunk := s.recv(65536)):
            answer += chunk
        head, _, body = answer.partition(b"\r\n\r\n")
        while not head.startswith(b"HTTP/1.1 200") and (chunk := s.recv(65536)):
            body += chunk  # (a refusal: read to its end)
    answers[target] = [head.split(b"\r\n")[0].decode(), body.decode(errors="replace")]
print(json.dumps(answers), flush=True)
"""


@pytest.mark.skipif(os.getuid() != 0, reason="needs root to run a process as another user")
@pytest.mark.parametrize("host", ["127.0.0.1", "::1"])
async def test_loopback_answers_another_user_only_with_the_token(
        procs: meshio.ProcMesh, host: str) -> None:
    """A local client of another user (uid 65534) reads the job's command
    line and every actor's stacks only with the token, as the inspection
    socket answers only its own user; ``/metrics`` it reads without one."""
    await procs.spawn("echo", Echo)
    async with meshio.serve_dashboard(host=host) as server:
        wrong = ("1" if server.token[0] == "0" else "0") + server.token[1:]
        secret = ("/", "/api/state", "/api/stacks", "/events")
        targets = [*secret, *(f"{path}?token={server.token}" for path in secret),
                   f"/api/state?token={wrong}", "/metrics"]
        child = await asyncio.create_subprocess_exec(
            "/usr/bin/python3", "-c", OTHER_USER, host, str(server.port), *targets,
            user=65534, group=65534, stdout=asyncio.subprocess.PIPE, cwd="/")
        out, _ = await asyncio.wait_for(child.communicate(), GUARD)
        assert child.returncode == 0
        answers = json.loads(out)
        for path in secret:
            status, body = answers[path]
            assert status == "HTTP/1.1 401 Unauthorized", (path, answers[path])
            assert "another user's (uid 65534)" in body and "token" in body, body
            assert answers[f"{path}?token={server.token}"][0] == "HTTP/1.1 200 OK", path
        status, body = answers[f"/api/state?token={wrong}"]
        assert status == "HTTP/1.1 403 Forbidden" and "another user's" in body, body
        assert answers["/metrics"][0] == "HTTP/1.1 200 OK"  # (a Prometheus of its own user)
        assert "meshio_endpoint_calls" in answers["/metrics"][1]
        for path in (*secret, "/metrics"):  # this user needs no token
            request = f"GET {path} HTTP/1.1\r\nHost: localhost:{server.port}\r\n\r\n"
            assert await status_of(server.port, request.encode(), host) == "200 OK", path


@pytest.mark.parametrize("family,host", [(socket.AF_INET, "127.0.0.1"),
                                         (socket.AF_INET6, "::1"),
                                         (socket.AF_INET6, "::ffff:127.0.0.1")])
def test_tcp_peer_uid_is_the_owner_of_the_socket_while_it_is_open(
        family: socket.AddressFamily, host: str) -> None:
    v4 = "." in host  # (an IPv6 socket dials the IPv4 listener at ::ffff:127.0.0.1)
    with socket.create_server(("127.0.0.1" if v4 else host, 0),
                              family=socket.AF_INET if v4 else socket.AF_INET6) as listener:
        client = socket.socket(family)
        client.connect((host, listener.getsockname()[1]))
        accepted, peer = listener.accept()
        with accepted:
            ours = accepted.getsockname()[:2]
            assert tcp_peer_uid(peer[:2], ours) == os.getuid()
            assert tcp_peer_uid(ours, peer[:2]) == os.getuid()  # (and ours, the other way)
            client.close()  # closed: no process holds it
            assert tcp_peer_uid(peer[:2], ours) is None


async def test_proc_meshes_of_one_name_are_told_apart() -> None:
    host = meshio.this_host()
    async with host.spawn_procs(per_host={"procs": 1}) as one, \
            host.spawn_procs(per_host={"procs": 2}) as two:  # both named "procs"
        await one.spawn("echo", Echo)
        await two.spawn("other", Echo)
        async with meshio.serve_dashboard() as server:
            base = f"http://127.0.0.1:{server.port}"
            status, _, body = await aget(base + "/api/state")
            assert status == 200
            state = json.loads(body)
            first, second = state["proc_meshes"]
            assert (first["name"], second["name"]) == ("procs", "procs")
            assert [len(first["processes"]), len(second["processes"])] == [1, 2]
            assert state["meshes"] == {
                first["id"]: {"name": "procs", "supervisor": None, "strategy": None,
                              "extent": {"procs": 1}, "actor_meshes": ["echo"]},
                second["id"]: {"name": "procs", "supervisor": None, "strategy": None,
                               "extent": {"procs": 2}, "actor_meshes": ["other"]}}
            status, _, body = await aget(base + "/metrics")
            up = {(s.labels["mesh_id"], s.labels["proc"])
                  for f in text_string_to_metric_families(body.decode())
                  if f.name == "meshio_process_up" for s in f.samples}
            assert up == {(first["id"], "0"), (second["id"], "0"), (second["id"], "1")}


async def test_text_utf8_cannot_encode_is_replaced(
        procs: meshio.ProcMesh, monkeypatch: pytest.MonkeyPatch) -> None:
    await procs.spawn("echo", Echo)
    # a command line of bytes that were not UTF-8, as Python decodes them
    monkeypatch.setattr(sys, "argv", [sys.argv[0], "caf\udce9", "lone\ud800"])
    want = [sys.argv[0], "caf\\xe9", "lone\\ud800"]  # (the byte shown; the lone one escaped)
    async with meshio.serve_dashboard() as server:
        status, _, body = await aget(f"http://127.0.0.1:{server.port}/api/state")
        assert status == 200, body
        assert json.loads(body)["job"]["argv"] == want
        stream = events(server.port)
        try:
            async with asyncio.timeout(GUARD):
                kind, data = await anext(stream)
                assert (kind, data["job"]["argv"]) == ("state", want)
        finally:
            await stream.aclose()


async def test_closing_with_a_live_stream_open_is_quiet(
        procs: meshio.ProcMesh, caplog: pytest.LogCaptureFixture) -> None:
    await procs.spawn("echo", Echo)
    caplog.set_level(logging.ERROR)
    with loop_reports() as reported:
        async with meshio.serve_dashboard() as server:
            stream = events(server.port)  # a browser's tab, open
            try:
                async with asyncio.timeout(GUARD):
                    assert (await anext(stream))[0] == "state"
                    await server.aclose()
                    with pytest.raises(asyncio.IncompleteReadError):  # the stream ended
                        await anext(stream)
            finally:
                await stream.aclose()
    assert reported == [], reported
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text


async def test_bad_arguments_are_clear_errors() -> None:
    with pytest.raises(TypeError, match="serve_dashboard: port must be an int, got str"):
        meshio.serve_dashboard("80")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"serve_dashboard: port must be in 0\.\.65535"):
        meshio.serve_dashboard(70000)
    with pytest.raises(TypeError, match="serve_dashboard: host must be a str"):
        meshio.serve_dashboard(0, host=None)  # type: ignore[arg-type]


def test_serve_dashboard_needs_a_running_loop() -> None:
    with pytest.raises(RuntimeError, match="call it in async code"):
        meshio.serve_dashboard()


def test_meshio_dashboard_has_a_running_controller_serve_it(tmp_path: Path) -> None:
    env = {**os.environ, "XDG_RUNTIME_DIR": str(tmp_path)}
    assert "dashboard" in meshio_cli("--help", env=env).stdout
    none = meshio_cli("dashboard", env=env)
    assert none.returncode == 1 and none.stdout == ""
    assert "no running meshio controller of yours found" in none.stderr
    with running(env) as controller:
        asked = meshio_cli("dashboard", "--pid", str(controller.pid), env=env)
        assert asked.returncode == 0, asked.stderr
        url = asked.stdout.strip()
        assert url.startswith("http://127.0.0.1:") and "/?token=" in url
        status, _, page = get(url)
        assert status == 200 and b"meshio dashboard" in page
        state = json.loads(get(url.replace("/?", "/api/state?"))[2])
        assert state["job"]["pid"] == controller.pid
        [pm] = state["proc_meshes"]
        assert len(pm["processes"]) == 4 and state["meshes"][pm["id"]]["actor_meshes"] \
            == ["busy"]
        stacks = json.loads(get(url.replace("/?", "/api/stacks?"))[2])["text"]
        assert "busy ranks 0-1: in Busy.block at stacks_controller.py" in stacks
        again = meshio_cli("dashboard", env=env)  # the one controller: no --pid needed
        assert again.returncode == 0 and again.stdout.strip() == url  # the same one
        port = url.split(":")[2].split("/")[0]
        busy = meshio_cli("dashboard", "--host", "0.0.0.0", "--port", port, env=env)
        assert busy.returncode == 1 and "cannot serve the dashboard on 0.0.0.0" in busy.stderr
        bad = meshio_cli("dashboard", "--port", "70000", env=env)
        assert bad.returncode == 2 and bad.stderr.splitlines()[-1] == (
            "meshio dashboard: error: argument --port: must be an int in 0..65535, got '70000'")
    with pytest.raises(urllib.error.URLError):  # served until the controller ended
        get(url)
