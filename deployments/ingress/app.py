"""The ingress deployment: FastAPI routes, thin. Each WebSocket gets its own session object."""

# No `from __future__ import annotations` here: Serve rebuilds the route methods, and FastAPI must see
# the real `WebSocket` class in their signatures (a string annotation makes it refuse the handshake, 403).

import os
from pathlib import Path

from fastapi import FastAPI, WebSocket
from fastapi.responses import FileResponse
from fastapi.staticfiles import StaticFiles
from ray import serve
from ray.serve.handle import DeploymentHandle

from deployments.config import AppConfig
from deployments.ingress.chat_session import ChatSession
from deployments.ingress.video_session import VideoSession
from deployments.observability.metrics import IngressMetrics

WEB = Path(__file__).resolve().parents[2] / "clients" / "web"

app = FastAPI(title="realtime-video")
# The pages' scripts and styles; the pages themselves answer at / and /chat.
app.mount("/static", StaticFiles(directory=WEB, check_dir=False), name="static")


@serve.deployment(name="VideoIngress")
@serve.ingress(app)
class VideoIngress:
    def __init__(self, config: AppConfig, world: DeploymentHandle, understanding: DeploymentHandle | None = None) -> None:
        self.config = config
        self.world = world
        self.understanding = understanding
        self.metrics = IngressMetrics()
        self._info: dict[str, dict] = {}

    async def _model_info(self, name: str, handle: DeploymentHandle) -> dict:
        # Asked once: what a model can do does not change while its deployment lives.
        if name not in self._info:
            self._info[name] = await handle.model_info.remote()
        return self._info[name]

    @app.get("/")
    async def player_page(self) -> FileResponse:
        return FileResponse(WEB / "index.html")

    @app.get("/chat")
    async def chat_page(self) -> FileResponse:
        return FileResponse(WEB / "chat.html")

    @app.get("/healthz")
    async def healthz(self) -> dict:
        return {"status": "ok", "pid": os.getpid()}

    @app.get("/v1/models")
    async def models(self) -> dict:
        names = [self.config.model_name] + ([self.config.understanding_name] if self.understanding is not None else [])
        return {"object": "list", "data": [{"id": name, "object": "model", "owned_by": "realtime-video"} for name in names]}

    @app.websocket("/v1/realtime/video")
    async def realtime_video(self, websocket: WebSocket) -> None:
        info = await self._model_info("world", self.world)
        await VideoSession(websocket, self.config, self.world, info, self.metrics).run()

    @app.websocket("/v1/video/chat/stream")
    async def video_chat(self, websocket: WebSocket) -> None:
        if self.understanding is None:
            await websocket.close(1008, "no understanding model is configured")
            return
        info = await self._model_info("understanding", self.understanding)
        await ChatSession(websocket, self.config, self.understanding, info, self.metrics).run()
