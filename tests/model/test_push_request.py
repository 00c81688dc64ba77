"""Merging push requests: keys united once, and "anything may have changed" never narrowed."""

from __future__ import annotations

from collections import Counter

from meshpilot.model.config import ConfigKey
from meshpilot.model.kind import Kind
from meshpilot.model.push_request import PushRequest, TriggerReason, merge_all

DR = ConfigKey(Kind.DESTINATION_RULE, "reviews", "default")
SE = ConfigKey(Kind.SERVICE_ENTRY, "reviews.default.svc.cluster.local", "default")


def _request(
    *keys: ConfigKey, full: bool = True, reason: TriggerReason = TriggerReason.CONFIG
) -> PushRequest:
    return PushRequest(full=full, configs_updated=frozenset(keys), reasons=Counter({reason: 1}))


def test_keys_are_united_and_reasons_added() -> None:
    merged = merge_all([_request(DR), _request(SE, full=False, reason=TriggerReason.ENDPOINT)])
    assert merged.full and merged.configs_updated == {DR, SE}
    assert merged.reasons == Counter({TriggerReason.CONFIG: 1, TriggerReason.ENDPOINT: 1})


def test_a_full_push_without_keys_stays_everything_whatever_it_is_merged_with() -> None:
    mesh_config = _request(reason=TriggerReason.GLOBAL)
    assert mesh_config.is_everything
    for order in (
        [mesh_config, _request(DR)],
        [_request(DR), mesh_config],
        [_request(SE, full=False), mesh_config],
    ):
        assert merge_all(order).is_everything
    assert _request(DR).merge(mesh_config).is_everything and mesh_config.merge(_request(DR)).is_everything


def test_endpoint_only_requests_stay_endpoint_only() -> None:
    merged = _request(SE, full=False).merge(_request(SE, full=False))
    assert not merged.full and merged.configs_updated == {SE} and not merged.is_everything
