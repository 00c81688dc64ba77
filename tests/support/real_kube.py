"""A real Kubernetes API server for tests: kube-apiserver over etcd, both on loopback.

``RealKubeApiServer`` has the interface of ``support.kube_api.KubeApiServer`` that the
integration tests use (``apply``, ``delete``, ``get``, ``objects``, ``write_kubeconfig``,
``api_client``), so a test can run against the emulator and against Kubernetes itself::

    with RealKubeApiServer(tmp_path) as kube:
        kube.apply(pod("a", "default", "10.0.0.1", {"app": "a"}))
        with kube.api_client() as api:
            CoreV1Api(api).list_namespaced_pod("default")

Both binaries come from ``make reference`` (``support.reference.binary``). The server has its own
CA, serving certificate and service-account signing key, made at start; clients authenticate with a
certificate of ``O=system:masters``; authorization is RBAC. The ``istio-system`` namespace exists.
Istio's CRDs (from the pinned
``istio.io/istio`` module) are installed and Established before ``start`` returns.

What a real server does that the emulator does not, and what ``apply`` does about it:

- a Pod's ``status`` is written only through the ``status`` subresource: ``apply`` writes it there;
- Pods with an assigned node are deleted gracefully (a kubelet would confirm): ``delete`` uses
  ``gracePeriodSeconds=0``, so they go at once;
- a Namespace is removed by the namespace controller, which is not running: ``delete`` of a
  Namespace empties it of the resources of ``SWEPT`` and finalizes it, as the controller would;
- EndpointSlice addresses may not be loopback (127.0.0.0/8), unlike the emulator's;
- the ``ServiceAccount`` admission plugin is off, so Pods may name service accounts that do not
  exist (no controller manager creates ``default`` either).

``reset()`` brings the server back to its state after ``start`` (every object created since deleted,
the namespaces there at start relabelled as they were), so one server serves a module of tests.
"""

from __future__ import annotations

import base64
import contextlib
import datetime
import functools
import http.client
import ipaddress
import json
import shutil
import ssl
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Protocol, Self

import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from kubernetes import client as k8s_client
from support.certs import TestCA
from support.kube_resources import RESOURCES, Obj, StatusError, find_resource
from support.processes import Process
from support.reference import binary, istio_file

from bench.server import free_port

__all__ = ["SWEPT", "KubeApi", "RealKubeApiServer", "Resource", "StatusError"]

#: Istio's CRDs, as the ``base`` chart installs them.
CRD_FILE = "manifests/charts/base/files/crd-all.gen.yaml"
#: Namespaces of the server's own objects (leases of its identity, ...): ``reset`` leaves them alone.
SYSTEM_NAMESPACES = frozenset({"kube-system", "kube-public", "kube-node-lease"})
#: The Service range: the test objects' ClusterIPs (10.96.x.y) are in it; ``kubernetes`` gets 10.96.0.1.
SERVICE_CIDR = "10.96.0.0/12"
SERVICE_ACCOUNT_ISSUER = "https://kubernetes.default.svc.cluster.local"

START_TIMEOUT = 90.0


#: libyaml's parser where PyYAML has it (seven times faster on the CRDs' 0.9 MB).
_YamlLoader: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


@functools.cache
def _crd_text() -> str:
    return json.dumps([d for d in yaml.load_all(istio_file(CRD_FILE), Loader=_YamlLoader) if d])


def istio_crds() -> list[Obj]:
    """Istio's CRDs, parsed once per test process (pure-Python YAML took 2.3 s per server started;
    thirteen modules start one) and handed out as fresh copies, so no server sees another's changes."""
    crds: list[Obj] = json.loads(_crd_text())
    return crds


REQUEST_TIMEOUT = (5.0, 30.0)
LOG_TAIL = 4000


class KubeApi(Protocol):
    """What the integration tests use of an API server: the emulator's and the real one's interface."""

    def apply(self, obj: Mapping[str, Any]) -> Obj: ...
    def delete(self, resource: str, namespace: str, name: str) -> Obj: ...
    def get(self, resource: str, namespace: str, name: str) -> Obj | None: ...
    def objects(self, resource: str, namespace: str | None = None) -> list[Obj]: ...
    def write_kubeconfig(self, path: Path, name: str = ..., namespace: str = "") -> Path: ...
    def api_client(self) -> k8s_client.ApiClient: ...


@dataclass(frozen=True)
class Resource:
    """A resource the server serves, at its preferred version."""

    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool
    has_status: bool = False

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    def path(self, namespace: str = "", name: str = "") -> str:
        path = f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"
        if self.namespaced and namespace:
            path += f"/namespaces/{namespace}"
        path += f"/{self.plural}"
        return f"{path}/{name}" if name else path


#: What ``reset`` (and the deletion of a Namespace) sweeps: the emulator's resources and the
#: ones the real-server tests create besides (as ``plural.group``; the core group has none).
SWEPT: tuple[str, ...] = (
    *(f"{r.plural}.{r.group}" if r.group else r.plural for r in RESOURCES),
    "serviceaccounts",
    "mutatingwebhookconfigurations.admissionregistration.k8s.io",
    "validatingwebhookconfigurations.admissionregistration.k8s.io",
)


# -- Certificates --


def _pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def issue(
    ca: TestCA,
    subject: x509.Name,
    *,
    server: bool,
    dns: tuple[str, ...] = (),
    ips: tuple[str, ...] = (),
) -> tuple[bytes, bytes]:
    """A certificate (PEM, and its key's PEM) signed by ``ca``, for serving or for client auth."""
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(ca.cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.ExtendedKeyUsage(
                [ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH]
            ),
            critical=False,
        )
    )
    names: list[x509.GeneralName] = [x509.DNSName(d) for d in dns]
    names += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ips]
    if names:
        builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
    cert = builder.sign(ca.key, hashes.SHA256())
    return _pem(cert), _key_pem(key)


# -- The server --


class RealKubeApiServer:
    """etcd and kube-apiserver on 127.0.0.1 (ports picked at start), files under ``workdir``."""

    def __init__(self, workdir: Path | None = None, *, apiserver_args: Sequence[str] = ()) -> None:
        """``apiserver_args``: more flags for kube-apiserver (an audit log, say)."""
        self._own_workdir = workdir is None
        self._apiserver_args = tuple(apiserver_args)
        self.workdir = workdir if workdir is not None else Path(tempfile.mkdtemp(prefix="real-kube-"))
        self.host = "127.0.0.1"
        self.port = 0
        self.ca = TestCA()
        self._processes: list[Process] = []
        self._client: k8s_client.ApiClient | None = None
        self._resources: dict[str, list[Resource]] = {}  # by apiVersion
        self._baseline: dict[tuple[str, str, str], Obj] = {}
        self.ca_file = self.workdir / "pki" / "ca.crt"
        self.client_cert_file = self.workdir / "pki" / "client.crt"
        self.client_key_file = self.workdir / "pki" / "client.key"

    # -- Lifecycle --

    def start(self) -> Self:
        """Start etcd, then kube-apiserver; wait until ready; install Istio's CRDs. Stops all on failure."""
        try:
            # Where `make reference` did not run these skip (or fail, where required) the caller.
            etcd, apiserver = binary("etcd"), binary("kube-apiserver")
            crds = istio_crds()
            self._start(etcd, apiserver)
            self._install_crds(crds)
            # Istio's namespace, as a cluster with Istio installed has it: istiod (and meshpilot) keep
            # the CA's root in its istio-ca-secret, and refuse to start without somewhere to keep it.
            self.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "istio-system"}})
            self._baseline = self._snapshot()
        except BaseException as err:
            logs = self.logs()
            self.stop()
            if isinstance(err, AssertionError | OSError | StatusError):
                raise AssertionError(f"the real API server did not start: {err}\n{logs}") from err
            raise
        return self

    def stop(self) -> None:
        """Stop kube-apiserver, then etcd (SIGTERM, then SIGKILL). Idempotent."""
        if self._client is not None:
            self._client.close()
            self._client = None
        for process in reversed(self._processes):
            process.stop(timeout=10)
        self._processes.clear()
        # etcd preallocates its WAL (64 MB): never left behind; the logs stay in a given workdir.
        shutil.rmtree(self.workdir / "etcd", ignore_errors=True)
        if self._own_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    @property
    def url(self) -> str:
        return f"https://{self.host}:{self.port}"

    def logs(self) -> str:
        """The tail of each process's log."""
        return "\n".join(f"===== {p.name} =====\n{p.log()[-LOG_TAIL:]}" for p in self._processes)

    def _start(self, etcd: Path, apiserver: Path) -> None:
        pki = self.ca_file.parent
        pki.mkdir(parents=True, exist_ok=True)
        self.ca_file.write_bytes(self.ca.root_pem)
        serving, serving_key = issue(
            self.ca,
            x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kube-apiserver")]),
            server=True,
            dns=(
                "localhost",
                "kubernetes",
                "kubernetes.default",
                "kubernetes.default.svc",
                "kubernetes.default.svc.cluster.local",
            ),
            ips=(self.host, "10.96.0.1"),
        )
        (pki / "serving.crt").write_bytes(serving)
        (pki / "serving.key").write_bytes(serving_key)
        client, client_key = issue(
            self.ca,
            x509.Name(
                [
                    x509.NameAttribute(NameOID.ORGANIZATION_NAME, "system:masters"),
                    x509.NameAttribute(NameOID.COMMON_NAME, "meshpilot-tests"),
                ]
            ),
            server=False,
        )
        self.client_cert_file.write_bytes(client)
        self.client_key_file.write_bytes(client_key)
        signing = ec.generate_private_key(ec.SECP256R1())
        (pki / "sa.key").write_bytes(_key_pem(signing))
        (pki / "sa.pub").write_bytes(
            signing.public_key().public_bytes(
                serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
            )
        )

        client_port, peer_port = free_port(self.host), free_port(self.host)
        client_url, peer_url = f"http://{self.host}:{client_port}", f"http://{self.host}:{peer_port}"
        etcd_process = Process(
            "etcd",
            [
                str(etcd),
                "--name=test",
                f"--data-dir={self.workdir / 'etcd'}",
                f"--listen-client-urls={client_url}",
                f"--advertise-client-urls={client_url}",
                f"--listen-peer-urls={peer_url}",
                f"--initial-advertise-peer-urls={peer_url}",
                f"--initial-cluster=test={peer_url}",
                "--initial-cluster-state=new",
                "--unsafe-no-fsync",  # a test's data need not survive a power cut
                "--log-level=warn",
            ],
            self.workdir / "etcd.log",
        )
        self._processes.append(etcd_process)
        etcd_process.start()
        self._wait(
            "etcd /health", lambda: _http_ok(self.host, client_port, "/health", b'"health":"true"', None)
        )

        self.port = free_port(self.host)
        apiserver_process = Process(
            "kube-apiserver",
            [
                str(apiserver),
                f"--etcd-servers={client_url}",
                f"--bind-address={self.host}",
                f"--advertise-address={self.host}",
                f"--secure-port={self.port}",
                f"--cert-dir={pki}",
                f"--tls-cert-file={pki / 'serving.crt'}",
                f"--tls-private-key-file={pki / 'serving.key'}",
                f"--client-ca-file={self.ca_file}",
                f"--service-account-key-file={pki / 'sa.pub'}",
                f"--service-account-signing-key-file={pki / 'sa.key'}",
                f"--service-account-issuer={SERVICE_ACCOUNT_ISSUER}",
                "--authorization-mode=RBAC",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                # No controller manager creates service accounts; Pods name theirs freely.
                "--disable-admission-plugins=ServiceAccount",
                # No Endpoints for the `kubernetes` Service: 127.0.0.1 is not a valid endpoint address.
                "--endpoint-reconciler-type=none",
                "--enable-priority-and-fairness=false",
                "--profiling=false",
                "--v=1",
                *self._apiserver_args,
            ],
            self.workdir / "kube-apiserver.log",
        )
        self._processes.append(apiserver_process)
        apiserver_process.start()
        context = self._ssl_context()
        self._wait(
            "kube-apiserver /readyz", lambda: _http_ok(self.host, self.port, "/readyz", b"ok", context)
        )
        # The bootstrap controller makes `default` and the `kubernetes` Service shortly after ready;
        # the baseline must hold them, or every reset would delete them and it would make them again.
        self._wait("the `kubernetes` Service", lambda: self.get("services", "default", "kubernetes"))

    def _wait(self, what: str, check: Callable[[], object], timeout: float = START_TIMEOUT) -> None:
        deadline = time.monotonic() + timeout
        last: object = None
        while time.monotonic() < deadline:
            for process in self._processes:
                if not process.running:
                    raise AssertionError(f"{process.name} exited while waiting for {what}")
            try:
                if check():
                    return
            except (OSError, http.client.HTTPException, StatusError, k8s_client.ApiException) as err:
                last = err
            time.sleep(0.1)
        raise AssertionError(f"timed out after {timeout}s waiting for {what}: {last!r}")

    def _ssl_context(self) -> ssl.SSLContext:
        context = ssl.create_default_context(cafile=str(self.ca_file))
        context.load_cert_chain(str(self.client_cert_file), str(self.client_key_file))
        return context

    def _install_crds(self, crds: list[Obj]) -> None:
        for crd in crds:
            self.apply(crd)

        def established() -> bool:
            for crd in crds:
                stored = self.get("customresourcedefinitions", "", crd["metadata"]["name"]) or {}
                conditions = stored.get("status", {}).get("conditions") or []
                if not any(c["type"] == "Established" and c["status"] == "True" for c in conditions):
                    return False
            return True

        self._wait("Istio's CRDs Established", established, timeout=30)

    # -- Clients --

    def write_kubeconfig(self, path: Path, name: str = "kube-apiserver", namespace: str = "") -> Path:
        """A self-contained kubeconfig (CA and client certificate inline) with ``name`` as current context."""
        context: dict[str, str] = {"cluster": name, "user": name}
        if namespace:
            context["namespace"] = namespace

        def inline(path: Path) -> str:
            return base64.b64encode(path.read_bytes()).decode()

        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": name,
                    "cluster": {"server": self.url, "certificate-authority-data": inline(self.ca_file)},
                }
            ],
            "users": [
                {
                    "name": name,
                    "user": {
                        "client-certificate-data": inline(self.client_cert_file),
                        "client-key-data": inline(self.client_key_file),
                    },
                }
            ],
            "contexts": [{"name": name, "context": context}],
            "current-context": name,
        }
        path.write_text(yaml.safe_dump(config))
        return path

    def api_client(self) -> k8s_client.ApiClient:
        """An official client for this server, as ``system:masters``; close it (``with ... as api:``)."""
        configuration = k8s_client.Configuration(host=self.url)
        configuration.ssl_ca_cert = str(self.ca_file)
        configuration.cert_file = str(self.client_cert_file)
        configuration.key_file = str(self.client_key_file)
        return k8s_client.ApiClient(configuration)

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        query: Mapping[str, Any] | None = None,
        content_type: str = "application/json",
    ) -> Obj:
        """Any request; the answer's JSON, or StatusError with the server's status, reason and message."""
        if self._client is None:
            self._client = self.api_client()
        headers = {"Accept": "application/json"}
        if body is not None:
            headers["Content-Type"] = content_type
        method, url, headers, serialized, post = self._client.param_serialize(
            method, path, query_params=list((query or {}).items()), header_params=headers, body=body
        )
        response = self._client.call_api(
            method, url, headers, serialized, post, _request_timeout=REQUEST_TIMEOUT
        )
        data = response.read()
        try:
            answer = json.loads(data) if data else {}
        except ValueError:
            answer = {"message": data[:500].decode(errors="replace")}
        if response.status >= 300:
            raise StatusError(
                response.status, str(answer.get("reason", "")), str(answer.get("message", answer))
            )
        result: Obj = answer
        return result

    # -- Resources, found through discovery --

    def _group_versions(self, api_version: str, *, refresh: bool = False) -> list[Resource]:
        if refresh or api_version not in self._resources:
            group, _, version = api_version.rpartition("/")
            path = f"/apis/{api_version}" if group else f"/api/{version}"
            try:
                listed = self.request("GET", path)["resources"]
            except StatusError as err:
                if err.code != 404:
                    raise
                listed = []
            names = {r["name"] for r in listed}
            self._resources[api_version] = [
                Resource(
                    group, version, r["name"], r["kind"], r["namespaced"], f"{r['name']}/status" in names
                )
                for r in listed
                if "/" not in r["name"]
            ]
        return self._resources[api_version]

    def resource_of(self, obj: Mapping[str, Any]) -> Resource:
        """The resource of an object, from its apiVersion and kind."""
        api_version, kind = obj.get("apiVersion", ""), obj.get("kind")
        for refresh in (False, True):  # a CRD made since the last look
            for resource in self._group_versions(api_version, refresh=refresh):
                if resource.kind == kind:
                    return resource
        raise KeyError(f"not a served resource: {api_version} {kind}")

    def resource(self, name: str) -> Resource:
        """A resource by kind, plural or ``plural.group`` (``Lease``, ``leases.coordination.k8s.io``)."""
        with contextlib.suppress(KeyError):
            known = find_resource(name)
            return self.resource_of({"apiVersion": known.api_version(), "kind": known.kind})
        for refresh in (False, True):
            for api_version in self._all_group_versions(refresh):
                for resource in self._group_versions(api_version, refresh=refresh):
                    if name in (resource.kind, resource.plural, f"{resource.plural}.{resource.group}"):
                        return resource
        raise KeyError(f"not a served resource: {name!r}")

    def _all_group_versions(self, refresh: bool) -> list[str]:
        """Every group's preferred version (the core group's ``v1`` first); known ones first unless
        ``refresh``, so a lookup seldom asks the server for more than it did before."""
        versions: list[str] = list(self.request("GET", "/api")["versions"])
        versions += [g["preferredVersion"]["groupVersion"] for g in self.request("GET", "/apis")["groups"]]
        if not refresh:
            versions.sort(key=lambda v: v not in self._resources)
        return versions

    # -- Direct access from test code --

    def apply(self, obj: Mapping[str, Any]) -> Obj:
        """Create the object, or replace it whatever its resourceVersion. Returns the stored object.

        A ``status`` is written through the status subresource where there is one (a Pod's
        ``podIP``), as a kubelet or controller would write it.
        """
        resource = self.resource_of(obj)
        metadata = dict(obj.get("metadata", {}))
        metadata.pop("resourceVersion", None)
        namespace, name = metadata.get("namespace", "") if resource.namespaced else "", metadata["name"]
        body = {k: v for k, v in obj.items() if k != "status" or not resource.has_status}
        body["metadata"] = metadata
        current = self.get_resource(resource, namespace, name)
        if current is None:
            stored = self.request("POST", resource.path(namespace), body)
        else:
            metadata["resourceVersion"] = current["metadata"]["resourceVersion"]
            stored = self.request("PUT", resource.path(namespace, name), body)
        if resource.has_status and "status" in obj:
            stored = self.request(
                "PATCH",
                resource.path(namespace, name) + "/status",
                {"status": obj["status"]},
                content_type="application/merge-patch+json",
            )
        return stored

    def get_resource(self, resource: Resource, namespace: str, name: str) -> Obj | None:
        try:
            return _with_type(resource, self.request("GET", resource.path(namespace, name)))
        except StatusError as err:
            if err.code == 404:
                return None
            raise

    def get(self, resource: str, namespace: str, name: str) -> Obj | None:
        return self.get_resource(self.resource(resource), namespace, name)

    def delete(self, resource: str, namespace: str, name: str) -> Obj:
        """Delete by resource (kind, plural or plural.group) at once; raises StatusError 404 if missing."""
        rtype = self.resource(resource)
        options = {"apiVersion": "v1", "kind": "DeleteOptions", "gracePeriodSeconds": 0}
        deleted = self.request("DELETE", rtype.path(namespace, name), options)
        if rtype.kind == "Namespace":
            self._finalize_namespace(name)
        return deleted

    def objects(self, resource: str, namespace: str | None = None) -> list[Obj]:
        """The stored objects of a resource, in one namespace or all."""
        rtype = self.resource(resource)
        listed = self.request("GET", rtype.path(namespace or ""))
        return [_with_type(rtype, item) for item in listed.get("items", [])]

    def _finalize_namespace(self, name: str) -> None:
        """What the namespace controller does for a deleted Namespace: empty it, drop its finalizer."""
        for resource_name in SWEPT:
            with contextlib.suppress(KeyError):
                rtype = self.resource(resource_name)
                if rtype.namespaced:
                    for obj in self.objects(resource_name, name):
                        self._delete_quietly(rtype, name, obj["metadata"]["name"])
        namespace = self.get("namespaces", "", name)
        if namespace is None:
            return
        namespace["spec"]["finalizers"] = []
        with contextlib.suppress(StatusError):  # gone meanwhile
            self.request("PUT", f"/api/v1/namespaces/{name}/finalize", namespace)
        self._wait(f"namespace {name} removed", lambda: self.get("namespaces", "", name) is None, timeout=10)

    def _delete_quietly(self, rtype: Resource, namespace: str, name: str) -> None:
        options = {"apiVersion": "v1", "kind": "DeleteOptions", "gracePeriodSeconds": 0}
        try:
            self.request("DELETE", rtype.path(namespace, name), options)
        except StatusError as err:
            if err.code != 404:
                raise

    # -- Between tests --

    def _swept(self) -> Iterator[tuple[Resource, Obj]]:
        for resource_name in SWEPT:
            try:
                rtype = self.resource(resource_name)
            except KeyError:
                continue
            for obj in self.objects(resource_name):
                yield rtype, obj

    def _snapshot(self) -> dict[tuple[str, str, str], Obj]:
        return {
            (rtype.plural, obj["metadata"].get("namespace", ""), obj["metadata"]["name"]): obj
            for rtype, obj in self._swept()
        }

    def reset(self) -> None:
        """Back to the state after ``start``: objects made since deleted, namespaces relabelled."""
        namespaces: list[str] = []
        for rtype, obj in list(self._swept()):
            meta = obj["metadata"]
            key = (rtype.plural, meta.get("namespace", ""), meta["name"])
            if key in self._baseline:
                if rtype.kind == "Namespace":
                    self._restore_namespace(self._baseline[key], obj)
            elif rtype.kind == "Namespace":
                namespaces.append(meta["name"])
            elif meta.get("namespace", "") not in SYSTEM_NAMESPACES:
                self._delete_quietly(rtype, meta.get("namespace", ""), meta["name"])
        for name in namespaces:
            with contextlib.suppress(StatusError):  # already terminating
                self.request("DELETE", f"/api/v1/namespaces/{name}")
            self._finalize_namespace(name)

    def _restore_namespace(self, before: Obj, now: Obj) -> None:
        keep = ("labels", "annotations")
        if all(before["metadata"].get(k) == now["metadata"].get(k) for k in keep):
            return
        restored = dict(now)
        restored["metadata"] = {k: v for k, v in now["metadata"].items() if k not in keep}
        restored["metadata"].update({k: before["metadata"][k] for k in keep if k in before["metadata"]})
        self.request("PUT", f"/api/v1/namespaces/{now['metadata']['name']}", restored)


def _with_type(resource: Resource, obj: Obj) -> Obj:
    """Items of a list come without apiVersion and kind; the emulator's have them."""
    obj.setdefault("apiVersion", resource.api_version)
    obj.setdefault("kind", resource.kind)
    return obj


def _http_ok(host: str, port: int, path: str, expect: bytes, context: ssl.SSLContext | None) -> bool:
    conn: http.client.HTTPConnection
    if context is None:
        conn = http.client.HTTPConnection(host, port, timeout=2)
    else:
        conn = http.client.HTTPSConnection(host, port, timeout=2, context=context)
    try:
        conn.request("GET", path)
        response = conn.getresponse()
        return response.status == 200 and expect in response.read()
    finally:
        conn.close()


def service_account_token(
    kube: RealKubeApiServer, account: str, namespace: str, audience: str = "istio-ca", seconds: int = 3600
) -> str:
    """A token of ``namespace/account`` (the ServiceAccount made if missing) from the API server's
    TokenRequest, as the kubelet projects it into a pod's ``istio-token`` volume."""
    kube.apply(
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": account, "namespace": namespace}}
    )
    with kube.api_client() as client:
        request = {"spec": {"audiences": [audience], "expirationSeconds": seconds}}
        status = (
            k8s_client.CoreV1Api(client)
            .create_namespaced_service_account_token(account, namespace, request)
            .status
        )
        assert status is not None
        return str(status.token)
