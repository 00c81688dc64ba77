"""The workload a pod belongs to, which names ISTIO_META_OWNER and ISTIO_META_WORKLOAD_NAME."""

from __future__ import annotations

from meshpilot.webhooks.inject.context import Workload, pod_workload


def test_replicaset_with_the_template_hash_means_its_deployment() -> None:
    pod = {
        "metadata": {
            "generateName": "web-7d9f8-",
            "labels": {"pod-template-hash": "7d9f8"},
            "ownerReferences": [
                {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web-7d9f8", "controller": True}
            ],
        }
    }
    assert pod_workload(pod, "shop") == Workload("web", "shop", "apps/v1", "Deployment")


def test_other_controllers_are_the_workload_and_non_controllers_are_ignored() -> None:
    refs = [
        {"apiVersion": "v1", "kind": "ConfigMap", "name": "not-me"},
        {"apiVersion": "foo/v1", "kind": "Bar", "name": "custom", "controller": True},
    ]
    pod = {"metadata": {"name": "custom-0", "ownerReferences": refs}}
    assert pod_workload(pod, "ns") == Workload("custom", "ns", "foo/v1", "Bar")


def test_a_pod_without_a_controller_is_its_own_workload() -> None:
    assert pod_workload({"metadata": {"name": "solo"}}, "ns") == Workload("solo", "ns", "v1", "Pod")
    assert pod_workload({"metadata": {"generateName": "gen-"}}, "ns") == Workload("gen", "ns", "v1", "Pod")
