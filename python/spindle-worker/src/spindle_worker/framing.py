"""Frames: a 4-byte big-endian length, then one msgpack map (see the protocol doc)."""

from __future__ import annotations

import asyncio
import struct
from typing import Any

import ormsgpack

MAX_FRAME = 256 * 1024 * 1024
_LEN = struct.Struct(">I")


class FrameError(Exception):
    """A frame that breaks the framing rules (too large, not a map)."""


def encode_frame(msg: dict[str, Any]) -> bytes:
    # OPT_NON_STR_KEYS: channel_versions and similar maps may carry non-str keys in
    # principle; bytes stay msgpack `bin` (ormsgpack's default for bytes).
    body = ormsgpack.packb(msg, option=ormsgpack.OPT_NON_STR_KEYS)
    if len(body) > MAX_FRAME:
        raise FrameError(f"frame of {len(body)} bytes is over the {MAX_FRAME}-byte limit")
    return _LEN.pack(len(body)) + body


async def read_frame(reader: asyncio.StreamReader) -> dict[str, Any] | None:
    """The next frame, or None at a clean end of stream."""
    try:
        head = await reader.readexactly(4)
    except asyncio.IncompleteReadError as e:
        if e.partial:
            raise FrameError("stream ended inside a frame header") from e
        return None
    (length,) = _LEN.unpack(head)
    if length > MAX_FRAME:
        raise FrameError(f"incoming frame of {length} bytes is over the {MAX_FRAME}-byte limit")
    try:
        body = await reader.readexactly(length)
    except asyncio.IncompleteReadError as e:
        raise FrameError("stream ended inside a frame") from e
    msg = ormsgpack.unpackb(body)
    if not isinstance(msg, dict):
        raise FrameError(f"a frame must hold a msgpack map, got {type(msg).__name__}")
    return msg
