"""The sample store's block codec: one series' samples of one time block in one compact, lossless blob.

Timestamps go in as delta-of-deltas (a scrape on a fixed interval gives zeros, a jittery one small
numbers), values as the XOR of each float's bits with the previous one (a gauge that holds still gives
zeros, a slowly moving one zeros in the high bytes); both are zigzag/bit planes shuffled byte by byte
(all first bytes, then all second bytes, ...) so that the runs of zero bytes line up, then deflated.
That is the idea of Gorilla (Pelkonen et al., VLDB 2015) done with array operations instead of a bit
writer: numpy does the arithmetic, zlib the entropy coding, and nothing is lost (values round-trip bit
for bit, NaN payloads and -0.0 included).

Layout: version byte, uint32 count, int64 first timestamp, then the deflated planes (8·n value bytes
followed by 8·(n-1) delta-of-delta bytes).
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

VERSION = 1
_HEADER = struct.Struct("<BIq")
_LEVEL = 6


class CorruptChunk(ValueError):
    """A blob that this codec did not write (or a newer version of it)."""


def _shuffle(words: npt.NDArray[np.uint64]) -> bytes:
    return words.view(np.uint8).reshape(-1, 8).T.tobytes()


def _unshuffle(raw: bytes, n: int) -> npt.NDArray[np.uint64]:
    planes = np.frombuffer(raw, dtype=np.uint8, count=8 * n).reshape(8, n)
    return np.ascontiguousarray(planes.T).view(np.uint64).reshape(n)


def encode(
    times: Sequence[int] | npt.NDArray[np.int64], values: Sequence[float] | npt.NDArray[np.float64]
) -> bytes:
    """Samples in strictly increasing time order -> blob."""
    t = np.asarray(times, dtype=np.int64)
    v = np.asarray(values, dtype=np.float64)
    n = len(t)
    if n == 0 or len(v) != n:
        raise ValueError(f"a chunk needs as many values as timestamps, at least one ({n}, {len(v)})")
    bits = v.view(np.uint64)
    xored = bits.copy()
    xored[1:] ^= bits[:-1]
    deltas = np.diff(t)
    dod = np.diff(deltas, prepend=np.int64(0))
    zigzag = ((dod << 1) ^ (dod >> 63)).view(np.uint64)
    body = zlib.compress(_shuffle(xored) + _shuffle(zigzag), _LEVEL)
    return _HEADER.pack(VERSION, n, int(t[0])) + body


def decode(blob: bytes) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float64]]:
    """Blob -> (timestamps, values) as arrays."""
    try:
        version, n, first = _HEADER.unpack_from(blob)
        raw = zlib.decompress(blob[_HEADER.size :])
    except (struct.error, zlib.error) as exc:
        raise CorruptChunk(f"not a sample chunk: {exc}") from exc
    if version != VERSION or len(raw) != 8 * (2 * n - 1):
        raise CorruptChunk(f"sample chunk version {version}, {len(raw)} bytes for {n} samples")
    bits = np.bitwise_xor.accumulate(_unshuffle(raw, n))
    zz = _unshuffle(raw[8 * n :], n - 1)
    dod = (zz >> np.uint64(1)).view(np.int64) ^ -(zz & np.uint64(1)).view(np.int64)
    t = np.empty(n, dtype=np.int64)
    t[0] = first
    np.cumsum(np.cumsum(dod), out=t[1:])
    t[1:] += first
    return t, bits.view(np.float64)


def decode_pairs(blob: bytes) -> list[tuple[int, float]]:
    """Blob -> [(t_ms, value)] as Python numbers (what the store's readers hand out)."""
    t, v = decode(blob)
    return list(zip(t.tolist(), v.tolist(), strict=True))
