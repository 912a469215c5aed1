"""The `/v1/realtime/video` protocol layer on its own: no Ray, no sockets, no torch."""

from __future__ import annotations

import base64
import io
import json
import struct
import zlib

import numpy as np
import pytest
from PIL import Image

from deployments.contract.events import CameraCommand, Interaction
from deployments.contract.session_spec import PacingSettings
from deployments.protocol.errors import (
    CONTROL_MESSAGE_MAX_BYTES,
    STALL_TIMEOUT_S,
    START_MESSAGE_MAX_BYTES,
    START_TIMEOUT_S,
    ProtocolError,
    error_message,
    event_id_conflict,
    interaction_failed,
    over_capacity,
    stall_timeout,
    start_timeout,
)
from deployments.protocol.video import (
    ACTION_SCRIPT_EVENT_ID,
    GenerationDefaults,
    InteractionMessage,
    PingMessage,
    PlaybackMessage,
    StopMessage,
    check_model,
    chunk_metadata,
    decode_image_data_url,
    interaction_queued,
    new_request_id,
    parse_control_message,
    parse_pacing,
    parse_session_start,
    pong,
    resolve_generation,
    session_done,
    video_start,
)

DEFAULTS = GenerationDefaults(width=64, height=48, fps=16, max_session_seconds=3600)


def start(**fields) -> str:
    return json.dumps({"type": "session.start", "prompt": "a forest", **fields})


def start_error(raw) -> ProtocolError:
    with pytest.raises(ProtocolError) as info:
        parse_session_start(raw)
    return info.value


def resolve(**fields):
    return resolve_generation(parse_session_start(start(**fields)), DEFAULTS)


def resolve_error(defaults: GenerationDefaults = DEFAULTS, **fields) -> ProtocolError:
    request = parse_session_start(start(**fields))
    with pytest.raises(ProtocolError) as info:
        resolve_generation(request, defaults)
    return info.value


def control_error(raw) -> ProtocolError:
    with pytest.raises(ProtocolError) as info:
        parse_control_message(raw if isinstance(raw, (str, bytes)) else json.dumps(raw))
    return info.value


def interaction(body: dict) -> str:
    return json.dumps({"type": "session.interaction", "interaction": body})


def png_bytes(width: int = 6, height: int = 4, color=(200, 30, 10)) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (width, height), color).save(buf, format="PNG")
    return buf.getvalue()


def data_url(data: bytes, mime: str = "image/png") -> str:
    return f"data:{mime};base64," + base64.b64encode(data).decode()


def png_with_declared_size(width: int, height: int) -> bytes:
    """A tiny PNG whose header claims `width` x `height` (a decompression bomb's calling card)."""
    data = bytearray(png_bytes())
    ihdr = data.index(b"IHDR")
    data[ihdr + 4 : ihdr + 12] = struct.pack(">II", width, height)
    crc = zlib.crc32(bytes(data[ihdr : ihdr + 17]))
    data[ihdr + 17 : ihdr + 21] = struct.pack(">I", crc)
    return bytes(data)


# =====================================================================================
# errors.py
# =====================================================================================
def test_limits_are_the_protocols():
    assert START_MESSAGE_MAX_BYTES == 4 * 1024 * 1024
    assert CONTROL_MESSAGE_MAX_BYTES == 128 * 1024
    assert (START_TIMEOUT_S, STALL_TIMEOUT_S) == (10.0, 60.0)


def test_error_message_has_keys_only_when_known():
    assert error_message("boom") == {"type": "error", "message": "boom"}
    assert error_message("boom", "internal_error", request_id="r", event_id="e", retry_after_s=2.0, absent=None) == {
        "type": "error",
        "message": "boom",
        "code": "internal_error",
        "request_id": "r",
        "event_id": "e",
        "retry_after_s": 2.0,
    }


def test_fixed_session_errors():
    assert start_timeout().to_message() == {"type": "error", "message": "Timeout waiting for session.start", "code": "timeout"}
    assert stall_timeout().message == "Stall timeout: no generation progress"
    assert stall_timeout().ends_session
    conflict = event_id_conflict("e1")
    assert conflict.to_message("r1") == {
        "type": "error",
        "message": "event_id_conflict",
        "code": "event_id_conflict",
        "request_id": "r1",
        "event_id": "e1",
    }
    assert not conflict.ends_session
    failed = interaction_failed("e2")
    assert (failed.message, failed.code, failed.event_id, failed.close_code) == ("Failed to apply interaction", "interaction_failed", "e2", None)
    busy = over_capacity(5.0)
    assert busy.close_code == 1013 and busy.to_message()["retry_after_s"] == 5.0 and busy.code == "over_capacity"


# =====================================================================================
# session.start: fixed texts
# =====================================================================================
@pytest.mark.parametrize(
    ("raw", "message", "code", "close"),
    [
        ("x" * (START_MESSAGE_MAX_BYTES + 1), "session.start message too large", "message_too_large", 1009),
        (b"x" * (START_MESSAGE_MAX_BYTES + 1), "session.start message too large", "message_too_large", 1009),
        # counted in bytes: 2 Mi two-byte characters are 4 MiB + 2 bytes
        ('"' + "é" * (2 * 1024 * 1024) + '"', "session.start message too large", "message_too_large", 1009),
        ("{not json", "Invalid JSON in session.start", "invalid_json", 1008),
        ('{"type": "session.start", "prompt": "a", "seed": NaN}', "Invalid JSON in session.start", "invalid_json", 1008),
        (b"\xff\xfe{", "Invalid JSON in session.start", "invalid_json", 1008),
        ("[" * 100_000 + "]" * 100_000, "Invalid JSON in session.start", "invalid_json", 1008),
        ("[1, 2]", "session.start must be a JSON object", "invalid_request", 1008),
        ('"session.start"', "session.start must be a JSON object", "invalid_request", 1008),
        ('{"type": "session.ping"}', "Expected session.start, got: session.ping", "invalid_request", 1008),
        ('{"prompt": "a"}', "Expected session.start, got: None", "invalid_request", 1008),
        (start(format="mp4"), "Invalid session.start format: expected 'm4s'.", "invalid_request", 1008),
        (start(format=None), "Invalid session.start format: expected 'm4s'.", "invalid_request", 1008),
    ],
)
def test_start_fixed_errors(raw, message, code, close):
    err = start_error(raw)
    assert (err.message, err.code, err.close_code) == (message, code, close)


def test_start_at_the_size_limit_is_parsed():
    raw = start(extra_params={"pad": ""})
    raw = raw.replace('"pad": ""', '"pad": "' + "x" * (START_MESSAGE_MAX_BYTES - len(raw)) + '"')
    assert len(raw) == START_MESSAGE_MAX_BYTES
    assert parse_session_start(raw).extra_params["pad"].startswith("x")


@pytest.mark.parametrize(
    ("fields", "details"),
    [
        ({"prompt": "   "}, "prompt: must be a non-blank string"),
        ({"prompt": None}, "prompt: must be a non-blank string"),
        ({"prompt": 5}, "prompt: must be a non-blank string"),
        ({"promt": "typo"}, "promt: unknown field"),
        ({"width": True, "height": 48}, "width: must be an integer"),
        ({"width": "64", "height": 48}, "width: must be an integer"),
        ({"width": 64.5, "height": 48}, "width: must be an integer"),
        ({"width": 0, "height": 48}, "width: must be >= 1"),
        ({"width": 64}, "width and height must be given together"),
        ({"fps": False}, "fps: must be an integer"),
        ({"fps": 0}, "fps: must be >= 1"),
        ({"num_frames": -3}, "num_frames: must be >= 1"),
        ({"seconds": "0"}, "seconds: must be a positive integer string"),
        ({"seconds": "2.5"}, "seconds: must be a positive integer string"),
        ({"seconds": True}, "seconds: must be a positive integer string"),
        ({"num_inference_steps": 0}, "num_inference_steps: must be >= 1"),
        ({"guidance_scale": "1"}, "guidance_scale: must be a number"),
        ({"guidance_scale": True}, "guidance_scale: must be a number"),
        ({"guidance_scale": -1}, "guidance_scale: must be >= 0"),
        ({"boundary_ratio": 1.5}, "boundary_ratio: must be <= 1"),
        ({"flow_shift": 0}, "flow_shift: must be > 0"),
        ({"seed": -1}, "seed: must be >= 0"),
        ({"seed": 1.5}, "seed: must be an integer"),
        ({"size": "64*48"}, "size: must be 'WIDTHxHEIGHT'"),
        ({"size": "0x48"}, "size: must be 'WIDTHxHEIGHT'"),
        ({"size": "64x48", "width": 32}, "size '64x48' disagrees with width 32"),
        ({"size": "64x48", "height": 32}, "size '64x48' disagrees with height 32"),
        ({"negative_prompt": 3}, "negative_prompt: must be a string"),
        ({"extra_params": [1]}, "extra_params: must be an object"),
        ({"sampling_params": "x"}, "sampling_params: must be an object"),
        ({"lora": 3}, "lora: must be an object"),
        ({"image_reference": "data:image/png;base64,AAAA"}, "image_reference: must be an object"),
        ({"image_reference": {"file_id": "f"}}, "image_reference: file_id references are not supported"),
        ({"image_reference": {"image_url": "file:///etc/passwd"}}, "image_reference.image_url: must be a data:image/png"),
        ({"image_reference": {"image_url": "data:image/gif;base64,AAAA"}}, "image_reference.image_url: must be a data:image/png"),
        ({"image_reference": {"image_url": "data:image/png;base64,AAAA", "detail": 1}}, "image_reference.detail: unknown field"),
        ({"sampling_params": {"seed": "x"}}, "seed: must be an integer"),
    ],
)
def test_start_validation_names_the_field(fields, details):
    err = start_error(start(**fields))
    assert err.message.startswith("Invalid session.start: ")
    assert details in err.message
    assert "\n" not in err.message
    assert (err.code, err.close_code) == ("invalid_request", 1008)


def test_json_numbers_that_overflow_to_infinity_are_refused():
    err = start_error('{"type": "session.start", "prompt": "a", "guidance_scale": 1e400}')
    assert err.message == "Invalid session.start: guidance_scale: must be a finite number"


def test_start_validation_lists_several_problems_on_one_line():
    err = start_error(start(width=True, height=48, fps=0))
    assert err.message == "Invalid session.start: width: must be an integer; fps: must be >= 1"


def test_missing_prompt():
    assert start_error('{"type": "session.start"}').message == "Invalid session.start: prompt: is required"


def test_minimal_start_and_the_echo_of_set_fields_only():
    request = parse_session_start(start())
    assert request.prompt == "a forest" and request.format == "m4s"
    assert request.echo_config() == {"prompt": "a forest"}
    request = parse_session_start(start(format="m4s", seed=7, negative_prompt="blur", guidance_scale=1))
    assert request.echo_config() == {"prompt": "a forest", "format": "m4s", "seed": 7, "negative_prompt": "blur", "guidance_scale": 1.0}


def test_start_accepts_bytes_and_integral_floats():
    request = parse_session_start(start(width=64.0, height=48, seed=3.0).encode())
    assert (request.width, request.seed) == (64, 3)
    assert isinstance(request.width, int)


def test_sampling_params_fill_unset_fields_and_the_rest_goes_to_extra_params():
    request = parse_session_start(
        start(
            seed=1,
            extra_params={"pace_to_media_time": True, "shared": "top"},
            sampling_params={"seed": 2, "num_inference_steps": 3, "fps": 8, "shared": "sp", "custom": 5},
        )
    )
    assert request.seed == 1  # the top level wins
    assert request.num_inference_steps == 3 and request.fps == 8
    assert request.extra_params == {"pace_to_media_time": True, "shared": "top", "custom": 5}
    assert {"num_inference_steps", "fps", "extra_params", "seed"} <= request.model_fields_set
    echo = request.echo_config()
    assert echo["num_inference_steps"] == 3 and echo["extra_params"]["custom"] == 5
    assert "guidance_scale" not in echo


def test_sampling_params_alone_create_extra_params_and_can_carry_the_prompt():
    request = parse_session_start(json.dumps({"type": "session.start", "sampling_params": {"prompt": "a sea", "foo": [1]}}))
    assert request.prompt == "a sea"
    assert request.extra_params == {"foo": [1]}
    assert request.model_fields_set == {"prompt", "extra_params", "sampling_params"}


def test_sampling_params_extra_params_key_is_a_field_too():
    request = parse_session_start(start(sampling_params={"extra_params": {"a": 1}, "b": 2}))
    assert request.extra_params == {"a": 1, "b": 2}


def test_vllm_omni_video_params_and_user_are_known():
    request = parse_session_start(start(user="u1", video_params={"width": 64, "height": 48, "fps": 8}, fps=12))
    assert (request.width, request.height, request.fps, request.user) == (64, 48, 12, "u1")
    assert "video_params.colour: unknown field" in start_error(start(video_params={"colour": 1})).message


# =====================================================================================
# model check
# =====================================================================================
def test_model_mismatch_text():
    request = parse_session_start(start(model="other"))
    with pytest.raises(ProtocolError) as info:
        check_model(request, ["world-model", "alias"])
    assert info.value.message == "Model mismatch: request specifies 'other' but server is running 'world-model'."
    assert (info.value.code, info.value.close_code) == ("model_mismatch", 1008)


@pytest.mark.parametrize("model", [None, "", "world-model", "alias"])
def test_model_match(model):
    fields = {} if model is None else {"model": model}
    check_model(parse_session_start(start(**fields)), ["world-model", "alias"])


# =====================================================================================
# resolve_generation
# =====================================================================================
def test_defaults_apply_when_unset():
    resolved = resolve()
    assert (resolved.width, resolved.height, resolved.fps) == (64, 48, 16)
    assert resolved.num_frames is None and resolved.num_blocks is None  # until stop
    assert resolved.seed is None and resolved.image is None
    assert resolved.config == {"prompt": "a forest"}
    assert GenerationDefaults(width=64, height=64).fps == 24


def test_server_defaults_for_steps_and_shift_unless_set():
    defaults = GenerationDefaults(width=64, height=48, num_inference_steps=4, flow_shift=5.0)
    request = parse_session_start(start())
    assert (resolve_generation(request, defaults).num_inference_steps, resolve_generation(request, defaults).flow_shift) == (4, 5.0)
    request = parse_session_start(start(num_inference_steps=2, flow_shift=3))
    resolved = resolve_generation(request, defaults)
    assert (resolved.num_inference_steps, resolved.flow_shift) == (2, 3.0)


@pytest.mark.parametrize(
    ("num_frames", "used", "blocks"),
    [(1, 9, 1), (9, 9, 1), (10, 21, 2), (21, 21, 2), (22, 33, 3), (32, 33, 3), (33, 33, 3), (34, 45, 4)],
)
def test_num_frames_round_up_to_whole_blocks_and_the_echo_shows_it(num_frames, used, blocks):
    resolved = resolve(num_frames=num_frames)
    assert (resolved.num_frames, resolved.num_blocks) == (used, blocks)
    assert resolved.config["num_frames"] == used
    assert DEFAULTS.frames_for_blocks(blocks) == used


def test_seconds_times_fps():
    resolved = resolve(seconds="2")  # 2 s at the default 16 fps = 32 frames -> 33
    assert (resolved.num_frames, resolved.num_blocks, resolved.fps) == (33, 3, 16)
    assert resolved.config == {"prompt": "a forest", "seconds": "2"}
    assert resolve(seconds="1", fps=9).num_frames == 9
    assert resolve(seconds=1, fps=24).num_frames == 33  # a plain integer is accepted too


def test_num_frames_wins_over_seconds():
    assert resolve(seconds="10", num_frames=9).num_frames == 9


def test_session_length_limit():
    err = resolve_error(GenerationDefaults(width=64, height=48, fps=16, max_session_seconds=2), seconds="3")
    assert err.message.startswith("Invalid session.start: seconds: ")
    assert "limit of 2 s" in err.message


def test_size_string_and_width_height():
    resolved = resolve(size="128x96")
    assert (resolved.width, resolved.height) == (128, 96)
    resolved = resolve(width=32, height=80)
    assert (resolved.width, resolved.height) == (32, 80)
    resolved = resolve(size="128x96", width=128, height=96)  # agreeing is fine
    assert (resolved.width, resolved.height) == (128, 96)


@pytest.mark.parametrize(
    ("fields", "details"),
    [
        ({"width": 65, "height": 48}, "width: must be a positive multiple of 16, got 65"),
        ({"width": 64, "height": 50}, "height: must be a positive multiple of 16, got 50"),
        ({"size": "64x50"}, "size (height 50): must be a positive multiple of 16"),
        ({"size": "8192x64"}, "size (width 8192): must be at most 4096"),
        ({"guidance_scale": 5}, "guidance_scale: must be <= 1 (this model is distilled"),
        ({"guidance_scale_2": 3.5}, "guidance_scale_2: must be <= 1"),
        ({"true_cfg_scale": 4}, "true_cfg_scale: must be <= 1"),
        ({"lora": {"name": "style", "path": "/x"}}, "lora: per-request LoRA adapters are not supported"),
    ],
)
def test_what_the_engine_cannot_honour(fields, details):
    err = resolve_error(**fields)
    assert err.message.startswith("Invalid session.start: ")
    assert details in err.message
    assert (err.code, err.close_code) == ("invalid_request", 1008)


def test_accepted_and_echoed_but_unused():
    resolved = resolve(guidance_scale=1.0, boundary_ratio=0.9, negative_prompt="blur", quality="high", lora={})
    assert resolved.negative_prompt == "blur"
    assert resolved.config["boundary_ratio"] == 0.9 and resolved.config["quality"] == "high"
    assert resolve_generation(parse_session_start(start(guidance_scale=5)), GenerationDefaults(64, 48, max_guidance_scale=20)).fps == 24


def test_a_start_resolves_to_the_spec_the_engine_and_replica_run():
    spec = resolve(seed=5, size="32x16", num_inference_steps=2, extra_params={"pace_to_media_time": True, "pacing_lead_seconds": 0.5})
    assert (spec.prompt, spec.width, spec.height, spec.seed, spec.num_inference_steps) == ("a forest", 32, 16, 5, 2)
    assert spec.pacing == PacingSettings(0.5, 5.0) and resolve().pacing is None
    assert spec.session_id != resolve().session_id  # each resolved start is a fresh session


@pytest.mark.parametrize(
    ("extra", "named"),
    [
        ({"pace_to_media_time": "yes"}, "extra_params.pace_to_media_time must be true or false"),
        ({"pace_to_media_time": True, "pacing_lead_seconds": -1}, "extra_params.pacing_lead_seconds must be a finite number >= 0"),
        ({"pace_to_media_time": True, "pacing_max_lag_seconds": 0}, "extra_params.pacing_max_lag_seconds must be a finite number > 0, or null"),
    ],
)
def test_bad_pacing_settings_are_refused_by_name(extra, named):
    err = resolve_error(extra_params=extra)
    assert named in err.message and err.message.startswith("Invalid session.start: ")


def test_pacing_settings_parse_with_their_defaults():
    assert parse_pacing({}) is None and parse_pacing({"pace_to_media_time": False}) is None
    assert parse_pacing({"pace_to_media_time": True}) == PacingSettings(0.0, 5.0)
    assert parse_pacing({"pace_to_media_time": True, "pacing_lead_seconds": 0.5, "pacing_max_lag_seconds": None}) == PacingSettings(0.5, None)


# =====================================================================================
# image_reference
# =====================================================================================
@pytest.mark.parametrize(("fmt", "mime"), [("PNG", "image/png"), ("JPEG", "image/jpeg"), ("WEBP", "image/webp")])
def test_data_url_image_decodes_to_uint8_rgb(fmt, mime):
    buf = io.BytesIO()
    Image.new("RGB", (6, 4), (200, 30, 10)).save(buf, format=fmt, **({} if fmt == "PNG" else {"quality": 100}))
    resolved = resolve(image_reference={"image_url": data_url(buf.getvalue(), mime)})
    image = resolved.image
    assert isinstance(image, np.ndarray) and image.dtype == np.uint8 and image.shape == (4, 6, 3)
    assert np.abs(image.astype(int) - [200, 30, 10]).max() <= (0 if fmt == "PNG" else 12)
    # the echo keeps the media type, not megabytes of base64
    assert resolved.config["image_reference"]["image_url"].startswith(f"data:{mime};base64,<")
    assert "elided" in resolved.config["image_reference"]["image_url"]


def test_rgba_and_grey_images_become_rgb():
    buf = io.BytesIO()
    Image.new("LA", (3, 5), (100, 255)).save(buf, format="PNG")
    assert decode_image_data_url(data_url(buf.getvalue())).shape == (5, 3, 3)


@pytest.mark.parametrize(
    ("url", "details"),
    [
        ("data:image/png;base64,@@@@", "image_reference.image_url: the base64 payload is not valid"),
        ("data:image/png;base64," + base64.b64encode(b"not an image").decode(), "image_reference: not a decodable PNG, JPEG or WebP image"),
        (data_url(png_bytes()[:40]), "image_reference: not a decodable"),
    ],
)
def test_bad_image_payloads(url, details):
    err = resolve_error(image_reference={"image_url": url})
    assert err.message.startswith("Invalid session.start: ")
    assert details in err.message


def test_a_gif_under_a_png_label_is_refused():
    buf = io.BytesIO()
    Image.new("RGB", (2, 2)).save(buf, format="GIF")
    assert "not a decodable" in resolve_error(image_reference={"image_url": data_url(buf.getvalue())}).message


@pytest.mark.parametrize("size", [(5000, 5000), (100_000, 100_000)])
def test_decompression_bombs_are_refused_from_the_header(size):
    err = resolve_error(image_reference={"image_url": data_url(png_with_declared_size(*size))})
    assert err.message.startswith("Invalid session.start: image_reference: the image is")
    assert "limit of" in err.message


@pytest.mark.parametrize(("fmt", "mime"), [("JPEG", "image/jpeg"), ("WEBP", "image/webp"), ("PNG", "image/png")])
def test_small_files_that_decode_huge_are_refused_in_every_format(fmt, mime):
    buf = io.BytesIO()
    Image.new("RGB", (4200, 4200), (90, 120, 30)).save(buf, format=fmt)  # 17.6 million pixels, one colour
    assert len(buf.getvalue()) < 1_000_000  # small on the wire: a bomb
    err = resolve_error(image_reference={"image_url": f"data:{mime};base64," + base64.b64encode(buf.getvalue()).decode()})
    assert "the image is 4200x4200, more than the limit of 16777216 pixels" in err.message, err.message


def test_image_pixel_limit_is_configurable():
    with pytest.raises(ProtocolError, match="more than the limit of 10 pixels"):
        decode_image_data_url(data_url(png_bytes(6, 4)), max_pixels=10)


def test_image_conditioning_must_match_the_model():
    i2v = GenerationDefaults(width=64, height=48, image_conditioned=True)
    t2v = GenerationDefaults(width=64, height=48, image_conditioned=False)
    assert "needs a start image" in resolve_error(i2v).message
    assert "takes no start image" in resolve_error(t2v, image_reference={"image_url": data_url(png_bytes())}).message
    assert resolve_generation(parse_session_start(start(image_reference={"image_url": data_url(png_bytes())})), i2v).image.shape == (4, 6, 3)


def test_web_url_images_are_decoded_from_fetched_bytes_only():
    request = parse_session_start(start(image_reference={"image_url": "https://images.example.com/a.png"}))
    i2v = GenerationDefaults(width=64, height=48, image_conditioned=True)
    with pytest.raises(ProtocolError, match="remote URLs are not fetched here"):
        resolve_generation(request, i2v)
    resolved = resolve_generation(request, i2v, remote_image=png_bytes())
    assert resolved.image.shape == (4, 6, 3)
    # the echo keeps the URL the client sent
    assert resolved.config["image_reference"]["image_url"] == "https://images.example.com/a.png"


# =====================================================================================
# control messages: fixed texts
# =====================================================================================
@pytest.mark.parametrize(
    ("raw", "message", "code"),
    [
        ("x" * (CONTROL_MESSAGE_MAX_BYTES + 1), "control message too large", "message_too_large"),
        (b"x" * (CONTROL_MESSAGE_MAX_BYTES + 1), "control message too large", "message_too_large"),
        ("{oops", "Invalid JSON message", "invalid_json"),
        ('{"type": "session.playback", "position_seconds": Infinity}', "Invalid JSON message", "invalid_json"),
        ("[]", "WebSocket messages must be JSON objects", "invalid_request"),
        ("3", "WebSocket messages must be JSON objects", "invalid_request"),
        ('{"type": "session.dance"}', "Unknown message type: session.dance", "unknown_type"),
        ('{"type": "session.start", "prompt": "again"}', "Unknown message type: session.start", "unknown_type"),
        ("{}", "Unknown message type: None", "unknown_type"),
    ],
)
def test_control_fixed_errors(raw, message, code):
    err = control_error(raw)
    assert (err.message, err.code, err.close_code) == (message, code, None)  # the session goes on


@pytest.mark.parametrize(
    ("message", "text"),
    [
        ({"type": "session.interaction"}, "session.interaction requires an interaction object"),
        ({"type": "session.interaction", "interaction": "go"}, "session.interaction requires an interaction object"),
        (json.loads(interaction({"event_id": "", "event": {"prompt": "a"}})), "session.interaction event_id must be a non-empty string"),
        (json.loads(interaction({"event_id": 5, "event": {"prompt": "a"}})), "session.interaction event_id must be a non-empty string"),
        (json.loads(interaction({"event_id": "e"})), "session.interaction requires event object"),
        (json.loads(interaction({"event_id": "e", "event": "a"})), "session.interaction requires event object"),
        (
            json.loads(interaction({"event_id": "e", "event": {"prompt": "a", "negative_prompt": "b"}})),
            "session.interaction negative_prompt is not supported in this release",
        ),
        (json.loads(interaction({"event": {"prompt": "a"}, "transition_chunks": True})), "session.interaction transition_chunks must be an integer"),
        (json.loads(interaction({"event": {"prompt": "a"}, "transition_chunks": 1.5})), "session.interaction transition_chunks must be an integer"),
        (json.loads(interaction({"event": {"prompt": "a"}, "transition_chunks": "2"})), "session.interaction transition_chunks must be an integer"),
        (json.loads(interaction({"event": {"prompt": "a"}, "transition_chunks": -1})), "session.interaction transition_chunks must be >= 0"),
        (json.loads(interaction({"event": {"prompt": "a"}, "transition_chunks": -2.0})), "session.interaction transition_chunks must be >= 0"),
    ],
)
def test_interaction_fixed_errors(message, text):
    err = control_error(message)
    assert err.message == text
    assert (err.code, err.close_code) == ("invalid_request", None)


def test_camera_numbers_that_overflow_to_infinity_are_refused():
    raw = '{"type": "session.interaction", "interaction": {"event": {"multi_modal_data": {"camera": {"mode": "target", "data": {"translation": [1, 2, 1e400]}}}}}}'
    assert control_error(raw).message.startswith("session.interaction camera translation must be a list of 3 finite numbers")


def test_interaction_errors_carry_the_clients_event_id():
    assert control_error(interaction({"event_id": "e7", "event": {"prompt": "a", "negative_prompt": "b"}})).event_id == "e7"
    assert control_error(interaction({"event": {"prompt": "a", "negative_prompt": "b"}})).event_id is None


@pytest.mark.parametrize(
    ("event", "text"),
    [
        ({}, "session.interaction event needs a non-empty prompt or multi_modal_data"),
        ({"multi_modal_data": {}}, "session.interaction event needs a non-empty prompt or multi_modal_data"),
        ({"prompt": "  "}, "session.interaction requires a non-empty event.prompt"),
        ({"prompt": 3}, "session.interaction requires a non-empty event.prompt"),
        ({"multi_modal_data": []}, "session.interaction event.multi_modal_data must be an object"),
        ({"multi_modal_data": {"image": "x"}}, "session.interaction multi_modal_data.image is not supported"),
        ({"multi_modal_data": {"camera": "left"}}, "session.interaction camera must be an object"),
        ({"multi_modal_data": {"camera": {"mode": "orbit", "data": {}}}}, "session.interaction camera mode must be 'target' or 'velocity'"),
        ({"multi_modal_data": {"camera": {"mode": "target"}}}, "session.interaction camera data must be an object"),
        (
            {"multi_modal_data": {"camera": {"mode": "target", "data": {"translation": [1, 2]}}}},
            "session.interaction camera translation must be a list of 3 finite numbers [x, y, z]",
        ),
        (
            {"multi_modal_data": {"camera": {"mode": "target", "data": {"translation": [1, 2, True]}}}},
            "session.interaction camera translation must be a list of 3 finite numbers",
        ),
        (
            {"multi_modal_data": {"camera": {"mode": "target", "data": {"translation": [1, 2, 1e9]}}}},
            "session.interaction camera translation values must be within",
        ),
        (
            {"multi_modal_data": {"camera": {"mode": "velocity", "data": {"rotation": [0, 0, 1]}}}},
            "session.interaction camera rotation must be a list of 4 finite numbers [x, y, z, w]",
        ),
        (
            {"multi_modal_data": {"camera": {"mode": "velocity", "data": {"rotation": [0, 0, 0, 0]}}}},
            "session.interaction camera rotation must be a non-zero quaternion",
        ),
        ({"multi_modal_data": {"actions": []}}, "session.interaction actions must be a non-empty list"),
        ({"multi_modal_data": {"actions": "wasd"}}, "session.interaction actions must be a non-empty list"),
        ({"multi_modal_data": {"actions": ["w"]}}, "session.interaction actions[0] must be a list of keys"),
        ({"multi_modal_data": {"actions": [["w"], ["q"]]}}, "session.interaction actions[1] has unknown key 'q'; keys are a d i j k l s w"),
        ({"multi_modal_data": {"actions": [["W"]]}}, "session.interaction actions[0] has unknown key 'W'"),
    ],
)
def test_interaction_event_errors(event, text):
    err = control_error(interaction({"event_id": "e", "event": event}))
    assert err.message.startswith(text)
    assert (err.code, err.event_id, err.close_code) == ("invalid_request", "e", None)


# =====================================================================================
# control messages: conversion
# =====================================================================================
def test_prompt_interaction_converts_to_the_engines_type():
    message = parse_control_message(interaction({"event_id": "p1", "event": {"prompt": "a desert"}, "transition_chunks": 2.0}))
    assert message == InteractionMessage("p1", Interaction("p1", prompt="a desert", transition_chunks=2))
    assert isinstance(message.interaction.transition_chunks, int)
    assert not message.generated_event_id


def test_missing_or_null_event_id_gets_a_fresh_uuid4_hex():
    ids = set()
    for body in ({"event": {"prompt": "a"}}, {"event_id": None, "event": {"prompt": "a"}}):
        message = parse_control_message(interaction(body))
        assert message.generated_event_id
        assert len(message.event_id) == 32 and int(message.event_id, 16) >= 0
        assert message.interaction.event_id == message.event_id
        ids.add(message.event_id)
    assert len(ids) == 2


def test_camera_interaction_converts_to_a_camera_command():
    body = {
        "event_id": "c1",
        "event": {"multi_modal_data": {"camera": {"mode": "target", "data": {"translation": [1, 0.5, -2], "rotation": [0, 0.7071, 0, 0.7071]}}}},
        "transition_chunks": 3,
    }
    message = parse_control_message(interaction(body))
    assert message.interaction == Interaction(
        "c1", camera=CameraCommand("target", (1.0, 0.5, -2.0), (0.0, 0.7071, 0.0, 0.7071)), transition_chunks=3
    )
    from deployments.generation.interactions import camera_pose

    assert camera_pose(message.interaction.camera).rotation[3] == pytest.approx(2**-0.5, abs=1e-4)


def test_camera_parts_default_to_identity():
    message = parse_control_message(interaction({"event": {"multi_modal_data": {"camera": {"mode": "velocity", "data": {"translation": [0, 0, 0.1]}}}}}))
    assert message.interaction.camera == CameraCommand("velocity", (0.0, 0.0, 0.1), (0.0, 0.0, 0.0, 1.0))


def test_keyboard_actions_convert_to_tuples_per_latent_frame():
    body = {"event_id": "k1", "event": {"prompt": "run", "multi_modal_data": {"actions": [["w"], [], ["w", "l"]]}}}
    message = parse_control_message(interaction(body))
    assert message.interaction == Interaction("k1", prompt="run", actions=(("w",), (), ("w", "l")))


def test_the_engine_accepts_what_the_parser_produced():
    from deployments.generation.interactions import Director

    director = Director("a forest", frames_per_block=3, accepts_camera=True)
    for body in (
        {"event": {"prompt": "a desert"}, "transition_chunks": 1},
        {"event": {"multi_modal_data": {"camera": {"mode": "velocity", "data": {"translation": [0, 0, 0.1]}}}}},
        {"event": {"multi_modal_data": {"actions": [["a", "i"]]}}},
    ):
        director.submit(parse_control_message(interaction(body)).interaction)
    assert len(director.pending_ids) == 3


def test_stop_ping_playback():
    assert parse_control_message('{"type": "session.stop"}') == StopMessage()
    assert parse_control_message(b'{"type": "session.ping"}') == PingMessage()
    assert parse_control_message('{"type": "session.playback", "position_seconds": 1.5}') == PlaybackMessage(1.5)
    assert parse_control_message('{"type": "session.playback", "position_seconds": 0}') == PlaybackMessage(0.0)


@pytest.mark.parametrize("position", ["-0.1", '"1"', "true", "null", "1e400"])
def test_bad_playback_position(position):
    err = control_error('{"type": "session.playback", "position_seconds": %s}' % position)
    assert err.message == "session.playback position_seconds must be a finite number >= 0"
    assert err.close_code is None


def test_control_message_at_the_limit_is_parsed():
    raw = interaction({"event_id": "big", "event": {"prompt": "p"}})
    raw = raw.replace('"p"', '"' + "p" * (CONTROL_MESSAGE_MAX_BYTES - len(raw) + 1) + '"')
    assert len(raw) == CONTROL_MESSAGE_MAX_BYTES
    assert parse_control_message(raw).event_id == "big"


# =====================================================================================
# server -> client
# =====================================================================================
def test_builders():
    request_id = new_request_id()
    assert request_id.startswith("video_stream-") and len(request_id) == len("video_stream-") + 32
    assert new_request_id() != request_id
    assert video_start("r", {"prompt": "a"}) == {"type": "video.start", "request_id": "r", "format": "m4s", "config": {"prompt": "a"}}
    assert video_start("r", {}, session_id="s")["session_id"] == "s"
    assert chunk_metadata("r", "media", 9, 100, 0, 0, ("e1",), ("e1",), ()) == {
        "type": "video.chunk_metadata",
        "request_id": "r",
        "kind": "media",
        "num_frames": 9,
        "byte_length": 100,
        "transport_chunk_index": 0,
        "generation_chunk_index": 0,
        "started_event_ids": ["e1"],
        "active_event_ids": ["e1"],
        "completed_event_ids": [],
    }
    trailer = chunk_metadata("r", "trailer", 1, 10, 5, 4, (), (), ())
    assert trailer["generation_chunk_index"] is None and trailer["kind"] == "trailer"
    with pytest.raises(ValueError):
        chunk_metadata("r", "audio", 1, 1, 0, 0, (), (), ())
    assert interaction_queued("r", "e") == {"type": "session.interaction.queued", "request_id": "r", "event_id": "e"}
    assert session_done("r", 3, True) == {"type": "session.done", "request_id": "r", "chunks": 3, "stopped": True}
    assert pong() == {"type": "session.pong"}
    json.dumps([video_start("r", resolve(num_frames=10).config), pong()])  # all JSON-serializable


# -- extra_params the seed's clients send ---------------------------------------------------------------
def test_codec_options_from_the_allow_list_reach_the_start_checked():
    resolved = resolve_generation(parse_session_start(start(extra_params={"video_codec_options": {"crf": "30", "profile": "baseline", "g": 12}})), DEFAULTS)
    assert resolved.codec_options == (("crf", "30"), ("profile", "baseline"), ("g", "12"))
    assert resolve_generation(parse_session_start(start()), DEFAULTS).codec_options == ()


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"x264-params": "keyint=1"}, "extra_params.video_codec_options: 'x264-params' is not an option this server lets a session set; allowed: crf, g, preset, profile"),
        ({"tune": "film"}, "'tune' is not an option"),
        ({"crf": 99}, "extra_params.video_codec_options.crf: must be an integer from 0 to 51, got 99"),
        ({"preset": "placebo"}, "extra_params.video_codec_options.preset: must be one of ultrafast"),
        ("crf=20", "extra_params.video_codec_options: must be an object of x264 options"),
    ],
)
def test_codec_options_outside_the_allow_list_are_refused_by_name(options, named):
    err = resolve_error(extra_params={"video_codec_options": options})
    assert named in err.message and err.message.startswith("Invalid session.start: ")


def test_a_camera_action_script_plays_from_block_zero():
    script = [[["w"], ["w"], []], [["l"], ["l"], ["l"]]]
    spec = resolve_generation(parse_session_start(start(num_frames=33, extra_params={"camera_action_script": script})), DEFAULTS)
    [interaction] = spec.interactions  # submitted before block 0 starts
    assert interaction.event_id == ACTION_SCRIPT_EVENT_ID and interaction.actions == (("w",), ("w",), (), ("l",), ("l",), ("l",))


@pytest.mark.parametrize(
    ("defaults", "script", "named"),
    [
        (DEFAULTS, [[["w"], ["x"], []]], "extra_params.camera_action_script[0][1] has unknown key 'x'"),
        (DEFAULTS, [[["w"], []]], "extra_params.camera_action_script[0]: must be a list of 3 per-latent-frame lists of keys"),
        (DEFAULTS, [[[], [], []]] * 4, "extra_params.camera_action_script: 4 blocks of actions for a video of 3 blocks"),
        (GenerationDefaults(width=64, height=48, fps=16, accepts_camera=False), [[[], [], []]], "this model has no camera adapter"),
    ],
)
def test_bad_camera_action_scripts_are_refused_by_name(defaults, script, named):
    err = resolve_error(defaults, num_frames=33, extra_params={"camera_action_script": script})
    assert named in err.message, err.message
