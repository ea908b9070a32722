"""Whether a Cancel follows in the socket read being parsed
(:meth:`~meshio._transport._connection.Connection.cancel_follows`): a call
that finds its actor idle runs at once unless one does, else as the read
ends, so that the Cancel drops it first (``tests/test_cancel_same_read.py``).
A read of calls and no Cancel (many calls in flight) runs each at once,
without waiting for the read's end.  It may say yes for bytes that only look
like a Cancel (a call then waits for the read's end), never no for a Cancel
that follows.

No processes: the connection runs on the frame fuzzer's fake transport.
"""

from __future__ import annotations

from typing import Any

import msgspec
from hypothesis import given
from hypothesis import strategies as st

from fuzz import FUZZ
from meshio._transport import _messages as M
from meshio._transport._connection import Connection
from meshio._transport._frames import frame_header
from test_wire_fuzz import FakeRuntime, connect


class Recording(FakeRuntime):
    """Records, for each message a read delivers, whether a Cancel follows."""

    def __init__(self) -> None:
        super().__init__()
        self.follows: list[bool] = []

    def dispatch(self, conn: Connection, msg: M.Message, bufs: list[Any]) -> None:
        super().dispatch(conn, msg, bufs)
        self.follows.append(conn.cancel_follows())


def one_read(msgs: list[M.Message]) -> list[bool]:
    """Deliver ``msgs`` in one read: whether a Cancel followed each."""
    rt = Recording()
    conn, _ = connect(rt)
    data = b"".join(frame_header(len(body), []) + body
                    for body in map(M.encode_message, msgs))
    target = conn.get_buffer(-1)
    assert len(target) >= len(data)
    target[:len(data)] = data
    conn.buffer_updated(len(data))
    assert [m for m, _ in rt.got] == msgs
    return rt.follows


def call(req: int, args: bytes = b"\x80") -> M.Call:
    return M.Call(req, "bench", "ping", msgspec.Raw(args))


def test_calls_with_no_cancel_behind_them_run_at_once() -> None:
    assert one_read([call(1), call(2), M.Calls([call(3), call(4)]), call(5)]) == [False] * 4


def test_each_message_before_a_cancel_sees_it() -> None:
    assert one_read([call(1), M.Calls([call(2)]), M.Cancel(1, "bench"), call(3)]) == [
        True, True, False, False]
    assert one_read([call(1), M.Cancel(1, "bench", expired=True)]) == [True, False]


def test_a_cancel_in_a_later_read_is_not_in_this_one() -> None:
    rt = Recording()
    conn, _ = connect(rt)
    for msg in (call(1), M.Cancel(1, "bench")):
        body = M.encode_message(msg)
        data = frame_header(len(body), []) + body
        conn.get_buffer(-1)[:len(data)] = data
        conn.buffer_updated(len(data))
    assert rt.follows == [False, False]


messages = st.one_of(
    st.builds(call, st.integers(0, 2**64 - 1), st.binary(max_size=40).map(
        lambda b: msgspec.msgpack.encode(b))),
    st.builds(M.Cancel, st.integers(0, 2**64 - 1), st.text(max_size=300), st.booleans()),
    st.builds(M.Ping, st.integers(0, 2**64 - 1)),
)


@FUZZ
@given(st.lists(messages, max_size=12))
def test_a_cancel_that_follows_is_never_missed(msgs: list[M.Message]) -> None:
    follows = one_read(msgs)
    for i, msg in enumerate(msgs):
        if any(type(m) is M.Cancel for m in msgs[i + 1:]):
            assert follows[i], (i, msg)
