"""`ModelReadiness`: /healthz and sessions learn whether a model's replicas have loaded without blocking on it.

The handle is the one fake here (a Serve handle whose replica "loads" until the
test says so); what is under test is the waiting, caching and retrying.
"""

from __future__ import annotations

import asyncio

import pytest

from deployments.ingress.readiness import ModelNotReady, ModelReadiness

pytestmark = pytest.mark.timeout(30)


class _LoadingHandle:
    """`handle.model_info.remote()` answers once `loaded` is set (or fails while `failing`)."""

    def __init__(self) -> None:
        self.loaded = asyncio.Event()
        self.failing = False
        self.calls = 0
        self.model_info = self

    def remote(self):
        self.calls += 1

        async def answer():
            if self.failing:
                raise RuntimeError("replica died while loading")
            await self.loaded.wait()
            return {"frames_per_block": 3}

        return answer()


def test_not_ready_until_a_replica_answers_then_cached():
    async def go():
        world, chat = _LoadingHandle(), _LoadingHandle()
        readiness = ModelReadiness({"WorldModel": world, "Understanding": chat})
        assert await readiness.not_ready(0.05) == ["WorldModel", "Understanding"]
        with pytest.raises(ModelNotReady) as info:
            await readiness.info("WorldModel", 0.05)
        assert info.value.name == "WorldModel" and info.value.waited_s == 0.05
        world.loaded.set()
        assert await readiness.info("WorldModel", 1.0) == {"frames_per_block": 3}
        assert await readiness.not_ready(0.05) == ["Understanding"]
        waiting = asyncio.ensure_future(readiness.info("Understanding", 5.0))  # a session waiting for its model
        await asyncio.sleep(0.05)
        chat.loaded.set()
        assert await waiting == {"frames_per_block": 3}
        assert await readiness.not_ready(0.05) == []
        return world.calls, chat.calls

    # One call per deployment, however often /healthz and sessions ask: the timeouts never cancel it.
    assert asyncio.run(go()) == (1, 1)


def test_a_failed_ask_is_asked_again():
    async def go():
        world = _LoadingHandle()
        world.failing = True
        readiness = ModelReadiness({"WorldModel": world})
        assert await readiness.not_ready(0.05) == ["WorldModel"]
        world.failing = False
        world.loaded.set()
        assert await readiness.info("WorldModel", 1.0) == {"frames_per_block": 3}
        return world.calls

    assert asyncio.run(go()) == 2
