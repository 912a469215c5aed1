"""Which image a byte string is, and its data URL: the start-image forms every layer passes around."""

from __future__ import annotations

import base64

_MAGIC = ((b"\x89PNG\r\n\x1a\n", "image/png"), (b"\xff\xd8\xff", "image/jpeg"))
MEDIA_TYPES = ("image/png", "image/jpeg", "image/webp")  # what a session's start image may be


def media_type(data: bytes) -> str | None:
    """PNG, JPEG or WebP, read off the bytes (never a file name or a declared type); None for anything else."""
    kind = next((m for magic, m in _MAGIC if data.startswith(magic)), None)
    if kind is None and data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        kind = "image/webp"
    return kind


def data_url(data: bytes, kind: str) -> str:
    return f"data:{kind};base64," + base64.b64encode(data).decode("ascii")
