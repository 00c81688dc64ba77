"""Decoding objects: kinds, API versions, core Kubernetes objects."""

from __future__ import annotations

from typing import Any

import pytest

from meshpilot.config.core_objects import KubeEndpointSlice, KubePod, KubeService
from meshpilot.config.decode import decode_object
from meshpilot.config.errors import ConfigError
from meshpilot.model.config import Config
from meshpilot.model.kind import Kind


@pytest.mark.parametrize("version", ["v1", "v1beta1", "v1alpha3"])
def test_every_networking_version_parses_into_the_same_config(version: str) -> None:
    raw = {
        "apiVersion": f"networking.istio.io/{version}",
        "kind": "DestinationRule",
        "metadata": {"name": "r", "namespace": "ns"},
        "spec": {"host": "reviews"},
    }
    result = decode_object(raw)
    assert isinstance(result.obj, Config)
    assert result.obj.kind is Kind.DESTINATION_RULE
    assert result.obj.spec.host == "reviews"
    assert (
        result.obj.spec_hash == decode_object({**raw, "apiVersion": "networking.istio.io/v1"}).obj.spec_hash
    )  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (
            {
                "apiVersion": "security.istio.io/v1alpha3",
                "kind": "PeerAuthentication",
                "metadata": {"name": "a"},
            },
            "unsupported version security.istio.io/v1alpha3 of PeerAuthentication",
        ),
        (
            {"apiVersion": "networking.istio.io/v1", "kind": "Telemetry", "metadata": {"name": "a"}},
            "unknown kind networking.istio.io/Telemetry",
        ),
        ({"kind": "Service", "metadata": {"name": "a"}}, "apiVersion is required"),
        ({"apiVersion": "v1", "metadata": {"name": "a"}}, "kind is required"),
        (
            {
                "apiVersion": "v1",
                "kind": "Service",
                "metadata": {"name": "a"},
                "spec": {"ports": [{"port": 0}]},
            },
            "port 0 is out of range",
        ),
        (
            {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "a"}, "spec": {"type": "Magic"}},
            "unsupported service type 'Magic'",
        ),
        (
            {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "a", "labels": {"v": 1}}},
            "must be a map of strings",
        ),
    ],
)
def test_rejected_objects(raw: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        decode_object(raw)


def test_core_objects() -> None:
    svc = decode_object(
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": "reviews"},
            "spec": {
                "clusterIP": "None",
                "selector": {"app": "r"},
                "ports": [{"name": "http", "port": 9080, "targetPort": "web", "appProtocol": "http"}],
            },
        }
    ).obj
    assert isinstance(svc, KubeService)
    assert svc.meta.namespace == "default"
    assert svc.is_headless
    assert svc.ports[0].target_port == "web"
    es = decode_object(
        {
            "apiVersion": "discovery.k8s.io/v1",
            "kind": "EndpointSlice",
            "metadata": {"name": "s", "namespace": "ns", "labels": {"kubernetes.io/service-name": "r"}},
            "ports": [{"name": "http", "port": 9080}],
            "endpoints": [
                {
                    "addresses": ["10.0.0.1"],
                    "conditions": {"ready": False},
                    "targetRef": {"kind": "Pod", "name": "p"},
                }
            ],
        }
    ).obj
    assert isinstance(es, KubeEndpointSlice)
    assert es.service_name == "r"
    assert es.endpoints[0].ready is False
    assert es.endpoints[0].target_ref == ("Pod", "ns", "p")
    pod = decode_object(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "p"},
            "spec": {
                "serviceAccountName": "sa",
                "containers": [{"ports": [{"name": "web", "containerPort": 8080}]}],
            },
            "status": {"podIPs": [{"ip": "10.0.0.1"}, {"ip": "fd00::1"}]},
        }
    ).obj
    assert isinstance(pod, KubePod)
    assert pod.pod_ips == ("10.0.0.1", "fd00::1")
    assert pod.container_ports[0].container_port == 8080
