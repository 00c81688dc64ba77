"""Delta xDS rules as pure functions: subscriptions, ACK/NACK, and what a response carries."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from meshpilot.model.proxy import NodeMetadata, parse_proxy
from meshpilot.xds import delta_protocol as dp
from meshpilot.xds.connection import Connection
from meshpilot.xds.delta_wire import delta_response
from meshpilot.xds.generators.base import Resource, ResourceList, payload_version

CDS = "type.googleapis.com/envoy.config.cluster.v3.Cluster"
EDS = "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment"


def conn() -> Connection:
    proxy = parse_proxy("sidecar~10.0.0.1~a.ns~ns.svc.cluster.local", NodeMetadata.parse({}))
    return Connection(proxy=proxy, peer="test", protocol="delta")


def res(name: str, body: bytes) -> Resource:
    return Resource(name, body)


def test_first_request_without_names_is_a_wildcard_and_is_answered() -> None:
    c = conn()
    decision = dp.decide(c, CDS, [], [], {}, "", None)
    assert decision.verdict is dp.Verdict.INITIAL and decision.respond and decision.names is None
    assert c.watched[CDS].wildcard and not c.watched[CDS].names


def test_first_request_with_kept_versions_records_what_the_proxy_holds() -> None:
    c = conn()
    version = dp.version_text(payload_version(b"a"))
    dp.decide(c, EDS, ["a"], [], {"a": version, "b": "not-ours"}, "", None)
    watch = c.watched[EDS]
    assert watch.names == {"a", "b"}, "names it kept are subscribed, as istiod counts them"
    assert watch.versions == {"a": payload_version(b"a")}, "a version this server did not make is not"


def test_ack_records_and_needs_no_response() -> None:
    c = conn()
    dp.decide(c, EDS, ["a"], [], {}, "", None)
    c.watched[EDS].nonce_sent = "n1"
    decision = dp.decide(c, EDS, [], [], {}, "n1", None)
    assert decision.verdict is dp.Verdict.ACK and not decision.respond
    assert c.watched[EDS].nonce_acked == "n1"


def test_subscribing_more_sends_only_the_added_names() -> None:
    c = conn()
    dp.decide(c, EDS, ["a"], [], {}, "", None)
    decision = dp.decide(c, EDS, ["a", "b"], [], {}, "", None)
    assert decision.verdict is dp.Verdict.SUBSCRIPTION and decision.respond and decision.names == {"b"}


def test_unsubscribing_forgets_the_version_and_needs_no_response() -> None:
    c = conn()
    dp.decide(c, EDS, ["a", "b"], [], {}, "", None)
    c.watched[EDS].versions["a"] = 1
    decision = dp.decide(c, EDS, [], ["a", "never"], {}, "", None)
    assert not decision.respond
    assert c.watched[EDS].names == {"b"} and "a" not in c.watched[EDS].versions


def test_nack_records_the_error_acknowledges_nothing_but_keeps_its_subscriptions() -> None:
    c = conn()
    dp.decide(c, EDS, ["a"], [], {}, "", None)
    c.watched[EDS].nonce_sent = "n1"
    assert not dp.decide(c, EDS, [], [], {}, "n1", "bad").respond
    decision = dp.decide(c, EDS, ["b"], [], {}, "n1", "bad again")
    assert decision.verdict is dp.Verdict.NACK
    assert decision.respond and decision.names == {"b"}, "Envoy will not subscribe to b again"
    assert c.watched[EDS].last_error == "bad again" and c.watched[EDS].names == {"a", "b"}
    assert c.watched[EDS].nonce_acked == ""


def test_a_nack_of_a_type_never_sent_creates_no_watch() -> None:
    c = conn()
    assert dp.decide(c, EDS, ["a"], [], {}, "n0", "bad").verdict is dp.Verdict.NACK
    assert EDS not in c.watched


def test_a_stale_nonce_does_not_ack_but_its_subscription_counts() -> None:
    c = conn()
    dp.decide(c, EDS, ["a"], [], {}, "", None)
    c.watched[EDS].nonce_sent = "n2"
    decision = dp.decide(c, EDS, ["b"], [], {}, "n1", None)
    assert decision.verdict is dp.Verdict.STALE and decision.names == {"b"}
    assert c.watched[EDS].nonce_acked == ""


def test_wildcard_types_ignore_named_subscriptions_until_star_is_asked_again() -> None:
    c = conn()
    dp.decide(c, CDS, ["x"], [], {}, "", None)
    assert not c.watched[CDS].wildcard
    assert not dp.decide(c, CDS, ["y"], [], {}, "", None).respond
    rejoin = dp.decide(c, CDS, ["*"], [], {}, "", None)
    assert rejoin.respond and rejoin.names is None and c.watched[CDS].wildcard
    assert not dp.decide(c, CDS, [], ["*"], {}, "", None).respond
    assert not c.watched[CDS].wildcard, "leaving * is recorded"


def test_names_too_long_or_too_many_are_refused_without_a_change() -> None:
    c = conn()
    dp.decide(c, EDS, ["a"], [], {}, "", None)
    with pytest.raises(dp.RefusedRequest) as long_name:
        dp.decide(c, EDS, ["x" * (dp.MAX_NAME_BYTES + 1)], [], {}, "", None)
    assert not long_name.value.exhausted
    with pytest.raises(dp.RefusedRequest) as too_many:
        dp.decide(c, EDS, [str(i) for i in range(dp.MAX_SUBSCRIPTIONS + 1)], [], {}, "", None)
    assert too_many.value.exhausted
    assert c.watched[EDS].names == {"a"}


def test_changes_carry_only_what_differs_and_removals_on_a_whole_response() -> None:
    c = conn()
    dp.decide(c, CDS, [], [], {}, "", None)
    watch = c.watched[CDS]
    first = ResourceList([res("a", b"1"), res("b", b"2")])
    sent = dp.changes(watch, first, whole=True)
    assert [r.name for r, _ in sent.updated] == ["a", "b"] and not sent.removed
    dp.record_sent(watch, sent)
    assert not dp.changes(watch, first, whole=True), "nothing differs"
    second = ResourceList([res("a", b"1"), res("c", b"3")])
    diff = dp.changes(watch, second, whole=True)
    assert [r.name for r, _ in diff.updated] == ["c"] and diff.removed == ["b"]
    partial = dp.changes(watch, [res("c", b"3")], whole=False)
    assert [r.name for r, _ in partial.updated] == ["c"] and not partial.removed, "a part removes nothing"


def test_forget_makes_an_unchanged_resource_go_out_again() -> None:
    c = conn()
    dp.decide(c, EDS, ["a"], [], {}, "", None)
    watch = c.watched[EDS]
    dp.record_sent(watch, dp.changes(watch, [res("a", b"1")], whole=True))
    dp.forget(watch, {"a"})
    assert [r.name for r, _ in dp.changes(watch, [res("a", b"1")], whole=True).updated] == ["a"]


def test_the_response_envelope_parses_as_envoy_reads_it() -> None:
    from envoy.service.discovery.v3 import discovery_pb2
    from google.protobuf import any_pb2

    payload = any_pb2.Any(type_url=CDS, value=b"\x0a\x01a").SerializeToString()
    changes = dp.Changes([(res("a", payload), 0xABC)], ["gone"])
    raw = delta_response("v7", CDS, "nonce-1", changes)
    parsed = discovery_pb2.DeltaDiscoveryResponse.FromString(raw)
    assert parsed.system_version_info == "v7" and parsed.type_url == CDS and parsed.nonce == "nonce-1"
    assert list(parsed.removed_resources) == ["gone"]
    (resource,) = parsed.resources
    assert resource.name == "a" and resource.version == "0000000000000abc"
    assert resource.resource.type_url == CDS and resource.resource.value == b"\x0a\x01a"


_names = st.lists(st.sampled_from(["a", "b", "c", "d"]), max_size=3)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(_names, _names, st.booleans()), min_size=1, max_size=12))
def test_subscriptions_follow_the_requests_and_only_added_names_are_answered(
    steps: list[tuple[list[str], list[str], bool]],
) -> None:
    c = conn()
    expected: set[str] = set()
    for i, (subscribe, unsubscribe, with_nonce) in enumerate(steps):
        watch = c.watched.get(EDS)
        nonce = watch.nonce_sent if watch is not None and with_nonce else ""
        decision = dp.decide(c, EDS, subscribe, unsubscribe, {}, nonce, None)
        before = set(expected)
        expected = (expected | set(subscribe)) - set(unsubscribe)
        if i == 0:
            assert decision.respond and decision.names is None
        else:
            added = expected - before
            assert decision.respond == bool(added) and (not added or decision.names == added)
        assert c.watched[EDS].names == expected
        c.watched[EDS].nonce_sent = f"n{i}"
