"""OpenAI's Videos API on the ingress: `/v1/videos` routes, validated here, run by the VideoJobs replica.

The routes are plain functions added to the ingress app by `install`. Each
gets a `VideosApi` over the ingress replica serving the request (Serve's
`servable_object`, the same object its class routes get as `self`); it needs
the replica's `config`, `world`, `jobs` (the VideoJobs handle; None when the
jobs API is off), `readiness` (ingress/readiness.py) and `check_http(request)`, the
API-key check every HTTP route passes first. They are not methods of the
ingress class on purpose: Serve binds `self` to a class's routes by rewriting
their signatures when the class is decorated, in the driver; a method defined
in another module reaches the replica by reference, without that rewrite, and
FastAPI then asks for `self` as a query parameter (422). Every failure is an
`ApiError`, answered in OpenAI's shape by the one handler `install` adds.
"""

# No `from __future__ import annotations` here: FastAPI must see the real `Request` class in the signatures.

import asyncio
import logging
import re

from fastapi import Depends, FastAPI, Request
from fastapi.exception_handlers import http_exception_handler
from fastapi.responses import JSONResponse, Response, StreamingResponse
from ray import serve
from ray.exceptions import RayActorError, RayTaskError
from ray.serve.exceptions import RayServeException
from starlette.datastructures import UploadFile
from starlette.exceptions import HTTPException as StarletteHTTPException

from deployments.ingress.image_fetch import FetchPolicy, fetch_image
from deployments.ingress.readiness import ModelNotReady
from deployments.jobs.content import DOWNLOADS, VIDEO
from deployments.jobs.records import COMPLETED, ID_PREFIX, JobRecord, JobsError, JobSpec
from deployments.protocol import videos
from deployments.protocol.errors import MESSAGE_TOO_LARGE, START_MESSAGE_MAX_BYTES, ProtocolError
from deployments.protocol.jsonwire import loads, short
from deployments.protocol.videos import ApiError
from deployments.world_model.requests import generation_defaults

logger = logging.getLogger("ray.serve")

_JOB_ID = re.compile(re.escape(ID_PREFIX) + r"[0-9a-f]{32}")
_FORMS = ("multipart/form-data", "application/x-www-form-urlencoded")
# What a failed job's error code means for a caller that waited on it (POST /v1/videos/sync).
_CLIENT_FAULTS = {"invalid_request", "interaction_failed"}
POLL_AFTER_MS = "500"  # hint for the SDK's create_and_poll (`openai-poll-after-ms`)


class VideosApi:
    """The ingress replica as the video routes see it: validation here, the rest asked of VideoJobs."""

    def __init__(self, ingress, key_id: str | None = None) -> None:
        self.ingress = ingress
        self.config = ingress.config
        self.key_id = key_id  # the caller's key (fingerprint): it sees and makes only its own jobs

    @property
    def jobs(self):
        if self.ingress.jobs is None:
            raise videos.not_found("The video jobs API is off on this server (set jobs_db_path to turn it on).")
        return self.ingress.jobs

    async def ask(self, method: str, *args):
        """One call to the VideoJobs replica on the caller's behalf (scoped to its key), its refusals as HTTP errors."""
        try:
            return await getattr(self.jobs, method).remote(*args, key_id=self.key_id)
        except JobsError as exc:  # Ray re-raises the replica's exception as a subclass of its type
            raise _from_jobs_error(exc) from None
        except (RayActorError, RayServeException) as exc:
            logger.warning("video jobs unavailable: %s", exc)
            raise videos.over_capacity("The video jobs service is restarting; try again shortly.", self.config.retry_after_s) from None
        except RayTaskError as exc:  # a bug or a failing disk in VideoJobs: still an OpenAI-shaped answer
            logger.error("video jobs %s failed: %s", method, exc)
            raise ApiError(500, "The video jobs service failed to answer", type=videos.SERVER_ERROR, code="internal_error") from None

    async def job_spec(self, request: Request) -> JobSpec:
        _ = self.jobs  # refuse before reading a body the server will not use
        body = await _read_body(request)
        try:
            info = await self.ingress.readiness.info("WorldModel", self.config.model_wait_s)
        except (RayActorError, RayServeException, ModelNotReady):
            raise videos.over_capacity("The video model is starting; try again shortly.", self.config.retry_after_s) from None
        remote_image = None
        if (url := videos.remote_image_url(body)) is not None:
            try:
                remote_image = await fetch_image(url, FetchPolicy.from_config(self.config))
            except ProtocolError as exc:
                raise videos.from_protocol_error(exc, "input_reference" if "input_reference" in body else "image_reference") from None
        # Off the event loop: a start image is decoded here.
        create = await asyncio.to_thread(
            videos.parse_video_create,
            body,
            generation_defaults(self.config, info),
            [self.config.model_name],
            self.config.jobs_default_seconds,
            info["accepts_camera"],
            remote_image,
        )
        spec = create.spec
        return JobSpec(spec, create.model, create.seconds, create.size, spec.num_frames, create.actions)

    async def content(self, video_id: str, variant: str = VIDEO.name, headers: dict | None = None) -> StreamingResponse:
        size = await self.ask("content_size", video_id, variant)
        chunks = self.jobs.options(stream=True).read_content.remote(video_id, variant, key_id=self.key_id)
        media_type = DOWNLOADS[variant].media_type
        return StreamingResponse(chunks, media_type=media_type, headers={"content-length": str(size), **(headers or {})})


def _api(request: Request) -> VideosApi:
    """The ingress replica serving this request, after its API-key and origin checks (the same as /v1/models)."""
    ingress = serve.get_replica_context().servable_object
    return VideosApi(ingress, ingress.check_http(request).key_id)


# -- routes ------------------------------------------------------------------------------
async def create_video(request: Request, api: VideosApi = Depends(_api)) -> JSONResponse:
    record = await api.ask("create", await api.job_spec(request))
    return JSONResponse(videos.video_object(record))


async def remix_video(video_id: str, request: Request, api: VideosApi = Depends(_api)) -> JSONResponse:
    _checked(video_id)
    prompt = videos.parse_remix(await _read_body(request))
    return JSONResponse(videos.video_object(await api.ask("remix", video_id, prompt)))


async def create_video_sync(request: Request, api: VideosApi = Depends(_api)) -> Response:
    """Render and answer with the MP4 itself; the job stays listed (its id is in `x-video-id`)."""
    record = await api.ask("create", await api.job_spec(request))
    try:
        record = await api.ask("wait", record.id, api.config.jobs_sync_timeout_s)
    except asyncio.CancelledError:
        # The caller went away: nobody will fetch this video, so free its slot.
        api.jobs.delete.remote(record.id, key_id=api.key_id)
        raise
    if record.status != COMPLETED:
        raise _unfinished(record)
    return await api.content(record.id, headers={"x-video-id": record.id})


async def list_videos(
    limit: str | None = None, after: str | None = None, order: str | None = None, api: VideosApi = Depends(_api)
) -> JSONResponse:
    query = videos.parse_list_query(limit, after, order)
    if query.after is not None and not _JOB_ID.fullmatch(query.after):
        raise videos.not_found(f"No video found with id '{query.after}'.", param="after")
    page = await api.ask("page", query.limit, query.after, query.order)
    return JSONResponse(videos.video_list(page))


async def retrieve_video(video_id: str, api: VideosApi = Depends(_api)) -> JSONResponse:
    record = await api.ask("get", _checked(video_id))
    headers = {} if record.finished else {"openai-poll-after-ms": POLL_AFTER_MS}
    return JSONResponse(videos.video_object(record), headers=headers)


async def delete_video(video_id: str, api: VideosApi = Depends(_api)) -> JSONResponse:
    await api.ask("delete", _checked(video_id))
    return JSONResponse(videos.video_deleted(video_id))


async def video_content(video_id: str, variant: str | None = None, api: VideosApi = Depends(_api)) -> Response:
    variant = variant or VIDEO.name
    if variant not in DOWNLOADS:
        raise videos.invalid(f"variant: must be one of {', '.join(DOWNLOADS)}, got {short(variant, 32)!r}", param="variant")
    return await api.content(_checked(video_id), variant)


ROUTES = (
    ("POST", "/v1/videos", create_video),
    ("POST", "/v1/videos/sync", create_video_sync),
    ("POST", "/v1/videos/{video_id}/remix", remix_video),
    ("GET", "/v1/videos", list_videos),
    ("GET", "/v1/videos/{video_id}", retrieve_video),
    ("DELETE", "/v1/videos/{video_id}", delete_video),
    ("GET", "/v1/videos/{video_id}/content", video_content),
)


def install(app: FastAPI) -> None:
    """Add the routes and the handlers that answer every video API error in OpenAI's error body."""
    for method, path, endpoint in ROUTES:
        app.add_api_route(path, endpoint, methods=[method])
    app.add_exception_handler(ApiError, _error_response)
    app.add_exception_handler(StarletteHTTPException, _unrouted)


async def _error_response(request: Request, exc: ApiError) -> JSONResponse:
    return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers())


async def _unrouted(request: Request, exc: StarletteHTTPException) -> Response:
    """An operation of OpenAI's API this server does not offer (edits, extensions, characters) is named as such."""
    if exc.status_code not in (404, 405) or "/v1/videos" not in request.url.path:
        return await http_exception_handler(request, exc)
    offered = ", ".join(sorted({f"{method} {path}" for method, path, _ in ROUTES}))
    message = f"{request.method} {request.url.path} is not an operation of this server's video API; it offers {offered}"
    return await _error_response(request, ApiError(exc.status_code, message, code="unsupported_operation"))


def _checked(video_id: str) -> str:
    if not _JOB_ID.fullmatch(video_id):
        raise videos.not_found(f"No video found with id '{video_id}'.", param="video_id")
    return video_id


def _from_jobs_error(exc: JobsError) -> ApiError:
    if exc.kind == JobsError.NOT_FOUND:
        return videos.not_found(exc.message, param=exc.param)
    if exc.kind == JobsError.QUEUE_FULL:
        return videos.over_capacity(exc.message, exc.retry_after_s)
    if exc.kind == JobsError.QUOTA:
        return videos.quota_exceeded(exc.message, exc.param, exc.retry_after_s)
    if exc.kind == JobsError.NOT_READY:
        return ApiError(409, exc.message, param=exc.param, code="video_not_ready")
    return ApiError(500, exc.message, type=videos.SERVER_ERROR, code=exc.kind)


def _unfinished(record: JobRecord) -> ApiError:
    """Why a synchronous render has no video to answer with."""
    if not record.finished:
        return ApiError(504, f"The video is still rendering; retrieve {record.id} later.", type=videos.SERVER_ERROR, code="timeout")
    error = record.error
    code = error.code if error is not None else "failed"
    message = error.message if error is not None else "The video failed"
    if code in _CLIENT_FAULTS:
        return videos.invalid(message, code=code)
    return ApiError(500, message, type=videos.SERVER_ERROR, code=code)


async def _read_body(request: Request) -> dict:
    """The create request's fields, from JSON or a form (where `input_reference` may be an image file)."""
    content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if content_type in _FORMS:
        try:
            form = await request.form()
        except Exception as exc:  # python-multipart raises several kinds on a malformed body
            raise videos.invalid(f"The form could not be read: {exc}") from None
        texts = []
        body_image = None
        for key, value in form.multi_items():
            if isinstance(value, UploadFile):
                if key != "input_reference":
                    raise videos.invalid(f"Only input_reference may be a file, not {key!r}", param=key)
                data = await value.read(videos.IMAGE_MAX_BYTES + 1)
                body_image = videos.image_data_url(data, value.content_type)
            else:
                texts.append((key, value))
        fields = videos.form_fields(texts)
        if body_image is not None:
            fields["input_reference"] = body_image
        return fields
    raw = await request.body()
    if len(raw) > START_MESSAGE_MAX_BYTES:
        raise ApiError(413, f"The request is too large: at most {START_MESSAGE_MAX_BYTES} bytes", code=MESSAGE_TOO_LARGE)
    try:
        return loads(raw)
    except ValueError:
        raise videos.invalid("The request body is not valid JSON") from None
