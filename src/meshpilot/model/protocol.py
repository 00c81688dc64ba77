"""Application protocols of service ports, as Istio names and infers them."""

from __future__ import annotations

from meshpilot.model.identity import IdentityEnum


class Protocol(IdentityEnum):
    GRPC = "GRPC"
    GRPC_WEB = "GRPC-Web"
    HTTP = "HTTP"
    HTTP_PROXY = "HTTP_PROXY"
    HTTP2 = "HTTP2"
    HTTPS = "HTTPS"
    TCP = "TCP"
    TLS = "TLS"
    UDP = "UDP"
    MONGO = "Mongo"
    REDIS = "Redis"
    MYSQL = "MySQL"
    #: Not declared: the proxy sniffs between HTTP and TCP.
    UNSUPPORTED = "UnsupportedProtocol"

    @property
    def is_http(self) -> bool:
        return self in _HTTP

    @property
    def is_http2(self) -> bool:
        return self in (Protocol.HTTP2, Protocol.GRPC, Protocol.GRPC_WEB)

    @property
    def is_tcp(self) -> bool:
        return self in _TCP

    @property
    def is_tls(self) -> bool:
        return self in (Protocol.HTTPS, Protocol.TLS)

    @classmethod
    def parse(cls, text: str) -> Protocol:
        """Case-insensitive lookup; unknown names are UNSUPPORTED."""
        return _BY_LOWER.get(text.lower(), Protocol.UNSUPPORTED)


_HTTP = frozenset({Protocol.HTTP, Protocol.HTTP2, Protocol.GRPC, Protocol.GRPC_WEB, Protocol.HTTP_PROXY})
_TCP = frozenset({Protocol.TCP, Protocol.HTTPS, Protocol.TLS, Protocol.MONGO, Protocol.REDIS, Protocol.MYSQL})
_BY_LOWER = {p.value.lower(): p for p in Protocol if p is not Protocol.UNSUPPORTED}

# Unnamed ports that are well known to carry TCP (istiod's wellKnownPorts).
_WELL_KNOWN_TCP_PORTS = frozenset({25, 53, 3306, 27017})

# appProtocol values Kubernetes defines, with the protocol they mean.
_APP_PROTOCOLS = {
    "kubernetes.io/h2c": Protocol.HTTP2,
    "kubernetes.io/ws": Protocol.HTTP,
    "kubernetes.io/wss": Protocol.HTTPS,
}


def protocol_from_port_name(name: str) -> Protocol:
    """Protocol from a port name's prefix: ``http``, ``http-web``, ``grpc-web-x``."""
    if name[:8].lower() == "grpc-web":
        return Protocol.GRPC_WEB
    return Protocol.parse(name.split("-", 1)[0])


def kube_port_protocol(name: str, port: int, app_protocol: str | None, l4: str = "TCP") -> Protocol:
    """Protocol of a Kubernetes service port, as istiod's ``ConvertProtocol``.

    UDP ports are UDP. A set appProtocol replaces the port name; Kubernetes'
    own ``kubernetes.io/*`` values map to their protocols. An undeclared
    protocol on a well-known port is TCP; any other is sniffed.
    """
    if l4.upper() == "UDP":
        return Protocol.UDP
    if app_protocol is not None:
        known = _APP_PROTOCOLS.get(app_protocol)
        if known is not None:
            return known
        name = app_protocol
    protocol = protocol_from_port_name(name)
    if protocol is Protocol.UNSUPPORTED and port in _WELL_KNOWN_TCP_PORTS:
        return Protocol.TCP
    return protocol
