"""Control messages: frozen, tagged msgspec Structs in one union, one decoder.

Payload fields (arguments, results) are ``msgspec.Raw``: encoded once by the
sender with the endpoint's schema and decoded by the receiver with its own
typed decoder, so the control decoder never looks inside them.
"""

from __future__ import annotations

from typing import Union

import msgspec

__all__ = (
    "Call",
    "ErrorInfo",
    "Fail",
    "Fault",
    "Hello",
    "Message",
    "PortSend",
    "Reply",
    "Shutdown",
    "SpawnActor",
    "StopActor",
    "decode_message",
    "encode_message",
)


class _Msg(msgspec.Struct, frozen=True, array_like=True, tag=True, gc=False):
    pass


class Hello(_Msg, tag=1):
    """First message on every connection: who is speaking."""

    addr: str
    pid: int
    worker: str = ""


class Call(_Msg, tag=2):
    """Invoke ``method`` on the actor of mesh ``target`` hosted by the receiver.

    ``req`` 0 means no reply is wanted (broadcast).
    """

    req: int
    target: str
    method: str
    args: msgspec.Raw


class Reply(_Msg, tag=3):
    req: int
    value: msgspec.Raw


class ErrorInfo(msgspec.Struct, frozen=True, array_like=True, gc=False):
    """What went wrong remotely; the caller turns it into an exception."""

    kind: str  # "actor" | "schema" | "unknown_actor" | "unknown_endpoint" | "protocol"
    type_name: str
    message: str
    traceback: str = ""
    actor: str = ""
    rank: int = -1


class Fail(_Msg, tag=4):
    req: int
    error: ErrorInfo


class SpawnActor(_Msg, tag=5):
    """Create the actor of mesh ``target`` at ``rank`` of a mesh shaped
    ``labels``/``sizes``; ``mesh`` is the pickled full-mesh reference."""

    req: int
    target: str
    name: str
    cls: bytes
    rank: int
    labels: list[str]
    sizes: list[int]
    mesh: bytes
    args: msgspec.Raw


class StopActor(_Msg, tag=6):
    req: int
    target: str


class PortSend(_Msg, tag=7):
    """A value for the port ``port`` owned by the receiver; ``close`` ends it."""

    port: int
    value: msgspec.Raw
    close: bool = False


class Fault(_Msg, tag=8):
    """An actor failed with no caller to tell (broadcast, failing hook)."""

    error: ErrorInfo


class Shutdown(_Msg, tag=9):
    pass


Message = Union[Hello, Call, Reply, Fail, SpawnActor, StopActor, PortSend, Fault, Shutdown]

_decoder = msgspec.msgpack.Decoder(Message)
_encoder = msgspec.msgpack.Encoder()

decode_message = _decoder.decode
encode_message = _encoder.encode
