"""Jobs: hosts from a scheduler, as named host meshes (Monarch's model).

Every job kind has the same operations (:class:`Job`): ``apply()``
gets the hosts (allocates, starts ``meshio agent`` on each), ``state()``
returns them as named :class:`~meshio.HostMesh`\\ es (applying first if
needed), ``resize(name, hosts=n)`` grows or shrinks one of them while it
runs, ``kill()`` gives them back.  A job that outlives its controller
(``ProcessJob``, ``SlurmJob``) is written to a cache file in ``.meshio/``
so that running the controller script again re-attaches to the same live
hosts instead of starting new ones; an entry that is stale (its agents are
gone) or of another shape (other meshes) is reported and given back, one
that is foreign (another user's, another job kind's) is refused.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import json
import keyword
import logging
import os
import secrets
import stat
import subprocess
import sys
import tempfile
from collections.abc import AsyncGenerator, Awaitable, Callable, Iterator, Mapping
from functools import partial
from pathlib import Path
from typing import Any, Protocol, cast, runtime_checkable

from .._checks import check_seconds
from .._extent import Region
from .._flock import LOCK_FLAGS, flocked
from .._launcher import LocalLauncher
from .._proc_mesh import HostMesh, grow_hosts, shrink_hosts
from .._transport._tasks import awaited, to_the_end, within
from .._transport._tls import TLSConfig
from ._agent import tls_flags
from ._remote import attach, checked_secret, not_private

__all__ = ("AgentsJob", "CachedJob", "ClusterError", "Job", "JobCacheError", "JobState", "LocalJob",
           "ProcessJob", "check_cache_dir", "check_job_name", "check_meshes", "check_tls",
           "job_lock", "not_cached", "read_job_secret", "read_own_cache", "record_resize",
           "resize_job", "write_cache")

log = logging.getLogger("meshio")

#: seconds a started agent gets to print its address
AGENT_START_TIMEOUT = 30.0


class JobCacheError(RuntimeError):
    """A job cache or secret file that must not be used (another user's,
    readable or writable by others, not a file, or not a meshio job cache),
    or a cache directory where they cannot be kept; raised by a job's
    ``apply()``, ``state()`` and ``kill()``.  Raised by ``resize()`` too when
    the cache no longer names the job this controller applied: another
    controller killed it (and perhaps applied a new one, or resized it)."""


class ClusterError(RuntimeError):
    """Raised when the cluster refuses or fails a job.  By
    :class:`KubernetesJob`: an API request fails (an object of that name
    exists already, the account may not create it, the API server cannot be
    reached) or an agent's pod cannot start (its image cannot be pulled, it
    crash-loops).  By :class:`ProcessJob`'s ``apply()``, ``state()`` and
    ``resize()``: an agent process did not start (its ``host`` does not
    resolve, or is no address of this machine); the message names the host
    and gives the agent's own reason, from the job's log."""


class JobState:
    """The hosts of a job, one :class:`~meshio.HostMesh` per mesh name:
    ``state.trainers`` (or ``state.meshes["trainers"]``)."""

    meshes: Mapping[str, HostMesh]

    def __init__(self, meshes: Mapping[str, HostMesh]) -> None:
        self.meshes = dict(meshes)

    def __getattr__(self, name: str) -> HostMesh:
        try:
            return self.__dict__["meshes"][name]  # type: ignore[no-any-return]
        except KeyError:
            raise AttributeError(f"this job has no host mesh {name!r}; it has "
                                 f"{sorted(self.__dict__.get('meshes', {}))}") from None

    def __iter__(self) -> Iterator[str]:
        return iter(self.meshes)

    def __repr__(self) -> str:
        return f"JobState({', '.join(f'{k}={len(v)} hosts' for k, v in self.meshes.items())})"


@runtime_checkable
class Job(Protocol):
    """What every job kind does (``isinstance(job, Job)`` checks that
    ``job`` has these methods)."""

    async def apply(self) -> None:
        """Get the hosts: re-attach to a live cached job, or start one."""
        ...

    async def state(self) -> JobState:
        """The job's host meshes by name (``apply()`` first if needed)."""
        ...

    async def resize(self, name: str, /, *, hosts: int) -> None:
        """Grow or shrink the host mesh ``name`` to ``hosts`` hosts while the
        job runs: the host mesh from ``state()`` changes in place and the
        proc meshes spawned on it with ``elastic=True`` follow it (new
        hosts get their processes and actors; on the hosts removed, the
        processes are stopped before the hosts go).  Other proc meshes
        keep their shape (those on a removed host lose its processes).
        Resizes of one job take turns (under the job's lock, as ``apply()``
        and ``kill()``): each changes the size it finds to ``hosts``, so
        resizes at once end at the size of the one that ran last.  A
        shrink gives the hosts back one at a time, the last first;
        cancelled midway, it finishes the host at hand (its processes
        stopped, the host given back), then raises ``CancelledError``: the
        host mesh, its elastic proc meshes and the job agree on the hosts
        left.

        Raises:
            KeyError: the job has no host mesh ``name``.
            TypeError: ``hosts`` is not an int.
            ValueError: ``hosts`` < 1.
            ProcessStartError, ActorError: an elastic proc mesh did not grow
                onto the new hosts (it keeps its shape; the host mesh grew).
            JobCacheError: another controller killed the job (or changed
                it) since this one applied it: nothing was added or given
                back, and the next ``apply()`` finds the job anew.
        """
        ...

    async def kill(self) -> None:
        """Give the hosts back and forget the cached job."""
        ...


#: what ``state.<name>`` of a :class:`JobState` gives other than a host
#: mesh: no mesh may have one of these names
_STATE_NAMES = frozenset(dir(JobState)) | frozenset(JobState.__annotations__)


def check_meshes(meshes: Mapping[str, int]) -> dict[str, int]:
    """``meshes={"trainers": 2}`` checked: names are identifiers that
    ``state.<name>`` gives (no keyword, no attribute of :class:`JobState`),
    counts ≥ 1.

    Raises:
        TypeError: a name that is not a str, a count that is not an int (a
            bool).
        ValueError: not a mapping, or an empty one, a name that is not an
            identifier, is a keyword (``class``) or names an attribute of
            the job's state (``meshes``), a count below 1.
    """
    if not isinstance(meshes, Mapping) or not meshes:
        raise ValueError("meshes must be a non-empty mapping of mesh name to host count, "
                         "e.g. {'trainers': 2}")
    checked: dict[str, int] = {}
    for name, n in meshes.items():
        if not isinstance(name, str):
            raise TypeError(f"mesh name {name!r} must be a str (an identifier: state.<name> "
                            f"names the mesh), got {type(name).__name__}")
        if not name.isidentifier() or keyword.iskeyword(name):
            why = "a Python keyword" if name.isidentifier() else "not an identifier"
            raise ValueError(f"mesh name {name!r} is {why}: state.<name> must name the mesh; "
                             "choose another name")
        if name in _STATE_NAMES:
            raise ValueError(f"mesh name {name!r} is an attribute of the job's state "
                             f"(state.{name} is not a host mesh); choose another name")
        if isinstance(n, bool) or not isinstance(n, int):
            raise TypeError(f"meshes[{name!r}] must be an int host count, got "
                            f"{type(n).__name__}")
        if n < 1:
            raise ValueError(f"meshes[{name!r}] must be at least 1, got {n}")
        checked[name] = n
    return checked


def check_job_name(kind: str, name: object) -> str:
    """A ``ProcessJob``'s or ``SlurmJob``'s ``name=``, checked: it names
    files (``<name>.json``) and the scheduler's job.

    Raises:
        TypeError: not a str.
        ValueError: not letters, digits, - and _.
    """
    if not isinstance(name, str):
        raise TypeError(f"{kind}: name must be a str (letters, digits, - and _), got "
                        f"{type(name).__name__} {name!r}")
    if not name.replace("-", "_").isidentifier():
        raise ValueError(f"{kind}: job name {name!r} must be letters, digits, - and _")
    return name


def check_cache_dir(kind: str, cache_dir: object) -> Path:
    """A job's ``cache_dir=``, checked: a path (a str or an
    ``os.PathLike``) as a :class:`~pathlib.Path`.

    Raises:
        TypeError: not a path (None, an int, bytes).
        ValueError: it holds a NUL character.
    """
    got = f"{type(cache_dir).__name__} {cache_dir!r}"  # (before isinstance narrows it)
    path: Path | None = None
    if isinstance(cache_dir, (str, os.PathLike)):
        with contextlib.suppress(TypeError):  # (an os.PathLike of bytes)
            path = Path(cast("str | os.PathLike[str]", cache_dir))
    if path is None:
        raise TypeError(f"{kind}(cache_dir=...) must be a path (a str or os.PathLike), got {got}")
    if "\0" in str(path):
        raise ValueError(f"{kind}(cache_dir=...) must be a path without NUL, got {cache_dir!r}")
    return path


def check_tls(what: str, tls: object) -> TLSConfig | None:
    """A job's ``tls=``: a :class:`~meshio.TLSConfig` or None.

    Raises:
        TypeError: anything else (a path: make a ``TLSConfig(cert, key, ca)``).
    """
    if tls is not None and not isinstance(tls, TLSConfig):
        raise TypeError(f"{what}: tls must be a meshio.TLSConfig(cert, key, ca) or None, got "
                        f"{type(tls).__name__} {tls!r}")
    return tls


def check_resize(job: str, meshes: Mapping[str, int], name: str, hosts: int) -> None:
    """The arguments of ``job.resize(name, hosts=n)``, checked.

    Raises:
        KeyError: the job has no host mesh ``name``.
        TypeError: ``hosts`` is not an int.
        ValueError: ``hosts`` < 1.
    """
    if name not in meshes:
        raise KeyError(f"{job}.resize({name!r}): the job has no host mesh {name!r}; it has "
                       f"{sorted(meshes)}")
    if isinstance(hosts, bool) or not isinstance(hosts, int):
        raise TypeError(f"{job}.resize({name!r}, hosts=...): expected an int, got "
                        f"{type(hosts).__name__} {hosts!r}")
    if hosts < 1:
        raise ValueError(f"{job}.resize({name!r}, hosts={hosts}): a host mesh keeps at least "
                         f"1 host (kill() the job to give every host back)")


async def resize_job(job: CachedJob, what: str, meshes: Mapping[str, int], name: str, hosts: int,
                     add: Callable[[int], Awaitable[HostMesh]],
                     remove: Callable[[int], Awaitable[None]]) -> None:
    """``job.resize(name, hosts=hosts)``, the same for every kind: ``add(n)``
    gets ``n`` more hosts from the scheduler (the job records them) and
    returns them as a host mesh, which the named host mesh and its elastic
    proc meshes grow onto; to shrink, one host at a time, the last first,
    those proc meshes stop their processes on it, it leaves the host mesh,
    then ``remove(1)`` gives it back (and records it).  Each host is
    finished once begun: cancelled meanwhile, the resize gives back the
    host at hand, then raises ``CancelledError``, so the host mesh, its
    elastic proc meshes and the cache name the same hosts (``what`` names
    the job in errors).  The whole resize holds the job's
    lock (:meth:`CachedJob.locked`), as ``apply()`` and ``kill()`` do:
    another resize of the job (another task, or another controller) waits
    for it, then changes the size it finds, ``meshes[name]`` read under
    the lock, to the size it asks for; a kill by another controller waits
    for it, then gives back the hosts added too; one that came first is
    found under the lock (:meth:`CachedJob._check_cached`), and nothing is
    added or given back (nor, to shrink, are the elastic proc meshes'
    processes stopped).  Nothing under the lock takes it again: the host
    mesh is got (``state()``, which may ``apply()``) before, and growing or
    shrinking proc meshes never calls into the job.

    Raises:
        JobCacheError: another controller killed (or changed) the job."""
    check_resize(what, meshes, name, hosts)
    mesh = (await job.state()).meshes[name]  # (may apply() it: the lock is taken after)
    async with job.locked():
        job._check_cached(what)
        old = meshes[name]
        if hosts > old:
            # (add() records the new hosts and grow_hosts() puts them in the host mesh
            # before it first waits: cancelled after, the recorded size is still true)
            await grow_hosts(mesh, await add(hosts - old))
        elif hosts < old:
            for _ in range(old - hosts):
                # (finished once begun: the elastic proc meshes may have dropped the host
                # already, so it leaves the host mesh and is given back all the same)
                await to_the_end(awaited(_give_back_last(mesh, remove)))


async def _give_back_last(mesh: HostMesh, remove: Callable[[int], Awaitable[None]]) -> None:
    """(:func:`resize_job`'s shrink by one host: the elastic proc meshes stop
    their processes on the last host of ``mesh``, which leaves it, then
    ``remove(1)`` gives it back.)"""
    await shrink_hosts(mesh, 1)
    await remove(1)


def not_cached(what: str, cache: Path, cached: Mapping[str, Any] | None) -> JobCacheError:
    """The error of a resize of the job ``what`` that finds under the job's
    lock that its cache holds ``cached`` (None: nothing), not the job this
    controller applied (:meth:`CachedJob._check_cached`)."""
    if cached is None:
        return JobCacheError(f"{what} was killed by another controller (its cache {cache} is "
                             "gone): nothing was resized. apply() it to start a new job")
    return JobCacheError(f"{what} was killed or changed by another controller since this one "
                         f"applied it (its cache {cache} names other hosts, meshes "
                         f"{cached.get('meshes')}): nothing was resized. apply() it to attach "
                         "to the job the cache names")


def record_resize(cache: Path, entry: dict[str, Any], meshes: dict[str, int], name: str,
                  hosts: int) -> None:
    """A job's mesh ``name`` has ``hosts`` hosts now (its agents are in
    ``entry["hosts"]`` already): in ``meshes`` and in the cache too."""
    meshes[name] = hosts
    entry["meshes"] = dict(meshes)
    write_cache(cache, entry)


class CachedJob(abc.ABC):
    """What a job kept in a cache file (``ProcessJob``, ``SlurmJob``,
    ``KubernetesJob``) shares: its ``apply()`` and ``kill()`` hold the
    job's lock (:func:`job_lock`), so one controller at a time reads the
    cache, starts or gives back what it names, and writes or removes it.
    Each kind documents its own ``apply()`` and ``kill()`` and runs these."""

    kind: str
    name: str
    cache: Path

    async def apply(self) -> None:
        """Get the hosts: re-attach to a live cached job, or start one (the
        kind's :meth:`_apply_locked`, under the job's lock; an ``apply()``
        waiting for the lock finds the job applied by another task of this
        object, or re-attaches to what another controller started)."""
        if self._applied():
            return
        async with self.locked():
            if not self._applied():  # (another task of this job may have applied it)
                await self._apply_locked()

    async def kill(self) -> None:
        """Give the hosts back and forget the cached job (the kind's
        :meth:`_kill_locked`, under the job's lock: after an ``apply()`` or
        a resize of the job that holds it, never halfway through one)."""
        async with self.locked():
            await self._kill_locked()

    def locked(self) -> contextlib.AbstractAsyncContextManager[None]:
        """The job's lock (:func:`job_lock`), held while the cache and what
        it names change: by ``apply()``, ``kill()`` and a resize's hosts
        added or given back."""
        return job_lock(self.cache, f"{self.kind} {self.name!r}")

    @abc.abstractmethod
    async def state(self) -> JobState:
        """The job's host meshes by name (``apply()`` first if needed)."""

    @abc.abstractmethod
    def _check_cached(self, what: str) -> None:
        """Under the job's lock, before a resize changes the job: the cache
        still names the job this object applied.  If not (another
        controller's ``kill()`` came first), this object forgets the job
        (its next ``apply()`` finds it anew) and raises.

        Raises:
            JobCacheError: the cache is gone, or names another job (``what``
                names this one in the message).
        """

    @abc.abstractmethod
    def _applied(self) -> bool:
        """Whether this object has its hosts (``apply()`` has nothing to do)."""

    @abc.abstractmethod
    async def _apply_locked(self) -> None:
        """(:meth:`apply`'s work, under the job's lock.)"""

    @abc.abstractmethod
    async def _kill_locked(self) -> None:
        """(:meth:`kill`'s work, under the job's lock.)"""


class AgentsJob(CachedJob):
    """What a job whose cache entry lists its agents (``ProcessJob``,
    ``SlurmJob``) shares: one :class:`JobState` for its life, which
    ``resize`` changes in place."""

    meshes: dict[str, int]
    tls: TLSConfig | None
    _entry: dict[str, Any] | None
    _state: JobState | None

    def _applied(self) -> bool:
        return self._entry is not None

    async def state(self) -> JobState:
        """The job's host meshes by name (``apply()`` first if needed); the
        same object each time (``resize`` changes its host meshes).

        Raises:
            JobCacheError: the cache or the job secret file is unsafe (as
                :meth:`apply`'s), or the secret file is missing.
        """
        await self.apply()
        assert self._entry is not None
        if self._state is None:
            self._state = attached(self._entry, self.tls)
        return self._state

    def _check_cached(self, what: str) -> None:
        entry = self._entry  # (None: killed by another task since the resize applied it)
        cached = read_own_cache(self.cache, self.kind)
        # (its agents name the job: those of a new job of this name differ, as
        # do those of this one resized by another controller)
        if entry is not None and cached is not None and cached.get("hosts") == entry["hosts"]:
            return
        self._entry = None
        self._state = None
        raise not_cached(what, self.cache, cached)

    def _added(self, name: str, agents: list[dict[str, Any]]) -> HostMesh:
        """``agents`` are the new last hosts of mesh ``name`` (recorded in
        the cache); they as a host mesh."""
        entry = self._entry
        assert entry is not None
        entry["hosts"][name] += agents
        record_resize(self.cache, entry, self.meshes, name, len(entry["hosts"][name]))
        return attached({**entry, "hosts": {name: agents}}, self.tls).meshes[name]

    def _removed(self, name: str, n: int) -> None:
        """The last ``n`` hosts of mesh ``name`` are gone (recorded in the cache)."""
        entry = self._entry
        assert entry is not None
        agents: list[dict[str, Any]] = entry["hosts"][name]
        del agents[len(agents) - n:]
        record_resize(self.cache, entry, self.meshes, name, len(agents))


# ------------------------------------------------------------------ cache

def _load_cache(path: Path) -> dict[str, Any] | None:
    """The job cache at ``path`` if it is this user's, private and a meshio
    job cache; None if there is none.

    Raises:
        JobCacheError: the file is another user's or others may read or
            write it, or it is not a meshio job cache.
    """
    data = _read_private(path, "job cache")
    if data is None:
        return None
    try:
        loaded: object = json.loads(data)
    except ValueError:
        loaded = None
    if not isinstance(loaded, dict) or cast(dict[str, Any], loaded).get("meshio_job") != 1:
        raise JobCacheError(f"job cache {path} is not a meshio job cache; it is not used. "
                            "Remove it.")
    return cast(dict[str, Any], loaded)


def _read_private(path: Path, what: str) -> bytes | None:
    """The contents of ``path`` (``what``: a job's cache or secret) if it is
    a file of this user's that others may neither read nor write; None if
    there is none.  What is checked is the file opened (through a link, if
    ``path`` is one), and what is read is that file.

    Raises:
        JobCacheError: it is another user's, others may read or write it,
            it is not a regular file, or it cannot be read.
    """
    try:  # (O_NONBLOCK: a FIFO planted there does not hang the open)
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as e:
        with contextlib.suppress(OSError):
            _refuse_unless_private(path, what, path.stat())  # another user's, private
        raise JobCacheError(f"{what} {path} cannot be read ({e.strerror or e}); it is not "
                            "used. Remove it.") from None
    with os.fdopen(fd, "rb") as f:
        _refuse_unless_private(path, what, os.fstat(fd))
        return f.read()


def _refuse_unless_private(path: Path, what: str, st: os.stat_result) -> None:
    """(:func:`_read_private`'s checks of the file opened, ``st``.)"""
    if (why := not_private(st)) is not None:
        raise JobCacheError(f"{what} {path} {why}; it is not used. Remove it or choose "
                            "another job name.")


def read_job_secret(path: Path) -> bytes | None:
    """The job secret in ``path`` if it is this user's and private (as a
    job cache is: :func:`_read_private`); None if there is none.

    Raises:
        JobCacheError: the file is another user's, others may read or
            write it, it is no regular file, or it holds no secret.
    """
    data = _read_private(path, "job secret")
    if data is None:
        return None
    try:
        return checked_secret(data.strip())
    except ValueError as e:
        raise JobCacheError(f"job secret {path}: {e}; it is not used. Remove it.") from None


def read_own_cache(path: Path, kind: str) -> dict[str, Any] | None:
    """The cached job at ``path`` if it is this user's, private and of this
    kind, whatever its meshes (a job of another shape is still what the
    cache holds: given back, never forgotten); None if there is none.

    Raises:
        JobCacheError: the file is another user's or others may read or
            write it, it is not a meshio job cache, or it holds a job of
            another kind (which only that kind can give back).
    """
    entry = _load_cache(path)
    if entry is not None and entry.get("kind") != kind:
        raise JobCacheError(
            f"job cache {path} holds a {entry.get('kind')} with meshes {entry.get('meshes')}, "
            f"not a {kind}; it is not used. Give that job back with kill() on a "
            f"{entry.get('kind')} of the same name, or choose another job name.")
    return entry


def write_cache(path: Path, entry: dict[str, Any]) -> None:
    """Write ``entry`` to ``path``, readable by this user only.

    Raises:
        JobCacheError: its directory is another user's, or others may write
            to it (:func:`_write_private`).
    """
    _write_private(path, json.dumps({"meshio_job": 1, **entry}, indent=1).encode())


def _write_private(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` (a job's cache, secret), readable by this
    user only: into a fresh file (``O_EXCL``, mode 0600, a random name),
    renamed over ``path``; whatever was there (a file or link another user
    planted) is replaced, never written through.  Its directory and the
    missing ones above it are made mode 0700 (:func:`_make_private_dirs`).

    Raises:
        JobCacheError: the directory is another user's, or others may write
            to it (:func:`_private_dir`); or ``path`` cannot be written (a
            directory there, a full disk).
    """
    folder = _private_dir(path.parent)
    try:
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{path.name}.")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
    except OSError as e:
        raise JobCacheError(f"{path} cannot be written ({e.strerror or e}); remove what is "
                            "there, or choose another cache_dir") from None


def _private_dir(folder: Path) -> Path:
    """``folder``, a job's cache directory, made if missing (and the missing
    ones above it, mode 0700: :func:`_make_private_dirs`) and checked to be
    this user's and writable by no one else: what a job keeps there (its
    cache, secret, lock) is only as private as the directory.  Checked
    before a job's cache is written and before one is read (a re-attach).

    Raises:
        JobCacheError: the directory is another user's, or others may write
            to it: they could plant or swap the job's secret there; or it
            cannot be made.
    """
    try:
        _make_private_dirs(folder)
    except OSError as e:
        raise JobCacheError(f"job cache directory {folder} cannot be made ({e}); choose "
                            "another cache_dir") from None
    st = folder.stat()
    if st.st_uid != os.getuid() or st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise JobCacheError(
            f"job cache directory {folder} belongs to uid {st.st_uid} with mode "
            f"{stat.S_IMODE(st.st_mode):o}: the job's secret cannot be kept there (others could "
            f"read or replace it); meshio needs it to be yours (uid {os.getuid()}) and writable "
            f"by you only: remove it, or choose another cache_dir")
    return folder


@contextlib.asynccontextmanager
async def job_lock(cache: Path, what: str) -> AsyncGenerator[None]:
    """Hold the lock of the job whose cache is ``cache`` (``<name>.lock``
    beside it, locked with ``flock``: :func:`~meshio._flock.flocked`): one
    controller at a time reads the cache, starts or gives back the job and
    writes or removes the cache, so two ``apply()`` of one job name (two
    controller processes, two tasks) never both start agents (the second
    waits, then finds the first's cache and re-attaches), and a ``kill()``
    gives back all an ``apply()`` started (:class:`CachedJob` takes it).
    The cache directory is checked to be private first
    (:func:`_private_dir`).  ``what`` names the job in the log line said
    while waiting.

    Raises:
        JobCacheError: the cache directory is unsafe or cannot be made, or
            the lock file cannot be opened.
    """
    folder = _private_dir(cache.parent)
    path = folder / f"{cache.stem}.lock"
    try:
        fd = os.open(path, LOCK_FLAGS, 0o600)
    except OSError as e:
        raise JobCacheError(f"job lock {path} cannot be opened ({e.strerror or e}); remove "
                            "what is there, or choose another cache_dir") from None
    async with flocked(fd, lambda: log.info(
            "meshio: %s: another apply(), kill() or resize() of this job holds %s; waiting "
            "for it", what, path)):
        yield


def _make_private_dirs(folder: Path) -> None:
    """Make ``folder`` and the missing directories above it, each mode 0700
    (``mkdir(parents=True)`` makes those above by the umask: 0777 under
    ``umask 000``, where another user could swap the folder beneath).

    Raises:
        OSError: one cannot be made (something else of that name there).
    """
    missing: list[Path] = []
    for d in [folder, *folder.parents]:
        if d.is_dir():
            break
        missing.append(d)
    for d in reversed(missing):
        d.mkdir(mode=0o700, exist_ok=True)


def _start_time(pid: int) -> str | None:
    """The kernel's start time of ``pid`` (tells a live agent from a
    recycled pid); None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    if len(fields) < 20 or fields[0] in ("Z", "X"):  # exited (a zombie nobody reaped)
        return None
    return fields[19]


# ------------------------------------------------------------------ jobs

class LocalJob:
    """This host only, for every mesh name (each with one host): the job
    kind a script uses before it has a cluster, with the same code.  Its
    host meshes have a ``hosts`` dimension of size 1, as a one-host mesh
    of every other job kind does (``this_host()`` has no dimension); their
    processes are children of the controller, as ``this_host()``'s are."""

    def __init__(self, meshes: Mapping[str, int]) -> None:
        self.meshes: dict[str, int] = check_meshes(meshes)
        many = [k for k, n in self.meshes.items() if n != 1]
        if many:
            raise ValueError(f"LocalJob has one host; meshes {many} ask for more (use "
                             "ProcessJob to simulate several hosts on this one)")
        self._state: JobState | None = None

    async def apply(self) -> None:
        pass

    async def state(self) -> JobState:
        if self._state is None:
            self._state = JobState({name: HostMesh([LocalLauncher()], Region.full(("hosts",), (1,)))
                                    for name in self.meshes})
        return self._state

    async def resize(self, name: str, /, *, hosts: int) -> None:
        """Nothing to do for ``hosts=1``; a LocalJob has one host.

        Raises:
            ValueError: ``hosts`` is not 1 (use ProcessJob to simulate
                several hosts on this one).
            KeyError, TypeError: as for every job (see :meth:`Job.resize`).
        """
        check_resize("LocalJob", self.meshes, name, hosts)
        if hosts != 1:
            raise ValueError(f"LocalJob.resize({name!r}, hosts={hosts}): a LocalJob has one "
                             f"host (use ProcessJob to simulate several hosts on this one)")

    async def kill(self) -> None:
        pass


class ProcessJob(AgentsJob):
    """Host agents as local processes, one per host of each mesh: the test
    double of a cluster job, and a real option on one big machine.

    Agents listen on ``host`` (loopback by default) and outlive the
    controller script, so a second run re-attaches to them (cached in
    ``cache_dir``); each exits once no controller has used it for
    ``idle_timeout`` seconds, and ``kill()`` ends them at once.
    """

    kind = "ProcessJob"

    def __init__(self, meshes: Mapping[str, int], *, name: str = "job",
                 host: str = "127.0.0.1", tls: TLSConfig | None = None,
                 cache_dir: str | os.PathLike[str] = ".meshio",
                 idle_timeout: float = 600.0) -> None:
        self.meshes: dict[str, int] = check_meshes(meshes)
        self.name: str = check_job_name("ProcessJob", name)
        what = f"ProcessJob {name!r}"
        if not isinstance(host, str):
            raise TypeError(f"{what}: host must be a str (an address of this machine), got "
                            f"{type(host).__name__} {host!r}")
        if not host.strip():
            raise ValueError(f"{what}: host must be an address of this machine, got {host!r}")
        self.host: str = host
        self.tls: TLSConfig | None = check_tls(what, tls)
        self.idle_timeout: float = check_seconds(idle_timeout, "ProcessJob", "idle_timeout")
        self.cache: Path = check_cache_dir("ProcessJob", cache_dir) / f"{name}.json"
        self._entry: dict[str, Any] | None = None
        self._state: JobState | None = None

    async def apply(self) -> None:
        """Re-attach to the cached job if its agents all live, or start new
        agents.  A cached job of another shape (other ``meshes``, or resized)
        is reported and its agents stopped first.  One ``apply()`` or
        ``kill()`` of a job name runs at a time (:func:`job_lock`): another,
        in this process or another, waits for it, then re-attaches to the
        agents it started.

        Raises:
            JobCacheError: the cache file is unsafe, not a meshio cache, or
                holds a job of another kind.
            ClusterError: an agent did not start (the message says why: its
                last line in the job's log ``<cache_dir>/<name>.log``).
        """
        await super().apply()

    async def _apply_locked(self) -> None:
        entry = read_own_cache(self.cache, self.kind)
        if entry is not None and entry.get("meshes") != self.meshes:
            log.warning("meshio: job cache %s is a ProcessJob with meshes %s, not %s: stopping "
                        "its agents and starting a new job", self.cache, entry.get("meshes"),
                        self.meshes)
            _kill_agents(entry)
            entry = None
        if entry is not None:
            gone = [a for agents in entry["hosts"].values() for a in agents
                    if _start_time(a["pid"]) != a["start"]]
            if gone:
                log.warning("meshio: job cache %s is stale (agents %s are gone); starting new "
                            "agents", self.cache, [a["addr"] for a in gone])
                _kill_agents(entry)
                entry = None
        if entry is None:
            entry = await self._start()
            write_cache(self.cache, entry)
        self._entry = entry

    async def _start(self) -> dict[str, Any]:
        secret = secrets.token_bytes(32)
        secret_file = self.cache.with_suffix(".secret")
        write_secret(secret_file, secret)
        hosts: dict[str, list[dict[str, Any]]] = {}
        started: list[dict[str, Any]] = []
        try:
            for mesh, n in self.meshes.items():
                hosts[mesh] = []
                for _ in range(n):
                    agent = await self._start_agent(secret_file)
                    started.append(agent)
                    hosts[mesh].append(agent)
        except BaseException:
            _kill_agents({"hosts": {"all": started}})
            secret_file.unlink(missing_ok=True)  # (no cache names it: nobody else would)
            raise
        return {"kind": self.kind, "meshes": self.meshes, "hosts": hosts,
                "secret_file": str(secret_file)}

    async def _start_agent(self, secret_file: Path) -> dict[str, Any]:
        tls = self.tls
        argv = [sys.executable, "-m", "meshio", "agent", "--listen", f"{self.host}:0",
                "--secret-file", str(secret_file), "--idle-timeout", str(self.idle_timeout)]
        if tls is not None:
            argv += tls_flags(os.fspath(tls.cert), os.fspath(tls.key), os.fspath(tls.ca),
                              mutual=tls.mutual, check_hostname=tls.check_hostname)
        log_path = self.cache.with_suffix(".log")
        # (readable by this user only, as the cache beside it: whatever the umask)
        log_fd = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
        logged = os.fstat(log_fd).st_size  # (what this agent writes follows)
        with os.fdopen(log_fd, "ab") as log_file:
            # ``sh`` starts the agent in the background and exits: the agent is
            # nobody's child here and outlives this script (the next run
            # re-attaches); it prints its pid, then the agent its address.
            shell = subprocess.Popen(["/bin/sh", "-c", 'setsid "$@" & echo $!', "sh", *argv],
                                     stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=log_file)
        assert shell.stdout is not None
        out = shell.stdout
        pid_line = asyncio.get_running_loop().run_in_executor(None, out.readline)
        pid = 0
        timed_out = False
        try:
            pid = int(await asyncio.shield(pid_line))
            line = await within(asyncio.to_thread(out.readline), AGENT_START_TIMEOUT)
        except BaseException as e:  # too slow, or given up: nobody else knows of it
            if isinstance(e, asyncio.CancelledError) and not pid:
                with contextlib.suppress(ValueError):  # the shell prints it at once
                    pid = int(await pid_line)
            if pid:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, 9)  # its stdout closes: the reading thread ends
            if not isinstance(e, TimeoutError):
                raise
            line = b""
            timed_out = True
        finally:
            out.close()
            shell.wait()  # (it exits once it printed the pid)
        prefix = b"meshio agent listening on "
        if not line.startswith(prefix):
            raise ClusterError(f"ProcessJob {self.name!r}: an agent did not start on host "
                               f"{self.host!r}: {_agent_error(log_path, logged, line, timed_out)}"
                               f" (see {log_path})")
        addr = line[len(prefix):].decode().strip()
        return {"addr": addr, "pid": pid, "start": _start_time(pid)}

    async def resize(self, name: str, /, *, hosts: int) -> None:
        """Start agents for the new hosts, or stop the last ones (once the
        elastic proc meshes' processes there are stopped); the cache
        records the new shape.  See :meth:`Job.resize`.

        Raises:
            ClusterError: a new agent did not start (nothing changed).
            JobCacheError: another controller killed the job (or changed
                it): no agent is started or stopped.
        """
        await resize_job(self, f"ProcessJob {self.name!r}", self.meshes, name, hosts,
                         partial(self._add, name), partial(self._remove, name))

    async def _add(self, name: str, n: int) -> HostMesh:
        entry = self._entry
        assert entry is not None
        added: list[dict[str, Any]] = []
        try:
            for _ in range(n):
                added.append(await self._start_agent(Path(entry["secret_file"])))
        except BaseException:
            _kill_agents({"hosts": {name: added}})
            raise
        return self._added(name, added)

    async def _remove(self, name: str, n: int) -> None:
        assert self._entry is not None
        agents: list[dict[str, Any]] = self._entry["hosts"][name]
        _kill_agents({"hosts": {name: agents[len(agents) - n:]}})
        self._removed(name, n)

    async def kill(self) -> None:
        """Stop the agents the cache names (whatever its shape), and forget
        the cached job and its secret (the job's lock file and the agents'
        log ``<name>.log`` stay: see :func:`job_lock`, and the log tells
        why an agent did not start).  It holds the job's lock, as
        :meth:`apply` does: a kill while another controller applies the job
        waits for it, then stops the agents it started.

        Raises:
            JobCacheError: the cache file or directory is unsafe, or the
                cache is not a meshio cache or holds a job of another kind
                (nothing is removed).
        """
        await super().kill()

    async def _kill_locked(self) -> None:
        entry = self._entry or read_own_cache(self.cache, self.kind)
        if entry is not None:
            _kill_agents(entry)
            Path(entry["secret_file"]).unlink(missing_ok=True)
        self.cache.unlink(missing_ok=True)
        self._entry = None
        self._state = None


def _agent_error(log_path: Path, logged: int, line: bytes, timed_out: bool) -> str:
    """Why an agent did not start: the last line it wrote to the job's log
    (from offset ``logged`` on), or what it printed instead of its address
    (``line``), or that it printed nothing within the start timeout."""
    with open(log_path, "rb") as f:
        f.seek(logged)
        said = f.read().decode(errors="replace").strip().splitlines()
    last = said[-1] if said else ""
    if timed_out:
        return (f"it printed no address within {AGENT_START_TIMEOUT:g}s and was killed"
                + (f"; its last line: {last}" if last else ""))
    if last:
        return last
    if line:
        return f"it printed {line.decode(errors='replace').strip()!r}, not its address"
    return "it exited without a word"


def attached(entry: dict[str, Any], tls: TLSConfig | None) -> JobState:
    """The host meshes of a cached job whose agents are listed by address
    (``entry["hosts"]``: mesh name → agents ``{"addr": ...}``).

    Raises:
        JobCacheError: its secret file is missing, or unsafe
            (:func:`read_job_secret`).
    """
    secret_file = Path(entry["secret_file"])
    secret = read_job_secret(secret_file)
    if secret is None:
        raise JobCacheError(f"job secret {secret_file}, named by the job's cache, is missing; "
                            "kill() the job and start it again.")
    return JobState({mesh: attach([a["addr"] for a in agents], secret=secret, tls=tls)
                     for mesh, agents in entry["hosts"].items()})


def write_secret(path: Path, secret: bytes) -> None:
    """A job secret file, readable by this user only.

    Raises:
        JobCacheError: its directory is another user's, or others may write
            to it (:func:`_write_private`).
    """
    _write_private(path, secret.hex().encode())


def _kill_agents(entry: dict[str, Any]) -> None:
    """SIGTERM the cached job's agents that are still the processes it started."""
    for agents in entry["hosts"].values():
        for a in agents:
            if _start_time(a["pid"]) == a["start"]:
                try:
                    os.kill(a["pid"], 15)
                except ProcessLookupError:
                    pass
