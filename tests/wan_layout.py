"""The original Wan layout and a stock Wan base, made from the tiny world model, for the importer's tests.

`to_original_wan` is written here from Wan2.1's own module names (wan/modules/model.py), the inverse of what
diffusers' converter does, and is deliberately not derived from the importer.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import torch

# diffusers name part -> original Wan name part (Wan2.1's wan/modules/model.py)
_TO_ORIGINAL = (
    ("condition_embedder.time_embedder.linear_1", "time_embedding.0"),
    ("condition_embedder.time_embedder.linear_2", "time_embedding.2"),
    ("condition_embedder.text_embedder.linear_1", "text_embedding.0"),
    ("condition_embedder.text_embedder.linear_2", "text_embedding.2"),
    ("condition_embedder.time_proj", "time_projection.1"),
    (".attn1.", ".self_attn."),
    (".attn2.", ".cross_attn."),
    (".to_q.", ".q."),
    (".to_k.", ".k."),
    (".to_v.", ".v."),
    (".to_out.0.", ".o."),
    ("ffn.net.0.proj", "ffn.0"),
    ("ffn.net.2", "ffn.2"),
)


def to_original_wan(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    out = {}
    for name, tensor in state.items():
        for new, old in _TO_ORIGINAL:
            name = name.replace(new, old)
        # Wan's cross-attention norm is norm3; diffusers calls it norm2.
        name = re.sub(r"\.norm2\.", ".norm3.", name)
        if name == "scale_shift_table":
            name = "head.modulation"
        name = re.sub(r"^blocks\.(\d+)\.scale_shift_table$", r"blocks.\1.modulation", name)
        name = name.replace("proj_out.", "head.head.")
        out[name] = tensor.clone()
    return out


def make_stock_base(model_dir: Path, out: Path) -> Path:
    """`model_dir` as a stock Wan base ships: no AR geometry, no VAE scale factors, no camera adapter, no causal weights."""
    base = shutil.copytree(model_dir, out, ignore=shutil.ignore_patterns("camera_adapter"))
    config_path = base / "transformer" / "config.json"
    config = json.loads(config_path.read_text())
    for key in ("num_frames_per_block", "sink_size", "sliding_window_num_frames"):
        del config[key]
    config_path.write_text(json.dumps(config))
    vae_path = base / "vae" / "config.json"
    vae = json.loads(vae_path.read_text())
    del vae["scale_factor_temporal"], vae["scale_factor_spatial"]
    vae_path.write_text(json.dumps(vae))
    (base / "transformer" / "diffusion_pytorch_model.safetensors").unlink()
    return base
