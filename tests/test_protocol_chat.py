"""The `/v1/video/chat/stream` protocol layer on its own (PROTOCOL.md section 2): no Ray, no sockets, no torch."""

from __future__ import annotations

import base64
import json

import pytest

from deployments.protocol.chat import (
    CHAT_MESSAGE_MAX_BYTES,
    CONFIG_MESSAGE_MAX_BYTES,
    CONFIG_TIMEOUT_MESSAGE,
    CONFIG_TIMEOUT_S,
    IDLE_TIMEOUT_MESSAGE,
    IDLE_TIMEOUT_S,
    MAX_FRAME_BYTES,
    MAX_FRAMES_LIMIT,
    NO_FRAMES_MESSAGE,
    QUERY_FAILED_MESSAGE,
    AudioMessage,
    ChatConfig,
    DoneMessage,
    FrameMessage,
    PingMessage,
    QueryMessage,
    check_model,
    config_timeout,
    error,
    evs_stats,
    frame_ack,
    idle_timeout,
    invalid_image,
    new_response_id,
    no_frames,
    parse_chat_message,
    parse_session_config,
    pong,
    query_failed,
    response_start,
    session_done,
    text_delta,
    text_done,
)
from deployments.protocol.errors import CLOSE_POLICY, CLOSE_TOO_BIG, ProtocolError


def config(**fields) -> str:
    return json.dumps({"type": "session.config", **fields})


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def refused(parse, raw) -> ProtocolError:
    with pytest.raises(ProtocolError) as info:
        parse(raw)
    return info.value


# =====================================================================================
# session.config
# =====================================================================================
def test_defaults():
    assert parse_session_config(config()) == ChatConfig(
        model="",
        modalities=("text",),
        max_frames=64,
        num_sample_frames=16,
        evs_enabled=True,
        evs_threshold=0.95,
        system_prompt=None,
    )
    assert ChatConfig().as_dict() == {
        "model": "",
        "modalities": ["text"],
        "max_frames": 64,
        "num_sample_frames": 16,
        "evs_enabled": True,
        "evs_threshold": 0.95,
        "system_prompt": None,
        "use_audio_in_video": False,
        "replace_running_answer": False,
    }


def test_all_fields_and_unknown_keys_ignored():
    got = parse_session_config(
        config(
            model="tiny-omni",
            modalities=["text", "audio"],
            max_frames=8,
            num_sample_frames=4,
            evs_enabled=False,
            evs_threshold=0.5,
            system_prompt="Be brief.",
            use_audio_in_video=True,  # vLLM-Omni's newer field: accepted
            replace_running_answer=True,  # ours, opt-in
            sampling_params_list=[{}],
            whatever={"nested": [1, 2]},
        )
    )
    assert got == ChatConfig("tiny-omni", ("text", "audio"), 8, 4, False, 0.5, "Be brief.", True, True)


@pytest.mark.parametrize("field", ["use_audio_in_video", "replace_running_answer"])
def test_flags_must_be_booleans(field):
    with pytest.raises(ProtocolError, match=f"Invalid type for '{field}': expected bool, got int"):
        parse_session_config(config(**{field: 1}))


@pytest.mark.parametrize(
    ("fields", "attribute", "value"),
    [
        ({"num_frames": 3}, "num_sample_frames", 3),
        ({"enable_frame_filter": False}, "evs_enabled", False),
        ({"frame_filter_threshold": 0.8}, "evs_threshold", 0.8),
        # the canonical name wins when both are sent
        ({"num_frames": 3, "num_sample_frames": 5}, "num_sample_frames", 5),
        ({"enable_frame_filter": False, "evs_enabled": True}, "evs_enabled", True),
        ({"frame_filter_threshold": 0.1, "evs_threshold": 0.7}, "evs_threshold", 0.7),
    ],
)
def test_aliases(fields, attribute, value):
    assert getattr(parse_session_config(config(**fields)), attribute) == value


@pytest.mark.parametrize(("value", "expected"), [(1, 1.0), (0, 0.0), (0.9, 0.9), (1.0, 1.0)])
def test_evs_threshold_int_or_float(value, expected):
    got = parse_session_config(config(evs_threshold=value)).evs_threshold
    assert got == expected and isinstance(got, float)


def test_system_prompt_null_is_the_default():
    assert parse_session_config(config(system_prompt=None)).system_prompt is None


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"model": None}, "Invalid type for 'model': expected str, got NoneType"),
        ({"model": 1}, "Invalid type for 'model': expected str, got int"),
        ({"modalities": "text"}, "Invalid type for 'modalities': expected list, got str"),
        ({"modalities": {"text": 1}}, "Invalid type for 'modalities': expected list, got dict"),
        ({"modalities": ["text", 1]}, "Invalid type for 'modalities[1]': expected str, got int"),
        ({"max_frames": "64"}, "Invalid type for 'max_frames': expected int, got str"),
        ({"max_frames": 64.0}, "Invalid type for 'max_frames': expected int, got float"),
        ({"max_frames": True}, "Invalid type for 'max_frames': expected int, got bool"),  # bool is not an int
        ({"max_frames": None}, "Invalid type for 'max_frames': expected int, got NoneType"),
        ({"max_frames": []}, "Invalid type for 'max_frames': expected int, got list"),
        ({"num_sample_frames": 2.5}, "Invalid type for 'num_sample_frames': expected int, got float"),
        ({"num_sample_frames": False}, "Invalid type for 'num_sample_frames': expected int, got bool"),
        ({"num_frames": "8"}, "Invalid type for 'num_frames': expected int, got str"),
        ({"evs_enabled": 1}, "Invalid type for 'evs_enabled': expected bool, got int"),
        ({"evs_enabled": "true"}, "Invalid type for 'evs_enabled': expected bool, got str"),
        ({"enable_frame_filter": None}, "Invalid type for 'enable_frame_filter': expected bool, got NoneType"),
        ({"evs_threshold": "0.9"}, "Invalid type for 'evs_threshold': expected int/float, got str"),
        ({"evs_threshold": True}, "Invalid type for 'evs_threshold': expected int/float, got bool"),
        ({"frame_filter_threshold": None}, "Invalid type for 'frame_filter_threshold': expected int/float, got NoneType"),
        ({"system_prompt": 5}, "Invalid type for 'system_prompt': expected str/NoneType, got int"),
        ({"system_prompt": ["a"]}, "Invalid type for 'system_prompt': expected str/NoneType, got list"),
    ],
)
def test_type_errors(fields, message):
    exc = refused(parse_session_config, config(**fields))
    assert exc.message == message
    assert exc.close_code == CLOSE_POLICY
    assert exc.to_message() == {"type": "error", "message": message, "code": "invalid_request"}


def test_type_errors_in_vllm_omni_field_order():
    # vLLM-Omni checks model, modalities, max_frames, num_sample_frames, evs_enabled, evs_threshold: first failure wins
    exc = refused(parse_session_config, config(evs_threshold="x", max_frames="y", model=3))
    assert exc.message == "Invalid type for 'model': expected str, got int"


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"max_frames": 0}, f"Invalid value for 'max_frames': expected an integer from 1 to {MAX_FRAMES_LIMIT}, got 0"),
        ({"max_frames": MAX_FRAMES_LIMIT + 1}, f"Invalid value for 'max_frames': expected an integer from 1 to {MAX_FRAMES_LIMIT}, got {MAX_FRAMES_LIMIT + 1}"),
        ({"num_sample_frames": 0}, f"Invalid value for 'num_sample_frames': expected an integer from 1 to {MAX_FRAMES_LIMIT}, got 0"),
        ({"num_frames": -1}, f"Invalid value for 'num_frames': expected an integer from 1 to {MAX_FRAMES_LIMIT}, got -1"),
        ({"evs_threshold": 1.5}, "Invalid value for 'evs_threshold': expected a number from 0 to 1, got 1.5"),
        ({"evs_threshold": -0.1}, "Invalid value for 'evs_threshold': expected a number from 0 to 1, got -0.1"),
        ({"frame_filter_threshold": 2}, "Invalid value for 'frame_filter_threshold': expected a number from 0 to 1, got 2"),
        ({"modalities": []}, 'Invalid value for \'modalities\': expected a non-empty list of "text" and "audio", got []'),
        ({"modalities": ["video"]}, 'Invalid value for \'modalities\': expected a non-empty list of "text" and "audio", got ["video"]'),
    ],
)
def test_range_errors(fields, message):
    exc = refused(parse_session_config, config(**fields))
    assert exc.message == message
    assert exc.close_code == CLOSE_POLICY


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ('{"type": "session.config", "evs_threshold": 1e999}', "Invalid value for 'evs_threshold': expected a number from 0 to 1, got Infinity"),
        ('{"type": "session.config", "max_frames": 1' + "0" * 40 + "}", "Invalid value for 'max_frames': expected an integer from 1 to 1024, got 1" + "0" * 40),
        ('{"type": "session.config", "evs_threshold": 1' + "0" * 400 + "}", "Invalid value for 'evs_threshold': expected a number from 0 to 1, got 1" + "0" * 99 + "..."),
    ],
)
def test_huge_numbers(raw, message):
    assert refused(parse_session_config, raw).message == message


def test_range_edges_accepted():
    got = parse_session_config(config(max_frames=1, num_sample_frames=MAX_FRAMES_LIMIT, evs_threshold=0))
    assert (got.max_frames, got.num_sample_frames, got.evs_threshold) == (1, MAX_FRAMES_LIMIT, 0.0)
    assert parse_session_config(config(max_frames=MAX_FRAMES_LIMIT, num_sample_frames=1)).max_frames == MAX_FRAMES_LIMIT
    assert parse_session_config(config(modalities=["audio", "text", "audio"])).modalities == ("audio", "text")


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ("{", "Invalid JSON in session.config"),
        ("", "Invalid JSON in session.config"),
        (b"\xff\xfe", "Invalid JSON in session.config"),
        ('{"type": "session.config", "evs_threshold": NaN}', "Invalid JSON in session.config"),
        (json.dumps({"type": "video.frame", "data": ""}), "Expected session.config, got: video.frame"),
        (json.dumps({"model": "x"}), "Expected session.config, got: None"),
        (json.dumps({"type": 5}), "Expected session.config, got: 5"),
        ("[]", "Expected session.config, got: list"),
        ("5", "Expected session.config, got: int"),
        ("1.5", "Expected session.config, got: float"),
        ('"session.config"', "Expected session.config, got: str"),
        ("null", "Expected session.config, got: NoneType"),
        ("true", "Expected session.config, got: bool"),
    ],
)
def test_first_message_errors(raw, message):
    exc = refused(parse_session_config, raw)
    assert exc.message == message
    assert exc.ends_session and exc.close_code == CLOSE_POLICY


def test_config_as_bytes():
    assert parse_session_config(config(max_frames=3).encode()).max_frames == 3


def test_config_too_large():
    raw = config(system_prompt="x" * CONFIG_MESSAGE_MAX_BYTES)
    exc = refused(parse_session_config, raw)
    assert exc.message == "session.config message too large"
    assert exc.close_code == CLOSE_TOO_BIG


def test_timeouts():
    assert CONFIG_TIMEOUT_S == 10.0 and IDLE_TIMEOUT_S == 60.0
    assert CONFIG_TIMEOUT_MESSAGE == "Timeout waiting for session.config"
    assert IDLE_TIMEOUT_MESSAGE == "Idle timeout: no message received"
    for exc, text in ((config_timeout(), CONFIG_TIMEOUT_MESSAGE), (idle_timeout(), IDLE_TIMEOUT_MESSAGE)):
        assert exc.message == text and exc.ends_session
        assert exc.to_message()["message"] == text


def test_check_model():
    check_model(ChatConfig(model=""), ["tiny-omni"])  # the default: whatever is served
    check_model(ChatConfig(model="tiny-omni"), ["tiny-omni", "alias"])
    check_model(ChatConfig(model="anything"), [])  # nothing to check against
    exc = refused(lambda c: check_model(c, ["tiny-omni"]), ChatConfig(model="gpt-4o"))
    assert exc.message == "The model `gpt-4o` does not exist."  # vLLM's text
    assert exc.code == "model_mismatch" and exc.close_code == CLOSE_POLICY


# =====================================================================================
# Messages after session.config
# =====================================================================================
JPEG_ISH = b"\xff\xd8\xff\xe0" + bytes(range(256)) * 4


def frame(**fields) -> str:
    return json.dumps({"type": "video.frame", **fields})


def test_video_frame():
    got = parse_chat_message(frame(data=b64(JPEG_ISH), frame_id="f-1", pts_ms=40))
    assert isinstance(got, FrameMessage)
    assert (got.data, got.frame_id, got.pts_ms) == (JPEG_ISH, "f-1", 40)
    plain = parse_chat_message(frame(data=b64(JPEG_ISH)))
    assert (plain.frame_id, plain.pts_ms) == (None, None)


@pytest.mark.parametrize(
    ("frame_id", "pts_ms", "expected"),
    [
        (7, 12.5, (7, 12.5)),  # an integer id is acked too (theirs acks strings only)
        ("", None, (None, None)),  # no usable id: no ack, as in vLLM-Omni
        (True, True, (None, None)),
        ({"a": 1}, "40", (None, None)),
    ],
)
def test_video_frame_ids(frame_id, pts_ms, expected):
    got = parse_chat_message(frame(data=b64(JPEG_ISH), frame_id=frame_id, pts_ms=pts_ms))
    assert (got.frame_id, got.pts_ms) == expected


def test_video_frame_base64_leniency():
    text = b64(JPEG_ISH)
    mime = "\n".join(text[i : i + 76] for i in range(0, len(text), 76))  # MIME line breaks
    assert parse_chat_message(frame(data=mime)).data == JPEG_ISH
    assert parse_chat_message(frame(data="data:image/jpeg;base64," + text)).data == JPEG_ISH


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ("abc", "Invalid base64 in video.frame"),  # bad padding
        ("!!!!", "Invalid base64 in video.frame"),
        ("aGVsbG8=junk", "Invalid base64 in video.frame"),  # data after padding
        ("aGVs bG8*", "Invalid base64 in video.frame"),
        ("é" * 8, "Invalid base64 in video.frame"),
        (123, "Invalid base64 in video.frame"),
        (["aGVsbG8="], "Invalid base64 in video.frame"),
        ("", "video.frame requires a non-empty 'data' field"),
        (None, "video.frame requires a non-empty 'data' field"),
    ],
)
def test_video_frame_errors(data, message):
    exc = refused(parse_chat_message, frame(data=data, frame_id="f-9"))
    assert exc.message == message
    assert not exc.ends_session
    assert exc.to_message()["frame_id"] == "f-9"  # the client can tell which frame


def test_video_frame_without_data_key():
    assert refused(parse_chat_message, json.dumps({"type": "video.frame"})).message == "video.frame requires a non-empty 'data' field"


def test_frame_size_limit():
    assert MAX_FRAME_BYTES == 10485760
    at_limit = b"\x00" * MAX_FRAME_BYTES
    assert len(parse_chat_message(frame(data=b64(at_limit))).data) == MAX_FRAME_BYTES
    exc = refused(parse_chat_message, frame(data=b64(at_limit + b"\x00"), frame_id="big"))
    assert exc.message == "Frame too large: 10485761 bytes (limit 10485760)"
    assert exc.code == "frame_too_large" and not exc.ends_session
    assert exc.to_message()["frame_id"] == "big"


def test_message_size_bound_fits_a_full_frame():
    # a 10 MiB frame, base64, with a long id and pts, fits in one message
    raw = frame(data=b64(b"\x00" * MAX_FRAME_BYTES), frame_id="x" * 256, pts_ms=1e12)
    assert len(raw) <= CHAT_MESSAGE_MAX_BYTES
    exc = refused(parse_chat_message, " " * (CHAT_MESSAGE_MAX_BYTES + 1))
    assert exc.message == f"Message too large: {CHAT_MESSAGE_MAX_BYTES + 1} bytes (limit {CHAT_MESSAGE_MAX_BYTES})"
    assert exc.code == "message_too_large" and not exc.ends_session


def test_frame_id_too_long():
    exc = refused(parse_chat_message, frame(data=b64(JPEG_ISH), frame_id="x" * 257))
    assert exc.message == "video.frame frame_id must be at most 256 characters"


def test_audio_chunk():
    pcm = (1000).to_bytes(2, "little", signed=True) * 160
    got = parse_chat_message(json.dumps({"type": "audio.chunk", "data": b64(pcm)}))
    assert isinstance(got, AudioMessage) and got.pcm == pcm
    assert parse_chat_message(json.dumps({"type": "audio.chunk", "data": ""})).pcm == b""


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"data": "abc"}, "Invalid base64 in audio.chunk"),
        ({"data": "****"}, "Invalid base64 in audio.chunk"),
        ({"data": 5}, "Invalid base64 in audio.chunk"),
        ({}, "audio.chunk requires a 'data' field with base64 PCM16 audio"),
        ({"data": b64(b"\x01\x02\x03")}, "audio.chunk data must be whole 16-bit PCM samples: got 3 bytes, an odd count"),
    ],
)
def test_audio_chunk_errors(fields, message):
    exc = refused(parse_chat_message, json.dumps({"type": "audio.chunk", **fields}))
    assert exc.message == message and not exc.ends_session


def test_video_query():
    assert parse_chat_message(json.dumps({"type": "video.query", "text": "What is this?"})) == QueryMessage("What is this?")
    pcm = b"\x00\x01" * 8
    got = parse_chat_message(json.dumps({"type": "video.query", "text": "and this?", "audio_data": b64(pcm)}))
    assert got == QueryMessage("and this?", pcm)
    assert parse_chat_message(json.dumps({"type": "video.query", "text": "x", "audio_data": ""})).audio is None


@pytest.mark.parametrize("text", [None, "", "   \n", 5, ["hi"], {"text": "hi"}, True])
def test_video_query_needs_text(text):
    fields = {"type": "video.query"} if text is None else {"type": "video.query", "text": text}
    exc = refused(parse_chat_message, json.dumps(fields))
    assert exc.message == "video.query requires a non-empty 'text' field"
    assert not exc.ends_session


def test_video_query_bad_audio():
    exc = refused(parse_chat_message, json.dumps({"type": "video.query", "text": "x", "audio_data": "a"}))
    assert exc.message == "Invalid base64 in video.query audio_data"


def test_done_and_ping():
    assert parse_chat_message('{"type": "video.done"}') == DoneMessage()
    assert parse_chat_message(b'{"type": "ping"}') == PingMessage()


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ("{", "Invalid JSON"),
        ("", "Invalid JSON"),
        (b"\xff", "Invalid JSON"),
        ('{"type": "video.query", "text": Infinity}', "Invalid JSON"),
        ("[]", "Messages must be JSON objects"),
        ("5", "Messages must be JSON objects"),
        ('"video.done"', "Messages must be JSON objects"),
        ("null", "Messages must be JSON objects"),
        ('{"type": "video.stop"}', "Unknown message type: video.stop"),
        ('{"type": "session.config"}', "Unknown message type: session.config"),
        ('{"text": "hi"}', "Unknown message type: None"),
        ('{"type": 3}', "Unknown message type: 3"),
    ],
)
def test_message_errors(raw, message):
    exc = refused(parse_chat_message, raw)
    assert exc.message == message
    assert not exc.ends_session
    assert exc.to_message()["message"] == message


# =====================================================================================
# Server -> client
# =====================================================================================
def test_fixed_texts():
    assert NO_FRAMES_MESSAGE == "No frames available. Send video.frame before video.query."
    assert QUERY_FAILED_MESSAGE == "Query processing failed"
    assert no_frames().to_message() == {"type": "error", "message": NO_FRAMES_MESSAGE, "code": "no_frames"}
    assert query_failed().to_message() == {"type": "error", "message": QUERY_FAILED_MESSAGE, "code": "query_failed"}
    assert not no_frames().ends_session and not query_failed().ends_session
    bad = invalid_image("not a JPEG or PNG image", frame_id="f")
    assert bad.to_message() == {
        "type": "error",
        "message": "Invalid image in video.frame: not a JPEG or PNG image",
        "code": "invalid_image",
        "frame_id": "f",
    }
    assert not bad.ends_session


def test_builders():
    assert response_start() == {"type": "response.start"}
    rid = new_response_id()
    assert rid.startswith("video-") and len(rid) == len("video-") + 32
    assert response_start(rid, num_frames=4) == {"type": "response.start", "response_id": rid, "num_frames": 4}
    assert text_delta("He") == {"type": "response.text.delta", "delta": "He"}
    assert text_done("Hello") == {"type": "response.text.done", "text": "Hello"}
    assert session_done() == {"type": "session.done"}
    assert pong() == {"type": "pong"}
    assert evs_stats(3, 1, 4) == {
        "type": "response.evs_stats",
        "retained_count": 3,
        "dropped_count": 1,
        "total_count": 4,
        "drop_rate": 0.25,
    }
    assert evs_stats(0, 0, 0)["drop_rate"] == 0.0
    assert error("Query processing failed") == {"type": "error", "message": "Query processing failed"}
    assert error("x", "some_code", request_id="r") == {"type": "error", "message": "x", "code": "some_code", "request_id": "r"}


def test_frame_ack():
    assert frame_ack("f-1", True, 3) == {
        "type": "video.frame.ack",
        "frame_id": "f-1",
        "pts_ms": None,
        "accepted": True,
        "buffered_frames": 3,
    }
    assert frame_ack("f-2", False, 3, "filtered", pts_ms=80) == {
        "type": "video.frame.ack",
        "frame_id": "f-2",
        "pts_ms": 80,
        "accepted": False,
        "buffered_frames": 3,
        "reason": "filtered",
    }
    assert frame_ack(9, True, 64, dropped_frame_id=1)["dropped_frame_id"] == 1


def test_every_message_is_json():
    for message in (response_start("r"), text_delta("a"), text_done("a"), evs_stats(1, 0, 1), session_done(), frame_ack("f", True, 1)):
        assert json.loads(json.dumps(message)) == message
