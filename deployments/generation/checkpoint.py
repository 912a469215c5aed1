"""Load a causal world model's components from a diffusers-layout folder with the stock classes."""

from __future__ import annotations

import json
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch

from deployments.generation.geometry import (
    ARGeometry,
    CheckpointError,
    ModelTraits,
    read_geometry,
    read_traits,
)
from deployments.generation.tensor_parallel import (
    TensorParallel,
    check_shardable,
    shard_transformer,
)

TINY_DECODER_FOLDER = "tiny_decoder"


def resolve_video_decoder(root: Path, choice: str) -> str:
    """`auto`: the folder's tiny decoder when it was trained for this model, else the VAE."""
    if choice != "auto":
        return choice
    config = root / TINY_DECODER_FOLDER / "config.json"
    return "tiny" if config.is_file() and json.loads(config.read_text()).get("trained", False) else "vae"


@dataclass
class WorldModelComponents:
    path: Path
    geometry: ARGeometry
    transformer: object
    vae: object
    text_encoder: object
    tokenizer: object
    camera_adapter: object | None
    flow_shift: float
    timesteps: list[float] | None
    image_conditioned: bool
    last_frame_condition: bool = False  # see deployments/generation/conditioning.py
    reprojection_ground_depth: float | None = None  # see deployments/generation/reprojection.py
    tensor_parallel: TensorParallel | None = None  # None: the whole transformer on this process
    tiny_decoder: object | None = None  # the folder's tiny_decoder/, when asked for


def _scheduler_settings(root: Path) -> tuple[float, list[float] | None]:
    path = root / "scheduler" / "scheduler_config.json"
    config = json.loads(path.read_text()) if path.is_file() else {}
    # FlowMatchEuler calls it `shift`, UniPC `flow_shift`; causal Wan distills use 5.0.
    shift = config.get("flow_shift", config.get("shift", 5.0))
    timesteps = config.get("denoising_step_list")
    return float(shift), (list(map(float, timesteps)) if timesteps else None)


@contextmanager
def quiet_loading():
    """The AR keys are extra to the stock transformer config; diffusers warns about them on every load."""
    from diffusers.utils import logging as dlog
    from transformers.utils import logging as tlog

    saved = [(log, log.get_verbosity(), log.is_progress_bar_enabled()) for log in (dlog, tlog)]
    for log, _, bars in saved:
        log.set_verbosity_error()
        if bars:
            log.disable_progress_bar()
    try:
        yield
    finally:
        for log, verbosity, bars in saved:
            log.set_verbosity(verbosity)
            if bars:
                log.enable_progress_bar()


def load_world_model(
    path: str | Path,
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.float32,
    vae_dtype: torch.dtype = torch.float32,
    tensor_parallel: TensorParallel | None = None,
    tiny_decoder: bool = False,
) -> WorldModelComponents:
    """Load every component; with `tensor_parallel` the transformer's blocks are then sharded over its mesh.
    `tiny_decoder`: also load the folder's `tiny_decoder/` (deployments/generation/tiny_decoder.py).

    Under tensor parallel every rank calls this with the same arguments; the
    text encoder, VAE and camera adapter stay whole on each rank.
    """
    root = Path(path)
    if not root.is_dir():
        raise CheckpointError(f"model folder {root} does not exist")
    geometry = read_geometry(root)
    traits = read_traits(root)
    if tensor_parallel is not None:
        # Before any weight is read: a head count that does not split is refused up front.
        check_shardable(json.loads((root / "transformer" / "config.json").read_text()), tensor_parallel.world_size)
        if torch.device(device).type != tensor_parallel.device_type:
            raise ValueError(f"device {device} does not match the tensor-parallel mesh's {tensor_parallel.device_type}")
    if tiny_decoder and not (root / TINY_DECODER_FOLDER).is_dir():
        raise CheckpointError(f"video_decoder tiny: model folder {root} has no {TINY_DECODER_FOLDER}/ (config.json and model.safetensors); "
                              "use the VAE or add one")
    with quiet_loading():
        components = _load(root, geometry, traits, device, dtype, vae_dtype)
    if tiny_decoder:
        from deployments.generation.tiny_decoder import TinyVideoDecoder

        components.tiny_decoder = TinyVideoDecoder.from_pretrained(root / TINY_DECODER_FOLDER, dtype=vae_dtype).to(device)
    if tensor_parallel is not None:
        shard_transformer(components.transformer, tensor_parallel)
        components.tensor_parallel = tensor_parallel
    return components


def _load(root: Path, geometry: ARGeometry, traits: ModelTraits, device, dtype: torch.dtype, vae_dtype: torch.dtype) -> WorldModelComponents:
    from diffusers import AutoencoderKLWan, WanTransformer3DModel
    from transformers import AutoTokenizer, UMT5EncoderModel

    from deployments.generation.camera_adapter import CameraAdapter

    transformer = WanTransformer3DModel.from_pretrained(root, subfolder="transformer", dtype=dtype).to(device).eval()
    vae = AutoencoderKLWan.from_pretrained(root, subfolder="vae", dtype=vae_dtype).to(device).eval()
    text_encoder = UMT5EncoderModel.from_pretrained(root / "text_encoder", dtype=dtype).to(device).eval()
    tokenizer = AutoTokenizer.from_pretrained(root / "tokenizer")
    adapter = None
    if traits.camera_adapter:
        adapter = CameraAdapter.from_pretrained(root, subfolder="camera_adapter", dtype=dtype).to(device).eval()
    shift, timesteps = _scheduler_settings(root)
    return WorldModelComponents(
        path=root,
        geometry=geometry,
        transformer=transformer,
        vae=vae,
        text_encoder=text_encoder,
        tokenizer=tokenizer,
        camera_adapter=adapter,
        flow_shift=shift,
        timesteps=timesteps,
        image_conditioned=traits.image_conditioned,
        last_frame_condition=traits.last_frame_condition,
        reprojection_ground_depth=traits.reprojection_ground_depth,
    )
