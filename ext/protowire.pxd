# A growable byte buffer and protobuf wire-format writers, inlined into the
# modules that cimport them (there is no protowire module at run time).
from cpython.bytes cimport PyBytes_FromStringAndSize
from cpython.mem cimport PyMem_Free, PyMem_Realloc
from cpython.unicode cimport PyUnicode_AsUTF8AndSize
from libc.stdint cimport uint8_t, uint64_t
from libc.string cimport memcpy, memmove


cdef struct Buffer:
    uint8_t *data
    Py_ssize_t size
    Py_ssize_t capacity


cdef inline void buf_init(Buffer *buf) noexcept:
    buf.data = NULL
    buf.size = 0
    buf.capacity = 0


cdef inline void buf_free(Buffer *buf) noexcept:
    PyMem_Free(buf.data)
    buf.data = NULL
    buf.size = 0
    buf.capacity = 0


cdef inline int buf_reserve(Buffer *buf, Py_ssize_t extra) except -1:
    cdef Py_ssize_t need = buf.size + extra
    cdef Py_ssize_t cap
    cdef uint8_t *grown
    if need <= buf.capacity:
        return 0
    cap = buf.capacity * 2 if buf.capacity else 512
    while cap < need:
        cap *= 2
    grown = <uint8_t *>PyMem_Realloc(buf.data, cap)
    if grown == NULL:
        raise MemoryError()
    buf.data = grown
    buf.capacity = cap
    return 0


cdef inline bytes buf_bytes(Buffer *buf):
    return PyBytes_FromStringAndSize(<char *>buf.data, buf.size)


cdef inline int put_raw(Buffer *buf, const char *data, Py_ssize_t n) except -1:
    if n:
        buf_reserve(buf, n)
        memcpy(buf.data + buf.size, data, n)
        buf.size += n
    return 0


cdef inline int varint_size(uint64_t value) noexcept nogil:
    cdef int n = 1
    while value > 0x7F:
        value >>= 7
        n += 1
    return n


cdef inline int put_varint(Buffer *buf, uint64_t value) except -1:
    buf_reserve(buf, 10)
    while value > 0x7F:
        buf.data[buf.size] = <uint8_t>((value & 0x7F) | 0x80)
        buf.size += 1
        value >>= 7
    buf.data[buf.size] = <uint8_t>value
    buf.size += 1
    return 0


cdef inline int put_uint_field(Buffer *buf, int field, uint64_t value) except -1:
    # proto3: a zero scalar is not written.
    if value:
        put_varint(buf, <uint64_t>(field << 3))
        put_varint(buf, value)
    return 0


cdef inline int put_len_field(Buffer *buf, int field, const char *data, Py_ssize_t n) except -1:
    put_varint(buf, <uint64_t>(field << 3 | 2))
    put_varint(buf, <uint64_t>n)
    return put_raw(buf, data, n)


cdef inline int put_str_field(Buffer *buf, int field, str text) except -1:
    # The UTF-8 form is cached in the str object after the first call.
    cdef Py_ssize_t n
    cdef const char *data
    if not text:
        return 0
    data = PyUnicode_AsUTF8AndSize(text, &n)
    return put_len_field(buf, field, data, n)


cdef inline Py_ssize_t begin_message(Buffer *buf, int field) except -1:
    # Tag, then one byte reserved for the length; end_message fixes it up.
    put_varint(buf, <uint64_t>(field << 3 | 2))
    buf_reserve(buf, 1)
    buf.size += 1
    return buf.size


cdef inline int end_message(Buffer *buf, Py_ssize_t start) except -1:
    cdef Py_ssize_t length = buf.size - start
    cdef int n = varint_size(<uint64_t>length)
    cdef Py_ssize_t pos
    cdef uint64_t value = <uint64_t>length
    if n > 1:
        buf_reserve(buf, n - 1)
        memmove(buf.data + start + n - 1, buf.data + start, length)
        buf.size += n - 1
    pos = start - 1
    while value > 0x7F:
        buf.data[pos] = <uint8_t>((value & 0x7F) | 0x80)
        pos += 1
        value >>= 7
    buf.data[pos] = <uint8_t>value
    return 0
