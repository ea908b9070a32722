"""A mesh belongs to the event loop whose meshio runtime made it (one
runtime per loop, each with its own job secret).  Used from another loop,
or from a thread that runs none, it raises at once
:class:`~meshio.WrongLoopError` (a ``RuntimeError``) saying so and naming
the fix (``asyncio.run_coroutine_threadsafe``); once its loop has ended,
:class:`~meshio.ClosedResourceError`.  So do a service's ``stop`` and
``scale``, a port's receiver that has to wait, a supervisor's waits and
``stop``, and a view sliced off a reference.  A mesh passed to an actor
works there as ever.  (Probe report items 3 and 7: the call raised a
misleading ``AuthenticationError``, ``procs.spawn`` never returned,
``procs.stop`` left a "Task exception was never retrieved"; from a thread,
asyncio's bare "no running event loop".  Then: ``recv``,
``Supervisor.wait_failed`` and ``events`` waited forever, ``Service.scale``
grew the service from the other loop and ``Service.stop`` stopped it
before raising, a slice of a reference raised ``AuthenticationError``.)"""

from __future__ import annotations

import asyncio
import pickle
import threading
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import torch

import meshio
from meshio import Actor, ActorError, Channel, ClosedResourceError, WrongLoopError, endpoint
from meshio._transport._runtime import _runtimes, close_runtime
from meshio.store import WeightStore

#: generous bound on any single wait: a regression fails instead of hanging
GUARD = 30.0
OTHER_LOOP = "belongs to the meshio runtime of another event loop"
NO_LOOP = r"thread that runs no event loop.*run_coroutine_threadsafe"

pytestmark = pytest.mark.usefixtures("uvloop_started")


class C(Actor):
    @endpoint
    async def ping(self, x: int) -> int:
        return x + 1


class Caller(Actor):
    @endpoint
    async def relay(self, c: C, x: int) -> int:
        return await c.ping.call_one(x)

    @endpoint
    async def echo(self, c: C) -> C:
        return c


class Builder(Actor):
    def __init__(self, c: C) -> None:
        self.first = c.ping.call_one(0)


async def _raises(use: Callable[[], Awaitable[Any]], match: str,
                  error: type[Exception] = WrongLoopError) -> None:
    """``use()`` raises ``error`` at once (or when awaited: a coroutine)."""
    with pytest.raises(error, match=match):
        await asyncio.wait_for(use(), GUARD)


async def test_a_mesh_used_on_a_loop_of_another_thread_raises_at_once() -> None:
    """``asyncio.run`` in ``asyncio.to_thread``: the meshes of the test's
    loop (owned ones, a reference that arrived there, a service, a port
    opened there) raise, and nothing makes a runtime on the other loop for
    them; back on their loop they work."""
    async with meshio.this_host().spawn_procs(per_host={"procs": 1}) as procs:
        c = await procs.spawn("c", C)
        caller = await procs.spawn("caller", Caller)
        ref = await asyncio.wait_for(caller.echo.call_one(c), GUARD)  # no proc mesh here
        svc = meshio.Service(c)

        async def elsewhere() -> None:
            try:
                for use in (lambda: c.ping.call_one(1), lambda: c.ping.call(1),
                            lambda: c.ping.choose(1), lambda: ref.ping.call_one(1),
                            lambda: svc.ping.route(1), lambda: svc.ping.call(1), c.stop,
                            lambda: procs.spawn("c2", C), procs.stop, procs.ready):
                    await _raises(use, OTHER_LOOP)
                with pytest.raises(WrongLoopError, match=OTHER_LOOP):
                    c.ping.broadcast(1)
                # (no runtime was made here to call them from)
                assert asyncio.get_running_loop() not in _runtimes
            finally:
                close_runtime()

        await asyncio.to_thread(asyncio.run, elsewhere())
        assert await asyncio.wait_for(c.ping.call_one(1), GUARD) == 2
        assert await asyncio.wait_for(ref.ping.call_one(2), GUARD) == 3
        assert await asyncio.wait_for(svc.ping.route(3), GUARD) == 4
        assert await asyncio.wait_for(caller.relay.call_one(c, 4), GUARD) == 5  # in an actor
        assert not procs.stopped


async def test_a_port_used_on_a_loop_of_another_thread_raises() -> None:
    """A port opened on this loop, sent to from another loop of this
    process: an error, not values lost to a refused handshake."""
    port, values = Channel[int].open()

    async def elsewhere() -> None:
        try:
            with pytest.raises(WrongLoopError, match="another event loop"):
                port.send(1)
        finally:
            close_runtime()  # (port.send made this loop's runtime, to send from)

    await asyncio.to_thread(asyncio.run, elsewhere())
    port.send(2)
    assert await asyncio.wait_for(values.recv(), GUARD) == 2


def test_the_error_of_a_foreign_loop_is_a_runtime_error() -> None:
    """``WrongLoopError`` is a meshio error that code catching
    ``RuntimeError`` (what these uses raised before it) still catches."""
    assert issubclass(WrongLoopError, meshio.MeshioError)
    assert issubclass(WrongLoopError, RuntimeError)


async def test_a_receiver_waited_on_from_another_loop_raises() -> None:
    """Only the loop a channel was opened on feeds its receiver: ``recv``
    (and ``async for``) waiting on another loop raise at once, instead of
    waiting forever on a future nobody sets; at home it goes on."""
    port, values = Channel[int].open()

    async def elsewhere() -> None:
        async def first() -> int:
            async for v in values:
                return v
            raise AssertionError("the receiver ended")

        await _raises(values.recv, OTHER_LOOP)
        await _raises(first, OTHER_LOOP)
        assert asyncio.get_running_loop() not in _runtimes

    await asyncio.to_thread(asyncio.run, elsewhere())
    port.send(3)
    assert await asyncio.wait_for(values.recv(), GUARD) == 3


async def test_a_service_stopped_or_scaled_from_another_loop_raises_and_changes_nothing(
) -> None:
    """``Service.scale`` from another loop used to start replicas from that
    loop's runtime, and ``Service.stop`` to stop the service before
    raising: both raise at once now, and the service still serves."""
    async with meshio.this_host().spawn_procs(per_host={"procs": 1}) as procs:
        c = await procs.spawn("c", C)
        svc = meshio.Service(c)

        async def elsewhere() -> None:
            try:
                for use in (lambda: svc.scale(replicas=2), svc.stop):
                    await _raises(use, f"service 'c' {OTHER_LOOP}")
                assert asyncio.get_running_loop() not in _runtimes
            finally:
                close_runtime()

        await asyncio.to_thread(asyncio.run, elsewhere())
        assert len(svc.stats()) == 1
        assert await asyncio.wait_for(svc.ping.route(1), GUARD) == 2
        await asyncio.wait_for(svc.stop(), GUARD)  # at home it stops
        assert svc.stats() == []


async def test_a_supervisor_waited_on_from_another_loop_raises() -> None:
    """A supervisor's ``wait_failed`` and ``events`` on another loop than
    its proc meshes' used to wait forever (the loop that fails them is not
    theirs), and its ``stop`` stopped them with errors of futures "attached
    to a different loop": each raises at once; the proc mesh lives on."""
    sup = meshio.Supervisor(name="sup")
    async with meshio.this_host().spawn_procs(per_host={"procs": 1}, supervisor=sup) as procs:
        c = await procs.spawn("c", C)

        async def elsewhere() -> None:
            try:
                await _raises(sup.wait_failed, "supervisor 'sup'.*another event loop")
                await _raises(lambda: anext(aiter(sup.events())), OTHER_LOOP)
                await _raises(sup.stop, OTHER_LOOP)
            finally:
                close_runtime()

        await asyncio.to_thread(asyncio.run, elsewhere())
        assert not procs.stopped and sup.failure is None
        assert await _ping(c) == 2


async def test_a_weight_store_and_stats_used_from_another_loop_raise() -> None:
    """A weight store belongs to the loop it was made on: from another,
    ``publish`` said it was "published by its owner (pid N) only", naming
    this very process, ``read`` dialled its own process as a stranger and
    ``kept`` said none; ``meshio.stats()`` answered "no proc mesh".  Each now
    raises WrongLoopError at once and makes no runtime there; at home they
    go on."""
    store = WeightStore("w")
    await store.publish({"x": torch.ones(2)}, version=1)
    procs, _ = await _start()
    try:
        async def elsewhere() -> None:
            await _raises(lambda: store.publish({"x": torch.ones(2)}, version=2),
                          f"WeightStore 'w' {OTHER_LOOP}")
            await _raises(lambda: store.read(timeout=GUARD), "WeightStore 'w'")
            with pytest.raises(WrongLoopError, match="WeightStore 'w'"):
                store.kept  # noqa: B018 (a property's raise)
            await _raises(meshio.stats, f"each proc mesh {OTHER_LOOP}")
            assert asyncio.get_running_loop() not in _runtimes

        await asyncio.to_thread(asyncio.run, elsewhere())
        assert store.kept == (1,)
        assert float((await store.read(timeout=GUARD))["x"].sum()) == 2.0
        assert len((await meshio.stats()).proc_meshes) == 1
    finally:
        await procs.stop()


async def test_a_slice_of_a_reference_taken_on_another_loop_names_the_loop() -> None:
    """A view sliced off a reference belongs to the runtime the reference
    does: taken and called on another loop, it raises ``WrongLoopError``
    (it used to dial the processes from that loop's runtime and fail with
    an ``AuthenticationError``); on its loop it works."""
    async with meshio.this_host().spawn_procs(per_host={"procs": 2}) as procs:
        c = await procs.spawn("c", C)
        caller = await procs.spawn("caller", Caller)
        ref = await asyncio.wait_for(caller.slice(procs=0).echo.call_one(c), GUARD)

        async def elsewhere() -> None:
            try:
                await _raises(lambda: ref.slice(procs=1).ping.call_one(1), OTHER_LOOP)
                await _raises(lambda: ref.slice(procs=0).ping.call(1), OTHER_LOOP)
            finally:
                close_runtime()

        await asyncio.to_thread(asyncio.run, elsewhere())
        assert await asyncio.wait_for(ref.slice(procs=1).ping.call_one(1), GUARD) == 2


async def test_every_use_from_a_thread_without_a_loop_says_it_in_the_same_words() -> None:
    """Meshio used from a thread that runs no loop (``Channel.open``: the
    runtime), a mesh of this loop, and a reference that belongs to no loop
    yet (unpickled in that thread): one error, one wording but the subject."""
    async with meshio.this_host().spawn_procs(per_host={"procs": 1}) as procs:
        c = await procs.spawn("c", C)

        def in_thread() -> list[str]:
            ref = pickle.loads(pickle.dumps(c))  # (belongs to no runtime yet)
            messages = []
            for use in (Channel[int].open, lambda: c.ping.broadcast(1),
                        lambda: ref.ping.broadcast(1)):
                with pytest.raises(WrongLoopError, match=NO_LOOP) as ei:
                    use()
                messages.append(str(ei.value))
            return messages

        messages = await asyncio.to_thread(in_thread)
        subjects = [m.split(" cannot be used from ", 1)[0] for m in messages]
        assert subjects == ["meshio", "actor mesh 'c'", "actor mesh 'c'"]
        assert len({m.split(" cannot be used from ", 1)[1] for m in messages}) == 1


def test_meshio_at_a_scripts_top_level_says_to_write_an_async_main() -> None:
    """Monarch's synchronous ``procs = this_host().spawn_procs(...)`` at a
    script's top level (the main thread, no loop running): the fix is an
    ``async def main()`` run by ``meshio.run`` (it was the advice for a
    thread of ``asyncio.to_thread``).  A mesh whose loop runs in another
    thread, used from the main thread, still gets the thread recipe."""
    for use in (lambda: meshio.this_host().spawn_procs(per_host={"procs": 1}),
                Channel[int].open):
        with pytest.raises(WrongLoopError) as ei:
            use()
        message = str(ei.value)
        assert message.startswith("meshio cannot be used outside a running event loop (here: "
                                  "the main thread"), message
        assert "`async def main()`" in message and "meshio.run(main())" in message
        assert "`await` them in a cell" in message and "to_thread" not in message

    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever)
    thread.start()
    try:
        procs, c = asyncio.run_coroutine_threadsafe(_start(), loop).result(GUARD)
        try:
            with pytest.raises(WrongLoopError, match=NO_LOOP):
                c.ping.call_one(1)
        finally:
            asyncio.run_coroutine_threadsafe(_finish(procs), loop).result(GUARD)
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(GUARD)
        loop.close()


async def _start() -> tuple[meshio.ProcMesh, C]:
    procs = await meshio.this_host().spawn_procs(per_host={"procs": 1})
    return procs, await procs.spawn("c", C)


async def _open() -> tuple[meshio.Port[int], meshio.PortReceiver[int]]:
    return Channel[int].open()


async def _store() -> WeightStore:
    store = WeightStore("z")
    await store.publish({"x": torch.ones(2)}, version=1)
    return store


async def _ping(c: C) -> int:
    return await asyncio.wait_for(c.ping.call_one(1), GUARD)


async def _finish(procs: meshio.ProcMesh) -> None:
    await procs.stop()
    close_runtime()


def test_a_later_loop_cannot_use_the_meshes_of_the_first() -> None:
    """A second ``asyncio.run`` while the first loop is not running: each
    use raises at once (``spawn`` used to wait forever); the first loop
    still drives them."""
    first = asyncio.new_event_loop()
    try:
        procs, c = first.run_until_complete(_start())
        try:
            async def later() -> None:
                for use in (lambda: c.ping.call_one(1), lambda: procs.spawn("c2", C),
                            procs.stop):
                    await _raises(use, OTHER_LOOP)
                assert asyncio.get_running_loop() not in _runtimes

            asyncio.run(later())
            assert first.run_until_complete(_ping(c)) == 2
        finally:
            first.run_until_complete(_finish(procs))
    finally:
        first.close()


def test_the_meshes_of_a_loop_that_has_ended_say_so() -> None:
    """Once the loop that made them has ended, a mesh and its proc mesh
    raise ClosedResourceError saying so (they used to dial the processes
    from the new loop's runtime), as do a service of the mesh and the
    receiver of a port opened there."""
    first = asyncio.new_event_loop()
    try:
        procs, c = first.run_until_complete(_start())
        svc = meshio.Service(c)
        _, values = first.run_until_complete(_open())
        store = first.run_until_complete(_store())
        first.run_until_complete(_finish(procs))
    finally:
        first.close()

    async def ended() -> None:
        for use in (lambda: c.ping.call_one(1), lambda: procs.spawn("c2", C), procs.stop,
                    lambda: svc.scale(replicas=2), svc.stop, values.recv,
                    lambda: store.read(timeout=GUARD),
                    lambda: store.publish({"x": torch.ones(2)}, version=2)):
            await _raises(use, "event loop that has ended", ClosedResourceError)
        assert asyncio.get_running_loop() not in _runtimes

    asyncio.run(ended())


async def test_calls_from_a_thread_without_a_loop_name_the_fix() -> None:
    """From a thread of the controller (``asyncio.to_thread``) a call, a
    broadcast and a port's send say how to make them on the loop
    (``asyncio.run_coroutine_threadsafe``, which works, as does
    ``loop.call_soon_threadsafe`` for a port)."""
    async with meshio.this_host().spawn_procs(per_host={"procs": 1}) as procs:
        c = await procs.spawn("c", C)
        port, values = Channel[int].open()
        with pytest.raises(WrongLoopError, match=NO_LOOP):
            await asyncio.to_thread(lambda: c.ping.call_one(1))
        with pytest.raises(WrongLoopError, match=NO_LOOP):
            await asyncio.to_thread(lambda: c.ping.broadcast(1))
        with pytest.raises(WrongLoopError, match="call_soon_threadsafe"):
            await asyncio.to_thread(port.send, 1)

        loop = asyncio.get_running_loop()

        async def ping() -> int:
            return await c.ping.call_one(1)

        assert await asyncio.to_thread(
            lambda: asyncio.run_coroutine_threadsafe(ping(), loop).result(GUARD)) == 2
        await asyncio.to_thread(loop.call_soon_threadsafe, port.send, 7)
        assert await asyncio.wait_for(values.recv(), GUARD) == 7


async def test_the_thread_recipe_in_the_error_is_one_that_works() -> None:
    """``run_coroutine_threadsafe(c.ping.call_one(1), loop)``, the obvious
    reading of the fix the error named, raises the same error (the adverb
    sends at once, in the calling thread); the message shows the form that
    works, the call wrapped in an ``async def`` run on the loop."""
    async with meshio.this_host().spawn_procs(per_host={"procs": 1}) as procs:
        c = await procs.spawn("c", C)
        loop = asyncio.get_running_loop()

        def obvious() -> None:
            # (pyright sees that an adverb's future is not a coroutine; users may not)
            asyncio.run_coroutine_threadsafe(
                c.ping.call_one(1), loop).result(GUARD)  # pyright: ignore[reportArgumentType]

        with pytest.raises(WrongLoopError) as ei:
            await asyncio.to_thread(obvious)
        message = str(ei.value)
        assert "`async def call(): return await mesh.endpoint.call_one(...)`" in message
        assert "asyncio.run_coroutine_threadsafe(call(), loop).result()" in message
        assert "an adverb sends at once, in the thread that calls it" in message


async def test_a_call_in_an_actors_init_names_init() -> None:
    """A call awaited in an actor's ``__init__`` (its thread): the error
    says so, not "a plain 'def' endpoint" the user never wrote."""
    async with meshio.this_host().spawn_procs(per_host={"procs": 1}) as procs:
        c = await procs.spawn("c", C)
        with pytest.raises(ActorError, match=r"cannot be made from an actor's __init__") as ei:
            await asyncio.wait_for(procs.spawn("b", Builder, c), GUARD)
        assert ei.value.remote_type == "RuntimeError"
        assert "plain 'def' endpoint" not in str(ei.value)
