"""istiod's push logs from a real meshpilot process: ``--log_output_level=ads:debug --log_as_json``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from envoy.config.cluster.v3 import cluster_pb2
from support.ads_client import AdsClient
from support.kube import istio, workload, write
from support.processes import Meshpilot
from support.wait import eventually

pytestmark = [pytest.mark.integration]

CDS = "type.googleapis.com/envoy.config.cluster.v3.Cluster"
NODE = "sidecar~127.0.0.11~productpage-v1.default~default.svc.cluster.local"
PROXY_ID = "productpage-v1.default"


def _lines(mp: Meshpilot) -> list[dict[str, Any]]:
    out = []
    for line in mp.log().splitlines():
        if line.strip():
            out.append(json.loads(line))  # every line is JSON: a plain one fails here
    return out


async def test_push_logs_as_json_with_ads_at_debug(tmp_path: Path) -> None:
    config = tmp_path / "config"
    write(
        config / "apps.yaml",
        [
            *workload("productpage", "default", "10.96.0.10", 9080, {"productpage-v1": "127.0.0.11"}),
            *workload("ratings", "default", "10.96.0.30", 9080, {"ratings-v1": "127.0.0.31"}),
        ],
    )
    mp = Meshpilot(
        tmp_path,
        config,
        extra=["--log-level", "info", "--log_output_level=ads:debug", "--log_as_json"],
    )
    mp.start()
    client: AdsClient | None = None
    try:
        mp.wait_ready()
        client = AdsClient(f"127.0.0.1:{mp.grpc_port}")
        client.send(CDS, node_id=NODE)
        first = await client.recv(10)
        client.ack(first)
        rule = {"host": "ratings", "trafficPolicy": {"loadBalancer": {"simple": "RANDOM"}}}
        write(config / "rule.yaml", [istio("DestinationRule", "ratings", "default", rule)])
        pushed = await client.recv(10)
        client.ack(pushed)
        clusters = [cluster_pb2.Cluster.FromString(r.value) for r in pushed.resources]

        def push_lines() -> tuple[dict[str, Any], dict[str, Any]] | None:
            lines = _lines(mp)
            stable = [
                line
                for line in lines
                if line["msg"].startswith("Push debounce stable") and "DestinationRule" in line["msg"]
            ]
            sent = [
                line
                for line in lines
                if line["msg"].startswith("CDS: PUSH for node:") and pushed.nonce in line["msg"]
            ]
            return (stable[0], sent[0]) if stable and sent else None

        stable, sent = eventually(push_lines, what="the push's log lines")
    finally:
        if client is not None:
            await client.close()
        mp.stop()

    lines = _lines(mp)
    assert {"time", "level", "msg"} <= set(stable) and stable["time"].endswith("Z")
    assert (stable["level"], stable["scope"]) == ("info", "ads")
    assert " 1 for config DestinationRule/default/ratings: " in stable["msg"]
    assert "since last change" in stable["msg"] and stable["msg"].endswith("forced=false")
    assert (sent["level"], sent["scope"]) == ("debug", "ads")
    assert f"for node:{PROXY_ID} resources:{len(clusters)} size:" in sent["msg"]
    assert f"version:{pushed.version_info}" in sent["msg"]
    pushing = [line for line in lines if line["msg"].startswith("XDS: Pushing Services:")]
    assert any(
        line["msg"].endswith(f" ConnectedEndpoints:1 Version:{pushed.version_info}")
        and line["scope"] == "ads"
        for line in pushing
    ), pushing
    # ads at debug, every other scope at info: no other scope's debug lines.
    assert {line.get("scope", "default") for line in lines if line["level"] == "debug"} <= {"ads"}
    assert any(line["level"] == "info" and "scope" not in line for line in lines), "default-scope lines"
