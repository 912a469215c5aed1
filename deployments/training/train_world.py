"""`rtv train-world`: the built-in world model from scratch, stage by stage, resumable.

    render   trajectories of the procedural world        WORK/data/traj_*.npz
    vae      AutoencoderKLWan on their frames             WORK/vae/
    encode   every trajectory to normalized latents       WORK/latents.pt
    decoder  the tiny streaming decoder, on the latents   WORK/tiny_decoder/
    world    transformer + camera adapter + text encoder  WORK/transformer/checkpoint.pt
    export   fp16 weights in the shipped layout           OUT/*.safetensors + OUT/spec.json

The world stage keeps the weights of every checkpoint (WORK/transformer/snapshot-STEP.pt), so the
export can take any of them: shipped weights are named by the run's command and a step.

Each stage skips work whose output is already there, so a run that was
stopped goes on where it was. Everything is seeded: the same seed and sizes
give the same data and the same training run (bit for bit with the same
torch build and thread count).
"""

from __future__ import annotations

import json
import shutil
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch

from deployments.generation.camera_adapter import position_bands_of
from deployments.models.builtin_world_model import BUILTIN_SPEC, save_shipped
from deployments.training.copy_init import init_as_copy
from deployments.training.dataset import list_trajectories, load_trajectory, render_dataset, starts_at_origin
from deployments.generation.tiny_decoder import TinyDecoderConfig
from deployments.training.logs import jsonl_logger
from deployments.training.tiny_decoder_training import DecoderTraining, train_tiny_decoder
from deployments.training.transformer_training import (Sample, TeacherForcing, TransformerTraining, sequence_blocks_for, snapshot_path,
                                                       snapshot_steps, train_transformer)
from deployments.training.vae_training import VAETraining, encode_video, train_vae, vae_trained


STAGES = ("render", "vae", "encode", "decoder", "world", "export")


@dataclass(frozen=True)
class WorldTraining:
    trajectories: int = 640
    vae_trajectories: int = 320  # the VAE trains on the first ones (at the origin); they hold every biome and pattern
    blocks: int = 8  # per trajectory
    height: int = 64
    width: int = 64
    workers: int = 2
    threads: int = 2
    vae: VAETraining = field(default_factory=VAETraining)
    transformer: TransformerTraining = field(default_factory=TransformerTraining)
    decoder: DecoderTraining = field(default_factory=DecoderTraining)
    # Shipped weights to go on from (`save_shipped`'s layout): their VAE is taken as it is (the
    # transformer's latents live in its space), and so is their tiny decoder (trained on those latents);
    # the transformer, adapter and text encoder start from them.
    init_from: Path | None = None
    # The camera adapter's absolute position code (CameraAdapter.position_bands); None: the start
    # weights' own (BUILTIN_SPEC's from scratch). Weights without one grow it from a zero start.
    camera_position_bands: int | None = None

    def smoke(self) -> "WorldTraining":
        """A few steps of everything: what CI runs."""
        return replace(self, trajectories=6, vae_trajectories=6, blocks=7, workers=1,
                       vae=replace(self.vae.scaled(steps=2, batch=2), held_out=2,
                                   stream=replace(self.vae.stream, steps=2, batch=2, prefix_chunks=(3,))),
                       transformer=replace(self.transformer, steps=2, batch=2, held_out=1, motion_steps=1),
                       decoder=replace(self.decoder, steps=2, batch=2, held_out=1))


def run(work: str | Path, out: str | Path, config: WorldTraining = WorldTraining(), *, seed: int = 0, stages: tuple[str, ...] | None = None,
        export_step: int | None = None) -> dict:
    """`export_step` exports the transformer as it was at that step of the run (a kept snapshot) instead of the last checkpoint."""
    work, out = Path(work), Path(out)
    work.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(config.threads)
    log = jsonl_logger(work / "train.log")
    wanted = set(stages or STAGES)
    report: dict = {}

    if "render" in wanted:
        t = time.time()
        render_dataset(work / "data", config.trajectories, config.blocks, seed=seed, height=config.height, width=config.width, workers=config.workers)
        log({"stage": "render", "trajectories": config.trajectories, "seconds": round(time.time() - t, 1)})
    paths = list_trajectories(work / "data")[: config.trajectories]

    vae_dir = work / "vae"
    decoder_dir = work / "tiny_decoder"
    if "vae" in wanted and config.init_from is not None:
        if not (vae_dir / "config.json").is_file():
            init = _init_folder(work, config, seed)
            shutil.copytree(init / "vae", vae_dir)
            # The tiny decoder was trained on this VAE's latents: it goes on with it (and is exported with the rest).
            if (init / "tiny_decoder" / "model.safetensors").is_file() and not decoder_dir.exists():
                shutil.copytree(init / "tiny_decoder", decoder_dir)
            log({"stage": "vae", "from": str(config.init_from), "tiny_decoder": decoder_dir.exists()})
    elif "vae" in wanted and not vae_trained(vae_dir, config.vae):
        videos = [load_trajectory(p).frames for p in paths[: config.vae_trajectories]]
        report["vae"] = train_vae(videos, vae_dir, BUILTIN_SPEC, config.vae, seed=seed, log=log)

    latents_file = work / "latents.pt"
    if "encode" in wanted and not latents_file.is_file():
        from diffusers import AutoencoderKLWan

        from deployments.generation.vae_stream import LatentNormalizer

        vae = AutoencoderKLWan.from_pretrained(vae_dir).eval()
        normalizer = LatentNormalizer(vae)
        t = time.time()
        latents, mixes, poses = [], [], []
        for p in paths:
            traj = load_trajectory(p)
            latents.append(normalizer.to_normalized(encode_video(vae, traj.frames)[None])[0].half())
            mixes.append(traj.prompt_mixes)
            poses.append(traj.relative_poses)
        torch.save({"latents": latents, "mixes": mixes, "poses": poses}, latents_file)
        log({"stage": "encode", "trajectories": len(paths), "seconds": round(time.time() - t, 1)})

    if "decoder" in wanted and not (decoder_dir / "model.safetensors").is_file():
        data = torch.load(latents_file, weights_only=False)
        vae_config = json.loads((vae_dir / "config.json").read_text())
        videos = [load_trajectory(p).frames for p in paths]
        shape = TinyDecoderConfig.for_vae(vae_config["z_dim"], vae_config["scale_factor_spatial"], vae_config["scale_factor_temporal"],
                                          config.decoder.widths)
        report["decoder"] = train_tiny_decoder(data["latents"], videos, vae_config["latents_mean"], vae_config["latents_std"], shape,
                                               decoder_dir, config.decoder, seed=seed, log=log)

    if "world" in wanted:
        data = torch.load(latents_file, weights_only=False)  # our own file: Pose objects ride along
        trainer = _trainer(work, config, seed)
        held = config.transformer.held_out
        train = {k: v[: len(v) - held] for k, v in data.items()}
        probe = _probe(trainer, data, held, vae_dir)
        total = len(data["latents"])
        origin = [i for i in range(len(train["latents"])) if starts_at_origin(i, total)]
        report["transformer"] = train_transformer(trainer, train["latents"], train["mixes"], train["poses"], work / "transformer",
                                                  seed=seed, log=log, probe=probe, text_to_video=origin)
    if "export" in wanted:
        from diffusers import AutoencoderKLWan

        state = _exported_state(work / "transformer", export_step)
        vae = AutoencoderKLWan.from_pretrained(vae_dir)
        weights = {"transformer": state["transformer"], "camera_adapter": state["camera_adapter"],
                   "text_encoder": state["text_encoder"], "vae": vae.state_dict()}
        decoder = None
        if (decoder_dir / "model.safetensors").is_file():
            from deployments.generation.tiny_decoder import TinyVideoDecoder

            decoder = TinyVideoDecoder.from_pretrained(decoder_dir)
            weights["tiny_decoder"] = decoder.state_dict()
        save_shipped(weights, list(vae.config.latents_mean), list(vae.config.latents_std), out,
                     tiny_decoder_widths=None if decoder is None else decoder.config.widths,
                     camera_position_bands=position_bands_of(state["camera_adapter"]))
        log({"stage": "export", "out": str(out), "step": state["step"], "bytes": sum(f.stat().st_size for f in out.glob("*.safetensors"))})
    return report


class MissingSnapshot(ValueError):
    pass


def _exported_state(transformer_dir: Path, step: int | None) -> dict:
    if step is None:
        return torch.load(transformer_dir / "checkpoint.pt", weights_only=False)
    path = snapshot_path(transformer_dir, step)
    if not path.is_file():
        kept = snapshot_steps(transformer_dir)
        raise MissingSnapshot(f"no snapshot of step {step} in {transformer_dir} (kept: {', '.join(map(str, kept)) or 'none'})")
    return torch.load(path, weights_only=False)


def _probe(trainer: TeacherForcing, data: dict, held: int, vae_dir: Path):
    """The context probe on the held-out trajectories' first blocks (the trajectories the transformer never trains on)."""
    from deployments.training.probe import context_probe

    if held == 0:
        return None
    vae = json.loads((vae_dir / "config.json").read_text())
    mean, std = torch.tensor(vae["latents_mean"]), torch.tensor(vae["latents_std"])
    n, fpb = trainer.config.blocks, trainer.fpb
    samples = [Sample.of_blocks(lat, list(range(n)), fpb, mix, pose, False)
               for lat, mix, pose in zip(data["latents"][-held:], data["mixes"][-held:], data["poses"][-held:])
               if lat.shape[1] >= n * fpb]
    return lambda: context_probe(trainer, samples, mean, std)


def _init_folder(work: Path, config: WorldTraining, seed: int) -> Path:
    """The checkpoint training starts from: random weights by the same builder (and seed) as the
    random-weight checkpoints, or the shipped weights in `config.init_from`."""
    from deployments.models.builtin_world_model import load_shipped
    from deployments.models.tiny_world_model import build_world_model

    init = work / "init"
    if not (init / "transformer" / "config.json").is_file():
        spec, weights = (BUILTIN_SPEC, None) if config.init_from is None else load_shipped(config.init_from)
        if config.camera_position_bands is not None:
            spec = replace(spec, camera_position_bands=config.camera_position_bands)
        build_world_model(init, spec, seed=seed, weights=weights)
    return init


def _trainer(work: Path, config: WorldTraining, seed: int) -> TeacherForcing:
    """The models to train, initialized by the same builder (and seed) as the random-weight checkpoints."""
    from diffusers import WanTransformer3DModel
    from transformers import AutoTokenizer, UMT5EncoderModel

    from deployments.generation.camera_adapter import CameraAdapter
    from deployments.generation.geometry import read_traits

    init = _init_folder(work, config, seed)
    transformer = WanTransformer3DModel.from_pretrained(init, subfolder="transformer").train()
    adapter = CameraAdapter.from_pretrained(init, subfolder="camera_adapter").train()
    text_encoder = UMT5EncoderModel.from_pretrained(init / "text_encoder").eval()  # no dropout; gradients still flow
    tokenizer = AutoTokenizer.from_pretrained(init / "tokenizer")
    if config.transformer.copy_init and config.init_from is None:
        init_as_copy(transformer, adapter)
    spec = BUILTIN_SPEC
    blocks = sequence_blocks_for(spec.sink_size, spec.sliding_window_num_frames, spec.num_frames_per_block)
    return TeacherForcing(
        transformer, adapter, text_encoder, tokenizer,
        height=config.height, width=config.width, frames_per_block=spec.num_frames_per_block,
        shift=spec.flow_shift, config=replace(config.transformer, blocks=blocks),
        timesteps=list(spec.denoising_step_list) if spec.denoising_step_list else None,
        ground_depth=read_traits(init).reprojection_ground_depth,
    )
