"""The messages of `WS /v1/realtime/video` (PROTOCOL.md section 1): parse, validate, resolve, build.

No Ray, no sockets, no torch. The ingress feeds raw frames in and gets typed
values (or a `ProtocolError` with the exact text clients match on) out:

    request = parse_session_start(raw)            # first message
    check_model(request, [served_name])
    start = resolve_generation(request, defaults) # sizes, frame count, start image
    send(video_start(request_id, start.config))
    message = parse_control_message(raw)          # every later message
"""

from __future__ import annotations

import base64
import binascii
import io
import math
import re
import uuid
from dataclasses import dataclass
from typing import Annotated, Any, Literal

import numpy as np
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    ValidationError,
    field_validator,
    model_validator,
)

from deployments.contract import timeline
from deployments.contract.events import CameraCommand, Interaction
from deployments.contract.actions import parse_action_script, parse_actions
from deployments.contract.session_spec import PacingSettings, SessionSpec
from deployments.protocol.errors import (
    CLOSE_POLICY,
    CLOSE_TOO_BIG,
    CONTROL_MESSAGE_MAX_BYTES,
    INVALID_JSON,
    INVALID_REQUEST,
    MESSAGE_TOO_LARGE,
    MODEL_MISMATCH,
    START_MESSAGE_MAX_BYTES,
    UNKNOWN_TYPE,
    ProtocolError,
)
from deployments.protocol import server_messages
from deployments.protocol.jsonwire import byte_length, loads, short

FORMAT = "m4s"
IMAGE_MAX_PIXELS = 4096 * 4096  # a start image larger than this is refused before it is decoded
EVENT_ID_MAX_CHARS = 256  # ids ride on every chunk's metadata
CAMERA_TRANSLATION_LIMIT = 1e6
ACTION_SCRIPT_EVENT_ID = "camera_action_script"  # how extra_params.camera_action_script's progress shows in chunk metadata


# =====================================================================================
# session.start
# =====================================================================================
def _bounds(value: float, ge: float | None, le: float | None, gt: float | None) -> None:
    if ge is not None and value < ge:
        raise ValueError(f"must be >= {ge:g}")
    if gt is not None and value <= gt:
        raise ValueError(f"must be > {gt:g}")
    if le is not None and value > le:
        raise ValueError(f"must be <= {le:g}")


def _integer(ge: float | None = None, le: float | None = None) -> BeforeValidator:
    """JSON integer; an integral float (2.0) counts, a bool or a string does not."""

    def check(value: Any) -> int | None:
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError("must be an integer")
        if isinstance(value, float):
            if not (math.isfinite(value) and value.is_integer()):
                raise ValueError("must be an integer")
            value = int(value)
        _bounds(value, ge, le, None)
        return value

    return BeforeValidator(check)


def _number(ge: float | None = None, le: float | None = None, gt: float | None = None) -> BeforeValidator:
    """Finite JSON number (int or float), never a bool or a string."""

    def check(value: Any) -> float | None:
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError("must be a number")
        value = float(value)
        if not math.isfinite(value):
            raise ValueError("must be a finite number")
        _bounds(value, ge, le, gt)
        return value

    return BeforeValidator(check)


def _text(non_blank: bool = False, nullable: bool = True) -> BeforeValidator:
    def check(value: Any) -> str | None:
        if value is None and nullable:
            return None
        if not isinstance(value, str):
            raise ValueError("must be a non-blank string" if non_blank else "must be a string")
        if non_blank and not value.strip():
            raise ValueError("must be a non-blank string")
        return value

    return BeforeValidator(check)


_SIZE = re.compile(r"^(\d{1,6})x(\d{1,6})$")
_SECONDS = re.compile(r"^[1-9]\d{0,8}$")


def _check_size(value: Any) -> str | None:
    if value is None:
        return None
    match = _SIZE.match(value) if isinstance(value, str) else None
    if match is None or int(match.group(1)) <= 0 or int(match.group(2)) <= 0:
        raise ValueError("must be 'WIDTHxHEIGHT' with positive integers, e.g. '832x480'")
    return value


def parse_size(size: str) -> tuple[int, int]:
    """'832x480' -> (width, height)."""
    match = _SIZE.match(size)
    if match is None:
        raise ValueError(f"size must be 'WIDTHxHEIGHT', got {size!r}")
    return int(match.group(1)), int(match.group(2))


def _check_seconds(value: Any) -> str | None:
    # OpenAI's video API sends seconds as a string ("4"); a plain positive integer is accepted too.
    if value is None:
        return None
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        value = str(value)
    if not isinstance(value, str) or not _SECONDS.match(value):
        raise ValueError('must be a positive integer string, e.g. "4"')
    return value


def _check_image_reference(value: Any) -> Any:
    if value is None:
        return None
    if not isinstance(value, dict):
        raise ValueError('must be an object {"image_url": "data:image/...;base64,..."}')
    if "file_id" in value:
        raise ValueError('file_id references are not supported; send {"image_url": "data:image/...;base64,..."}')
    return value


_DATA_URL = re.compile(r"^data:image/(png|jpeg|webp);base64,", re.IGNORECASE)
_WEB_URL = re.compile(r"^https?://", re.IGNORECASE)


class ImageReference(BaseModel):
    model_config = ConfigDict(extra="forbid")

    image_url: Annotated[str, _text(nullable=False)]

    @field_validator("image_url")
    @classmethod
    def _data_or_web_url(cls, value: str) -> str:
        # http(s) URLs pass here; the ingress fetches them only from allowed hosts (ingress/image_fetch.py).
        if not _DATA_URL.match(value) and not _WEB_URL.match(value):
            raise ValueError("must be a data:image/png, data:image/jpeg or data:image/webp base64 URL, or an http(s) URL")
        return value


class VideoParams(BaseModel):
    """vLLM-Omni's optional `video_params` block; its values fill top-level fields the client left unset."""

    model_config = ConfigDict(extra="forbid")

    width: Annotated[int | None, _integer(ge=1)] = None
    height: Annotated[int | None, _integer(ge=1)] = None
    fps: Annotated[int | None, _integer(ge=1)] = None
    num_frames: Annotated[int | None, _integer(ge=1)] = None


class SessionStartRequest(BaseModel):
    """A validated `session.start` (after the `sampling_params` merge); `type` and unset fields are not kept.

    Unknown top-level keys are refused, naming the key. The protocol already has
    two open-ended places for options it does not list (`sampling_params`, whose
    unknown keys land in `extra_params`, and `extra_params` itself), so a
    top-level key we do not know is almost always a typo ("promt",
    "num_inference_step") that would otherwise silently change nothing. `user`
    and `video_params`, fields of vLLM-Omni's request model that PROTOCOL.md
    does not list, are known here so that clients written for it still work.
    """

    model_config = ConfigDict(extra="forbid")

    prompt: Annotated[str, _text(non_blank=True, nullable=False)]
    model: Annotated[str | None, _text()] = None
    negative_prompt: Annotated[str | None, _text()] = None
    size: Annotated[str | None, BeforeValidator(_check_size)] = None
    width: Annotated[int | None, _integer(ge=1)] = None
    height: Annotated[int | None, _integer(ge=1)] = None
    fps: Annotated[int | None, _integer(ge=1, le=240)] = None
    num_frames: Annotated[int | None, _integer(ge=1)] = None
    seconds: Annotated[str | None, BeforeValidator(_check_seconds)] = None
    num_inference_steps: Annotated[int | None, _integer(ge=1, le=200)] = None
    guidance_scale: Annotated[float | None, _number(ge=0.0, le=20.0)] = None
    guidance_scale_2: Annotated[float | None, _number(ge=0.0, le=20.0)] = None
    true_cfg_scale: Annotated[float | None, _number(ge=0.0, le=20.0)] = None
    boundary_ratio: Annotated[float | None, _number(ge=0.0, le=1.0)] = None
    flow_shift: Annotated[float | None, _number(gt=0.0, le=100.0)] = None
    seed: Annotated[int | None, _integer(ge=0, le=2**63 - 1)] = None
    quality: Annotated[str | None, _text()] = None
    image_reference: Annotated[ImageReference | None, BeforeValidator(_check_image_reference)] = None
    lora: dict[str, Any] | None = None
    extra_params: dict[str, Any] | None = None
    sampling_params: dict[str, Any] | None = None
    format: Literal["m4s"] = FORMAT
    user: Annotated[str | None, _text()] = None
    video_params: VideoParams | None = None

    @model_validator(mode="after")
    def _size_agrees(self) -> "SessionStartRequest":
        if self.size is not None:
            width, height = parse_size(self.size)
            for name, given, implied in (("width", self.width, width), ("height", self.height, height)):
                if given is not None and given != implied:
                    raise ValueError(f"size {self.size!r} disagrees with {name} {given}")
        elif (self.width is None) != (self.height is None):
            raise ValueError("width and height must be given together (or use size)")
        return self

    def echo_config(self) -> dict:
        """The validated request for `video.start`'s `config`: only the fields the client set.

        A start image's base64 payload is elided (it can be megabytes); its
        media type and length stay.
        """
        out = self.model_dump(mode="json", exclude_unset=True)
        ref = out.get("image_reference")
        if isinstance(ref, dict) and isinstance(ref.get("image_url"), str) and _DATA_URL.match(ref["image_url"]):
            head, _, payload = ref["image_url"].partition(",")
            ref["image_url"] = f"{head},<{len(payload)} base64 characters elided>"
        return out


_REQUEST_FIELDS = frozenset(SessionStartRequest.model_fields)
_FILLABLE = _REQUEST_FIELDS - {"sampling_params", "video_params"}


def merge_start_fields(message: dict) -> dict:
    """The request fields of a `session.start`, with `sampling_params` and `video_params` folded in.

    A `sampling_params` key that is a request field fills that field when the
    top level did not set it (the top level wins otherwise); any other key goes
    to `extra_params`, where the top level's own `extra_params` keys win.
    `video_params` values fill `width`/`height`/`fps`/`num_frames` left unset.
    Values of the wrong type are left for validation to name.
    """
    data = {k: v for k, v in message.items() if k != "type"}
    sampling = data.get("sampling_params")
    if isinstance(sampling, dict):
        leftovers = {}
        for key, value in sampling.items():
            if key in _FILLABLE:
                data.setdefault(key, value)
            else:
                leftovers[key] = value
        if leftovers:
            base = data.get("extra_params")
            if base is None:
                data["extra_params"] = leftovers
            elif isinstance(base, dict):
                data["extra_params"] = {**leftovers, **base}
    video = data.get("video_params")
    if isinstance(video, dict):
        for key in ("width", "height", "fps", "num_frames"):
            if video.get(key) is not None and data.get(key) is None:
                data[key] = video[key]
    return data


def _describe(exc: ValidationError, limit: int = 5) -> str:
    """Pydantic's errors as one short line: `field: problem; field: problem`."""
    parts = []
    for err in exc.errors(include_url=False):
        loc = ".".join(str(p) for p in err["loc"])
        kind = err["type"]
        if kind == "missing":
            problem = "is required"
        elif kind == "extra_forbidden":
            problem = "unknown field"
            if len(err["loc"]) == 1:
                problem += " (put model-specific options in sampling_params or extra_params)"
        elif kind in ("dict_type", "model_type", "model_attributes_type"):
            problem = "must be an object"
        elif kind == "literal_error":
            problem = f"must be {err['ctx']['expected']}"
        elif kind in ("value_error", "assertion_error"):
            problem = str(err.get("ctx", {}).get("error", err["msg"]))
        else:
            msg = err["msg"]
            problem = msg[:1].lower() + msg[1:]
        parts.append(f"{loc}: {problem}" if loc else problem)
    if len(parts) > limit:
        parts = parts[:limit] + [f"and {len(parts) - limit} more"]
    return "; ".join(parts)


def invalid_start(details: str) -> ProtocolError:
    return ProtocolError(f"Invalid session.start: {details}", INVALID_REQUEST, close_code=CLOSE_POLICY)


def parse_session_start(raw: str | bytes) -> SessionStartRequest:
    """The first message of a session; every failure ends the session (`close_code` set)."""
    if byte_length(raw) > START_MESSAGE_MAX_BYTES:
        raise ProtocolError("session.start message too large", MESSAGE_TOO_LARGE, close_code=CLOSE_TOO_BIG)
    try:
        message = loads(raw)
    except ValueError:
        raise ProtocolError("Invalid JSON in session.start", INVALID_JSON, close_code=CLOSE_POLICY) from None
    if not isinstance(message, dict):
        raise ProtocolError("session.start must be a JSON object", INVALID_REQUEST, close_code=CLOSE_POLICY)
    if message.get("type") != "session.start":
        raise ProtocolError(f"Expected session.start, got: {short(message.get('type'))}", INVALID_REQUEST, close_code=CLOSE_POLICY)
    data = merge_start_fields(message)
    if "format" in data and data["format"] != FORMAT:
        raise ProtocolError("Invalid session.start format: expected 'm4s'.", INVALID_REQUEST, close_code=CLOSE_POLICY)
    try:
        return SessionStartRequest.model_validate(data)
    except ValidationError as exc:
        raise invalid_start(_describe(exc)) from None


def check_model(request: SessionStartRequest, served_names: list[str]) -> None:
    """Refuse a `model` the server does not serve; absent or "" means the served one."""
    if not request.model or not served_names or request.model in served_names:
        return
    raise ProtocolError(
        f"Model mismatch: request specifies '{request.model}' but server is running '{served_names[0]}'.",
        MODEL_MISMATCH,
        close_code=CLOSE_POLICY,
    )


# =====================================================================================
# session.start -> what the engine runs
# =====================================================================================
@dataclass(frozen=True)
class GenerationDefaults:
    """What the served model does when a client does not ask, and what it can do at all."""

    width: int
    height: int
    fps: int = 24  # PROTOCOL: 24 where the model has none
    num_inference_steps: int | None = None  # None: the checkpoint's own schedule
    flow_shift: float | None = None  # None: the checkpoint's scheduler config
    frames_per_block: int = 3  # latent frames per block
    temporal_factor: int = 4  # VAE temporal compression
    size_multiple: int = 16  # VAE stride x patch size
    max_session_seconds: float | None = None  # longest num_frames / fps a client may ask for
    max_dimension: int | None = 4096
    # A distilled causal model runs without classifier-free guidance: a scale above this cannot be honoured.
    max_guidance_scale: float = 1.0
    image_conditioned: bool | None = None  # True: image-to-video (start image required); None: not checked
    max_image_pixels: int = IMAGE_MAX_PIXELS
    accepts_camera: bool | None = None  # False: keys and camera refused (a model without a camera adapter); None: not checked

    def frames_for_blocks(self, blocks: int) -> int:
        return timeline.frames_for_blocks(blocks, self.frames_per_block, self.temporal_factor)

    def blocks_for_frames(self, num_frames: int) -> int:
        return timeline.blocks_for_frames(num_frames, self.frames_per_block, self.temporal_factor)


def resolve_generation(request: SessionStartRequest, defaults: GenerationDefaults, remote_image: bytes | None = None) -> SessionSpec:
    """Apply the defaults, check what the model can honour, round the length to whole blocks, decode the start image.

    An http(s) `image_reference` is fetched by the caller (which owns the network policy) and passed as `remote_image`.
    """
    problems: list[str] = []
    fps = request.fps if request.fps is not None else defaults.fps

    if request.size is not None:
        width, height = parse_size(request.size)
        names = ("size", "size")
    elif request.width is not None:
        width, height = request.width, request.height
        names = ("width", "height")
    else:
        width, height = defaults.width, defaults.height
        names = ("width", "height")
    m = defaults.size_multiple
    for name, axis, value in ((names[0], "width", width), (names[1], "height", height)):
        label = name if name == axis else f"{name} ({axis} {value})"
        if value <= 0 or value % m:
            problems.append(f"{label}: must be a positive multiple of {m}, got {value}")
        elif defaults.max_dimension is not None and value > defaults.max_dimension:
            problems.append(f"{label}: must be at most {defaults.max_dimension}, got {value}")

    num_frames = num_blocks = None
    if request.num_frames is not None:
        asked, source = request.num_frames, "num_frames"
    elif request.seconds is not None:
        asked, source = int(request.seconds) * fps, "seconds"
    else:
        asked = source = None
    if asked is not None:
        num_blocks = defaults.blocks_for_frames(asked)
        num_frames = defaults.frames_for_blocks(num_blocks)
        limit = defaults.max_session_seconds
        if limit is not None and num_frames > limit * fps:
            problems.append(f"{source}: {num_frames} frames at {fps} fps is longer than this server's limit of {limit:g} s per session")

    for name in ("guidance_scale", "guidance_scale_2", "true_cfg_scale"):
        value = getattr(request, name)
        if value is not None and value > defaults.max_guidance_scale:
            why = "this model is distilled and runs without classifier-free guidance" if defaults.max_guidance_scale <= 1.0 else "this model's limit"
            problems.append(f"{name}: must be <= {defaults.max_guidance_scale:g} ({why}), got {value:g}")
    if request.lora:
        problems.append("lora: per-request LoRA adapters are not supported by this server")
    extra = request.extra_params or {}
    codec_options: tuple[tuple[str, str], ...] = ()
    action_script = pacing = None
    try:
        codec_options = parse_codec_options(extra.get("video_codec_options"))
    except ValueError as exc:
        problems.append(f"extra_params.{exc}")
    try:
        pacing = parse_pacing(extra)
    except ValueError as exc:
        problems.append(f"extra_params.{exc}")
    if extra.get("camera_action_script") is not None:
        if defaults.accepts_camera is False:
            problems.append("extra_params.camera_action_script: this model has no camera adapter, so keyboard actions are not supported")
        else:
            try:
                action_script = parse_action_script(extra["camera_action_script"], defaults.frames_per_block, num_blocks,
                                                    name="camera_action_script")
            except ValueError as exc:
                problems.append(f"extra_params.{exc}")

    if problems:
        raise invalid_start("; ".join(problems))

    image = None
    if request.image_reference is not None:
        url = request.image_reference.image_url
        if _WEB_URL.match(url):
            if remote_image is None:
                raise invalid_start("image_reference.image_url: remote URLs are not fetched here; send a data:image/...;base64 URL")
            image = decode_image_bytes(remote_image, defaults.max_image_pixels)
        else:
            image = decode_image_data_url(url, defaults.max_image_pixels)
    if defaults.image_conditioned is True and image is None:
        raise invalid_start("image_reference: this model is image-to-video and needs a start image")
    if defaults.image_conditioned is False and image is not None:
        raise invalid_start("image_reference: this model is text-to-video and takes no start image")

    config = request.echo_config()
    if "num_frames" in config:
        config["num_frames"] = num_frames
    return SessionSpec(
        prompt=request.prompt,
        width=width,
        height=height,
        fps=fps,
        seed=request.seed,
        num_inference_steps=request.num_inference_steps if request.num_inference_steps is not None else defaults.num_inference_steps,
        flow_shift=request.flow_shift if request.flow_shift is not None else defaults.flow_shift,
        num_frames=num_frames,
        num_blocks=num_blocks,
        image=image,
        pacing=pacing,
        negative_prompt=request.negative_prompt,
        config=config,
        codec_options=codec_options,
        # Submitted before block 0, so the script plays from the first frame.
        interactions=() if action_script is None else (Interaction(event_id=ACTION_SCRIPT_EVENT_ID, actions=action_script),),
    )


def parse_pacing(extra: dict[str, Any]) -> PacingSettings | None:
    """`extra_params.pace_to_media_time` and its two settings: None unless it is true; ValueError names a bad value."""
    enabled = extra.get("pace_to_media_time", False)
    if not isinstance(enabled, bool):
        raise ValueError("pace_to_media_time must be true or false")
    if not enabled:
        return None
    lead = extra.get("pacing_lead_seconds", 0.0)
    if isinstance(lead, bool) or not isinstance(lead, (int, float)) or not math.isfinite(lead) or lead < 0:
        raise ValueError("pacing_lead_seconds must be a finite number >= 0")
    lag = extra.get("pacing_max_lag_seconds", 5.0)
    if lag is not None and (isinstance(lag, bool) or not isinstance(lag, (int, float)) or not math.isfinite(lag) or lag <= 0):
        raise ValueError("pacing_max_lag_seconds must be a finite number > 0, or null")
    return PacingSettings(float(lead), None if lag is None else float(lag))


def decode_image_data_url(url: str, max_pixels: int = IMAGE_MAX_PIXELS) -> np.ndarray:
    """`data:image/png|jpeg|webp;base64,...` -> uint8 (H, W, 3); the size is checked from the header before decoding."""
    match = _DATA_URL.match(url)
    if match is None:
        raise invalid_start("image_reference.image_url: must be a data:image/png, data:image/jpeg or data:image/webp base64 URL")
    try:
        data = base64.b64decode(url[match.end():], validate=True)
    except (binascii.Error, ValueError):
        raise invalid_start("image_reference.image_url: the base64 payload is not valid") from None
    return decode_image_bytes(data, max_pixels)


def decode_image_bytes(data: bytes, max_pixels: int = IMAGE_MAX_PIXELS) -> np.ndarray:
    """PNG, JPEG or WebP bytes -> uint8 (H, W, 3); the size is checked from the header before decoding."""
    from PIL import Image, ImageOps

    try:
        with Image.open(io.BytesIO(data), formats=("PNG", "JPEG", "WEBP")) as img:
            width, height = img.size
            if width * height > max_pixels:
                raise invalid_start(f"image_reference: the image is {width}x{height}, more than the limit of {max_pixels} pixels")
            img.load()
            rgb = ImageOps.exif_transpose(img).convert("RGB")
            return np.array(rgb, dtype=np.uint8)
    except ProtocolError:
        raise
    except Image.DecompressionBombError:
        raise invalid_start(f"image_reference: the image is more than the limit of {max_pixels} pixels") from None
    except Exception:  # Pillow raises many kinds on corrupt input
        raise invalid_start("image_reference: not a decodable PNG, JPEG or WebP image") from None


# =====================================================================================
# Control messages (after session.start): a bad one gets an error, the session goes on
# =====================================================================================
@dataclass(frozen=True)
class InteractionMessage:
    event_id: str
    interaction: Interaction
    generated_event_id: bool = False  # the client sent none: a fresh uuid4 hex


@dataclass(frozen=True)
class StopMessage:
    pass


@dataclass(frozen=True)
class PingMessage:
    pass


@dataclass(frozen=True)
class PlaybackMessage:
    position_seconds: float


ControlMessage = InteractionMessage | StopMessage | PingMessage | PlaybackMessage


def parse_control_message(raw: str | bytes) -> ControlMessage:
    """One message after `session.start`; raises ProtocolError (never session-ending) with the text to send."""
    if byte_length(raw) > CONTROL_MESSAGE_MAX_BYTES:
        raise ProtocolError("control message too large", MESSAGE_TOO_LARGE)
    try:
        message = loads(raw)
    except ValueError:
        raise ProtocolError("Invalid JSON message", INVALID_JSON) from None
    if not isinstance(message, dict):
        raise ProtocolError("WebSocket messages must be JSON objects", INVALID_REQUEST)
    kind = message.get("type")
    if kind == "session.interaction":
        return parse_interaction(message)
    if kind == "session.stop":
        return StopMessage()
    if kind == "session.ping":
        return PingMessage()
    if kind == "session.playback":
        position = message.get("position_seconds")
        if isinstance(position, bool) or not isinstance(position, (int, float)) or not math.isfinite(position) or position < 0:
            raise ProtocolError("session.playback position_seconds must be a finite number >= 0", INVALID_REQUEST)
        return PlaybackMessage(float(position))
    raise ProtocolError(f"Unknown message type: {short(kind)}", UNKNOWN_TYPE)


def parse_interaction(message: dict) -> InteractionMessage:
    """A `session.interaction` message, converted to the engine's `Interaction`."""
    body = message.get("interaction")
    if not isinstance(body, dict):
        raise ProtocolError("session.interaction requires an interaction object", INVALID_REQUEST)
    event_id = body.get("event_id")
    generated = event_id is None
    if generated:
        event_id = uuid.uuid4().hex
    elif not isinstance(event_id, str) or not event_id:
        raise ProtocolError("session.interaction event_id must be a non-empty string", INVALID_REQUEST)
    elif len(event_id) > EVENT_ID_MAX_CHARS:
        raise ProtocolError(f"session.interaction event_id must be at most {EVENT_ID_MAX_CHARS} characters", INVALID_REQUEST)

    def refuse(text: str) -> ProtocolError:
        return ProtocolError(text, INVALID_REQUEST, event_id=None if generated else event_id)

    event = body.get("event")
    if not isinstance(event, dict):
        raise refuse("session.interaction requires event object")
    if event.get("negative_prompt") is not None:
        raise refuse("session.interaction negative_prompt is not supported in this release")
    chunks = body.get("transition_chunks")
    if chunks is None:
        chunks = 0
    elif isinstance(chunks, bool) or not isinstance(chunks, (int, float)) or (isinstance(chunks, float) and not chunks.is_integer()):
        raise refuse("session.interaction transition_chunks must be an integer")
    chunks = int(chunks)
    if chunks < 0:
        raise refuse("session.interaction transition_chunks must be >= 0")

    prompt = event.get("prompt")
    if prompt is not None and (not isinstance(prompt, str) or not prompt.strip()):
        raise refuse("session.interaction requires a non-empty event.prompt")
    camera = actions = None
    media = event.get("multi_modal_data")
    if media is not None:
        if not isinstance(media, dict):
            raise refuse("session.interaction event.multi_modal_data must be an object")
        unknown = sorted(set(media) - {"camera", "actions"})
        if unknown:
            raise refuse(f"session.interaction multi_modal_data.{short(unknown[0], 64)} is not supported (camera and actions are)")
        try:
            if media.get("camera") is not None:
                camera = parse_camera(media["camera"])
            if media.get("actions") is not None:
                actions = parse_actions(media["actions"])
        except ValueError as exc:
            raise refuse(f"session.interaction {exc}") from None
    if prompt is None and camera is None and actions is None:
        raise refuse("session.interaction event needs a non-empty prompt or multi_modal_data (camera or actions)")
    interaction = Interaction(event_id=event_id, prompt=prompt, camera=camera, actions=actions, transition_chunks=chunks)
    return InteractionMessage(event_id=event_id, interaction=interaction, generated_event_id=generated)


def _vector(value: Any, n: int, name: str, shape: str) -> tuple[float, ...]:
    if (
        not isinstance(value, list)
        or len(value) != n
        or any(isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x) for x in value)
    ):
        raise ValueError(f"camera {name} must be a list of {n} finite numbers {shape}")
    return tuple(float(x) for x in value)


def parse_camera(payload: Any) -> CameraCommand:
    """`{"mode": "target"|"velocity", "data": {"translation": [x, y, z], "rotation": [x, y, z, w]}}`; missing parts are identity."""
    if not isinstance(payload, dict):
        raise ValueError("camera must be an object with mode and data")
    mode = payload.get("mode")
    if not isinstance(mode, str) or mode not in ("target", "velocity"):
        raise ValueError("camera mode must be 'target' or 'velocity'")
    data = payload.get("data")
    if not isinstance(data, dict):
        raise ValueError("camera data must be an object with translation and rotation")
    translation = _vector(data.get("translation", [0.0, 0.0, 0.0]), 3, "translation", "[x, y, z]")
    if any(abs(x) > CAMERA_TRANSLATION_LIMIT for x in translation):
        raise ValueError(f"camera translation values must be within +-{CAMERA_TRANSLATION_LIMIT:g}")
    rotation = _vector(data.get("rotation", [0.0, 0.0, 0.0, 1.0]), 4, "rotation", "[x, y, z, w]")
    norm = math.sqrt(sum(x * x for x in rotation))
    if not math.isfinite(norm) or norm < 1e-12:
        raise ValueError("camera rotation must be a non-zero quaternion")
    return CameraCommand(mode=mode, translation=translation, rotation=rotation)


# x264 options a client may set per session (`extra_params.video_codec_options`) and what each takes. Nothing
# that adds latency or breaks the stream's shape: `tune` stays zerolatency and B-frames stay off.
CODEC_OPTIONS: dict[str, tuple[str, ...] | tuple[int, int]] = {
    "crf": (0, 51),
    "g": (1, 600),  # keyframe interval, in frames
    "preset": ("ultrafast", "superfast", "veryfast", "faster", "fast", "medium"),
    "profile": ("baseline", "main", "high"),
}


def parse_codec_options(options: Any) -> tuple[tuple[str, str], ...]:
    """`video_codec_options` -> (name, value) pairs for the encoder; raises ValueError naming what was refused."""
    if options is None:
        return ()
    if not isinstance(options, dict):
        raise ValueError("video_codec_options: must be an object of x264 options")
    allowed = ", ".join(CODEC_OPTIONS)
    out = []
    for key, value in options.items():
        if key not in CODEC_OPTIONS:
            raise ValueError(f"video_codec_options: {short(repr(key), 40)} is not an option this server lets a session set; allowed: {allowed}")
        choices = CODEC_OPTIONS[key]
        if isinstance(choices[0], int):
            low, high = choices
            number = value if isinstance(value, int) and not isinstance(value, bool) else (int(value) if isinstance(value, str) and value.isdigit() else None)
            if number is None or not low <= number <= high:
                raise ValueError(f"video_codec_options.{key}: must be an integer from {low} to {high}, got {short(repr(value), 40)}")
            out.append((key, str(number)))
        else:
            if value not in choices:
                raise ValueError(f"video_codec_options.{key}: must be one of {', '.join(choices)}, got {short(repr(value), 40)}")
            out.append((key, value))
    return tuple(out)


# =====================================================================================
# Server -> client
# =====================================================================================
def new_request_id() -> str:
    return "video_stream-" + uuid.uuid4().hex


def video_start(request_id: str, config: dict, format: str = FORMAT, **extra: Any) -> dict:
    return server_messages.VideoStart(request_id=request_id, format=format, config=config, **extra).wire()


def chunk_metadata(
    request_id: str,
    kind: Literal["media", "trailer"],
    num_frames: int,
    byte_length: int,
    transport_chunk_index: int,
    generation_chunk_index: int | None,
    started: tuple[str, ...] | list[str] = (),
    active: tuple[str, ...] | list[str] = (),
    completed: tuple[str, ...] | list[str] = (),
    **extra: Any,
) -> dict:
    """Sent right before each binary frame; a trailer has no generation chunk index. `extra`: additive fields."""
    return server_messages.ChunkMetadata(
        request_id=request_id,
        kind=kind,
        num_frames=num_frames,
        byte_length=byte_length,
        transport_chunk_index=transport_chunk_index,
        generation_chunk_index=generation_chunk_index if kind == "media" else None,
        started_event_ids=list(started),
        active_event_ids=list(active),
        completed_event_ids=list(completed),
        **extra,
    ).wire()


def interaction_queued(request_id: str, event_id: str) -> dict:
    return server_messages.InteractionQueued(request_id=request_id, event_id=event_id).wire()


def session_done(request_id: str, chunks: int, stopped: bool) -> dict:
    return server_messages.VideoSessionDone(request_id=request_id, chunks=chunks, stopped=stopped).wire()


def pong() -> dict:
    return server_messages.VideoPong().wire()
