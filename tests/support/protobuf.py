"""Protobuf wire encoding, for hand-made (and hand-damaged) XSpace messages."""

from __future__ import annotations


def varint(value: int) -> bytes:
    """``value`` as a protobuf varint (a negative int64 as its 10-byte two's complement), for hand-made messages."""
    value &= (1 << 64) - 1
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | 0x80 if value else byte)
        if not value:
            return bytes(out)


def len_field(number: int, payload: bytes) -> bytes:
    """A length-delimited protobuf field ``number`` holding ``payload``."""
    return varint(number << 3 | 2) + varint(len(payload)) + payload
