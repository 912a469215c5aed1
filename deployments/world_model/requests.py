"""The defaults a session start is resolved against: shared by every client of the WorldModel replicas.

The WebSocket sessions and the video jobs validate the same fields with the
same protocol code (`protocol.video.resolve_generation`, which makes the
`SessionSpec` a replica runs); this makes sure they also apply the same defaults.
"""

from __future__ import annotations

from deployments.config import AppConfig
from deployments.protocol import video


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
