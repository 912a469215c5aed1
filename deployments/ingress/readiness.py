"""Which model deployments can take a session, known without ever blocking a handshake on model loading.

Serve routes a call only to a running replica, so a model deployment's
`model_info` answers once one of its replicas has loaded. One such call per
deployment is kept in flight until it answers (then its answer is kept: what a
model can do does not change while its deployment lives). `/healthz` only
looks at those calls; a session waits on its own model's, up to a bound.
"""

from __future__ import annotations

import asyncio

from ray.serve.handle import DeploymentHandle


class ModelNotReady(Exception):
    def __init__(self, name: str, waited_s: float) -> None:
        super().__init__(f"{name} is still loading")
        self.name, self.waited_s = name, waited_s


class ModelReadiness:
    def __init__(self, handles: dict[str, DeploymentHandle]) -> None:
        self._handles = handles
        self._asks: dict[str, asyncio.Future] = {}

    def _ask(self, name: str) -> asyncio.Future:
        ask = self._asks.get(name)
        if ask is None or (ask.done() and (ask.cancelled() or ask.exception() is not None)):
            # A failed ask (a replica that died while loading) is asked again.
            ask = self._asks[name] = asyncio.ensure_future(self._fetch(name))
        return ask

    async def _fetch(self, name: str) -> dict:
        return await self._handles[name].model_info.remote()

    async def info(self, name: str, wait_s: float) -> dict:
        """`name`'s model_info, waiting up to `wait_s` for a replica to load; raises ModelNotReady."""
        try:
            return await asyncio.wait_for(asyncio.shield(self._ask(name)), wait_s)
        except asyncio.TimeoutError:
            raise ModelNotReady(name, wait_s) from None

    async def not_ready(self, probe_s: float = 0.2) -> list[str]:
        """The deployments with no replica that answers yet (each given `probe_s` at most, together)."""
        asks = {name: self._ask(name) for name in self._handles}
        pending = [a for a in asks.values() if not a.done()]
        if pending:
            await asyncio.wait(pending, timeout=probe_s)
        return [name for name, ask in asks.items() if not ask.done() or ask.cancelled() or ask.exception() is not None]
