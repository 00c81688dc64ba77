# cython: language_level=3
"""Default virtual hosts of a route configuration, wire-encoded (compiled twin).

Same contract as ``meshpilot.networking.vhosts_py``, which documents the
encodings and is the typed source of truth.
"""

import ipaddress

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_GET_SIZE
from cpython.set cimport PySet_GET_SIZE
from cpython.unicode cimport (
    PyUnicode_1BYTE_DATA, PyUnicode_AsUTF8AndSize, PyUnicode_FindChar, PyUnicode_GET_LENGTH,
)
from libc.stdint cimport uint64_t

from protowire cimport (
    Buffer, buf_bytes, buf_free, buf_init, buf_reserve, put_len_field, put_raw, put_str_field, put_varint,
    varint_size,
)

from meshpilot.model.service import Registry, Resolution

cdef object _PASSTHROUGH = Resolution.PASSTHROUGH
cdef object _ALIAS = Resolution.ALIAS
cdef object _KUBERNETES = Registry.KUBERNETES
cdef str _SVC = ".svc."


cdef int put_bytes(Buffer *buf, bytes data) except -1:
    # As field 2 (virtual_hosts) of a RouteConfiguration.
    return put_len_field(buf, 2, PyBytes_AS_STRING(data), PyBytes_GET_SIZE(data))


cdef extern from "Python.h":
    bint PyUnicode_IS_ASCII(object text)


cdef bint _is_ip(str text) except -1:
    # Only digits and dots, or a colon, can be an address; the parse settles the rest.
    # A hostname fails at its first letter, without a pass over the whole name.
    cdef Py_UCS4 ch
    if PyUnicode_FindChar(text, u":", 0, PyUnicode_GET_LENGTH(text), 1) == -1:
        for ch in text:
            if ch != u"." and not (u"0" <= ch <= u"9"):
                return False
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


cdef inline bint _plain(str text) noexcept:
    # ASCII without capitals: lower() would give the same string.
    cdef const unsigned char *data
    cdef Py_ssize_t i
    if not PyUnicode_IS_ASCII(text):
        return False
    data = <const unsigned char *>PyUnicode_1BYTE_DATA(text)
    for i in range(PyUnicode_GET_LENGTH(text)):
        if 65 <= data[i] <= 90:
            return False
    return True


cdef inline str _lower(str text):
    # Hostnames are almost always lowercase already: no new string then.
    return text if _plain(text) else text.lower()


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
    # One int object to compare with, rather than a new one per candidate.
    cdef object wanted = port
    for svc in services:
        for candidate in svc.ports:
            if candidate.port == wanted:
                key = _lower(svc.hostname)
                by_host[key] = svc
                ports[key] = candidate
                break
    for svc in by_host.values():
        hostname = svc.hostname
        known.add(hostname)
        known.add(hostname + suffix)
    return by_host, ports, known


cdef inline int put_head(Buffer *buf, int field, Py_ssize_t length) except -1:
    # The tag and length of a length-delimited field whose bytes follow.
    put_varint(buf, <uint64_t>(field << 3 | 2))
    return put_varint(buf, <uint64_t>length)


cdef inline Py_ssize_t field_size(Py_ssize_t length) noexcept:
    # A length-delimited field of a number below 16 with ``length`` bytes.
    return 1 + varint_size(<uint64_t>length) + length


cdef int _keep(Buffer *buf, str domain, bint plain, list expanded, known, set seen_domains) except -1:
    """Write ``domain`` as field 2 unless an earlier host took it or it is another service's name.

    Returns 1 when it is kept. ``plain``: the domain is known to be lowercase ASCII, so it
    needs no scan.
    """
    cdef Py_ssize_t before, size
    cdef const char *data
    if domain in expanded and domain in known:
        return 0
    # add() both tests and records: the set grows only for a domain not seen before.
    before = PySet_GET_SIZE(seen_domains)
    seen_domains.add(domain if plain else _lower(domain))
    if PySet_GET_SIZE(seen_domains) == before:
        return 0
    # A repeated string is written even when empty (a short name can be ""), as protobuf does;
    # put_str_field would drop it, as proto3 drops an empty singular string.
    data = PyUnicode_AsUTF8AndSize(domain, &size)
    put_len_field(buf, 2, data, size)
    return 1


def default_virtual_hosts(services, long port, str proxy_domain, http_protocols, covered, known,
                          set seen_names, set seen_domains, bytes route_template):
    """(name, serialized VirtualHost) of each service on ``port`` that gets the default route."""
    cdef list out = []
    cdef list expanded
    cdef str hostname, name, domain, address
    cdef Buffer buf
    cdef Py_ssize_t before, kept, host_len, name_len, cluster_len, action_len, operation_len
    cdef Py_ssize_t decorator_len, route_len
    cdef const char *host_data
    cdef const char *name_data
    cdef bint plain, wildcards
    cdef object matching, resolution
    cdef object wanted = port
    cdef str suffix = f":{port}"
    # The cluster name is this prefix and the hostname, written without building the string.
    cdef bytes cluster_prefix = f"outbound|{port}||".encode()
    cdef Py_ssize_t prefix_len = len(cluster_prefix)
    cdef Py_ssize_t template_len = len(route_template)
    cdef _Domain domain_info = _Domain(proxy_domain)
    buf_init(&buf)
    try:
        for svc in services:
            matching = None
            for candidate in svc.ports:
                if candidate.port == wanted:
                    matching = candidate
                    break
            if matching is None or matching.protocol not in http_protocols:
                continue
            hostname = svc.hostname
            resolution = svc.resolution
            if hostname in covered or resolution is _ALIAS:
                continue
            name = hostname + suffix
            before = PySet_GET_SIZE(seen_names)
            seen_names.add(name)
            if PySet_GET_SIZE(seen_names) == before:
                continue
            expanded = _alt_hosts(hostname, domain_info)
            # Every name but the addresses is cut from the hostname (or adds "." and "*."),
            # so a lowercase ASCII hostname makes them all lowercase.
            plain = _plain(hostname)
            wildcards = resolution is _PASSTHROUGH and svc.registry is _KUBERNETES
            buf.size = 0
            put_str_field(&buf, 1, name)
            kept = _keep(&buf, hostname, plain, expanded, known, seen_domains)
            for domain in expanded:
                kept += _keep(&buf, domain, plain, expanded, known, seen_domains)
            if wildcards:
                kept += _keep(&buf, "*." + hostname, plain, expanded, known, seen_domains)
                for domain in expanded:
                    kept += _keep(&buf, "*." + domain, plain, expanded, known, seen_domains)
            for address in svc.addresses:
                if address and address != "0.0.0.0":
                    domain = f"[{address}]" if ":" in address else address
                    kept += _keep(&buf, domain, False, expanded, known, seen_domains)
            if not kept:
                continue
            # The route: the template, then route {cluster} and decorator {operation},
            # with every length known up front so nothing is moved afterwards.
            host_data = PyUnicode_AsUTF8AndSize(hostname, &host_len)
            name_data = PyUnicode_AsUTF8AndSize(name, &name_len)
            cluster_len = prefix_len + host_len
            action_len = field_size(cluster_len)
            operation_len = name_len + 2
            decorator_len = field_size(operation_len)
            route_len = template_len + field_size(action_len) + field_size(decorator_len)
            put_head(&buf, 3, route_len)
            put_raw(&buf, PyBytes_AS_STRING(route_template), template_len)
            put_head(&buf, 2, action_len)
            put_head(&buf, 1, cluster_len)
            put_raw(&buf, PyBytes_AS_STRING(cluster_prefix), prefix_len)
            put_raw(&buf, host_data, host_len)
            put_head(&buf, 5, decorator_len)
            put_head(&buf, 1, operation_len)
            put_raw(&buf, name_data, name_len)
            put_raw(&buf, "/*", 2)
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
    cdef list hosts = virtual_hosts if type(virtual_hosts) is list else list(virtual_hosts)
    # Sized up front: growing by doubling would copy the configuration several times over.
    cdef Py_ssize_t size = PyBytes_GET_SIZE(header) + field_size(PyBytes_GET_SIZE(catch_all))
    for vhost in hosts:
        size += field_size(PyBytes_GET_SIZE(vhost))
    buf_init(&buf)
    try:
        buf_reserve(&buf, size)
        put_raw(&buf, PyBytes_AS_STRING(header), PyBytes_GET_SIZE(header))
        for vhost in hosts:
            put_bytes(&buf, vhost)
        put_bytes(&buf, catch_all)
        return buf_bytes(&buf)
    finally:
        buf_free(&buf)
