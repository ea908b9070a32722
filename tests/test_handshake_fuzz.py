"""The connection handshake's state machine (``meshio._transport._handshake``)
fuzzed as the decoder it is: whatever bytes a peer sends, in whatever
pieces, each side either answers or refuses with ``AuthenticationError``
(nothing else is raised) and is never proven by a peer without the secret;
an honest exchange completes however the bytes are cut, handing over the
frames that follow; any byte changed in it fails it."""

from __future__ import annotations

import itertools

from hypothesis import given
from hypothesis import strategies as st

from fuzz import FUZZ
from meshio import AuthenticationError
from meshio._transport._handshake import (
    CHALLENGE_SIZE,
    HELLO_SIZE,
    MAGIC,
    PROOF_SIZE,
    Handshake,
)

SECRET = b"s" * 32
END = "tcp://127.0.0.1:4000"

#: a stream a hostile peer sends, in pieces: bytes that start like a
#: handshake often enough to reach past the magic
hostile = st.lists(st.one_of(st.binary(max_size=80),
                             st.binary(max_size=80).map(lambda b: MAGIC + b)), max_size=6)


def pieces(data: bytes, cuts: list[int]) -> list[bytes]:
    """``data`` cut at ``cuts`` (positions, any order, any range)."""
    at = sorted({c % (len(data) + 1) for c in cuts} | {0, len(data)})
    return [data[a:b] for a, b in itertools.pairwise(at)]


def feed_all(side: Handshake, chunks: list[bytes]) -> bytes:
    """Feed every chunk until ``side`` is done or refuses; what it sent."""
    sent = b""
    for chunk in chunks:
        if side.done:
            side.leftover += chunk
            continue
        sent += side.feed(chunk)
    return sent


@FUZZ
@given(dialler=st.booleans(), chunks=hostile)
def test_a_peer_without_the_secret_gets_an_answer_or_a_refusal_never_in(
        dialler: bool, chunks: list[bytes]) -> None:
    side = Handshake(SECRET, dialler=dialler, end=END)
    side.start()
    try:
        feed_all(side, chunks)
    except AuthenticationError:
        pass
    assert not side.done


@FUZZ
@given(frames=st.binary(max_size=64), cuts_hello=st.lists(st.integers(0, 200), max_size=4),
       cuts_proof=st.lists(st.integers(0, 200), max_size=4))
def test_an_honest_exchange_completes_however_it_is_cut(
        frames: bytes, cuts_hello: list[int], cuts_proof: list[int]) -> None:
    dialler = Handshake(SECRET, dialler=True, end=END)
    listener = Handshake(SECRET, dialler=False, end=END)
    hello = dialler.start()
    assert len(hello) == HELLO_SIZE and listener.start() == b""
    challenge = feed_all(listener, pieces(hello, cuts_hello))
    assert len(challenge) == CHALLENGE_SIZE and not listener.done
    proof = feed_all(dialler, pieces(challenge, cuts_hello))
    assert len(proof) == PROOF_SIZE and dialler.done and dialler.leftover == b""
    # the dialler's first frames may follow its proof at once
    assert feed_all(listener, pieces(proof + frames, cuts_proof)) == b""
    assert listener.done and listener.leftover == frames


@FUZZ
@given(where=st.integers(0, HELLO_SIZE + CHALLENGE_SIZE + PROOF_SIZE - 1),
       flip=st.integers(1, 255))
def test_any_byte_changed_in_the_exchange_fails_it(where: int, flip: int) -> None:
    dialler = Handshake(SECRET, dialler=True, end=END)
    listener = Handshake(SECRET, dialler=False, end=END)

    def changed(msg: bytes, first: int) -> bytes:
        i = where - first
        if not 0 <= i < len(msg):
            return msg
        return msg[:i] + bytes([msg[i] ^ flip]) + msg[i + 1:]

    try:
        challenge = listener.feed(changed(dialler.start(), 0))
        proof = dialler.feed(changed(challenge, HELLO_SIZE))
        listener.feed(changed(proof, HELLO_SIZE + CHALLENGE_SIZE))
    except AuthenticationError:
        pass
    assert not (dialler.done and listener.done)


@FUZZ
@given(extra=st.binary(min_size=1, max_size=64), cuts=st.lists(st.integers(0, 200), max_size=3))
def test_bytes_sent_before_the_challenge_are_refused(extra: bytes, cuts: list[int]) -> None:
    """A dialler cannot have its proof yet: anything after its HELLO that
    reaches the listener in the same piece as its end is refused."""
    hello = Handshake(SECRET, dialler=True, end=END).start()
    listener = Handshake(SECRET, dialler=False, end=END)
    chunks = pieces(hello + extra, cuts)
    if any(len(b"".join(chunks[:i])) < HELLO_SIZE < len(b"".join(chunks[:i + 1]))
           for i in range(len(chunks))):  # (a piece carries the HELLO's end and more)
        try:
            feed_all(listener, chunks)
        except AuthenticationError as e:
            assert "before the challenge" in str(e)
        else:
            raise AssertionError("bytes after the HELLO, in its piece, were taken")
