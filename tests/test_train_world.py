"""`rtv train-world` runs every stage end to end (a few steps: CI never trains for real), and what it
writes installs as a checkpoint the engine serves."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch

from clients import cli

pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("train-world")
    code = cli.main(["train-world", str(root / "weights"), "--work", str(root / "work"), "--smoke", "--threads", "1"])
    assert code == 0
    return root


def test_every_stage_leaves_its_output(smoke_run) -> None:
    work = smoke_run / "work"
    assert len(list((work / "data").glob("traj_*.npz"))) == 6
    vae_report = json.loads((work / "vae" / "training.json").read_text())
    assert vae_report["held_out_psnr_db"] > 0 and vae_report["held_out_anchored_psnr_db"] > 0
    assert (work / "latents.pt").is_file() and (work / "transformer" / "checkpoint.pt").is_file()
    records = [json.loads(line) for line in (work / "train.log").read_text().splitlines()]
    assert {"render", "vae", "encode", "decoder", "transformer", "export"} <= {r["stage"] for r in records}
    assert [r["held_out_psnr_db"] for r in records if "held_out_psnr_db" in r and r["stage"] == "decoder"]
    probes = [r["probe"] for r in records if "probe" in r]  # measured on the held-out trajectory at the checkpoint
    assert probes and {"psnr_db", "copy_previous_psnr_db", "motion_sign_agreement"} <= set(probes[-1])
    sizes = {f.name: f.stat().st_size for f in (smoke_run / "weights").iterdir()}
    assert set(sizes) == {"transformer.safetensors", "vae.safetensors", "text_encoder.safetensors", "camera_adapter.safetensors",
                          "tiny_decoder.safetensors", "spec.json"}
    assert json.loads((smoke_run / "weights" / "spec.json").read_text())["tiny_decoder_widths"] == [48, 32, 24, 24]


def test_a_second_run_resumes_instead_of_starting_over(smoke_run) -> None:
    work = smoke_run / "work"
    before = (work / "transformer" / "checkpoint.pt").stat().st_mtime
    assert cli.main(["train-world", str(smoke_run / "weights"), "--work", str(work), "--smoke", "--threads", "1", "--stages", "render,vae,encode,world"]) == 0
    assert json.loads((work / "train.log").read_text().splitlines()[-1]).get("resumed_at") == 2  # nothing left to train
    assert (work / "transformer" / "checkpoint.pt").stat().st_mtime == before


def test_a_run_can_go_on_from_shipped_weights(smoke_run, tmp_path) -> None:
    from safetensors.torch import load_file

    shipped, work = smoke_run / "weights", tmp_path / "work"
    shutil.copytree(smoke_run / "work" / "data", work / "data")  # the same trajectories, already rendered
    assert cli.main(["train-world", str(tmp_path / "weights"), "--work", str(work), "--smoke", "--threads", "1",
                     "--init-from", str(shipped), "--stages", "vae,encode,world"]) == 0
    assert not (work / "vae" / "training.json").exists()  # the shipped VAE is taken, not trained
    vae = load_file(work / "vae" / "diffusion_pytorch_model.safetensors")
    for key, tensor in load_file(shipped / "vae.safetensors").items():
        assert torch.equal(vae[key].half(), tensor), key
    decoder = load_file(work / "tiny_decoder" / "model.safetensors")  # and its tiny decoder, trained on that VAE's latents
    for key, tensor in load_file(shipped / "tiny_decoder.safetensors").items():
        assert torch.equal(decoder[key].half(), tensor), key
    start = load_file(work / "init" / "transformer" / "diffusion_pytorch_model.safetensors")
    for key, tensor in load_file(shipped / "transformer.safetensors").items():
        assert torch.equal(start[key].half(), tensor), key  # training started from the shipped transformer, not a copy init
    trained = torch.load(work / "transformer" / "checkpoint.pt", weights_only=False)["transformer"]
    assert any(not torch.equal(trained[k], start[k]) for k in start)


def test_weights_without_a_position_code_grow_one_from_a_zero_start(smoke_run, tmp_path) -> None:
    """--camera-position-bands on weights trained before the adapter had a position code: training starts
    from their exact function (the new projection at zero), and the export says how many bands it has."""
    from safetensors.torch import load_file, save_file

    from deployments.models.builtin_world_model import load_shipped

    old = shutil.copytree(smoke_run / "weights", tmp_path / "old")
    adapter = {k: v for k, v in load_file(old / "camera_adapter.safetensors").items() if not k.startswith("proj_position.")}
    save_file(adapter, old / "camera_adapter.safetensors")
    spec = json.loads((old / "spec.json").read_text())
    spec.pop("camera_position_bands")
    (old / "spec.json").write_text(json.dumps(spec))
    assert load_shipped(old)[0].camera_position_bands == 0  # such weights still install as they were trained

    work = tmp_path / "work"
    shutil.copytree(smoke_run / "work" / "data", work / "data")
    assert cli.main(["train-world", str(tmp_path / "grown"), "--work", str(work), "--smoke", "--threads", "1",
                     "--init-from", str(old), "--camera-position-bands", "2", "--stages", "vae,encode,world,export"]) == 0
    start = load_file(work / "init" / "camera_adapter" / "diffusion_pytorch_model.safetensors")
    assert start["proj_position.weight"].shape[1] == 12 and not start["proj_position.weight"].any()
    for key, tensor in adapter.items():
        assert torch.equal(start[key].half(), tensor), key
    spec, weights = load_shipped(tmp_path / "grown")
    assert spec.camera_position_bands == 2 and weights["camera_adapter"]["proj_position.weight"].any()


def test_export_takes_a_kept_snapshot_by_step(smoke_run, tmp_path, capsys) -> None:
    from safetensors.torch import load_file

    work = tmp_path / "work"
    for part in ("vae", "tiny_decoder", "transformer"):
        shutil.copytree(smoke_run / "work" / part, work / part)
    snapshot = torch.load(work / "transformer" / "snapshot-2.pt", weights_only=False)
    assert snapshot["step"] == 2 and "optimizer" not in snapshot  # weights only: a snapshot is for export, not resume
    later = torch.load(work / "transformer" / "checkpoint.pt", weights_only=False)  # as if the run had gone on
    later["transformer"] = {k: v + 1 for k, v in later["transformer"].items()}
    later["step"] = 3
    torch.save(later, work / "transformer" / "checkpoint.pt")

    def export(name: str, *flags: str) -> int:
        return cli.main(["train-world", str(tmp_path / name), "--work", str(work), "--smoke", "--threads", "1", "--stages", "export", *flags])

    def last_logged() -> dict:
        return json.loads((work / "train.log").read_text().splitlines()[-1])

    assert export("last") == 0  # without the flag: the last checkpoint
    last = load_file(tmp_path / "last" / "transformer.safetensors")
    assert all(torch.equal(last[k], later["transformer"][k].half()) for k in last)
    assert {"stage": "export", "step": 3}.items() <= last_logged().items()
    assert export("at-2", "--export-step", "2") == 0
    exported = load_file(tmp_path / "at-2" / "transformer.safetensors")
    assert set(exported) == set(snapshot["transformer"])
    assert all(torch.equal(exported[k], snapshot["transformer"][k].half()) for k in exported)
    assert {"stage": "export", "step": 2}.items() <= last_logged().items()
    assert export("at-7", "--export-step", "7") == 2
    err = capsys.readouterr().err
    assert "no snapshot of step 7" in err and "(kept: 2)" in err, err
    assert not (tmp_path / "at-7").exists()
    assert cli.main(["train-world", "--export-step", "0"]) == 2
    assert "--export-step must be at least 1" in capsys.readouterr().err


def test_init_from_needs_shipped_weights(tmp_path, capsys) -> None:
    assert cli.main(["train-world", "--init-from", str(tmp_path)]) == 2
    assert "holds no shipped weights" in capsys.readouterr().err


def test_exported_weights_install_exactly_and_serve(smoke_run, tmp_path) -> None:
    from safetensors.torch import load_file

    from deployments.generation.engine import WorldModelEngine
    from deployments.contract.session_spec import SessionSpec
    from deployments.models.builtin_world_model import install_builtin_world_models

    dirs = install_builtin_world_models(tmp_path, smoke_run / "weights")
    shipped = load_file(smoke_run / "weights" / "transformer.safetensors")
    for name in ("world-model", "world-model-i2v"):  # the same weights; only the start-image key differs
        installed = load_file(dirs[name] / "transformer" / "diffusion_pytorch_model.safetensors")
        assert set(shipped) == set(installed)
        for key, tensor in shipped.items():
            assert torch.equal(tensor.float(), installed[key].float()), (name, key)
    decoder = load_file(smoke_run / "weights" / "tiny_decoder.safetensors")
    installed = load_file(dirs["world-model"] / "tiny_decoder" / "model.safetensors")
    assert set(decoder) == set(installed) and all(torch.equal(decoder[k].float(), installed[k].float()) for k in decoder)
    from deployments.generation.checkpoint import resolve_video_decoder

    assert resolve_video_decoder(dirs["world-model"], "auto") == "tiny"  # trained for this model: served by default
    for name, image in (("world-model", None), ("world-model-i2v", np.zeros((64, 64, 3), np.uint8))):
        for video_decoder in ("vae", "tiny"):
            engine = WorldModelEngine.from_pretrained(dirs[name], video_decoder=video_decoder)
            session = engine.open_session(SessionSpec(prompt="a snowy field", height=64, width=64, seed=0, image=image))
            assert engine.generate_block(session).frames.shape == (9, 64, 64, 3)


def test_bad_arguments_are_one_line_errors(capsys) -> None:
    assert cli.main(["train-world", "--stages", "vae,paint"]) == 2
    assert "unknown stage 'paint'" in capsys.readouterr().err
    assert cli.main(["train-world", "--workers", "0"]) == 2
    assert "--workers must be at least 1" in capsys.readouterr().err
    assert cli.main(["train-world", "--own-context", "1.5"]) == 2
    assert "--own-context must be between 0 and 1, not 1.5" in capsys.readouterr().err
    assert cli.main(["train-world", "--transitions", "-0.1"]) == 2
    assert "--transitions must be between 0 and 1" in capsys.readouterr().err
    assert cli.main(["train-world", "--first-block-weight", "0"]) == 2
    assert "--first-block-weight must be above 0" in capsys.readouterr().err
    assert cli.main(["train-world", "--camera-position-bands", "-1"]) == 2
    assert "--camera-position-bands must be 0 or more, not -1" in capsys.readouterr().err


def test_anchor_target_is_each_chunks_last_frame_pooled_and_folded() -> None:
    from deployments.training.vae_training import ANCHORED_CHANNELS, anchor_target

    torch.manual_seed(0)
    start = torch.rand(2, 3, 9, 64, 64) * 2 - 1  # a stream's start: frame 0, then two chunks of 4
    target = anchor_target(start, spatial_factor=4, first_chunk=True)
    assert target.shape == (2, ANCHORED_CHANNELS, 3, 16, 16)
    for latent, frame in enumerate((0, 4, 8)):
        pooled = torch.nn.functional.avg_pool2d(start[:, :, frame], 2)  # (2, 3, 32, 32)
        # Channel 4c + 2i + j holds colour c at sub-position (i, j) of each 2x2 cell.
        for c in range(3):
            for i in range(2):
                for j in range(2):
                    assert torch.allclose(target[:, 4 * c + 2 * i + j, latent], pooled[:, c, i::2, j::2])
    middle = anchor_target(start[:, :, 1:], spatial_factor=4, first_chunk=False)  # mid-stream: chunks only
    assert torch.equal(middle, target[:, :, 1:])


def test_the_context_probe_tells_a_model_that_reads_its_context_from_one_that_does_not() -> None:
    from deployments.generation.camera import Pose
    from deployments.training.probe import context_probe
    from deployments.training.transformer_training import Sample, TeacherForcing

    # A latent world that pans: each latent frame is the one before, moved 2 anchored pixels sideways.
    torch.manual_seed(0)
    base = torch.nn.functional.avg_pool2d(torch.randn(1, 16, 64, 96), 3, stride=1, padding=1)[0] * 3
    frames = torch.stack([base[:, ::2, 2 * j : 2 * j + 64 : 2][:, :, :16] for j in range(12)], dim=1)  # (16, 12, 16, 16)
    samples = [Sample.of_blocks(frames, [0, 1, 2, 3], 3, [(("a city plaza", 1.0),)] * 4, [(Pose(),) * 3] * 4, False)]

    class Oracle:  # the edge of the unit: a "transformer" whose velocity is exact, or blind
        fpb = 3
        transformer = torch.nn.Linear(1, 1)
        ground_depth = None
        condition = TeacherForcing.condition  # the channels as the trainer builds them

        def __init__(self, exact: bool) -> None:
            self.exact = exact

        def velocity(self, samples, clean, sig, noise):
            return noise - clean if self.exact else noise - clean.mean(dim=(3, 4), keepdim=True)

    mean, std = torch.zeros(16), torch.full((16,), 0.3)
    good, blind = (context_probe(Oracle(exact), samples, mean, std) for exact in (True, False))
    assert good["psnr_db"] > max(good["copy_previous_psnr_db"], good["given_frame_psnr_db"], blind["psnr_db"]) + 10
    assert good["motion_sign_agreement"] == 1.0 and good["moving_frames"] > 0
    assert good["anchored_mse"] < 1e-6 < blind["anchored_mse"] and good["given_frame_anchored_mse"] == blind["given_frame_anchored_mse"] > 0
    assert blind["motion_sign_agreement"] < 1.0


@pytest.mark.parametrize("reprojection,switch,bands", [(None, None, 0), (1.0, None, 0), (1.0, 0, 0), (None, 2, 0), (1.0, None, 2)])
def test_teacher_forcing_predicts_what_the_engine_predicts(tmp_path, reprojection, switch, bands) -> None:
    """A block's velocity under teacher forcing equals the engine's first denoising step of that block,
    given the same earlier block, noise, prompt and camera: the model is trained on what it is served
    (with the last frame reprojected to the turning camera's poses too, with the prompt switched
    before the block, at once or over `switch` blocks, and with the camera adapter's position code)."""
    from deployments.contract.events import Interaction
    from deployments.contract.session_spec import SessionSpec
    from deployments.generation.checkpoint import load_world_model
    from deployments.generation.engine import WorldModelEngine
    from deployments.generation.interactions import Director
    from deployments.models.tiny_world_model import WorldModelSpec, make_world_model
    from deployments.training.transformer_training import Sample, TeacherForcing, TransformerTraining

    spec = WorldModelSpec(last_frame_condition=True, last_frame_reprojection=reprojection, camera_position_bands=bands)
    path = make_world_model(tmp_path / "last-frame", spec)
    if bands:  # as training leaves it: the position code in use
        from deployments.generation.camera_adapter import CameraAdapter

        adapter = CameraAdapter.from_pretrained(path / "camera_adapter")
        with torch.no_grad():
            adapter.proj_position.weight.normal_(std=0.5)
        adapter.save_pretrained(path / "camera_adapter")
    engine = WorldModelEngine.from_pretrained(path)
    session = engine.open_session(SessionSpec(prompt="a sandy desert", height=64, width=64, seed=3))
    first = engine.generate_block(session)
    turn = Interaction(event_id="turn", actions=(("l", "w"),) * 3)
    if switch is not None:
        turn = Interaction(event_id="turn", actions=turn.actions, prompt="a lava field", transition_chunks=switch)
    session.submit(turn)
    director = Director("a sandy desert", 3, accepts_camera=True)  # the same session's poses and prompts, as a trajectory stores them
    plans = [director.plan_block()]
    director.submit(turn)
    plans.append(director.plan_block())
    poses = [tuple(p.relative_to(plan.reference_pose) for p in plan.poses) for plan in plans]
    z = engine.vae.config.z_dim
    seen: dict = {}

    def inputs(module, args):
        seen.setdefault("noise", args[0][:, :z].clone())

    def outputs(module, args, out):
        seen.setdefault("velocity", out[0].float().clone())

    hooks = [engine.transformer.patch_embedding.register_forward_pre_hook(inputs), engine.transformer.register_forward_hook(outputs)]
    second = engine.generate_block(session)
    for hook in hooks:
        hook.remove()

    parts = load_world_model(path)
    trainer = TeacherForcing(parts.transformer, parts.camera_adapter, parts.text_encoder, parts.tokenizer, height=64, width=64,
                             frames_per_block=3, shift=parts.flow_shift, config=TransformerTraining(blocks=2),
                             ground_depth=parts.reprojection_ground_depth)
    latents = torch.cat([first.latents[0], second.latents[0]], dim=1)
    mixes = [plan.prompt_mix for plan in plans]
    assert (mixes[1] != mixes[0]) == (switch is not None)
    sample = Sample.of_blocks(latents, [0, 1], 3, mixes, poses, False)
    noise = torch.cat([torch.zeros_like(seen["noise"]), seen["noise"]], dim=2)
    sig = np.array([[0.5, session.sigmas[0]]])
    with torch.no_grad():
        velocity = trainer.velocity([sample], latents[None], sig, noise)
    torch.testing.assert_close(velocity[:, :, 3:], seen["velocity"], atol=1e-4, rtol=1e-3)
    # The channels carried the first block's last frame; without them the prediction is another one.
    blank = Sample(sample.latents, sample.mixes, sample.poses, False, torch.zeros_like(sample.before), views=sample.views)
    with torch.no_grad():
        assert not torch.allclose(trainer.velocity([blank], latents[None], sig, noise)[:, :, 3:], seen["velocity"], atol=1e-3)


def test_copy_init_starts_every_block_at_the_frame_it_is_given(tmp_path) -> None:
    """After `init_as_copy` the stock transformer's velocity at sigma 1 is `noise - given`: a block's clean
    estimate is the last frame before it, whatever the noise, the prompt or the camera."""
    from deployments.generation.camera import Pose
    from deployments.generation.checkpoint import load_world_model
    from deployments.models.tiny_world_model import WorldModelSpec, make_world_model
    from deployments.training.copy_init import copy_layout, init_as_copy
    from deployments.training.transformer_training import Sample, TeacherForcing, TransformerTraining

    spec = WorldModelSpec(last_frame_condition=True, num_attention_heads=2, attention_head_dim=66)
    parts = load_world_model(make_world_model(tmp_path / "last-frame", spec))
    trainer = TeacherForcing(parts.transformer, parts.camera_adapter, parts.text_encoder, parts.tokenizer, height=64, width=64,
                             frames_per_block=3, shift=parts.flow_shift, config=TransformerTraining(blocks=3))
    torch.manual_seed(0)
    latents = torch.randn(16, 9, 8, 8)
    poses = [(Pose(translation=(0.1 * i, 0.0, 0.0)),) * 3 for i in range(3)]
    sample = Sample.of_blocks(latents, [0, 1, 2], 3, [(("a snowy field", 1.0),)] * 3, poses, False)
    noise = torch.randn(1, 16, 9, 8, 8)
    sig = np.ones((1, 3))
    # Blocks 1 and 2 are given the frame before them on each of their frames.
    given = trainer.condition([sample], latents[None], sample.before[None])[:, 4:, 3:]

    def error() -> float:
        with torch.no_grad():
            v = trainer.velocity([sample], latents[None], sig, noise)[:, :, 3:]
        target = noise[:, :, 3:] - given
        return float((v - target).norm() / target.norm())

    assert error() > 0.9
    init_as_copy(parts.transformer, parts.camera_adapter)
    assert error() < 0.1
    # The blocks read the given frame but not the constant anchors that steady the output norm.
    seen = []
    hook = parts.transformer.blocks[0].attn1.register_forward_pre_hook(lambda m, args: seen.append(args[0]))
    error()
    hook.remove()
    block_input = seen[0][0, -64:]  # the last block's noisy tokens
    layout = copy_layout(parts.transformer)
    assert block_input[:, layout.anchors].abs().max() < 1e-5 and block_input[:, layout.given].abs().mean() > 0.1


def test_copy_init_refuses_a_transformer_without_the_frame_channels(tmp_path) -> None:
    from deployments.generation.checkpoint import load_world_model
    from deployments.models.tiny_world_model import WorldModelSpec, make_world_model
    from deployments.training.copy_init import init_as_copy

    parts = load_world_model(make_world_model(tmp_path / "t2v", WorldModelSpec(num_attention_heads=2, attention_head_dim=66)))
    with pytest.raises(ValueError, match=r"\(36 input channels\), not 16"):
        init_as_copy(parts.transformer)


def test_switch_weight_leaves_prompt_transitions_out_of_the_loss(tmp_path) -> None:
    """With `switch_weight=0` the loss is the plain loss over the blocks whose prompt did not change."""
    from dataclasses import replace

    from deployments.generation.camera import Pose
    from deployments.generation.checkpoint import load_world_model
    from deployments.models.tiny_world_model import WorldModelSpec, make_world_model
    from deployments.training.transformer_training import Sample, TeacherForcing, TransformerTraining

    parts = load_world_model(make_world_model(tmp_path / "last-frame", WorldModelSpec(last_frame_condition=True)))
    trainer = TeacherForcing(parts.transformer, parts.camera_adapter, parts.text_encoder, parts.tokenizer, height=64, width=64,
                             frames_per_block=3, shift=parts.flow_shift, config=TransformerTraining(blocks=3))
    torch.manual_seed(0)
    latents = torch.randn(16, 12, 8, 8)
    snow, lava = (("a snowy field", 1.0),), (("a lava field", 1.0),)
    sample = Sample.of_blocks(latents, [0, 1, 3], 3, [snow, snow, snow, lava], [(Pose(),) * 3] * 4, False)
    assert sample.switching == (False, False, True)  # block 3 follows block 2's prompt, not block 1's

    def loss(config: TransformerTraining) -> torch.Tensor:
        trainer.config = config
        with torch.no_grad():
            return trainer.loss([sample], np.random.default_rng(1), torch.Generator().manual_seed(1))

    def kept_only(rng_seed: int) -> torch.Tensor:  # the same draw, measured on blocks 0 and 1 alone
        rng, generator = np.random.default_rng(rng_seed), torch.Generator().manual_seed(rng_seed)
        cfg = trainer.config
        x0 = sample.latents[None]
        sig = np.where(rng.random((1, 3)) < cfg.schedule_fraction, rng.choice(trainer.sigmas, size=(1, 3)), 0.0)
        noise = torch.randn(x0.shape, generator=generator)
        with torch.no_grad():
            v = trainer.velocity([sample], x0, sig, noise)
        return ((v - (noise - x0))[:, :, :6] ** 2).mean()

    exact = {"schedule_fraction": 1.0, "context_noise_fraction": 0.0, "context_blur_fraction": 0.0}
    plain = loss(TransformerTraining(blocks=3, switch_weight=1.0, **exact))
    without = loss(TransformerTraining(blocks=3, switch_weight=0.0, **exact))
    torch.testing.assert_close(without, kept_only(1))
    assert not torch.isclose(plain, without)
    halved = loss(replace(trainer.config, switch_weight=0.5))
    assert min(plain, without) < halved < max(plain, without)


def test_text_to_video_samples_come_from_sessions_that_start_where_text_to_video_starts() -> None:
    """Samples without a start image are drawn from the listed (origin-start) trajectories only; the rest from all."""
    from deployments.generation.camera import Pose
    from deployments.training.dataset import starts_at_origin
    from deployments.training.transformer_training import TransformerTraining, draw_samples

    fpb, blocks = 3, 4
    latents = [torch.full((2, fpb * blocks, 4, 4), float(i)) for i in range(6)]  # trajectory i holds the value i
    mixes = [[(("a lava field", 1.0),)] * blocks] * 6
    poses = [[(Pose(),) * fpb] * blocks] * 6
    origin = [i for i in range(6) if starts_at_origin(i, 6)]
    assert origin == [0, 1, 2]
    rng = np.random.default_rng(0)
    drawn = [s for _ in range(40) for s in draw_samples(rng, TransformerTraining(batch=4, blocks=blocks), fpb, latents, mixes, poses, origin)]
    without = {int(s.latents[0, 0, 0, 0]) for s in drawn if not s.image}
    with_image = {int(s.latents[0, 0, 0, 0]) for s in drawn if s.image}
    assert without == {0, 1, 2} and with_image == set(range(6))


def test_a_blurred_context_keeps_the_target_sharp() -> None:
    """With context blur on, the clean blocks and the given frames the model reads are softened; what it
    must predict (the velocity towards the true blocks) is not."""
    from deployments.generation.camera import Pose
    from deployments.training.transformer_training import BLUR_FACTORS, Sample, TeacherForcing, TransformerTraining, soften

    checker = (torch.arange(16)[:, None] + torch.arange(16)[None, :]) % 2 * 2.0 - 1.0
    assert soften(checker.expand(2, 3, 16, 16), 2).abs().max() < 1e-6  # two-pixel detail is gone
    torch.testing.assert_close(soften(torch.full((2, 3, 16, 16), 0.7), 4), torch.full((2, 3, 16, 16), 0.7))

    torch.manual_seed(0)
    sample = Sample.of_blocks(torch.randn(4, 9, 16, 16), [0, 1, 2], 3, [(("a city plaza", 1.0),)] * 3, [(Pose(),) * 3] * 3, False)
    seen = {}

    class Spy(TeacherForcing):  # the edge of the unit: records what the model would read, predicts zero
        def __init__(self) -> None:
            self.sigmas, self.shift, self.fpb = [1.0], 1.0, 3

        def velocity(self, samples, clean, sig, noise, before=None):
            seen.update(clean=clean, before=before)
            return torch.zeros_like(clean)

    def read(blur: float) -> dict:
        config = TransformerTraining(blocks=3, context_noise_fraction=0.0, context_blur_fraction=blur)
        loss = Spy().loss([sample], np.random.default_rng(0), torch.Generator().manual_seed(0), config)
        return dict(seen, loss=loss)

    sharp, soft = read(0.0), read(1.0)
    torch.testing.assert_close(sharp["clean"][0], sample.latents)
    assert any(torch.allclose(soft["clean"][0], soften(sample.latents, f)) and torch.allclose(soft["before"][0], soften(sample.before, f))
               for f in BLUR_FACTORS)
    torch.testing.assert_close(sharp["loss"], soft["loss"])  # the same target: the true, sharp blocks


def test_an_own_context_is_the_models_one_step_guess_and_the_target_stays_true() -> None:
    """With own context on, the clean blocks the model reads are its own guesses of them, and so is each
    given frame whose block before it is in the sample; the frame before a jump stays the true one."""
    from deployments.generation.camera import Pose
    from deployments.training.transformer_training import Sample, TeacherForcing, TransformerTraining

    torch.manual_seed(0)
    latents = torch.randn(4, 15, 8, 8)
    sample = Sample.of_blocks(latents, [0, 2, 3], 3, [(("a city plaza", 1.0),)] * 5, [(Pose(),) * 3] * 5, False)
    assert sample.indices == (0, 2, 3)
    marker = torch.randn(1, 4, 9, 8, 8)  # what the spy's model "makes" of every block
    calls = []

    class Spy(TeacherForcing):  # the edge of the unit: records what the model reads
        def __init__(self) -> None:
            self.sigmas, self.shift, self.fpb = [1.0], 1.0, 3

        def velocity(self, samples, clean, sig, noise, before=None):
            calls.append(dict(clean=clean, sig=sig, before=before))
            if len(calls) % 2 == 1 and np.all(sig == 1.0) and own_on:
                return noise - marker
            return noise - sample.latents[None]  # the training forward: a perfect model of the true blocks

    own_on = False

    def read(own: float) -> dict:
        nonlocal own_on
        calls.clear()
        own_on = own > 0
        config = TransformerTraining(blocks=3, context_noise_fraction=0.0, context_blur_fraction=0.0, own_context_fraction=own)
        loss = Spy().loss([sample], np.random.default_rng(0), torch.Generator().manual_seed(0), config)
        return dict(calls[-1], loss=loss, calls=len(calls))

    true, own = read(0.0), read(1.0)
    assert true["calls"] == 1 and own["calls"] == 2
    torch.testing.assert_close(true["clean"][0], sample.latents)
    torch.testing.assert_close(own["clean"], marker)
    torch.testing.assert_close(own["before"][0, :, 1], sample.before[:, 1])  # block 2 follows a jump: its true frame before
    torch.testing.assert_close(own["before"][0, :, 2], marker[0, :, 5])  # block 3 follows block 2: the guess's last frame
    assert not torch.allclose(own["before"][0, :, 2], sample.before[:, 2])
    assert true["loss"] == 0 and own["loss"] == 0  # the target is the true blocks, whatever the context


def test_block_weights_pick_out_transitions_and_text_to_video_first_blocks() -> None:
    from deployments.generation.camera import Pose
    from deployments.training.transformer_training import Sample, TransformerTraining, block_weight

    mixes = [(("a city plaza", 1.0),), (("a city plaza", 0.5), ("a lava field", 0.5)), (("a lava field", 1.0),)]
    latents = torch.zeros(4, 9, 8, 8)
    cfg = TransformerTraining(switch_weight=0.25, first_block_weight=3.0)
    text_only = Sample.of_blocks(latents, [0, 1, 2], 3, mixes, [(Pose(),) * 3] * 3, False)
    with_image = Sample.of_blocks(latents, [0, 1, 2], 3, mixes, [(Pose(),) * 3] * 3, True)
    assert [block_weight(cfg, text_only, k) for k in range(3)] == [3.0, 0.25, 0.25]
    assert [block_weight(cfg, with_image, k) for k in range(3)] == [1.0, 0.25, 0.25]
    assert [block_weight(TransformerTraining(), text_only, k) for k in range(3)] == [1.0, 0.3, 0.3]


def test_transition_samples_end_inside_a_prompt_transition() -> None:
    from deployments.generation.camera import Pose
    from deployments.training.transformer_training import TransformerTraining, draw_samples, transition_blocks

    fpb, blocks = 3, 6
    plaza, lava = (("a city plaza", 1.0),), (("a lava field", 1.0),)
    mixes = [[plaza] * 4 + [lava] * 2, [plaza] * 6, [plaza] * 3 + [(("a city plaza", 0.5), ("a lava field", 0.5))] + [lava] * 2]
    latents = [torch.full((2, fpb * blocks, 4, 4), float(i)) for i in range(3)]
    poses = [[(Pose(),) * fpb] * blocks] * 3
    assert transition_blocks(mixes, fpb, latents, 4) == [(0, [0, 2, 3, 4]), (2, [0, 1, 2, 3]), (2, [0, 2, 3, 4])]
    # With a tail, also the blocks that must settle after a transition has ended (and no other).
    assert transition_blocks(mixes, fpb, latents, 4, tail=1) == [(0, [0, 2, 3, 4]), (0, [0, 3, 4, 5]), (2, [0, 1, 2, 3]), (2, [0, 2, 3, 4]), (2, [0, 3, 4, 5])]
    rng = np.random.default_rng(0)
    recipe = TransformerTraining(batch=4, blocks=4, transition_fraction=1.0)
    drawn = [s for _ in range(20) for s in draw_samples(rng, recipe, fpb, latents, mixes, poses, text_to_video=[0, 1])]
    assert all(s.switching[-1] for s in drawn)  # each sample's last block is a transition block
    assert {int(s.latents[0, 0, 0, 0]) for s in drawn if not s.image} == {0}  # text-to-video only from the listed trajectories
    assert {int(s.latents[0, 0, 0, 0]) for s in drawn if s.image} == {0, 2}


def test_lone_first_blocks_open_text_to_video_sessions_half_on_named_prompts() -> None:
    """`first_blocks`: one-block samples, each a text-to-video session's first block from the listed
    trajectories, every other one from a session that opens on a prompt the README names."""
    from deployments.generation.camera import Pose
    from deployments.training.trajectories import DEMO_PROMPTS
    from deployments.training.transformer_training import draw_first_blocks

    fpb, blocks = 3, 4
    latents = [torch.full((2, fpb * blocks, 4, 4), float(i)) + torch.arange(fpb * blocks).view(1, -1, 1, 1) / 100 for i in range(6)]
    opening = [(("lava everywhere", 1.0),), ((DEMO_PROMPTS[1], 1.0),), (("lava and snow", 1.0),), ((DEMO_PROMPTS[0], 1.0),),
               ((DEMO_PROMPTS[2], 1.0),), ((DEMO_PROMPTS[3], 0.5), ("lava everywhere", 0.5))]
    mixes = [[first] + [(("a lava field", 1.0),)] * (blocks - 1) for first in opening]
    poses = [[(Pose(),) * fpb] * blocks] * 6
    drawn = draw_first_blocks(np.random.default_rng(0), 40, fpb, latents, mixes, poses, text_to_video=[0, 1, 2, 3])
    assert len(drawn) == 40 and not any(s.image for s in drawn)
    assert all(s.indices == (0,) and s.latents.shape[1] == fpb for s in drawn)
    torch.testing.assert_close(drawn[0].latents[0, :, 0, 0] % 1, torch.tensor([0.0, 0.01, 0.02]))  # the session's first frames
    sources = [int(s.latents[0, 0, 0, 0]) for s in drawn]
    assert set(sources) <= {0, 1, 2, 3}  # listed trajectories only (4 opens on a named prompt but is not listed)
    assert set(sources[::2]) == {1, 3}  # every other one opens on a named prompt
    assert set(sources[1::2]) == {0, 1, 2, 3}
