"""A raw chat-endpoint client for end-to-end tests: frames, tones, and every message recorded in order."""

from __future__ import annotations

import asyncio
import base64
import io
import json

import numpy as np
import websockets
from PIL import Image

from deployments.protocol.server_messages import CHAT_MESSAGES, read_message

CHAT_PATH = "/v1/video/chat/stream"


def jpeg(step: int, moving: bool = True) -> str:
    """A moving scene changes a lot between frames (blocks of new colours); a static one not at all."""
    blocks = np.random.default_rng(step if moving else 0).integers(0, 256, (6, 8, 3), dtype=np.uint8)
    frame = np.kron(blocks, np.ones((20, 20, 1), np.uint8))
    buffer = io.BytesIO()
    Image.fromarray(frame).save(buffer, format="JPEG", quality=90)
    return base64.b64encode(buffer.getvalue()).decode()


def tone(seconds: float, hz: float) -> str:
    t = np.arange(int(16000 * seconds)) / 16000
    return base64.b64encode((np.sin(2 * np.pi * hz * t) * 12000).astype("<i2").tobytes()).decode()


class Chat:
    """A raw client: sends what it is told, records every message in order."""

    def __init__(self, ws):
        self.ws = ws
        self.messages: list[dict] = []
        self.close_code = None

    async def send(self, message):
        await self.ws.send(message if isinstance(message, str) else json.dumps(message))

    async def until(self, predicate, timeout=60.0):
        while True:
            try:
                raw = await asyncio.wait_for(self.ws.recv(), timeout)
            except websockets.ConnectionClosed as exc:
                self.close_code = exc.rcvd.code if exc.rcvd else None
                return None
            message = json.loads(raw)
            read_message(message, CHAT_MESSAGES)  # a served message that breaks the contract fails the test
            self.messages.append(message)
            if predicate(message):
                return message

    async def to_end(self):
        return await self.until(lambda m: False)

    def of(self, kind):
        return [m for m in self.messages if m["type"] == kind]


async def open_chat(address, path=CHAT_PATH, headers=None, **config):
    ws = await websockets.connect(f"ws://{address}{path}", max_size=None, open_timeout=30, additional_headers=headers)
    chat = Chat(ws)
    await chat.send({"type": "session.config", **config})
    return chat


async def frames(chat, count, moving=True, start=0, ids=True):
    for i in range(start, start + count):
        await chat.send({"type": "video.frame", "data": jpeg(i, moving), **({"frame_id": f"f{i}"} if ids else {}), "pts_ms": i * 500})


def answers(chat):
    """(response.start, [deltas], response.text.done) per answer, in order; checks the pairing."""
    out, current = [], None
    for m in chat.messages:
        if m["type"] == "response.start":
            assert current is None, "response.start before the previous answer's response.text.done"
            current = (m, [])
        elif m["type"] == "response.text.delta":
            current[1].append(m["delta"])
        elif m["type"] == "response.text.done":
            out.append((current[0], current[1], m))
            current = None
    assert current is None, "an answer without response.text.done"
    return out
