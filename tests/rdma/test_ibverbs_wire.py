"""The ``ibverbs`` backend's two decoders of what a peer sends, fuzzed: the
queue-pair information exchanged when two processes connect, and the
description of an ``RDMABuffer``'s registration in its handle.  Any bytes
give the decoded value or an ``RDMAError`` naming where they came from;
what is encoded decodes to itself.  Pure functions: no RDMA device needed,
only meshio built with the backend (``libibverbs-dev`` at install)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fuzz import FUZZ
from meshio.rdma import RDMAError

pytest.importorskip("meshio._ibverbs_ffi", reason="meshio built without the ibverbs backend")

from meshio.rdma import _ibverbs_device as ibd
from meshio.rdma import _ibverbs_qp as ibq

u8, u16, u32 = (st.integers(0, (1 << bits) - 1) for bits in (8, 16, 32))


@FUZZ
@given(data=st.one_of(st.binary(max_size=64), st.binary(min_size=29, max_size=29),
                      st.binary(max_size=28).map(lambda b: b"\x01" + b)))
def test_any_queue_pair_information_decodes_or_is_an_rdma_error(data: bytes) -> None:
    try:
        info = ibq._QpInfo.unpack(data, "connect from peer-x")
    except RDMAError as e:
        assert "connect from peer-x" in str(e)
    else:
        assert info.pack() == data


@FUZZ
@given(qpn=u32, psn=u32, gid=st.binary(min_size=16, max_size=16), lid=u16, mtu=u8,
       rd_atomic=u8)
def test_queue_pair_information_round_trips(qpn: int, psn: int, gid: bytes, lid: int,
                                            mtu: int, rd_atomic: int) -> None:
    info = ibq._QpInfo(qpn, psn, gid, lid, mtu, rd_atomic)
    assert ibq._QpInfo.unpack(info.pack(), "here") == info


@FUZZ
@given(why=st.text(max_size=40))
def test_a_refusal_from_the_peer_is_its_message(why: str) -> None:
    with pytest.raises(RDMAError) as refused:
        ibq._QpInfo.unpack(b"\0" + why.encode(), "connect from peer-x")
    assert str(refused.value) == f"connect from peer-x: {why}"


@FUZZ
@given(ib=st.one_of(st.none(), st.binary(max_size=64), st.binary(min_size=39, max_size=39),
                    st.binary(min_size=38, max_size=38).map(lambda b: b"\x01" + b)))
def test_any_registration_description_decodes_or_is_an_rdma_error(ib: bytes | None) -> None:
    try:
        remote = ibd.Remote.unpack(ib, "handle from rank 3")
    except RDMAError as e:
        assert "handle from rank 3" in str(e)
    else:
        assert ib is not None and ib[0] == 1 and len(ib) == 39
        assert (remote.addr, remote.size, remote.rkey) == (
            int.from_bytes(ib[1:9], "little"), int.from_bytes(ib[9:17], "little"),
            int.from_bytes(ib[17:21], "little"))
