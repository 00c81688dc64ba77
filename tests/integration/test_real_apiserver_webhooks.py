"""meshpilot's webhooks called by Kubernetes' own kube-apiserver, and its TokenRequest/TokenReview.

A real API server (``support.real_kube``, built by `make reference`) is given webhook
configurations shaped as Istio's charts make them (``istio-sidecar-injector``'s
``namespace.sidecar-injector.istio.io`` and ``istiod-default-validator``'s ``validation.istio.io``,
failurePolicy Fail), pointed by URL at meshpilot's HTTPS port with the CA of the certificate it
serves, and kept to this module's namespace. Objects created through the API then go through
meshpilot: a Pod comes back with its sidecar, an invalid VirtualService is refused with istiod's
message. The API server's TokenRequest and TokenReview are checked too: the CA (issue 15, not built
yet) will authenticate workloads with them, and these tests show the real server here supports them.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from cryptography import x509
from kubernetes.client import AuthenticationV1Api, CoreV1Api, CustomObjectsApi
from kubernetes.client.exceptions import ApiException
from support import certs
from support.kube import istio, namespace
from support.processes import Meshpilot
from support.real_kube import RealKubeApiServer, StatusError, issue
from support.wait import eventually

from meshpilot.webhooks.tls import ISTIOD_DNS_NAMES

# The module's API server (etcd, kube-apiserver, Istio's CRDs) starts inside the first test's time.
pytestmark = [pytest.mark.integration, pytest.mark.reference, pytest.mark.timeout(240)]

NAMESPACE = "webhooks"
HOST = "127.0.0.1"


@dataclass
class Cluster:
    kube: RealKubeApiServer
    meshpilot: Meshpilot


def injector_configuration(url: str, ca_bundle: bytes) -> dict[str, Any]:
    """istiod's injector webhook for the default revision (istio-discovery's mutatingwebhook.yaml),
    by URL, kept to NAMESPACE by its name label."""
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": "istio-sidecar-injector"},
        "webhooks": [
            {
                "name": "namespace.sidecar-injector.istio.io",
                "clientConfig": {"url": url, "caBundle": base64.b64encode(ca_bundle).decode()},
                "sideEffects": "None",
                "rules": [
                    {
                        "operations": ["CREATE"],
                        "apiGroups": [""],
                        "apiVersions": ["v1"],
                        "resources": ["pods"],
                    }
                ],
                "failurePolicy": "Fail",
                "reinvocationPolicy": "Never",
                "admissionReviewVersions": ["v1"],
                "namespaceSelector": {
                    "matchExpressions": [
                        {"key": "istio-injection", "operator": "In", "values": ["enabled"]},
                        {"key": "kubernetes.io/metadata.name", "operator": "In", "values": [NAMESPACE]},
                    ]
                },
                "objectSelector": {
                    "matchExpressions": [
                        {"key": "sidecar.istio.io/inject", "operator": "NotIn", "values": ["false"]}
                    ]
                },
            }
        ],
    }


def validator_configuration(url: str, ca_bundle: bytes) -> dict[str, Any]:
    """istiod's default validator (base chart's istiod-default-validator), kept to NAMESPACE."""
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": "istiod-default-validator"},
        "webhooks": [
            {
                "name": "validation.istio.io",
                "clientConfig": {"url": url, "caBundle": base64.b64encode(ca_bundle).decode()},
                "rules": [
                    {
                        "operations": ["CREATE", "UPDATE"],
                        "apiGroups": [
                            "security.istio.io",
                            "networking.istio.io",
                            "telemetry.istio.io",
                            "extensions.istio.io",
                        ],
                        "apiVersions": ["*"],
                        "resources": ["*"],
                    }
                ],
                "failurePolicy": "Fail",
                "sideEffects": "None",
                "admissionReviewVersions": ["v1"],
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": NAMESPACE}},
            }
        ],
    }


def app_pod(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NAMESPACE, "labels": {"app": "productpage"}},
        # Named, as the ServiceAccount admission plugin (off in this server) would name `default`: the
        # sidecar's projected istio-token volume is refused for a pod without a service account.
        "spec": {
            "serviceAccountName": "productpage",
            "containers": [
                {"name": "productpage", "image": "productpage:1", "ports": [{"containerPort": 9080}]}
            ],
        },
    }


def virtual_service(name: str, weight: int) -> dict[str, Any]:
    return istio(
        "VirtualService",
        name,
        NAMESPACE,
        {"hosts": ["reviews"], "http": [{"route": [{"destination": {"host": "reviews"}, "weight": weight}]}]},
    )


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    workdir = tmp_path_factory.mktemp("real-webhooks")
    with RealKubeApiServer() as kube:
        # meshpilot's serving certificate, from a CA of its own: the caBundle the API server trusts.
        ca = certs.TestCA()
        cert, key = issue(
            ca,
            x509.Name([]),
            server=True,
            dns=ISTIOD_DNS_NAMES,
            ips=(HOST,),
        )
        (workdir / "tls.crt").write_bytes(cert)
        (workdir / "tls.key").write_bytes(key)
        tls = ["--tls-cert-file", str(workdir / "tls.crt"), "--tls-key-file", str(workdir / "tls.key")]
        mp = Meshpilot(workdir, None, kubeconfig=kube.write_kubeconfig(workdir / "kubeconfig"), extra=tls)
        mp.start()
        try:
            mp.wait_ready()
            kube.apply(namespace(NAMESPACE, **{"istio-injection": "enabled"}))
            webhook = f"https://{HOST}:{mp.webhook_port}"
            kube.apply(injector_configuration(f"{webhook}/inject", ca.root_pem))
            kube.apply(validator_configuration(f"{webhook}/validate", ca.root_pem))
            # The API server picks the configurations up a moment later: a dry run shows when.
            eventually(lambda: _refused_dry_run(kube), timeout=20, what="the validating webhook in force")
            eventually(lambda: _injected_dry_run(kube), timeout=20, what="the injecting webhook in force")
            yield Cluster(kube, mp)
        except BaseException:
            print(f"===== meshpilot =====\n{mp.log()[-6000:]}\n{kube.logs()}")
            raise
        finally:
            mp.stop()


def _refused_dry_run(kube: RealKubeApiServer) -> bool:
    path = kube.resource("virtualservices").path(NAMESPACE)
    try:
        kube.request("POST", path, virtual_service("dry-run", -1), query={"dryRun": "All"})
    except StatusError as err:
        return "validation.istio.io" in err.message
    return False


def _injected_dry_run(kube: RealKubeApiServer) -> bool:
    created = kube.request(
        "POST", f"/api/v1/namespaces/{NAMESPACE}/pods", app_pod("dry-run"), query={"dryRun": "All"}
    )
    return any(c["name"] == "istio-proxy" for c in created["spec"]["containers"])


def test_a_pod_created_through_the_api_server_gets_its_sidecar(cluster: Cluster) -> None:
    before = cluster.meshpilot.metric("sidecar_injection_success_total")
    with cluster.kube.api_client() as client:
        created = CoreV1Api(client).create_namespaced_pod(NAMESPACE, app_pod("productpage-1"))
    containers = [c.name for c in created.spec.containers]
    assert containers[0] == "productpage"
    assert "istio-proxy" in containers
    assert [c.name for c in created.spec.init_containers or []] == ["istio-init"]
    assert "sidecar.istio.io/status" in created.metadata.annotations
    # What the API server stored is the injected pod, and meshpilot counted the injection.
    stored = cluster.kube.get("pods", NAMESPACE, "productpage-1")
    assert stored is not None
    assert [c["name"] for c in stored["spec"]["containers"]] == containers
    assert cluster.meshpilot.metric("sidecar_injection_success_total") == before + 1


def test_a_pod_that_opts_out_by_label_is_not_sent_to_meshpilot(cluster: Cluster) -> None:
    """The chart's objectSelector keeps the API server from calling the webhook at all."""
    requests = cluster.meshpilot.metric("sidecar_injection_requests_total")
    pod = app_pod("opted-out")
    pod["metadata"]["labels"]["sidecar.istio.io/inject"] = "false"
    created = cluster.kube.apply(pod)
    assert [c["name"] for c in created["spec"]["containers"]] == ["productpage"]
    assert cluster.meshpilot.metric("sidecar_injection_requests_total") == requests


def test_a_pod_that_opts_out_by_annotation_is_skipped_by_meshpilot(cluster: Cluster) -> None:
    """The annotation is meshpilot's to read: the API server calls it, and it answers without a patch."""
    skipped = cluster.meshpilot.metric("sidecar_injection_skip_total")
    pod = app_pod("opted-out-annotation")
    pod["metadata"].setdefault("annotations", {})["sidecar.istio.io/inject"] = "false"
    created = cluster.kube.apply(pod)
    assert [c["name"] for c in created["spec"]["containers"]] == ["productpage"]
    assert cluster.meshpilot.metric("sidecar_injection_skip_total") == skipped + 1


def test_a_valid_virtual_service_is_admitted(cluster: Cluster) -> None:
    with cluster.kube.api_client() as client:
        CustomObjectsApi(client).create_namespaced_custom_object(
            "networking.istio.io", "v1", NAMESPACE, "virtualservices", virtual_service("good", 100)
        )
    assert cluster.kube.get("virtualservices", NAMESPACE, "good") is not None


def test_an_invalid_virtual_service_is_refused_by_the_api_server(cluster: Cluster) -> None:
    with pytest.raises(StatusError) as created:
        cluster.kube.apply(virtual_service("bad", -5))
    assert created.value.code == 400
    assert created.value.message.startswith('admission webhook "validation.istio.io" denied the request')
    assert cluster.kube.get("virtualservices", NAMESPACE, "bad") is None
    # An update to an invalid spec is refused too; the stored object stays as it was.
    cluster.kube.apply(virtual_service("updated", 100))
    with pytest.raises(StatusError) as updated:
        cluster.kube.apply(virtual_service("updated", -5))
    assert updated.value.message.startswith('admission webhook "validation.istio.io" denied the request')
    stored = cluster.kube.get("virtualservices", NAMESPACE, "updated")
    assert stored is not None and stored["spec"]["http"][0]["route"][0]["weight"] == 100


def test_the_refusal_carries_istiods_message(cluster: Cluster) -> None:
    with cluster.kube.api_client() as client, pytest.raises(ApiException) as refused:
        CustomObjectsApi(client).create_namespaced_custom_object(
            "networking.istio.io", "v1", NAMESPACE, "virtualservices", virtual_service("bad-message", -5)
        )
    assert json.loads(refused.value.body)["message"] == (
        'admission webhook "validation.istio.io" denied the request: '
        "configuration is invalid: 1 error occurred:\n\t* weight -5 < 0\n\n"
    )


def test_a_requested_token_is_reviewed_as_its_service_account(cluster: Cluster) -> None:
    cluster.kube.apply(
        {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": {"name": "reviews", "namespace": NAMESPACE},
        }
    )
    with cluster.kube.api_client() as client:
        token = (
            CoreV1Api(client)
            .create_namespaced_service_account_token(
                "reviews",
                NAMESPACE,
                {
                    "apiVersion": "authentication.k8s.io/v1",
                    "kind": "TokenRequest",
                    "spec": {"audiences": ["istio-ca"], "expirationSeconds": 600},
                },
            )
            .status.token
        )
        reviews = AuthenticationV1Api(client)
        review = reviews.create_token_review({"spec": {"token": token, "audiences": ["istio-ca"]}})
        assert review.status.authenticated is True
        assert review.status.user.username == f"system:serviceaccount:{NAMESPACE}:reviews"
        assert review.status.audiences == ["istio-ca"]
        # The token is for the CA's audience only.
        other = reviews.create_token_review({"spec": {"token": token, "audiences": ["someone-else"]}})
        assert not other.status.authenticated
