"""`rtv train-world` runs every stage end to end (a few steps: CI never trains for real), and what it
writes installs as a checkpoint the engine serves."""

from __future__ import annotations

import json

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
    assert json.loads((work / "vae" / "training.json").read_text())["held_out_psnr_db"] > 0
    assert (work / "latents.pt").is_file() and (work / "transformer" / "checkpoint.pt").is_file()
    stages = [json.loads(line)["stage"] for line in (work / "train.log").read_text().splitlines()]
    assert {"render", "vae", "encode", "transformer", "export"} <= set(stages)
    sizes = {f.name: f.stat().st_size for f in (smoke_run / "weights").iterdir()}
    assert set(sizes) == {"transformer.safetensors", "vae.safetensors", "text_encoder.safetensors", "camera_adapter.safetensors", "spec.json"}


def test_a_second_run_resumes_instead_of_starting_over(smoke_run) -> None:
    work = smoke_run / "work"
    before = (work / "transformer" / "checkpoint.pt").stat().st_mtime
    assert cli.main(["train-world", str(smoke_run / "weights"), "--work", str(work), "--smoke", "--threads", "1", "--stages", "render,vae,encode,world"]) == 0
    assert json.loads((work / "train.log").read_text().splitlines()[-1]).get("resumed_at") == 2  # nothing left to train
    assert (work / "transformer" / "checkpoint.pt").stat().st_mtime == before


def test_exported_weights_install_exactly_and_serve(smoke_run, tmp_path) -> None:
    from safetensors.torch import load_file

    from deployments.generation.engine import WorldModelEngine
    from deployments.generation.session import SessionConfig
    from deployments.models.builtin_world_model import install_builtin_world_models

    dirs = install_builtin_world_models(tmp_path, smoke_run / "weights")
    shipped = load_file(smoke_run / "weights" / "transformer.safetensors")
    installed = load_file(dirs["world-model-i2v"] / "transformer" / "diffusion_pytorch_model.safetensors")
    assert set(shipped) == set(installed)
    for name, tensor in shipped.items():
        assert torch.equal(tensor.float(), installed[name].float()), name
    t2v = load_file(dirs["world-model"] / "transformer" / "diffusion_pytorch_model.safetensors")
    assert torch.equal(t2v["patch_embedding.weight"].float(), shipped["patch_embedding.weight"][:, :16].float())
    for name, image in (("world-model", None), ("world-model-i2v", np.zeros((64, 64, 3), np.uint8))):
        engine = WorldModelEngine.from_pretrained(dirs[name])
        session = engine.open_session(SessionConfig(prompt="a snowy field", height=64, width=64, seed=0, image=image))
        assert engine.generate_block(session).frames.shape == (9, 64, 64, 3)


def test_bad_arguments_are_one_line_errors(capsys) -> None:
    assert cli.main(["train-world", "--stages", "vae,paint"]) == 2
    assert "unknown stage 'paint'" in capsys.readouterr().err
    assert cli.main(["train-world", "--workers", "0"]) == 2
    assert "--workers must be at least 1" in capsys.readouterr().err
