"""A remote exception whose message is huge (its argument 32 MiB of
``bytes``) reaches the caller as an error whose text a terminal or log can
take: each long line and the whole text cut in the middle, with a note of
how many characters were cut; the type, the start and end of the message
and the traceback's frames stay.  A small message is unchanged."""

from __future__ import annotations

import re

import pytest

import meshio
from meshio import Actor, ActorError, endpoint

MiB = 1 << 20
#: what the caller's error text may hold at most (a few tens of KiB)
CAP = 64 * 1024


class Raiser(Actor):
    @endpoint
    async def raise_big(self) -> None:
        raise ValueError(b"e" * (32 * MiB) + b"THE END")

    @endpoint
    async def raise_small(self) -> None:
        raise ValueError("small: 3 < 4")


@pytest.fixture
async def raiser(procs: meshio.ProcMesh) -> Raiser:
    return (await procs.spawn("raiser", Raiser)).slice(procs=0)


async def test_a_huge_remote_message_is_cut(raiser: Raiser) -> None:
    with pytest.raises(ActorError) as info:
        await raiser.raise_big.call_one()
    err = info.value
    assert isinstance(err, ValueError) and err.remote_type == "ValueError"
    text = str(err)
    assert len(text) < CAP and len(err.remote_message) < CAP and len(err.remote_traceback) < CAP
    assert text.startswith("ValueError: b'eeee")
    assert "in raiser rank 0, endpoint Raiser.raise_big" in text
    assert 'raise ValueError(b"e" * (32 * MiB) + b"THE END")' in text  # (its frame)
    assert err.remote_message.startswith("b'eeee") and err.remote_message.endswith("eeTHE END'")
    cut = [int(n) for n in re.findall(r"\[(\d+) characters cut\]", text)]
    assert cut and all(n > 32 * MiB - CAP for n in cut)


async def test_a_small_remote_message_is_unchanged(raiser: Raiser) -> None:
    with pytest.raises(ActorError) as info:
        await raiser.raise_small.call_one()
    err = info.value
    assert err.remote_message == "small: 3 < 4"
    assert err.remote_traceback.startswith("Traceback (most recent call last):\n")
    assert err.remote_traceback.endswith(
        '    raise ValueError("small: 3 < 4")\nValueError: small: 3 < 4\n')
    assert str(err) == ("ValueError: small: 3 < 4\n  in raiser rank 0, endpoint Raiser.raise_small"
                        "\n\nRemote traceback:\n" + err.remote_traceback)
