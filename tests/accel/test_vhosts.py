"""Route configurations with wire-encoded default hosts parse into exactly what the protobuf builder makes."""

from __future__ import annotations

import dataclasses
import importlib
from typing import Any

import pytest
from envoy.config.route.v3 import route_pb2
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.kube import istio, service, workload
from support.model import build

from meshpilot.model.protocol import Protocol
from meshpilot.networking import route_shared_hosts, vhosts, vhosts_py
from meshpilot.networking.protobuf import serialize
from meshpilot.networking.route import build_route_configuration, default_route, encode_route_configuration


def _compiled() -> Any:
    try:
        return importlib.import_module("meshpilot._ext.vhosts")
    except ImportError:
        return None


labels = st.sampled_from(["a", "b", "ns", "svc", "cluster", "local", "example", "com", "1", "10"])
hostnames = st.lists(labels, min_size=1, max_size=6).map(".".join)
domains = st.one_of(
    st.builds(lambda ns: f"{ns}.svc.cluster.local", st.sampled_from(["ns", "a", "default"])),
    hostnames,
)


@given(st.one_of(hostnames, st.sampled_from(["10.0.0.1", "fd00::1", "a.ns.svc.cluster.local"])), domains)
@settings(max_examples=500, deadline=None)
def test_alt_hosts_twins_agree(hostname: str, proxy_domain: str) -> None:
    compiled = _compiled()
    if compiled is None:
        pytest.skip("compiled extension not built")
    assert compiled.alt_hosts(hostname, proxy_domain) == vhosts_py.alt_hosts(hostname, proxy_domain)


port_names = st.sampled_from(["http", "http2", "grpc", "tcp", "web", "https", "http-x"])


@st.composite
def meshes(draw: Any) -> list[dict[str, Any]]:
    docs: list[dict[str, Any]] = list(workload("client", "ns", "10.96.0.1", 8080, {"client-0": "10.1.0.11"}))
    for i in range(draw(st.integers(1, 6))):
        ns = draw(st.sampled_from(["ns", "other"]))
        name = draw(st.sampled_from([f"s{i}", "dup"]))  # "dup" repeats a name across namespaces
        ports = draw(st.lists(st.sampled_from([80, 8080, 9080]), min_size=1, max_size=2, unique=True))
        svc_ports = [(f"{draw(port_names)}-{p}", p) for p in ports]
        kind = draw(st.sampled_from(["ClusterIP", "headless", "ExternalName"]))
        if kind == "headless":
            docs.append(service(name, ns, "None", svc_ports, {"app": name}))
        elif kind == "ExternalName":
            docs.append(
                service(name, ns, "", svc_ports, None, type="ExternalName", externalName="db.example.com")
            )
        else:
            docs.append(service(name, ns, f"10.96.1.{i}", svc_ports, {"app": name}))
    for i in range(draw(st.integers(0, 2))):
        # Addresses are kept as written: an upper-case one is lowercased only where domains are compared.
        addresses = draw(st.sampled_from([[], ["192.0.2.10"], ["2001:db8::5"], ["2001:DB8::6"]]))
        resolution = draw(st.sampled_from(["STATIC", "NONE"]))
        docs.append(
            istio(
                "ServiceEntry",
                f"se{i}",
                draw(st.sampled_from(["ns", "other"])),
                {
                    "hosts": [
                        # "s0" and "s1.other" are short names some namespace's hosts take too.
                        draw(
                            st.sampled_from(
                                ["api.example.com", "*.wild.com", "s0.ns.svc.cluster.local", "s0", "s1.other"]
                            )
                        )
                    ],
                    "addresses": addresses,
                    "location": "MESH_EXTERNAL",
                    "resolution": resolution,
                    "endpoints": [{"address": "198.51.100.1"}] if resolution == "STATIC" else [],
                    "ports": [
                        {"number": draw(st.sampled_from([80, 8080])), "name": "http", "protocol": "HTTP"}
                    ],
                },
            )
        )
    for i in range(draw(st.integers(0, 2))):
        host = draw(
            st.sampled_from(
                ["s0", "s1.other.svc.cluster.local", "api.example.com", "*.wild.com", "nowhere.io"]
            )
        )
        docs.append(
            istio(
                "VirtualService",
                f"vs{i}",
                draw(st.sampled_from(["ns", "other"])),
                {
                    "hosts": [host],
                    "http": [{"route": [{"destination": {"host": "s0.ns.svc.cluster.local"}}]}],
                },
            )
        )
    return docs


@given(meshes(), st.sampled_from(["REGISTRY_ONLY", "ALLOW_ANY"]))
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_encoded_route_configurations_equal_the_builders(docs: list[dict[str, Any]], policy: str) -> None:
    model = build(docs, mesh_yaml=f"outboundTrafficPolicy:\n  mode: {policy}\n")
    proxy = model.proxy("sidecar~10.1.0.11~client-0.ns~ns.svc.cluster.local")
    for name in ["80", "8080", "9080", "7", "s0.ns.svc.cluster.local:8080", "bogus"]:
        expected = build_route_configuration(proxy, model.push, name)
        encoded = encode_route_configuration(proxy, model.push, name)
        assert route_pb2.RouteConfiguration.FromString(encoded) == expected, name


@given(meshes())
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_namespaces_sharing_default_hosts_get_the_route_configurations_they_would_build_alone(
    docs: list[dict[str, Any]],
) -> None:
    _same_shared_or_alone(docs)


def test_an_upper_case_address_of_a_namespace_s_own_service_is_kept_when_hosts_are_shared() -> None:
    entry = istio(
        "ServiceEntry",
        "api",
        "ns",
        {
            "hosts": ["api.ns.svc.cluster.local"],
            "addresses": ["2001:DB8::1"],
            "location": "MESH_INTERNAL",
            "resolution": "STATIC",
            "endpoints": [{"address": "198.51.100.1"}],
            "ports": [{"number": 8080, "name": "http", "protocol": "HTTP"}],
        },
    )
    docs = [*workload("client", "ns", "10.96.0.1", 8080, {"client-0": "10.1.0.11"}), entry]
    # One pass from nowhere for 8080, shared by the three namespaces (80 and 9080 have no services).
    assert _same_shared_or_alone(docs) == 1


def _same_shared_or_alone(
    docs: list[dict[str, Any]], namespaces: tuple[str, ...] = ("ns", "other", "third")
) -> int:
    """Each namespace's route configurations, from one snapshot shared with the others and from one
    where nothing is shared, are the same bytes. Returns how many passes from nowhere the shared
    snapshot made (one per port with services and set of shared inputs when the namespaces share)."""
    model = build(docs)
    shared = model.env.build_push_context("shared")
    alone = model.env.build_push_context("alone")
    alone.share_outputs = False
    made = 0
    original = route_shared_hosts._neutral

    def counted(*args: Any) -> Any:
        nonlocal made
        made += 1
        return original(*args)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(route_shared_hosts, "_neutral", counted)
        # Every namespace shares, however many of the services it names: the guards are what is tested.
        patch.setattr(route_shared_hosts, "SHARE_BELOW", 2.0)
        for namespace in namespaces:
            node = f"sidecar~10.1.0.12~client-1.{namespace}~{namespace}.svc.cluster.local"
            proxy = model.proxy(node, {"NAMESPACE": namespace})
            for name in ["80", "8080", "9080"]:
                model.env.refresh_proxy(proxy, alone)
                expected = encode_route_configuration(proxy, alone, name)
                model.env.refresh_proxy(proxy, shared)
                assert encode_route_configuration(proxy, shared, name) == expected, (namespace, name)
    return made


def test_namespaces_each_routing_their_own_service_share_one_pass() -> None:
    """Every namespace has a service on 8080 and a VirtualService for it: its route configuration
    holds its own VirtualService's host by short name, and still shares the other hosts."""
    docs: list[dict[str, Any]] = []
    namespaces = ("a", "b", "c", "d")
    for i, namespace in enumerate(namespaces):
        docs.append(service(f"web{i}", namespace, f"10.96.2.{i}", [("http", 8080)], {"app": f"web{i}"}))
        docs.append(service("api", namespace, f"10.96.3.{i}", [("http", 8080)], {"app": "api"}))
        host = f"web{i}.{namespace}.svc.cluster.local"
        docs.append(
            istio(
                "VirtualService",
                f"web{i}",
                namespace,
                {"hosts": [host], "http": [{"route": [{"destination": {"host": host}}]}]},
            )
        )
    # One pass from nowhere for 8080 serves all four namespaces (80 and 9080 have no services).
    assert _same_shared_or_alone(docs, namespaces) == 1


def test_namespaces_with_destination_rules_of_their_own_share_one_pass() -> None:
    """A namespace with DestinationRules of its own builds its scope's service list itself; the same
    services in the same order still share one pass from nowhere."""
    docs: list[dict[str, Any]] = []
    namespaces = ("a", "b", "c", "d")
    for i, namespace in enumerate(namespaces):
        docs.append(service(f"web{i}", namespace, f"10.96.2.{i}", [("http", 8080)], {"app": f"web{i}"}))
        host = f"web{i}.{namespace}.svc.cluster.local"
        docs.append(istio("DestinationRule", f"web{i}", namespace, {"host": host}))
    model = build(docs)
    assert not model.push.destination_rules.same_for("a")  # so each namespace's scope is its own
    assert _same_shared_or_alone(docs, namespaces) == 1


def test_a_namespace_naming_most_services_encodes_alone_and_others_still_share() -> None:
    """Sharing would cost a namespace naming most services more than encoding every host: it encodes
    them all itself, with no pass from nowhere; a namespace naming few makes that pass once and then
    encodes only its own service's host."""
    docs = [
        *workload("client", "ns", "10.96.0.1", 8080, {"client-0": "10.1.0.11"}),
        *[service(f"s{i}", "ns", f"10.96.1.{i}", [("http", 8080)], {"app": f"s{i}"}) for i in range(5)],
        service("t", "other", "10.96.2.1", [("http", 8080)], {"app": "t"}),
    ]
    model = build(docs)
    alone = model.env.build_push_context("alone")
    alone.share_outputs = False
    shared = model.env.build_push_context("shared")
    encoded: list[int] = []  # how many services each call of the encoder was given
    original = vhosts.default_virtual_hosts

    def counted(services: Any, *args: Any) -> Any:
        encoded.append(len(services))
        return original(services, *args)

    calls = {}
    for namespace in ("ns", "other"):
        node = f"sidecar~10.1.0.12~client-1.{namespace}~{namespace}.svc.cluster.local"
        proxy = model.proxy(node, {"NAMESPACE": namespace})
        model.env.refresh_proxy(proxy, alone)
        expected = encode_route_configuration(proxy, alone, "8080")
        model.env.refresh_proxy(proxy, shared)
        encoded.clear()
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(vhosts, "default_virtual_hosts", counted)
            assert encode_route_configuration(proxy, shared, "8080") == expected, namespace
        calls[namespace] = list(encoded)
    # Seven services on 8080: "ns" names six and encodes all seven; "other" names one.
    assert calls == {"ns": [7], "other": [7, 1]}


def test_compiled_default_hosts_equal_the_twins() -> None:
    compiled = _compiled()
    if compiled is None:
        pytest.skip("compiled extension not built")
    docs = [
        *workload("client", "ns", "10.96.0.1", 8080, {"client-0": "10.1.0.11"}),
        *[
            service(f"s{i}", "ns" if i % 2 else "other", f"10.96.1.{i}", [("http", 8080)], {"app": "x"})
            for i in range(20)
        ],
        service("h", "ns", "None", [("http", 8080)], {"app": "h"}),
    ]
    model = build(docs)
    proxy = model.proxy("sidecar~10.1.0.11~client-0.ns~ns.svc.cluster.local")
    assert proxy.sidecar_scope is not None
    services = proxy.sidecar_scope.services
    from meshpilot.model.protocol import Protocol

    http = frozenset({Protocol.HTTP})
    results = []
    for module in (vhosts_py, compiled):
        seen_names: set[str] = {"s3.ns.svc.cluster.local:8080"}
        seen_domains: set[str] = {"s5"}
        out = module.default_virtual_hosts(
            services,
            8080,
            "ns.svc.cluster.local",
            http,
            {"s7.ns.svc.cluster.local"},
            {"s9"},
            seen_names,
            seen_domains,
            b"\x0a\x02\x0a\x00",
        )
        results.append((out, seen_names, seen_domains))
    assert results[0] == results[1]
    assert len(results[0][0]) == 20  # 22 services: s3 seen before, s7 covered by a VirtualService


host_labels = st.sampled_from(["a", "B", "ns", "svc", "cluster", "local", "com", "é", "10", ""])
service_hosts = st.one_of(
    st.lists(host_labels, min_size=1, max_size=6).map(".".join),
    st.sampled_from(["10.0.0.1", "a.ns.svc.cluster.local", "A.Ns.svc.cluster.local", "*.wild.com"]),
)


@st.composite
def raw_services(draw: Any) -> Any:
    from meshpilot.model.protocol import Protocol
    from meshpilot.model.service import Port, Registry, Resolution, Service

    ports = draw(st.lists(st.sampled_from([80, 8080]), min_size=1, max_size=2, unique=True))
    protocol = draw(st.sampled_from([Protocol.HTTP, Protocol.TCP]))
    return Service(
        hostname=draw(service_hosts),
        namespace="ns",
        name="s",
        ports=tuple(Port(f"p{p}", p, protocol) for p in ports),
        registry=draw(st.sampled_from(list(Registry))),
        addresses=tuple(draw(st.lists(st.sampled_from(["", "0.0.0.0", "10.0.0.1", "FD00::1"]), max_size=2))),
        resolution=draw(st.sampled_from(list(Resolution))),
    )


@given(st.lists(raw_services(), max_size=6), domains, st.sets(service_hosts, max_size=3))
@settings(max_examples=300, deadline=None)
def test_default_hosts_twins_agree_on_odd_services(
    services: list[Any], proxy_domain: str, seen: set[str]
) -> None:
    """Capitals, non-ASCII and empty labels, IPs, wildcards and repeated names give the same bytes."""
    compiled = _compiled()
    if compiled is None:
        pytest.skip("compiled extension not built")
    from meshpilot.model.protocol import Protocol

    results = []
    for module in (vhosts_py, compiled):
        _, _, known = module.services_on_port(services, 8080)
        seen_names, seen_domains = {f"{h}:8080" for h in seen}, set(seen)
        out = module.default_virtual_hosts(
            services,
            8080,
            proxy_domain,
            (Protocol.HTTP,),
            set(),
            known,
            seen_names,
            seen_domains,
            b"\x0a\x00",
        )
        results.append((out, seen_names, seen_domains))
    assert results[0] == results[1]


def _direct(
    docs: list[dict[str, Any]],
    namespace: str,
    known: set[str] | None = None,
    rename: dict[str, str] | None = None,
    reverse: bool = False,
) -> None:
    """``default_hosts`` called directly, for inputs the route builder does not make (``known``
    without the hostnames, hostnames validation refuses), is the encoder's answer: its guards fall
    back to the namespace's own encoding."""
    model = build(docs)
    push = model.env.build_push_context("direct")
    assert push.share_outputs
    listed = [
        dataclasses.replace(s, hostname=(rename or {}).get(s.hostname, s.hostname)) for s in push.services
    ]
    services, _, found_known = vhosts_py.services_on_port(listed[::-1] if reverse else listed, 8080)
    names = found_known if known is None else known
    template = serialize(default_route("", "", push.mesh))
    protocols = tuple(Protocol)
    domain = f"{namespace}.svc.cluster.local"
    for _ in range(2):  # the second call finds the pass from nowhere memoized
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(route_shared_hosts, "SHARE_BELOW", 2.0)  # shares, so that the guards decide
            shared = route_shared_hosts.default_hosts(
                push, services, 8080, domain, protocols, set(), names, set(), set(), template
            )
        alone = vhosts.default_virtual_hosts(
            services.values(), 8080, domain, protocols, set(), names, set(), set(), template
        )
        assert shared == alone


def _entry(name: str, namespace: str, host: str) -> dict[str, Any]:
    return istio(
        "ServiceEntry",
        name,
        namespace,
        {
            "hosts": [host],
            "location": "MESH_INTERNAL",
            "resolution": "NONE",
            "ports": [{"number": 8080, "name": "http", "protocol": "HTTP"}],
        },
    )


def test_a_short_name_a_later_host_took_from_nowhere_is_left_to_the_namespace_s_own_encoding() -> None:
    # Without ``known`` naming the hostname "s0", the entry's host takes "s0" in the pass from nowhere,
    # while in namespace "ns" the service s0.ns, encoded first, takes it: the two differ beyond the
    # namespace's own hosts.
    docs = [service("s0", "ns", "10.96.0.1", [("http", 8080)], {"app": "s0"}), _entry("x", "other", "s0")]
    _direct(docs, "ns", known=set(), reverse=True)
    _direct(docs, "ns", known=set())
    _direct(docs, "ns", reverse=True)


def test_a_hostname_naming_the_namespace_of_nowhere_is_encoded_alone() -> None:
    # No real namespace is named "\x00"; such a hostname got its short names in the pass from nowhere.
    docs = [
        service("s0", "ns", "10.96.0.1", [("http", 8080)], {"app": "s0"}),
        _entry("x", "other", "web.zz.svc.cluster.local"),
    ]
    _direct(docs, "ns", rename={"web.zz.svc.cluster.local": "web.\x00.svc.cluster.local"})
