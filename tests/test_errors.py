"""Errors are values you can read: remote exceptions, schema errors, bad
constructors, unknown endpoints."""

from __future__ import annotations

import asyncio
import itertools
import os
import pickle
import sys
from typing import Any, Generic, TypeVar, cast

import msgspec
import pytest

import meshio
from meshio import (
    Actor,
    ActorError,
    MeshioError,
    SchemaError,
    UnknownEndpointError,
    current_rank,
    endpoint,
)
from meshio._exceptions import new_actor_error
from meshio._transport._messages import ErrorInfo, Fail, decode_message

#: these tests hold on both transports: worker processes and in-process
pytestmark = pytest.mark.meshio_transports()

class Item(msgspec.Struct):
    name: str
    qty: int


class CustomError(Exception):
    pass


class NeedsArgs(Exception):
    """Its constructor takes two arguments, its ``__str__`` reads them."""

    def __init__(self, a: int, b: int) -> None:
        super().__init__(a, b)
        self.a, self.b = a, b

    def __str__(self) -> str:
        return f"needs {self.a} and {self.b}"


class Sealed(Exception):
    """A class that refuses subclasses."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        raise TypeError("Sealed cannot be subclassed")


def deep_helper_that_raises(msg: str) -> None:
    raise ValueError(msg)


def frame_files(tb: str) -> list[str]:
    """The files of a formatted traceback's frames, in order (those of the
    remote tracebacks in its message too)."""
    return [line.split('"')[1] for line in tb.splitlines() if line.startswith('  File "')]


MESHIO_DIR = os.path.join(os.path.dirname(os.path.abspath(meshio.__file__)), "")


class Faulty(Actor):
    def __init__(self, lr: float = 0.1, fail_ranks: list[int] | None = None) -> None:
        if current_rank().rank in (fail_ranks or []):
            raise RuntimeError(f"cannot start rank {current_rank().rank}")
        self.lr = lr

    @endpoint
    async def boom(self, msg: str) -> None:
        deep_helper_that_raises(msg)

    @endpoint
    def sync_boom(self) -> int:
        raise CustomError("custom failure")

    @endpoint
    def bad_extent(self) -> None:
        meshio.Extent(["gpus"], [-1])  # (raises inside meshio)

    @endpoint
    async def fail_on(self, ranks: list[int]) -> int:
        r = current_rank().rank
        if r in ranks:
            raise KeyError(f"rank {r} has no key")
        return r

    @endpoint
    async def train(self, step: int) -> float:
        return step * self.lr

    @endpoint
    async def total(self, items: list[int]) -> int:
        return sum(items)

    @endpoint
    async def order(self, items: list[Item]) -> int:
        return sum(i.qty for i in items)

    @endpoint
    async def config(self, cfg: dict[str, int], flag: bool = False) -> int:
        return len(cfg) + flag

    @endpoint
    async def lies(self) -> int:
        return "not an int"  # type: ignore[return-value]

    @endpoint
    async def lies_nested(self) -> list[int]:
        return [1, 2, "three"]  # type: ignore[list-item]

    @endpoint
    async def unencodable(self) -> int:
        return object()  # type: ignore[return-value]

    @endpoint
    async def pickled_where_int(self) -> list[int]:
        return [1, 2 + 3j]  # type: ignore[list-item]

    @endpoint
    async def ok(self) -> str:
        return "ok"

    @endpoint
    async def bad_batch(self) -> None:
        import worker_only_errors  # (here only: the test process must not have it)

        raise worker_only_errors.BadBatch("batch 3 is empty")

    @endpoint
    def raise_(self, kind: str) -> None:  # (plain def: an async one cannot raise StopIteration)
        errors: dict[str, BaseException] = {
            "needs_args": NeedsArgs(1, 2), "key": KeyError("k"), "sealed": Sealed("sealed"),
            "supervision": meshio.SupervisionError("nested call's process died"),
            "timeout": meshio.CallTimeout("nested call timed out"),
            "stop": StopIteration("stop"), "os": FileNotFoundError(2, "no such file", "/x")}
        raise errors[kind]


@pytest.fixture
async def faulty(procs: meshio.ProcMesh) -> Faulty:
    return await procs.spawn("faulty", Faulty)


# ------------------------------------------------------ remote exceptions


async def test_remote_exception_is_an_actor_error(faulty: Faulty) -> None:
    with pytest.raises(ActorError) as info:
        await faulty.slice(procs=1).boom.call_one(msg="kaboom")
    err = info.value
    assert isinstance(err, MeshioError)
    assert err.remote_type == "ValueError"
    assert err.remote_message == "kaboom"
    assert err.actor == "faulty"
    assert err.rank == 1
    assert "boom" in err.endpoint
    assert "deep_helper_that_raises" in err.remote_traceback
    assert "raise ValueError(msg)" in err.remote_traceback
    # from the user's frame: not meshio's that called it
    assert frame_files(err.remote_traceback) == [__file__, __file__]
    assert "    deep_helper_that_raises(msg)\n" in err.remote_traceback
    msg = str(err)
    assert "ValueError: kaboom" in msg and "faulty" in msg and "rank 1" in msg
    assert "deep_helper_that_raises" in msg  # the traceback is part of the message
    assert err.failures == ()


async def test_remote_custom_exception_and_plain_def(faulty: Faulty) -> None:
    with pytest.raises(ActorError) as info:
        await faulty.slice(procs=0).sync_boom.call_one()
    err = info.value
    assert err.remote_type.endswith("CustomError")
    assert err.remote_message == "custom failure"
    assert err.rank == 0
    assert "sync_boom" in err.remote_traceback
    # not the actor thread's frames that ran it
    assert frame_files(err.remote_traceback) == [__file__]
    assert '    raise CustomError("custom failure")\n' in err.remote_traceback


async def test_remote_traceback_keeps_meshio_frames_the_user_s_code_called(
        faulty: Faulty) -> None:
    """Only the leading frames, which called the user's code, are left out:
    those of a call back into meshio that failed there stay."""
    with pytest.raises(ValueError, match="size of 'gpus'") as info:
        await faulty.slice(procs=0).bad_extent.call_one()
    assert isinstance(info.value, ActorError)
    files = frame_files(info.value.remote_traceback)
    assert files[0] == __file__ and files[1:] and all(f.startswith(MESHIO_DIR) for f in files[1:])


async def test_remote_value_error_is_a_value_error(faulty: Faulty) -> None:
    """issue 15 item 12: ``except ValueError`` catches a ValueError raised by
    the endpoint; the error is still the ActorError with the remote
    traceback, and pickles as such."""
    try:
        await faulty.slice(procs=1).boom.call_one(msg="kaboom")
    except ValueError as e:
        err: BaseException = e
    assert isinstance(err, ActorError) and isinstance(err, ValueError)
    assert err.remote_type == "ValueError" and err.remote_message == "kaboom"
    assert "raise ValueError(msg)" in err.remote_traceback
    assert str(err).startswith("ValueError: kaboom\n  in faulty rank 1")
    assert repr(err).startswith("ActorError('ValueError: kaboom")
    copy = pickle.loads(pickle.dumps(err))
    assert type(copy) is type(err) and copy.args == err.args and copy.__dict__ == err.__dict__


async def test_remote_custom_exceptions_keep_their_class(faulty: Faulty) -> None:
    """issue 15 item 12: a custom class of an imported module (a plain ``def``
    endpoint's too), one whose ``__init__`` needs arguments and whose
    ``__str__`` reads them (neither runs at the caller), a builtin with a
    constructor of its own (OSError), and on several ranks the combined error.
    A class that refuses subclasses and meshio's own errors (a
    SupervisionError or CallTimeout raised in the endpoint is not this call's
    process dying or timing out) arrive as a plain ActorError naming them."""
    one = faulty.slice(procs=0)
    with pytest.raises(CustomError) as custom:
        await one.sync_boom.call_one()
    assert isinstance(custom.value, ActorError)
    assert custom.value.remote_message == "custom failure"
    with pytest.raises(NeedsArgs) as needs:
        await one.raise_.call_one(kind="needs_args")
    assert isinstance(needs.value, ActorError)
    assert needs.value.remote_message == "needs 1 and 2"
    assert str(needs.value).startswith(f"{__name__}.NeedsArgs: needs 1 and 2")
    assert type(pickle.loads(pickle.dumps(needs.value))) is type(needs.value)
    with pytest.raises(FileNotFoundError) as missing:
        await one.raise_.call_one(kind="os")
    assert missing.value.remote_message == "[Errno 2] no such file: '/x'"  # type: ignore[attr-defined]
    with pytest.raises(KeyError) as both:
        await faulty.raise_.call(kind="key")
    assert isinstance(both.value, ActorError) and len(both.value.failures) == 2
    assert all(isinstance(e, KeyError) for _, e in both.value.failures)
    for kind, name in [("sealed", f"{__name__}.Sealed"),
                       ("supervision", "meshio.SupervisionError"),
                       ("timeout", "meshio.CallTimeout")]:
        with pytest.raises(ActorError) as plain:
            await one.raise_.call_one(kind=kind)
        assert type(plain.value) is ActorError and plain.value.remote_type == name


class Relay(Actor):
    @endpoint
    async def bad_batch_of(self, faulty: Faulty) -> None:
        await faulty.bad_batch.call_one()


@pytest.mark.meshio_transports("processes")  # (in-process, the test's process imports the class)
async def test_a_remote_class_not_loaded_here_is_its_nearest_loaded_base(
        procs: meshio.ProcMesh) -> None:
    """issue 15 item 12: an endpoint raising ``BadBatch(BatchError(ValueError))``
    of a module the caller never imported is caught by ``except ValueError``
    (the nearest base class loaded here), also through an actor that has not
    imported it either and lets it pass; ``remote_type`` still names BadBatch.
    (It was a plain ActorError: only loaded classes counted.)"""
    assert "worker_only_errors" not in sys.modules
    faulty = await procs.spawn("faulty", Faulty)
    with pytest.raises(ValueError) as direct:
        await faulty.slice(procs=1).bad_batch.call_one()
    relay = (await procs.spawn("relay", Relay)).slice(procs=0)
    with pytest.raises(ValueError) as through:
        await relay.bad_batch_of.call_one(faulty.slice(procs=1))
    for e in (direct.value, through.value):
        assert isinstance(e, ActorError)
        assert (e.remote_type, e.remote_bases, e.remote_message) == (
            "worker_only_errors.BadBatch", ("worker_only_errors.BatchError", "ValueError"),
            "batch 3 is empty")
        assert type(pickle.loads(pickle.dumps(e))) is type(e)
    assert "worker_only_errors" not in sys.modules


def test_the_first_loaded_class_of_the_remote_mro_decides() -> None:
    """The nearest loaded class of the remote exception's MRO is the one the
    error is also an instance of; where that is one of meshio's (or another
    of the classes never stood for), the error stays a plain ActorError
    rather than an instance of a farther base."""
    def made(remote_type: str, *bases: str) -> ActorError:
        return new_actor_error("m", remote_type=remote_type, remote_bases=bases,
                               remote_message="m", remote_traceback="", actor="a", rank=0,
                               endpoint="e")

    assert isinstance(made("gone.Missing", "gone.Base", "KeyError", "LookupError"), KeyError)
    assert isinstance(made("gone.Missing", f"{__name__}.CustomError"), CustomError)
    assert type(made("gone.Missing", "gone.Base")) is ActorError
    for bases in [("meshio.DeadlockError", "meshio.MeshioError", "RuntimeError"),
                  ("SyntaxError",), ("StopIteration",)]:
        assert type(made("gone.Missing", *bases)) is ActorError
    # (a class loaded here that cannot be subclassed gives way to its base)
    assert isinstance(made(f"{__name__}.Sealed", "RuntimeError"), RuntimeError)


def test_an_older_peers_failure_decodes_without_bases() -> None:
    """``ErrorInfo.bases`` is new: a Fail from a peer without it decodes."""
    old = msgspec.msgpack.encode([4, 7, ["actor", "ValueError", "m", "tb", "a", 0]])
    decoded = decode_message(old)
    assert decoded == Fail(7, ErrorInfo("actor", "ValueError", "m", "tb", "a", 0))
    assert isinstance(decoded, Fail) and decoded.error.bases == ()


async def test_stop_iteration_from_a_def_endpoint(faulty: Faulty) -> None:
    """A plain ``def`` endpoint raising StopIteration (which a future cannot
    hold) fails its call as an ``async def`` one does, with a RuntimeError
    caused by it, instead of leaving the call and the actor's mailbox hung."""
    one = faulty.slice(procs=0)
    with pytest.raises(RuntimeError) as info:
        await asyncio.wait_for(one.raise_.call_one(kind="stop"), 30)
    assert isinstance(info.value, ActorError) and not isinstance(info.value, StopIteration)
    assert info.value.remote_message == "Faulty.raise_ raised StopIteration"
    assert "StopIteration: stop" in info.value.remote_traceback
    assert await one.ok.call_one() == "ok"


async def test_actor_keeps_serving_after_an_exception(faulty: Faulty) -> None:
    with pytest.raises(ActorError):
        await faulty.boom.call(msg="x")
    assert (await faulty.ok.call()).values() == ["ok", "ok"]


async def test_one_failing_rank_raises_its_own_error(faulty: Faulty) -> None:
    with pytest.raises(ActorError) as info:
        await faulty.fail_on.call(ranks=[1])
    err = info.value
    assert err.rank == 1 and err.remote_type == "KeyError"
    assert "rank 1 has no key" in err.remote_message


async def test_every_failing_rank_is_listed(meshio_host: meshio.HostMesh) -> None:
    async with meshio_host.spawn_procs(per_host={"procs": 3}) as pm:
        f = await pm.spawn("faulty", Faulty)
        with pytest.raises(ActorError) as info:
            await f.fail_on.call(ranks=[0, 2])
        err = info.value
        assert [p.rank for p, _ in err.failures] == [0, 2]
        errors = [e for _, e in err.failures]
        assert all(isinstance(e, ActorError) for e in errors)
        assert [e.rank for e in errors if isinstance(e, ActorError)] == [0, 2]
        assert all(e.remote_type == "KeyError" for e in errors if isinstance(e, ActorError))
        msg = str(err)
        assert "failed on 2 of 3 ranks" in msg
        assert "rank 0 {'procs': 0}" in msg and "rank 2 {'procs': 2}" in msg
        assert "rank 1 {" not in msg
        # rank 1 was fine and still is
        assert await f.slice(procs=1).fail_on.call_one(ranks=[0, 2]) == 1
        # stream raises the failing ranks' errors in turn
        seen = []
        with pytest.raises(ActorError):
            async for _, v in f.fail_on.stream(ranks=[0, 2]):
                seen.append(v)
        assert len(seen) <= 1


# ---------------------------------------------------------- schema errors


async def test_wrong_argument_type_is_a_schema_error(faulty: Faulty) -> None:
    with pytest.raises(SchemaError) as info:
        await faulty.train.call(step="x")  # type: ignore[arg-type]
    err = info.value
    assert isinstance(err, ValueError) and isinstance(err, MeshioError)
    msg = str(err)
    assert "$.step" in msg and "int" in msg and "train" in msg
    # the actors keep serving
    assert (await faulty.train.call(step=2)).values() == [pytest.approx(0.2)] * 2


async def test_nested_schema_error_paths(faulty: Faulty) -> None:
    one = faulty.slice(procs=0)
    with pytest.raises(SchemaError, match=r"\$\.items\[1\]"):
        await one.total.call_one(items=[1, "two", 3])  # type: ignore[list-item]
    with pytest.raises(SchemaError, match=r"\$\.items\[1\]\.qty"):
        await one.order.call_one(items=[Item("a", 1), {"name": "b", "qty": "x"}])  # type: ignore[list-item]
    with pytest.raises(SchemaError, match=r"\$\.cfg"):
        await one.config.call_one(cfg={"a": "b"})  # type: ignore[dict-item]
    with pytest.raises(SchemaError, match=r"\$\.flag"):
        await one.config.call_one(cfg={}, flag="yes")  # type: ignore[arg-type]
    assert await one.total.call_one(items=[1, 2, 3]) == 6
    assert await one.order.call_one(items=[Item("a", 1), Item("b", 4)]) == 5
    assert await one.config.call_one(cfg={"a": 1}, flag=True) == 2


async def test_schema_error_on_every_rank_lists_them(faulty: Faulty) -> None:
    with pytest.raises(SchemaError) as info:
        await faulty.total.call(items=["x"])  # type: ignore[list-item]
    err = info.value
    assert [p.rank for p, _ in err.failures] == [0, 1]
    assert "$.items[0]" in str(err)


async def test_binding_errors_are_raised_at_the_caller(faulty: Faulty) -> None:
    ep = faulty.train
    with pytest.raises(SchemaError, match=r"unexpected keyword argument\(s\) \['stpe'\]"):
        ep.call(stpe=1)  # type: ignore[call-arg]
    with pytest.raises(SchemaError, match=r"takes 1 positional argument\(s\) but 2 were given"):
        ep.call(1, 2)  # type: ignore[call-arg]
    with pytest.raises(SchemaError, match=r"missing required argument\(s\) \['step'\]"):
        ep.call()  # type: ignore[call-arg]
    with pytest.raises(SchemaError, match="multiple values for argument 'step'"):
        ep.call(1, step=2)  # type: ignore[misc]
    one = faulty.slice(procs=0)
    with pytest.raises(SchemaError, match="stpe"):
        one.train.call_one(stpe=1)  # type: ignore[call-arg]
    with pytest.raises(SchemaError, match="stpe"):
        faulty.train.choose(stpe=1)  # type: ignore[call-arg]
    with pytest.raises(SchemaError, match="stpe"):
        faulty.train.broadcast(stpe=1)  # type: ignore[call-arg]
    with pytest.raises(SchemaError, match="stpe"):
        async for _ in faulty.train.stream(stpe=1):  # type: ignore[call-arg]
            pass
    assert (await faulty.train.call(step=10)).values() == [pytest.approx(1.0)] * 2


async def test_result_not_matching_its_annotation(faulty: Faulty) -> None:
    one = faulty.slice(procs=1)
    with pytest.raises(SchemaError) as info:
        await one.lies.call_one()
    msg = str(info.value)
    assert "lies" in msg and "result" in msg and "int" in msg
    with pytest.raises(SchemaError, match=r"\$\[2\]"):
        await one.lies_nested.call_one()
    with pytest.raises(SchemaError, match="unencodable"):
        await one.unencodable.call_one()
    assert await one.ok.call_one() == "ok"


async def test_a_pickled_result_names_the_type_that_arrived(faulty: Faulty) -> None:
    """A result that travels pickled where its annotation wants none said
    only "Expected `int`, got `ext`"."""
    one = faulty.slice(procs=0)
    with pytest.raises(SchemaError, match=r"result of Faulty\.unencodable does not match its "
                                          r"annotation: Expected `int`, got `object`"):
        await one.unencodable.call_one()
    with pytest.raises(SchemaError, match=r"Expected `int`, got `complex` - at `\$\[1\]`"):
        await one.pickled_where_int.call_one()


# ------------------------------------------------------------ constructors


async def test_wrong_constructor_argument_types(procs: meshio.ProcMesh) -> None:
    with pytest.raises(SchemaError) as info:
        await procs.spawn("faulty", Faulty, lr="fast")  # type: ignore[arg-type]
    assert "$.lr" in str(info.value) and "__init__" in str(info.value)
    with pytest.raises(SchemaError, match=r"\$\.fail_ranks\[0\]"):
        await procs.spawn("faulty2", Faulty, fail_ranks=["zero"])  # type: ignore[list-item]
    with pytest.raises(SchemaError, match="unexpected keyword"):
        await procs.spawn("faulty3", Faulty, learning_rate=0.1)  # type: ignore[call-arg]
    with pytest.raises(SchemaError, match="positional"):
        await procs.spawn("faulty4", Faulty, 0.1, [], 3)  # type: ignore[call-arg]
    # the same name can be used again once the arguments are right
    f = await procs.spawn("faulty", Faulty, lr=0.5)
    assert (await f.train.call(step=2)).values() == [1.0, 1.0]


async def test_constructor_that_raises(procs: meshio.ProcMesh) -> None:
    with pytest.raises(ActorError) as info:
        await procs.spawn("faulty", Faulty, fail_ranks=[1])
    err = info.value
    assert "__init__" in err.endpoint
    assert err.rank == 1 and err.actor == "faulty"
    assert err.remote_type == "RuntimeError"
    assert err.remote_message == "cannot start rank 1"
    assert "__init__" in str(err) and "Faulty" in str(err)
    assert "__init__" in err.remote_traceback
    # the constructor's frame first: not the spawn's and the thread's
    assert frame_files(err.remote_traceback) == [__file__]
    assert '    raise RuntimeError(f"cannot start rank {current_rank().rank}")\n' \
        in err.remote_traceback


class Hop(Actor):
    """One link of a chain of calls; the last one raises."""

    def __init__(self) -> None:
        self.next: Hop | None = None

    @endpoint
    async def link(self, nxt: Hop) -> None:
        self.next = nxt

    @endpoint
    async def hop(self) -> int:
        if self.next is None:
            raise ValueError("leaf failure")
        return 1 + await self.next.hop.call_one()


async def test_an_error_through_a_chain_of_calls_is_told_once_per_hop(
        procs: meshio.ProcMesh) -> None:
    """An error no endpoint of a chain catches reaches the caller as what
    the last one raised (``except ValueError`` catches it), its message once
    per hop: it held each hop's whole text twice (in the message and the
    traceback), doubling per hop (120 KB after 8 hops)."""
    hops = [(await procs.spawn(f"hop{i}", Hop)).slice(procs=i % 2) for i in range(4)]
    for mine, nxt in itertools.pairwise(hops):
        await mine.link.call_one(nxt)
    with pytest.raises(ValueError) as info:
        await hops[0].hop.call_one()
    e = info.value
    assert isinstance(e, ActorError)
    assert (e.remote_type, e.remote_message, e.actor) == ("ValueError", "leaf failure", "hop0")
    assert str(e).count("leaf failure") == 3 + 3  # (as one hop's, and once for each further)
    assert str(e).count("in hop3 rank") == 1
    # each hop's traceback starts at its endpoint's frame, not meshio's
    tbs = e.remote_traceback.split("Traceback (most recent call last):\n")[1:]
    assert len(tbs) == 4
    for tb in tbs[:-1]:
        assert tb.startswith(f'  File "{__file__}", line ')
        assert "    return 1 + await self.next.hop.call_one()\n" in tb
    assert frame_files(tbs[-1]) == [__file__]
    assert '    raise ValueError("leaf failure")\n' in tbs[-1]


async def test_constructor_raising_on_every_rank(procs: meshio.ProcMesh) -> None:
    with pytest.raises(ActorError) as info:
        await procs.spawn("faulty", Faulty, fail_ranks=[0, 1])
    err = info.value
    assert [p.rank for p, _ in err.failures] == [0, 1]
    assert "__init__" in str(err)
    assert "cannot start rank 0" in str(err) and "cannot start rank 1" in str(err)


T = TypeVar("T")


class Boxed(Actor, Generic[T]):
    @endpoint
    async def held(self, value: T) -> T:
        return value


async def test_spawn_rejects_non_actors_and_bad_names(procs: meshio.ProcMesh) -> None:
    with pytest.raises(TypeError, match="not a subclass"):
        await procs.spawn("x", dict)  # type: ignore[type-var]
    with pytest.raises(TypeError, match=r"^spawn: .*Boxed\[int\] is a parametrized alias of "
                                        r"the actor class Boxed; spawn Boxed itself"):
        await procs.spawn("boxed", Boxed[int])
    boxed: Boxed[int] = await procs.spawn("boxed", Boxed)  # (as the error says)
    assert await boxed.held.choose(3) == 3
    with pytest.raises(ValueError, match="name"):
        await procs.spawn("a/b", Faulty)
    with pytest.raises(ValueError, match="name"):
        await procs.spawn("", Faulty)
    await procs.spawn("twice", Faulty)
    with pytest.raises(ValueError,
                       match=r"already has actors named 'twice'; stop them first \(`await "):
        await procs.spawn("twice", Faulty)


# ------------------------------------------------------- unknown endpoints


async def test_unknown_endpoint_attribute_lists_endpoints(faulty: Faulty) -> None:
    with pytest.raises(AttributeError) as info:
        faulty.nonexistent  # type: ignore[attr-defined]  # noqa: B018
    msg = str(info.value)
    assert "nonexistent" in msg and "'boom'" in msg and "'train'" in msg
    assert not hasattr(faulty, "also_missing")


async def test_endpoint_unknown_to_the_remote_class(faulty: Faulty) -> None:
    class Stranger(Actor):
        @endpoint
        async def wander(self) -> None: ...

    # an Endpoint built by hand for another class reaches the actor, which refuses it
    ep = meshio.Endpoint(cast(meshio.ActorMesh[Any], faulty), Stranger.wander)
    with pytest.raises(UnknownEndpointError) as info:
        await ep.call()
    assert isinstance(info.value, AttributeError)
    assert "wander" in str(info.value) and "'boom'" in str(info.value)
    assert (await faulty.ok.call()).values() == ["ok", "ok"]


def test_endpoint_names_may_not_shadow_mesh_operations() -> None:
    with pytest.raises(TypeError, match="slice"):
        class Bad(Actor):
            @endpoint
            async def slice(self) -> None: ...  # type: ignore[override]
