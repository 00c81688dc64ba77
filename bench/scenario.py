"""Benchmark scenarios: a YAML shape of a mesh, turned into a config directory and a fleet.

A scenario names how many services, ports, endpoints, namespaces and proxies
to make. Every proxy is a Pod of one of the services (so it has inbound
config, as a real sidecar does), in REDIRECT mode, with its own IP.

With ``service_entries`` the same services (hosts, VIPs, ports, endpoint
addresses and labels) are written as ServiceEntries with inline endpoints
instead of Services, Pods and EndpointSlices: istiod reads only Istio kinds
from files, so that is the form both servers get when istiod runs beside
meshpilot (``python -m bench.run --peer istiod``). The proxies are then client
sidecars on addresses of their own (see ``proxy``).
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import yaml

from meshpilot.networking.names import outbound_cluster

PROTOCOLS = {"http": ("http", 8080), "tcp": ("tcp", 9000), "grpc": ("grpc", 7070)}
#: A ServiceEntry port's protocol, by scenario protocol.
SE_PROTOCOLS = {"http": "HTTP", "tcp": "TCP", "grpc": "GRPC"}
GATEWAY_NAME = "bench-gateway"
GATEWAY_NAMESPACE = "istio-system"
GATEWAY_LABELS = {"istio": "ingressgateway"}
GATEWAY_PORT = 80


@dataclass(frozen=True)
class Scenario:
    name: str
    services: int = 100
    endpoints_per_service: int = 10
    ports_per_service: int = 1
    namespaces: int = 1
    proxies: int = 100
    protocol: str = "http"
    #: VirtualServices (each on one service) and DestinationRules with two subsets.
    virtual_services: int = 0
    destination_rules: int = 0
    #: How many distinct traffic policies the rules cycle through (their connection limits differ):
    #: rules with equal policies share CDS templates, so ``destination_rules`` here is the worst case.
    rule_policies: int = 10
    #: Proxies connect through a Sidecar resource that limits egress to their namespace.
    scoped: bool = False
    #: Proxies are ingress gateways (``router``) of one Gateway; VirtualServices bind to it.
    gateway: bool = False
    #: Services as ServiceEntries (resolution STATIC, inline endpoints), not Kubernetes objects.
    service_entries: bool = False
    description: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def load(cls, path: Path) -> Scenario:
        data = yaml.safe_load(path.read_text()) or {}
        known = {f.name for f in fields(cls)}
        unknown = set(data) - known
        if unknown:
            raise ValueError(f"{path}: unknown scenario fields {sorted(unknown)}")
        data.setdefault("name", path.stem)
        return cls(**data)

    def scaled(self, factor: float) -> Scenario:
        """The same shape with fewer services, endpoints and proxies (for quick runs)."""

        def scale(n: int) -> int:
            return max(1, int(n * factor))

        return Scenario(
            **{
                **self.__dict__,
                "services": scale(self.services),
                "proxies": scale(self.proxies),
                "virtual_services": min(self.virtual_services, scale(self.services)),
                "destination_rules": min(self.destination_rules, scale(self.services)),
            }
        )

    # -- naming ----------------------------------------------------------------

    def namespace(self, service: int) -> str:
        return f"bench-{service % self.namespaces}"

    def service_name(self, service: int) -> str:
        return f"svc-{service}"

    def hostname(self, service: int) -> str:
        return f"{self.service_name(service)}.{self.namespace(service)}.svc.cluster.local"

    def ports(self) -> list[tuple[str, int]]:
        prefix, base = PROTOCOLS[self.protocol]
        return [(f"{prefix}-{i}", base + i) for i in range(self.ports_per_service)]

    def endpoint_ip(self, service: int, index: int) -> str:
        return str(ipaddress.ip_address("10.128.0.0") + service * 1024 + index)

    def cluster_ip(self, service: int) -> str:
        return str(ipaddress.ip_address("10.96.0.0") + service + 1)

    def proxy(self, i: int) -> tuple[str, str, str, dict[str, str]]:
        """(node id, IP, namespace, labels) of proxy ``i``: an endpoint of service ``i % services``
        (with ``service_entries``, a client of it), or a replica of the ingress gateway."""
        if self.gateway:
            ip = str(ipaddress.ip_address("10.200.0.0") + i)
            node_id = f"router~{ip}~ingress-{i}.{GATEWAY_NAMESPACE}~{GATEWAY_NAMESPACE}.svc.cluster.local"
            return node_id, ip, GATEWAY_NAMESPACE, dict(GATEWAY_LABELS)
        service = i % self.services
        index = i // self.services
        namespace = self.namespace(service)
        pod = f"{self.service_name(service)}-{index}"
        ip = self.endpoint_ip(service, index)
        if self.service_entries:
            # A client sidecar: its address backs no service, so it has no inbound services. istiod
            # finds a proxy's services among ServiceEntry endpoints by its IP, meshpilot (today) only
            # among Kubernetes Pods; on an endpoint's IP the two would build different sidecars.
            ip = str(ipaddress.ip_address("10.64.0.0") + i)
        node_id = f"sidecar~{ip}~{pod}.{namespace}~{namespace}.svc.cluster.local"
        return node_id, ip, namespace, {"app": self.service_name(service), "version": "v1"}

    def proxies_seeing(self, service: int) -> int:
        """How many proxies hold service ``service`` in their config: every one, or with ``scoped``
        (egress limited to the proxy's own namespace) those of the service's namespace."""
        if not self.scoped:
            return self.proxies
        namespace = self.namespace(service)
        return sum(1 for i in range(self.proxies) if self.proxy(i)[2] == namespace)

    def outbound_clusters(self) -> list[str]:
        """The outbound clusters (EDS names) of a sidecar that sees every service."""
        subsets = [("", "v1", "v2") if s < self.destination_rules else ("",) for s in range(self.services)]
        return sorted(
            outbound_cluster(port, subset, self.hostname(s))
            for s in range(self.services)
            for _, port in self.ports()
            for subset in subsets[s]
        )

    def route_names(self) -> list[str]:
        if self.gateway:
            return [f"http.{GATEWAY_PORT}"]
        return [str(port) for _, port in self.ports()] if self.protocol != "tcp" else []

    # -- config ------------------------------------------------------------------

    def endpoints_of(self, service: int) -> int:
        # Sidecars are endpoints too: a service has at least as many pods as proxies it hosts.
        if self.gateway:
            return self.endpoints_per_service
        hosted = self.proxies // self.services + (1 if service < self.proxies % self.services else 0)
        return max(self.endpoints_per_service, hosted)

    def objects(self, *, endpoint_bump: int = 0) -> dict[str, list[dict[str, Any]]]:
        """Config files (name -> objects) for the scenario."""
        files: dict[str, list[dict[str, Any]]] = {}
        namespaces = sorted({self.namespace(s) for s in range(self.services)})
        files["namespaces.yaml"] = [
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}} for ns in namespaces
        ]
        for s in range(self.services):
            files[f"svc-{s}.yaml"] = self.service_objects(s, extra_endpoints=endpoint_bump if s == 0 else 0)
        if self.destination_rules:
            files["destination-rules.yaml"] = [
                self.destination_rule(s) for s in range(self.destination_rules)
            ]
        # A file each, as a change to one is one object from the Kubernetes API: a change rewrites
        # one file, not a file of a thousand objects to read again.
        for s in range(self.virtual_services):
            files[self.virtual_service_file(s)] = [self.virtual_service(s, marker="initial")]
        if self.gateway:
            files["namespaces.yaml"].append(
                {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": GATEWAY_NAMESPACE}}
            )
            files["gateway.yaml"] = [self.ingress_gateway()]
        if self.scoped:
            files["sidecars.yaml"] = [
                {
                    "apiVersion": "networking.istio.io/v1",
                    "kind": "Sidecar",
                    "metadata": {"name": "default", "namespace": ns},
                    "spec": {"egress": [{"hosts": ["./*", "istio-system/*"]}]},
                }
                for ns in namespaces
            ]
        return files

    def service_objects(self, s: int, *, extra_endpoints: int = 0) -> list[dict[str, Any]]:
        if self.service_entries:
            return [self.service_entry(s, extra_endpoints=extra_endpoints)]
        ns, name = self.namespace(s), self.service_name(s)
        ports = self.ports()
        labels = {"app": name, "version": "v1"}
        docs: list[dict[str, Any]] = [
            {
                "apiVersion": "v1",
                "kind": "Service",
                "metadata": {"name": name, "namespace": ns},
                "spec": {
                    "clusterIP": self.cluster_ip(s),
                    "selector": {"app": name},
                    "ports": [{"name": p, "port": n, "targetPort": n} for p, n in ports],
                },
            }
        ]
        count = self.endpoints_of(s) + extra_endpoints
        endpoints = []
        for i in range(count):
            pod = f"{name}-{i}"
            ip = self.endpoint_ip(s, i)
            docs.append(
                {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "metadata": {"name": pod, "namespace": ns, "labels": labels},
                    "spec": {"serviceAccountName": name},
                    "status": {"podIP": ip},
                }
            )
            endpoints.append(
                {
                    "addresses": [ip],
                    "conditions": {"ready": True},
                    "targetRef": {"kind": "Pod", "name": pod, "namespace": ns},
                }
            )
        docs.append(
            {
                "apiVersion": "discovery.k8s.io/v1",
                "kind": "EndpointSlice",
                "metadata": {
                    "name": f"{name}-slice",
                    "namespace": ns,
                    "labels": {"kubernetes.io/service-name": name},
                },
                "addressType": "IPv4",
                "ports": [{"name": p, "port": n} for p, n in ports],
                "endpoints": endpoints,
            }
        )
        return docs

    def service_entry(self, s: int, *, extra_endpoints: int = 0) -> dict[str, Any]:
        """Service ``s`` as one ServiceEntry: the Service's host, VIP and ports, the pods' addresses,
        labels and service account as inline endpoints (what a Kubernetes Service becomes in istiod's
        model, written in the form istiod's file source reads)."""
        name = self.service_name(s)
        protocol = SE_PROTOCOLS[self.protocol]
        return {
            "apiVersion": "networking.istio.io/v1",
            "kind": "ServiceEntry",
            "metadata": {"name": name, "namespace": self.namespace(s)},
            "spec": {
                "hosts": [self.hostname(s)],
                "addresses": [self.cluster_ip(s)],
                "location": "MESH_INTERNAL",
                "resolution": "STATIC",
                "ports": [
                    {"name": p, "number": n, "protocol": protocol, "targetPort": n} for p, n in self.ports()
                ],
                "endpoints": [
                    {
                        "address": self.endpoint_ip(s, i),
                        "labels": {"app": name, "version": "v1"},
                        "serviceAccount": name,
                    }
                    for i in range(self.endpoints_of(s) + extra_endpoints)
                ],
            },
        }

    def virtual_service_file(self, s: int) -> str:
        return f"vs-{s}.yaml"

    def ingress_gateway(self) -> dict[str, Any]:
        return {
            "apiVersion": "networking.istio.io/v1",
            "kind": "Gateway",
            "metadata": {"name": GATEWAY_NAME, "namespace": GATEWAY_NAMESPACE},
            "spec": {
                "selector": dict(GATEWAY_LABELS),
                "servers": [
                    {"port": {"number": GATEWAY_PORT, "name": "http", "protocol": "HTTP"}, "hosts": ["*"]}
                ],
            },
        }

    def destination_rule(self, s: int) -> dict[str, Any]:
        """Two subsets and a traffic policy of the kinds real meshes set (connection pool, outlier
        detection, load balancer), v2 overriding the load balancer. Rule ``s`` has policy
        ``s % rule_policies`` of that many distinct ones (connection limits differ)."""
        return {
            "apiVersion": "networking.istio.io/v1",
            "kind": "DestinationRule",
            "metadata": {"name": self.service_name(s), "namespace": self.namespace(s)},
            "spec": {
                "host": self.hostname(s),
                "trafficPolicy": {
                    "connectionPool": {
                        "tcp": {"maxConnections": 100 + s % self.rule_policies, "connectTimeout": "5s"},
                        "http": {
                            "http1MaxPendingRequests": 64,
                            "http2MaxRequests": 1000,
                            "maxRequestsPerConnection": 10,
                            "idleTimeout": "300s",
                        },
                    },
                    "outlierDetection": {
                        "consecutive5xxErrors": 5,
                        "interval": "10s",
                        "baseEjectionTime": "30s",
                        "maxEjectionPercent": 50,
                    },
                    "loadBalancer": {"simple": "LEAST_REQUEST"},
                },
                "subsets": [
                    {"name": "v1", "labels": {"version": "v1"}},
                    {
                        "name": "v2",
                        "labels": {"version": "v2"},
                        "trafficPolicy": {"loadBalancer": {"simple": "ROUND_ROBIN"}},
                    },
                ],
            },
        }

    def virtual_service(self, s: int, *, marker: str) -> dict[str, Any]:
        """A VirtualService whose route name carries ``marker``, so a fleet can see it arrive."""
        route: dict[str, Any] = {
            "name": f"bench-{marker}",
            "route": [{"destination": {"host": self.hostname(s)}}],
        }
        if self.gateway:
            # Bound to the ingress gateway, for a public host of the service.
            return {
                "apiVersion": "networking.istio.io/v1",
                "kind": "VirtualService",
                "metadata": {"name": self.service_name(s), "namespace": self.namespace(s)},
                "spec": {
                    "hosts": [f"{self.service_name(s)}.bench.example.com"],
                    "gateways": [f"{GATEWAY_NAMESPACE}/{GATEWAY_NAME}"],
                    "http": [route],
                },
            }
        if self.protocol == "tcp":
            return {
                "apiVersion": "networking.istio.io/v1",
                "kind": "VirtualService",
                "metadata": {"name": self.service_name(s), "namespace": self.namespace(s)},
                "spec": {"hosts": [self.hostname(s)], "tcp": [{"route": route["route"]}]},
            }
        return {
            "apiVersion": "networking.istio.io/v1",
            "kind": "VirtualService",
            "metadata": {"name": self.service_name(s), "namespace": self.namespace(s)},
            "spec": {"hosts": [self.hostname(s)], "http": [route]},
        }

    def write(self, directory: Path, **kwargs: Any) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        for name, docs in self.objects(**kwargs).items():
            write_yaml(directory / name, docs)


def write_yaml(path: Path, docs: list[dict[str, Any]]) -> None:
    """Atomically, so the watcher never reads half a file."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(yaml.safe_dump_all(docs, sort_keys=False))
    tmp.replace(path)
