"""Reading a WebSocket text frame as JSON, strictly, for both endpoints."""

from __future__ import annotations

import json
from typing import Any


def byte_length(raw: str | bytes | bytearray | memoryview) -> int:
    """Size limits count UTF-8 bytes, not characters."""
    if isinstance(raw, str):
        return len(raw) if raw.isascii() else len(raw.encode("utf-8", "surrogatepass"))
    return len(raw)


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def loads(raw: str | bytes | bytearray | memoryview) -> Any:
    """Strict JSON: NaN/Infinity literals and bytes that are not UTF-8 are invalid; so is nesting too deep to parse."""
    if isinstance(raw, memoryview):
        raw = raw.tobytes()
    try:
        return json.loads(raw, parse_constant=_reject_constant)
    except RecursionError:
        raise ValueError("JSON nested too deeply") from None


def short(value: Any, limit: int = 200) -> str:
    """A value echoed in an error message, cut to a readable length."""
    text = str(value)
    return text if len(text) <= limit else text[:limit] + "..."
