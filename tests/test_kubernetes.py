"""issue 10: KubernetesJob.  No live cluster is available here, so:

- the generated manifests are validated against the Kubernetes OpenAPI
  schema (``kubernetes-validate``, strict: unknown fields fail) and compared
  with golden files (regenerate them with
  ``MESHIO_REGEN_GOLDEN=1 python -m pytest tests/test_kubernetes.py -k golden``
  and review the diff);
- the agent command in a manifest is run through ``meshio``'s own parser;
- ``apply()``/``state()``/``kill()`` run the official ``kubernetes`` client
  against a small fake API server on loopback (real HTTP, real client); in
  the last test its "kubelet" starts each pod's agent from the pod's own
  command in a network-namespace host, and the controller calls actors on
  them.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import os
import re
import socket
import subprocess
import sys
import threading
import uuid
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import kubernetes_validate
import pytest
import trustme

import meshio._cli
import meshio.jobs._agent as agent_module
from lock_holder import lock_held, lock_wanted
from meshio import Actor, context, endpoint
from meshio.jobs import (
    ClusterError,
    ClusterNotConfiguredError,
    JobCacheError,
    KubernetesJob,
    TLSConfig,
)
from meshio.jobs._job import write_cache, write_secret
from meshio.jobs._kubernetes import JOB_LABEL
from netns_hosts import Host, netns_hosts, requires_netns

GOLDEN = Path(__file__).parent / "golden"
#: the oldest and a recent schema kubernetes-validate ships
SCHEMAS = ("1.25.0", "1.33.0")
SECRET = bytes(range(32))
DEADLINE = 60.0


def golden_jobs(tmp_path: Path) -> dict[str, KubernetesJob]:
    """The jobs of the golden files, with a fixed job secret."""
    cache = tmp_path / ".meshio"
    write_secret(cache / "rl.secret", SECRET)
    ca = trustme.CA()
    cert = ca.issue_cert("*.rl-trainers.ml.svc")
    cert.cert_chain_pems[0].write_to_path(str(tmp_path / "tls.crt"))
    cert.private_key_pem.write_to_path(str(tmp_path / "tls.key"))
    ca.cert_pem.write_to_path(str(tmp_path / "ca.crt"))
    tls = TLSConfig(tmp_path / "tls.crt", tmp_path / "tls.key", tmp_path / "ca.crt")
    return {
        "kubernetes_job": KubernetesJob(
            meshes={"trainers": 2, "generators": 1}, image="ghcr.io/example/meshio:0.1",
            namespace="ml", name="rl", env={"NCCL_DEBUG": "INFO"},
            resources={"limits": {"nvidia.com/gpu": 8}}, cache_dir=cache),
        "kubernetes_statefulset_tls": KubernetesJob(
            meshes={"trainers": 2}, image="ghcr.io/example/meshio:0.1", namespace="ml",
            name="rl", workload="statefulset", port=29600, tls=tls, tls_secret="rl-certs",
            idle_timeout=None, pod_spec={"nodeSelector": {"gpu": "h100"}}, cache_dir=cache),
    }


def as_list(docs: list[dict[str, Any]]) -> str:
    """What ``kubectl apply -f`` takes: one JSON ``List``."""
    return json.dumps({"apiVersion": "v1", "kind": "List", "items": docs}, indent=2) + "\n"


# ------------------------------------------------------------------ manifests

@pytest.mark.parametrize("name", ["kubernetes_job", "kubernetes_statefulset_tls"])
def test_manifests_match_the_golden_files(tmp_path: Path, name: str) -> None:
    rendered = as_list(golden_jobs(tmp_path)[name].manifests())
    path = GOLDEN / f"{name}.json"
    if os.environ.get("MESHIO_REGEN_GOLDEN"):
        path.parent.mkdir(exist_ok=True)
        path.write_text(rendered)
    assert rendered == path.read_text(), f"{path} differs: regenerate (see the module docstring)"


@pytest.mark.parametrize("version", SCHEMAS)
def test_manifests_validate_against_the_kubernetes_schema(tmp_path: Path, version: str) -> None:
    """Every object of every variant (job and statefulset, TLS generated
    or named, env, resources) is valid, unknown fields included."""
    jobs = list(golden_jobs(tmp_path).values())
    tls = jobs[1].tls
    jobs.append(KubernetesJob(meshes={"a": 1, "b_two": 3}, image="meshio:dev", tls=tls,
                              cache_dir=tmp_path / ".meshio"))
    kinds: set[str] = set()
    for job in jobs:
        for doc in job.manifests():
            kubernetes_validate.validate(doc, version, strict=True)
            kinds.add(doc["kind"])
    assert kinds == {"Secret", "Service", "Job", "StatefulSet"}
    # and the check can fail: a misspelt field is refused
    bad = jobs[0].manifests()[-1]
    bad["spec"]["template"]["spec"]["containers"][0]["imagePullPolcy"] = "Always"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, version, strict=True)


def by_kind(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind]


def test_options_are_reflected(tmp_path: Path) -> None:
    """Image, env, ports, resources, TLS (generated Secret with the files'
    contents, mounted, passed to the agent), the job secret and DNS names."""
    ca = trustme.CA()
    cert = ca.issue_cert("x.example")
    files = {"tls.crt": cert.cert_chain_pems[0].bytes(), "tls.key": cert.private_key_pem.bytes(),
             "ca.crt": ca.cert_pem.bytes()}
    for key, data in files.items():
        (tmp_path / key).write_bytes(data)
    tls = TLSConfig(tmp_path / "tls.crt", tmp_path / "tls.key", tmp_path / "ca.crt",
                    mutual=False)
    job = KubernetesJob(meshes={"trainers": 3}, image="reg.example/img:7", namespace="team-a",
                        name="exp1", port=31000, env={"A": "1", "B": "two"},
                        resources={"requests": {"cpu": "2"}}, tls=tls,
                        cache_dir=tmp_path / ".meshio")
    docs = job.manifests()
    secret, tls_secret = by_kind(docs, "Secret")
    assert base64.b64decode(secret["data"]["secret"]) == (tmp_path / ".meshio/exp1.secret"
                                                          ).read_bytes()
    assert tls_secret["type"] == "kubernetes.io/tls"
    assert {k: base64.b64decode(v) for k, v in tls_secret["data"].items()} == files
    (service,) = by_kind(docs, "Service")
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["ports"][0]["port"] == 31000
    (wl,) = by_kind(docs, "Job")
    assert wl["spec"]["completionMode"] == "Indexed" and wl["spec"]["completions"] == 3
    pod = wl["spec"]["template"]["spec"]
    assert pod["subdomain"] == service["metadata"]["name"] == "exp1-trainers"
    (c,) = pod["containers"]
    assert c["image"] == "reg.example/img:7"
    assert c["ports"] == [{"name": "agent", "containerPort": 31000, "protocol": "TCP"}]
    assert c["resources"] == {"requests": {"cpu": "2"}}
    assert {e["name"]: e.get("value") for e in c["env"]} == {"POD_IP": None, "A": "1",
                                                            "B": "two"}
    argv = c["command"]
    assert argv[argv.index("--listen") + 1] == "0.0.0.0:31000"
    assert "--tls-no-mutual" in argv
    assert argv[argv.index("--tls-ca") + 1] == "/etc/meshio/tls/ca.crt"
    assert {v["secret"]["secretName"] for v in pod["volumes"]} == {"exp1-secret", "exp1-tls"}
    assert all(d["metadata"]["namespace"] == "team-a" for d in docs)
    assert job.hostnames() == {"trainers": [f"exp1-trainers-{i}.exp1-trainers.team-a.svc"
                                            for i in range(3)]}
    # the secret is made once and kept: the manifests of a second run match
    again = KubernetesJob(meshes={"trainers": 3}, image="reg.example/img:7", namespace="team-a",
                          name="exp1", port=31000, env={"A": "1", "B": "two"},
                          resources={"requests": {"cpu": "2"}}, tls=tls,
                          cache_dir=tmp_path / ".meshio")
    assert again.manifests() == docs


def test_bad_names_and_options_are_refused(tmp_path: Path) -> None:
    def make(**kw: Any) -> KubernetesJob:
        args: dict[str, Any] = {"meshes": {"trainers": 1}, "image": "i",
                                "cache_dir": tmp_path}
        return KubernetesJob(**(args | kw))

    for kw, match in [({"name": "My_Job"}, "DNS label"), ({"namespace": "a.b"}, "DNS label"),
                      ({"meshes": {"x_": 1}}, "not a DNS label"),
                      ({"name": "n" * 60, "meshes": {"trainers": 1}}, "at most 63"),
                      ({"meshes": {"Ab": 1, "ab": 1}}, "same object name"),
                      ({"workload": "deployment"}, "workload"), ({"port": 0}, "port"),
                      ({"addresses": "nodeport"}, "addresses"),
                      ({"tls_secret": "certs"}, "pass tls=")]:
        with pytest.raises(ValueError, match=match):
            make(**kw)


def test_arguments_of_the_wrong_type_are_refused_at_construction(tmp_path: Path) -> None:
    """An ``env`` value that is not a str (it would be ``value: 1`` or
    ``null`` in the manifest), a ``pod_spec`` that replaces the agent's
    container or its volumes, an ``idle_timeout`` that is not seconds > 0
    (NaN made an agent spin), a ``tls`` that is not a TLSConfig: refused
    when the job is made, naming the argument."""
    def make(**kw: Any) -> KubernetesJob:
        args: dict[str, Any] = {"meshes": {"trainers": 1}, "image": "i",
                                "cache_dir": tmp_path}
        return KubernetesJob(**(args | kw))

    for kw, error, match in [
            ({"env": {"A": 1}}, TypeError, r"env\['A'\] must be a str"),
            ({"env": {"B": None}}, TypeError, r"env\['B'\] must be a str"),
            ({"env": "A=1"}, TypeError, "env must be a mapping"),
            ({"pod_spec": {"containers": []}}, ValueError,
             r"pod_spec must not set \['containers'\]"),
            ({"pod_spec": {"volumes": []}}, ValueError,
             r"pod_spec must not set \['volumes'\]"),
            ({"resources": "lots"}, TypeError, "resources must be a mapping"),
            ({"idle_timeout": float("nan")}, ValueError, r"idle_timeout=\.\.\.\) must be seconds"),
            ({"idle_timeout": 0}, ValueError, r"idle_timeout=\.\.\.\) must be seconds > 0"),
            ({"idle_timeout": "600"}, TypeError, r"idle_timeout=\.\.\.\) must be a number"),
            ({"start_timeout": -1}, ValueError, r"start_timeout=\.\.\.\) must be seconds > 0"),
            ({"tls": "cert.pem"}, TypeError, "tls must be a meshio.TLSConfig"),
            ({"image": ""}, ValueError, "image must name"),
            ({"name": 5}, TypeError, "name must be a str")]:
        with pytest.raises(error, match=match):
            make(**kw)
    job = make(env={"A": "1"}, pod_spec={"nodeSelector": {"gpu": "h100"}},
               idle_timeout=float("inf"))
    (wl,) = [d for d in job.manifests() if d["kind"] == "Job"]
    (container,) = wl["spec"]["template"]["spec"]["containers"]
    assert {"name": "A", "value": "1"} in container["env"]
    assert container["command"][-2:] == ["--idle-timeout", "inf"]


def test_an_unsafe_secret_file_is_refused(tmp_path: Path) -> None:
    job = KubernetesJob(meshes={"trainers": 1}, image="i", cache_dir=tmp_path)
    write_secret(job.secret_file, SECRET)
    job.secret_file.chmod(0o644)
    with pytest.raises(JobCacheError, match="readable or writable by others"):
        job.manifests()


def test_the_agent_command_parses_with_meshios_cli(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """``meshio agent``'s own parser takes the command of every variant and
    serves with what the manifest says (the agent itself is replaced by a
    recorder: the mounted files exist only in a pod)."""
    seen: dict[str, Any] = {}

    async def serve(listen: str, secret: bytes, **kw: Any) -> None:
        seen.update(listen=listen, secret=secret, **kw)

    def tls_config(cert: str, key: str, ca: str, mutual: bool,
                   check_hostname: bool) -> tuple[str, str, str, bool, bool]:
        return cert, key, ca, mutual, check_hostname

    def loadable(cert: str, key: str, ca: str) -> None:
        return None

    monkeypatch.setattr(agent_module, "serve_agent", serve)
    monkeypatch.setattr(agent_module, "_unloadable", loadable)
    def read_secret_file(path: str, *, private: bool) -> bytes:
        assert private  # (the mounted Secret, root's and mode 0440, passes: test_cli_args)
        return f"read {path}".encode()

    monkeypatch.setattr(agent_module, "read_secret_file", read_secret_file)
    monkeypatch.setattr(agent_module, "TLSConfig", tls_config)

    def in_pod(command: list[str]) -> list[str]:
        """``command`` as Kubernetes runs it: ``$(POD_IP)`` expanded from the env."""
        return [a.replace("$(POD_IP)", "10.0.0.5") for a in command]

    for job in golden_jobs(tmp_path).values():
        (wl,) = [d for d in job.manifests() if d["kind"] in ("Job", "StatefulSet")][:1]
        argv = in_pod(wl["spec"]["template"]["spec"]["containers"][0]["command"])
        assert argv[:2] == ["meshio", "agent"]
        seen.clear()
        with pytest.raises(SystemExit) as exit_:
            meshio._cli.main(argv[1:])
        assert exit_.value.code == 0
        assert seen["listen"] == f"0.0.0.0:{job.port}"
        assert seen["secret"] == b"read /etc/meshio/secret/secret"
        assert seen["advertise"] == "10.0.0.5"
        assert seen["idle_timeout"] == job.idle_timeout
        assert seen["tls"] == (None if job.tls is None else (
            "/etc/meshio/tls/tls.crt", "/etc/meshio/tls/tls.key", "/etc/meshio/tls/ca.crt", True,
            True))
    # a certificate that cannot name the pods' IPs: their workers do not check names
    tls = golden_jobs(tmp_path)["kubernetes_statefulset_tls"].tls
    assert tls is not None
    job = KubernetesJob(meshes={"trainers": 1}, image="i", cache_dir=tmp_path / ".meshio",
                        tls=TLSConfig(tls.cert, tls.key, tls.ca, check_hostname=False))
    seen.clear()
    with pytest.raises(SystemExit) as exit_:
        meshio._cli.main(in_pod(job.agent_command())[1:])
    assert exit_.value.code == 0
    assert seen["tls"] == ("/etc/meshio/tls/tls.crt", "/etc/meshio/tls/tls.key",
                           "/etc/meshio/tls/ca.crt", True, False)


# ------------------------------------------------------------------ no cluster

@pytest.fixture
def no_cluster(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "no-kubeconfig"))
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)


async def test_apply_without_a_cluster_raises_the_typed_error(tmp_path: Path,
                                                               no_cluster: None) -> None:
    job = KubernetesJob(meshes={"trainers": 2}, image="i", cache_dir=tmp_path / ".meshio")
    for op in (job.apply, job.state, job.kill):
        with pytest.raises(ClusterNotConfiguredError, match="no Kubernetes cluster is configured"):
            await op()
    assert not job.cache.exists()
    # the manifests need no cluster, and attach() contacts nothing
    state = job.attach()
    assert state.trainers.sizes == {"hosts": 2}


async def test_without_the_client_package_the_error_says_to_install_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "kubernetes", None)  # import fails
    job = KubernetesJob(meshes={"trainers": 1}, image="i", cache_dir=tmp_path)
    with pytest.raises(ClusterNotConfiguredError, match="pip install kubernetes"):
        await job.apply()


# ------------------------------------------------------------------ a fake API server

PLURALS = {"secrets": "Secret", "services": "Service", "jobs": "Job",
           "statefulsets": "StatefulSet", "pods": "Pod"}
ROUTE = re.compile(r"/(?:api/v1|apis/batch/v1|apis/apps/v1)/namespaces/([^/]+)/([a-z]+)"
                   r"(?:/([^/]+))?")
Pod = dict[str, Any]


class FakeCluster:
    """The API server's objects, with a "kubelet" that makes each workload's
    pods at once (``start_pod`` gives a pod its IP, by default a made-up one)."""

    def __init__(self) -> None:
        self.objects: dict[tuple[str, str, str], dict[str, Any]] = {}  # (ns, plural, name)
        self.requests: list[tuple[str, str]] = []
        self.patches: list[tuple[str, dict[str, Any]]] = []  # (content type, body)
        self.start_pod: Callable[[Pod, dict[str, Any]], str] = lambda pod, spec: "10.1.0.9"
        self.waiting_reason = ""
        #: reads a deleted object still answers, terminating (a finalizer at work)
        self.linger = 0
        self.terminating: dict[tuple[str, str, str], list[Any]] = {}  # key -> [object, reads]
        self.lock = threading.Lock()
        #: a create of this (plural, name) is answered once ``released`` is set
        #: (``held`` is set when it comes)
        self.hold: tuple[str, str] | None = None
        self.held = threading.Event()
        self.released = threading.Event()

    def create(self, ns: str, plural: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        name = body["metadata"]["name"]
        if (ns, plural, name) in self.objects or (ns, plural, name) in self.terminating:
            return 409, status(409, f'{plural} "{name}" already exists', "AlreadyExists")
        body["metadata"]["uid"] = str(uuid.uuid4())
        self.objects[ns, plural, name] = body
        if plural in ("jobs", "statefulsets"):
            n = body["spec"].get("completions") or body["spec"]["replicas"]
            for i in range(n):
                self.make_pod(ns, body, i)
        return 201, body

    def make_pod(self, ns: str, workload: dict[str, Any], i: int) -> None:
        template = workload["spec"]["template"]
        host = f"{workload['metadata']['name']}-{i}"
        pod: Pod = {"apiVersion": "v1", "kind": "Pod",
                    "metadata": {"name": f"{host}-x{i}", "namespace": ns,
                                 "uid": str(uuid.uuid4()),
                                 "labels": template["metadata"]["labels"],
                                 "ownerReferences": [{
                                     "apiVersion": workload["apiVersion"],
                                     "kind": workload["kind"], "name": host,
                                     "uid": workload["metadata"]["uid"]}]},
                    "spec": {**template["spec"], "hostname": host}}
        ip = self.start_pod(pod, template["spec"])
        waiting = {"waiting": {"reason": self.waiting_reason, "message": "no such image"}}
        pod["status"] = {
            "phase": "Pending" if self.waiting_reason else "Running", "podIP": ip,
            "conditions": [{"type": "Ready",
                            "status": "False" if self.waiting_reason else "True"}],
            "containerStatuses": [{"name": "agent", "image": "i", "imageID": "", "ready": True,
                                   "restartCount": 0,
                                   "state": waiting if self.waiting_reason else {"running": {}}}],
        }
        self.objects[ns, "pods", pod["metadata"]["name"]] = pod

    def delete(self, ns: str, plural: str, name: str) -> tuple[int, dict[str, Any]]:
        obj = self.objects.pop((ns, plural, name), None)
        if obj is None:
            return 404, status(404, f'{plural} "{name}" not found', "NotFound")
        if self.linger:
            obj["metadata"]["deletionTimestamp"] = "2026-12-01T00:00:00Z"
            self.terminating[ns, plural, name] = [obj, self.linger]
        if plural in ("jobs", "statefulsets"):  # Background propagation: its pods go
            for key, pod in list(self.objects.items()):
                if key[1] == "pods" and pod["spec"]["subdomain" if plural == "jobs"
                                                    else "hostname"].startswith(name):
                    del self.objects[key]
        return 200, status(200, "deleted", "")

    def patch(self, ns: str, plural: str, name: str,
              body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        """A merge patch of a StatefulSet's ``spec.replicas`` (all resize
        sends): its pods follow, the highest ordinals removed first."""
        obj = self.objects.get((ns, plural, name))
        if obj is None:
            return 404, status(404, f'{plural} "{name}" not found', "NotFound")
        assert plural == "statefulsets" and body.keys() == {"spec"}, body
        assert body["spec"].keys() == {"replicas"}, body
        old, n = obj["spec"]["replicas"], body["spec"]["replicas"]
        obj["spec"]["replicas"] = n
        for i in range(old, n):
            self.make_pod(ns, obj, i)
        for key, pod in list(self.objects.items()):
            if key[1] == "pods" and pod["spec"]["hostname"] in {
                    f"{name}-{i}" for i in range(n, old)}:
                del self.objects[key]
        return 200, obj

    def pods(self, ns: str, selector: str) -> list[Pod]:
        key, _, value = selector.partition("=")
        return [o for (n, plural, _), o in self.objects.items()
                if n == ns and plural == "pods" and o["metadata"]["labels"].get(key) == value]

    def names(self, plural: str) -> list[str]:
        return sorted(name for _, p, name in self.objects if p == plural)


def status(code: int, message: str, reason: str) -> dict[str, Any]:
    return {"kind": "Status", "apiVersion": "v1", "status": "Failure" if code >= 300 else
            "Success", "message": message, "reason": reason, "code": code}


def handler_for(cluster: FakeCluster) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.0"  # one request per connection: a watch ends at close

        def log_message(self, format: str, *args: Any) -> None:
            pass

        def reply(self, code: int, body: dict[str, Any] | list[dict[str, Any]]) -> None:
            lines = ([json.dumps(e) for e in body] if isinstance(body, list)
                     else [json.dumps(body)])
            data = "\n".join(lines).encode() + b"\n"
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def route(self) -> tuple[str, str, str | None, dict[str, list[str]]]:
            url = urlsplit(self.path)
            m = ROUTE.fullmatch(url.path)
            assert m is not None and m[2] in PLURALS, self.path
            cluster.requests.append((self.command, url.path))
            return m[1], m[2], m[3], parse_qs(url.query)

        def do_POST(self) -> None:
            ns, plural, _, _ = self.route()
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            if (plural, body["metadata"]["name"]) == cluster.hold:
                cluster.held.set()
                cluster.released.wait(DEADLINE)
            with cluster.lock:
                self.reply(*cluster.create(ns, plural, body))

        def do_GET(self) -> None:
            ns, plural, name, query = self.route()
            with cluster.lock:
                if plural == "pods" and query.get("watch") == ["true"]:
                    pods = cluster.pods(ns, query["labelSelector"][0])
                    self.reply(200, [{"type": "ADDED", "object": p} for p in pods])
                elif name is not None and (ns, plural, name) in cluster.objects:
                    self.reply(200, cluster.objects[ns, plural, name])
                elif (going := cluster.terminating.get((ns, plural, str(name)))) is not None:
                    going[1] -= 1
                    if not going[1]:  # its finalizers are done: gone after this read
                        del cluster.terminating[ns, plural, str(name)]
                    self.reply(200, going[0])
                else:
                    self.reply(404, status(404, f'{plural} "{name}" not found', "NotFound"))

        def do_PATCH(self) -> None:
            ns, plural, name, _ = self.route()
            assert name is not None
            cluster.patches.append((self.headers["Content-Type"],
                                    json.loads(self.rfile.read(
                                        int(self.headers["Content-Length"])))))
            with cluster.lock:
                self.reply(*cluster.patch(ns, plural, name, cluster.patches[-1][1]))

        def do_DELETE(self) -> None:
            ns, plural, name, _ = self.route()
            assert name is not None
            with cluster.lock:
                self.reply(*cluster.delete(ns, plural, name))

    return Handler


@pytest.fixture
def cluster(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeCluster]:
    """A fake API server on loopback, named by a kubeconfig (the real
    client's usual configuration path)."""
    fake = FakeCluster()
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler_for(fake))
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "fake",
        "clusters": [{"name": "fake", "cluster": {
            "server": f"http://127.0.0.1:{server.server_address[1]}"}}],
        "users": [{"name": "me", "user": {"token": "t"}}],
        "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "me"}}]}))
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    try:
        yield fake
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def make_job(tmp_path: Path, **kw: Any) -> KubernetesJob:
    args: dict[str, Any] = {"meshes": {"trainers": 2, "generators": 1}, "image": "i",
                            "namespace": "ml", "name": "rl", "cache_dir": tmp_path / ".meshio",
                            "start_timeout": 5}
    return KubernetesJob(**(args | kw))


async def test_apply_creates_the_objects_reattaches_and_kill_deletes(
        tmp_path: Path, cluster: FakeCluster) -> None:
    job = make_job(tmp_path)
    await job.apply()
    assert cluster.names("secrets") == ["rl-secret"]
    assert cluster.names("services") == cluster.names("jobs") == ["rl-generators", "rl-trainers"]
    assert len(cluster.names("pods")) == 3
    posted = cluster.objects["ml", "jobs", "rl-trainers"]
    assert posted["spec"] == next(d for d in job.manifests()
                                  if d["metadata"]["name"] == "rl-trainers" and
                                  d["kind"] == "Job")["spec"]
    entry = json.loads(job.cache.read_text())
    assert entry["kind"] == "KubernetesJob" and len(entry["uids"]) == 5
    assert (job.cache.stat().st_mode & 0o777) == 0o600
    state = await job.state()
    assert state.trainers.sizes == {"hosts": 2} and state.generators.sizes == {"hosts": 1}

    # the script run again: a new job object re-attaches, creating nothing
    cluster.requests.clear()
    again = make_job(tmp_path)
    await again.apply()
    assert not [r for r in cluster.requests if r[0] != "GET"]
    assert cluster.names("pods") and len(cluster.names("jobs")) == 2

    await again.kill()
    assert not cluster.objects
    assert not job.cache.exists() and not job.secret_file.exists()
    await again.kill()  # nothing left: nothing to do, no error


async def test_apply_and_kill_wait_for_the_jobs_lock(tmp_path: Path,
                                                    cluster: FakeCluster) -> None:
    """Two controllers applying one job name at once create its objects
    once, and a kill while another controller applies the job deletes what
    that created: the job's lock is held by another process (as another
    controller's apply() holds it), and apply() and kill() wait for it."""
    job = make_job(tmp_path)
    async with lock_held(job.cache) as holder, holder.waiting(job.apply()):
        assert not cluster.objects  # nothing created while another holds the lock
    assert len(cluster.names("pods")) == 3 and job.cache.exists()

    async with lock_held(job.cache) as holder, holder.waiting(make_job(tmp_path).kill()):
        assert len(cluster.names("pods")) == 3 and job.cache.exists()  # nothing deleted yet
    assert not cluster.objects and not job.cache.exists()


async def test_a_cancelled_apply_lets_the_lock_go_once_its_requests_are_done(
        tmp_path: Path, cluster: FakeCluster) -> None:
    """apply() cancelled while its thread creates the job's objects (the
    API server holds the create of one): the job's lock stays held until
    that request is answered, and the thread makes no other, so another
    controller (another process here) that takes the lock then finds every
    object created named by the cache, and a kill() deletes them all; the
    cancellation still propagates.  Before, the lock went at once: a kill()
    by another controller then found no cache, and the objects created
    after it were left running; and the thread went on creating every
    object, a request after another, before the call could end."""
    job = make_job(tmp_path)
    cluster.hold = ("jobs", "rl-trainers")
    applying = asyncio.ensure_future(job.apply())
    try:
        assert await asyncio.to_thread(cluster.held.wait, DEADLINE)
        applying.cancel()
        async with lock_wanted(job.cache) as other:
            assert await other.said() == "waiting"  # the cancelled apply() holds it still
            cluster.released.set()
            assert await other.said() == "held"
            assert applying.done()  # (it let the lock go as it ended)
            # the create under way was answered, and no other was made
            assert sorted(json.loads(job.cache.read_text())["uids"]) == [
                "Job/rl-trainers", "Secret/rl-secret", "Service/rl-trainers"]
            assert cluster.names("jobs") == ["rl-trainers"]
            assert len(cluster.names("pods")) == 2
            await other.release()
        with pytest.raises(asyncio.CancelledError):
            await applying
        await make_job(tmp_path).kill()
        assert not cluster.objects and not job.cache.exists()
    finally:
        cluster.released.set()
        applying.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await applying


async def test_kill_waits_until_the_objects_are_gone_so_the_name_is_free_at_once(
        tmp_path: Path, cluster: FakeCluster) -> None:
    """Deleted objects with finalizers stay a while, terminating; creating
    their names meanwhile is refused (409).  kill() returns once they are
    gone, so applying the same job again right after it works."""
    await make_job(tmp_path).apply()
    cluster.linger = 3
    await make_job(tmp_path).kill()
    assert not cluster.objects and not cluster.terminating
    await make_job(tmp_path).apply()
    assert len(cluster.names("pods")) == 3


async def test_objects_that_never_go_make_kill_a_timeout_naming_them(
        tmp_path: Path, cluster: FakeCluster) -> None:
    job = make_job(tmp_path, start_timeout=1)
    await job.apply()
    cluster.linger = 10**6
    with pytest.raises(TimeoutError, match=r"Job rl-trainers, Service rl-trainers, .*still "
                                           r"terminating after 1 s"):
        await job.kill()
    assert job.cache.exists()  # not forgotten: kill() can be tried again


async def test_a_stale_cache_is_reported_and_replaced(tmp_path: Path, cluster: FakeCluster,
                                                      caplog: pytest.LogCaptureFixture) -> None:
    await make_job(tmp_path).apply()
    old = cluster.objects["ml", "jobs", "rl-trainers"]["metadata"]["uid"]
    cluster.delete("ml", "jobs", "rl-trainers")  # someone deleted it (or it ended)
    with caplog.at_level(logging.WARNING, "meshio"):
        await make_job(tmp_path).apply()
    assert "is stale (Job rl-trainers is gone)" in caplog.text
    assert cluster.objects["ml", "jobs", "rl-trainers"]["metadata"]["uid"] != old
    assert len(cluster.names("pods")) == 3  # the old pods went with their jobs


async def test_a_cache_of_another_shape_is_given_back_not_orphaned(
        tmp_path: Path, cluster: FakeCluster, caplog: pytest.LogCaptureFixture) -> None:
    """The script run with other meshes (or namespace): the job the cache
    names is deleted before the new one is created (its objects of the
    names in common would refuse the new ones, 409, and the others would
    run on with nobody to delete them), but never a namesake of one of its
    objects.  ``kill()`` of a job of any shape deletes what the cache names."""
    await make_job(tmp_path).apply()  # trainers 2, generators 1
    cluster.delete("ml", "services", "rl-generators")  # replaced by a namesake
    cluster.create("ml", "services", {"metadata": {"name": "rl-generators"}})
    namesake = cluster.objects["ml", "services", "rl-generators"]
    smaller = make_job(tmp_path, meshes={"trainers": 1})
    with caplog.at_level(logging.WARNING, "meshio"):
        await smaller.apply()
    assert "holds a job with meshes {'trainers': 2, 'generators': 1}" in caplog.text
    assert cluster.names("jobs") == ["rl-trainers"] and len(cluster.names("pods")) == 1
    assert cluster.objects["ml", "services", "rl-generators"] is namesake
    assert json.loads(smaller.cache.read_text())["meshes"] == {"trainers": 1}
    cluster.delete("ml", "services", "rl-generators")

    await make_job(tmp_path, namespace="other").kill()  # the cache's job, in ml
    assert not cluster.objects
    assert not smaller.cache.exists() and not smaller.secret_file.exists()


async def test_a_namesake_object_is_a_cluster_error_and_nothing_is_left(
        tmp_path: Path, cluster: FakeCluster) -> None:
    """An object of the job's name exists (another job, or kubectl): apply()
    refuses, removes only what it made itself, and keeps the namesake."""
    cluster.create("ml", "services", {"metadata": {"name": "rl-generators"}})
    job = make_job(tmp_path)
    with pytest.raises(ClusterError, match=r"409.*exists already.*choose another name"):
        await job.apply()
    assert list(cluster.objects) == [("ml", "services", "rl-generators")]
    assert not job.cache.exists()


async def test_a_pod_that_cannot_start_is_reported(tmp_path: Path, cluster: FakeCluster) -> None:
    cluster.waiting_reason = "ImagePullBackOff"
    with pytest.raises(ClusterError, match=r"pod rl-\w+-0-x0 cannot start: ImagePullBackOff"):
        await make_job(tmp_path).apply()


async def test_pods_not_ready_in_time_are_a_timeout(tmp_path: Path,
                                                    cluster: FakeCluster) -> None:
    # a ready pod of an earlier job of this name, still going away, does not count
    cluster.make_pod("ml", {"apiVersion": "batch/v1", "kind": "Job", "metadata": {
        "name": "rl-trainers", "uid": "earlier"}, "spec": {"template": make_job(
            tmp_path).manifests()[2]["spec"]["template"]}}, 0)
    earlier = cluster.objects.pop(("ml", "pods", "rl-trainers-0-x0"))
    earlier["metadata"]["name"] = "rl-trainers-0-old"
    cluster.objects["ml", "pods", "rl-trainers-0-old"] = earlier
    cluster.waiting_reason = "ContainerCreating"  # still starting when the watch ends
    with pytest.raises(TimeoutError, match=r"pods \['rl-generators-0', 'rl-trainers-0', "
                                           r"'rl-trainers-1'\] not ready after 5 s"):
        await make_job(tmp_path).apply()


async def test_an_unreachable_api_server_is_a_cluster_error(
        tmp_path: Path, cluster: FakeCluster, monkeypatch: pytest.MonkeyPatch) -> None:
    kubeconfig = Path(os.environ["KUBECONFIG"])
    config = json.loads(kubeconfig.read_text())
    config["clusters"][0]["cluster"]["server"] = "http://127.0.0.1:9"  # nobody listens
    kubeconfig.write_text(json.dumps(config))
    with pytest.raises(ClusterError, match="API server did not answer"):
        await make_job(tmp_path).apply()


class SilentServer:
    """An API server that takes each request and never answers it: a
    socket that listens, accepts and reads (``requests``: their first
    lines; ``came`` is set at each)."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.requests: list[str] = []
        self.came = threading.Event()
        self.conns: list[socket.socket] = []
        self.thread = threading.Thread(target=self.serve)
        self.thread.start()

    def serve(self) -> None:
        with contextlib.suppress(OSError):  # (the listener shut down: the test is over)
            while True:
                conn, _ = self.listener.accept()
                self.conns.append(conn)
                head = b""
                while b"\r\n\r\n" not in head and (data := conn.recv(4096)):
                    head += data
                self.requests.append(head.split(b"\r\n", 1)[0].decode())
                self.came.set()

    def close(self) -> None:
        self.listener.shutdown(socket.SHUT_RDWR)  # (wakes accept())
        self.thread.join()
        self.listener.close()
        for conn in self.conns:
            conn.close()


@pytest.fixture
def silent(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[SilentServer]:
    server = SilentServer()
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "silent",
        "clusters": [{"name": "silent", "cluster": {
            "server": f"http://127.0.0.1:{server.listener.getsockname()[1]}"}}],
        "users": [{"name": "me", "user": {"token": "t"}}],
        "contexts": [{"name": "silent", "context": {"cluster": "silent", "user": "me"}}]}))
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    try:
        yield server
    finally:
        server.close()


async def test_an_api_server_that_never_answers_gets_start_timeout_and_one_request(
        tmp_path: Path, silent: SilentServer) -> None:
    """Each request is given what is left of the call's ``start_timeout``
    (at most 30 s), and one that got no answer is not sent again.  A failed
    apply() leaves no cache and no secret.  Before, a request had 30 s
    whatever ``start_timeout``, kill()'s delete was sent 4 times (2 min),
    and apply() left ``rl.secret`` behind."""
    job = make_job(tmp_path, start_timeout=2)
    with pytest.raises(ClusterError, match="API server did not answer"):
        await job.apply()
    assert not job.cache.exists() and not job.secret_file.exists()
    with pytest.raises(ClusterError, match="API server did not answer"):
        await job.kill()
    assert [r.split(" ", 1)[0] for r in silent.requests] == ["POST", "DELETE"]


async def test_a_kill_cancelled_while_the_api_server_does_not_answer_ends_with_that_request(
        tmp_path: Path, silent: SilentServer) -> None:
    """kill() cancelled while its first delete gets no answer: the
    cancellation ends it once that request's time is out (``start_timeout``
    here), with no other request made, and the cache is kept for the next
    kill().  Before, it waited for the delete sent 4 times, 30 s each."""
    job = make_job(tmp_path, start_timeout=5)
    write_secret(job.secret_file, SECRET)
    write_cache(job.cache, {"kind": "KubernetesJob", "meshes": job.meshes, "namespace": "ml",
                            "workload": "job", "uids": {}})
    killing = asyncio.ensure_future(job.kill())
    came = asyncio.ensure_future(asyncio.to_thread(silent.came.wait, DEADLINE))
    try:
        await asyncio.wait([came, killing], return_when=asyncio.FIRST_COMPLETED)
        assert not killing.done() and await came  # its delete is under way
        killing.cancel()
        with pytest.raises(asyncio.CancelledError):
            await killing
    finally:
        killing.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await killing
        silent.came.set()
        await came
    assert [r.split(" ", 1)[0] for r in silent.requests] == ["DELETE"]
    assert job.cache.exists() and job.secret_file.exists()


@pytest.mark.parametrize("content", ["hello\n", "a: [\n"])
@pytest.mark.parametrize("where", ["KUBECONFIG", "~/.kube/config"])
async def test_a_malformed_kubeconfig_is_the_typed_error_naming_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, content: str, where: str) -> None:
    """Before, the client's own TypeError or yaml error came out of apply()."""
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    if where == "KUBECONFIG":
        kubeconfig = tmp_path / "garbage"
        monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
    else:
        kubeconfig = tmp_path / ".kube" / "config"
        kubeconfig.parent.mkdir()
        monkeypatch.delenv("KUBECONFIG", raising=False)
    kubeconfig.write_text(content)
    job = make_job(tmp_path)
    for op in (job.apply, job.kill):
        with pytest.raises(ClusterNotConfiguredError) as raised:
            await op()
        said = str(raised.value)
        assert said.startswith(f"the kubeconfig {kubeconfig} is not valid (")
        assert ("TypeError: " if content == "hello\n" else "ParserError: ") in said
        assert "\n" not in said
    assert not job.cache.exists() and not job.secret_file.exists()


class Where(Actor):
    @endpoint
    async def where(self) -> tuple[str, str]:
        return context().proc.addr, os.environ.get("FROM_MANIFEST", "")


@requires_netns
async def test_pods_run_their_manifest_command_and_the_controller_calls_them(
        tmp_path: Path, cluster: FakeCluster) -> None:
    """The fake kubelet runs each pod's own container command (``$(POD_IP)``
    expanded, Secrets written where they are mounted, the container env
    set) in a network-namespace host; ``state()`` with ``addresses="pod-ip"``
    (a controller outside the cluster) reaches those agents, and actors on
    them answer from the pods' addresses."""
    agents: list[subprocess.Popen[bytes]] = []
    free: list[Host] = []

    def start_pod(pod: Pod, spec: dict[str, Any]) -> str:
        host = free.pop(0)
        root = tmp_path / pod["metadata"]["name"]
        (container,) = spec["containers"]
        for mount in container["volumeMounts"]:
            (volume,) = [v for v in spec["volumes"] if v["name"] == mount["name"]]
            data = cluster.objects["ml", "secrets", volume["secret"]["secretName"]]["data"]
            target = root / mount["mountPath"].lstrip("/")
            target.mkdir(parents=True)
            for key, value in data.items():
                (target / key).write_bytes(base64.b64decode(value))
                (target / key).chmod(0o400)
        env = {e["name"]: e.get("value", host.addr) for e in container["env"]}
        argv = [a.replace("$(POD_IP)", env["POD_IP"]) for a in container["command"]]
        argv = [str(root) + a if a.startswith("/etc/meshio/") else a for a in argv]
        assert argv[0] == "meshio"
        agent = subprocess.Popen(["ip", "netns", "exec", host.netns, sys.executable, "-m",
                                  *argv], env={**os.environ, **env}, stdin=subprocess.DEVNULL,
                                 stdout=subprocess.PIPE)
        agents.append(agent)
        assert agent.stdout is not None
        line = agent.stdout.readline().decode()  # what the startup probe waits for
        assert line == f"meshio agent listening on tcp://{host.addr}:29600\n", line
        return host.addr

    cluster.start_pod = start_pod
    write_secret(tmp_path / "hosts.secret", SECRET)  # of the hosts' own agents, unused here
    with netns_hosts(3, tmp_path / "hosts.secret") as hosts:
        free += hosts
        job = make_job(tmp_path, port=29600, addresses="pod-ip",
                       env={"FROM_MANIFEST": "yes"}, start_timeout=DEADLINE)
        try:
            state = await job.state()
            async with state.trainers.spawn_procs() as procs:
                actors = await procs.spawn("w", Where)
                found = (await asyncio.wait_for(actors.where.call(), DEADLINE)).values()
            assert sorted(addr.rsplit(":", 1)[0] for addr, _ in found) == sorted(
                f"tcp://{h.addr}" for h in hosts[:2])
            assert [env for _, env in found] == ["yes", "yes"]
        finally:
            await job.kill()
            for agent in agents:
                agent.terminate()
                agent.wait(DEADLINE)
                assert agent.stdout is not None
                agent.stdout.close()


@pytest.mark.parametrize("version", SCHEMAS)
async def test_resize_patches_the_statefulset_replicas(tmp_path: Path, cluster: FakeCluster,
                                                       version: str) -> None:
    """issue 17 §3: resize("trainers", hosts=n) sends a merge patch of the
    StatefulSet's replicas (nothing else); growing, it waits for the new
    pods and the host mesh from state() grows in place; shrinking, it
    shrinks.  The manifests and the cache follow, and the StatefulSet the
    cluster holds after each patch is still valid."""
    job = make_job(tmp_path, workload="statefulset")
    state = await job.state()
    trainers = state.trainers
    assert trainers.sizes == {"hosts": 2}

    await job.resize("trainers", hosts=4)
    content_type, body = cluster.patches[-1]
    assert body == {"spec": {"replicas": 4}} and "merge-patch" in content_type
    assert trainers.sizes == {"hosts": 4} and (await job.state()).trainers is trainers
    assert sorted(p["spec"]["hostname"] for p in cluster.pods("ml", f"{JOB_LABEL}=rl")
                  if p["spec"]["hostname"].startswith("rl-trainers")) == [
        f"rl-trainers-{i}" for i in range(4)]
    (sts,) = [d for d in job.manifests()
              if d["kind"] == "StatefulSet" and d["metadata"]["name"] == "rl-trainers"]
    assert sts["spec"]["replicas"] == 4
    for doc in job.manifests():
        kubernetes_validate.validate(doc, version, strict=True)
    live = cluster.objects["ml", "statefulsets", "rl-trainers"]
    kubernetes_validate.validate({k: v for k, v in live.items() if k != "status"}, version,
                                 strict=True)
    assert json.loads(job.cache.read_text())["meshes"] == {"trainers": 4, "generators": 1}

    await job.resize("trainers", hosts=1)
    assert cluster.patches[-1][1] == {"spec": {"replicas": 1}}
    assert trainers.sizes == {"hosts": 1} and state.generators.sizes == {"hosts": 1}
    assert [p["spec"]["hostname"] for p in cluster.pods("ml", f"{JOB_LABEL}=rl")
            if p["spec"]["hostname"].startswith("rl-trainers")] == ["rl-trainers-0"]
    assert json.loads(job.cache.read_text())["meshes"] == {"trainers": 1, "generators": 1}
    await job.kill()


async def test_resize_of_an_indexed_job_is_refused(tmp_path: Path, cluster: FakeCluster) -> None:
    job = make_job(tmp_path)
    with pytest.raises(ValueError, match="workload='job', an Indexed Job of fixed size"):
        await job.resize("trainers", hosts=3)
    with pytest.raises(KeyError, match="has no host mesh 'learners'"):
        await job.resize("learners", hosts=3)
    with pytest.raises(ValueError, match="makes the pod name"):
        await make_job(tmp_path, workload="statefulset").resize("trainers", hosts=10 ** 60)
    assert cluster.patches == []
