"""What the two realtime endpoints send, as typed models: the ingress builds its JSON messages with
them and the client SDK parses what it receives with them, so both ends read one contract.

The seeds' fields are declared as the seeds send them. Our additive fields are declared too where a
client reads them (`video.start.generation`, `fragment_frames`, ...); anything else rides along as an
extra (`model_extra`), so a client reading a newer server keeps what it does not know, and a server
can add a field without a new model. `wire()` is the JSON object that goes out.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictFloat, StrictInt, StrictStr, ValidationError

Count = StrictInt  # a bool is not a count
Number = Union[StrictInt, StrictFloat]


class ServerMessage(BaseModel):
    model_config = ConfigDict(extra="allow", frozen=True)
    # Declared fields the wire leaves out while they are None (sent only when known, as the seeds do).
    omit_when_none: ClassVar[frozenset[str]] = frozenset()

    def wire(self) -> dict[str, Any]:
        out = self.model_dump(mode="json")
        return {k: v for k, v in out.items() if v is not None or k not in self.omit_when_none}


# -- both endpoints ---------------------------------------------------------------------
class ErrorMessage(ServerMessage):
    """`error`: `message` always; `code`, `request_id`, `event_id` and extras (e.g. `retry_after_s`) when known."""

    type: Literal["error"] = "error"
    message: StrictStr
    code: StrictStr | None = None
    request_id: StrictStr | None = None
    event_id: StrictStr | StrictInt | None = None

    def wire(self) -> dict[str, Any]:
        return {k: v for k, v in self.model_dump(mode="json").items() if v is not None}


# -- /v1/realtime/video -------------------------------------------------------------------
class GenerationInfo(BaseModel):
    """`video.start.generation` (ours, additive): what the session runs with, defaults included."""

    model_config = ConfigDict(extra="allow", frozen=True)
    width: Count | None = None
    height: Count | None = None
    fps: Number | None = None
    num_frames: Count | None = None
    num_blocks: Count | None = None
    frames_per_block: Count | None = Field(default=None, gt=0)
    scale_factor_temporal: Count | None = Field(default=None, gt=0)
    pipeline_depth: Count = Field(default=0, ge=0)
    accepts_camera: StrictBool | None = None


class VideoStart(ServerMessage):
    omit_when_none = frozenset({"replica_id", "session_id", "seed", "generation"})

    type: Literal["video.start"] = "video.start"
    request_id: StrictStr
    format: StrictStr = "m4s"
    config: dict[str, Any] = Field(default_factory=dict)
    replica_id: StrictStr | None = None
    session_id: StrictStr | None = None
    seed: Count | None = None
    generation: GenerationInfo | None = None


class ChunkMetadata(ServerMessage):
    """Sent right before each binary frame. `num_frames` is what the block generated (0 on the trailer);
    `fragment_frames` (ours) is what the fragment that follows holds; `frames_ready_at` (ours) is when the
    replica had the block's frames, in Unix seconds, so a client on the same host can time what serving adds;
    `replica_sent_at` and `ingress_received_at` (ours) split that time: encoded (and paced) on the replica,
    then Ray's hop to the ingress, then the ingress, Serve's proxy and the socket."""

    omit_when_none = frozenset({"fragment_frames", "frames_ready_at", "replica_sent_at", "ingress_received_at"})

    type: Literal["video.chunk_metadata"] = "video.chunk_metadata"
    request_id: StrictStr | None = None
    kind: Literal["media", "trailer"]
    num_frames: Count = Field(ge=0)
    byte_length: Count = Field(ge=0)
    transport_chunk_index: Count = Field(ge=0)
    generation_chunk_index: Count | None = None
    started_event_ids: list[StrictStr] = Field(default_factory=list)
    active_event_ids: list[StrictStr] = Field(default_factory=list)
    completed_event_ids: list[StrictStr] = Field(default_factory=list)
    fragment_frames: Count | None = Field(default=None, ge=0)
    frames_ready_at: Number | None = None
    replica_sent_at: Number | None = None
    ingress_received_at: Number | None = None


class InteractionQueued(ServerMessage):
    type: Literal["session.interaction.queued"] = "session.interaction.queued"
    request_id: StrictStr | None = None
    event_id: StrictStr


class VideoSessionDone(ServerMessage):
    type: Literal["session.done"] = "session.done"
    request_id: StrictStr | None = None
    chunks: Count = Field(ge=0)
    stopped: StrictBool


class VideoPong(ServerMessage):
    type: Literal["session.pong"] = "session.pong"


# -- /v1/video/chat/stream ----------------------------------------------------------------
class ResponseStart(ServerMessage):
    """`{"type": "response.start"}` is all the seed sends; `response_id` and extras are ours."""

    omit_when_none = frozenset({"response_id"})

    type: Literal["response.start"] = "response.start"
    response_id: StrictStr | None = None


class TextDelta(ServerMessage):
    type: Literal["response.text.delta"] = "response.text.delta"
    delta: StrictStr


class TextDone(ServerMessage):
    """Always sent after response.start, also when the query failed (then with the text so far)."""

    type: Literal["response.text.done"] = "response.text.done"
    text: StrictStr


class EvsStats(ServerMessage):
    type: Literal["response.evs_stats"] = "response.evs_stats"
    retained_count: Count = Field(ge=0)
    dropped_count: Count = Field(ge=0)
    total_count: Count = Field(ge=0)
    drop_rate: Number


class FrameAck(ServerMessage):
    """`video.frame.ack`, only for frames that carry a `frame_id`; `reason` when not accepted."""

    omit_when_none = frozenset({"reason", "dropped_frame_id"})

    type: Literal["video.frame.ack"] = "video.frame.ack"
    frame_id: StrictStr | StrictInt
    pts_ms: Number | None = None
    accepted: StrictBool
    buffered_frames: Count = Field(ge=0)
    reason: StrictStr | None = None
    dropped_frame_id: StrictStr | StrictInt | None = None


class ChatSessionDone(ServerMessage):
    type: Literal["session.done"] = "session.done"


class ChatPong(ServerMessage):
    type: Literal["pong"] = "pong"


VIDEO_MESSAGES: dict[str, type[ServerMessage]] = {
    m.model_fields["type"].default: m for m in (VideoStart, ChunkMetadata, InteractionQueued, VideoSessionDone, VideoPong, ErrorMessage)
}
CHAT_MESSAGES: dict[str, type[ServerMessage]] = {
    m.model_fields["type"].default: m
    for m in (ResponseStart, TextDelta, TextDone, EvsStats, FrameAck, ChatSessionDone, ChatPong, ErrorMessage)
}


class MalformedMessage(ValueError):
    """A server message of a known type whose fields break the contract; the text names them."""


def read_message(data: dict[str, Any], messages: dict[str, type[ServerMessage]]) -> ServerMessage | None:
    """A received JSON object as its model (None for a type this endpoint's contract does not name)."""
    model = messages.get(data.get("type")) if isinstance(data.get("type"), str) else None
    if model is None:
        return None
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(str(p) for p in e['loc']) or 'message'}: {e['msg']}" for e in exc.errors()[:5])
        raise MalformedMessage(f"{data['type']} breaks the contract ({problems})") from None
