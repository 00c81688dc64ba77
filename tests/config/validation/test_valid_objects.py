"""Realistic, valid objects of every kind are accepted without errors (or warnings)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from meshpilot.config.decode import decode_object
from meshpilot.model.kind import Kind

VIRTUAL_SERVICE = """
hosts: [reviews.prod.svc.cluster.local, reviews]
exportTo: [".", istio-system]
http:
- name: jason
  match:
  - name: by-user
    headers:
      end-user: {exact: jason}
      x-trace: {regex: "^[a-f0-9]{16}$"}
    uri: {prefix: /reviews}
    queryParams: {debug: {exact: "1"}}
    sourceLabels: {app: productpage, version: v2}
    sourceNamespace: bookinfo
  - uri: {regex: "^/ratings/[0-9]+$"}
    withoutHeaders: {x-canary: {regex: "*"}}
    method: {exact: POST}
  route:
  - destination: {host: reviews.prod.svc.cluster.local, subset: v2, port: {number: 9080}}
    weight: 80
    headers:
      request: {set: {x-route: v2}}
      response: {add: {x-served-by: "%HOSTNAME%"}, remove: [x-internal]}
  - destination: {host: reviews.prod.svc.cluster.local, subset: v3}
    weight: 20
  headers:
    request:
      set: {":authority": reviews.internal, x-start: "%START_TIME(%s.%3f)%"}
      add: {x-percent: "100%%"}
      remove: [x-debug]
  timeout: 10s
  retries: {attempts: 3, perTryTimeout: 2s, retryOn: "gateway-error,connect-failure,refused-stream,503"}
  corsPolicy:
    allowOrigins: [{exact: "https://example.com"}, {regex: "https://.*\\\\.example\\\\.org"}]
    allowMethods: [GET, POST, "*"]
    allowHeaders: [x-custom, "*"]
    exposeHeaders: [x-served-by]
    maxAge: 24h
    allowCredentials: true
  fault:
    delay: {fixedDelay: 5s, percentage: {value: 0.1}}
    abort: {httpStatus: 503, percentage: {value: 0.001}}
  mirror: {host: reviews-shadow}
  mirrorPercentage: {value: 10.5}
- name: legacy
  match: [{uri: {exact: /old}}]
  redirect: {uri: /new, authority: reviews.example.com, redirectCode: 301}
- name: api-v2
  match: [{uri: {prefix: /api/v2}}]
  rewrite:
    uriRegexRewrite: {match: "^/api/v2/(.*)", rewrite: "/\\\\1"}
  route: [{destination: {host: api}}]
- name: health
  match: [{uri: {exact: /healthz}}]
  directResponse: {status: 200, body: {string: ok}}
- name: default
  route: [{destination: {host: reviews.prod.svc.cluster.local, subset: v1}}]
tcp:
- match: [{port: 27017, destinationSubnets: [10.0.0.0/16, "2001:db8::/32"]}]
  route: [{destination: {host: mongo.backends.svc.cluster.local, port: {number: 5555}}}]
"""

GATEWAY_VIRTUAL_SERVICE = """
hosts: ["*.bookinfo.example.com", bookinfo.com]
gateways: [istio-system/bookinfo-gateway, mesh]
http:
- match: [{uri: {prefix: /productpage}, gateways: [istio-system/bookinfo-gateway]}]
  route: [{destination: {host: productpage}}]
tls:
- match: [{sniHosts: [login.bookinfo.example.com], port: 443, gateways: [istio-system/bookinfo-gateway]}]
  route: [{destination: {host: login.bookinfo.svc.cluster.local}}]
"""

DESTINATION_RULE = """
host: "reviews.prod.svc.cluster.local"
exportTo: ["."]
trafficPolicy:
  connectionPool:
    tcp:
      maxConnections: 100
      connectTimeout: 30ms
      idleTimeout: 0s
      tcpKeepalive: {time: 7200s, interval: 75s}
    http: {http1MaxPendingRequests: 64, http2MaxRequests: 1000, maxRetries: 3, idleTimeout: 1h}
  outlierDetection:
    consecutive5xxErrors: 7
    interval: 5m
    baseEjectionTime: 15m
    maxEjectionPercent: 50
  loadBalancer:
    consistentHash:
      httpCookie: {name: user, ttl: 0s, attributes: [{name: SameSite, value: Strict}]}
      maglev: {tableSize: 65537}
    localityLbSetting:
      enabled: true
      failover: [{from: us-east, to: us-west}]
    warmup: {duration: 60s, minimumPercent: 10, aggression: 1.5}
  tls: {mode: ISTIO_MUTUAL}
  portLevelSettings:
  - port: {number: 80}
    loadBalancer: {simple: LEAST_REQUEST}
  - port: {number: 9443}
    tls:
      mode: MUTUAL
      clientCertificate: /etc/certs/cert.pem
      privateKey: /etc/certs/key.pem
      caCertificates: /etc/certs/ca.pem
      subjectAltNames: [reviews.example.com]
subsets:
- name: v1
  labels: {version: v1, app.kubernetes.io/name: reviews}
- name: v2
  labels: {version: v2}
  trafficPolicy:
    loadBalancer:
      localityLbSetting:
        distribute:
        - from: us-west/zone1/*
          to: {us-west/zone1/*: 80, us-west/zone2/*: 20}
    tunnel: {protocol: CONNECT, targetHost: egress.example.com, targetPort: 8443}
"""

GATEWAY = """
selector: {istio: ingressgateway}
servers:
- port: {number: 80, name: http, protocol: HTTP}
  hosts: [bookinfo/reviews.example.com, "*.example.com"]
  tls: {httpsRedirect: true}
- port: {number: 443, name: https, protocol: HTTPS}
  hosts: ["*/reviews.example.com", ./ratings.example.com]
  tls:
    mode: SIMPLE
    credentialName: reviews-cert
    minProtocolVersion: TLSV1_2
    cipherSuites:
    - ECDHE-RSA-AES128-GCM-SHA256
    - "[ECDHE-ECDSA-AES128-GCM-SHA256|ECDHE-ECDSA-CHACHA20-POLY1305]"
- port: {number: 8443, name: mtls, protocol: HTTPS}
  hosts: [secure.example.com]
  tls:
    mode: MUTUAL
    serverCertificate: /etc/certs/server.pem
    privateKey: /etc/certs/key.pem
    caCertificates: /etc/certs/ca.pem
    caCrl: /etc/certs/crl.pem
- port: {number: 15443, name: tls, protocol: TLS}
  hosts: ["*.global"]
  tls: {mode: AUTO_PASSTHROUGH}
- port: {number: 31400, name: tcp, protocol: TCP}
  hosts: ["*"]
  bind: 0.0.0.0
"""

SERVICE_ENTRIES = {
    "dns": """
hosts: [api.dropboxapi.com, www.googleapis.com]
location: MESH_EXTERNAL
resolution: DNS
ports:
- {number: 443, name: https, protocol: TLS}
- {number: 80, name: http, protocol: HTTP}
""",
    "dns-endpoints": """
hosts: ["*.internal.example.com"]
addresses: [240.0.0.10]
resolution: DNS
location: MESH_INTERNAL
ports: [{number: 8080, name: http, protocol: HTTP, targetPort: 80}]
endpoints:
- address: us-east.internal.example.com
  ports: {http: 8080}
  labels: {region: us-east}
- address: 10.1.2.3
exportTo: ["~"]
""",
    "static": """
hosts: [mymongodb.somedomain]
addresses: [192.192.192.192/24]
resolution: STATIC
ports: [{number: 27018, name: mongodb, protocol: MONGO}]
endpoints:
- address: 2.2.2.2
  ports: {mongodb: 7777}
  labels: {app: mongo}
  network: net1
  locality: us-east/zone1
  weight: 3
- address: "2001:db8::1"
""",
    "unix": """
hosts: [uds.local]
resolution: STATIC
ports: [{number: 80, name: http, protocol: HTTP}]
endpoints: [{address: "unix:///var/run/example/socket"}]
""",
    "selector": """
hosts: [vm.example.internal]
location: MESH_INTERNAL
resolution: STATIC
ports: [{number: 8080, name: http, protocol: HTTP}]
workloadSelector: {labels: {app: vm}}
""",
    "none": """
hosts: ["*.wikipedia.org"]
location: MESH_EXTERNAL
resolution: NONE
addresses: [10.0.0.0/8]
ports: [{number: 443, name: https, protocol: TLS}]
""",
}

WORKLOAD_ENTRIES = {
    "ip": """
address: 10.20.30.40
ports: {http: 8080, grpc-web: 9090}
labels: {app: details, version: v1, topology.istio.io/network: vpc-1}
serviceAccount: details-legacy
network: vpc-1
locality: us-east1/us-east1-b
weight: 10
""",
    "dns-name": "{address: vm1.internal.example.com, labels: {app: vm}}",
    "ipv6": "{address: 'fe80::1%eth0'}",
    "uds": "{address: 'unix:///var/run/app.sock'}",
}

SIDECAR = """
workloadSelector: {labels: {app: ratings}}
ingress:
- port: {number: 9080, protocol: HTTP, name: somename}
  defaultEndpoint: "127.0.0.1:8080"
  connectionPool: {http: {http1MaxPendingRequests: 1024}}
- port: {number: 9443, protocol: HTTPS, name: secure}
  defaultEndpoint: "unix:///var/run/app.sock"
  tls: {mode: SIMPLE, privateKey: /etc/key.pem, serverCertificate: /etc/cert.pem}
- port: {number: 9000, protocol: TCP, name: raw}
  bind: 0.0.0.0
  defaultEndpoint: "[::1]:9000"
inboundConnectionPool: {tcp: {maxConnections: 512}}
egress:
- port: {number: 9080, protocol: HTTP, name: egresshttp}
  hosts: [prod-us1/*]
- port: {number: 0, protocol: HTTP, name: uds}
  bind: "unix:///var/run/egress.sock"
  captureMode: NONE
  hosts: ["~/*"]
- hosts: [istio-system/*, ./*, "*/api.example.com"]
outboundTrafficPolicy:
  mode: ALLOW_ANY
  egressProxy: {host: egress.proxy.internal, subset: v1, port: {number: 3128}}
"""

PEER_AUTHENTICATION = """
selector: {matchLabels: {app: reviews}}
mtls: {mode: STRICT}
portLevelMtls:
  "8080": {mode: DISABLE}
  "9090": {mode: PERMISSIVE}
"""

AUTHORIZATION_POLICIES = {
    "allow": """
selector: {matchLabels: {app: httpbin, version: v1}}
action: ALLOW
rules:
- from:
  - source: {principals: [cluster.local/ns/default/sa/sleep], requestPrincipals: ["*"]}
  - source: {namespaces: [test], notIpBlocks: [10.0.0.0/8, "2001:db8::/32"], remoteIpBlocks: [1.2.3.4]}
  - source: {serviceAccounts: [default/sleep, curl]}
  to:
  - operation:
      methods: [GET, HEAD]
      paths: ["/info*", "/api/{*}/items/{**}"]
      ports: ["8000"]
      hosts: [x.com]
  when:
  - key: request.auth.claims[iss]
    values: ["https://accounts.google.com"]
  - key: source.ip
    notValues: [10.1.2.3, 10.2.0.0/16]
  - key: request.headers[User-Agent]
    values: ["curl/*"]
  - key: destination.port
    values: ["443"]
  - key: source.serviceAccount
    values: [default/sleep]
""",
    "deny-with-port": """
targetRefs: [{kind: Gateway, group: gateway.networking.k8s.io, name: waypoint}]
action: DENY
rules:
- from: [{source: {notNamespaces: [foo]}}]
  to: [{operation: {ports: ["8080"], notPaths: [/healthz]}}]
""",
    "custom": """
targetRef: {kind: Service, group: "", name: productpage}
action: CUSTOM
provider: {name: my-ext-authz}
rules:
- to: [{operation: {paths: [/admin/*]}}]
  when: [{key: connection.sni, values: [admin.example.com]}]
""",
    "allow-nothing": "{}",
    "audit": "{action: AUDIT, rules: [{from: [{source: {namespaces: [x]}}]}]}",
}

JWKS = (
    '{"keys": [{"kty": "RSA", "e": "AQAB", "kid": "DHFbpoIUqrY8t2zpA2qXfCmr5VO5ZEr4RzHU_-envvQ", '
    '"n": "xAE7eB6qugXyCAG3yhh7pkDkT65pHymX-P7KfIupjf59vsdo91bSP9C8H07pSAGQO1MV_xFj9VswgsCg4R6otmg5PV2He95lZ'
    "dHtOcU5DXIg_pbhLdKXbi66GlVeK6ABZOUW3WYtnNHD-91gVuoeJT_DwtGGcp4ignkgXfkiEm4sw-4sfb4qdt5oLbyVpmW6x9cfa7vs2"
    "WTfURiCrBoUqgBo_-4WTiULmmHSGZHOjzwa8WtrtOQGsAFjIbno85jp6MnGGGZPYZbDAa_b3y5u-YpW7ypZrvD8BgtKVjgtQgZhLAGe"
    "zM"
    't0ua3DRrWnKqTZ0BJ_EyxOGuHJrLsn00fnMQ"}]}'
)

REQUEST_AUTHENTICATION = {
    "jwks-uri": """
selector: {matchLabels: {app: httpbin}}
jwtRules:
- issuer: "https://accounts.google.com"
  jwksUri: "https://www.googleapis.com:443/oauth2/v3/certs"
  audiences: [bookstore-android.apps.googleusercontent.com]
  fromHeaders: [{name: x-jwt-assertion, prefix: "Bearer "}]
  fromParams: [my_token]
  fromCookies: [session]
  outputClaimToHeaders: [{header: x-jwt-sub, claim: sub}]
  forwardOriginalToken: true
  timeout: 5s
""",
    "inline-jwks": {
        "targetRefs": [{"kind": "Gateway", "group": "gateway.networking.k8s.io", "name": "gw"}],
        "jwtRules": [{"issuer": "testing@secure.istio.io", "jwks": JWKS}],
    },
}


def _params() -> list[Any]:
    cases: list[tuple[str, str, Any]] = [
        ("VirtualService", "mesh", VIRTUAL_SERVICE),
        ("VirtualService", "gateway", GATEWAY_VIRTUAL_SERVICE),
        ("DestinationRule", "full", DESTINATION_RULE),
        ("Gateway", "servers", GATEWAY),
        ("Sidecar", "full", SIDECAR),
        ("PeerAuthentication", "port-level", PEER_AUTHENTICATION),
    ]
    cases += [("ServiceEntry", k, v) for k, v in SERVICE_ENTRIES.items()]
    cases += [("WorkloadEntry", k, v) for k, v in WORKLOAD_ENTRIES.items()]
    cases += [("AuthorizationPolicy", k, v) for k, v in AUTHORIZATION_POLICIES.items()]
    cases += [("RequestAuthentication", k, v) for k, v in REQUEST_AUTHENTICATION.items()]
    return [pytest.param(kind, spec, id=f"{kind}-{label}") for kind, label, spec in cases]


@pytest.mark.parametrize(("kind", "spec"), _params())
def test_valid_object_has_no_errors_or_warnings(kind: str, spec: Any, validate: Callable[..., Any]) -> None:
    outcome = validate(kind, spec, name="reviews", namespace="bookinfo", labels={"app": "reviews"})
    assert outcome.errors == []
    assert outcome.warnings == []


def test_decode_returns_the_config_of_a_valid_object() -> None:
    raw = {
        "apiVersion": "networking.istio.io/v1beta1",
        "kind": "DestinationRule",
        "metadata": {"name": "reviews", "namespace": "bookinfo"},
        "spec": {"host": "reviews", "subsets": [{"name": "v1", "labels": {"version": "v1"}}]},
    }
    result = decode_object(raw)
    assert result.warnings == []
    assert result.obj.kind is Kind.DESTINATION_RULE
    assert result.obj.spec.subsets[0].name == "v1"
