"""The server->client message models: what the ingress builds is what the SDK reads, field for field."""

from __future__ import annotations

import json

import pytest

from deployments.protocol import chat, errors, server_messages as wire, video


def built_messages() -> list[tuple[dict, dict]]:
    """(the endpoint's contract, a message as the ingress builds it) for every builder."""
    return [
        (wire.VIDEO_MESSAGES, video.video_start("video_stream-1", {"size": "64x64"}, seed=3, replica_id="r1", session_id="s1",
                                                generation={"frames_per_block": 3, "scale_factor_temporal": 4, "pipeline_depth": 1, "num_frames": None})),
        (wire.VIDEO_MESSAGES, video.chunk_metadata("video_stream-1", "media", 9, 1200, 0, 0, ["e1"], ["e1"], [], fragment_frames=8)),
        (wire.VIDEO_MESSAGES, video.chunk_metadata("video_stream-1", "trailer", 0, 40, 3, 7)),
        (wire.VIDEO_MESSAGES, video.interaction_queued("video_stream-1", "e2")),
        (wire.VIDEO_MESSAGES, video.session_done("video_stream-1", 4, True)),
        (wire.VIDEO_MESSAGES, video.pong()),
        (wire.VIDEO_MESSAGES, errors.error_message("Stall timeout", "stall_timeout", request_id="video_stream-1", retry_after_s=2.0)),
        (wire.CHAT_MESSAGES, chat.response_start("video-1", modalities=["text"])),
        (wire.CHAT_MESSAGES, chat.text_delta("a red ", response_id="video-1")),
        (wire.CHAT_MESSAGES, chat.text_done("a red square")),
        (wire.CHAT_MESSAGES, chat.evs_stats(3, 1, 4)),
        (wire.CHAT_MESSAGES, chat.frame_ack("f1", False, 2, "rate_limited", pts_ms=40.0)),
        (wire.CHAT_MESSAGES, chat.frame_ack(7, True, 3)),
        (wire.CHAT_MESSAGES, chat.session_done()),
        (wire.CHAT_MESSAGES, chat.pong()),
    ]


@pytest.mark.parametrize("contract,message", built_messages(), ids=lambda m: m.get("type") if isinstance(m, dict) and "type" in m else None)
def test_every_built_message_reads_back_as_its_model_and_goes_out_unchanged(contract, message) -> None:
    model = wire.read_message(json.loads(json.dumps(message)), contract)
    assert model is not None and model.type == message["type"]
    assert model.wire() == message


def test_seed_fields_keep_their_seed_shape() -> None:
    trailer = video.chunk_metadata("video_stream-1", "trailer", 0, 40, 3, 7)
    assert trailer["generation_chunk_index"] is None and "fragment_frames" not in trailer  # null is sent, ours only when known
    assert video.video_start("video_stream-1", {}) == {"type": "video.start", "request_id": "video_stream-1", "format": "m4s", "config": {}}
    assert chat.response_start() == {"type": "response.start"}
    assert errors.error_message("x") == {"type": "error", "message": "x"}
    assert chat.frame_ack("f", True, 1) == {"type": "video.frame.ack", "frame_id": "f", "pts_ms": None, "accepted": True, "buffered_frames": 1}


def test_extras_ride_along_and_unknown_types_are_not_guessed() -> None:
    model = wire.read_message({"type": "session.done", "request_id": "v", "chunks": 2, "stopped": False, "later_field": 1}, wire.VIDEO_MESSAGES)
    assert model.model_extra == {"later_field": 1} and model.wire()["later_field"] == 1
    assert wire.read_message({"type": "response.audio.delta"}, wire.CHAT_MESSAGES) is None
    assert wire.read_message({"type": "pong"}, wire.VIDEO_MESSAGES) is None  # the chat endpoint's pong, not the video one's


@pytest.mark.parametrize("contract,message,named", [
    (wire.VIDEO_MESSAGES, {"type": "video.chunk_metadata", "kind": "media", "num_frames": -1, "byte_length": 3, "transport_chunk_index": 0}, "num_frames"),
    (wire.VIDEO_MESSAGES, {"type": "video.chunk_metadata", "kind": "audio", "num_frames": 1, "byte_length": 3, "transport_chunk_index": 0}, "kind"),
    (wire.VIDEO_MESSAGES, {"type": "video.start"}, "request_id"),
    (wire.VIDEO_MESSAGES, {"type": "video.start", "request_id": "v", "generation": {"frames_per_block": 0}}, "generation.frames_per_block"),
    (wire.VIDEO_MESSAGES, {"type": "session.done", "request_id": "v", "chunks": "2", "stopped": False}, "chunks"),
    (wire.CHAT_MESSAGES, {"type": "response.text.delta", "delta": 5}, "delta"),
    (wire.CHAT_MESSAGES, {"type": "video.frame.ack", "frame_id": "f", "accepted": "yes", "buffered_frames": 1}, "accepted"),
    (wire.CHAT_MESSAGES, {"type": "error"}, "message"),
])
def test_a_message_that_breaks_the_contract_is_refused_naming_the_field(contract, message, named) -> None:
    with pytest.raises(wire.MalformedMessage, match=rf"^{message['type']} breaks the contract \({named}"):
        wire.read_message(message, contract)
