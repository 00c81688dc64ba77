"""Real gRPC clients resolve ``xds:///`` targets through meshpilot and call real gRPC servers."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

import pytest
from support.grpc_mesh import GrpcClient, NameServer, write_bootstrap, xds_server
from support.kube import istio, namespace, workload
from support.wait import eventually

pytestmark = [pytest.mark.integration]

# Addresses of their own (127.0.5.0/24): other suites' servers bind 127.0.0.x:9080.
CLIENT_IP = "127.0.5.50"
REVIEWS = "xds:///reviews.default.svc.cluster.local:9080"
SUBSETS = [{"name": "v1", "labels": {"version": "v1"}}, {"name": "v2", "labels": {"version": "v2"}}]


def reviews_rule(subsets: list[dict[str, object]] = SUBSETS) -> dict[str, object]:
    return istio("DestinationRule", "reviews", "default", {"host": "reviews", "subsets": subsets})


def reviews_routes(*http: dict[str, object]) -> dict[str, object]:
    return istio("VirtualService", "reviews", "default", {"hosts": ["reviews"], "http": list(http)})


def to(subset: str, weight: int | None = None) -> dict[str, object]:
    out: dict[str, object] = {"destination": {"host": "reviews", "subset": subset}}
    if weight is not None:
        out["weight"] = weight
    return out


@pytest.fixture
def servers() -> Iterator[dict[str, NameServer]]:
    started: dict[str, NameServer] = {}
    try:
        for name, ip in (
            ("reviews-v1", "127.0.5.41"),
            ("reviews-v2", "127.0.5.42"),
            ("ratings-v1", "127.0.5.43"),
        ):
            started[name] = NameServer(name, ip, 9080).start()
        yield started
    finally:
        for server in started.values():
            server.stop()


def node_metadata(ip: str, labels: dict[str, str]) -> dict[str, object]:
    return {
        "GENERATOR": "grpc",
        "NAMESPACE": "default",
        "INSTANCE_IPS": ip,
        "CLUSTER_ID": "Kubernetes",
        "ISTIO_VERSION": "1.28.0",
        "LABELS": labels,
    }


@pytest.fixture
def client(mesh, servers) -> Iterator[GrpcClient]:
    mesh.write("namespace.yaml", [namespace("default")])
    mesh.write(
        "reviews.yaml",
        workload(
            "reviews",
            "default",
            "10.96.0.20",
            9080,
            {"reviews-v1": "127.0.5.41", "reviews-v2": "127.0.5.42"},
            versions={"reviews-v1": "v1", "reviews-v2": "v2"},
            port_name="grpc",
        ),
    )
    mesh.write(
        "ratings.yaml",
        workload("ratings", "default", "10.96.0.30", 9080, {"ratings-v1": "127.0.5.43"}, port_name="grpc"),
    )
    mp = mesh.start_meshpilot()
    path = write_bootstrap(
        mesh.tmp / "grpc-bootstrap.json",
        xds_port=mp.grpc_port,
        node_id=f"sidecar~{CLIENT_IP}~grpc-client.default~default.svc.cluster.local",
        metadata=node_metadata(CLIENT_IP, {"app": "grpc-client"}),
    )
    grpc_client = GrpcClient(mesh.tmp, "client", path, trace="xds_client")
    try:
        yield grpc_client
    finally:
        grpc_client.stop()


def rejected(mesh) -> float:
    """NACKs meshpilot counted: gRPC rejects any resource it cannot use."""
    return sum(
        v for k, v in mesh.meshpilot.metrics().items() if k.startswith("pilot_total_xds_rejects_total")
    )


def answers(client: GrpcClient, n: int, target: str = REVIEWS, metadata=()) -> Counter[str]:
    names, errors = client.calls(target, n, metadata)
    assert not errors, f"failed calls: {errors}\n{client.log()}"
    return names


def test_calls_reach_the_service_dialled(mesh, client, servers) -> None:
    assert answers(client, 10, "xds:///ratings.default.svc.cluster.local:9080") == Counter({"ratings-v1": 10})
    # The short name resolves in the client's namespace, as istiod resolves it.
    assert answers(client, 10, "xds:///ratings:9080") == Counter({"ratings-v1": 10})
    # Round robin over both endpoints of reviews.
    spread = answers(client, 40)
    assert set(spread) == {"reviews-v1", "reviews-v2"}
    assert min(spread.values()) >= 10
    assert servers["ratings-v1"].calls == 20
    assert rejected(mesh) == 0


def test_weighted_routes_split_calls(mesh, client) -> None:
    mesh.write("routing.yaml", [reviews_rule(), reviews_routes({"route": [to("v1", 80), to("v2", 20)]})])

    def split_applied() -> bool:
        # The old config sends half the calls to v1; the new one 80%.
        return answers(client, 50)["reviews-v1"] >= 35

    eventually(split_applied, timeout=30, what="the weighted route applied")
    n = 400
    spread = answers(client, n)
    assert sum(spread.values()) == n
    # 80/20 with 400 calls: the standard deviation is 8 calls (2%); allow 3.5 of them.
    assert abs(spread["reviews-v1"] / n - 0.8) <= 0.07, spread
    assert set(spread) == {"reviews-v1", "reviews-v2"}
    assert rejected(mesh) == 0


def test_a_metadata_match_routes_to_a_subset(mesh, client) -> None:
    mesh.write(
        "routing.yaml",
        [
            reviews_rule(),
            reviews_routes(
                {
                    "match": [{"headers": {"end-user": {"exact": "jason"}}}],
                    "route": [to("v2")],
                    # gRPC has no CORS filter; its per-route config must not reach the client.
                    "corsPolicy": {"allowOrigins": [{"exact": "https://example.com"}]},
                },
                {"route": [to("v1")]},
            ),
        ],
    )
    eventually(lambda: answers(client, 20) == Counter({"reviews-v1": 20}), timeout=30, what="default to v1")
    assert answers(client, 20, metadata=[("end-user", "jason")]) == Counter({"reviews-v2": 20})
    assert answers(client, 20, metadata=[("end-user", "someone-else")]) == Counter({"reviews-v1": 20})
    assert rejected(mesh) == 0


def test_a_destination_rule_subset_selects_endpoints_by_label(mesh, client) -> None:
    stable = [{"name": "stable", "labels": {"version": "v1"}}]
    mesh.write("routing.yaml", [reviews_rule(stable), reviews_routes({"route": [to("stable")]})])
    eventually(
        lambda: answers(client, 20) == Counter({"reviews-v1": 20}), timeout=30, what="subset stable is v1"
    )
    # The same subset name, now selecting other labels: only the DestinationRule changes.
    stable[0]["labels"] = {"version": "v2"}
    mesh.write("routing.yaml", [reviews_rule(stable), reviews_routes({"route": [to("stable")]})])
    eventually(
        lambda: answers(client, 20) == Counter({"reviews-v2": 20}), timeout=30, what="subset stable is v2"
    )
    assert rejected(mesh) == 0


def test_a_virtual_service_change_moves_a_running_client(mesh, client) -> None:
    pid = client.proc.pid
    mesh.write("routing.yaml", [reviews_rule(), reviews_routes({"route": [to("v1")]})])
    eventually(lambda: answers(client, 20) == Counter({"reviews-v1": 20}), timeout=30, what="all on v1")
    mesh.write("routing.yaml", [reviews_rule(), reviews_routes({"route": [to("v2")]})])
    eventually(lambda: answers(client, 20) == Counter({"reviews-v2": 20}), timeout=30, what="all on v2")
    mesh.remove("routing.yaml")
    eventually(
        lambda: set(answers(client, 20)) == {"reviews-v1", "reviews-v2"}, timeout=30, what="both again"
    )
    # One process and one channel throughout: the pushes reached a running client.
    assert client.proc.pid == pid and client.proc.poll() is None
    assert rejected(mesh) == 0


def test_an_xds_server_serves_with_the_listener_meshpilot_sends(mesh, client) -> None:
    # A third reviews pod whose server is xDS-enabled: it serves only once it has its listener.
    mesh.write(
        "reviews.yaml",
        workload(
            "reviews",
            "default",
            "10.96.0.20",
            9080,
            {"reviews-v1": "127.0.5.41", "reviews-v2": "127.0.5.42", "reviews-v3": "127.0.5.44"},
            versions={"reviews-v1": "v1", "reviews-v2": "v2", "reviews-v3": "v3"},
            port_name="grpc",
        ),
    )
    path = write_bootstrap(
        mesh.tmp / "grpc-server-bootstrap.json",
        xds_port=mesh.meshpilot.grpc_port,
        node_id="sidecar~127.0.5.44~reviews-v3.default~default.svc.cluster.local",
        metadata=node_metadata("127.0.5.44", {"app": "reviews", "version": "v3"}),
    )
    server = xds_server(mesh.tmp, "reviews-v3", "127.0.5.44", 9080, path)
    try:
        mesh.write(
            "routing.yaml",
            [
                reviews_rule([*SUBSETS, {"name": "v3", "labels": {"version": "v3"}}]),
                reviews_routes({"route": [to("v3")]}),
            ],
        )

        def served_by_v3() -> bool:
            names, _ = client.calls(REVIEWS, 5)
            return names == Counter({"reviews-v3": 5})

        try:
            eventually(served_by_v3, timeout=30, what="the xDS server serving")
        except AssertionError as err:
            raise AssertionError(f"{err}\n{server.log()}") from err
        assert rejected(mesh) == 0
    finally:
        server.stop()


def test_authorization_policies_reach_an_xds_server(mesh, client) -> None:
    # An xDS-enabled reviews pod whose listener carries the AuthorizationPolicies selecting it.
    mesh.write(
        "reviews.yaml",
        workload(
            "reviews",
            "default",
            "10.96.0.20",
            9080,
            {"reviews-v1": "127.0.5.41", "reviews-v2": "127.0.5.42", "reviews-v3": "127.0.5.45"},
            versions={"reviews-v1": "v1", "reviews-v2": "v2", "reviews-v3": "v3"},
            port_name="grpc",
        ),
    )
    v3 = {"matchLabels": {"app": "reviews", "version": "v3"}}
    # A DENY on another path, an ALLOW on the path the client calls: calls go through.
    deny_other = istio(
        "AuthorizationPolicy",
        "deny-other",
        "default",
        {
            "selector": v3,
            "action": "DENY",
            "rules": [{"to": [{"operation": {"paths": ["/meshpilot.test.Other/*"]}}]}],
        },
        group="security",
    )

    def allow(name: str, rule: dict[str, object]) -> dict[str, object]:
        return istio(
            "AuthorizationPolicy", name, "default", {"selector": v3, "rules": [rule]}, group="security"
        )

    by_path = allow("allow-echo", {"to": [{"operation": {"paths": ["/meshpilot.test.Echo/*"]}}]})
    mesh.write("authz.yaml", [deny_other, by_path])
    path = write_bootstrap(
        mesh.tmp / "grpc-authz-server-bootstrap.json",
        xds_port=mesh.meshpilot.grpc_port,
        node_id="sidecar~127.0.5.45~reviews-v3.default~default.svc.cluster.local",
        metadata=node_metadata("127.0.5.45", {"app": "reviews", "version": "v3"}),
    )
    server = xds_server(mesh.tmp, "reviews-v3", "127.0.5.45", 9080, path)
    try:
        mesh.write(
            "routing.yaml",
            [
                reviews_rule([*SUBSETS, {"name": "v3", "labels": {"version": "v3"}}]),
                reviews_routes({"route": [to("v3")]}),
            ],
        )

        def outcome() -> tuple[Counter[str], Counter[str]]:
            return client.calls(REVIEWS, 5)

        try:
            eventually(
                lambda: outcome() == (Counter({"reviews-v3": 5}), Counter()), timeout=30, what="allowed"
            )
            # An ALLOW for a principal other than the client's (a plaintext client has none).
            other = {"from": [{"source": {"principals": ["cluster.local/ns/default/sa/someone-else"]}}]}
            mesh.write("authz.yaml", [deny_other, allow("allow-echo", other)])
            eventually(
                lambda: outcome() == (Counter(), Counter({"PERMISSION_DENIED": 5})), timeout=30, what="denied"
            )
            # Back to the path rule: allowed again, by the same running server.
            mesh.write("authz.yaml", [deny_other, by_path])
            eventually(
                lambda: outcome() == (Counter({"reviews-v3": 5}), Counter()), timeout=30, what="re-allowed"
            )
        except AssertionError as err:
            raise AssertionError(f"{err}\n{server.log()}") from err
        assert server.proc.poll() is None
        assert rejected(mesh) == 0
    finally:
        server.stop()
