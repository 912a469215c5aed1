"""Tiny random-weight causal world models in the diffusers on-disk layout.

No machine here reaches a model hub, so the project writes its own checkpoints:
a stock `WanPipeline` (or `WanImageToVideoPipeline`) saved with
`save_pretrained`, whose transformer config also carries the autoregressive
keys a causal Wan needs, plus a `camera_adapter/` folder. The engine loads them
with the same `from_pretrained` calls that load a real checkpoint.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import torch

from deployments.models.tokenizer import build_byte_tokenizer, vocab_size

README = """# Tiny random-weight causal world model

Built by `rtv make-models` for tests and laptop demos. Its weights are random:
it makes noise-like video. Point the server at a real causal Wan checkpoint
(same layout) for real video.
"""


@dataclass(frozen=True)
class TinyWorldModelSpec:
    """Sizes of the tiny model; AR keys are the ones a real causal checkpoint carries."""

    image_conditioned: bool = False
    camera_adapter: bool = True
    num_frames_per_block: int = 3
    sink_size: int = 3
    sliding_window_num_frames: int = 12
    num_layers: int = 2
    num_attention_heads: int = 2
    attention_head_dim: int = 12
    text_dim: int = 32
    flow_shift: float = 5.0
    vae_base_dim: int = 3


def make_world_model(out_dir: str | os.PathLike, spec: TinyWorldModelSpec = TinyWorldModelSpec(), seed: int = 0) -> Path:
    """Write a tiny causal world model to `out_dir`, deterministically from `seed`."""
    from diffusers import (
        AutoencoderKLWan,
        FlowMatchEulerDiscreteScheduler,
        WanImageToVideoPipeline,
        WanPipeline,
        WanTransformer3DModel,
    )
    from transformers import AutoTokenizer, UMT5Config, UMT5EncoderModel

    from deployments.generation.camera_adapter import CameraAdapter

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)

    build_byte_tokenizer(out / "tokenizer")
    tokenizer = AutoTokenizer.from_pretrained(out / "tokenizer")
    text_encoder = UMT5EncoderModel(
        UMT5Config(
            vocab_size=vocab_size(),
            d_model=spec.text_dim,
            d_kv=8,
            d_ff=64,
            num_layers=2,
            num_heads=4,
            relative_attention_num_buckets=32,
            relative_attention_max_distance=128,
            pad_token_id=tokenizer.pad_token_id,
            eos_token_id=tokenizer.eos_token_id,
            decoder_start_token_id=tokenizer.pad_token_id,
        )
    ).eval()
    z_dim = 16
    inner_dim = spec.num_attention_heads * spec.attention_head_dim
    transformer = WanTransformer3DModel(
        patch_size=(1, 2, 2),
        num_attention_heads=spec.num_attention_heads,
        attention_head_dim=spec.attention_head_dim,
        in_channels=z_dim + (4 + z_dim if spec.image_conditioned else 0),
        out_channels=z_dim,
        text_dim=spec.text_dim,
        freq_dim=32,
        ffn_dim=32,
        num_layers=spec.num_layers,
        cross_attn_norm=True,
        qk_norm="rms_norm_across_heads",
        rope_max_seq_len=1024,
    ).eval()
    transformer.register_to_config(
        num_frames_per_block=spec.num_frames_per_block,
        sink_size=spec.sink_size,
        sliding_window_num_frames=spec.sliding_window_num_frames,
    )
    vae = AutoencoderKLWan(
        base_dim=spec.vae_base_dim,
        z_dim=z_dim,
        dim_mult=[1, 1, 1, 1],
        num_res_blocks=1,
        temperal_downsample=[False, True, True],
    ).eval()
    scheduler = FlowMatchEulerDiscreteScheduler(shift=spec.flow_shift)
    pipeline_cls = WanImageToVideoPipeline if spec.image_conditioned else WanPipeline
    pipeline = pipeline_cls(tokenizer=tokenizer, text_encoder=text_encoder, transformer=transformer, vae=vae, scheduler=scheduler)
    pipeline.save_pretrained(out, safe_serialization=True)

    if spec.camera_adapter:
        adapter = CameraAdapter(inner_dim=inner_dim, spatial_factor=vae.config.scale_factor_spatial, patch_size=(1, 2, 2))
        adapter.save_pretrained(out / "camera_adapter", safe_serialization=True)
    (out / "README.md").write_text(README)
    return out


def make_models(out_dir: str | os.PathLike, seed: int = 0) -> dict[str, Path]:
    """All tiny built-in checkpoints the server and tests use, under one folder."""
    from deployments.models.tiny_vlm import make_tiny_vlm

    out = Path(out_dir)
    return {
        "world-model": make_world_model(out / "world-model", TinyWorldModelSpec(), seed=seed),
        "world-model-i2v": make_world_model(out / "world-model-i2v", TinyWorldModelSpec(image_conditioned=True), seed=seed),
        "omni": make_tiny_vlm(out / "omni", seed=seed),
    }
