# cython: language_level=3
"""Default virtual hosts of a route configuration, wire-encoded (compiled twin).

Same contract as ``meshpilot.networking.vhosts_py``, which documents the
encodings and is the typed source of truth.
"""

import ipaddress

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_GET_SIZE
from libc.stdint cimport uint64_t

from protowire cimport (
    Buffer, begin_message, buf_bytes, buf_free, buf_init, end_message, put_len_field, put_raw,
    put_str_field,
    put_varint,
)

from meshpilot.model.service import Registry, Resolution

cdef object _PASSTHROUGH = Resolution.PASSTHROUGH
cdef object _ALIAS = Resolution.ALIAS
cdef object _KUBERNETES = Registry.KUBERNETES
cdef str _SVC = ".svc."


cdef int put_bytes(Buffer *buf, bytes data) except -1:
    # As field 2 (virtual_hosts) of a RouteConfiguration.
    return put_len_field(buf, 2, PyBytes_AS_STRING(data), PyBytes_GET_SIZE(data))


cdef bint _is_ip(str text) except -1:
    # Only digits and dots, or a colon, can be an address; the parse settles the rest.
    cdef Py_UCS4 ch
    cdef bint colon = False
    cdef bint other = False
    for ch in text:
        if ch == u":":
            colon = True
            break
        if ch != u"." and not (u"0" <= ch <= u"9"):
            other = True
    if other and not colon:
        return False
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


cdef inline str _lower(str text):
    # Hostnames are almost always lowercase already: no new string then.
    cdef Py_UCS4 ch
    for ch in text:
        if u"A" <= ch <= u"Z" or ch > 127:
            return text.lower()
    return text


cdef class _Domain:
    """The proxy's DNS domain, split once for every host's short names."""
    cdef str domain
    cdef bint kube
    cdef str svc_suffix
    cdef str namespace
    cdef list parts

    def __init__(self, str domain):
        cdef Py_ssize_t at
        self.domain = domain
        self.kube = _SVC in domain
        if self.kube:
            at = domain.index(_SVC)
            self.svc_suffix = domain[at:]
            self.namespace = domain[:at]
        else:
            self.parts = domain.split(".")


cdef list _alt_hosts(str hostname, _Domain domain):
    cdef list out = [] if _is_ip(hostname) else [hostname + "."]
    cdef Py_ssize_t svc_at, dot, shared, limit, n_host, n_domain
    cdef list host_parts, domain_parts, unique
    cdef str head
    if domain.kube:
        if not hostname.endswith(domain.svc_suffix):
            return out
        svc_at = hostname.find(_SVC)
        if svc_at <= 0:
            return out
        dot = hostname.find(".")
        if dot + 1 > svc_at:
            return out
        head = hostname[:svc_at]
        if svc_at - dot - 1 == len(domain.namespace) and hostname.startswith(domain.namespace, dot + 1):
            out.append(hostname[:dot])
            out.append(head + ".svc")
            out.append(head)
            return out
        out.append(head)
        out.append(head + ".svc")
        return out
    host_parts = hostname.split(".")
    domain_parts = domain.parts
    n_host = len(host_parts)
    n_domain = len(domain_parts)
    limit = min(n_host, n_domain)
    shared = 0
    while shared < limit and host_parts[n_host - 1 - shared] == domain_parts[n_domain - 1 - shared]:
        shared += 1
    if shared == 0:
        return out
    unique = host_parts[:n_host - shared]
    out.append(".".join(unique))
    if len(unique) == 2:
        out.append(".".join(unique) + "." + host_parts[n_host - shared])
    return out


def alt_hosts(str hostname, str proxy_domain):
    """Other names a client may use for ``hostname``: ``host.``, and short forms in Kubernetes."""
    return _alt_hosts(hostname, _Domain(proxy_domain))


def services_on_port(services, long port):
    """Services with ``port`` by lowercased hostname (the last wins), their port, and names."""
    cdef dict by_host = {}
    cdef dict ports = {}
    cdef set known = set()
    cdef str suffix = f":{port}"
    cdef str key, hostname
    for svc in services:
        for candidate in svc.ports:
            if candidate.port == port:
                key = _lower(svc.hostname)
                by_host[key] = svc
                ports[key] = candidate
                break
    for svc in by_host.values():
        hostname = svc.hostname
        known.add(hostname)
        known.add(hostname + suffix)
    return by_host, ports, known


def default_virtual_hosts(services, long port, str proxy_domain, http_protocols, covered, known,
                          set seen_names, set seen_domains, bytes route_template):
    """(name, serialized VirtualHost) of each service on ``port`` that gets the default route."""
    cdef list out = []
    cdef list domains, expanded, kept
    cdef str hostname, name, domain, lowered, address
    cdef Buffer buf
    cdef Py_ssize_t route_at, action, decorator
    cdef object matching
    cdef _Domain domain_info = _Domain(proxy_domain)
    buf_init(&buf)
    try:
        for svc in services:
            matching = None
            for candidate in svc.ports:
                if candidate.port == port:
                    matching = candidate
                    break
            if matching is None or matching.protocol not in http_protocols:
                continue
            hostname = svc.hostname
            if hostname in covered or svc.resolution is _ALIAS:
                continue
            name = f"{hostname}:{port}"
            if name in seen_names:
                continue
            seen_names.add(name)
            expanded = _alt_hosts(hostname, domain_info)
            domains = [hostname]
            domains.extend(expanded)
            if svc.resolution is _PASSTHROUGH and svc.registry is _KUBERNETES:
                domains.extend(["*." + d for d in domains])
            for address in svc.addresses:
                if address and address != "0.0.0.0":
                    domains.append(f"[{address}]" if ":" in address else address)
            kept = []
            for domain in domains:
                lowered = _lower(domain)
                if lowered in seen_domains or (domain in expanded and domain in known):
                    continue
                kept.append(domain)
                seen_domains.add(lowered)
            if not kept:
                continue
            buf.size = 0
            put_str_field(&buf, 1, name)
            for domain in kept:
                put_str_field(&buf, 2, domain)
            route_at = begin_message(&buf, 3)
            put_raw(&buf, PyBytes_AS_STRING(route_template), PyBytes_GET_SIZE(route_template))
            action = begin_message(&buf, 2)
            put_str_field(&buf, 1, f"outbound|{port}||{hostname}")
            end_message(&buf, action)
            decorator = begin_message(&buf, 5)
            put_str_field(&buf, 1, name + "/*")
            end_message(&buf, decorator)
            end_message(&buf, route_at)
            put_varint(&buf, <uint64_t>(14 << 3))
            put_varint(&buf, 1)
            out.append((name, buf_bytes(&buf)))
        return out
    finally:
        buf_free(&buf)


def route_configuration(bytes header, virtual_hosts, bytes catch_all):
    """A serialized RouteConfiguration: its fixed fields, then the virtual hosts in order."""
    cdef Buffer buf
    cdef bytes vhost
    buf_init(&buf)
    try:
        put_raw(&buf, PyBytes_AS_STRING(header), PyBytes_GET_SIZE(header))
        for vhost in virtual_hosts:
            put_bytes(&buf, vhost)
        put_bytes(&buf, catch_all)
        return buf_bytes(&buf)
    finally:
        buf_free(&buf)
