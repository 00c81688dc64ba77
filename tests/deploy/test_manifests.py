"""deploy/: meshpilot as istiod, compared with Istio's manifests and applied to Kubernetes' API server.

- Each object of ``deploy/`` (read from its ``kustomization.yaml`` by a small loader; where ``kubectl``
  is installed, its Kustomize must build the same) is compared with the one Istio renders for istiod
  (``istioctl manifest generate``, conftest): the Service, the Deployment's arguments, probe and
  resources, the mesh ConfigMap and both webhook configurations match; each difference is asserted
  as such, with its reason in the manifest.
- The RBAC rules grant exactly what ``meshpilot.kube.permissions`` lists, and nothing istiod's own
  ClusterRole and Role do not grant.
- On a real kube-apiserver (``support.real_kube``) every object is created with the official client
  and accepted; a SubjectAccessReview per verb meshpilot needs is allowed for
  ``system:serviceaccount:istio-system:istiod`` (and the namespace rules only in istio-system).
- meshpilot then runs as that service account, with the Deployment's arguments and environment: it
  gets ready, makes the CA Secret, the root-cert ConfigMaps and the Lease, patches both webhook
  configurations' caBundle, and is never refused by the API server; the API server sends Istio config
  and Pods through the applied configurations to meshpilot (their service reference replaced by a URL:
  this API server has no cluster network to reach a Service through).
"""

from __future__ import annotations

import base64
import copy
import json
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import utils as kube_utils
from kubernetes.client import (
    AuthorizationV1Api,
    CoreV1Api,
    V1ResourceAttributes,
    V1SubjectAccessReview,
    V1SubjectAccessReviewSpec,
)
from support.kubelet import container_env
from support.processes import Process, free_port, http_get
from support.real_kube import SERVICE_ACCOUNT_ISSUER, RealKubeApiServer, StatusError
from support.wait import eventually

from meshpilot.kube.leader import STATUS_LEASE
from meshpilot.kube.permissions import ENABLE_STATUS, PERMISSIONS, Permission, Scope, expand
from meshpilot.kube.root_cert import ROOT_CERT_CONFIGMAP, ROOT_CERT_KEY
from meshpilot.webhooks.inject.config import parse_config
from meshpilot.webhooks.inject.template import check_templates

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
NAMESPACE = "istio-system"
SERVICE_ACCOUNT = f"system:serviceaccount:{NAMESPACE}:istiod"
HOST = "127.0.0.1"
#: What meshpilot's Deployment passes besides the chart's arguments: where the injector ConfigMap is mounted.
INJECT_ARGS = ["--injectConfig", "/var/lib/istio/inject"]

Objects = list[dict[str, Any]]
Rule = tuple[str, str, str]  # group, resource, verb


# -- The manifests, as Kustomize reads them --


def load_kustomization(directory: Path) -> Objects:
    """The objects of a kustomization's ``resources``, in order. Patches are not applied: the base has
    none (only the deploy/status overlay patches the Deployment)."""
    spec = yaml.safe_load((directory / "kustomization.yaml").read_text())
    assert not spec.get("patches") or directory.name == "status"
    objects: Objects = []
    for entry in spec.get("resources") or []:
        path = (directory / entry).resolve()
        if path.is_dir():
            objects += load_kustomization(path)
        else:
            objects += [doc for doc in yaml.safe_load_all(path.read_text()) if doc]
    return objects


def manifests() -> Objects:
    return load_kustomization(DEPLOY)


def status_manifests() -> Objects:
    """The deploy/status overlay's own objects (its patch turns on PILOT_ENABLE_STATUS)."""
    return [d for d in yaml.safe_load_all((DEPLOY / "status" / "clusterrole-status.yaml").read_text()) if d]


def find(objects: Objects, kind: str, name: str = "") -> dict[str, Any]:
    found = [o for o in objects if o["kind"] == kind and (not name or o["metadata"]["name"] == name)]
    assert len(found) == 1, f"{kind} {name}: {len(found)} objects"
    return found[0]


def rules_of(role: dict[str, Any]) -> set[Rule]:
    """(group, resource, verb) of each rule; rules limited by resourceNames grant less, and are left out."""
    return {
        (group, resource, verb)
        for rule in role.get("rules") or []
        if not rule.get("resourceNames")
        for group in rule.get("apiGroups", [])
        for resource in rule.get("resources", [])
        for verb in rule.get("verbs", [])
    }


def covered(rule: Rule, grants: set[Rule]) -> bool:
    group, resource, verb = rule
    return any(g == group and r in (resource, "*") and v in (verb, "*") for g, r, v in grants)


def needed(scope: Scope, only_with: str = "") -> list[Permission]:
    return [p for p in PERMISSIONS if p.scope is scope and p.only_with == only_with]


def canonical(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True)


def container(deployment: dict[str, Any]) -> dict[str, Any]:
    containers = deployment["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1
    found: dict[str, Any] = containers[0]
    return found


# -- Compared with istiod's, without an API server --


def test_the_loader_reads_what_kustomize_builds() -> None:
    objects = manifests()
    assert sorted((o["kind"], o["metadata"]["name"]) for o in objects) == sorted(
        [
            ("ServiceAccount", "istiod"),
            ("ClusterRole", "istiod-clusterrole-istio-system"),
            ("ClusterRoleBinding", "istiod-clusterrole-istio-system"),
            ("Role", "istiod"),
            ("RoleBinding", "istiod"),
            ("ConfigMap", "istio"),
            ("ConfigMap", "istio-sidecar-injector"),
            ("Service", "istiod"),
            ("Deployment", "istiod"),
            ("MutatingWebhookConfiguration", "istio-sidecar-injector"),
            ("ValidatingWebhookConfiguration", "istio-validator-istio-system"),
        ]
    )
    assert all(o["metadata"].get("namespace") in (None, NAMESPACE) for o in objects)
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        return
    # Where kubectl is installed, its Kustomize builds the same objects, and the overlay adds the status
    # writer's rules and turns it on.
    built = subprocess.run(
        [kubectl, "kustomize", str(DEPLOY)], check=True, capture_output=True, text=True, timeout=60
    ).stdout
    assert sorted(map(canonical, yaml.safe_load_all(built))) == sorted(map(canonical, objects))
    overlay = list(
        yaml.safe_load_all(
            subprocess.run(
                [kubectl, "kustomize", str(DEPLOY / "status")],
                check=True,
                capture_output=True,
                text=True,
                timeout=60,
            ).stdout
        )
    )
    assert {"name": "PILOT_ENABLE_STATUS", "value": "true"} in container(find(overlay, "Deployment"))["env"]
    assert len(overlay) == len(objects) + len(status_manifests())


def test_the_roles_grant_exactly_what_meshpilot_needs() -> None:
    objects = manifests()
    assert rules_of(find(objects, "ClusterRole")) == expand(needed(Scope.CLUSTER))
    assert rules_of(find(objects, "Role")) == expand(needed(Scope.ISTIO_NAMESPACE))
    status = status_manifests()
    assert rules_of(find(status, "ClusterRole")) == expand(needed(Scope.CLUSTER, ENABLE_STATUS))
    bindings = [
        find(objects, "ClusterRoleBinding"),
        find(objects, "RoleBinding"),
        find(status, "ClusterRoleBinding"),
    ]
    roles = [find(objects, "ClusterRole"), find(objects, "Role"), find(status, "ClusterRole")]
    for binding, role in zip(bindings, roles, strict=True):
        assert binding["roleRef"] == {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": role["kind"],
            "name": role["metadata"]["name"],
        }
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "istiod", "namespace": NAMESPACE}]


@pytest.mark.reference
def test_nothing_is_granted_that_istiods_roles_do_not_grant(istio_rendered: Callable[..., Objects]) -> None:
    rendered = istio_rendered()
    istiod = rules_of(find(rendered, "ClusterRole", "istiod-clusterrole-istio-system"))
    istiod_role = rules_of(find(rendered, "Role", "istiod"))
    objects = manifests()
    broader = sorted(r for r in rules_of(find(objects, "ClusterRole")) if not covered(r, istiod))
    assert not broader, f"beyond istiod's ClusterRole: {broader}"
    broader = sorted(r for r in rules_of(find(objects, "Role")) if not covered(r, istiod_role))
    assert not broader, f"beyond istiod's Role: {broader}"
    # The status writer's rules: within istiod's ClusterRole when it writes status (config analysis on).
    analysis = rules_of(
        find(
            istio_rendered("values.global.istiod.enableAnalysis=true"),
            "ClusterRole",
            "istiod-clusterrole-istio-system",
        )
    )
    status = rules_of(find(status_manifests(), "ClusterRole"))
    assert sorted(r for r in status if not covered(r, analysis)) == []
    # ... which istiod's default ClusterRole does not all grant: hence an overlay of their own.
    assert any(not covered(r, istiod) for r in status)


@pytest.mark.reference
def test_the_service_deployment_and_mesh_config_are_istiods(istio_rendered: Callable[..., Objects]) -> None:
    rendered, objects = istio_rendered(), manifests()
    assert find(objects, "Service")["spec"] == find(rendered, "Service", "istiod")["spec"]
    ours, theirs = find(objects, "Deployment"), find(rendered, "Deployment", "istiod")
    assert ours["spec"]["selector"] == theirs["spec"]["selector"]
    assert ours["spec"]["strategy"] == theirs["spec"]["strategy"]
    ours_pod, theirs_pod = ours["spec"]["template"], theirs["spec"]["template"]
    assert ours_pod["metadata"]["annotations"] == theirs_pod["metadata"]["annotations"]
    assert ours_pod["metadata"]["labels"].items() <= theirs_pod["metadata"]["labels"].items()
    assert ours_pod["spec"]["serviceAccountName"] == theirs_pod["spec"]["serviceAccountName"] == "istiod"
    mine, istiod = container(ours), container(theirs)
    assert mine["name"] == istiod["name"] == "discovery"
    assert mine["args"] == istiod["args"] + INJECT_ARGS
    for field in ("ports", "readinessProbe", "resources"):
        assert mine[field] == istiod[field], field
    # istiod's security context, and the uid its image runs as (1337), which meshpilot's image sets too.
    assert mine["securityContext"] == {**istiod["securityContext"], "runAsUser": 1337, "runAsGroup": 1337}
    # The chart's environment but for what means nothing to meshpilot (an external control plane's
    # KUBECONFIG, ztunnel's node accounts), and ROOT_CA_DIR: istiod reads its relative default from /,
    # meshpilot's working directory is its own. GOMAXPROCS bounds the push workers.
    theirs_env = {e["name"]: e for e in istiod["env"]}
    dropped = {"KUBECONFIG", "CA_TRUSTED_NODE_ACCOUNTS", "PLATFORM"}
    assert [e for e in mine["env"] if e["name"] != "ROOT_CA_DIR"] == [
        e for name, e in theirs_env.items() if name not in dropped
    ]
    mesh, istiod_mesh = find(objects, "ConfigMap", "istio"), find(rendered, "ConfigMap", "istio")
    for key in ("mesh", "meshNetworks"):
        assert yaml.safe_load(mesh["data"][key]) == yaml.safe_load(istiod_mesh["data"][key]), key


@pytest.mark.reference
def test_the_webhook_configurations_are_istiods(istio_rendered: Callable[..., Objects]) -> None:
    rendered, objects = istio_rendered(), manifests()
    for kind, name in (
        ("MutatingWebhookConfiguration", "istio-sidecar-injector"),
        ("ValidatingWebhookConfiguration", "istio-validator-istio-system"),
    ):
        ours, theirs = find(objects, kind, name), find(rendered, kind, name)
        assert ours["metadata"]["labels"]["istio.io/rev"] == "default"  # what meshpilot's patcher selects
        expected = copy.deepcopy(theirs["webhooks"])
        if kind.startswith("Validating"):
            # The one difference (validatingwebhook.yaml says why): Fail from the start.
            assert [w["failurePolicy"] for w in expected] == ["Ignore"]
            expected[0]["failurePolicy"] = "Fail"
        assert ours["webhooks"] == expected, kind


@pytest.mark.reference
def test_istios_own_injector_configmap_loads_in_meshpilot(istio_rendered: Callable[..., Objects]) -> None:
    """deploy/'s injector ConfigMap uses meshpilot's built-in template; Istio's, with its templates, may
    replace it unchanged."""
    for configmap in (
        find(istio_rendered(), "ConfigMap", "istio-sidecar-injector"),
        find(manifests(), "ConfigMap", "istio-sidecar-injector"),
    ):
        config = check_templates(parse_config(configmap["data"]["config"], configmap["data"]["values"]))
        assert config.default_templates == ("sidecar",)
        assert config.values["global"]["istioNamespace"] == NAMESPACE


# -- On Kubernetes' API server --


@dataclass
class Cluster:
    kube: RealKubeApiServer
    #: The objects as the API server stored them.
    stored: Objects


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    with RealKubeApiServer() as kube, kube.api_client() as api:
        stored: Objects = []
        for obj in [*manifests(), *status_manifests()]:
            # A create with the official client: validation and admission refuse what they do not accept.
            for made in kube_utils.create_from_dict(api, copy.deepcopy(obj), namespace=NAMESPACE):
                stored.append(api.sanitize_for_serialization(made))
        yield Cluster(kube, stored)


def allowed(kube: RealKubeApiServer, verb: str, group: str, resource: str, namespace: str = "") -> bool:
    """The API server's answer: may istiod's service account do this (``namespace`` "" is every one)?"""
    resource, _, subresource = resource.partition("/")
    review = V1SubjectAccessReview(
        spec=V1SubjectAccessReviewSpec(
            user=SERVICE_ACCOUNT,
            # The groups a token of the service account authenticates with.
            groups=["system:serviceaccounts", f"system:serviceaccounts:{NAMESPACE}", "system:authenticated"],
            resource_attributes=V1ResourceAttributes(
                verb=verb, group=group, resource=resource, subresource=subresource, namespace=namespace
            ),
        )
    )
    with kube.api_client() as api:
        status = AuthorizationV1Api(api).create_subject_access_review(review).status
    return bool(status.allowed)


@pytest.mark.integration
@pytest.mark.reference
def test_every_object_is_accepted(cluster: Cluster) -> None:
    expected = [*manifests(), *status_manifests()]
    assert [(o["kind"], o["metadata"]["name"]) for o in cluster.stored] == [
        (o["kind"], o["metadata"]["name"]) for o in expected
    ]
    for obj in expected:
        namespace = obj["metadata"].get("namespace", "")
        kind = cluster.kube.resource_of(obj)
        stored = cluster.kube.get_resource(kind, namespace, obj["metadata"]["name"])
        assert stored is not None, obj["metadata"]["name"]
    # The webhook configurations as written: nothing defaulted away, the rules and selectors kept.
    for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
        stored = find(cluster.stored, kind)
        for mine, kept in zip(find(manifests(), kind)["webhooks"], stored["webhooks"], strict=True):
            for field in ("name", "rules", "namespaceSelector", "objectSelector", "failurePolicy"):
                if field in mine:
                    assert _without_scope(kept[field]) == _without_scope(mine[field]), field
            assert kept["clientConfig"]["service"]["path"] == mine["clientConfig"]["service"]["path"]


@pytest.mark.integration
@pytest.mark.reference
def test_kubectl_applies_the_kustomization(cluster: Cluster, tmp_path: Path) -> None:
    """`kubectl apply -k deploy/`, as docs/deploy.md says, against the same server (a server-side dry
    run: the objects are there already)."""
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl is not installed")
    kubeconfig = cluster.kube.write_kubeconfig(tmp_path / "kubeconfig")
    for target in (DEPLOY, DEPLOY / "status"):
        applied = subprocess.run(
            [kubectl, "--kubeconfig", str(kubeconfig), "apply", "-k", str(target), "--dry-run=server"],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert applied.returncode == 0, applied.stderr
        assert "deployment.apps/istiod" in applied.stdout


def _without_scope(value: Any) -> Any:
    """Rules come back with the API server's default ``scope: "*"``."""
    if isinstance(value, list):
        return [_without_scope(v) for v in value]
    if isinstance(value, dict):
        return {k: v for k, v in value.items() if k != "scope"}
    return value


@pytest.mark.integration
@pytest.mark.reference
def test_the_api_server_allows_every_verb_meshpilot_needs(cluster: Cluster) -> None:
    refused = [
        (verb, p.group, p.resource, p.scope.value)
        for p in PERMISSIONS
        for verb in p.verbs
        if not allowed(cluster.kube, verb, p.group, p.resource, "" if p.scope is Scope.CLUSTER else NAMESPACE)
    ]
    assert refused == []


@pytest.mark.integration
@pytest.mark.reference
def test_the_api_server_allows_no_more(cluster: Cluster) -> None:
    kube = cluster.kube
    # The namespace rules hold in istio-system only.
    for p in needed(Scope.ISTIO_NAMESPACE):
        for verb in p.verbs:
            assert allowed(kube, verb, p.group, p.resource, NAMESPACE)
            assert not allowed(kube, verb, p.group, p.resource, "default"), (verb, p.resource)
    # Verbs meshpilot never uses, which istiod's roles grant.
    for verb, group, resource, namespace in (
        ("delete", "", "configmaps", "default"),
        ("patch", "", "configmaps", "default"),
        ("get", "", "secrets", "default"),
        ("update", "", "secrets", NAMESPACE),
        ("create", "networking.istio.io", "workloadentries", "default"),
        ("update", "admissionregistration.k8s.io", "mutatingwebhookconfigurations/status", ""),
        ("create", "apps", "deployments", NAMESPACE),
        ("create", "certificates.k8s.io", "certificatesigningrequests", ""),
    ):
        assert not allowed(kube, verb, group, resource, namespace), (verb, group, resource, namespace)


# -- meshpilot as istiod's service account --


def _token(kube: RealKubeApiServer) -> str:
    """A token of istiod's service account for the API server, as the kubelet mounts it in the pod."""
    with kube.api_client() as api:
        request = {"spec": {"audiences": [SERVICE_ACCOUNT_ISSUER], "expirationSeconds": 3600}}
        status = CoreV1Api(api).create_namespaced_service_account_token("istiod", NAMESPACE, request).status
    return str(status.token)


def _kubeconfig(kube: RealKubeApiServer, path: Path) -> Path:
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {"name": "kube", "cluster": {"server": kube.url, "certificate-authority": str(kube.ca_file)}}
        ],
        "users": [{"name": "istiod", "user": {"token": _token(kube)}}],
        "contexts": [{"name": "istiod", "context": {"cluster": "kube", "user": "istiod"}}],
        "current-context": "istiod",
    }
    path.write_text(yaml.safe_dump(config))
    return path


def _by_url(configuration: dict[str, Any], url: str) -> dict[str, Any]:
    """The applied configuration, its webhooks sent to ``url`` + their path instead of the Service."""
    updated = copy.deepcopy(configuration)
    for webhook in updated["webhooks"]:
        service = webhook["clientConfig"].pop("service")
        webhook["clientConfig"]["url"] = url + service["path"]
    return updated


class Istiod(Process):
    """meshpilot started as the Deployment starts it (its arguments and environment), on loopback
    ports of its own, with the injector ConfigMap written as the volume would hold it."""

    def __init__(self, workdir: Path, kubeconfig: Path, deployment: dict[str, Any], injector: dict[str, Any]):
        self.http_port, self.webhook_port = free_port(), free_port()
        inject_dir = workdir / "inject"
        inject_dir.mkdir()
        for key, value in injector["data"].items():
            (inject_dir / key).write_text(value)
        spec = container(deployment)
        pod_fields = {"metadata.name": "istiod-5d8f7c9b4-x2x7q", "metadata.namespace": NAMESPACE}
        pod_fields["spec.serviceAccountName"] = "istiod"
        env = container_env(spec["env"], pod_fields)
        env["KUBERNETES_SERVICE_HOST"] = ""  # not in a pod: the kubeconfig's credentials
        assert spec["args"][0] == "discovery"
        argv = [
            sys.executable,
            "-m",
            "meshpilot.cli.main",
            *spec["args"],
            # Later flags win: the test's own addresses and files.
            "--kubeconfig",
            str(kubeconfig),
            "--injectConfig",
            str(inject_dir),
            f"--grpcAddr={HOST}:{free_port()}",
            f"--secureGRPCAddr={HOST}:{free_port()}",
            f"--httpAddr={HOST}:{self.http_port}",
            f"--httpsAddr={HOST}:{self.webhook_port}",
            f"--monitoringAddr={HOST}:{free_port()}",
        ]
        super().__init__("meshpilot", argv, workdir / "meshpilot.log", env)


@pytest.fixture(scope="module")
def istiod(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Istiod]:
    kube = cluster.kube
    workdir = tmp_path_factory.mktemp("istiod")
    objects = manifests()
    process = Istiod(
        workdir,
        _kubeconfig(kube, workdir / "kubeconfig"),
        find(objects, "Deployment"),
        find(objects, "ConfigMap", "istio-sidecar-injector"),
    )
    url = f"https://{HOST}:{process.webhook_port}"
    for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
        kube.apply(_by_url(find(objects, kind), url))
    process.start()
    try:
        eventually(lambda: _ready(process), timeout=60, what="meshpilot /ready")
        yield process
    except BaseException:
        print(f"===== meshpilot =====\n{process.log()[-8000:]}\n{kube.logs()}")
        raise
    finally:
        process.stop()


def _ready(process: Istiod) -> bool:
    assert process.running, f"meshpilot exited:\n{process.log()[-4000:]}"
    return http_get(HOST, process.http_port, "/ready")[0] == 200


def _root(kube: RealKubeApiServer, namespace: str) -> str | None:
    configmap = kube.get("configmaps", namespace, ROOT_CERT_CONFIGMAP)
    return None if configmap is None else configmap["data"].get(ROOT_CERT_KEY)


@pytest.mark.integration
@pytest.mark.reference
@pytest.mark.timeout(240)
def test_meshpilot_does_its_work_as_istiods_service_account(cluster: Cluster, istiod: Istiod) -> None:
    kube = cluster.kube
    # The CA's root, made and kept in istio-ca-secret, published in every namespace.
    secret = kube.get("secrets", NAMESPACE, "istio-ca-secret")
    assert secret is not None
    root = base64.b64decode(secret["data"]["ca-cert.pem"]).decode()
    for namespace in ("default", NAMESPACE):
        eventually(lambda ns=namespace: _root(kube, ns) == root, timeout=20, what=f"root cert in {namespace}")
    # An edited root-cert ConfigMap is set back (read and update).
    edited = kube.get("configmaps", "default", ROOT_CERT_CONFIGMAP)
    assert edited is not None
    edited["data"][ROOT_CERT_KEY] = "tampered"
    kube.apply(edited)
    eventually(lambda: _root(kube, "default") == root, timeout=20, what="the root cert set back")
    # The Lease, held by this pod.
    lease = eventually(lambda: kube.get("leases", NAMESPACE, STATUS_LEASE), timeout=20, what="the Lease")
    assert lease["spec"]["holderIdentity"] == "istiod-5d8f7c9b4-x2x7q"
    # Both webhook configurations carry the root as caBundle.
    bundle = base64.b64encode(root.encode()).decode()
    for resource, name in (
        ("mutatingwebhookconfigurations", "istio-sidecar-injector"),
        ("validatingwebhookconfigurations", "istio-validator-istio-system"),
    ):

        def patched(resource: str = resource, name: str = name) -> bool:
            stored = kube.get(resource, "", name) or {}
            return all(w["clientConfig"].get("caBundle") == bundle for w in stored.get("webhooks", []))

        eventually(patched, timeout=20, what=f"{name}'s caBundle")
    # Not one request refused on the way.
    log = istiod.log()
    assert "forbidden" not in log.lower(), log[-4000:]


def _virtual_service(name: str, weight: int, labels: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "networking.istio.io/v1",
        "kind": "VirtualService",
        "metadata": {"name": name, "namespace": "default", "labels": labels},
        "spec": {
            "hosts": ["reviews"],
            "http": [{"route": [{"destination": {"host": "reviews"}, "weight": weight}]}],
        },
    }


@pytest.mark.integration
@pytest.mark.reference
@pytest.mark.timeout(240)
def test_the_api_server_validates_through_the_applied_configuration(cluster: Cluster, istiod: Istiod) -> None:
    kube = cluster.kube
    revision = {"istio.io/rev": "default"}

    def refused() -> bool:
        try:
            kube.request(
                "POST",
                kube.resource("virtualservices").path("default"),
                _virtual_service("dry-run", -1, revision),
                query={"dryRun": "All"},
            )
        except StatusError as err:
            return "rev.validation.istio.io" in err.message
        return False

    # The caBundle patched in, the API server calls meshpilot.
    eventually(refused, timeout=30, what="the validating webhook in force")
    with pytest.raises(StatusError) as bad:
        kube.apply(_virtual_service("bad", -5, revision))
    assert bad.value.message.startswith('admission webhook "rev.validation.istio.io" denied the request')
    assert "weight -5 < 0" in bad.value.message
    assert kube.get("virtualservices", "default", "bad") is None
    kube.apply(_virtual_service("good", 100, revision))
    # The chart's objectSelector: config of no revision is not this webhook's (the base chart's
    # istiod-default-validator, not installed here, would take it).
    kube.apply(_virtual_service("no-revision", -5, {}))


@pytest.mark.integration
@pytest.mark.reference
@pytest.mark.timeout(240)
def test_the_api_server_injects_through_the_applied_configuration(cluster: Cluster, istiod: Istiod) -> None:
    kube = cluster.kube
    kube.apply(
        {
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {"name": "app", "labels": {"istio-injection": "enabled"}},
        }
    )
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "productpage", "namespace": "app", "labels": {"app": "productpage"}},
        "spec": {
            "serviceAccountName": "productpage",
            "containers": [{"name": "productpage", "image": "productpage:1"}],
        },
    }

    def injected() -> bool:
        made = kube.request("POST", "/api/v1/namespaces/app/pods", pod, query={"dryRun": "All"})
        return any(c["name"] == "istio-proxy" for c in made["spec"]["containers"])

    eventually(injected, timeout=30, what="the injection webhook in force")
    created = kube.apply(pod)
    assert [c["name"] for c in created["spec"]["containers"]] == ["productpage", "istio-proxy"]
    assert "sidecar.istio.io/status" in created["metadata"]["annotations"]
