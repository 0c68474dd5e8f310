"""Walking protobuf messages in place (a memory-mapped model file), without parsing them: what
reads a 2 GB model's header, or finds where its tensors lie, in the time a small one takes.
Needs nothing beyond Python."""

from __future__ import annotations

from typing import Any, Iterator

__all__ = ["I32", "I64", "LEN", "VARINT", "fields", "length_delimited", "varint"]

# Wire types.
VARINT, I64, LEN, I32 = 0, 1, 2, 5


def varint(buf: Any, pos: int, end: int) -> tuple[int, int]:
    """The varint at ``buf[pos]`` (not past ``end``) and the position after it."""
    value = shift = 0
    while True:
        if pos >= end or shift > 63:
            raise ValueError("a truncated or malformed varint")
        b = buf[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        if not b & 0x80:
            return value, pos
        shift += 7


def _encode_varint(value: int) -> bytes:
    out = bytearray()
    while True:
        b = value & 0x7F
        value >>= 7
        out.append(b | (0x80 if value else 0))
        if not value:
            return bytes(out)


def fields(buf: Any, start: int, end: int) -> Iterator[tuple[int, int, int, int, int]]:
    """(field number, wire type, field start, payload start, payload end) of each field of the
    message in buf[start:end]."""
    pos = start
    while pos < end:
        field_start = pos
        tag, pos = varint(buf, pos, end)
        number, wire = tag >> 3, tag & 7
        if wire == VARINT:
            _, pos2 = varint(buf, pos, end)
        elif wire == I64:
            pos2 = pos + 8
        elif wire == I32:
            pos2 = pos + 4
        elif wire == LEN:
            n, pos = varint(buf, pos, end)
            pos2 = pos + n
        else:
            raise ValueError(f"wire type {wire} (groups) is not used by ONNX")
        if pos2 > end:
            raise ValueError("a field runs past the end of its message")
        yield number, wire, field_start, pos, pos2
        pos = pos2


def length_delimited(number: int, payload: bytes) -> bytes:
    """Field ``number`` holding ``payload`` (a message or bytes), encoded."""
    return _encode_varint(number << 3 | LEN) + _encode_varint(len(payload)) + payload
