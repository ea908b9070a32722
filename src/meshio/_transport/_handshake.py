"""Proving that a peer belongs to this job, on this very connection, before
any frame is decoded.

Every connection starts with a mutual challenge-response over the job's
secret ``k`` (32 random bytes made by the controller), in three small
fixed-size messages, before the framed protocol (:mod:`._runtime`)::

    dialler  -> listener  HELLO      MAGIC | Nd                         (40 bytes)
    listener -> dialler   CHALLENGE  MAGIC | Nl | HMAC(k, L | Nd | Nl | A) (72 bytes)
    dialler  -> listener  PROOF      HMAC(k, D | Nd | Nl | A)              (32 bytes)

``Nd``/``Nl`` are fresh random 32-byte nonces of each side, so a recorded
handshake replays to nothing; ``L``/``D`` are the two roles' labels, so a
proof cannot be reflected back to the side that made it.  ``A`` is the
listening end of this connection, as each side's kernel reports it: the
address the dialler reached (its socket's peer name) and the one the
listener was reached at (the accepted socket's own name): the Unix name
(``@name`` for an abstract one) or ``tcp://IP:PORT``.  Both are the same on
a direct connection, so a process without the secret that relays a
handshake between a dialler and another listener (having bound the name of
a worker that died) gets nowhere: the listener's proof is for another
address than the one dialled, and the dialler's for another than the one
reached.  (A translated address, NAT or a port forward, fails the same way:
meshio needs a direct route between its processes.)  MACs are HMAC-SHA256,
compared in constant time.  The listener proves itself first: a dialler
never sends a frame to a process that does not hold the secret, and the
dialler's frames may follow its PROOF at once (one round trip in all).

Nothing else is accepted before the end: a wrong MAGIC, bytes beyond a
message, a bad MAC, or silence for ``HANDSHAKE_TIMEOUT`` seconds drop the
connection.  :class:`Handshake` is the byte-level state machine (no I/O, so
a TCP/TLS transport reuses it as is); :class:`HandshakeProtocol` runs it on
an asyncio transport and hands the transport over when both sides are
proven.  On Unix sockets the peer's uid (``SO_PEERCRED``) must be ours too,
and a dialler that knows the pid of the process it dials checks that too.
"""

from __future__ import annotations

import asyncio
import hmac
import ipaddress
import os
import secrets
import socket
import struct
from collections.abc import Callable
from typing import Any, Final, cast

from .._exceptions import AuthenticationError

__all__ = ("HANDSHAKE_TIMEOUT", "Handshake", "HandshakeProtocol", "listening_end", "new_secret",
           "peer_creds", "tcp_address")

#: protocol name and version; a peer speaking anything else is refused at once
MAGIC: Final = b"MESHIO\x00\x02"
NONCE: Final = 32
MAC: Final = 32
HELLO_SIZE: Final = len(MAGIC) + NONCE
CHALLENGE_SIZE: Final = len(MAGIC) + NONCE + MAC
PROOF_SIZE: Final = MAC
SECRET_SIZE: Final = 32
#: seconds a listener gives a new connection to complete the handshake
HANDSHAKE_TIMEOUT = 30.0

_LISTENER: Final = b"meshio-auth-v2 listener\x00"
_DIALLER: Final = b"meshio-auth-v2 dialler\x00"
_CREDS: Final = struct.Struct("3i")


def new_secret() -> bytes:
    """A fresh job secret."""
    return secrets.token_bytes(SECRET_SIZE)


def tcp_address(host: str, port: int) -> str:
    """The meshio address of a TCP endpoint."""
    return f"tcp://[{host}]:{port}" if ":" in host else f"tcp://{host}:{port}"


def listening_end(sock: Any, *, dialler: bool) -> str:
    """The listening end of the connected socket ``sock``, as the kernel
    reports it: the dialler's peer, the listener's own name; ``@name`` for
    an abstract Unix socket, ``tcp://IP:PORT`` (an IPv4-mapped IPv6 address
    as IPv4) for TCP."""
    name: Any = sock.getpeername() if dialler else sock.getsockname()
    if sock.family == socket.AF_UNIX:
        if isinstance(name, bytes):  # an abstract name
            name = name.decode(errors="surrogateescape")
        return "@" + name[1:] if name.startswith("\0") else str(name)
    ip = ipaddress.ip_address(name[0].partition("%")[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return tcp_address(str(ip), int(name[1]))


def _mac(secret: bytes, label: bytes, nd: bytes, nl: bytes, end: bytes) -> bytes:
    return hmac.digest(secret, label + MAGIC + nd + nl + end, "sha256")


class Handshake:
    """One side of the handshake as a state machine over bytes.

    ``end`` is the listening end of this connection (:func:`listening_end`):
    for a dialler the address it reached, for a listener the one it was
    reached at.  Send :meth:`start`'s bytes, then give every received chunk
    to :meth:`feed` and send what it returns; once :attr:`done`, the peer is
    proven and :attr:`leftover` holds the first bytes of the framed protocol.

    Raises:
        AuthenticationError: from :meth:`feed`, when the peer is not one of
            this job, or not at the other end of this connection (the
            connection must be dropped).
    """

    def __init__(self, secret: bytes, *, dialler: bool, end: str) -> None:
        if len(secret) < 16:
            raise ValueError("a job secret has at least 16 bytes")
        self._secret = secret
        self._dialler = dialler
        self._end = end
        self._nonce = secrets.token_bytes(NONCE)
        self._peer_nonce = b""
        self._buf = b""
        self._need = CHALLENGE_SIZE if dialler else HELLO_SIZE
        self.done = False
        self.leftover = b""

    @property
    def proved(self) -> bool:
        """A listener: it answered the dialler's hello with its challenge
        and proof, and waits for the dialler's proof."""
        return bool(self._peer_nonce) and not self.done

    def start(self) -> bytes:
        """The bytes to send when the connection opens."""
        return MAGIC + self._nonce if self._dialler else b""

    def feed(self, data: bytes) -> bytes:
        """Take received bytes; return the bytes to send in answer."""
        if self.done:
            raise AuthenticationError("handshake already complete")
        buf = self._buf + data
        head = buf[:len(MAGIC)]
        if not self._peer_nonce and head != MAGIC[:len(head)]:
            raise AuthenticationError(f"not a meshio handshake (starts with {head!r})")
        if len(buf) < self._need:
            self._buf = buf
            return b""
        msg, rest = buf[:self._need], buf[self._need:]
        self._buf = b""
        end = self._end.encode(errors="surrogateescape")
        if self._dialler:  # CHALLENGE: the listener proves itself first
            nl, mac = msg[len(MAGIC):len(MAGIC) + NONCE], msg[len(MAGIC) + NONCE:]
            if not hmac.compare_digest(mac, _mac(self._secret, _LISTENER, self._nonce, nl, end)):
                raise AuthenticationError(
                    f"the listener at {self._end} does not hold this job's secret, or relays "
                    "the handshake of another address")
            self.done, self.leftover = True, rest
            return _mac(self._secret, _DIALLER, self._nonce, nl, end)
        if rest and not self._peer_nonce:
            raise AuthenticationError(
                f"{len(rest)} bytes sent before the challenge (a proof cannot exist yet)")
        if not self._peer_nonce:  # HELLO
            self._peer_nonce = msg[len(MAGIC):]
            self._need = PROOF_SIZE
            return MAGIC + self._nonce + _mac(self._secret, _LISTENER, self._peer_nonce,
                                              self._nonce, end)
        if not hmac.compare_digest(msg, _mac(self._secret, _DIALLER, self._peer_nonce,
                                             self._nonce, end)):
            raise AuthenticationError(
                f"the dialler does not hold this job's secret, or dialled another address "
                f"than {self._end} (a relayed handshake)")
        self.done, self.leftover = True, rest
        return b""


def peer_creds(transport: asyncio.BaseTransport) -> tuple[int, int, int] | None:
    """``(pid, uid, gid)`` of a Unix socket's peer; None for other sockets."""
    sock = transport.get_extra_info("socket")
    if sock is None or sock.family != socket.AF_UNIX:
        return None
    pid, uid, gid = _CREDS.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                                  _CREDS.size))
    return pid, uid, gid


class HandshakeProtocol(asyncio.Protocol):
    """Runs a :class:`Handshake` on a new connection, then hands over.

    ``on_done(transport, leftover)`` is called once both sides are proven
    (it installs the real protocol and feeds it ``leftover``);
    ``on_fail(error)`` once if not, with the transport already aborted:
    :class:`AuthenticationError` (another user, another pid than ``pid``,
    wrong secret, a relay, not meshio), :class:`TimeoutError` (no answer
    within ``timeout`` seconds) or :class:`ConnectionError` (closed by the
    peer mid-handshake).  ``pid``: a dialler's knowledge of the pid of the
    process listening where it dials (a Unix socket's ``SO_PEERCRED`` must
    say the same).  ``on_made()``: called first as its transport is made,
    its :attr:`peername` known (a listener counts it then).
    """

    def __init__(self, secret: bytes, *, dialler: bool, timeout: float,
                 on_done: Callable[[asyncio.Transport, bytes], None],
                 on_fail: Callable[[Exception], None], pid: int | None = None,
                 on_made: Callable[[], None] | None = None) -> None:
        self._secret = secret
        self._dialler = dialler
        self._pid = pid
        self._hs: Handshake | None = None
        self._timeout = timeout
        self._on_done = on_done
        self._on_fail = on_fail
        self._on_made = on_made
        self._transport: asyncio.Transport | None = None
        self._timer: asyncio.TimerHandle | None = None
        self.finished = False
        #: the peer's (pid, uid, gid) on a Unix socket
        self.creds: tuple[int, int, int] | None = None
        #: the peer's address on a TCP socket
        self.peername: Any = None
        #: bytes that arrived before ``connection_made`` (a TLS stream
        #: delivers the first ones as its handshake completes)
        self._early: list[bytes] = []

    def describe(self) -> str:
        """The peer, for log lines and errors."""
        if self.creds is not None:
            pid, uid, _ = self.creds
            return f"pid {pid} (uid {uid})"
        peer: object = self.peername
        if isinstance(peer, tuple) and len(cast(tuple[object, ...], peer)) >= 2:
            host, port = cast(tuple[object, ...], peer)[:2]
            return f"{host} port {port}"
        return "unidentified peer"

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        stream = cast(asyncio.Transport, transport)
        if self.finished:  # failed before its transport was made (dropped unproven)
            stream.abort()
            return
        self._transport = stream
        self.peername = transport.get_extra_info("peername") or self.peername
        if self._on_made is not None:  # (its peer known: a listener admits it)
            self._on_made()
        self._timer = asyncio.get_running_loop().call_later(self._timeout, self._expired)
        self.creds = peer_creds(transport)
        if self.creds is not None and self.creds[1] != os.getuid():
            self.fail(AuthenticationError(f"peer runs as uid {self.creds[1]}, not as this "
                                          f"job's uid {os.getuid()}"))
            return
        try:
            end = listening_end(transport.get_extra_info("socket"), dialler=self._dialler)
        except OSError as e:  # reset before we looked
            self.fail(ConnectionResetError(f"connection closed during the handshake ({e})"))
            return
        if self.creds is not None and self._pid is not None and self.creds[0] != self._pid:
            self.fail(AuthenticationError(
                f"the process listening at {end} is pid {self.creds[0]}, not pid {self._pid} "
                "that this job started there"))
            return
        self._hs = Handshake(self._secret, dialler=self._dialler, end=end)
        self._transport.write(self._hs.start())
        early, self._early = self._early, []
        for data in early:
            self.data_received(data)

    def data_received(self, data: bytes) -> None:
        if self._transport is None:
            self._early.append(data)
            return
        if self.finished or self._hs is None:
            return
        try:
            out = self._hs.feed(data)
        except AuthenticationError as e:
            self.fail(e)
            return
        if out:
            self._transport.write(out)
        if self._hs.done:
            self._finish()
            self._on_done(self._transport, self._hs.leftover)

    def eof_received(self) -> bool | None:
        return None  # close; connection_lost reports it

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.finished:
            why = (": the dialler hung up on this process's proof of the job's secret, as "
                   "one with another secret does (it says so), or gave up then"
                   if self._hs is not None and self._hs.proved else
                   ": the peer died, or refused this connection and logged why")
            self.fail(ConnectionResetError(
                f"connection closed during the handshake{f' ({exc})' if exc else ''}{why}"))

    def _expired(self) -> None:
        self.fail(TimeoutError(f"no handshake within {self._timeout:g}s"))

    def _finish(self) -> None:
        self.finished = True
        if self._timer is not None:
            self._timer.cancel()

    def fail(self, error: Exception) -> None:
        """Drop the connection and report ``error`` (once)."""
        if self.finished:
            return
        self._finish()
        if self._transport is not None:
            self._transport.abort()
        self._on_fail(error)
