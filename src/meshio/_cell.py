"""Hosting actors inside a worker: one mailbox per actor, handled one
message at a time (unless the endpoint is ``concurrent``)."""

from __future__ import annotations

import asyncio
import inspect
import os
import traceback
from collections import deque
from typing import Any

import msgspec

from ._actor import Actor, Context, ProcInfo, _context
from ._endpoint import EndpointDescriptor
from ._exceptions import SchemaError
from ._extent import Region
from ._messages import Call, ErrorInfo, Fail, Reply, SpawnActor
from ._runtime import Connection, Runtime
from ._serial import Buffers, Packer, loads

__all__ = ("ActorCell", "actor_error", "spawn_cell")


def _type_name(e: BaseException) -> str:
    t = type(e)
    if t.__module__ == "builtins":
        return t.__qualname__
    if t.__module__.startswith("meshio._"):  # our own errors by their public name
        import meshio

        if getattr(meshio, t.__name__, None) is t:
            return f"meshio.{t.__name__}"
    return f"{t.__module__}.{t.__qualname__}"


def actor_error(e: BaseException, ctx: Context | None, kind: str = "actor") -> ErrorInfo:
    return ErrorInfo(
        kind, _type_name(e), str(e),
        "".join(traceback.format_exception(e)) if kind == "actor" else "",
        ctx.actor_name if ctx else "", ctx.point.rank if ctx else -1)


class ActorCell:
    """One actor instance and its mailbox."""

    def __init__(self, rt: Runtime, target: str, ctx: Context, instance: Actor) -> None:
        self.rt = rt
        self.target = target
        self.ctx = ctx
        self.instance = instance
        self.endpoints = type(instance)._meshio_endpoints
        self.mailbox: deque[tuple[Connection, Call, Buffers]] = deque()
        self.waiter: asyncio.Future[None] | None = None
        self.task = rt.loop.create_task(self._pump())

    def post(self, conn: Connection, msg: Call, bufs: Buffers) -> None:
        desc = self.endpoints.get(msg.method)
        if desc is not None and desc.concurrent:
            # Concurrent endpoints do not queue behind a busy actor: start now.
            try:
                args, kwargs = desc.schema.unpack_args(msg.args, bufs)
            except SchemaError as e:
                self._fail(conn, msg.req, actor_error(e, self.ctx, "schema"))
                return
            self.rt.loop.create_task(self._run_concurrent(conn, msg.req, desc, args, kwargs))
            return
        self.mailbox.append((conn, msg, bufs))
        waiter = self.waiter
        if waiter is not None:
            self.waiter = None
            if not waiter.done():
                waiter.set_result(None)

    def stop(self) -> None:
        self.task.cancel()
        if getattr(self.rt, "_rdma", None):
            from ._rdma import release_owned

            release_owned(self.rt, self.target)  # its RDMA registrations go with it
        while self.mailbox:
            conn, msg, _ = self.mailbox.popleft()
            if msg.req:
                conn.send_message(Fail(msg.req, ErrorInfo(
                    "unknown_actor", "UnknownActorError",
                    f"actor {self.ctx.actor_name!r} rank {self.ctx.point.rank} was stopped "
                    "before handling this call", actor=self.ctx.actor_name,
                    rank=self.ctx.point.rank)))

    def _fail(self, conn: Connection, req: int, info: ErrorInfo) -> None:
        if req:
            conn.send_message(Fail(req, info))
        else:  # nobody waits for a broadcast: a supervision event
            self.rt.report_fault(info)

    async def _pump(self) -> None:
        _context.set(self.ctx)
        mailbox = self.mailbox
        loop = self.rt.loop
        while True:
            if not mailbox:
                self.waiter = loop.create_future()
                await self.waiter
                continue
            conn, msg, bufs = mailbox.popleft()
            desc = self.endpoints.get(msg.method)
            if desc is None:
                self._fail(conn, msg.req, ErrorInfo(
                    "unknown_endpoint", "UnknownEndpointError",
                    f"{type(self.instance).__qualname__} has no endpoint {msg.method!r} "
                    f"(it has {sorted(self.endpoints)})", actor=self.ctx.actor_name,
                    rank=self.ctx.point.rank))
                continue
            try:
                args, kwargs = desc.schema.unpack_args(msg.args, bufs)
            except SchemaError as e:
                self._fail(conn, msg.req, actor_error(e, self.ctx, "schema"))
                continue
            if desc.concurrent:
                loop.create_task(self._run(conn, msg.req, desc, args, kwargs))
            else:
                await self._run(conn, msg.req, desc, args, kwargs)

    async def _run_concurrent(self, conn: Connection, req: int,
                              desc: EndpointDescriptor[Any, Any, Any],
                              args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        _context.set(self.ctx)  # this task's own copy of the context
        await self._run(conn, req, desc, args, kwargs)

    async def _run(self, conn: Connection, req: int, desc: EndpointDescriptor[Any, Any, Any],
                   args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        try:
            result = desc.fn(self.instance, *args, **kwargs)
            if desc.is_async:
                result = await result
        except Exception as e:
            self._fail(conn, req, actor_error(e, self.ctx))
            return
        if not req:
            return
        packer = Packer()
        try:
            body = desc.schema.pack_result(result, packer)
        except Exception as e:
            conn.send_message(Fail(req, ErrorInfo(
                "schema", "SchemaError",
                f"result of {desc.fn.__qualname__} could not be encoded: {e}",
                actor=self.ctx.actor_name, rank=self.ctx.point.rank)))
            return
        conn.send_message(Reply(req, msgspec.Raw(body)), packer.out)


async def spawn_cell(rt: Runtime, conn: Connection, msg: SpawnActor, bufs: Buffers) -> None:
    """Build the actor of a SpawnActor message and answer the spawner."""
    ctx: Context | None = None
    try:
        if msg.target in rt.actors:
            raise ValueError(f"an actor mesh named {msg.name!r} already lives in this process")
        cls = loads(msg.cls, [], 0)
        mesh = loads(msg.mesh, [], 0)
        point = Region.full(msg.labels, msg.sizes).point(msg.rank)
        ctx = Context(point, msg.name, ProcInfo(msg.rank, os.getpid(), rt.host, rt.addr), mesh)
        args, kwargs = cls._meshio_ctor.unpack_args(msg.args, bufs)
        token = _context.set(ctx)
        try:
            instance = cls.__new__(cls)
            instance._meshio_context = ctx
            instance.__init__(*args, **kwargs)
            if msg.restart:
                hook = getattr(instance, "on_restart", None)
                if hook is not None:
                    result = hook()
                    if inspect.isawaitable(result):
                        await result
        finally:
            _context.reset(token)
    except SchemaError as e:
        conn.send_message(Fail(msg.req, actor_error(e, ctx, "schema")))
        return
    except Exception as e:
        info = actor_error(e, ctx)
        if ctx is None:
            info = ErrorInfo(info.kind, info.type_name, info.message, info.traceback,
                             msg.name, msg.rank)
        conn.send_message(Fail(msg.req, info))
        return
    rt.actors[msg.target] = ActorCell(rt, msg.target, ctx, instance)
    conn.send_message(Reply(msg.req, msgspec.Raw(b"\xc0")))


