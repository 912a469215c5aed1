"""From a validated start to what a WorldModel replica runs: shared by every client of the replicas.

The WebSocket sessions and the video jobs validate the same fields with the
same protocol code; these two functions make sure they also apply the same
defaults and build the same `SessionRequest` from the result.
"""

from __future__ import annotations

import uuid

from deployments.config import AppConfig
from deployments.generation.interactions import Interaction
from deployments.protocol import video
from deployments.world_model.messages import SessionRequest
from deployments.world_model.pacing import PacingSettings


ACTION_SCRIPT_EVENT_ID = "camera_action_script"  # how the script's progress shows in chunk metadata


def generation_defaults(config: AppConfig, model_info: dict) -> video.GenerationDefaults:
    """What a session gets when it does not ask, and what the served model can do (`model_info` from the replica)."""
    return video.GenerationDefaults(
        width=config.width,
        height=config.height,
        fps=config.fps,
        num_inference_steps=config.num_inference_steps,
        max_session_seconds=config.max_session_seconds,
        frames_per_block=model_info["frames_per_block"],
        temporal_factor=model_info["temporal_factor"],
        size_multiple=model_info["size_multiple"],
        image_conditioned=model_info["image_conditioned"],
        accepts_camera=model_info.get("accepts_camera"),
    )


def session_request(resolved: video.ResolvedStart, pacing: PacingSettings | None = None) -> SessionRequest:
    """A fresh session (new id) running what `resolved` asks for."""
    return SessionRequest(
        session_id=uuid.uuid4().hex,
        prompt=resolved.prompt,
        height=resolved.height,
        width=resolved.width,
        fps=resolved.fps,
        seed=resolved.seed,
        num_blocks=resolved.num_blocks,
        num_inference_steps=resolved.num_inference_steps,
        flow_shift=resolved.flow_shift,
        image=resolved.image,
        pacing=pacing,
        codec_options=resolved.codec_options,
        # Submitted before block 0, so the script plays from the first frame.
        interactions=() if resolved.action_script is None else (Interaction(event_id=ACTION_SCRIPT_EVENT_ID, actions=resolved.action_script),),
    )
