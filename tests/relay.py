"""A recording WebSocket relay for client tests against the real server.

The client under test connects to the relay; the relay opens the same path on
the real server and passes every message through unchanged, both ways, noting
each with its arrival time. So a test sees what the client sent and when
(pacing, ordering, ack gating), on a real session. `hold` keeps server
messages back from the client after a given one until the test releases them:
how a test proves the client shows a delta before the next one exists.
"""

from __future__ import annotations

import asyncio
import base64
import json
import threading
import time
from collections.abc import Callable


class Relay:
    """`with Relay(upstream) as relay:` then point the client at `relay.url`.

    `upstream` is `ws://host:port` of the real server (paths are kept).
    `log` holds (time.perf_counter(), "in" | "out", message) per text message:
    "in" from the client, "out" from the server; base64 `data` replaced by its
    decoded size `nbytes`. `hold(predicate)`: after forwarding the first server
    message the predicate accepts, later server messages wait until `release()`.
    """

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream.rstrip("/")
        self.log: list[tuple[float, str, dict]] = []
        self.port: int | None = None
        self._hold: Callable[[dict], bool] | None = None
        self._held = threading.Event()  # the held message went through
        self._released = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._ready = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._main()), daemon=True)

    @property
    def url(self) -> str:
        return f"ws://127.0.0.1:{self.port}"

    def hold(self, predicate: Callable[[dict], bool]) -> None:
        self._hold = predicate

    def release(self) -> None:
        self._released.set()

    def wait_held(self, timeout: float) -> bool:
        return self._held.wait(timeout)

    def __enter__(self) -> "Relay":
        self._thread.start()
        assert self._ready.wait(10), "relay did not start"
        return self

    def __exit__(self, *exc) -> None:
        self._released.set()
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)

    # -- log views -----------------------------------------------------------------
    def received(self, kind: str | None = None) -> list[tuple[float, dict]]:
        """What the client sent, as (time, message)."""
        return [(t, m) for t, d, m in self.log if d == "in" and (kind is None or m.get("type") == kind)]

    def sent(self, kind: str | None = None) -> list[tuple[float, dict]]:
        """What the server sent, as (time, message)."""
        return [(t, m) for t, d, m in self.log if d == "out" and (kind is None or m.get("type") == kind)]

    # -- the relay -----------------------------------------------------------------
    async def _main(self) -> None:
        from websockets.asyncio.server import serve

        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        async with serve(self._session, "127.0.0.1", 0, max_size=None) as server:
            self.port = server.sockets[0].getsockname()[1]
            self._ready.set()
            await self._stop.wait()

    async def _session(self, client) -> None:
        from websockets.asyncio.client import connect
        from websockets.exceptions import ConnectionClosed

        async with connect(self.upstream + client.request.path, max_size=None, open_timeout=60) as server:
            async def pump(source, sink, direction: str) -> None:
                try:
                    async for raw in source:
                        self._note(raw, direction)
                        await sink.send(raw)
                        if direction == "out" and self._hold is not None and isinstance(raw, str) and self._hold(json.loads(raw)):
                            self._hold = None
                            self._held.set()
                            await asyncio.to_thread(self._released.wait, 60)
                except ConnectionClosed:
                    pass
                # Pass the close on with its code, as the far end gave it.
                code = source.close_code or 1000
                await sink.close(code if code not in (1005, 1006) else 1000, source.close_reason or "")

            await asyncio.gather(pump(client, server, "in"), pump(server, client, "out"))

    def _note(self, raw, direction: str) -> None:
        now = time.perf_counter()
        if not isinstance(raw, str):
            self.log.append((now, direction, {"type": None, "binary": len(raw)}))
            return
        message = json.loads(raw)
        if isinstance(message, dict) and isinstance(message.get("data"), str):
            message = {k: v for k, v in message.items() if k != "data"} | {"nbytes": len(base64.b64decode(message["data"]))}
        self.log.append((now, direction, message))
