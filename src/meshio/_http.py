"""The small HTTP/1.1 server under ``serve_metrics`` and ``serve_dashboard``.

An :class:`HTTPServer` listens on the controller's loop from its start
(asyncio streams: each request is one ``GET`` read by its head, answered,
and the connection closed; :data:`MAX_UNREAD` connections at most wait for
their head), answers each request in a task it owns, and
on :meth:`~HTTPServer.aclose` stops listening and cancels and awaits the
requests being answered (a server-sent event stream among them), quietly.
Subclasses say what each request gets (``_respond``); what they write is
UTF-8, so text that came from the OS or a user (``sys.argv``, a name)
goes through :func:`utf8` first.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from dataclasses import dataclass
from types import TracebackType
from typing import Self, TypeVar
from urllib.parse import parse_qs, urlsplit

from ._transport._sockets import Crowd
from ._transport._tasks import TaskOwner, awaited, within

__all__ = ("HTTPServer", "Request", "response_head", "start")

_S = TypeVar("_S", bound="HTTPServer")

log = logging.getLogger("meshio")

#: seconds a client has to send its request
REQUEST_TIMEOUT = 10.0
#: bytes of a request's head at most
MAX_REQUEST = 1 << 16
#: connections whose request's head is not read yet, at once: past it the
#: oldest of the address holding the most is dropped for the newest
#: (:class:`~._transport._sockets.Crowd`): idle connections by the thousand
#: hold at most this many descriptors of the controller
MAX_UNREAD = 256


@dataclass(frozen=True)
class Request:
    """One request: its ``method``, ``path`` (without the query), the
    query's parameters (the first value of each) and its headers (names
    lowercased)."""

    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]


def _parse(head: bytes) -> Request:
    """The request of ``head`` (up to its blank line).

    Raises:
        ValueError: it is no HTTP request.
    """
    first, *lines = (line.removesuffix("\r") for line in head.decode("latin-1").split("\n"))
    words = first.split()
    if len(words) != 3 or not words[2].startswith("HTTP/"):
        raise ValueError(f"request line {first[:60]!r} is not 'METHOD TARGET HTTP/VERSION'")
    method, target, _version = words
    headers: dict[str, str] = {}
    for line in lines:
        if line:
            name, colon, value = line.partition(":")
            if not colon or not name.strip():
                raise ValueError(f"header line {line[:60]!r} is not 'NAME: VALUE'")
            headers[name.strip().lower()] = value.strip()
    url = urlsplit(target)  # (ValueError: a malformed host, as "http://[")
    return Request(method, url.path, {k: v[0] for k, v in parse_qs(url.query).items()},
                   headers)


def response_head(status: str, content_type: str, length: int | None = None,
                  extra: str = "") -> bytes:
    """The status line and headers of a response (``length`` None: the body
    runs until the connection closes, as a server-sent event stream's)."""
    size = "" if length is None else f"Content-Length: {length}\r\n"
    return (f"HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\n{size}"
            f"Cache-Control: no-store\r\n{extra}Connection: close\r\n\r\n").encode()


def _refuse(writer: asyncio.StreamWriter, status: str, why: str, extra: str = "") -> None:
    """Answer a request that gets nothing else with ``status`` and why
    (plain text, at most 200 characters of ``why``; ``extra`` headers)."""
    body = f"{status}: {why[:200]}\n".encode()
    writer.write(response_head(status, "text/plain; charset=utf-8", len(body),
                               f"X-Content-Type-Options: nosniff\r\n{extra}") + body)


async def _read_head(reader: asyncio.StreamReader) -> bytes:
    """A request's head, up to its blank line (lines may end in a bare LF,
    as a hand-typed request's do).

    Raises:
        asyncio.LimitOverrunError: it is over :data:`MAX_REQUEST` bytes.
        asyncio.IncompleteReadError: the client stopped sending before its end.
    """
    head = bytearray()
    while True:
        line = await reader.readuntil(b"\n")
        head += line
        if len(head) > MAX_REQUEST:
            raise asyncio.LimitOverrunError("the request's head is too long", len(head))
        if line in (b"\n", b"\r\n"):
            return bytes(head)


def start(cls: type[_S], port: int, host: str, who: str) -> _S:
    """A ``cls`` server listening on ``host``:``port``, for ``who`` (the
    public function, named in errors), on the running loop.

    Raises:
        TypeError: ``port`` is not an int or ``host`` not a str.
        ValueError: ``port`` is not in 0..65535.
        OSError: the address cannot be listened on (in use, not this host's).
        RuntimeError: no event loop is running here.
    """
    if isinstance(port, bool) or not isinstance(port, int):
        raise TypeError(f"{who}: port must be an int, got {type(port).__name__} {port!r}")
    if not 0 <= port <= 65535:
        raise ValueError(f"{who}: port must be in 0..65535, got {port}")
    if not isinstance(host, str):
        raise TypeError(f"{who}: host must be a str, got {type(host).__name__} {host!r}")
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        raise RuntimeError(f"{who}() serves from the controller's event loop: call it in async "
                           "code (inside meshio.run)") from None
    sock = socket.create_server((host, port), family=socket.AF_INET6 if ":" in host
                                else socket.AF_INET)
    try:
        return cls(sock)
    except BaseException:
        sock.close()
        raise


class HTTPServer:
    """Listens on ``sock`` from its start; :meth:`_respond` answers each
    request.  Stop it with :meth:`aclose`, or use it as ``async with``.

    Attributes:
        host: the address it listens on.
        port: the port it listens on (the one picked, if asked for 0).
    """

    def __init__(self, sock: socket.socket) -> None:
        self.host: str = sock.getsockname()[0]
        self.port: int = sock.getsockname()[1]
        self._sock = sock
        self._closed = False
        #: asyncio's task of each connection, waiting for the request's task
        self._answering: set[asyncio.Task[None]] = set()
        #: each request's task (cancelled by aclose)
        self._requests = TaskOwner(f"the requests to {self._base()}")
        #: the connections whose request's head is not read yet
        self._unread: Crowd[asyncio.StreamWriter] = Crowd(MAX_UNREAD)
        self._starting: asyncio.Future[asyncio.Server] = awaited(
            asyncio.start_server(self._answer, sock=sock, limit=MAX_REQUEST))

    def _base(self) -> str:
        """``http://HOST:PORT``."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    async def aclose(self) -> None:
        """Stop listening and end the requests being answered.  Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._starting.cancel()
        self._requests.cancel()  # (before wait_closed: from 3.12 it waits for them)
        try:
            server = await self._starting
        except asyncio.CancelledError:
            if not self._starting.cancelled():  # (we are cancelled ourselves)
                raise
            self._sock.close()  # closed before the server took it
        else:
            server.close()
            await server.wait_closed()
        await self._requests.aclose()
        if self._answering:  # (so asyncio has seen them end when we return)
            await asyncio.wait(self._answering)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None:
        await self.aclose()

    async def _respond(self, request: Request, writer: asyncio.StreamWriter) -> None:
        """Write the response to ``request`` (the connection is closed after)."""
        raise NotImplementedError

    async def _answer_get(self, request: Request, writer: asyncio.StreamWriter) -> None:
        """:meth:`_respond`; a failure of its own (a bug) is logged and
        answered with 500, and the server serves on."""
        try:
            await self._respond(request, writer)
        except OSError:
            raise  # (the client went away)
        except Exception as e:
            log.exception("meshio: answering GET %s on %s failed", request.path, self._base())
            _refuse(writer, "500 Internal Server Error", f"{type(e).__name__}: {e}")

    async def _answer(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """asyncio's callback for a connection: answers it in a task of the
        server's own (:meth:`_serve`), the one :meth:`aclose` cancels (a
        callback's task that ends cancelled is reported by asyncio as an
        error on Python 3.11, a traceback on stderr)."""
        if self._closed:  # (accepted as the server closed)
            writer.transport.abort()
            return
        connection = asyncio.current_task()
        assert connection is not None
        self._answering.add(connection)
        self._unread.admit(writer, writer.get_extra_info("peername"), writer.transport.abort)
        try:
            request = self._requests.start(self._serve(reader, writer))
            try:
                await asyncio.wait([request])
            except asyncio.CancelledError:  # (we are cancelled ourselves)
                request.cancel()
                raise
            if not request.cancelled():
                request.result()  # (it catches all it expects: anything else is a bug)
        finally:
            self._answering.discard(connection)
            self._unread.leave(writer)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Read the request of a connection, answer it and close the connection."""
        try:
            try:
                try:
                    head = await within(_read_head(reader), REQUEST_TIMEOUT)
                finally:
                    self._unread.leave(writer)
                request = _parse(head)
            except asyncio.LimitOverrunError:
                _refuse(writer, "431 Request Header Fields Too Large",
                        f"a request's head is at most {MAX_REQUEST} bytes")
            except TimeoutError:
                _refuse(writer, "408 Request Timeout",
                        f"no request's head within {REQUEST_TIMEOUT:g} s")
            except asyncio.IncompleteReadError:
                _refuse(writer, "400 Bad Request", "the request's head ends before its blank line")
            except ValueError as e:
                _refuse(writer, "400 Bad Request", f"not an HTTP request ({e})")
            else:
                if request.method != "GET":
                    _refuse(writer, "405 Method Not Allowed", f"GET only, not {request.method}",
                            "Allow: GET\r\n")
                else:
                    await self._answer_get(request, writer)
            await writer.drain()
        except OSError:
            pass  # a client that went away: nothing to answer
        finally:
            if self._closed:  # (cut short: what it did not read yet is not waited for)
                writer.transport.abort()
            else:
                writer.close()
