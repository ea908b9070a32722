"""Kubernetes jobs: host agents as pods, reached at stable DNS names.

:class:`KubernetesJob` generates, for each mesh, a headless Service and an
Indexed Job (or a StatefulSet) whose pods run ``meshio agent``; the job
secret (and the TLS certificate, when given) travel in Kubernetes Secrets
mounted into the pods.  :meth:`KubernetesJob.manifests` returns these
objects, for ``kubectl apply`` or any other tool; :meth:`KubernetesJob.apply`
creates them with the official ``kubernetes`` client when a cluster is
configured (a kubeconfig, or the pod's service account in the cluster) and
waits for every agent to be ready.  Pod ``i`` of mesh ``trainers`` of job
``job`` is ``job-trainers-i.job-trainers.<namespace>.svc``: the address
:meth:`KubernetesJob.state` attaches to (or the pods' IPs, for a
controller outside the cluster).  Like a :class:`~meshio.jobs.ProcessJob`,
the job is cached in ``.meshio/`` and a second run of the controller
re-attaches to the same live pods.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import contextvars
import importlib
import logging
import os
import re
import secrets
import threading
import time
from collections.abc import Callable, Generator, Mapping
from functools import partial
from pathlib import Path
from typing import Any, Literal, TypeVar, cast

from .._checks import check_seconds
from .._proc_mesh import HostMesh
from .._transport._tasks import to_the_end
from .._transport._tls import TLSConfig
from ._agent import tls_flags
from ._job import (
    CachedJob,
    ClusterError,
    JobState,
    check_cache_dir,
    check_meshes,
    check_tls,
    not_cached,
    read_job_secret,
    read_own_cache,
    record_resize,
    resize_job,
    write_cache,
    write_secret,
)
from ._remote import attach

__all__ = ("ClusterError", "ClusterNotConfiguredError", "KubernetesJob")

log = logging.getLogger("meshio")

T = TypeVar("T")

#: where the job secret and the TLS files are mounted in an agent's pod
SECRET_DIR = "/etc/meshio/secret"
TLS_DIR = "/etc/meshio/tls"
#: labels meshio puts on everything it generates
JOB_LABEL = "meshio.dev/job"
MESH_LABEL = "meshio.dev/mesh"
#: seconds one request to the API server may take (less when less is left
#: of the call's ``start_timeout``: :func:`_request_timeout`)
REQUEST_TIMEOUT = 30
#: a pod's container waiting for one of these will not start by itself
_BROKEN = frozenset({"ImagePullBackOff", "InvalidImageName", "CreateContainerConfigError",
                     "CreateContainerError", "CrashLoopBackOff"})
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
#: object kind -> (API class, method suffix) of the official client
_APIS = {"Secret": ("CoreV1Api", "namespaced_secret"),
         "Service": ("CoreV1Api", "namespaced_service"),
         "Job": ("BatchV1Api", "namespaced_job"),
         "StatefulSet": ("AppsV1Api", "namespaced_stateful_set")}


class ClusterNotConfiguredError(RuntimeError):
    """Raised by :class:`KubernetesJob`'s ``apply()``, ``state()`` and
    ``kill()`` when there is no cluster to talk to: no kubeconfig
    (``$KUBECONFIG``, ``~/.kube/config``) or one that is not valid, not
    running in a pod with a service account, or the ``kubernetes`` package
    is not installed."""


def _kubernetes() -> Any:
    """The official client.  Imported here, on first use: it is an optional
    and heavy dependency that only ``apply()``/``kill()`` need (and untyped,
    so used as ``Any``)."""
    try:
        return importlib.import_module("kubernetes")
    except ImportError as e:
        raise ClusterNotConfiguredError(
            "KubernetesJob needs the official Kubernetes client to create its objects: "
            "pip install kubernetes (or apply job.manifests() with kubectl)") from e


class KubernetesJob(CachedJob):
    """Host agents as pods of a Kubernetes cluster: for each mesh, a headless
    Service and an Indexed Job (``workload="job"``, the default) or a
    StatefulSet (``workload="statefulset"``) of ``meshes[name]`` pods, each
    running ``meshio agent`` in ``image`` (which must have meshio installed).

    Args:
        meshes: host count per mesh name, e.g. ``{"trainers": 2}``.
        image: the agents' container image.
        namespace: the namespace of every object.
        name: the job's name (a DNS label), prefix of every object's name.
        workload: ``"job"``: an Indexed Job, which ends once its agents
            exit (``idle_timeout``); ``"statefulset"``: pods that are
            restarted until the job is killed.
        port: the agents' TCP port.
        env: environment of the agents (and so of their workers).
        resources: the agent container's ``resources`` (requests and
            limits, e.g. ``{"limits": {"nvidia.com/gpu": 8}}``).
        pod_spec: more fields of the pods' spec (``nodeSelector``,
            ``tolerations``, ``serviceAccountName``, ...).
        tls: TLS for every connection of the job: the controller's
            certificate and, unless ``tls_secret`` names one, the agents'
            too (put in a generated Secret).
        tls_secret: an existing ``kubernetes.io/tls`` Secret (keys
            ``tls.crt``, ``tls.key``, ``ca.crt``; cert-manager's layout)
            holding the agents' certificate; needs ``tls``.
        addresses: how the controller reaches the agents: ``"dns"``, their
            stable names (a controller in the cluster); ``"pod-ip"``, their
            pods' IPs, read from the API server (a controller outside the
            cluster, with a route to the pod network).
        idle_timeout: seconds an agent waits without a controller before it
            exits (None: never).
        context: the kubeconfig context (default: its current one).
        cache_dir: where the job cache and the job secret are kept.
        start_timeout: seconds ``apply()`` has to create the job's objects
            and see every agent's pod ready, and ``kill()`` to delete them
            and see them gone (finite: the API server's watch takes whole
            seconds); each request to the API server gets what is left of
            it, at most 30 s, and one that gets no answer is not sent again.

    Raises:
        ValueError: a name that does not make valid Kubernetes names, a
            bad option (a ``pod_spec`` that sets ``containers`` or
            ``volumes``, which meshio makes: the agent's container and its
            secrets), or seconds out of range (``idle_timeout`` or
            ``start_timeout`` not > 0, NaN, an int no float holds).
        TypeError: an argument of the wrong type (an ``env`` value that is
            not a str, a ``tls`` that is not a ``TLSConfig``, seconds that
            are no number).
    """

    kind = "KubernetesJob"

    def __init__(self, meshes: Mapping[str, int], *, image: str, namespace: str = "default",
                 name: str = "job", workload: Literal["job", "statefulset"] = "job",
                 port: int = 29500, env: Mapping[str, str] | None = None,
                 resources: Mapping[str, Any] | None = None,
                 pod_spec: Mapping[str, Any] | None = None, tls: TLSConfig | None = None,
                 tls_secret: str | None = None,
                 addresses: Literal["dns", "pod-ip"] = "dns",
                 idle_timeout: float | None = 600.0, context: str | None = None,
                 cache_dir: str | os.PathLike[str] = ".meshio",
                 start_timeout: float = 600.0) -> None:
        self.meshes: dict[str, int] = check_meshes(meshes)
        for what, value in (("name", name), ("namespace", namespace)):
            if not isinstance(value, str):
                raise TypeError(f"KubernetesJob {what} must be a str (a DNS label), got "
                                f"{type(value).__name__} {value!r}")
            if not _DNS_LABEL.fullmatch(value) or len(value) > 63:
                raise ValueError(f"KubernetesJob {what} {value!r} must be a DNS label: lower-case "
                                 "letters, digits and -, at most 63 characters")
        if workload not in ("job", "statefulset"):
            raise ValueError(f"workload must be 'job' or 'statefulset', got {workload!r}")
        if addresses not in ("dns", "pod-ip"):
            raise ValueError(f"addresses must be 'dns' or 'pod-ip', got {addresses!r}")
        if isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536:
            raise ValueError(f"port must be a TCP port (1-65535), got {port!r}")
        if tls_secret is not None and tls is None:
            raise ValueError("tls_secret names the agents' certificate; the controller needs "
                             "its own: pass tls=TLSConfig(...) too")
        this = f"KubernetesJob {name!r}"
        if not isinstance(image, str) or not image:
            raise ValueError(f"{this}: image must name the agents' container image, got "
                             f"{image!r}")
        if idle_timeout is not None:
            idle_timeout = check_seconds(idle_timeout, "KubernetesJob", "idle_timeout",
                                         also=" or None")
        # (finite: the watch of the pods takes whole seconds)
        start_timeout = check_seconds(start_timeout, "KubernetesJob", "start_timeout", inf=False)
        for what, given in (("env", env), ("resources", resources), ("pod_spec", pod_spec)):
            if given is not None and not (isinstance(given, Mapping)
                                          and all(isinstance(k, str) for k in given)):
                raise TypeError(f"{this}: {what} must be a mapping with str keys, got "
                                f"{type(given).__name__} {given!r}")
        for key, value in (env or {}).items():
            if not isinstance(value, str):
                raise TypeError(f"{this}: env[{key!r}] must be a str (a container's "
                                f"environment holds strings), got {type(value).__name__} "
                                f"{value!r}")
        made = sorted({"containers", "volumes"} & set(pod_spec or {}))
        if made:
            raise ValueError(f"{this}: pod_spec must not set {made}: meshio makes the pods' "
                             "containers and volumes (the agent's container, its secrets); "
                             "use image, env and resources for the agent's container")
        self.name: str = name
        self.namespace: str = namespace
        self.image: str = image
        self.workload: Literal["job", "statefulset"] = workload
        self.port: int = port
        self.env: dict[str, str] = dict(env or {})
        self.resources: dict[str, Any] = dict(resources or {})
        self.pod_spec: dict[str, Any] = dict(pod_spec or {})
        self.tls: TLSConfig | None = check_tls(this, tls)
        self.tls_secret: str | None = tls_secret
        self.addresses: Literal["dns", "pod-ip"] = addresses
        self.idle_timeout: float | None = idle_timeout
        self.context: str | None = context
        self.start_timeout: float = start_timeout
        self.cache: Path = check_cache_dir("KubernetesJob", cache_dir) / f"{name}.json"
        self.secret_file: Path = self.cache.with_suffix(".secret")
        self._objects: dict[str, str] = {}  # mesh -> object name (of its Service and workload)
        for mesh, n in self.meshes.items():
            obj = f"{name}-{mesh.lower().replace('_', '-')}"
            if obj in self._objects.values():
                raise ValueError(f"meshes {sorted(self.meshes)} make the same object name "
                                 f"{obj!r} (names are lower-cased, _ becomes -)")
            self._objects[mesh] = obj
            self._check_pod_names(mesh, n)
        self._ips: dict[str, str] | None = None  # pod hostname -> IP, once applied
        self._attached: JobState | None = None  # state(), once made

    def _check_pod_names(self, mesh: str, n: int) -> None:
        """Raise ValueError unless the pods of ``n`` hosts of ``mesh`` have
        valid names."""
        obj = self._objects[mesh]
        host = f"{obj}-{n - 1}"
        if not _DNS_LABEL.fullmatch(obj) or len(host) > 63:
            raise ValueError(f"mesh {mesh!r} of job {self.name!r} makes the pod name {host!r}, "
                             "not a DNS label (lower-case letters, digits and -, at most "
                             "63 characters): choose shorter or other names")

    # -------------------------------------------------------------- manifests

    def hostnames(self) -> dict[str, list[str]]:
        """The agents' stable DNS names, per mesh, in index order:
        ``<pod>.<service>.<namespace>.svc``."""
        return {mesh: [f"{obj}-{i}.{obj}.{self.namespace}.svc" for i in range(self.meshes[mesh])]
                for mesh, obj in self._objects.items()}

    def manifests(self) -> list[dict[str, Any]]:
        """The job's Kubernetes objects, as dicts (``kubectl apply`` takes
        them as JSON or YAML): the Secret with the job secret, a TLS Secret
        when ``tls`` is given without ``tls_secret``, and for each mesh a
        headless Service and its Indexed Job or StatefulSet.

        The job secret is read from ``<cache_dir>/<name>.secret``, which is
        made (mode 0600) if it does not exist, so the controller holds the
        same secret as the pods.

        Raises:
            JobCacheError: the secret file is another user's, or others may
                read or write it.
        """
        secret = self._job_secret()
        docs: list[dict[str, Any]] = [{
            "apiVersion": "v1", "kind": "Secret",
            "metadata": self._metadata(f"{self.name}-secret"),
            "type": "Opaque",
            "data": {"secret": base64.b64encode(secret).decode()},
        }]
        tls = self.tls
        if tls is not None and self.tls_secret is None:
            files = {"tls.crt": tls.cert, "tls.key": tls.key, "ca.crt": tls.ca}
            docs.append({
                "apiVersion": "v1", "kind": "Secret",
                "metadata": self._metadata(f"{self.name}-tls"),
                "type": "kubernetes.io/tls",
                "data": {key: base64.b64encode(Path(path).read_bytes()).decode()
                         for key, path in files.items()},
            })
        for mesh in self.meshes:
            docs += [self._service(mesh), self._workload(mesh)]
        return docs

    def _metadata(self, name: str, mesh: str | None = None) -> dict[str, Any]:
        labels = {"app.kubernetes.io/name": "meshio-agent",
                  "app.kubernetes.io/managed-by": "meshio", JOB_LABEL: self.name}
        if mesh is not None:
            labels[MESH_LABEL] = self._objects[mesh].removeprefix(f"{self.name}-")
        return {"name": name, "namespace": self.namespace, "labels": labels}

    def _service(self, mesh: str) -> dict[str, Any]:
        obj = self._objects[mesh]
        meta = self._metadata(obj, mesh)
        return {
            "apiVersion": "v1", "kind": "Service",
            "metadata": meta,
            "spec": {
                "clusterIP": "None",  # headless: a DNS name per pod, no proxy
                # an agent's name resolves as soon as its pod has an IP
                "publishNotReadyAddresses": True,
                "selector": {JOB_LABEL: self.name, MESH_LABEL: meta["labels"][MESH_LABEL]},
                "ports": [{"name": "agent", "port": self.port, "targetPort": self.port,
                           "protocol": "TCP"}],
            },
        }

    def agent_command(self) -> list[str]:
        """The command each pod runs (``$(POD_IP)`` is expanded by Kubernetes
        from the pod's environment)."""
        argv = ["meshio", "agent", "--listen", f"0.0.0.0:{self.port}",
                "--advertise", "$(POD_IP)", "--secret-file", f"{SECRET_DIR}/secret"]
        if self.idle_timeout is not None:
            argv += ["--idle-timeout", f"{self.idle_timeout:g}"]
        if self.tls is not None:
            argv += tls_flags(f"{TLS_DIR}/tls.crt", f"{TLS_DIR}/tls.key", f"{TLS_DIR}/ca.crt",
                              mutual=self.tls.mutual, check_hostname=self.tls.check_hostname)
        return argv

    def _workload(self, mesh: str) -> dict[str, Any]:
        obj = self._objects[mesh]
        meta = self._metadata(obj, mesh)
        container: dict[str, Any] = {
            "name": "agent",
            "image": self.image,
            "command": self.agent_command(),
            "env": [{"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
                    *({"name": k, "value": v} for k, v in self.env.items())],
            "ports": [{"name": "agent", "containerPort": self.port, "protocol": "TCP"}],
            # ready once the agent listens (it logs the probe's connection,
            # which proves no secret, once); a startup probe stops then
            "startupProbe": {"tcpSocket": {"port": self.port}, "periodSeconds": 1,
                             "failureThreshold": 300},
            "volumeMounts": [{"name": "meshio-secret", "mountPath": SECRET_DIR,
                              "readOnly": True}],
        }
        volumes: list[dict[str, Any]] = [{"name": "meshio-secret", "secret": {
            "secretName": f"{self.name}-secret", "defaultMode": 0o440}}]
        if self.tls is not None:
            container["volumeMounts"].append({"name": "meshio-tls", "mountPath": TLS_DIR,
                                              "readOnly": True})
            volumes.append({"name": "meshio-tls", "secret": {
                "secretName": self.tls_secret or f"{self.name}-tls", "defaultMode": 0o440}})
        if self.resources:
            container["resources"] = self.resources
        pod = {
            "metadata": {"labels": meta["labels"]},
            "spec": {
                # restartPolicy: a failed agent restarts in its pod, at the same name
                "restartPolicy": "OnFailure" if self.workload == "job" else "Always",
                "containers": [container],
                "volumes": volumes,
                **self.pod_spec,
            },
        }
        if self.workload == "job":
            pod["spec"]["subdomain"] = obj  # <job>-<index>.<subdomain>: the DNS name
            return {"apiVersion": "batch/v1", "kind": "Job", "metadata": meta, "spec": {
                "completionMode": "Indexed",
                "completions": self.meshes[mesh],
                "parallelism": self.meshes[mesh],
                "backoffLimit": 6 * self.meshes[mesh],
                "template": pod,
            }}
        return {"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": meta, "spec": {
            "serviceName": obj,
            "replicas": self.meshes[mesh],
            "podManagementPolicy": "Parallel",
            "selector": {"matchLabels": {k: meta["labels"][k] for k in (JOB_LABEL, MESH_LABEL)}},
            "template": pod,
        }}

    def _job_secret(self) -> bytes:
        """The job secret in ``self.secret_file``, made if missing.

        Raises:
            JobCacheError: the file is unsafe (:func:`read_job_secret`), or
                its directory (:func:`write_secret`).
        """
        secret = read_job_secret(self.secret_file)
        if secret is None:
            write_secret(self.secret_file, secrets.token_bytes(32))
            secret = read_job_secret(self.secret_file)
            assert secret is not None  # (just written)
        return secret

    # -------------------------------------------------------------- job protocol

    def attach(self) -> JobState:
        """The job's host meshes at the agents' stable DNS names, contacting
        nothing: for a controller in the cluster whose objects were applied
        some other way (``kubectl apply``)."""
        return self._state(self.hostnames())

    def _state(self, hosts: Mapping[str, list[str]]) -> JobState:
        secret = self._job_secret()
        return JobState({mesh: attach([f"tcp://{h}:{self.port}" for h in names], secret=secret,
                                      tls=self.tls)
                         for mesh, names in hosts.items()})

    async def apply(self) -> None:
        """Create the job's objects (or re-attach to the cached live ones)
        and wait until every agent's pod is ready.  One ``apply()`` or
        ``kill()`` of a job name runs at a time (the job's lock,
        ``<cache_dir>/<name>.lock``): another, in this process or another,
        waits for it, then re-attaches to the objects it created.
        Cancelled while it talks to the API server, it makes no other
        request, lets the lock go only once the one under way is done (what
        it created is then in the cache, for the next ``apply()`` or
        ``kill()``), then raises ``CancelledError``; so do ``resize()`` and
        ``kill()``.  One that fails to create the job's objects deletes
        those it created and leaves no cache, nor the secret file it made.

        Raises:
            ClusterNotConfiguredError: no cluster is configured.
            ClusterError: the cluster refused an object or a pod cannot start.
            TimeoutError: pods not ready within ``start_timeout``.
            JobCacheError: an unsafe cache, secret file or cache directory.
        """
        await super().apply()

    def _applied(self) -> bool:
        return self._ips is not None

    def _check_cached(self, what: str) -> None:
        cached = read_own_cache(self.cache, self.kind)
        if cached is not None and (cached.get("meshes"), cached.get("namespace"),
                                   cached.get("workload")) == (self.meshes, self.namespace,
                                                               self.workload):
            return
        self._ips = None
        self._attached = None
        raise not_cached(what, self.cache, cached)

    async def _apply_locked(self) -> None:
        self._ips = await _in_thread(self.start_timeout, self._apply)

    async def state(self) -> JobState:
        """The job's host meshes by name (``apply()`` first if needed)."""
        await self.apply()
        if self._attached is None:  # (one per job: resize changes its host meshes)
            self._attached = self._state(self._hosts())
        return self._attached

    def _hosts(self) -> dict[str, list[str]]:
        """How the controller reaches each mesh's agents (see ``addresses``)."""
        ips = self._ips
        assert ips is not None
        hosts = self.hostnames()
        if self.addresses == "pod-ip":
            hosts = {mesh: [ips[h.split(".", 1)[0]] for h in names]
                     for mesh, names in hosts.items()}
        return hosts

    async def resize(self, name: str, /, *, hosts: int) -> None:
        """Patch the mesh's StatefulSet to ``hosts`` replicas.  Growing, it
        waits until the new pods are ready, then the host mesh and its
        elastic proc meshes grow onto them; shrinking, one pod at a time,
        the last first, those proc meshes stop their processes on it, then
        a patch removes it (a StatefulSet removes the highest ordinal).
        :meth:`manifests` and the cache give the new replica count.  See
        :meth:`Job.resize`.

        Raises:
            ValueError: a pod name too long, or the job's workload is
                ``"job"`` (an Indexed Job's size is fixed).
            ClusterNotConfiguredError, ClusterError, TimeoutError: as for
                :meth:`apply` (new pods not ready in ``start_timeout``).
            JobCacheError: another controller killed the job, or applied
                one of another shape (nothing is patched).
        """
        if name in self.meshes and self.workload != "statefulset":
            raise ValueError(f"KubernetesJob {self.name!r}.resize({name!r}): workload="
                             f"{self.workload!r}, an Indexed Job of fixed size; make the job "
                             f"with workload='statefulset' to resize it")
        if name in self.meshes and isinstance(hosts, int) and hosts >= 1:
            self._check_pod_names(name, hosts)
        await resize_job(self, f"KubernetesJob {self.name!r}", self.meshes, name, hosts,
                         partial(self._add, name), partial(self._remove, name))

    async def _add(self, name: str, n: int) -> HostMesh:
        old = self.meshes[name]
        self._ips = await _in_thread(self.start_timeout, self._scale, name, old + n)
        return self._state({name: self._hosts()[name][old:]}).meshes[name]

    async def _remove(self, name: str, n: int) -> None:
        await _in_thread(self.start_timeout, self._scale, name,
                         self.meshes[name] - n)

    def _scale(self, name: str, hosts: int) -> dict[str, str]:
        """Patch mesh ``name``'s StatefulSet to ``hosts`` replicas, record it,
        and wait for its pods; every agent's pod IP."""
        k8s, api = _client(self.context)
        entry = read_own_cache(self.cache, self.kind)
        assert entry is not None  # (checked under the job's lock: _check_cached)
        obj = self._objects[name]
        with _reaching(self.name):
            _call(k8s, f"scale StatefulSet {obj}",
                  self._method(k8s, api, "StatefulSet", "patch"), obj, self.namespace,
                  {"spec": {"replicas": hosts}})
            record_resize(self.cache, entry, self.meshes, name, hosts)
            return self._wait_ready(k8s, api, entry["uids"])

    async def kill(self) -> None:
        """Delete the job's objects (their pods with them), wait until the
        API server has removed them (so that a job of the same name can be
        applied at once), and forget the cached job and its secret.  It
        holds the job's lock, as :meth:`apply` does: a kill while another
        controller applies the job waits for it, then deletes what it
        created.

        Raises:
            ClusterNotConfiguredError: no cluster is configured.
            ClusterError: the cluster refused a deletion.
            TimeoutError: objects still there after ``start_timeout`` (a
                finalizer that does not finish); the cache is kept.
            JobCacheError: an unsafe cache file or cache directory, or a
                cache that holds a job of another kind.
        """
        await super().kill()

    async def _kill_locked(self) -> None:
        await _in_thread(self.start_timeout, self._kill, _client(self.context))
        self.cache.unlink(missing_ok=True)
        self.secret_file.unlink(missing_ok=True)
        self._ips = None
        self._attached = None

    # ------------------------------------------------------ the client (a thread)

    def _kill(self, client: tuple[Any, Any]) -> None:
        self._release_other(*client)
        self._delete(client)

    def _apply(self) -> dict[str, str]:
        k8s, api = _client(self.context)
        with _reaching(self.name):
            return self._apply_with(k8s, api)

    def _apply_with(self, k8s: Any, api: Any) -> dict[str, str]:
        self._release_other(k8s, api)
        entry = read_own_cache(self.cache, self.kind)
        made_secret = not self.secret_file.exists()  # (manifests() makes it)
        docs = self.manifests()
        if entry is not None:
            gone = self._gone(k8s, api, docs, entry["uids"])
            if not gone:
                return self._wait_ready(k8s, api, entry["uids"])
            log.warning("meshio: job cache %s is stale (%s); starting a new job", self.cache,
                        "; ".join(gone))
            self._delete((k8s, api))
        uids: dict[str, str] = {}
        try:
            for doc in docs:
                kind, name = doc["kind"], doc["metadata"]["name"]
                made = _call(k8s, f"create {kind} {name}",
                             self._method(k8s, api, kind, "create"), self.namespace, doc)
                uids[f"{kind}/{name}"] = made.metadata.uid
        except BaseException:
            # What this call made (never a namesake found there) is named by
            # the cache until it is deleted: a cancelled call makes no more
            # requests, a failed deletion leaves it for kill().
            self._write_cache(uids)
            for made_as in uids:
                kind, name = made_as.split("/")
                self._delete_one(k8s, api, self.namespace, kind, name)
            self.cache.unlink()
            if made_secret:
                self.secret_file.unlink(missing_ok=True)
            raise
        self._write_cache(uids)
        return self._wait_ready(k8s, api, uids)

    def _write_cache(self, uids: Mapping[str, str]) -> None:
        write_cache(self.cache, {"kind": self.kind, "meshes": self.meshes,
                                 "namespace": self.namespace, "workload": self.workload,
                                 "uids": uids, "secret_file": str(self.secret_file)})

    @staticmethod
    def _method(k8s: Any, api: Any, kind: str, verb: str) -> Any:
        cls, suffix = _APIS[kind]
        return getattr(getattr(k8s.client, cls)(api), f"{verb}_{suffix}")

    def _read(self, k8s: Any, api: Any, ns: str, kind: str, name: str) -> Any | None:
        """The live object ``kind``/``name`` of namespace ``ns``; None if there is none."""
        try:
            return self._method(k8s, api, kind, "read")(name, ns,
                                                        _request_timeout=_request_timeout())
        except k8s.client.ApiException as e:
            if e.status != 404:
                raise _api_error(f"read {kind} {name}", e) from e
            return None

    def _gone(self, k8s: Any, api: Any, docs: list[dict[str, Any]],
              uids: Mapping[str, str]) -> list[str]:
        """Why the cached job's objects are not the live job, if they are not."""
        gone: list[str] = []
        for doc in docs:
            kind, name = doc["kind"], doc["metadata"]["name"]
            live = self._read(k8s, api, self.namespace, kind, name)
            if live is None:
                gone.append(f"{kind} {name} is gone")
            elif live.metadata.uid != uids.get(f"{kind}/{name}"):
                gone.append(f"{kind} {name} is another object of that name")
            elif kind == "Job" and any(c.type in ("Complete", "Failed") and c.status == "True"
                                       for c in _items(getattr(live.status, "conditions", None))):
                gone.append(f"Job {name} has ended")
        return gone

    def _wait_ready(self, k8s: Any, api: Any, uids: Mapping[str, str]) -> dict[str, str]:
        """Watch the job's pods until one of each hostname is ready; their IPs.
        Only pods of this job's workloads count (``uids``), not those of an
        earlier job of this name that are still going away."""
        want = {h.split(".", 1)[0] for names in self.hostnames().values() for h in names}
        owners = {uid for key, uid in uids.items() if not key.startswith(("Secret/", "Service/"))}
        ready: dict[str, tuple[str, str]] = {}  # pod uid -> (hostname, IP)
        watch = k8s.watch.Watch()
        core = k8s.client.CoreV1Api(api)
        try:
            for event in watch.stream(core.list_namespaced_pod, self.namespace,
                                      label_selector=f"{JOB_LABEL}={self.name}",
                                      timeout_seconds=max(1, int(_TALK.get().left()))):
                pod = event["object"]
                host = pod.spec.hostname or pod.metadata.name
                if host not in want or not any(
                        o.uid in owners for o in _items(pod.metadata.owner_references)):
                    continue
                status = pod.status
                if status is None:
                    continue
                waiting = [(c.name, c.state.waiting.reason, c.state.waiting.message)
                           for c in _items(status.container_statuses)
                           if c.state is not None and c.state.waiting is not None]
                broken = [w for w in waiting if w[1] in _BROKEN]
                if broken:
                    raise ClusterError(
                        f"KubernetesJob {self.name!r}: pod {pod.metadata.name} cannot start: "
                        f"{broken[0][1]}: {broken[0][2] or ''} (kubectl describe pod "
                        f"{pod.metadata.name} -n {self.namespace})")
                if (event["type"] != "DELETED" and pod.metadata.deletion_timestamp is None
                        and status.pod_ip and any(c.type == "Ready" and c.status == "True"
                                                  for c in _items(status.conditions))):
                    ready[pod.metadata.uid] = (host, status.pod_ip)
                else:
                    ready.pop(pod.metadata.uid, None)
                if want <= {h for h, _ in ready.values()}:
                    return dict(ready.values())
        except k8s.client.ApiException as e:
            raise _api_error("watch pods", e) from e
        finally:
            watch.stop()
        missing = sorted(want - {h for h, _ in ready.values()})
        raise TimeoutError(f"KubernetesJob {self.name!r}: pods {missing} not ready after "
                           f"{self.start_timeout:g} s (kubectl get pods -n {self.namespace} "
                           f"-l {JOB_LABEL}={self.name})")

    def _delete(self, client: tuple[Any, Any]) -> None:
        """Delete the job's objects and wait until they are gone."""
        k8s, api = client
        workload = "Job" if self.workload == "job" else "StatefulSet"
        objects = [(kind, obj) for obj in self._objects.values()
                   for kind in (workload, "Service")]
        objects.append(("Secret", f"{self.name}-secret"))
        if self.tls_secret != f"{self.name}-tls":  # never the user's own
            objects.append(("Secret", f"{self.name}-tls"))
        with _reaching(self.name):
            deleted = [(kind, name) for kind, name in objects
                       if self._delete_one(k8s, api, self.namespace, kind, name)]
            self._wait_gone(k8s, api, self.namespace, deleted)

    def _release_other(self, k8s: Any, api: Any) -> None:
        """Give back the job the cache names if it is not this job (other
        meshes, namespace or workload: a script whose job changed shape),
        rather than orphan it: delete the objects it made (those with the
        uids it recorded, never a namesake) and forget it."""
        entry = read_own_cache(self.cache, self.kind)
        if entry is None or (entry.get("meshes"), entry.get("namespace"),
                             entry.get("workload")) == (self.meshes, self.namespace,
                                                        self.workload):
            return
        ns, recorded = entry.get("namespace"), entry.get("uids")
        log.warning("meshio: job cache %s holds a job with meshes %s in namespace %s (%s), not "
                    "this one's; deleting its objects", self.cache, entry.get("meshes"), ns,
                    entry.get("workload"))
        if isinstance(ns, str) and isinstance(recorded, dict):
            uids = cast(dict[str, str], recorded)
            objects = [(kind, name) for kind, _, name in (key.partition("/") for key in uids)
                       if kind in _APIS]
            with _reaching(self.name):
                deleted = [(kind, name) for kind, name in objects
                           if (live := self._read(k8s, api, ns, kind, name)) is not None
                           and live.metadata.uid == uids[f"{kind}/{name}"]
                           and self._delete_one(k8s, api, ns, kind, name)]
                self._wait_gone(k8s, api, ns, deleted)
        self.cache.unlink()

    def _delete_one(self, k8s: Any, api: Any, ns: str, kind: str, name: str) -> bool:
        """Delete one object of namespace ``ns``; whether there was one."""
        try:
            # Background: the Job's or StatefulSet's pods go too.  The answer
            # (the object or a Status, by kind and version) is not decoded.
            self._method(k8s, api, kind, "delete")(name, ns,
                                                   propagation_policy="Background",
                                                   _preload_content=False,
                                                   _request_timeout=_request_timeout()).read()
        except k8s.client.ApiException as e:
            if e.status != 404:
                raise _api_error(f"delete {kind} {name}", e) from e
            return False
        return True

    def _wait_gone(self, k8s: Any, api: Any, ns: str, objects: list[tuple[str, str]]) -> None:
        """Wait until the deleted ``objects`` are gone: one with a finalizer
        stays, terminating, and creating its name again meanwhile is refused
        (409).  An object of that name not terminating is a new one, not
        waited for."""
        talk = _TALK.get()
        delay = 0.1
        while True:
            left = [(kind, name) for kind, name in objects
                    if (live := self._read(k8s, api, ns, kind, name)) is not None
                    and live.metadata.deletion_timestamp is not None]
            if not left:
                return
            if talk.left() <= 0:
                raise TimeoutError(
                    f"KubernetesJob {self.name!r}: {', '.join(f'{k} {n}' for k, n in left)} "
                    f"still terminating after {self.start_timeout:g} s (a finalizer that does "
                    f"not finish? kubectl get {left[0][0].lower()} {left[0][1]} -n "
                    f"{ns} -o yaml)")
            talk.stop.wait(min(delay, max(0.0, talk.left())))
            delay = min(2 * delay, 2.0)
            objects = left


class _Talk:
    """The requests to the API server of one call (``apply()``, ``kill()``,
    a resize's step), made by :func:`_in_thread`'s thread: they have
    ``seconds`` from the call's start, and none is made once ``stop`` is
    set (the call was cancelled)."""

    def __init__(self, seconds: float) -> None:
        self.deadline = time.monotonic() + seconds
        self.stop = threading.Event()

    def left(self) -> float:
        """Seconds left to the call (<= 0: none).

        Raises:
            CancelledError: the call was cancelled; it makes no more requests.
        """
        if self.stop.is_set():
            raise asyncio.CancelledError
        return self.deadline - time.monotonic()


#: the call whose requests this thread makes (set by :func:`_in_thread`)
_TALK: contextvars.ContextVar[_Talk] = contextvars.ContextVar("_TALK")


def _request_timeout() -> float:
    """Seconds the next request of this thread's call may take: what is left
    of the call's time, at most ``REQUEST_TIMEOUT``, at least 1 (a request
    made at the deadline gets its answer or its error, not a hang).

    Raises:
        CancelledError: the call was cancelled.
    """
    return min(REQUEST_TIMEOUT, max(1.0, _TALK.get().left()))


async def _in_thread(seconds: float, fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)`` in a thread (the client blocks), under the job's lock,
    its requests given ``seconds`` in all (:func:`_request_timeout`).
    Cancelled, this lets the thread finish the request under way but make
    no other (so a cancelled call waits for one request, at most
    ``REQUEST_TIMEOUT``), waits until the thread is done, then raises
    ``CancelledError``: the thread cannot be stopped halfway, and had the
    lock been let go at once it would go on creating or deleting objects
    and writing the cache while another controller applies or kills the job
    (which then misses them)."""
    talk = _Talk(seconds)
    context = contextvars.copy_context()
    context.run(_TALK.set, talk)
    done = asyncio.get_running_loop().run_in_executor(None, context.run, partial(fn, *args))
    try:
        return await asyncio.shield(done)
    except asyncio.CancelledError:
        talk.stop.set()
        with contextlib.suppress(Exception):  # (its outcome: the call was cancelled)
            await to_the_end(done)
        raise


def _client(context: str | None, *, retries: int = 3) -> tuple[Any, Any]:
    """The ``kubernetes`` module and an API client for the configured
    cluster: in-cluster (a pod's service account) or the kubeconfig.  A
    request that fails to connect is sent again, up to ``retries`` times;
    one that got no answer in its time is not (that time was its call's).

    Raises:
        ClusterNotConfiguredError: no ``kubernetes`` package, no cluster
            configured, or a kubeconfig that is not valid.
    """
    k8s = _kubernetes()
    urllib3 = importlib.import_module("urllib3")  # the client's own HTTP library
    cfg = k8s.client.Configuration()
    cfg.retries = urllib3.Retry(retries, read=0)
    # $KUBECONFIG read now (the client reads it once, when first imported)
    kubeconfig = os.path.expanduser(os.environ.get("KUBECONFIG", "~/.kube/config"))
    try:
        if os.environ.get("KUBERNETES_SERVICE_HOST") and context is None:
            k8s.config.load_incluster_config(client_configuration=cfg)
            return k8s, k8s.client.ApiClient(cfg)
        return k8s, k8s.config.new_client_from_config(config_file=kubeconfig, context=context,
                                                      persist_config=False,
                                                      client_configuration=cfg)
    except (k8s.config.ConfigException, OSError) as e:
        raise ClusterNotConfiguredError(
            f"no Kubernetes cluster is configured ({e}): KubernetesJob needs a kubeconfig "
            "($KUBECONFIG or ~/.kube/config) or to run in a pod with a service account; "
            "without one, apply job.manifests() with kubectl and use job.attach()") from e
    except Exception as e:  # the client's parser fails on what it meets (TypeError, YAMLError)
        reason = " ".join(f"{type(e).__name__}: {e}".split())  # (YAML's errors span lines)
        raise ClusterNotConfiguredError(
            f"the kubeconfig {kubeconfig} is not valid ({reason}): fix it, or point "
            "$KUBECONFIG at a valid one") from e


def probe(timeout: float) -> str:
    """What :class:`KubernetesJob` finds from this host: the configured
    cluster's API server and its version, asked once with ``timeout``
    seconds to answer (``meshio doctor``; blocks, like the client).

    Raises:
        ClusterNotConfiguredError: no ``kubernetes`` package, or no cluster
            configured.
        ClusterError: the API server did not answer in time, or refused.
    """
    k8s, api = _client(None, retries=0)
    urllib3 = importlib.import_module("urllib3")  # the client's own HTTP library
    host = api.configuration.host
    try:
        info = k8s.client.VersionApi(api).get_code(_request_timeout=timeout)
    except k8s.client.ApiException as e:
        raise _api_error("tell its version", e) from e
    except urllib3.exceptions.HTTPError as e:
        raise ClusterError(f"the Kubernetes API server at {host} did not answer (timeout "
                           f"{timeout:g} s): {e}") from e
    finally:
        api.close()
    return f"the API server at {host} answered: Kubernetes {info.git_version}"


@contextlib.contextmanager
def _reaching(job: str) -> Generator[None]:
    """Requests to the API server, whose failure to answer is a ClusterError."""
    urllib3 = importlib.import_module("urllib3")  # the client's own HTTP library
    try:
        yield
    except urllib3.exceptions.HTTPError as e:
        raise ClusterError(f"KubernetesJob {job!r}: the Kubernetes API server did not answer: "
                           f"{e}") from e


def _items(field: Any) -> list[Any]:
    """A list field of an API object (None when empty)."""
    return list(field or ())


def _call(k8s: Any, what: str, fn: Any, *args: Any) -> Any:
    try:
        return fn(*args, _request_timeout=_request_timeout())
    except k8s.client.ApiException as e:
        raise _api_error(what, e) from e


def _api_error(what: str, e: Any) -> ClusterError:
    hint = (": it exists already (another job of this name, or applied with kubectl); "
            "kill() that job or choose another name" if e.status == 409 else "")
    return ClusterError(f"the Kubernetes API refused to {what}: {e.status} {e.reason}{hint} "
                        f"{(e.body or '')[:500]}")
