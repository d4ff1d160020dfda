"""A strict reader (and writer, for tests and tools) of the IDX format used by MNIST.

Format: 2 zero bytes, a type byte, the number of dimensions, then one big-endian uint32 per dimension,
then the data in C order. Only unsigned bytes (type 0x08) occur in MNIST-like datasets.
"""

from __future__ import annotations

import struct

import numpy as np

from reprocube.errors import DataError

UNSIGNED_BYTE = 0x08


def parse_idx(payload: bytes, source: str = "IDX data") -> np.ndarray:
    """Parse a whole IDX payload into a uint8 array; refuse anything malformed or truncated."""
    if len(payload) < 4:
        raise DataError(f"{source}: malformed IDX file: {len(payload)} bytes, shorter than its 4-byte header")
    zero1, zero2, type_code, ndim = payload[0], payload[1], payload[2], payload[3]
    if zero1 != 0 or zero2 != 0:
        raise DataError(f"{source}: malformed IDX file: bad magic number {payload[:4].hex()}")
    if type_code != UNSIGNED_BYTE:
        raise DataError(f"{source}: unsupported IDX element type 0x{type_code:02x} (only unsigned bytes, 0x08)")
    if not 1 <= ndim <= 4:
        raise DataError(f"{source}: malformed IDX file: {ndim} dimensions")
    header_size = 4 + 4 * ndim
    if len(payload) < header_size:
        raise DataError(f"{source}: truncated IDX file: header needs {header_size} bytes, file has {len(payload)}")
    shape = struct.unpack(f">{ndim}I", payload[4:header_size])
    expected = header_size + int(np.prod(shape, dtype=np.int64))
    if len(payload) != expected:
        kind = "truncated" if len(payload) < expected else "malformed"
        raise DataError(f"{source}: {kind} IDX file: shape {shape} needs {expected} bytes, file has {len(payload)}")
    return np.frombuffer(payload, dtype=np.uint8, offset=header_size).reshape(shape)
