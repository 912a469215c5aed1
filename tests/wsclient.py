"""Raw WebSocket helpers for end-to-end tests: they speak the wire format, nothing more.

Every JSON message received is read with the endpoint's contract models
(`deployments/protocol/server_messages.py`): a served message that breaks
them fails the test that received it, whatever the test was about."""

from __future__ import annotations

import asyncio
import io
import json
from dataclasses import dataclass, field

import websockets

from deployments.protocol.server_messages import CHAT_MESSAGES, VIDEO_MESSAGES, read_message


@dataclass
class Transcript:
    messages: list[dict] = field(default_factory=list)  # every JSON message, in order
    media: list[tuple[dict, bytes]] = field(default_factory=list)  # (chunk_metadata, binary)
    close_code: int | None = None
    order_errors: list[str] = field(default_factory=list)

    def of_type(self, kind: str) -> list[dict]:
        return [m for m in self.messages if m.get("type") == kind]

    @property
    def errors(self) -> list[dict]:
        return self.of_type("error")

    @property
    def done(self) -> dict | None:
        found = self.of_type("session.done")
        return found[0] if found else None

    @property
    def stream(self) -> bytes:
        return b"".join(data for _, data in self.media)


@dataclass(frozen=True)
class Access:
    """What a client presents: a key (as a bearer header) and a browser Origin; nothing for an open server."""

    key: str | None = None
    origin: str | None = None

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.key}"} if self.key else {}


async def connect(address: str, path: str = "/v1/realtime/video", access: "Access | None" = None):
    access = access or Access()
    return await websockets.connect(f"ws://{address}{path}", max_size=None, open_timeout=30,
                                    additional_headers=access.headers, origin=access.origin)


async def receive(ws, transcript: Transcript, timeout: float = 60.0) -> dict | None:
    """Next JSON message (pairing binaries with their metadata); None when the socket closed."""
    while True:
        try:
            raw = await asyncio.wait_for(ws.recv(), timeout)
        except websockets.ConnectionClosed as exc:
            transcript.close_code = exc.rcvd.code if exc.rcvd else None
            return None
        if isinstance(raw, bytes):
            last = transcript.messages[-1] if transcript.messages else None
            if not last or last.get("type") != "video.chunk_metadata" or (transcript.media and transcript.media[-1][0] is last):
                transcript.order_errors.append("binary frame without its chunk_metadata right before it")
                continue
            if last["byte_length"] != len(raw):
                transcript.order_errors.append(f"byte_length {last['byte_length']} != {len(raw)}")
            transcript.media.append((last, raw))
            continue
        message = json.loads(raw)
        check_contract(ws, message)
        if transcript.messages and transcript.messages[-1].get("type") == "video.chunk_metadata" and (
            not transcript.media or transcript.media[-1][0] is not transcript.messages[-1]
        ):
            transcript.order_errors.append(f"{message.get('type')} came between chunk_metadata and its binary")
        transcript.messages.append(message)
        return message


def check_contract(ws, message: dict) -> None:
    """Read a received message with its endpoint's contract (the one the socket's path names)."""
    contract = CHAT_MESSAGES if ws.request.path.split("?")[0].endswith("/chat/stream") else VIDEO_MESSAGES
    read_message(message, contract)  # MalformedMessage names the field


async def until(ws, transcript: Transcript, predicate, timeout: float = 60.0) -> dict | None:
    while True:
        message = await receive(ws, transcript, timeout)
        if message is None or predicate(message):
            return message


async def run_to_end(ws, transcript: Transcript, timeout: float = 60.0) -> Transcript:
    while await receive(ws, transcript, timeout) is not None:
        pass
    return transcript


async def start(address: str, path: str = "/v1/realtime/video", access: "Access | None" = None, **fields) -> tuple[object, Transcript, dict]:
    ws = await connect(address, path, access)
    transcript = Transcript()
    await ws.send(json.dumps({"type": "session.start", **fields}))
    first = await receive(ws, transcript)
    return ws, transcript, first


async def send(ws, message: dict | str | bytes) -> None:
    await ws.send(message if isinstance(message, (str, bytes)) else json.dumps(message))


def decode_frames(stream: bytes) -> list:
    """A session's fMP4 stream decoded with PyAV: its frames as uint8 (H, W, 3) RGB arrays."""
    import av

    with av.open(io.BytesIO(stream)) as container:
        return [frame.to_ndarray(format="rgb24") for frame in container.decode(video=0)]
