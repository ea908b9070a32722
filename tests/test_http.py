"""The small HTTP server under ``serve_metrics`` and ``serve_dashboard``
against what any client on the network may send: a request that is no
HTTP, a head over the size limit, a method other than GET, no request at
all.  Each gets a status that says what was wrong (400, 431, 405 with
``Allow``, 408) and nothing is logged as an unhandled error; the server
answers the next request, its lines ended in CRLF or a bare LF.  An
answer that fails (a bug of the server's own) is a 500, logged by
meshio.  Closed while it answers (a server-sent event stream held open),
it ends the answer quietly.  Its request-head parser, fuzzed:
any bytes give a request or a ``ValueError``, and well-formed heads parse
to what they say."""

from __future__ import annotations

import asyncio
import gc
import logging
import socket
import string
from urllib.parse import urlencode

import pytest
from hypothesis import given
from hypothesis import strategies as st

import meshio
from fuzz import FUZZ
from log_watch import loop_reports
from meshio import _http

GUARD = 30.0

#: what each request gets: its status and a phrase of the body
HOSTILE = [
    (b"garbage\r\n\r\n", "400 Bad Request", "'METHOD TARGET HTTP/VERSION'"),
    (b"\xff\xfe\x00\r\n\r\n", "400 Bad Request", "'METHOD TARGET HTTP/VERSION'"),
    (b"GET /metrics SPDY/3\r\n\r\n", "400 Bad Request", "'METHOD TARGET HTTP/VERSION'"),
    (b"GET /metrics HTTP/1.1\r\nno colon here\r\n\r\n", "400 Bad Request", "'NAME: VALUE'"),
    (b"GET http://[ HTTP/1.1\r\n\r\n", "400 Bad Request", "not an HTTP request"),
    # (as long as the server reads before it knows: no unread bytes, no reset)
    (b"A" * (_http.MAX_REQUEST + 4), "431 Request Header Fields Too Large",
     f"at most {_http.MAX_REQUEST} bytes"),
    (b"GET /metrics HTTP/1.1\r\nHost: x\r\n", "400 Bad Request", "ends before its blank line"),
    (b"POST /metrics HTTP/1.1\r\n\r\n", "405 Method Not Allowed", "GET only, not POST"),
]


async def exchange(port: int, request: bytes, *, send_eof: bool = True) -> bytes:
    """Send ``request`` and read the answer until the server closes."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(request)
        await writer.drain()
        if send_eof:
            writer.write_eof()
        return await asyncio.wait_for(reader.read(), GUARD)
    finally:
        writer.close()


def status_and_body(answer: bytes) -> tuple[str, str]:
    head, _, body = answer.partition(b"\r\n\r\n")
    return head.split(b"\r\n")[0].decode().removeprefix("HTTP/1.1 "), body.decode()


async def test_hostile_requests_get_a_status_saying_what_was_wrong(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(_http, "REQUEST_TIMEOUT", 0.3)
    caplog.set_level(logging.ERROR)
    async with meshio.serve_metrics(0) as server:
        for request, status, phrase in HOSTILE:
            got, body = status_and_body(await exchange(server.port, request))
            assert (got, phrase in body) == (status, True), (request[:40], got, body)
        # a client that connects and sends nothing (its connection held open)
        got, body = status_and_body(await exchange(server.port, b"", send_eof=False))
        assert got == "408 Request Timeout" and "0.3 s" in body, body
        # a method other than GET is told which is allowed
        answer = await exchange(server.port, b"PUT /metrics HTTP/1.1\r\n\r\n")
        assert b"\r\nAllow: GET\r\n" in answer.partition(b"\r\n\r\n")[0], answer
        # the server goes on answering, lines ended in CRLF or a bare LF (typed by hand)
        for request in (b"GET /metrics HTTP/1.1\r\n\r\n", b"GET /metrics HTTP/1.0\nHost: x\n\n"):
            got, body = status_and_body(await exchange(server.port, request))
            assert got == "200 OK" and "meshio_" in body, (request, got)
    gc.collect()  # (a task's exception nobody retrieved is logged when it is collected)
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text


async def test_idle_connections_hold_at_most_max_unread_and_crowd_out_only_their_own(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Connections that send nothing are held at most MAX_UNREAD at once:
    past it the oldest of the address holding the most is dropped, so a
    flood of idle connections from one address (every one taken before any
    token is asked) costs the controller a bounded number of descriptors
    and does not crowd out a client at another address.  Before, each was
    held its REQUEST_TIMEOUT: thousands took the controller to its
    descriptor limit."""
    monkeypatch.setattr(_http, "MAX_UNREAD", 8)
    flood = 20
    async with meshio.serve_metrics(0) as server:
        # one client at 127.0.0.1 first (the oldest of all), then a flood from 127.0.0.2
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        held = []
        try:
            for _ in range(flood):
                held.append(await asyncio.open_connection(
                    "127.0.0.1", server.port, local_addr=("127.0.0.2", 0)))
            # the flood's oldest are dropped (the server closes them: EOF)
            async with asyncio.timeout(GUARD):
                for r, _ in held[:flood - 7]:
                    assert await r.read() == b""
            writer.write(b"GET /metrics HTTP/1.1\r\n\r\n")
            got, body = status_and_body(await asyncio.wait_for(reader.read(), GUARD))
            assert got == "200 OK" and "meshio_" in body, got
        finally:
            writer.close()
            for _, w in held:
                w.close()


class Failing(_http.HTTPServer):
    """A server whose answer to ``/boom`` fails (a bug of its own)."""

    async def _respond(self, request: _http.Request, writer: asyncio.StreamWriter) -> None:
        if request.path == "/boom":
            raise RuntimeError("boom")
        writer.write(_http.response_head("200 OK", "text/plain", 3) + b"ok\n")


async def test_a_failing_answer_is_a_500_logged_by_meshio_and_the_server_serves_on(
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.ERROR)
    async with _http.start(Failing, 0, "127.0.0.1", "test") as server:
        got, body = status_and_body(await exchange(server.port, b"GET /boom HTTP/1.1\r\n\r\n"))
        assert (got, body) == ("500 Internal Server Error",
                               "500 Internal Server Error: RuntimeError: boom\n")
        got, body = status_and_body(await exchange(server.port, b"GET / HTTP/1.1\r\n\r\n"))
        assert (got, body) == ("200 OK", "ok\n")
    gc.collect()
    errors = [(r.name, r.getMessage()) for r in caplog.records if r.levelno >= logging.ERROR]
    assert errors == [("meshio", f"meshio: answering GET /boom on http://127.0.0.1:{server.port}"
                                 " failed")], errors


@FUZZ
@given(head=st.binary(max_size=512))
def test_any_bytes_parse_to_a_request_or_a_value_error(head: bytes) -> None:
    try:
        request = _http._parse(head)
    except ValueError:
        return
    assert isinstance(request, _http.Request)


_TOKEN = st.text(string.ascii_letters + string.digits + "-!#$&'*+.^_`|~", min_size=1,
                 max_size=12)
_WORD = st.text(string.ascii_letters + string.digits + "-._~", min_size=1, max_size=12)
_VALUE = st.text(string.ascii_letters + string.digits + " -._~=/:;,", max_size=30).map(
    str.strip)


@FUZZ
@given(method=_TOKEN, path=st.lists(_WORD, max_size=4).map(lambda ws: "/" + "/".join(ws)),
       query=st.dictionaries(_WORD, _WORD, max_size=3),
       headers=st.dictionaries(_TOKEN.map(str.lower), _VALUE, max_size=5),
       end=st.sampled_from(["\r\n", "\n"]))
def test_a_well_formed_head_parses_to_what_it_says(
        method: str, path: str, query: dict[str, str], headers: dict[str, str],
        end: str) -> None:
    target = path + ("?" + urlencode(query) if query else "")
    head = (f"{method} {target} HTTP/1.1{end}"
            + "".join(f"{name}: {value}{end}" for name, value in headers.items())
            + end).encode()
    assert _http._parse(head) == _http.Request(method, path, query, headers)


class Hanging(_http.HTTPServer):
    """A server whose answer to each request waits until it is cancelled
    (as a server-sent event stream does), having said it started."""

    def __init__(self, sock: socket.socket) -> None:
        super().__init__(sock)
        self.answering = asyncio.Event()

    async def _respond(self, request: _http.Request, writer: asyncio.StreamWriter) -> None:
        writer.write(_http.response_head("200 OK", "text/event-stream"))
        self.answering.set()
        await asyncio.Event().wait()


async def test_closing_while_a_request_is_answered_ends_it_quietly(
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.ERROR)
    with loop_reports() as reported:
        async with _http.start(Hanging, 0, "127.0.0.1", "test") as server:
            reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
            try:
                writer.write(b"GET /events HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
                async with asyncio.timeout(GUARD):
                    await server.answering.wait()
                    await server.aclose()
                    answer = await reader.read()  # (until the server closed the connection)
                    assert answer == _http.response_head("200 OK", "text/event-stream")
            finally:
                writer.close()
    assert reported == [], reported
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text
