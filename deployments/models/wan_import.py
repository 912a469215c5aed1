"""Import a published causal Wan checkpoint (Self-Forcing, CausVid, LongLive, ...) as a world-model folder.

Those projects ship the transformer alone, as a state dict in the original Wan
naming, inside a training wrapper (`{"generator_ema": {...}}`, keys prefixed
`model.`, `module.`, `_orig_mod.`), next to a stock Wan2.1 diffusers base.
The key layout is converted by diffusers' own single-file converter, never by
a map of ours, and the result is checked tensor by tensor against the base's
transformer config before anything is written. The folder is assembled under
a temporary name beside `output` and renamed into place, so a refused or
failed import leaves nothing behind.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import torch

from deployments.generation.geometry import AR_KEYS, CheckpointError, read_geometry, read_traits

# Tried in this order when --key is not given; the top level comes last.
WRAPPER_KEYS = ("generator_ema", "generator")
# Module wrappers that training frameworks put into parameter names, anywhere in a name.
WRAPPER_SEGMENTS = ("_fsdp_wrapped_module.", "_checkpoint_wrapped_module.", "_orig_mod.")
# Prefixes a whole state dict may carry (DDP's `module.`, a wrapper's `model.`), in any order.
LEADING_PREFIXES = ("module.", "model.", "_orig_mod.")
ORIGINAL_MARKERS = ("head.modulation", "blocks.0.self_attn.q.weight", "text_embedding.0.weight")
DIFFUSERS_MARKERS = ("scale_shift_table", "condition_embedder.time_proj.weight")
# Parameters of families whose extra conditioning the engine has no path for: refused, never loaded half.
UNSUPPORTED_MODULES: tuple[tuple[tuple[str, ...], str], ...] = (
    (("action_model.", "keyboard_embed", "mouse_mlp"), "Matrix-Game's keyboard and mouse modules"),
    (("cam_plucker_proj", "cam_injector", "cam_scale_layer", "cam_shift_layer", "cam_hidden_layer"), "LingBot-World's camera modules"),
    (("vace_blocks", "vace_patch_embedding"), "VACE's control blocks"),
    (("motion_encoder.", "face_adapter.", "face_encoder."), "Wan-Animate's motion and face modules"),
    (("img_emb.",), "a CLIP image-context embedding (Wan2.1 I2V-14B style; image conditioning here goes through latent channels)"),
    (("lora_A", "lora_B", "lora_down", "lora_up"), "LoRA weights (merge them into the base generator first)"),
)
SECOND_EXPERT_KEYS = ("high_noise_model", "low_noise_model")
COPIED_COMPONENTS = ("text_encoder", "tokenizer", "vae", "scheduler")
DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


@dataclass(frozen=True)
class ImportRequest:
    weights: Path
    base: Path
    output: Path
    frames_per_block: int | None = None
    sink_size: int | None = None
    window_frames: int | None = None
    key: str | None = None
    camera_adapter: Path | None = None
    dtype: torch.dtype = torch.bfloat16
    # The distilled schedule, written into the output's scheduler config when given (the base's is a
    # many-step sampler's: Wan2.1's diffusers base says flow_shift 3.0 and no step list).
    shift: float | None = None
    denoising_steps: tuple[float, ...] | None = None


@dataclass
class ImportReport:
    output: Path
    source_key: str  # which wrapper entry held the transformer ("" for the top level)
    converted: bool  # original Wan naming converted (False: already diffusers naming)
    tensors: int
    geometry: dict = field(default_factory=dict)


def read_checkpoint(path: Path) -> object:
    """A safetensors file, or a torch pickle loaded with `weights_only=True` (no code runs on load)."""
    if not path.is_file():
        raise CheckpointError(f"weights file {path} does not exist")
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        try:
            return load_file(path)
        except Exception as exc:  # safetensors raises its own error types
            raise CheckpointError(f"{path} is not a readable safetensors file: {exc}") from None
    try:
        return torch.load(path, map_location="cpu", weights_only=True, mmap=False)
    except Exception as exc:  # UnpicklingError for unsafe globals, RuntimeError for a bad archive
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise CheckpointError(
            f"{path} cannot be loaded with torch.load(weights_only=True): {first}. Only plain tensors and containers are "
            "accepted; re-save the state dict (or convert it to safetensors) where you trust the file"
        ) from None


def _is_state_dict(value: object) -> bool:
    return isinstance(value, Mapping) and bool(value) and all(isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in value.items())


def select_state_dict(checkpoint: object, key: str | None = None) -> tuple[str, dict[str, torch.Tensor]]:
    """Find the transformer's state dict inside the usual wrappers: (where it was, the state dict)."""
    if not isinstance(checkpoint, Mapping):
        raise CheckpointError(f"the weights file holds a {type(checkpoint).__name__}, not a state dict or a dict of state dicts")
    experts = [k for k in SECOND_EXPERT_KEYS if k in checkpoint]
    if experts:
        raise CheckpointError(
            f"the weights file holds two experts ({', '.join(experts)}): Wan2.2-A14B-style mixtures of a high-noise and a "
            "low-noise transformer are not supported; the engine runs one transformer per block"
        )
    if key is not None:
        if key not in checkpoint:
            raise CheckpointError(f"--key {key!r} is not in the weights file; its top-level keys are {_some(checkpoint)}")
        value = checkpoint[key]
        if not _is_state_dict(value):
            raise CheckpointError(f"--key {key!r} holds a {type(value).__name__}, not a state dict of tensors")
        return key, dict(value)
    for name in WRAPPER_KEYS:
        if name in checkpoint and _is_state_dict(checkpoint[name]):
            return name, dict(checkpoint[name])
    if _is_state_dict(checkpoint):
        return "", dict(checkpoint)
    nested = [k for k, v in checkpoint.items() if _is_state_dict(v)]
    if nested:
        raise CheckpointError(f"no {' or '.join(WRAPPER_KEYS)} entry and the top level is not a state dict; pick one of {nested} with --key")
    raise CheckpointError(f"no state dict of tensors found in the weights file; its top-level keys are {_some(checkpoint)}")


def _some(mapping: Mapping, limit: int = 8) -> str:
    keys = [str(k) for k in mapping]
    return ", ".join(keys[:limit]) + (f" and {len(keys) - limit} more" if len(keys) > limit else "")


def strip_prefixes(state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Drop wrapper segments anywhere in a name, then the prefixes every name shares."""
    names = {}
    for name, tensor in state.items():
        for segment in WRAPPER_SEGMENTS:
            name = name.replace(segment, "")
        names[name] = tensor
    stripped = True
    while stripped:
        stripped = False
        for prefix in LEADING_PREFIXES:
            # ComfyUI's `model.diffusion_model.` is diffusers' converter's to take.
            if all(n.startswith(prefix) and not n.startswith("model.diffusion_model.") for n in names):
                names = {n[len(prefix):]: t for n, t in names.items()}
                stripped = True
    return names


def refuse_unsupported(state: Mapping[str, torch.Tensor]) -> None:
    for markers, what in UNSUPPORTED_MODULES:
        hits = [n for n in state if any(m in n for m in markers)]
        if hits:
            raise CheckpointError(f"the checkpoint carries {what} ({len(hits)} tensors, e.g. {hits[0]}): not supported by this engine")


def to_diffusers_layout(state: Mapping[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], bool]:
    """Original Wan naming -> diffusers', with diffusers' own converter: (state dict, whether it was converted)."""
    if any(any(n == m or n.endswith("." + m) or n.startswith(m) for m in DIFFUSERS_MARKERS) for n in state):
        return dict(state), False
    if not any(any(n.endswith(m) for m in ORIGINAL_MARKERS) for n in state):
        raise CheckpointError(f"the state dict is neither in the original Wan naming nor in diffusers'; its first keys are {_some(state, 5)}")
    from diffusers.loaders.single_file_utils import convert_wan_transformer_to_diffusers

    return convert_wan_transformer_to_diffusers(dict(state)), True


def expected_tensors(config: Mapping) -> dict[str, torch.Size]:
    """Names and shapes of the base transformer's parameters, from its config alone (no weights made)."""
    from diffusers import WanTransformer3DModel

    from deployments.generation.checkpoint import quiet_loading

    with quiet_loading(), torch.device("meta"):
        model = WanTransformer3DModel.from_config(dict(config))
    return {n: t.shape for n, t in model.state_dict().items()}


def check_tensors(state: Mapping[str, torch.Tensor], expected: Mapping[str, torch.Size], base: Path) -> None:
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    misshapen = [f"{n} {tuple(state[n].shape)} (base {tuple(expected[n])})" for n in sorted(set(state) & set(expected)) if state[n].shape != expected[n]]
    problems = []
    if missing:
        problems.append(f"missing {len(missing)}: {', '.join(missing[:6])}{' ...' if len(missing) > 6 else ''}")
    if unexpected:
        problems.append(f"unexpected {len(unexpected)}: {', '.join(unexpected[:6])}{' ...' if len(unexpected) > 6 else ''}")
    if misshapen:
        problems.append(f"misshapen {len(misshapen)}: {', '.join(misshapen[:4])}{' ...' if len(misshapen) > 4 else ''}")
    if problems:
        raise CheckpointError(
            f"the checkpoint does not match {base / 'transformer' / 'config.json'} ({'; '.join(problems)}); "
            "is --base the Wan2.1 release this checkpoint was trained from?"
        )


def cast_state(state: Mapping[str, torch.Tensor], dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """The dtype asked for, except where diffusers keeps float32 (the rule `build_world_model` saves by)."""
    from diffusers import WanTransformer3DModel

    from deployments.models.tiny_world_model import keeps_fp32

    keep = WanTransformer3DModel._keep_in_fp32_modules or []
    out = {}
    for name, tensor in state.items():
        target = torch.float32 if keeps_fp32(name, keep) else dtype
        out[name] = (tensor.to(target) if tensor.is_floating_point() else tensor).contiguous()
    return out


def transformer_config(base_config: Mapping, request: ImportRequest) -> dict:
    """The base's transformer config with the AR geometry: the flags win; without them the base must carry it."""
    given = {"num_frames_per_block": request.frames_per_block, "sink_size": request.sink_size, "sliding_window_num_frames": request.window_frames}
    flags = {"num_frames_per_block": "--frames-per-block", "sink_size": "--sink-size", "sliding_window_num_frames": "--window-frames"}
    config = dict(base_config)
    missing = []
    for key in AR_KEYS:
        value = given[key]
        if value is None:
            if config.get(key) is None:
                missing.append(flags[key])
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < (1 if key == "num_frames_per_block" else 0):
            raise CheckpointError(f"{flags[key]} must be a {'positive' if key == 'num_frames_per_block' else 'non-negative'} integer, got {value!r}")
        config[key] = value
    if missing:
        raise CheckpointError(f"the base's transformer config has no AR geometry: give {', '.join(missing)} (the geometry the checkpoint was trained with)")
    return config


def _link_or_copy(src: str, dst: str) -> str:
    """Hard links keep a multi-gigabyte text encoder from being copied; across file systems, copy."""
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)
    return dst


def _scheduler_config(folder: Path, request: ImportRequest) -> None:
    if request.shift is None and request.denoising_steps is None:
        return
    path = folder / "scheduler" / "scheduler_config.json"
    config = json.loads(path.read_text()) if path.is_file() else {"_class_name": "FlowMatchEulerDiscreteScheduler"}
    if request.shift is not None:
        if not request.shift > 0:
            raise CheckpointError(f"--shift must be positive, got {request.shift!r}")
        # UniPC and FlowMatchEuler name it differently; the loader reads `flow_shift` first.
        config["flow_shift"] = config["shift"] = float(request.shift)
    if request.denoising_steps is not None:
        steps = [float(t) for t in request.denoising_steps]
        if not steps or any(not 0 < t <= 1000 for t in steps) or steps != sorted(steps, reverse=True):
            raise CheckpointError(f"--denoising-steps must be decreasing timesteps in (0, 1000], got {list(request.denoising_steps)}")
        config["denoising_step_list"] = steps
    path.parent.mkdir(parents=True, exist_ok=True)
    path.unlink(missing_ok=True)  # a hard link to the base's file: never write through it
    path.write_text(json.dumps(config, indent=2) + "\n")


def _camera_adapter(source: Path, folder: Path, inner_dim: int) -> None:
    config = source / "config.json"
    if not config.is_file():
        raise CheckpointError(f"--camera-adapter {source} has no config.json (a CameraAdapter folder, as `save_pretrained` writes it)")
    width = json.loads(config.read_text()).get("inner_dim")
    if width != inner_dim:
        raise CheckpointError(f"--camera-adapter {source} is {width} wide; the transformer's inner dimension is {inner_dim}")
    shutil.copytree(source, folder / "camera_adapter", copy_function=_link_or_copy)


def import_checkpoint(request: ImportRequest) -> ImportReport:
    """Read, convert, check, then write the folder; raises CheckpointError naming what is wrong, writing nothing."""
    base, output = Path(request.base), Path(request.output)
    base_config_path = base / "transformer" / "config.json"
    if not base_config_path.is_file():
        raise CheckpointError(f"--base {base} is not a diffusers Wan folder: {base_config_path} is missing")
    for part in COPIED_COMPONENTS[:3]:
        if not (base / part).is_dir():
            raise CheckpointError(f"--base {base} has no {part}/ folder")
    if not (base / "vae" / "config.json").is_file():
        raise CheckpointError(f"--base {base} has no vae/config.json")
    if output.exists():
        raise CheckpointError(f"--output {output} already exists; remove it or choose another folder")
    base_config = json.loads(base_config_path.read_text())
    config = transformer_config(base_config, request)

    source_key, state = select_state_dict(read_checkpoint(Path(request.weights)), request.key)
    state = strip_prefixes(state)
    refuse_unsupported(state)
    state, converted = to_diffusers_layout(state)
    check_tensors(state, expected_tensors(base_config), base)
    state = cast_state(state, request.dtype)

    output.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{output.name}.importing-", dir=output.parent))
    try:
        for part in COPIED_COMPONENTS:
            if (base / part).is_dir():
                shutil.copytree(base / part, staging / part, copy_function=_link_or_copy)
        if (base / "model_index.json").is_file():
            shutil.copy2(base / "model_index.json", staging / "model_index.json")
        _write_transformer(staging / "transformer", state, config)
        _scheduler_config(staging, request)
        if request.camera_adapter is not None:
            _camera_adapter(Path(request.camera_adapter), staging, config["num_attention_heads"] * config["attention_head_dim"])
        geometry = read_geometry(staging)  # what the server will read: refused here, not at serve time
        read_traits(staging)
        os.rename(staging, output)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return ImportReport(output, source_key, converted, len(state), {k: getattr(geometry, k) for k in (*AR_KEYS, "scale_factor_temporal", "scale_factor_spatial")})


def _write_transformer(folder: Path, state: dict[str, torch.Tensor], config: dict) -> None:
    from safetensors.torch import save_file

    folder.mkdir(parents=True)
    save_file(state, folder / "diffusion_pytorch_model.safetensors", metadata={"format": "pt"})
    (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n")

