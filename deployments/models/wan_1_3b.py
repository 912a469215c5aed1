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
from dataclasses import dataclass, field
from pathlib import Path

import torch

from deployments.models.tokenizer import build_byte_tokenizer, vocab_size

README = """# Wan2.1-1.3B-architecture causal world model, random weights

Built by `bench/gpu_bench.py` to time the real model class on a GPU. Its
weights are random (the video is noise); the text encoder is a 2-layer UMT5 of
UMT5-XXL's width.
"""


@dataclass(frozen=True)
class WanArchSpec:
    """Sizes of a Wan2.1 causal world model; the defaults are Wan2.1-T2V-1.3B's."""

    num_layers: int = 30
    num_attention_heads: int = 12
    attention_head_dim: int = 128
    ffn_dim: int = 8960
    freq_dim: int = 256
    text_dim: int = 4096  # UMT5-XXL's d_model
    text_layers: int = 2  # UMT5-XXL has 24; it runs once per prompt
    text_heads: int = 64
    text_d_kv: int = 64
    text_d_ff: int = 10240
    vae_base_dim: int = 96
    vae_dim_mult: tuple[int, ...] = (1, 2, 4, 4)
    vae_num_res_blocks: int = 2
    num_frames_per_block: int = 3
    sink_size: int = 3
    sliding_window_num_frames: int = 12
    flow_shift: float = 5.0
    denoising_step_list: tuple[float, ...] = field(default=(1000.0, 750.0, 500.0, 250.0))
    camera_adapter: bool = True

    @property
    def inner_dim(self) -> int:
        return self.num_attention_heads * self.attention_head_dim


WAN_1_3B = WanArchSpec()

# The same builder at toy sizes: for checking the benchmark end to end on a CPU.
SMALL = WanArchSpec(
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


def parameter_count(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def _cast(module: torch.nn.Module, dtype: torch.dtype) -> None:
    """Cast floating weights to `dtype`, leaving the modules the class keeps in float32 (as a real release does)."""
    keep = getattr(module, "_keep_in_fp32_modules", None) or []
    for name, param in module.named_parameters():
        if param.is_floating_point() and not any(part in keep for part in name.split(".")):
            param.data = param.data.to(dtype)


def make_wan_world_model(
    out_dir: str | os.PathLike,
    spec: WanArchSpec = WAN_1_3B,
    *,
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.bfloat16,
    seed: int = 0,
) -> dict:
    """Write the checkpoint to `out_dir`; return what was built (parameter counts).

    Weights are made on `device` (a GPU makes 1.3B random weights in well
    under a second) and saved in `dtype`, except the VAE, which is saved in
    float32 as Wan ships it.
    """
    from diffusers import (
        AutoencoderKLWan,
        FlowMatchEulerDiscreteScheduler,
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
    z_dim = 16
    with torch.device(device):
        text_encoder = UMT5EncoderModel(
            UMT5Config(
                vocab_size=vocab_size(),
                d_model=spec.text_dim,
                d_kv=spec.text_d_kv,
                d_ff=spec.text_d_ff,
                num_layers=spec.text_layers,
                num_heads=spec.text_heads,
                feed_forward_proj="gated-gelu",
                relative_attention_num_buckets=32,
                relative_attention_max_distance=128,
                pad_token_id=tokenizer.pad_token_id,
                eos_token_id=tokenizer.eos_token_id,
                decoder_start_token_id=tokenizer.pad_token_id,
            )
        ).eval()
        transformer = WanTransformer3DModel(
            patch_size=(1, 2, 2),
            num_attention_heads=spec.num_attention_heads,
            attention_head_dim=spec.attention_head_dim,
            in_channels=z_dim,
            out_channels=z_dim,
            text_dim=spec.text_dim,
            freq_dim=spec.freq_dim,
            ffn_dim=spec.ffn_dim,
            num_layers=spec.num_layers,
            cross_attn_norm=True,
            qk_norm="rms_norm_across_heads",
            eps=1e-6,
            rope_max_seq_len=1024,
        ).eval()
        vae = AutoencoderKLWan(
            base_dim=spec.vae_base_dim,
            z_dim=z_dim,
            dim_mult=list(spec.vae_dim_mult),
            num_res_blocks=spec.vae_num_res_blocks,
            temperal_downsample=[False, True, True],
        ).eval()
        adapter = None
        if spec.camera_adapter:
            adapter = CameraAdapter(
                inner_dim=spec.inner_dim, spatial_factor=vae.config.scale_factor_spatial, patch_size=(1, 2, 2)
            ).eval()
    transformer.register_to_config(
        num_frames_per_block=spec.num_frames_per_block,
        sink_size=spec.sink_size,
        sliding_window_num_frames=spec.sliding_window_num_frames,
    )
    counts = {
        "transformer": parameter_count(transformer),
        "vae": parameter_count(vae),
        "text_encoder": parameter_count(text_encoder),
        "camera_adapter": parameter_count(adapter) if adapter is not None else 0,
    }
    _cast(transformer, dtype)
    _cast(text_encoder, dtype)
    scheduler = FlowMatchEulerDiscreteScheduler(shift=spec.flow_shift)
    scheduler.register_to_config(denoising_step_list=list(spec.denoising_step_list))
    pipeline = WanPipeline(tokenizer=tokenizer, text_encoder=text_encoder, transformer=transformer, vae=vae, scheduler=scheduler)
    pipeline.save_pretrained(out, safe_serialization=True)
    if adapter is not None:
        _cast(adapter, dtype)
        adapter.save_pretrained(out / "camera_adapter", safe_serialization=True)
    (out / "README.md").write_text(README)
    return counts
