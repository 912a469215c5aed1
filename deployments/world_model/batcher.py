"""Per-session requests of a replica, served together.

Each session's loop asks for its next block (and, beside the next block, for
the frames of the last one); whatever requests are waiting when the engine
comes free go to it as one call, and the engine runs those whose shapes allow
it as one batch (continuous batching: nobody waits for a batch to fill, a lone
session runs alone at once). While a call runs, the next one gathers.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable


class Batcher:
    def __init__(self, call: Callable[[list[str]], Awaitable[dict]], max_batch: int) -> None:
        self.call = call  # session ids -> {id: result or exception}
        self.max_batch = max_batch
        self._pending: dict[str, asyncio.Future] = {}
        self._wakeup = asyncio.Event()
        self._runner: asyncio.Task | None = None
        self.calls = 0  # for stats: how many calls, and how many session requests they carried
        self.requests = 0

    async def submit(self, session_id: str):
        """This session's result (or its exception); one request per session at a time."""
        if session_id in self._pending:
            raise RuntimeError(f"session {session_id} already has a request pending")
        future = asyncio.get_running_loop().create_future()
        self._pending[session_id] = future
        self._wakeup.set()
        if self._runner is None or self._runner.done():
            self._runner = asyncio.create_task(self._run())
        # Shielded: the call carries this session either way, and its outcome must still be collected.
        return await asyncio.shield(future)

    async def _run(self) -> None:
        while True:
            await self._wakeup.wait()
            self._wakeup.clear()
            while self._pending:
                ids = list(self._pending)[: self.max_batch]
                futures = {sid: self._pending.pop(sid) for sid in ids}
                try:
                    outcomes = await self.call(ids)
                except Exception as exc:  # the whole call failed: every session in it hears why
                    outcomes = {sid: exc for sid in ids}
                self.calls += 1
                self.requests += len(ids)
                for sid, future in futures.items():
                    outcome = outcomes.get(sid, RuntimeError(f"no result came back for session {sid}"))
                    if future.done():
                        continue
                    if isinstance(outcome, BaseException):
                        future.set_exception(outcome)
                    else:
                        future.set_result(outcome)

    def stats(self) -> dict:
        return {"calls": self.calls, "requests": self.requests, "pending": len(self._pending)}
