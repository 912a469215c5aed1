"""The ingress deployment: FastAPI routes, thin. Each WebSocket gets its own session object."""


import os

from fastapi import FastAPI, WebSocket
from ray import serve
from ray.serve.handle import DeploymentHandle

from deployments.config import AppConfig
from deployments.ingress.video_session import VideoSession

app = FastAPI(title="realtime-video")


@serve.deployment(name="VideoIngress")
@serve.ingress(app)
class VideoIngress:
    def __init__(self, config: AppConfig, world: DeploymentHandle) -> None:
        self.config = config
        self.world = world
        self._model_info: dict | None = None

    async def model_info(self) -> dict:
        if self._model_info is None:
            self._model_info = await self.world.model_info.remote()
        return self._model_info

    @app.get("/healthz")
    async def healthz(self) -> dict:
        return {"status": "ok", "pid": os.getpid()}

    @app.get("/v1/models")
    async def models(self) -> dict:
        return {"object": "list", "data": [{"id": self.config.model_name, "object": "model", "owned_by": "realtime-video"}]}

    @app.websocket("/v1/realtime/video")
    async def realtime_video(self, websocket: WebSocket) -> None:
        await VideoSession(websocket, self.config, self.world, await self.model_info()).run()
