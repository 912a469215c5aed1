"""The autoregressive geometry of a causal world model, read off its configs."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from deployments.contract.timeline import frames_for_blocks, frames_in_block

AR_KEYS = ("num_frames_per_block", "sink_size", "sliding_window_num_frames")
VAE_KEYS = ("scale_factor_temporal", "scale_factor_spatial")
# What `AutoencoderKLWan` itself assumes when a (stock, older) config does not say.
WAN_VAE_SCALE_FACTORS = {"scale_factor_temporal": 4, "scale_factor_spatial": 8}
IMPORT_HINT = (
    "a published causal checkpoint (Self-Forcing, CausVid, ...) or a stock Wan base becomes one with "
    "`rtv import-checkpoint --weights FILE --base DIR --output DIR --frames-per-block N --sink-size N --window-frames N`"
)


class CheckpointError(ValueError):
    """A checkpoint folder that cannot serve as a causal world model."""


@dataclass(frozen=True)
class ARGeometry:
    num_frames_per_block: int
    sink_size: int
    sliding_window_num_frames: int
    scale_factor_temporal: int
    scale_factor_spatial: int
    patch_size: tuple[int, int, int]
    rope_max_seq_len: int

    @property
    def size_multiple(self) -> int:
        """Height and width must be multiples of this (VAE stride x patch)."""
        return self.scale_factor_spatial * max(self.patch_size[1], self.patch_size[2])

    @property
    def context_frames(self) -> int:
        """Latent frames a block can attend to besides itself."""
        return self.sink_size + self.sliding_window_num_frames

    @property
    def first_full_context_block(self) -> int:
        """Index of the first block whose attention context (sink + window) is full: from it on every
        block attends to the same number of frames."""
        return -(-self.context_frames // self.num_frames_per_block)

    def frames_in_block(self, block_index: int) -> int:
        return frames_in_block(block_index, self.num_frames_per_block, self.scale_factor_temporal)

    def frames_for_blocks(self, blocks: int) -> int:
        return frames_for_blocks(blocks, self.num_frames_per_block, self.scale_factor_temporal)

    def latent_size(self, height: int, width: int) -> tuple[int, int]:
        return height // self.scale_factor_spatial, width // self.scale_factor_spatial

    def tokens_per_frame(self, height: int, width: int) -> int:
        lh, lw = self.latent_size(height, width)
        return (lh // self.patch_size[1]) * (lw // self.patch_size[2])

    def check_size(self, height: int, width: int) -> None:
        m = self.size_multiple
        for name, value in (("height", height), ("width", width)):
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0 or value % m:
                raise ValueError(f"{name} must be a positive multiple of {m}, got {value!r}")


def _read_json(path: Path) -> dict:
    if not path.is_file():
        raise CheckpointError(f"{path} is missing: not a diffusers-layout world model checkpoint")
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise CheckpointError(f"{path} is not valid JSON: {exc}") from exc


def read_geometry(checkpoint: str | Path) -> ARGeometry:
    """Read the AR geometry; refuse a checkpoint that lacks it, naming what is missing."""
    root = Path(checkpoint)
    transformer = _read_json(root / "transformer" / "config.json")
    vae = _read_json(root / "vae" / "config.json")
    missing = [f"transformer/config.json:{k}" for k in AR_KEYS if transformer.get(k) is None]
    if missing:
        raise CheckpointError(f"{root} is not a causal (autoregressive) world model: missing {', '.join(missing)}; {IMPORT_HINT}")
    values = {k: transformer[k] for k in AR_KEYS} | {k: vae.get(k, WAN_VAE_SCALE_FACTORS[k]) for k in VAE_KEYS}
    bad = [f"{k}={v!r}" for k, v in values.items() if isinstance(v, bool) or not isinstance(v, int) or v < 0]
    if bad or values["num_frames_per_block"] < 1 or values["scale_factor_temporal"] < 1:
        raise CheckpointError(f"{root}: AR geometry must be non-negative integers (block >= 1): {', '.join(bad) or values}")
    geometry = ARGeometry(
        **values,
        patch_size=tuple(transformer.get("patch_size", (1, 2, 2))),
        rope_max_seq_len=int(transformer.get("rope_max_seq_len", 1024)),
    )
    if geometry.patch_size[0] != 1:
        raise CheckpointError(f"{root}: temporal patch size {geometry.patch_size[0]} is not supported (need 1)")
    if geometry.context_frames + geometry.num_frames_per_block > geometry.rope_max_seq_len:
        raise CheckpointError(f"{root}: sink + window + block exceeds rope_max_seq_len {geometry.rope_max_seq_len}")
    return geometry


@dataclass(frozen=True)
class ModelTraits:
    """What a session may ask of a checkpoint, read off its configs without loading weights."""

    image_conditioned: bool  # a start image is required (and without it, refused)
    camera_adapter: bool
    latent_channels: int
    last_frame_condition: bool = False  # see deployments/generation/conditioning.py
    reprojection_ground_depth: float | None = None  # see deployments/generation/reprojection.py


def read_traits(checkpoint: str | Path) -> ModelTraits:
    root = Path(checkpoint)
    transformer = _read_json(root / "transformer" / "config.json")
    z_dim = _read_json(root / "vae" / "config.json").get("z_dim", 16)
    in_channels = transformer.get("in_channels", z_dim)
    # Wan image-to-video: noise latent + 4 mask channels + image latent.
    if in_channels not in (z_dim, 2 * z_dim + 4):
        raise CheckpointError(
            f"{root}: transformer in_channels {in_channels} fits neither text-to-video ({z_dim}) nor image-to-video ({2 * z_dim + 4})"
        )
    if transformer.get("added_kv_proj_dim") is not None or transformer.get("image_dim") is not None:
        raise CheckpointError(f"{root}: CLIP image-context checkpoints are not supported; image conditioning goes through latent channels")
    last_frame = transformer.get("last_frame_condition", False)
    if not isinstance(last_frame, bool) or not isinstance(transformer.get("start_image", False), bool):
        raise CheckpointError(f"{root}: transformer config keys last_frame_condition and start_image must be true or false")
    if last_frame and in_channels != 2 * z_dim + 4:
        raise CheckpointError(f"{root}: last_frame_condition needs the image-to-video input channels ({2 * z_dim + 4}), not {in_channels}")
    reprojection = transformer.get("last_frame_reprojection")
    if reprojection is not None:
        if not last_frame:
            raise CheckpointError(f"{root}: last_frame_reprojection needs last_frame_condition")
        if isinstance(reprojection, bool) or not isinstance(reprojection, (int, float)) or not reprojection > 0:
            raise CheckpointError(f"{root}: transformer config key last_frame_reprojection must be the ground's depth below the start pose (a positive number), not {reprojection!r}")
    # A last-frame model always has the condition channels; whether it takes a start image is its own key.
    image_conditioned = transformer.get("start_image", False) if last_frame else in_channels != z_dim
    return ModelTraits(image_conditioned, (root / "camera_adapter").is_dir(), z_dim, last_frame,
                       None if reprojection is None else float(reprojection))
