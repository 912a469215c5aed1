"""What every WebSocket session of the ingress shares, whichever endpoint it serves.

A session opens one streaming call to a replica (refused at once when the
replica is full, so it tries another), then runs three tasks side by side: the
pump (replica stream -> client), the reader (client -> replica mailbox) and the
watchdog (timeouts, lease renewals). Whichever ends first decides how the
session ends; the others are cancelled, and the stream is always cancelled so
the replica frees the slot.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from fastapi import WebSocket
from ray.exceptions import RayActorError
from ray.serve.handle import DeploymentHandle
from starlette.websockets import WebSocketDisconnect, WebSocketState

from deployments.ingress.access import choose_subprotocol
from deployments.ingress.limits import TokenBucket
from deployments.observability.metrics import IngressMetrics
from deployments.protocol import errors
from deployments.protocol.errors import ProtocolError
from deployments.sessions.opening import open_session

logger = logging.getLogger("ray.serve")

CLOSE_TIMEOUT_S = 5.0  # a last word or close frame that cannot leave by then is abandoned


class Disconnected(Exception):
    """The client went away."""


class WebSocketSession:
    endpoint = "websocket"  # names the endpoint in metrics

    def __init__(
        self,
        websocket: WebSocket,
        metrics: IngressMetrics | None = None,
        *,
        subprotocol: str | None = None,
        max_messages_per_second: float | None = None,
    ) -> None:
        self.ws = websocket
        self.metrics = metrics
        self.subprotocol = subprotocol  # echoed at accept: browsers drop a handshake that picks none of theirs
        self._message_rate = TokenBucket(max_messages_per_second) if max_messages_per_second else None
        self._send_lock = asyncio.Lock()
        self._stream = None
        self.request_id: str | None = None  # set once the session is accepted; errors then carry it

    # -- sending -----------------------------------------------------------------
    async def send_json(self, message: dict) -> None:
        if self.metrics is not None and message.get("type") == "error":
            self.metrics.error(self.endpoint, message.get("code"))
        async with self._send_lock:
            await self.ws.send_json(message)

    async def send_pair(self, metadata: dict, data: bytes) -> None:
        """A JSON message and its binary frame back to back: nothing may come between them."""
        async with self._send_lock:
            await self.ws.send_json(metadata)
            await self.ws.send_bytes(data)

    async def send_error(self, message: str, code: str | None = None, **extra: Any) -> None:
        await self.send_json(errors.error_message(message, code=code, request_id=self.request_id, **extra))

    async def fail(self, error: ProtocolError) -> None:
        """Send a protocol error; close when it ends the session."""
        await self.send_json(error.to_message(self.request_id))
        if error.close_code:
            await self.close(error.close_code)

    async def close(self, code: int = 1000) -> None:
        if self.ws.client_state == WebSocketState.CONNECTED:
            try:
                await asyncio.wait_for(self.ws.close(code), CLOSE_TIMEOUT_S)
            except (RuntimeError, asyncio.TimeoutError):
                pass

    async def receive_raw(self) -> str | bytes:
        message = await self.ws.receive()
        if message["type"] == "websocket.disconnect":
            raise Disconnected
        text = message.get("text")
        return text if text is not None else message.get("bytes") or b""

    async def receive_limited(self) -> str | bytes:
        """The next client message within the session's message rate; those over it get an error and are dropped."""
        while True:
            raw = await self.receive_raw()
            if self._message_rate is None or self._message_rate.take():
                return raw
            await self.fail(errors.rate_limited("messages", self._message_rate.rate))

    # -- life ------------------------------------------------------------------------
    async def run(self) -> None:
        await self.ws.accept(subprotocol=self.subprotocol)
        try:
            await self.serve()
        except (Disconnected, WebSocketDisconnect):
            pass
        finally:
            if self._stream is not None:
                self._stream.cancel()

    async def serve(self) -> None:
        raise NotImplementedError

    async def open_stream(self, handle: DeploymentHandle, method: str, request: object, accepted: type, retry_after_s: float):
        """The replica's first item: `accepted` or a refusal. A full replica refuses at once, so try another."""
        opened = await open_session(handle, method, request, accepted)
        self._stream = opened.stream
        return opened.first

    def refusal_error(self, refusal, retry_after_s: float, prefix: str) -> ProtocolError:
        if refusal is None or refusal.code == errors.OVER_CAPACITY:
            return errors.over_capacity((refusal and refusal.retry_after_s) or retry_after_s)
        return ProtocolError(f"{prefix}{refusal.message}", refusal.code, close_code=errors.CLOSE_POLICY)

    @property
    def stream(self):
        return self._stream

    async def supervise(self, *coroutines) -> None:
        """Run the session's tasks until the first ends; each returns the close code (None: leave it open).

        A task ends the session with an error by raising SessionFault: the error is sent after the other
        tasks are cancelled, so it never waits behind a send that a slow client holds up.
        """
        tasks = {asyncio.create_task(c) for c in coroutines}
        close_code: int | None = None
        last_word: ProtocolError | None = None
        try:
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            finished = done.pop()
            outcome = finished.exception()
            if outcome is None:
                close_code = finished.result()
            elif isinstance(outcome, (Disconnected, WebSocketDisconnect)):
                close_code = None
            elif isinstance(outcome, SessionFault):
                last_word = outcome.error
            elif isinstance(outcome, RayActorError):
                logger.warning("session %s: replica lost: %s", self.request_id, outcome)
                last_word = errors.replica_lost()
            else:
                logger.error("session %s failed", self.request_id, exc_info=outcome)
                last_word = errors.internal_error()
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        if self._stream is not None:
            self._stream.cancel()
        if last_word is not None:
            close_code = await self._last_word(last_word)
        if close_code is not None:
            await self.close(close_code)

    async def _last_word(self, error: ProtocolError) -> int | None:
        """Tell the client, if it is still there; returns the close code."""
        try:
            await asyncio.wait_for(self.send_json(error.to_message(self.request_id)), CLOSE_TIMEOUT_S)
        except Exception:  # the client may be gone too
            pass
        return error.close_code


async def refuse_websocket(websocket: WebSocket, denied) -> None:
    """Accept only to say why, then close with 1008: a browser sees the reason, not a bare failed handshake."""
    await websocket.accept(subprotocol=choose_subprotocol(websocket.headers))
    try:
        await websocket.send_json(errors.error_message(denied.message, denied.code))
        await asyncio.wait_for(websocket.close(errors.CLOSE_POLICY), CLOSE_TIMEOUT_S)
    except (RuntimeError, asyncio.TimeoutError, WebSocketDisconnect):
        pass


class SessionFault(Exception):
    """Raised by a session task to end the session with this error."""

    def __init__(self, error: ProtocolError) -> None:
        super().__init__(error.message)
        self.error = error
