"""The built-in world model: trained by `rtv train-world` on the procedural world, shipped as weights.

`BUILTIN_SPEC` is its architecture; `deployments/models/weights/world/` holds
its trained weights (fp16 safetensors) and the VAE's latent statistics.
`install_builtin_world_models` writes the text-to-video and image-to-video
checkpoint folders from them, in the same diffusers layout as every other
world model, through the same builder as the random-weight ones.

One transformer is trained, with the last-frame condition
(`deployments/generation/conditioning.py`): every block is given the last
frame before it, and the first block the start image when there is one (half
the training samples have none). The text-to-video and image-to-video models
are the same weights; only whether a start image is required differs.
"""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path

import torch

from deployments.models.shipped import load_float, save_fp16
from deployments.models.tiny_world_model import WorldModelSpec, build_world_model
from deployments.training.world import EYE_HEIGHT

WEIGHTS_DIR = Path(__file__).parent / "weights" / "world"
COMPONENTS = ("transformer", "vae", "text_encoder", "camera_adapter")
TINY_DECODER = "tiny_decoder"  # optional: shipped when trained

# Tokens of 2x2 latent pixels (64 per latent frame at 64x64): the first run's 4x4 tokens held more
# values than the model was wide. The window is two blocks, so that one training sequence (sink block,
# window, current block: 4 blocks) is exactly what the engine's cache holds once it is full.
BUILTIN_SPEC = WorldModelSpec(
    last_frame_condition=True,
    last_frame_reprojection=EYE_HEIGHT,
    sliding_window_num_frames=6,
    num_layers=4,
    num_attention_heads=4,
    attention_head_dim=48,
    ffn_dim=768,
    freq_dim=64,
    patch_size=(1, 2, 2),
    flow_shift=1.0,
    denoising_step_list=(1000.0,),
    vae_base_dim=16,
    vae_dim_mult=(1, 2, 4),
    vae_temporal_downsample=(True, True),
    vae_num_res_blocks=1,
    tiny_decoder_widths=None,  # the shipped spec.json names it when a trained one ships
    text_max_length=96,
    camera_rest_relative=True,
    camera_gain=5.0,
    camera_position_bands=4,  # weights that predate the code say so in their spec.json (load_shipped)
)

README = """# Built-in world model (trained)

Trained by `rtv train-world` on the project's procedural world
(`deployments/training/world.py`): a camera over a textured ground with
landmarks, biomes chosen by the prompt (meadow, desert, snow, shore, forest,
lava, city). Keys move the camera (w/s forward/back, a/d strafe, j/l yaw,
i/k pitch); prompts pick the biome. 64x64, 16 fps.
"""


def weights_available(weights_dir: str | os.PathLike = WEIGHTS_DIR) -> bool:
    root = Path(weights_dir)
    return all((root / f"{name}.safetensors").is_file() for name in COMPONENTS) and (root / "spec.json").is_file()


def load_shipped(weights_dir: str | os.PathLike = WEIGHTS_DIR) -> tuple[WorldModelSpec, dict[str, dict[str, torch.Tensor]]]:
    root = Path(weights_dir)
    extra = json.loads((root / "spec.json").read_text())
    widths = extra.get("tiny_decoder_widths")
    spec = replace(BUILTIN_SPEC, vae_latents_mean=tuple(extra["vae_latents_mean"]), vae_latents_std=tuple(extra["vae_latents_std"]),
                   tiny_decoder_widths=None if widths is None else tuple(widths),
                   camera_position_bands=extra.get("camera_position_bands", 0))
    names = COMPONENTS + ((TINY_DECODER,) if widths is not None else ())
    weights = {name: load_float(root / f"{name}.safetensors") for name in names}
    return spec, weights


def save_shipped(weights: dict[str, dict[str, torch.Tensor]], latents_mean: list[float], latents_std: list[float],
                 weights_dir: str | os.PathLike = WEIGHTS_DIR, tiny_decoder_widths: tuple[int, ...] | None = None,
                 camera_position_bands: int = 0) -> Path:
    """Write trained state dicts as the shipped fp16 files (the VAE's too: its outputs are 8-bit frames), and
    the tiny streaming decoder's when `weights` has one (`tiny_decoder_widths` its sizes); spec.json holds
    what the state dicts alone do not say."""
    root = Path(weights_dir)
    root.mkdir(parents=True, exist_ok=True)
    names = COMPONENTS + ((TINY_DECODER,) if TINY_DECODER in weights else ())
    for name in names:
        save_fp16(weights[name], root / f"{name}.safetensors")
    spec = {"vae_latents_mean": latents_mean, "vae_latents_std": latents_std}
    if TINY_DECODER in weights:
        spec["tiny_decoder_widths"] = list(tiny_decoder_widths)
    if camera_position_bands:
        spec["camera_position_bands"] = camera_position_bands
    (root / "spec.json").write_text(json.dumps(spec, indent=2) + "\n")
    return root


def install_builtin_world_models(out_root: str | os.PathLike, weights_dir: str | os.PathLike = WEIGHTS_DIR) -> dict[str, Path]:
    """Write `world-model` (text-to-video) and `world-model-i2v` under `out_root` from the shipped weights."""
    spec, weights = load_shipped(weights_dir)
    out = Path(out_root)
    i2v = out / "world-model-i2v"
    build_world_model(i2v, replace(spec, image_conditioned=True), readme=README, weights=weights)
    t2v = out / "world-model"
    build_world_model(t2v, replace(spec, image_conditioned=False), readme=README, weights=weights)
    return {"world-model": t2v, "world-model-i2v": i2v}
