# cython: language_level=3
"""Protobuf wire encoding of xDS responses and ClusterLoadAssignments (compiled twin).

Same contract as ``meshpilot.networking.wire_py``, which documents the
encodings and is the typed source of truth.
"""

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from cpython.unicode cimport PyUnicode_AsUTF8AndSize
from libc.stdint cimport uint64_t
from libc.string cimport memcpy

from protowire cimport (
    Buffer, begin_message, buf_bytes, buf_free, buf_init, end_message, put_len_field, put_raw, put_varint,
    put_str_field, put_uint_field, varint_size,
)

from meshpilot.model.endpoint import TLS_MODE_ISTIO, HealthStatus

TLS_ISTIO_MUTUAL = 3
NO_TLS_MODE = -1

cdef int _HEALTHY = int(HealthStatus.HEALTHY)
cdef int _UNHEALTHY = int(HealthStatus.UNHEALTHY)
cdef object _TERMINATING = HealthStatus.TERMINATING
cdef object _HEALTHY_STATUS = HealthStatus.HEALTHY
cdef str _UNIX = "unix://"
cdef str _ISTIO = TLS_MODE_ISTIO
cdef uint64_t _MAX_UINT32 = 0xFFFFFFFF


cdef inline str text(object value):
    # Exact str for the UTF-8 fast path; str subclasses (enums) are converted.
    return value if type(value) is str else str(value)


cdef inline bint is_unix(str address):
    # address.startswith("unix://") without a method call.
    return len(address) >= 7 and address[0] == u"u" and address[:7] == _UNIX


cdef int put_bytes_field(Buffer *buf, int field, bytes data) except -1:
    return put_len_field(buf, field, PyBytes_AS_STRING(data), PyBytes_GET_SIZE(data))


def any_bytes(type_url, bytes value):
    """A serialized ``google.protobuf.Any``."""
    cdef Buffer buf
    buf_init(&buf)
    try:
        put_str_field(&buf, 1, text(type_url))
        if PyBytes_GET_SIZE(value):
            put_bytes_field(&buf, 2, value)
        return buf_bytes(&buf)
    finally:
        buf_free(&buf)


cdef inline Py_ssize_t len_field_size(int field, Py_ssize_t n) noexcept:
    return varint_size(<uint64_t>(field << 3 | 2)) + varint_size(<uint64_t>n) + n


cdef inline char *write_varint(char *out, uint64_t value) noexcept:
    while value > 0x7F:
        out[0] = <char>((value & 0x7F) | 0x80)
        out += 1
        value >>= 7
    out[0] = <char>value
    return out + 1


cdef inline char *write_len_field(char *out, int field, const char *data, Py_ssize_t n) noexcept:
    out = write_varint(out, <uint64_t>(field << 3 | 2))
    out = write_varint(out, <uint64_t>n)
    memcpy(out, data, n)
    return out + n


def discovery_response(version, type_url, nonce, resources):
    """A serialized DiscoveryResponse around already-serialized ``Any`` resources.

    Responses run to megabytes, so the size is added up first and the bytes
    object is written in place: one allocation, one copy of each resource.
    """
    cdef bytes resource
    cdef list items = resources if type(resources) is list else list(resources)
    cdef const char *v
    cdef const char *t
    cdef const char *n
    cdef Py_ssize_t v_len, t_len, n_len, total = 0
    cdef char *out
    cdef bytes result
    v = PyUnicode_AsUTF8AndSize(text(version), &v_len)
    t = PyUnicode_AsUTF8AndSize(text(type_url), &t_len)
    n = PyUnicode_AsUTF8AndSize(text(nonce), &n_len)
    if v_len:
        total += len_field_size(1, v_len)
    for resource in items:
        total += len_field_size(2, PyBytes_GET_SIZE(resource))
    if t_len:
        total += len_field_size(4, t_len)
    if n_len:
        total += len_field_size(5, n_len)
    result = PyBytes_FromStringAndSize(NULL, total)
    out = PyBytes_AS_STRING(result)
    if v_len:
        out = write_len_field(out, 1, v, v_len)
    for resource in items:
        out = write_len_field(out, 2, PyBytes_AS_STRING(resource), PyBytes_GET_SIZE(resource))
    if t_len:
        out = write_len_field(out, 4, t, t_len)
    if n_len:
        out = write_len_field(out, 5, n, n_len)
    return result


cdef int put_address(Buffer *buf, int field, str address, uint64_t port) except -1:
    cdef Py_ssize_t outer = begin_message(buf, field)
    cdef Py_ssize_t inner
    if is_unix(address):
        inner = begin_message(buf, 2)
        put_str_field(buf, 1, address[7:])
    else:
        inner = begin_message(buf, 1)
        put_str_field(buf, 2, address)
        put_varint(buf, 3 << 3)  # port_value is a oneof member: zero is written too
        put_varint(buf, port)
    end_message(buf, inner)
    return end_message(buf, outer)


cdef int put_string_struct_entry(Buffer *buf, str filter_name, str key, str value) except -1:
    # filter_metadata entry {key: filter_name, value: Struct{fields: {key: Value{string_value}}}}
    cdef Py_ssize_t entry = begin_message(buf, 1)
    cdef Py_ssize_t struct_, field_entry, value_
    put_str_field(buf, 1, filter_name)
    struct_ = begin_message(buf, 2)
    field_entry = begin_message(buf, 1)
    put_str_field(buf, 1, key)
    value_ = begin_message(buf, 2)
    put_str_field(buf, 3, value)
    end_message(buf, value_)
    end_message(buf, field_entry)
    end_message(buf, struct_)
    return end_message(buf, entry)


cdef int put_lb_endpoint_body(Buffer *buf, object ep, bint mtls) except -1:
    cdef Py_ssize_t inner, extra_at, meta, weight_at
    cdef str address = ep.address
    cdef uint64_t port = ep.port
    cdef object health = ep.health
    cdef object weight = ep.weight
    inner = begin_message(buf, 1)
    put_address(buf, 1, address, port)
    for extra in ep.extra_addresses:
        extra_at = begin_message(buf, 4)
        put_address(buf, 1, extra, port)
        end_message(buf, extra_at)
    end_message(buf, inner)
    # HealthStatus is an IntEnum: an int, converted without calling int().
    put_uint_field(buf, 2, <uint64_t>(_UNHEALTHY if health is _TERMINATING else <long>health))
    meta = begin_message(buf, 3)
    if mtls:
        put_string_struct_entry(buf, "envoy.transport_socket_match", "tlsMode", "istio")
    put_string_struct_entry(buf, "istio", "workload", ep.telemetry)
    end_message(buf, meta)
    weight_at = begin_message(buf, 4)
    put_uint_field(buf, 1, <uint64_t>(weight or 1))
    return end_message(buf, weight_at)


cdef int put_lb_endpoint(Buffer *buf, object ep, bint mtls) except -1:
    # As field 2 (lb_endpoints) of a LocalityLbEndpoints.
    cdef Py_ssize_t outer = begin_message(buf, 2)
    put_lb_endpoint_body(buf, ep, mtls)
    return end_message(buf, outer)


cdef bint selected(object ep, str port_name, object subset, bint allow_hostnames) except -1:
    cdef object labels
    if ep.service_port_name != port_name or ep.health is not _HEALTHY_STATUS:
        return False
    if subset is not None:
        labels = ep.labels
        for key, value in (<dict>subset).items():
            if labels.get(key) != value:
                return False
    return allow_hostnames or ep.is_ip or is_unix(ep.address)


cdef list _select(object endpoints, str port_name, object subset, bint allow_hostnames):
    if subset is not None and not isinstance(subset, dict):
        subset = dict(subset)
    return [ep for ep in endpoints if selected(ep, port_name, subset, allow_hostnames)]


def select(endpoints, port_name, subset, bint allow_hostnames=False):
    """The endpoints that serve ``port_name``, match the subset labels and are healthy."""
    return _select(endpoints, text(port_name), subset, allow_hostnames)


cdef int put_locality(Buffer *buf, str label) except -1:
    cdef Py_ssize_t at = begin_message(buf, 1)
    cdef list parts
    if label:
        parts = label.split("/")
        if len(parts) > 0:
            put_str_field(buf, 1, parts[0])
        if len(parts) > 1:
            put_str_field(buf, 2, parts[1])
        if len(parts) > 2:
            put_str_field(buf, 3, parts[2])
    return end_message(buf, at)


cdef int put_groups(Buffer *buf, list endpoints, int tls_mode) except -1:
    cdef set seen
    cdef list labels = []
    cdef str label, first
    cdef Py_ssize_t group, weight_at
    cdef uint64_t total, weight
    cdef bint mtls, one_locality = True
    if not endpoints:
        return 0
    first = endpoints[0].locality.label
    for ep in endpoints:
        if ep.locality.label != first:
            one_locality = False
            break
    if one_locality:
        # The common case: no set, no sort.
        labels.append(first)
    else:
        seen = set()
        for ep in endpoints:
            label = ep.locality.label
            if label not in seen:
                seen.add(label)
                labels.append(label)
        labels.sort()
    for label in labels:
        group = begin_message(buf, 2)
        put_locality(buf, label)
        total = 0
        for ep in endpoints:
            if ep.locality.label != label:
                continue
            if tls_mode != NO_TLS_MODE:
                mtls = tls_mode == TLS_ISTIO_MUTUAL
            else:
                mtls = ep.tls_mode == _ISTIO
            put_lb_endpoint(buf, ep, mtls)
            weight = <uint64_t>(ep.weight or 1)
            total = total + weight
            if total > _MAX_UINT32:
                total = _MAX_UINT32
        weight_at = begin_message(buf, 3)
        put_uint_field(buf, 1, total)
        end_message(buf, weight_at)
        end_message(buf, group)
    return 0


def locality_groups(endpoints, int tls_mode):
    """Repeated ``LocalityLbEndpoints`` (field 2 of a CLA), one per locality in sorted order."""
    cdef Buffer buf
    buf_init(&buf)
    try:
        put_groups(&buf, list(endpoints), tls_mode)
        return buf_bytes(&buf)
    finally:
        buf_free(&buf)


def lb_endpoint(ep, bint mtls):
    """One serialized LbEndpoint."""
    cdef Buffer buf
    buf_init(&buf)
    try:
        put_lb_endpoint_body(&buf, ep, mtls)
        return buf_bytes(&buf)
    finally:
        buf_free(&buf)


def cluster_load_assignment(cluster_name, endpoints, port_name, subset, int tls_mode,
                            bint allow_hostnames=False):
    """A serialized ClusterLoadAssignment of the selected endpoints (only the name if none)."""
    cdef Buffer buf
    cdef list chosen = _select(endpoints, text(port_name), subset, allow_hostnames)
    buf_init(&buf)
    try:
        put_str_field(&buf, 1, text(cluster_name))
        put_groups(&buf, chosen, tls_mode)
        return buf_bytes(&buf)
    finally:
        buf_free(&buf)


# -- outbound EDS clusters -------------------------------------------------------

CLUSTER_TLS_NONE = 0
CLUSTER_TLS_AUTO = 1
CLUSTER_TLS_ALWAYS = 2

cdef str _CLUSTER_TYPE = "type.googleapis.com/envoy.config.cluster.v3.Cluster"
cdef str _UPSTREAM_TLS_TYPE = (
    "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext"
)
cdef str _RAW_BUFFER_TYPE = (
    "type.googleapis.com/envoy.extensions.transport_sockets.raw_buffer.v3.RawBuffer"
)


cdef int put_struct_string(Buffer *buf, str key, str value) except -1:
    # Struct.fields entry {key, Value{string_value}}
    cdef Py_ssize_t entry = begin_message(buf, 1)
    cdef Py_ssize_t value_
    put_str_field(buf, 1, key)
    value_ = begin_message(buf, 2)
    put_str_field(buf, 3, value)
    end_message(buf, value_)
    return end_message(buf, entry)


def cluster_metadata(config, subset, host, name, namespace, bint external):
    """A cluster's ``Metadata``: ``istio`` with config, subset, external when so, and services."""
    cdef Buffer buf
    cdef Py_ssize_t entry, struct_, field_, value_, list_, item, inner
    buf_init(&buf)
    try:
        entry = begin_message(&buf, 1)
        put_str_field(&buf, 1, "istio")
        struct_ = begin_message(&buf, 2)
        if config:
            put_struct_string(&buf, "config", text(config))
        if subset:
            put_struct_string(&buf, "subset", text(subset))
        if external:
            field_ = begin_message(&buf, 1)
            put_str_field(&buf, 1, "external")
            value_ = begin_message(&buf, 2)
            put_uint_field(&buf, 4, 1)
            end_message(&buf, value_)
            end_message(&buf, field_)
        # Every outbound cluster names its service, mesh-external ones too (istiod's telemetry metadata).
        field_ = begin_message(&buf, 1)
        put_str_field(&buf, 1, "services")
        value_ = begin_message(&buf, 2)
        list_ = begin_message(&buf, 6)
        item = begin_message(&buf, 1)
        inner = begin_message(&buf, 5)
        put_struct_string(&buf, "host", text(host))
        put_struct_string(&buf, "name", text(name))
        put_struct_string(&buf, "namespace", text(namespace))
        end_message(&buf, inner)
        end_message(&buf, item)
        end_message(&buf, list_)
        end_message(&buf, value_)
        end_message(&buf, field_)
        end_message(&buf, struct_)
        end_message(&buf, entry)
        return buf_bytes(&buf)
    finally:
        buf_free(&buf)


cdef int put_validation(Buffer *buf, object sans, bytes rest) except -1:
    # combined_validation_context 8 {default_validation_context 1 {match_typed_subject_alt_names 15}, rest}
    cdef Py_ssize_t combined = begin_message(buf, 8)
    cdef Py_ssize_t default = begin_message(buf, 1)
    cdef Py_ssize_t matcher, string_matcher
    cdef const char *data
    cdef Py_ssize_t n
    for san in sans:
        matcher = begin_message(buf, 15)
        put_uint_field(buf, 1, 3)  # san_type URI
        string_matcher = begin_message(buf, 2)
        data = PyUnicode_AsUTF8AndSize(text(san), &n)
        put_len_field(buf, 1, data, n)  # exact is a oneof member: "" is written too
        end_message(buf, string_matcher)
        end_message(buf, matcher)
    end_message(buf, default)
    put_raw(buf, PyBytes_AS_STRING(rest), PyBytes_GET_SIZE(rest))
    return end_message(buf, combined)


cdef int put_tls_socket(Buffer *buf, int field, bytes common, bytes validation, object sans,
                        str sni) except -1:
    # TransportSocket{name, typed_config: Any{UpstreamTlsContext{common_tls_context, sni}}}
    cdef Py_ssize_t socket = begin_message(buf, field)
    cdef Py_ssize_t any_, context, common_at
    put_str_field(buf, 1, "envoy.transport_sockets.tls")
    any_ = begin_message(buf, 3)
    put_str_field(buf, 1, _UPSTREAM_TLS_TYPE)
    context = begin_message(buf, 2)
    common_at = begin_message(buf, 1)
    put_raw(buf, PyBytes_AS_STRING(common), PyBytes_GET_SIZE(common))
    put_validation(buf, sans, validation)
    end_message(buf, common_at)
    put_str_field(buf, 2, sni)
    end_message(buf, context)
    end_message(buf, any_)
    return end_message(buf, socket)


cdef int put_raw_buffer_match(Buffer *buf) except -1:
    cdef Py_ssize_t match = begin_message(buf, 43)
    cdef Py_ssize_t socket, any_
    put_str_field(buf, 1, "tlsMode-disabled")
    put_len_field(buf, 2, "", 0)  # an empty Struct, present
    socket = begin_message(buf, 3)
    put_str_field(buf, 1, "envoy.transport_sockets.raw_buffer")
    any_ = begin_message(buf, 3)
    put_str_field(buf, 1, _RAW_BUFFER_TYPE)
    end_message(buf, any_)
    end_message(buf, socket)
    return end_message(buf, match)


def outbound_cluster(bytes template, name, bytes metadata, int tls, bytes tls_common,
                     bytes tls_validation, sans, sni):
    """An outbound EDS cluster as a serialized ``Any``: the class template plus this cluster's fields."""
    cdef Buffer buf
    cdef str name_ = text(name)
    cdef str sni_ = text(sni)
    cdef Py_ssize_t any_, eds, match, struct_
    buf_init(&buf)
    try:
        put_str_field(&buf, 1, _CLUSTER_TYPE)
        any_ = begin_message(&buf, 2)
        put_raw(&buf, PyBytes_AS_STRING(template), PyBytes_GET_SIZE(template))
        put_str_field(&buf, 1, name_)
        eds = begin_message(&buf, 3)
        put_str_field(&buf, 2, name_)
        end_message(&buf, eds)
        put_bytes_field(&buf, 25, metadata)
        if tls == CLUSTER_TLS_ALWAYS:
            put_tls_socket(&buf, 24, tls_common, tls_validation, sans, sni_)
        put_str_field(&buf, 28, name_ + ";")
        if tls == CLUSTER_TLS_AUTO:
            match = begin_message(&buf, 43)
            put_str_field(&buf, 1, "tlsMode-istio")
            struct_ = begin_message(&buf, 2)
            put_struct_string(&buf, "tlsMode", "istio")
            end_message(&buf, struct_)
            put_tls_socket(&buf, 3, tls_common, tls_validation, sans, sni_)
            end_message(&buf, match)
            put_raw_buffer_match(&buf)
        end_message(&buf, any_)
        return buf_bytes(&buf)
    finally:
        buf_free(&buf)
