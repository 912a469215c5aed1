"""The ingress deployment: FastAPI routes, thin. Each WebSocket gets its own session object."""

# No `from __future__ import annotations` here: Serve rebuilds the route methods, and FastAPI must see
# the real `WebSocket` class in their signatures (a string annotation makes it refuse the handshake, 403).

import asyncio
import os
from pathlib import Path

from fastapi import FastAPI, Request, WebSocket
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import FileResponse, HTMLResponse, JSONResponse
from fastapi.staticfiles import StaticFiles
from ray import serve
from ray.serve.handle import DeploymentHandle

from deployments.config import AppConfig
from deployments.ingress.access import AccessDenied, AccessPolicy, Grant, keys_from
from deployments.ingress.chat_session import ChatSession
from deployments.ingress.key_sessions import SessionsPerKey
from deployments.ingress.readiness import ModelReadiness
from deployments.ingress.video_session import VideoSession
from deployments.ingress.videos_api import install as install_videos_api
from deployments.ingress.websocket_session import refuse_websocket
from deployments.observability.metrics import IngressMetrics
from deployments.protocol.videos import ApiError

WEB = Path(__file__).resolve().parents[2] / "clients" / "web"

# The API's schema and its docs page pass the key check like every data route (see the routes below).
app = FastAPI(title="realtime-video", docs_url=None, redoc_url=None, openapi_url=None)
# The pages' scripts and styles; the pages themselves answer at / and /chat.
app.mount("/static", StaticFiles(directory=WEB, check_dir=False), name="static")
install_videos_api(app)  # /v1/videos: OpenAI's Videos API (deployments/ingress/videos_api.py)


@serve.deployment(name="VideoIngress")
@serve.ingress(app)
class VideoIngress:
    def __init__(
        self,
        config: AppConfig,
        world: DeploymentHandle,
        understanding: DeploymentHandle | None = None,
        jobs: DeploymentHandle | None = None,
        key_sessions: DeploymentHandle | None = None,
    ) -> None:
        self.config = config
        self.world = world
        self.understanding = understanding
        self.jobs = jobs  # VideoJobs; None: no /v1/videos
        self.metrics = IngressMetrics()
        self.readiness = ModelReadiness({"WorldModel": world} | ({"Understanding": understanding} if understanding is not None else {}))
        origins = tuple(o.rstrip("/") for o in config.allowed_origins) if config.allowed_origins is not None else None
        self.access = AccessPolicy(keys_from(config.api_keys, os.environ), origins)
        self.sessions_per_key = SessionsPerKey(key_sessions, config.max_sessions_per_key)  # KeySessions: one count for all replicas
        self._open_sockets = 0

    @app.get("/")
    async def player_page(self) -> FileResponse:
        return FileResponse(WEB / "index.html")

    @app.get("/chat")
    async def chat_page(self) -> FileResponse:
        return FileResponse(WEB / "chat.html")

    @app.get("/openapi.json", include_in_schema=False)
    async def openapi_schema(self, request: Request) -> JSONResponse:
        self.check_http(request)
        return JSONResponse(app.openapi())

    @app.get("/docs", include_in_schema=False)
    async def api_docs(self, request: Request) -> HTMLResponse:
        self.check_http(request)
        # Relative, so it works under any route prefix; a key given as ?api_key= goes along to the schema.
        query = f"?{request.url.query}" if request.url.query else ""
        return get_swagger_ui_html(openapi_url=f"openapi.json{query}", title="realtime-video API")

    @app.get("/healthz")
    async def healthz(self) -> JSONResponse:
        # 200 only once every model deployment has a replica that can take a session: a load balancer or a
        # client that waits for it never meets a session that waits on model loading.
        loading = await self.readiness.not_ready()
        if loading:
            return JSONResponse({"status": "loading", "not_ready": loading, "pid": os.getpid()}, status_code=503)
        return JSONResponse({"status": "ok", "pid": os.getpid()})

    def check_http(self, request: Request) -> Grant:
        """API keys and origins for HTTP routes (which key, by fingerprint); refusals answer in OpenAI's error shape."""
        try:
            return self.access.check(request.headers, request.query_params, offered_protocols=[])
        except AccessDenied as exc:
            raise ApiError(exc.http_status, exc.message, code=exc.code) from None

    async def _admit(self, websocket: WebSocket, endpoint: str) -> tuple[Grant, str | None] | None:
        """Keys, origin and sessions per key (the grant and its lease), before any model work; a refusal closes with 1008."""
        try:
            grant = self.access.check(websocket.headers, websocket.query_params)
            return grant, await self.sessions_per_key.acquire(grant.key_id)
        except AccessDenied as exc:
            self.metrics.error(endpoint, exc.code)
            await refuse_websocket(websocket, exc)
            return None

    @app.get("/v1/models")
    async def models(self, request: Request) -> dict:
        self.check_http(request)
        names = [self.config.model_name] + ([self.config.understanding_name] if self.understanding is not None else [])
        return {"object": "list", "data": [{"id": name, "object": "model", "owned_by": "realtime-video"} for name in names]}

    async def _serve_socket(self, websocket: WebSocket, endpoint: str, make_session) -> None:
        admitted = await self._admit(websocket, endpoint)
        if admitted is None:
            return
        grant, lease = admitted
        self._open_sockets += 1
        try:
            await (await make_session(grant)).run()
        finally:
            self._open_sockets -= 1
            # Shielded: a cancelled handler still frees its count (else the renewals would, seconds later).
            await asyncio.shield(self.sessions_per_key.release(lease))

    async def stats(self) -> dict:
        """For tests and operators (through a handle): what this ingress replica holds right now."""
        return {"pid": os.getpid(), "open_sockets": self._open_sockets, "keyed_sessions": self.sessions_per_key.open_sessions(), "tasks": len(asyncio.all_tasks())}

    @app.websocket("/v1/realtime/video")
    async def realtime_video(self, websocket: WebSocket) -> None:
        async def make(grant: Grant) -> VideoSession:
            info = lambda: self.readiness.info("WorldModel", self.config.model_wait_s)  # noqa: E731
            return VideoSession(websocket, self.config, self.world, info, self.metrics, grant.subprotocol)

        await self._serve_socket(websocket, VideoSession.endpoint, make)

    @app.websocket("/v1/video/chat/stream")
    async def video_chat(self, websocket: WebSocket) -> None:
        if self.understanding is None:
            await websocket.close(1008, "no understanding model is configured")
            return

        async def make(grant: Grant) -> ChatSession:
            info = lambda: self.readiness.info("Understanding", self.config.model_wait_s)  # noqa: E731
            return ChatSession(websocket, self.config, self.understanding, info, self.metrics, grant.subprotocol)

        await self._serve_socket(websocket, ChatSession.endpoint, make)
