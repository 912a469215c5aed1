"""The built-in understanding model: a small Qwen2.5-Omni thinker trained on the procedural world.

`rtv train-omni` trains it (`deployments/training/omni_training.py`) and writes
the weights here; `rtv make-models` installs them as the `omni` checkpoint (the
same folder layout, classes and processor as the tiny random one, only larger
and trained). It answers a fixed set of questions about the world model's
videos (where, which way the camera moves, what is heard, what changed);
anything else gets one of those answers.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch

from deployments.models.shipped import load_float, save_fp16
from deployments.models.tiny_vlm import VLMSpec, make_tiny_vlm

WEIGHTS_DIR = Path(__file__).parent / "weights" / "omni"
WEIGHTS_FILE = "thinker.safetensors"

# Wide enough to see a few pixels of motion between two frames and to spell its answers byte by byte;
# 1.3 M parameters, 2.6 MB as shipped.
BUILTIN_OMNI_SPEC = VLMSpec(
    hidden=128,
    layers=4,
    heads=4,
    intermediate=384,
    mrope_section=(4, 6, 6),
    vision_hidden=64,
    vision_depth=4,
    vision_intermediate=128,
    vision_full_attention=(1, 3),
    audio_hidden=64,
    audio_ffn=128,
)

README = """# Built-in understanding model (trained)

A small Qwen2.5-Omni thinker trained by `rtv train-omni` on clips of the
project's procedural world (`deployments/training/omni_data.py`). It answers
a fixed set of questions, each in a few phrasings:

- where are we? -> the biome ("a snowy field", "a sandy desert", ...)
- which way is the camera turning / moving? (or "what is moving?") ->
  left, right, up, down, forward, back or still
- what do you hear? -> "a low steady tone", "a high beeping tone", ... or "nothing"
- what changed? -> "from a green meadow to a snowy field" or "nothing changed"

Frames at 2 per second, 64x64 as the built-in world model makes them; audio
PCM 16 kHz mono. Anything else gets one of those answers.
"""


def weights_available(weights_dir: str | os.PathLike = WEIGHTS_DIR) -> bool:
    return (Path(weights_dir) / WEIGHTS_FILE).is_file()


def load_shipped(weights_dir: str | os.PathLike = WEIGHTS_DIR) -> dict[str, torch.Tensor]:
    return load_float(Path(weights_dir) / WEIGHTS_FILE)


def save_shipped(state: dict[str, torch.Tensor], report: dict, weights_dir: str | os.PathLike = WEIGHTS_DIR) -> Path:
    """Write the trained state dict as shipped (fp16) with its held-out evaluation."""
    root = Path(weights_dir)
    root.mkdir(parents=True, exist_ok=True)
    save_fp16(state, root / WEIGHTS_FILE)
    (root / "eval.json").write_text(json.dumps(report, indent=2) + "\n")
    return root


def install_builtin_omni(out_dir: str | os.PathLike, weights_dir: str | os.PathLike = WEIGHTS_DIR) -> Path:
    """Write the trained thinker as a checkpoint folder (`from_pretrained` layout)."""
    return make_tiny_vlm(out_dir, spec=BUILTIN_OMNI_SPEC, weights=load_shipped(weights_dir), readme=README)
