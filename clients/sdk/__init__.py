"""The Python client for both endpoints, async and sync.

    VideoStreamClient   one `/v1/realtime/video` session: start, interact, iterate events, result()
    ChatStreamClient    one `/v1/video/chat/stream` session: configure, send frames and audio, ask, done()
    stream_session      a whole video session in one call (async); `generate` is the same, blocking
    ask_about_frames    frames in, one answer out (blocking)

One connection layer (`connection.py`: lifetime, clock, close codes) and one
error family (`errors.py`) serve both. `$RTV_API_KEY`, when set, is sent as a
Bearer token.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any

from clients.sdk.chat import Answer, ChatResult, ChatStreamClient
from clients.sdk.errors import (
    ClientConnectionError,
    ClientError,
    ClientInputError,
    ClientProtocolError,
    ClientTimeoutError,
    MediaError,
    ServerError,
    SessionEndedError,
)
from clients.sdk.video import SessionResult, VideoChunk, VideoStart, VideoStreamClient, stream_session

__all__ = [
    "Answer", "ChatResult", "ChatStreamClient", "ClientConnectionError", "ClientError", "ClientInputError",
    "ClientProtocolError", "ClientTimeoutError", "MediaError", "ServerError", "SessionEndedError", "SessionResult",
    "VideoChunk", "VideoStart", "VideoStreamClient", "ask_about_frames", "generate", "stream_session",
]


def generate(url: str, prompt: str, **fields: Any) -> SessionResult:
    """One whole video session, blocking: `fields` are `session.start`'s (num_frames, seed, extra_params...)
    and `stream_session`'s (on_event, open_timeout, event_timeout). The MP4 is `result.media`."""
    return asyncio.run(stream_session(url, prompt, **fields))


def ask_about_frames(url: str, frames: Iterable[Any], question: str, *, timeout: float | None = 120.0, **config: Any) -> Answer:
    """Send `frames` (RGB uint8 arrays, PIL images, or JPEG/PNG bytes) as a live camera would, then ask
    `question` and wait for the whole answer, blocking. `config` goes in `session.config` first."""

    async def run() -> Answer:
        async with ChatStreamClient(url) as chat:
            if config:
                await chat.configure(**config)
            for frame in frames:
                await chat.send_frame(frame)
            await chat.wait_acks(timeout=timeout)
            answer = await chat.ask(question, timeout=timeout)
            await chat.done(timeout=timeout)
            return answer

    return asyncio.run(run())
