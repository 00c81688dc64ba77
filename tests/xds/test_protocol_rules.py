"""The ACK/NACK decision, as a pure function of the request and the watch state."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from meshpilot.model.proxy import NodeMetadata, parse_proxy
from meshpilot.xds import protocol
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


def _state(c: Connection) -> dict[str, tuple[object, ...]]:
    return {
        t: (w.names, w.wildcard, w.nonce_acked, w.version_acked, w.last_error, w.always_respond)
        for t, w in c.watched.items()
    }


names_pool = st.lists(st.sampled_from(["a", "b", "c"]), max_size=3, unique=True)
steps = st.lists(
    st.tuples(
        st.sampled_from([CDS, EDS]),
        names_pool,
        st.sampled_from(["sent", "old", ""]),
        st.sampled_from([None, None, None, "bad"]),
        st.booleans(),  # the server responded and set a new nonce afterwards
    ),
    max_size=25,
)


@given(steps)
@settings(max_examples=300, deadline=None)
def test_quiet_ack_reaches_the_same_state_as_decide(
    sequence: list[tuple[str, list[str], str, str | None, bool]],
) -> None:
    """The unparsed-ACK fast path is only a shortcut: every request leaves both connections alike."""
    plain, fast = conn(), conn()
    for i, (type_url, names, which, error, respond_after) in enumerate(sequence):
        nonces = []
        for c in (plain, fast):
            watch = c.watched.get(type_url)
            nonces.append(watch.nonce_sent if watch is not None and which == "sent" else which)
        assert nonces[0] == nonces[1]
        nonce = nonces[0]
        expected = decide(plain, type_url, names, nonce, error, hash(tuple(names)))
        digest = hash(tuple(names))
        if error is None and protocol.quiet_ack(fast, type_url, nonce, digest):
            got_respond = False
        else:
            got_respond = decide(fast, type_url, names, nonce, error, digest).respond
        assert got_respond == expected.respond
        assert _state(fast) == _state(plain)
        if respond_after:
            for c in (plain, fast):
                if type_url in c.watched:
                    sent(c, type_url, f"n{i}")
                    c.watched[type_url].version_sent = f"v{i}"
                if type_url == CDS and EDS in c.watched:
                    c.watched[EDS].always_respond = True  # as the stream does after sending clusters
