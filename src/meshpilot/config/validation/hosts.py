"""Hostnames, wildcards, IP addresses, CIDRs, ports and protocols, as istiod checks them.

Functions named ``validate_*`` return the error message, or None when the value
is fine; the few that can report several problems return a list.
"""

from __future__ import annotations

import re

from meshpilot.config.validation import goparse
from meshpilot.config.validation.formatting import go_quote

_DNS1123_LABEL = re.compile(r"[a-zA-Z0-9](?:[-a-zA-Z0-9]*[a-zA-Z0-9])?")
# "*", or a label optionally preceded by "*" or "*-".
_WILDCARD_LABEL = re.compile(r"\*|(?:\*|\*-)?[a-zA-Z0-9](?:[-a-zA-Z0-9]*[a-zA-Z0-9])?")
_MAX_LABEL = 63
_UNIX_PREFIX = "unix://"
_SNI_OUTBOUND_FORMAT = "outbound_.<PORT>_._.<HOSTNAME>"


def is_dns1123_label(value: str) -> bool:
    """A DNS label as Istio reads it: upper case is allowed, dots are not."""
    return len(value) <= _MAX_LABEL and _DNS1123_LABEL.fullmatch(value) is not None


def is_wildcard_dns1123_label(value: str) -> bool:
    """A DNS label that may start with ``*`` or ``*-``, or is ``*`` itself."""
    return len(value) <= _MAX_LABEL and _WILDCARD_LABEL.fullmatch(value) is not None


def check_dns1123_preconditions(name: str) -> str | None:
    """The length checks shared by every hostname check."""
    if len(name.encode()) > 255:
        return f"domain name {go_quote(name)} too long (max 255)"
    if not name:
        return "empty domain name not allowed"
    return None


def validate_dns1123_labels(domain: str) -> str | None:
    """Every dot-separated label is a DNS label, the last may be empty, and the TLD is not a number."""
    labels = domain.split(".")
    tld = labels[-1]
    if goparse.is_atoi(tld):
        return (
            f"domain name {go_quote(domain)} invalid (top level domain {go_quote(tld)} cannot be all-numeric)"
        )
    for i, label in enumerate(labels):
        # A trailing dot ("istio.io.") is a fully qualified name, not an empty label.
        if i == len(labels) - 1 and label == "":
            return None
        if not is_dns1123_label(label):
            return f"domain name {go_quote(domain)} invalid (label {go_quote(label)} invalid)"
    return None


def validate_fqdn(name: str) -> str | None:
    """A hostname without wildcards; single-label names pass, IP literals do not."""
    return check_dns1123_preconditions(name) or validate_dns1123_labels(name)


def validate_wildcard_domain(name: str) -> str | None:
    """A hostname whose first label may be a wildcard (``*``, ``*.foo.com``, ``*foo.com``)."""
    problem = check_dns1123_preconditions(name)
    if problem:
        return problem
    first, dot, rest = name.partition(".")
    if not is_wildcard_dns1123_label(first):
        return f"domain name {go_quote(name)} invalid (label {go_quote(first)} invalid)"
    # istiod checks (and names in its message) only the part after the first dot.
    return validate_dns1123_labels(rest) if dot else None


def validate_wildcard_domain_for_gateway_vs(sni: bool, name: str) -> str | None:
    """Like validate_wildcard_domain, but also accepts the ``outbound_.<PORT>_._.<HOSTNAME>``
    SNI names that AUTO_PASSTHROUGH gateways see."""
    problem = check_dns1123_preconditions(name)
    if problem:
        return problem
    if sni and name.startswith("outbound_"):
        parts = name.split("_")
        if len(parts) < 4:
            return f"domain name {name} invalid, should follow '{_SNI_OUTBOUND_FORMAT}' format"
        port = parts[1].strip(".")
        hostname = parts[3].strip(".")
        # Unanchored searches, as istiod does them: a digit somewhere, a letter somewhere.
        if not any("0" <= c <= "9" for c in port):
            return _sni_label_error(name, port)
        if not any(c.isascii() and c.isalpha() for c in hostname):
            return _sni_label_error(name, hostname)
        return None
    return validate_wildcard_domain(name)


def _sni_label_error(name: str, label: str) -> str:
    return (
        f"domain name {go_quote(name)} invalid (label {go_quote(label)} invalid). "
        f"should follow {_SNI_OUTBOUND_FORMAT} format"
    )


def validate_partial_wildcard(host: str) -> str | None:
    """``*`` may only be the whole host or its ``*.`` prefix."""
    if "*" in host and len(host) != 1 and not host.startswith("*."):
        return f"partial wildcard {go_quote(host)} not allowed"
    return None


def _host_part_errors(host: str, is_gateway: bool) -> list[str]:
    """The dnsName part of a gateway server host or a sidecar egress host."""
    errors = []
    if host != "*" and "." not in host:
        errors.append("short names (non FQDN) are not allowed")
    problem = validate_wildcard_domain(host)
    if problem:
        # istiod appends the same error once for sidecars and once more for
        # anything that is not an IP, so a bad sidecar host reports it twice
        # and gateways accept IP hosts.
        if not is_gateway:
            errors.append(problem)
        if not goparse.is_ip_address(host):
            errors.append(problem)
    partial = validate_partial_wildcard(host)
    if partial:
        errors.append(partial)
    return errors


def namespace_slash_host_errors(host: str, *, is_gateway: bool, gateway_semantics: bool) -> list[str]:
    """A ``namespace/dnsName`` host of a Gateway server or Sidecar egress listener.

    Gateways also take a bare dnsName (the old form). The sidecar namespace
    part is ``*``, ``.``, ``~`` or a DNS label (istiod 1.28: ``~ns`` is not
    accepted yet).
    """
    ns, slash, dns_name = host.partition("/")
    if not slash:
        if is_gateway:
            return _host_part_errors(host, True)
        return ["host must be of form namespace/dnsName"]
    errors = []
    if not ns or not dns_name:
        errors.append("config namespace and dnsName in host entry cannot be empty")
    if is_gateway:
        # "~" appears only in gateways generated from the Gateway API.
        allowed = ns in ("*", ".") or (ns == "~" and gateway_semantics) or is_dns1123_label(ns)
        if not allowed:
            errors.append(f"invalid namespace value {go_quote(ns)} in gateway")
    elif ns not in ("*", ".", "~") and not is_dns1123_label(ns):
        errors.append(f"invalid namespace value {go_quote(ns)} in sidecar")
    errors.extend(_host_part_errors(dns_name, is_gateway))
    return errors


def host_matches(a: str, b: str) -> bool:
    """host.Name.Matches: whether two (possibly wildcard) hosts overlap."""
    a_wild, b_wild = a.startswith("*"), b.startswith("*")
    if a_wild and b_wild:
        if len(a) < len(b):
            return b[1:].endswith(a[1:])
        return a[1:].endswith(b[1:])
    if a_wild:
        return b.endswith(a[1:])
    if b_wild:
        return a.endswith(b[1:])
    return a == b


def host_subset_of(host: str, of: str) -> bool:
    """host.Name.SubsetOf: whether every name ``host`` matches is also matched by ``of``."""
    host_wild, of_wild = host.startswith("*"), of.startswith("*")
    if host_wild:
        return of_wild and len(host) >= len(of) and host[1:].endswith(of[1:])
    if of_wild:
        return host.endswith(of[1:])
    return host == of


def is_ip_address(value: str) -> bool:
    """An IPv4 or IPv6 address (zones allowed), not a CIDR."""
    return goparse.is_ip_address(value)


def validate_ip_address(value: str) -> str | None:
    """An IP address, or ``<value> is not a valid IP``."""
    return None if goparse.is_ip_address(value) else f"{value} is not a valid IP"


def validate_ip_subnet(value: str) -> str | None:
    """A CIDR block (when there is exactly one ``/``) or a plain IP address."""
    if value.count("/") == 1:
        try:
            goparse.parse_prefix(value)
        except goparse.GoParseError:
            return f"{value} is not a valid CIDR block"
        return None
    return validate_ip_address(value)


def validate_port(port: int) -> str | None:
    """A port number in 1..65535."""
    if 1 <= port <= 65535:
        return None
    return f"port number {port} must be in the range 1..65535"


def validate_port_name(name: str) -> str | None:
    """A port name is a DNS label; an empty name is invalid too."""
    return None if is_dns1123_label(name) else f"invalid port name: {name}"


# Protocol names as istiod spells them; anything else is "unsupported".
_PROTOCOLS = {
    "tcp": "TCP",
    "udp": "UDP",
    "grpc": "GRPC",
    "grpc-web": "GRPC-Web",
    "http": "HTTP",
    "http_proxy": "HTTP_PROXY",
    "http2": "HTTP2",
    "https": "HTTPS",
    "tls": "TLS",
    "mongo": "Mongo",
    "redis": "Redis",
    "mysql": "MySQL",
}
UNSUPPORTED_PROTOCOL = "UnsupportedProtocol"
_HTTP_PROTOCOLS = frozenset({"HTTP", "HTTP2", "HTTP_PROXY", "GRPC", "GRPC-Web"})
_TLS_PROTOCOLS = frozenset({"HTTPS", "TLS"})
_TCP_PROTOCOLS = frozenset({"TCP", "HTTPS", "TLS", "Mongo", "Redis", "MySQL"})


def parse_protocol(name: str) -> str:
    """The canonical protocol name (case-insensitive), or UNSUPPORTED_PROTOCOL (also for "")."""
    return _PROTOCOLS.get(name.lower(), UNSUPPORTED_PROTOCOL)


def is_http_protocol(protocol: str) -> bool:
    """HTTP, HTTP2, HTTP_PROXY, GRPC or GRPC-Web."""
    return protocol in _HTTP_PROTOCOLS


def is_tls_protocol(protocol: str) -> bool:
    """HTTPS or TLS."""
    return protocol in _TLS_PROTOCOLS


def is_tcp_protocol(protocol: str) -> bool:
    """Protocols carried over plain TCP connections (TLS-based ones included)."""
    return protocol in _TCP_PROTOCOLS


def validate_protocol(name: str) -> str | None:
    """A known protocol name; empty means "sniff it" and is fine."""
    if name and parse_protocol(name) == UNSUPPORTED_PROTOCOL:
        return f"unsupported protocol: {name}"
    return None


def unix_address(value: str) -> str | None:
    """The path of a ``unix://`` address, or None when ``value`` is not one."""
    return value[len(_UNIX_PREFIX) :] if value.startswith(_UNIX_PREFIX) else None


def validate_unix_address(path: str) -> str | None:
    """The part after ``unix://``: an abstract socket (``@name``) or an absolute file path."""
    if not path:
        return "unix address must not be empty"
    if path.startswith("@"):
        return None
    if not path.startswith("/") or path.endswith("/"):
        return f"{path} is not an absolute path to a file"
    return None
