"""Tiny random-weight causal world models in the diffusers on-disk layout.

No machine here reaches a model hub, so the project writes its own checkpoints:
a stock `WanPipeline` (or `WanImageToVideoPipeline`) saved with
`save_pretrained`, whose transformer config also carries the autoregressive
keys a causal Wan needs, plus a `camera_adapter/` folder. The engine loads them
with the same `from_pretrained` calls that load a real checkpoint.
"""

from __future__ import annotations

import dataclasses

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
class WorldModelSpec:
    """Sizes of a causal Wan world model; the defaults are the tiny built-in one's.

    AR keys are the ones a real causal checkpoint carries. `deployments/models/wan_1_3b.py` holds
    Wan2.1-T2V-1.3B's sizes for GPU benchmarks, built by the same function.
    """

    image_conditioned: bool = False  # a start image is required
    # Every block carries the last frame before it in the condition channels (conditioning.py); then
    # `image_conditioned` only says whether the start image is required or refused.
    last_frame_condition: bool = False
    # The ground's depth below the start pose: the last frame is warped to each frame's pose (reprojection.py).
    last_frame_reprojection: float | None = None
    camera_adapter: bool = True
    num_frames_per_block: int = 3
    sink_size: int = 3
    sliding_window_num_frames: int = 12
    num_layers: int = 2
    num_attention_heads: int = 2
    attention_head_dim: int = 12
    ffn_dim: int = 32
    freq_dim: int = 32
    text_dim: int = 32
    text_layers: int = 2
    text_heads: int = 4
    text_d_kv: int = 8
    text_d_ff: int = 64
    flow_shift: float = 5.0
    denoising_step_list: tuple[float, ...] | None = None  # a distilled model's few timesteps, in its scheduler config
    vae_base_dim: int = 3
    vae_dim_mult: tuple[int, ...] = (1, 1, 1, 1)
    vae_num_res_blocks: int = 1
    # Which of the VAE's downsamples also halve time (one fewer than dim_mult); Wan's own: (False, True, True).
    vae_temporal_downsample: tuple[bool, ...] = (False, True, True)
    vae_latents_mean: tuple[float, ...] | None = None  # None: Wan2.1's statistics (diffusers' defaults)
    vae_latents_std: tuple[float, ...] | None = None
    patch_size: tuple[int, int, int] = (1, 2, 2)
    text_max_length: int = 512  # the tokenizer's model_max_length: text states per prompt
    camera_rest_relative: bool = False  # the adapter sees motion relative to a camera at rest (see CameraAdapter)
    camera_gain: float = 1.0
    camera_position_bands: int = 0  # the adapter's absolute position code (see CameraAdapter); 0: none
    # Channel widths of the tiny streaming decoder written beside the VAE (tiny_decoder/, random weights
    # unless trained ones are given); None: none. The published taew2_1's are (256, 128, 64, 64).
    tiny_decoder_widths: tuple[int, int, int, int] | None = (16, 16, 8, 8)

    @property
    def inner_dim(self) -> int:
        return self.num_attention_heads * self.attention_head_dim

    @property
    def latent_channels(self) -> int:
        return 16

    @property
    def in_channels(self) -> int:
        # Wan image-to-video: noise latent + 4 mask channels + image latent.
        z = self.latent_channels
        return z + (4 + z if self.image_conditioned or self.last_frame_condition else 0)


def make_vae(spec: WorldModelSpec):
    """The spec's video VAE with fresh weights (the training of the built-in model starts from this too)."""
    from diffusers import AutoencoderKLWan

    downsamples = len(spec.vae_dim_mult) - 1
    if len(spec.vae_temporal_downsample) != downsamples:
        raise ValueError("vae_temporal_downsample needs one entry per downsample (len(vae_dim_mult) - 1)")
    stats = {}
    if spec.vae_latents_mean is not None:
        stats = {"latents_mean": list(spec.vae_latents_mean), "latents_std": list(spec.vae_latents_std)}
    return AutoencoderKLWan(
        base_dim=spec.vae_base_dim,
        z_dim=spec.latent_channels,
        dim_mult=list(spec.vae_dim_mult),
        num_res_blocks=spec.vae_num_res_blocks,
        temperal_downsample=list(spec.vae_temporal_downsample),
        scale_factor_temporal=2 ** sum(spec.vae_temporal_downsample),
        scale_factor_spatial=2**downsamples,
        **stats,
    )


def make_tiny_decoder(spec: WorldModelSpec, seed: int = 0):
    """The spec's tiny streaming decoder, fresh, matching the VAE's factors."""
    from deployments.generation.tiny_decoder import TinyDecoderConfig, TinyVideoDecoder

    config = TinyDecoderConfig.for_vae(spec.latent_channels, 2 ** (len(spec.vae_dim_mult) - 1), 2 ** sum(spec.vae_temporal_downsample),
                                       spec.tiny_decoder_widths)
    with torch.random.fork_rng(devices=[]):  # its own stream: the other components' weights stay as they were
        torch.manual_seed(seed)
        return TinyVideoDecoder(config).eval()


def make_world_model(out_dir: str | os.PathLike, spec: WorldModelSpec = WorldModelSpec(), seed: int = 0) -> Path:
    """Write a tiny causal world model to `out_dir`, deterministically from `seed`."""
    build_world_model(out_dir, spec, seed=seed)
    return Path(out_dir)


def build_world_model(
    out_dir: str | os.PathLike,
    spec: WorldModelSpec,
    *,
    seed: int = 0,
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.float32,
    readme: str = README,
    weights: dict[str, dict[str, torch.Tensor]] | None = None,
) -> dict[str, int]:
    """Write the checkpoint; returns each component's parameter count.

    Weights are made on `device` (a GPU makes a billion random weights in well under a second) and
    saved in `dtype`, except the VAE, saved in float32 as Wan ships it, and the modules diffusers
    keeps in float32. `weights` replaces the random ones of the components it names (`transformer`,
    `vae`, `text_encoder`, `camera_adapter`) with trained state dicts, loaded strictly.
    """
    from diffusers import (
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

    build_byte_tokenizer(out / "tokenizer", model_max_length=spec.text_max_length)
    tokenizer = AutoTokenizer.from_pretrained(out / "tokenizer")
    z_dim = spec.latent_channels
    with torch.device(device):
        text_encoder = UMT5EncoderModel(
            UMT5Config(
                vocab_size=vocab_size(),
                d_model=spec.text_dim,
                d_kv=spec.text_d_kv,
                d_ff=spec.text_d_ff,
                num_layers=spec.text_layers,
                num_heads=spec.text_heads,
                relative_attention_num_buckets=32,
                relative_attention_max_distance=128,
                pad_token_id=tokenizer.pad_token_id,
                eos_token_id=tokenizer.eos_token_id,
                decoder_start_token_id=tokenizer.pad_token_id,
            )
        ).eval()
        transformer = WanTransformer3DModel(
            patch_size=tuple(spec.patch_size),
            num_attention_heads=spec.num_attention_heads,
            attention_head_dim=spec.attention_head_dim,
            in_channels=spec.in_channels,
            out_channels=z_dim,
            text_dim=spec.text_dim,
            freq_dim=spec.freq_dim,
            ffn_dim=spec.ffn_dim,
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
        if spec.last_frame_condition:
            transformer.register_to_config(last_frame_condition=True, start_image=spec.image_conditioned)
        if spec.last_frame_reprojection is not None:
            transformer.register_to_config(last_frame_reprojection=spec.last_frame_reprojection)
        vae = make_vae(spec).eval()
    trained = weights or {}
    for name, module in (("transformer", transformer), ("vae", vae), ("text_encoder", text_encoder)):
        if name in trained:
            module.load_state_dict(trained[name], strict=True)
    counts = {"transformer": _parameters(transformer), "vae": _parameters(vae), "text_encoder": _parameters(text_encoder)}
    _cast(transformer, dtype)
    _cast(text_encoder, dtype)
    scheduler = FlowMatchEulerDiscreteScheduler(shift=spec.flow_shift)
    if spec.denoising_step_list is not None:
        scheduler.register_to_config(denoising_step_list=list(spec.denoising_step_list))
    pipeline_cls = WanImageToVideoPipeline if spec.image_conditioned else WanPipeline
    pipeline = pipeline_cls(tokenizer=tokenizer, text_encoder=text_encoder, transformer=transformer, vae=vae, scheduler=scheduler)
    pipeline.save_pretrained(out, safe_serialization=True)

    counts["camera_adapter"] = 0
    if spec.camera_adapter:
        with torch.device(device):
            adapter = CameraAdapter(
                inner_dim=spec.inner_dim,
                spatial_factor=vae.config.scale_factor_spatial,
                patch_size=tuple(spec.patch_size),
                **({"rest_relative": True, "gain": spec.camera_gain} if spec.camera_rest_relative else {}),
                **({"position_bands": spec.camera_position_bands} if spec.camera_position_bands else {}),
            )
        if "camera_adapter" in trained:
            load_adapter_weights(adapter, trained["camera_adapter"])
        counts["camera_adapter"] = _parameters(adapter)
        _cast(adapter, dtype)
        adapter.save_pretrained(out / "camera_adapter", safe_serialization=True)
    if spec.tiny_decoder_widths is not None:
        decoder = make_tiny_decoder(spec, seed)
        if "tiny_decoder" in trained:
            decoder.load_state_dict(trained["tiny_decoder"], strict=True)
            decoder.config = dataclasses.replace(decoder.config, trained=True)  # `video_decoder: auto` picks it
        counts["tiny_decoder"] = _parameters(decoder)
        decoder.to(dtype).save_pretrained(out / "tiny_decoder")
    (out / "README.md").write_text(readme)
    return counts


def load_adapter_weights(adapter, state: dict[str, torch.Tensor]) -> None:
    """Load a camera adapter's weights; weights trained before its position code leave that projection at
    its zero start (the function they were trained as), anything else missing or extra is refused."""
    missing, unexpected = adapter.load_state_dict(state, strict=False)
    missing = [k for k in missing if not k.startswith("proj_position.")]
    if missing or unexpected:
        raise ValueError(f"camera adapter weights do not fit the spec: missing {missing}, unexpected {unexpected}")


def _parameters(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def _cast(module: torch.nn.Module, dtype: torch.dtype) -> None:
    """Cast floating weights to `dtype`, leaving the modules the class keeps in float32 (as a real release does)."""
    if dtype == torch.float32:
        return
    keep = getattr(module, "_keep_in_fp32_modules", None) or []
    for name, param in module.named_parameters():
        if param.is_floating_point() and not keeps_fp32(name, keep):
            param.data = param.data.to(dtype)


def keeps_fp32(name: str, keep: list[str] | tuple[str, ...]) -> bool:
    """Whether a parameter belongs to a module diffusers keeps in float32 whatever the model's dtype."""
    return any(part in keep for part in name.split("."))


def make_models(out_dir: str | os.PathLike, seed: int = 0, trained: bool = True) -> dict[str, Path]:
    """The built-in checkpoints the server serves by default, under one folder.

    Each model is the trained built-in one (`builtin_world_model`, `builtin_omni_model`) when its weights
    ship with this checkout and `trained` is set; otherwise a tiny random-weight one from `seed`."""
    from deployments.models import builtin_omni_model, builtin_world_model
    from deployments.models.tiny_vlm import make_tiny_vlm

    out = Path(out_dir)
    if trained and builtin_world_model.weights_available():
        world = builtin_world_model.install_builtin_world_models(out)
    else:
        world = {
            "world-model": make_world_model(out / "world-model", WorldModelSpec(), seed=seed),
            "world-model-i2v": make_world_model(out / "world-model-i2v", WorldModelSpec(image_conditioned=True), seed=seed),
        }
    if trained and builtin_omni_model.weights_available():
        return world | {"omni": builtin_omni_model.install_builtin_omni(out / "omni")}
    return world | {"omni": make_tiny_vlm(out / "omni", seed=seed)}
