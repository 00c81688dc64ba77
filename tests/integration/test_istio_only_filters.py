"""A real upstream Envoy, which lists its own extensions, gets none of Istio's proxy's filters and
rejects nothing, though its node metadata says Istio's agent started it and the mesh asks for Istio's
metrics (``defaultProviders.metrics: [prometheus]``) and Telemetry objects change them.

Without the capability rule (networking/extensions.py) meshpilot would send ``istio.stats``,
``istio.metadata_exchange`` and ``istio.alpn`` here as istiod does, and Envoy would reject the whole
listener and cluster updates naming them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from integration.conftest import MeshHarness
from support.kube import egress_sidecar, istio, workload, write
from support.processes import backend_name
from support.wait import eventually

pytestmark = [pytest.mark.envoy, pytest.mark.integration]

CLIENT_IP = "127.0.0.71"
EGRESS = "127.0.1.71"
REVIEWS = ("127.0.0.72", 9080)
ISTIO_ONLY = ("istio.stats", "istio.metadata_exchange", "istio.alpn", "stats.PluginConfig")


def _offered_alpns(node: Any) -> set[str]:
    found: set[str] = set()
    if isinstance(node, dict):
        for key, value in node.items():
            found |= set(value) if key == "alpn_protocols" else _offered_alpns(value)
    elif isinstance(node, list):
        for item in node:
            found |= _offered_alpns(item)
    return found


def _telemetry() -> dict[str, Any]:
    doc = istio(
        "Telemetry",
        "mesh-default",
        "istio-system",
        {
            "metrics": [
                {"overrides": [{"match": {"metric": "REQUEST_COUNT"}, "tagOverrides": {"x": {"value": "1"}}}]}
            ]
        },
        group="telemetry",
    )
    return doc


def test_upstream_envoy_gets_no_istio_only_filter_and_rejects_nothing(
    mesh: MeshHarness, tmp_path: Path
) -> None:
    mesh.write(
        "apps.yaml",
        [
            *workload("productpage", "default", "10.96.0.70", 9080, {"productpage-v1": CLIENT_IP}),
            *workload("reviews", "default", "10.96.0.72", 9080, {"reviews-v1": REVIEWS[0]}),
            egress_sidecar("productpage", EGRESS),
        ],
    )
    mesh_config = tmp_path / "mesh.yaml"
    mesh_config.write_text("defaultProviders: {metrics: [prometheus]}\n")
    mesh.backend("reviews-v1", *REVIEWS)
    meshpilot = mesh.start_meshpilot(mesh_config=mesh_config)
    envoy = mesh.sidecar("productpage-v1", CLIENT_IP, labels={"app": "productpage"})
    eventually(lambda: backend_name(EGRESS, "reviews")[1] == "reviews-v1", what="reviews routed")

    def clean() -> None:
        dump = envoy.config_dump()
        text = json.dumps(dump)
        for name in ISTIO_ONLY:
            assert name not in text, name
        assert "istio-peer-exchange" not in _offered_alpns(dump)
        # The in-mesh clusters still offer "istio", so a sidecar's permissive inbound takes the mTLS.
        assert "istio" in _offered_alpns(dump)
        assert not envoy.rejected_updates()
        assert meshpilot.metric('pilot_total_xds_rejects{type="lds"}') == 0
        assert meshpilot.metric('pilot_total_xds_rejects{type="cds"}') == 0

    clean()

    # A Telemetry object makes the listeners again (an upstream Envoy's come out the same: not resent).
    def lds_generated() -> float:
        return meshpilot.metric('pilot_xds_pushes{type="lds"}') + meshpilot.metric(
            'meshpilot_xds_unchanged_skipped{type="lds"}'
        )

    before = lds_generated()
    write(mesh.config_dir / "telemetry.yaml", [_telemetry()])
    eventually(lambda: lds_generated() > before, what="listeners generated again")
    clean()
    assert backend_name(EGRESS, "reviews")[1] == "reviews-v1"
