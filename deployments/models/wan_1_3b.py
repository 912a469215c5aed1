"""A causal world model with Wan2.1-T2V-1.3B's architecture and random weights, for GPU benchmarks.

Speed does not depend on weight values, so this checkpoint times the real
model class without a download: the transformer is Wan2.1-T2V-1.3B's (dim 1536
= 12 heads x 128, 30 layers, ffn 8960, text_dim 4096, freq_dim 256), the VAE
is the stock Wan2.1 `AutoencoderKLWan` (base_dim 96, 4x temporal and 8x
spatial), and the autoregressive keys are a Self-Forcing-style causal
distill's (3 latent frames per block, 4 steps, sink 3 + window 12 frames).

The one stand-in is the text encoder: UMT5-XXL (5.7B) runs once per prompt,
never per block, so a UMT5 with the real width (d_model 4096, 64 heads x 64,
d_ff 10240) but 2 layers instead of 24, over the byte-level tokenizer, gives
the transformer text states of the real shape. Same on-disk layout as
`tiny_world_model`, loaded by the same `from_pretrained` calls.
"""

from __future__ import annotations

import os
from dataclasses import replace

import torch

from deployments.models.tiny_world_model import WorldModelSpec, build_world_model

README = """# Wan2.1-1.3B-architecture causal world model, random weights

Built by `bench/gpu_bench.py` to time the real model class on a GPU. Its
weights are random (the video is noise); the text encoder is a 2-layer UMT5 of
UMT5-XXL's width.
"""


# Wan2.1-T2V-1.3B's transformer and VAE; a Self-Forcing-style causal distill's AR keys and timesteps.
WAN_1_3B = WorldModelSpec(
    num_layers=30,
    num_attention_heads=12,
    attention_head_dim=128,
    ffn_dim=8960,
    freq_dim=256,
    text_dim=4096,  # UMT5-XXL's d_model
    text_layers=2,  # UMT5-XXL has 24; it runs once per prompt
    text_heads=64,
    text_d_kv=64,
    text_d_ff=10240,
    vae_base_dim=96,
    vae_dim_mult=(1, 2, 4, 4),
    vae_num_res_blocks=2,
    denoising_step_list=(1000.0, 750.0, 500.0, 250.0),
    tiny_decoder_widths=(256, 128, 64, 64),  # the published taew2_1's sizes (random weights: for timing)
)

# The same builder at toy sizes: for checking the benchmark end to end on a CPU.
SMALL = replace(
    WAN_1_3B,
    num_layers=2,
    num_attention_heads=2,
    attention_head_dim=16,
    ffn_dim=64,
    freq_dim=32,
    text_dim=32,
    text_layers=1,
    text_heads=4,
    text_d_kv=8,
    text_d_ff=64,
    vae_base_dim=8,
    vae_dim_mult=(1, 1, 1, 1),
    vae_num_res_blocks=1,
)

SPECS = {"wan-1.3b": WAN_1_3B, "small": SMALL}


def make_wan_world_model(
    out_dir: str | os.PathLike,
    spec: WorldModelSpec = WAN_1_3B,
    *,
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.bfloat16,
    seed: int = 0,
) -> dict:
    """Write the checkpoint to `out_dir` (weights made on `device`, saved in `dtype`, the VAE in float32);
    returns each component's parameter count."""
    return build_world_model(out_dir, spec, seed=seed, device=device, dtype=dtype, readme=README)
