"""OpenAI's Videos API (`/v1/videos`) on our model: request fields, job objects, errors. No Ray, no HTTP server.

A create request carries OpenAI's fields (`prompt`, `model`, `seconds`,
`size`, `input_reference`) and ours (`seed`, `fps`, `num_frames`, `actions`,
and every other `session.start` field). It is validated by the same code as
a WebSocket `session.start`, so both paths accept the same fields with the
same messages; only the prefix differs ("Invalid video request:" for
"Invalid session.start:"). Errors have OpenAI's shape:
`{"error": {"message", "type", "param", "code"}}`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel

from deployments.contract import actions as held_keys
from deployments.contract import images
from deployments.contract.session_spec import SessionSpec
from deployments.protocol import video
from deployments.protocol.errors import (
    INVALID_REQUEST,
    MESSAGE_TOO_LARGE,
    OVER_CAPACITY,
    START_MESSAGE_MAX_BYTES,
    ProtocolError,
)
from deployments.protocol.jsonwire import loads, short

if TYPE_CHECKING:
    from deployments.jobs.records import JobPage, JobRecord

START_PREFIX = "Invalid session.start: "
REQUEST_PREFIX = "Invalid video request: "
LIST_DEFAULT_LIMIT = 20
LIST_MAX_LIMIT = 100
# An uploaded start image travels as a base64 data URL inside the request: 3/4 of the request limit.
IMAGE_MAX_BYTES = START_MESSAGE_MAX_BYTES * 3 // 4 - 1024
# Form values of these fields stay text; any other field's value is read as JSON when it parses ("5" -> 5).
TEXT_FIELDS = frozenset({"prompt", "model", "negative_prompt", "size", "seconds", "quality", "user", "format"})
_FIELDS = frozenset(video.SessionStartRequest.model_fields) | {"actions", "input_reference"}

INVALID_REQUEST_ERROR = "invalid_request_error"
SERVER_ERROR = "server_error"


# =====================================================================================
# Errors
# =====================================================================================
class ApiError(Exception):
    """An HTTP error with OpenAI's body; `retry_after_s` becomes a Retry-After header."""

    def __init__(
        self,
        status: int,
        message: str,
        type: str = INVALID_REQUEST_ERROR,
        param: str | None = None,
        code: str | None = None,
        retry_after_s: float | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code
        self.retry_after_s = retry_after_s

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def headers(self) -> dict[str, str]:
        if self.retry_after_s is None:
            return {}
        return {"Retry-After": str(max(1, round(self.retry_after_s)))}


def invalid(message: str, param: str | None = None, code: str = INVALID_REQUEST) -> ApiError:
    return ApiError(400, message, param=param, code=code)


def not_found(message: str, param: str | None = None) -> ApiError:
    return ApiError(404, message, param=param, code="not_found")


def over_capacity(message: str, retry_after_s: float) -> ApiError:
    return ApiError(503, message, type=SERVER_ERROR, code=OVER_CAPACITY, retry_after_s=retry_after_s)


def quota_exceeded(message: str, limit: str | None, retry_after_s: float | None = None) -> ApiError:
    """A per-key limit reached: 429 in OpenAI's shape (`insufficient_quota`), the code naming the limit."""
    return ApiError(429, message, type="insufficient_quota", code=f"{limit}_limit" if limit else "insufficient_quota",
                    retry_after_s=retry_after_s)


def from_protocol_error(exc: ProtocolError, image_field: str = "image_reference") -> ApiError:
    """A `session.start` validation error as an HTTP 400 (413 when too large), naming the field it is about."""
    if exc.code == MESSAGE_TOO_LARGE:
        return ApiError(413, f"The request is too large: at most {START_MESSAGE_MAX_BYTES} bytes, a start image included as base64",
                        code=MESSAGE_TOO_LARGE)
    message = exc.message
    details = message[len(START_PREFIX):] if message.startswith(START_PREFIX) else None
    param = None
    if details is not None:
        message = REQUEST_PREFIX + details
        match = re.match(r"[A-Za-z_]\w*", details)
        if match and match.group(0) in _FIELDS:
            param = match.group(0)
    elif exc.code == "model_mismatch":
        param = "model"
    if param == "image_reference":
        param = image_field
    return invalid(message, param=param, code=exc.code or INVALID_REQUEST)


# =====================================================================================
# Create: the body -> what to render
# =====================================================================================
def form_fields(items: Iterable[tuple[str, str]]) -> dict:
    """Form fields as the JSON body they stand for.

    OpenAI's SDK sends every create as multipart, flattening objects and lists
    one level with brackets (`input_reference[image_url]`, `actions[]`) and
    writing numbers as text: `seed=5` is read back as the number 5, and a
    nested value (an action script) may also be sent as one JSON text.
    """
    out: dict[str, Any] = {}
    for key, text in items:
        match = re.fullmatch(r"([^\[\]]+)(?:\[([^\[\]]*)\])?", key)
        if match is None:
            raise invalid(f"{REQUEST_PREFIX}form field {short(key, 64)!r} is nested more than one level; send it as JSON text", param=key)
        name, sub = match.group(1), match.group(2)
        value = text if name in TEXT_FIELDS else _json_or_text(text)
        if sub is None:
            out[name] = value
            continue
        holder = out.setdefault(name, [] if sub == "" else {})
        if sub == "" and isinstance(holder, list):
            holder.append(value)
        elif sub != "" and isinstance(holder, dict):
            holder[sub] = value
        else:
            raise invalid(f"{REQUEST_PREFIX}{name}: given in two shapes", param=name)
    return out


def _json_or_text(text: str) -> Any:
    try:
        return loads(text)
    except ValueError:
        return text


def image_data_url(data: bytes, content_type: str | None = None) -> str:
    """An uploaded image as the data URL `image_reference` takes; the type is read from the bytes first."""
    if len(data) > IMAGE_MAX_BYTES:
        raise ApiError(413, f"input_reference: the image is larger than {IMAGE_MAX_BYTES} bytes", param="input_reference",
                       code=MESSAGE_TOO_LARGE)
    mime = images.media_type(data)
    if mime is None and content_type in images.MEDIA_TYPES:
        mime = content_type  # let the decoder say what is wrong with it
    if mime is None:
        raise invalid(f"{REQUEST_PREFIX}input_reference: must be a PNG, JPEG or WebP image", param="input_reference")
    return images.data_url(data, mime)


@dataclass(frozen=True)
class VideoCreate:
    """A validated create request: what the session runs, and what the job object reports."""

    spec: SessionSpec
    model: str
    seconds: str
    size: str
    actions: tuple[tuple[str, ...], ...] | None = None


def remote_image_url(body: Any) -> str | None:
    """The http(s) start image a create body names, if any (fetched by the ingress under its policy)."""
    if not isinstance(body, dict):
        return None
    reference = body.get("input_reference", body.get("image_reference"))
    url = reference.get("image_url") if isinstance(reference, dict) else reference
    return url if isinstance(url, str) and url.lower().startswith(("http://", "https://")) else None


def parse_video_create(
    body: Any,
    defaults: video.GenerationDefaults,
    served_names: list[str],
    default_seconds: int,
    accepts_actions: bool = True,
    remote_image: bytes | None = None,
) -> VideoCreate:
    """Validate a create body (JSON, or form fields through `form_fields`); raises ApiError.

    An http(s) start image is fetched by the caller (`remote_image_url` says which) and passed as `remote_image`.
    """
    if not isinstance(body, dict):
        raise invalid("The request body must be a JSON object (or a form)")
    fields = {k: v for k, v in body.items() if k != "type"}
    image_field = "image_reference"
    reference = fields.pop("input_reference", None)
    if reference is not None:
        if "image_reference" in fields:
            raise invalid(f"{REQUEST_PREFIX}give input_reference or image_reference, not both", param="input_reference")
        fields["image_reference"] = {"image_url": reference} if isinstance(reference, str) else reference
        image_field = "input_reference"
    script = fields.pop("actions", None)
    try:
        start = video.parse_session_start(json.dumps({"type": "session.start", **fields}))
        video.check_model(start, served_names)
        if start.seconds is None and start.num_frames is None:
            start = start.model_copy(update={"seconds": str(default_seconds)})  # OpenAI's default length
        resolved = video.resolve_generation(start, defaults, remote_image)
    except ProtocolError as exc:
        raise from_protocol_error(exc, image_field) from None
    actions = None
    if script is not None:
        if not accepts_actions:
            raise invalid(f"{REQUEST_PREFIX}actions: this model has no camera adapter, so keyboard actions are not supported",
                          param="actions")
        actions = parse_action_script(script, defaults.frames_per_block, resolved.num_blocks)
    seconds = start.seconds if start.seconds is not None else f"{resolved.num_frames / resolved.fps:g}"
    return VideoCreate(
        spec=resolved,
        model=start.model or served_names[0],
        seconds=seconds,
        size=f"{resolved.width}x{resolved.height}",
        actions=actions,
    )


def parse_action_script(script: Any, frames_per_block: int, num_blocks: int) -> tuple[tuple[str, ...], ...]:
    """The job's `actions` (see `held_keys.parse_action_script`); raises ApiError."""
    try:
        return held_keys.parse_action_script(script, frames_per_block, num_blocks)
    except ValueError as exc:
        raise invalid(f"{REQUEST_PREFIX}{exc}", param="actions") from None


# =====================================================================================
# Remix
# =====================================================================================
def parse_remix(body: Any) -> str:
    """A remix body's prompt (the one field it takes); raises ApiError."""
    if not isinstance(body, dict):
        raise invalid("The request body must be a JSON object (or a form)")
    extra = sorted(set(body) - {"prompt"})
    if extra:
        raise invalid(f"{REQUEST_PREFIX}{extra[0]}: a remix takes only a prompt (it keeps every other setting of the video); "
                      "create a new video to change the rest", param=extra[0])
    prompt = body.get("prompt")
    if not isinstance(prompt, str) or not prompt.strip():
        raise invalid(f"{REQUEST_PREFIX}prompt: must be a non-blank string", param="prompt")
    return prompt


# =====================================================================================
# List query
# =====================================================================================
@dataclass(frozen=True)
class ListQuery:
    limit: int = LIST_DEFAULT_LIMIT
    after: str | None = None
    order: Literal["asc", "desc"] = "desc"


def parse_list_query(limit: str | None, after: str | None, order: str | None) -> ListQuery:
    if limit is None:
        count = LIST_DEFAULT_LIMIT
    else:
        try:
            count = int(limit)
        except ValueError:
            raise invalid(f"limit: must be an integer from 1 to {LIST_MAX_LIMIT}, got {short(limit, 32)!r}", param="limit") from None
        if not 1 <= count <= LIST_MAX_LIMIT:
            raise invalid(f"limit: must be an integer from 1 to {LIST_MAX_LIMIT}, got {count}", param="limit")
    order = order or "desc"
    if order not in ("asc", "desc"):
        raise invalid(f"order: must be 'asc' or 'desc', got {short(order, 32)!r}", param="order")
    return ListQuery(count, after or None, order)


# =====================================================================================
# Job objects
# =====================================================================================
class VideoError(BaseModel):
    code: str
    message: str


class VideoObject(BaseModel):
    """OpenAI's `Video`; `fps`, `num_frames` and `seed` are ours (additive)."""

    id: str
    object: Literal["video"] = "video"
    status: Literal["queued", "in_progress", "completed", "failed"]
    progress: int
    created_at: int
    completed_at: int | None = None
    expires_at: int | None = None
    model: str
    prompt: str
    seconds: str
    size: str
    error: VideoError | None = None
    remixed_from_video_id: str | None = None
    fps: int
    num_frames: int
    seed: int | None = None


def _stamp(t: float | None) -> int | None:
    return None if t is None else int(t)


def video_object(record: JobRecord) -> dict:
    error = None if record.error is None else VideoError(code=record.error.code, message=record.error.message)
    return VideoObject(
        id=record.id,
        status=record.status,
        progress=record.progress,
        created_at=int(record.created_at),
        completed_at=_stamp(record.completed_at),
        expires_at=_stamp(record.expires_at),
        model=record.model,
        prompt=record.prompt,
        seconds=record.seconds,
        size=record.size,
        error=error,
        fps=record.fps,
        num_frames=record.num_frames,
        seed=record.seed,
        remixed_from_video_id=record.remixed_from_video_id,
    ).model_dump(mode="json")


class VideoList(BaseModel):
    """A page of `GET /v1/videos`, as OpenAI's list objects are."""

    object: Literal["list"] = "list"
    data: list[VideoObject]
    first_id: str | None
    last_id: str | None
    has_more: bool


class VideoDeleted(BaseModel):
    id: str
    object: Literal["video.deleted"] = "video.deleted"
    deleted: bool = True


def video_list(page: JobPage) -> dict:
    data = [video_object(record) for record in page.data]
    first, last = (data[0]["id"], data[-1]["id"]) if data else (None, None)
    return VideoList(data=data, first_id=first, last_id=last, has_more=page.has_more).model_dump(mode="json")


def video_deleted(video_id: str) -> dict:
    return VideoDeleted(id=video_id).model_dump(mode="json")
