# C-level API of the config hash (see confighash.pyx).
from libc.stdint cimport uint8_t, uint64_t

from protowire cimport Buffer


cdef uint64_t xxh64(const uint8_t *data, Py_ssize_t n, uint64_t seed) noexcept nogil
cdef int encode_into(Buffer *buf, object value) except -1


cdef inline uint64_t rotl64(uint64_t x, int r) noexcept nogil:
    return (x << r) | (x >> (64 - r))
