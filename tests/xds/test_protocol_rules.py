"""The ACK/NACK decision, as a pure function of the request and the watch state."""

from __future__ import annotations

from meshpilot.model.proxy import NodeMetadata, parse_proxy
from meshpilot.xds.connection import Connection
from meshpilot.xds.protocol import Verdict, decide

CDS = "type.googleapis.com/envoy.config.cluster.v3.Cluster"
EDS = "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment"


def conn() -> Connection:
    proxy = parse_proxy("sidecar~10.0.0.1~a.ns~ns.svc.cluster.local", NodeMetadata.parse({}))
    return Connection(proxy=proxy, peer="test")


def sent(c: Connection, type_url: str, nonce: str) -> None:
    c.watched[type_url].nonce_sent = nonce


def test_initial_then_ack_then_changed_wildcard() -> None:
    c = conn()
    first = decide(c, CDS, [], "", None)
    assert (first.verdict, first.respond) == (Verdict.INITIAL, True)
    assert c.watched[CDS].wildcard
    sent(c, CDS, "n1")
    ack = decide(c, CDS, [], "n1", None)
    assert (ack.verdict, ack.respond) == (Verdict.ACK, False)
    assert c.watched[CDS].nonce_acked == "n1"
    changed = decide(c, CDS, ["only-this"], "n1", None)
    assert (changed.verdict, changed.respond, changed.names) == (Verdict.ACK, True, None)


def test_non_wildcard_responds_only_with_added_names() -> None:
    c = conn()
    assert decide(c, EDS, ["a"], "", None).respond
    sent(c, EDS, "n1")
    added = decide(c, EDS, ["a", "b"], "n1", None)
    assert (added.respond, added.names) == (True, frozenset({"b"}))
    removed = decide(c, EDS, ["b"], "n1", None)
    assert removed.respond is False


def test_nack_stale_and_unsubscribe() -> None:
    c = conn()
    decide(c, EDS, ["a"], "", None)
    sent(c, EDS, "n1")
    nack = decide(c, EDS, ["a"], "n1", "bad config")
    assert (nack.verdict, nack.respond) == (Verdict.NACK, False)
    assert c.watched[EDS].last_error == "bad config"
    assert c.watched[EDS].nonce_acked == "", "a NACK is not an ACK"
    stale = decide(c, EDS, ["a", "z"], "old", None)
    assert (stale.verdict, stale.respond) == (Verdict.STALE, False)
    assert c.watched[EDS].names == {"a"}, "a stale request changes nothing"
    gone = decide(c, EDS, [], "n1", None)
    assert gone.verdict is Verdict.UNSUBSCRIBE
    assert EDS not in c.watched


def test_reconnect_with_a_nonce_is_answered_in_full() -> None:
    c = conn()
    decision = decide(c, EDS, ["a", "b"], "nonce-from-another-server", None)
    assert (decision.verdict, decision.respond, decision.names) == (Verdict.INITIAL, True, None)


def test_always_respond_answers_an_unchanged_ack_once() -> None:
    c = conn()
    decide(c, EDS, ["a"], "", None)
    sent(c, EDS, "n1")
    c.watched[EDS].always_respond = True
    assert decide(c, EDS, ["a"], "n1", None).respond is True
    assert decide(c, EDS, ["a"], "n1", None).respond is False
