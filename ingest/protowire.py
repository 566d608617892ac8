"""Walking protobuf wire format without decoding it: field numbers and byte ranges; varints one or many at once.

Used to split an XSpace into planes and a plane into lines before the protobuf
runtime decodes each piece, so that no large message is ever decoded whole; :func:`varints`
reads many varints with whole-array steps, for :mod:`.xspace_events`.
"""

from __future__ import annotations

import mmap
from collections.abc import Iterator

import numpy as np

VARINT, I64, LEN, I32 = 0, 1, 2, 5
#: What the walker reads: the file's memory map, or bytes.
Buffer = bytes | bytearray | memoryview | mmap.mmap


class WireError(ValueError):
    """The bytes are not valid protobuf wire format; ``offset`` is where it goes wrong."""

    def __init__(self, message: str, offset: int) -> None:
        super().__init__(message)
        self.offset = offset


def varint(buf: Buffer, pos: int, end: int) -> tuple[int, int]:
    """Decode the varint at ``pos``; return (value, position after it)."""
    result = 0
    shift = 0
    start = pos
    while True:
        if pos >= end:
            raise WireError("truncated varint (file cut short?)", start)
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result, pos
        shift += 7
        if shift >= 70:
            raise WireError("varint longer than 10 bytes", start)


def fields(buf: Buffer, start: int, end: int) -> Iterator[tuple[int, int, int, int, int]]:
    """Yield ``(field number, wire type, tag offset, value start, value end)`` for each field in ``[start, end)``.

    For length-delimited fields the value range is the payload; for the others it is
    the encoded value.

    Raises:
        WireError: an invalid tag or wire type, or a field running past ``end``.
    """
    pos = start
    while pos < end:
        tag_at = pos
        tag, pos = varint(buf, pos, end)
        number, wire = tag >> 3, tag & 7
        if number == 0:
            raise WireError("field number 0 (not protobuf data)", tag_at)
        if wire == VARINT:
            value_at = pos
            _, pos = varint(buf, pos, end)
        elif wire == LEN:
            length, value_at = varint(buf, pos, end)
            pos = value_at + length
        elif wire == I64:
            value_at, pos = pos, pos + 8
        elif wire == I32:
            value_at, pos = pos, pos + 4
        else:
            raise WireError(f"unsupported wire type {wire} (not an XSpace, or corrupt)", tag_at)
        if pos > end:
            raise WireError(f"field {number} runs past the end of its message (file cut short?)", tag_at)
        yield number, wire, tag_at, value_at, pos


_HIGH_BITS = np.uint64(0x8080808080808080)
_LOW_BITS = np.uint64(0x7F7F7F7F7F7F7F7F)
_ONE = np.uint64(1)
#: Joining the eight 7-bit groups of a little-endian word of varint bytes in three rounds, each joining pairs
#: of neighbours: (mask of the upper member of each pair, how far it moves down, mask of the lower member).
_JOINS = [(np.uint64(0x7F007F007F007F00), np.uint64(1), np.uint64(0x007F007F007F007F)),
          (np.uint64(0x3FFF00003FFF0000), np.uint64(2), np.uint64(0x00003FFF00003FFF)),
          (np.uint64(0x0FFFFFFF00000000), np.uint64(4), np.uint64(0x000000000FFFFFFF))]


def padded(data: np.ndarray) -> np.ndarray:
    """``data`` followed by 8 zero bytes, as :func:`varints` wants it."""
    out = np.zeros(len(data) + 8, dtype=np.uint8)
    out[: len(data)] = data
    return out


def varints(
    data: np.ndarray, pos: np.ndarray, limit: np.ndarray | int, *, strict: bool = True
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Decode the varint at each of ``pos``, none reaching ``limit`` (at most ``len(data) - 8``).

    ``data`` ends with 8 bytes of padding (see :func:`padded`): each varint is read
    as the little-endian 64-bit word at its position, so that one of up to 8 bytes
    takes a handful of whole-array operations; longer ones (negative numbers, values
    past 2**56) take a byte-at-a-time loop.

    Returns ``(values as uint64, position after each, ok)``. Values longer than 64
    bits are truncated, as protobuf does.

    Raises:
        WireError: with ``strict``, a varint that reaches its limit or runs past 10 bytes;
            without it such varints are only marked not ``ok``.
    """
    n = len(pos)
    pos = pos.astype(np.int64, copy=False)
    lim = np.broadcast_to(np.asarray(limit, dtype=np.int64), (n,))
    ok = pos < lim
    if not ok.all():
        if strict:
            raise WireError("truncated varint (file cut short?)", int(pos[np.argmin(ok)]))
        pos = np.where(ok, pos, 0)
    first = data[pos]
    if not (first & 0x80).any():  # all one byte: tags, small ids and lengths
        return first.astype(np.uint64), pos + 1, ok
    # In place where it can be: this runs on every field of every event.
    values = np.ndarray((len(data) - 7,), dtype="<u8", buffer=data, strides=(1,))[pos]
    ends = np.invert(values)
    ends &= _HIGH_BITS  # the high bits of the bytes that may end the varint (none: longer than 8)
    mask = ends - _ONE
    mask ^= ends  # the first of them and the bits below it: the varint's bytes (all 8 when it is the 8th)
    long = np.flatnonzero(ends == 0)
    if long.size:
        mask[long] = 0
        long = long[ok[long]]
    values &= mask
    values &= _LOW_BITS
    for upper, shift, lower in _JOINS:
        high = values & upper
        high >>= shift
        values &= lower
        values |= high
    after = pos + (np.bitwise_count(mask) >> 3)
    if long.size:
        values[long], after[long], ok[long] = _long_varints(data, pos[long], lim[long], strict)
    short = after > lim
    if short.any():
        if strict:
            raise WireError("truncated varint (file cut short?)", int(pos[np.argmax(short)]))
        ok &= ~short
    return values, after, ok


def _long_varints(
    data: np.ndarray, pos: np.ndarray, lim: np.ndarray, strict: bool
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`varints` one byte at a time, for varints of more than 8 bytes."""
    n = len(pos)
    ok = np.ones(n, dtype=bool)
    values = np.zeros(n, dtype=np.uint64)
    after = pos.copy()
    more = np.arange(n)
    shift = 0
    while more.size:
        if shift >= 70:
            if strict:
                raise WireError("varint longer than 10 bytes", int(pos[more[0]]))
            ok[more] = False
            break
        at = after[more]
        short = at >= lim[more]
        if short.any():
            if strict:
                raise WireError("truncated varint (file cut short?)", int(pos[more[np.argmax(short)]]))
            ok[more[short]] = False
            more, at = more[~short], at[~short]
        byte = data[at]
        values[more] |= (byte & 0x7F).astype(np.uint64) << np.uint64(shift)
        after[more] = at + 1
        more = more[byte >= 0x80]
        shift += 7
    return values, after, ok
