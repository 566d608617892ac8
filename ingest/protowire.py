"""Walking protobuf wire format without decoding it: field numbers and byte ranges.

Used to split an XSpace into planes and a plane into lines before the protobuf
runtime decodes each piece, so that no large message is ever decoded whole.
"""

from __future__ import annotations

import mmap
from collections.abc import Iterator

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
