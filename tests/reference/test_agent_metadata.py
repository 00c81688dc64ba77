"""The metadata the golden cases give their proxies is what Istio's own agent sends.

``tests/reference/agent_node_metadata.json`` is recorded from a real pilot-agent run
(tests/integration/test_istio_agent.py keeps it in step); ``support.golden.agent_metadata`` must
produce the same keys for the same pod, and the same values where they do not depend on the run.
"""

from __future__ import annotations

import json
from pathlib import Path

from support.golden import agent_metadata

RECORDED = json.loads(Path(__file__).with_name("agent_node_metadata.json").read_text())
NODE_ID = "sidecar~10.1.0.10~productpage-v1-6c9f8df8d-x7k2p.default~default.svc.cluster.local"

#: Keys the golden cases leave out, and why: they come from the Pod spec (its node and container
#: ports), which the cases' Pods do not have.
FROM_POD_SPEC = {"NODE_NAME", "POD_PORTS"}
#: Sent only with controlPlaneAuthPolicy MUTUAL_TLS (istiod's default), which the recording ran without.
WITH_MUTUAL_TLS = {"PILOT_SAN"}


def test_golden_proxies_carry_the_keys_the_real_agent_sends() -> None:
    made = agent_metadata(
        NODE_ID, {"LABELS": {"app": "productpage", "version": "v1"}, "SERVICE_ACCOUNT": "productpage"}
    )
    assert set(made) == (set(RECORDED) - FROM_POD_SPEC) | WITH_MUTUAL_TLS


def test_values_that_do_not_depend_on_the_run_agree() -> None:
    made = agent_metadata(
        NODE_ID, {"LABELS": {"app": "productpage", "version": "v1"}, "SERVICE_ACCOUNT": "productpage"}
    )
    for key in (
        "CLUSTER_ID",
        "MESH_ID",
        "METADATA_DISCOVERY",
        "NAMESPACE",
        "SERVICE_ACCOUNT",
        "LABELS",
        "OWNER",
    ):
        assert made[key] == RECORDED[key], key
    # The recording's pod is named as a Deployment's (productpage-v1-<hash>-<hash>); the cases' pods are not.
    assert RECORDED["WORKLOAD_NAME"] == "productpage-v1"
    assert set(made["PROXY_CONFIG"]) <= set(RECORDED["PROXY_CONFIG"])
