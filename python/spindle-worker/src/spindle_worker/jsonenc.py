"""JSON as the reference server writes it (stream payloads, state, schemas).

Behaviour matched to langgraph-api's encoder (orjson with a fallback for the types
orjson does not know): pydantic models (every LangChain message) as `model_dump()`,
named tuples as dicts, `Send` as `{node, args}`, sets as lists, UUIDs and paths as
strings, Decimals as int or float, timedeltas as seconds, bytes as base64, and
exceptions as `{error, message}` where the message is kept only for the error classes
whose text is safe to show (see `public_error`).
"""

from __future__ import annotations

import re
import uuid
from base64 import b64encode
from collections import deque
from collections.abc import Mapping
from datetime import timedelta, timezone
from decimal import Decimal
from ipaddress import IPv4Address, IPv4Interface, IPv4Network, IPv6Address, IPv6Interface, IPv6Network
from pathlib import Path
from typing import Any

import orjson
from langgraph.errors import EmptyInputError, GraphBubbleUp, InvalidUpdateError, TaskNotFound
from langgraph.types import Send

try:  # zoneinfo is stdlib from 3.9, but may lack tz data; only the type matters here
    from zoneinfo import ZoneInfo
except ImportError:  # pragma: no cover
    ZoneInfo = timezone  # type: ignore[misc,assignment]

INTERNAL_ERROR_MESSAGE = "An internal error occurred"

# The exceptions whose message the reference shows to clients: Python's own argument
# and lookup errors and LangGraph's DSL errors. Anything else may carry secrets from
# user code, so only its class name is shown.
PUBLIC_ERRORS: tuple[type[BaseException], ...] = (
    ValueError,
    TypeError,
    KeyError,
    AttributeError,
    RuntimeError,
    RecursionError,
    TimeoutError,
    InvalidUpdateError,
    GraphBubbleUp,
    EmptyInputError,
    TaskNotFound,
)

_STR_TYPES = (uuid.UUID, IPv4Address, IPv4Interface, IPv4Network, IPv6Address, IPv6Interface, IPv6Network, Path)
_OPTIONS = orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS
_SURROGATES = re.compile(r"[\ud800-\udfff]")


def public_error(exc: BaseException) -> dict[str, str]:
    """`{error, message}` for clients: the class name, and the message if it is safe."""
    message = str(exc) if isinstance(exc, PUBLIC_ERRORS) else INTERNAL_ERROR_MESSAGE
    return {"error": type(exc).__name__, "message": message}


def _decimal(value: Decimal) -> int | float:
    # An integral Decimal stays an int so ids round-trip; anything else is a float.
    if not value.is_finite() or int(value.as_tuple().exponent) < 0:
        return float(value)
    return int(value)


def _default(obj: Any) -> Any:
    if isinstance(obj, Send):
        return {"node": obj.node, "args": obj.arg}
    if not isinstance(obj, type):
        if callable(getattr(obj, "model_dump", None)):
            return obj.model_dump()
        if callable(getattr(obj, "dict", None)):
            return obj.dict()
        if callable(getattr(obj, "_asdict", None)):
            return obj._asdict()
    if isinstance(obj, BaseException):
        return public_error(obj)
    if isinstance(obj, (set, frozenset, deque)):
        return list(obj)
    if isinstance(obj, (timezone, ZoneInfo)):
        return obj.tzname(None)
    if isinstance(obj, timedelta):
        return obj.total_seconds()
    if isinstance(obj, Decimal):
        return _decimal(obj)
    if isinstance(obj, _STR_TYPES):
        return str(obj)
    if isinstance(obj, re.Pattern):
        return obj.pattern
    if isinstance(obj, (bytes, bytearray)):
        return b64encode(obj).decode()
    return None


def _sanitise(o: Any) -> Any:
    """Replace lone surrogates (which orjson refuses) with '?', everywhere in `o`."""
    if isinstance(o, str):
        return _SURROGATES.sub("?", o)
    if isinstance(o, Mapping):
        return {_sanitise(k): _sanitise(v) for k, v in o.items()}
    if isinstance(o, tuple) and hasattr(o, "_fields"):
        return {f: _sanitise(v) for f, v in zip(o._fields, o)}
    if isinstance(o, (list, tuple, set)):
        return [_sanitise(x) for x in o]
    return o


def dumpb(obj: Any) -> bytes:
    """UTF-8 JSON bytes for `obj`, as the reference encodes it."""
    try:
        out = orjson.dumps(obj, default=_default, option=_OPTIONS)
    except TypeError as e:
        if "surrogates not allowed" not in str(e):
            raise
        out = orjson.dumps(_sanitise(obj), default=_default, option=_OPTIONS)
    if b"\\u0000" in out:
        # NUL is replaced, not dropped, so "key\0" cannot turn into an existing "key".
        out = out.replace(b"\\\\u0000", b"\\\\ufffd").replace(b"\\u0000", b"\\ufffd")
    return out
