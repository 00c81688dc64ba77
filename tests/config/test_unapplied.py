"""Config stored but not applied (in full) is logged by name and counted, never passed over in silence."""

from __future__ import annotations

import logging

import pytest
from prometheus_client import CollectorRegistry

from meshpilot.config.decode import decode_object
from meshpilot.config.store import ConfigStore
from meshpilot.config.unapplied import UnappliedConfig
from meshpilot.model.config import Config, ConfigKey
from meshpilot.model.kind import Kind
from meshpilot.networking.envoyfilter.patches import unapplied


def _envoy_filter(name: str) -> Config:
    obj = decode_object(
        {
            "apiVersion": "networking.istio.io/v1alpha3",
            "kind": "EnvoyFilter",
            "metadata": {"name": name, "namespace": "shop"},
            "spec": {
                "configPatches": [
                    {
                        "applyTo": "EXTENSION_CONFIG",
                        "patch": {"operation": "ADD", "value": {"name": "ecds"}},
                    }
                ]
            },
        }
    ).obj
    assert isinstance(obj, Config), obj
    return obj


def test_an_envoy_filter_is_logged_by_name_and_counted(
    caplog: pytest.LogCaptureFixture,
) -> None:
    registry = CollectorRegistry()
    store = ConfigStore()
    store.add_handler(UnappliedConfig(registry, {Kind.ENVOY_FILTER: unapplied}).on_event)

    def count() -> float | None:
        return registry.get_sample_value("meshpilot_unapplied_config", {"kind": "EnvoyFilter"})

    assert count() == 0
    with caplog.at_level(logging.WARNING, logger="meshpilot.config.unapplied"):
        store.upsert(_envoy_filter("timeouts"))
        store.upsert(_envoy_filter("more"))
    assert count() == 2
    assert (
        "EnvoyFilter shop/timeouts is stored but not applied in full: patch 0 (EXTENSION_CONFIG"
        in caplog.text
    )
    store.delete(ConfigKey(Kind.ENVOY_FILTER, "timeouts", "shop"))
    assert count() == 1
