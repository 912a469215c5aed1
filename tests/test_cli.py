"""`rtv`: fast help, `rtv make-models`, and `rtv rollout` on the tiny world models (good and bad inputs)."""

from __future__ import annotations

import os

# No hub here: any attempt to download must fail loudly, not hang.
os.environ["HF_HUB_OFFLINE"] = "1"

import json
import pathlib
import shutil
import subprocess
import sys
import time

import numpy as np
import pytest

from clients import cli
from clients.cli.rollout import (
    RolloutInputError,
    load_action_script,
    prepare_rollout,
    run_rollout,
)
from deployments.models.tiny_world_model import WorldModelSpec, make_world_model

REPO = pathlib.Path(__file__).resolve().parents[1]
RTV_SCRIPT = pathlib.Path(sys.executable).parent / "rtv"
FRAMES_PER_BLOCK = WorldModelSpec().num_frames_per_block  # 3

# Three blocks of keyboard actions, one key list per latent frame; block 1 presses nothing.
ACTIONS = [
    [["w"], ["w", "l"], []],
    [[], [], []],
    [["a", "i"], ["s"], ["d", "j", "k"]],
]


def _env() -> dict[str, str]:
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    return env


def _rtv(*args: str, timeout: float = 110) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "clients.cli", *args], cwd=REPO, env=_env(), capture_output=True, text=True, timeout=timeout
    )


@pytest.fixture(scope="module")
def t2v_model(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    return make_world_model(tmp_path_factory.mktemp("ckpt") / "world-model", WorldModelSpec(), seed=0)


@pytest.fixture(scope="module")
def i2v_model(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    return make_world_model(tmp_path_factory.mktemp("ckpt") / "world-model-i2v", WorldModelSpec(image_conditioned=True), seed=0)


@pytest.fixture(scope="module")
def nocam_model(t2v_model: pathlib.Path, tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    """The text-to-video checkpoint without its camera adapter (a copy; cheaper than building one)."""
    out = tmp_path_factory.mktemp("ckpt") / "world-model-nocam"
    shutil.copytree(t2v_model, out, ignore=shutil.ignore_patterns("camera_adapter"))
    return out


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    from PIL import Image

    d = tmp_path_factory.mktemp("inputs")
    (d / "actions.json").write_text(json.dumps(ACTIONS))
    rng = np.random.default_rng(0)
    Image.fromarray(rng.integers(0, 256, (48, 80, 3), dtype=np.uint8)).save(d / "scene.png")
    (d / "not-an-image.png").write_text("this is not a PNG")
    (d / "empty-folder").mkdir()
    return d


def _check_files(out: pathlib.Path, frames: list[int], height: int, width: int) -> dict:
    summary = json.loads((out / "summary.json").read_text())
    assert summary["chunks_delivered"] == summary["chunks_expected"] == len(frames)
    assert summary["frames_delivered"] == summary["frames_expected"] == sum(frames)
    assert summary["matches_offline_frame_timeline"] is True
    assert summary["request_id"].startswith("rollout-") and len(summary["request_id"]) == len("rollout-") + 32
    assert (summary["height"], summary["width"]) == (height, width)
    assert 0 < summary["time_to_first_frame_seconds"] <= summary["total_seconds"]
    assert 0 <= summary["load_seconds"] <= summary["total_seconds"]
    for k, n in enumerate(frames):
        chunk = summary["chunks"][k]
        assert chunk["index"] == k and chunk["num_frames"] == n
        assert chunk["shape"] == [n, height, width, 3]
        # The seed's names for the same facts.
        assert (chunk["chunk_index"], chunk["frames"], chunk["frame_shape"]) == (k, n, [height, width, 3])
        assert chunk["chunk_latency_seconds"] == chunk["latency_seconds"] > 0
        assert chunk["metadata"]["block_index"] == k and chunk["metadata"]["num_frames"] == n
        arr = np.load(out / f"chunk_{k:03d}.npy")
        assert arr.dtype == np.uint8 and arr.shape == (n, height, width, 3)
        meta = json.loads((out / f"chunk_{k:03d}.json").read_text())
        assert meta["block_index"] == k and meta["num_frames"] == n and meta["latency_seconds"] > 0
    assert not (out / f"chunk_{len(frames):03d}.npy").exists()
    return summary


# -- help ---------------------------------------------------------------------------


@pytest.mark.timeout(120)
@pytest.mark.parametrize("args", [["--help"], ["rollout", "--help"]], ids=["top", "rollout"])
def test_help_is_fast(args: list[str]) -> None:
    commands = [[sys.executable, "-m", "clients.cli", *args]]
    if RTV_SCRIPT.exists():
        commands.append([str(RTV_SCRIPT), *args])
    for command in commands:
        t0 = time.perf_counter()
        proc = subprocess.run(command, cwd=REPO, env=_env(), capture_output=True, text=True, timeout=30)
        elapsed = time.perf_counter() - t0
        assert proc.returncode == 0, proc.stderr
        assert elapsed < 2.0, f"{command} took {elapsed:.2f}s"
        if args == ["--help"]:
            assert "rollout" in proc.stdout and "make-models" in proc.stdout
        else:
            assert "--action-script" in proc.stdout and "--num-blocks" in proc.stdout and "--output-dir" in proc.stdout


@pytest.mark.timeout(120)
def test_parser_imports_nothing_heavy() -> None:
    code = (
        "import sys; from clients import cli; cli.build_parser(); "
        "print(sorted(m for m in ('torch', 'numpy', 'diffusers', 'transformers') if m in sys.modules))"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=_env(), capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


# -- make-models ---------------------------------------------------------------------


@pytest.mark.timeout(120)
def test_make_models_writes_three_checkpoints(tmp_path: pathlib.Path, capsys: pytest.CaptureFixture) -> None:
    assert cli.main(["make-models", str(tmp_path / "models"), "--seed", "0"]) == 0
    out = capsys.readouterr().out
    for name in ("world-model", "world-model-i2v", "omni"):
        folder = tmp_path / "models" / name
        assert folder.is_dir() and any(folder.iterdir()), name
        assert f"{name}: {folder}" in out
    for name in ("world-model", "world-model-i2v"):
        assert (tmp_path / "models" / name / "model_index.json").is_file()
        assert (tmp_path / "models" / name / "transformer" / "config.json").is_file()


# -- good rollouts ---------------------------------------------------------------------


@pytest.mark.timeout(120)
def test_rollout_with_action_script(t2v_model: pathlib.Path, inputs: pathlib.Path, tmp_path: pathlib.Path) -> None:
    out = tmp_path / "out"
    proc = _rtv(
        "rollout", "--model", str(t2v_model), "--prompt", "a red room",
        "--action-script", str(inputs / "actions.json"), "--output-dir", str(out), "--seed", "3",
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == "", "library noise leaked onto stderr"
    assert str(out / "summary.json") in proc.stdout
    summary = _check_files(out, [9, 12, 12], 64, 64)
    # One JSON line per block on stdout as it is made, as the seed's example prints.
    lines = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert [(c["chunk_index"], c["frames"], c["frame_shape"]) for c in lines] == [(0, 9, [64, 64, 3]), (1, 12, [64, 64, 3]), (2, 12, [64, 64, 3])]
    assert summary["model"] == str(t2v_model)
    assert summary["prompt"] == "a red room" and summary["seed"] == 3
    for k, chunk in enumerate(summary["chunks"]):
        # Each block's actions start on (and, at exactly one block long, complete on) that block.
        assert chunk["metadata"]["started_event_ids"] == [f"actions-{k:03d}"]
        assert chunk["metadata"]["completed_event_ids"] == [f"actions-{k:03d}"]


@pytest.mark.timeout(120)
def test_rollout_image_to_video(i2v_model: pathlib.Path, inputs: pathlib.Path, tmp_path: pathlib.Path, capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "out"
    rc = cli.main([
        "rollout", "--model", str(i2v_model), "--prompt", "a beach", "--image", str(inputs / "scene.png"),
        "--num-blocks", "2", "--height", "32", "--width", "48", "--output-dir", str(out),
    ])
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    summary = _check_files(out, [9, 12], 32, 48)
    assert summary["image"] == str(inputs / "scene.png")
    assert "2/2 blocks" in captured.out and "matches" in captured.out


@pytest.mark.timeout(120)
def test_rollout_takes_the_seed_request_id_device_and_dtype(t2v_model: pathlib.Path, tmp_path: pathlib.Path) -> None:
    def frames(out, *extra):
        assert cli.main(["rollout", "--model", str(t2v_model), "--prompt", "a red room", "--num-blocks", "1", "--output-dir", str(out), *extra]) == 0
        return json.loads((out / "summary.json").read_text()), np.load(out / "chunk_000.npy")

    named, full = frames(tmp_path / "a", "--request-id", "req-42", "--device", "cpu", "--dtype", "float32")
    assert named["request_id"] == "req-42"
    unnamed, reduced = frames(tmp_path / "b", "--dtype", "bfloat16")
    assert unnamed["request_id"].startswith("rollout-")
    # The dtype reaches the model: the same seed gives other frames in bfloat16.
    assert not np.array_equal(full, reduced)


@pytest.mark.timeout(300)
def test_rollout_over_two_tensor_parallel_ranks_makes_the_frames_of_one(t2v_model: pathlib.Path, inputs: pathlib.Path, tmp_path: pathlib.Path) -> None:
    def run(out, *extra):
        argv = ["rollout", "--model", str(t2v_model), "--prompt", "a red room", "--action-script", str(inputs / "actions.json"),
                "--output-dir", str(out), "--device", "cpu", *extra]
        assert cli.main(argv) == 0
        summary = json.loads((out / "summary.json").read_text())
        return summary, [np.load(out / f"chunk_{k:03d}.npy") for k in range(summary["chunks_delivered"])]

    one, frames_one = run(tmp_path / "tp1")
    two, frames_two = run(tmp_path / "tp2", "--tensor-parallel-size", "2", "--enforce-eager")
    assert (two["tensor_parallel_size"], two["enforce_eager"], one["tensor_parallel_size"]) == (2, True, 1)
    assert [c["metadata"] for c in two["chunks"]] == [c["metadata"] for c in one["chunks"]]  # the actions landed alike
    for a, b in zip(frames_one, frames_two, strict=True):
        assert a.shape == b.shape and np.abs(a.astype(np.int16) - b.astype(np.int16)).max() <= 1


def test_block_count_defaults(t2v_model: pathlib.Path, inputs: pathlib.Path, tmp_path: pathlib.Path) -> None:
    assert prepare_rollout(t2v_model, "x", tmp_path).num_blocks == 4
    assert prepare_rollout(t2v_model, "x", tmp_path, num_blocks=2).num_blocks == 2
    plan = prepare_rollout(t2v_model, "x", tmp_path, action_script=inputs / "actions.json")
    assert plan.num_blocks == 3
    assert prepare_rollout(t2v_model, "x", tmp_path, action_script=inputs / "actions.json", num_blocks=3).num_blocks == 3


def test_action_script_parses_empty_key_lists(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "a.json"
    path.write_text(json.dumps(ACTIONS))
    assert load_action_script(path, FRAMES_PER_BLOCK) == [
        (("w",), ("w", "l"), ()),
        ((), (), ()),
        (("a", "i"), ("s",), ("d", "j", "k")),
    ]


# -- bad inputs ------------------------------------------------------------------------

# name -> (argv after `rollout` with {t2v} {i2v} {nocam} {inputs} {out} placeholders, action script text or None, what stderr must say)
BAD_INPUTS = {
    "invalid-json": ([], '[[["w"], [], []]', "not valid JSON"),
    "script-not-a-list": ([], '{"blocks": []}', "must be a list with one entry per block, each a list of 3 per-latent-frame lists of keys, got a JSON object"),
    "script-empty": ([], "[]", "got no blocks"),
    "block-not-a-list": ([], '["w"]', "json[0]: must be a list of 3 per-latent-frame lists of keys (the model's frames per block), got a JSON string"),
    "wrong-frames-per-block": ([], '[[["w"], [], []], [["w"], []]]', "json[1]: must be a list of 3 per-latent-frame lists of keys (the model's frames per block), got 2 latent frames"),
    "frame-not-a-list": ([], '[["w", "a", "s"]]', "json[0][0] must be a list of keys, got a JSON string"),
    "non-string-key": ([], '[[["w"], [1], []]]', "json[0][1] has unknown key 1; keys are a d i j k l s w"),
    "unknown-key": ([], '[[["w"], ["q"], []]]', "unknown key 'q'"),
    "height-not-multiple": (["--height", "60"], None, "height must be a positive multiple of 16"),
    "width-zero": (["--width", "0"], None, "width must be a positive multiple of 16"),
    "height-negative": (["--height", "-16"], None, "height must be a positive multiple of 16"),
    "blank-prompt": (["--prompt", "   "], None, "prompt must be a non-blank string"),
    "missing-model": (["--model", "{inputs}/no-such-model"], None, "no-such-model does not exist"),
    "not-a-checkpoint": (["--model", "{inputs}/empty-folder"], None, "not a diffusers-layout world model checkpoint"),
    "missing-image-file": (["--model", "{i2v}", "--image", "{inputs}/missing.png"], None, "image file"),
    "unreadable-image": (["--model", "{i2v}", "--image", "{inputs}/not-an-image.png"], None, "cannot read image"),
    "missing-action-script": (["--action-script", "{inputs}/missing.json"], None, "action script"),
    "image-for-text-to-video": (["--image", "{inputs}/scene.png"], None, "text-to-video"),
    "no-image-for-image-to-video": (["--model", "{i2v}"], None, "image-to-video"),
    "num-blocks-disagrees": (["--num-blocks", "2"], '[[["w"], [], []], [[], [], []], [[], [], []]]', "--num-blocks 2 disagrees"),
    "num-blocks-zero": (["--num-blocks", "0"], None, "--num-blocks must be a positive integer"),
    "actions-without-camera": (["--model", "{nocam}"], '[[["w"], [], []]]', "no camera adapter"),
    "unknown-device": (["--device", "tpu"], None, "--device must be cpu or cuda"),
    "blank-request-id": (["--request-id", " "], None, "--request-id must be a non-blank string"),
    "tensor-parallel-zero": (["--tensor-parallel-size", "0"], None, "--tensor-parallel-size must be a positive integer"),
    "heads-do-not-split": (["--tensor-parallel-size", "3"], None, "num_attention_heads=2"),
    "memory-fraction-on-cpu": (["--device", "cpu", "--gpu-memory-fraction", "0.5"], None, "it needs --device cuda"),
    "memory-fraction-above-one": (["--device", "cpu", "--gpu-memory-fraction", "1.5"], None, "--gpu-memory-fraction must be a number in (0, 1]"),
}
SUBPROCESS_CASES = ("invalid-json", "unknown-key", "height-not-multiple")


def _bad_argv(name: str, models: dict, inputs: pathlib.Path, tmp_path: pathlib.Path) -> list[str]:
    extra, script, _ = BAD_INPUTS[name]
    values = {**{k: str(v) for k, v in models.items()}, "inputs": str(inputs), "out": str(tmp_path / "out")}
    extra = [a.format(**values) for a in extra]
    argv = ["rollout", "--model", values["t2v"], "--prompt", "a red room", "--output-dir", values["out"]]
    if script is not None:
        (tmp_path / "script.json").write_text(script)
        argv += ["--action-script", str(tmp_path / "script.json")]
    return argv + extra  # later flags override earlier ones (--model, --prompt)


@pytest.fixture
def models(t2v_model: pathlib.Path, i2v_model: pathlib.Path, nocam_model: pathlib.Path) -> dict:
    return {"t2v": t2v_model, "i2v": i2v_model, "nocam": nocam_model}


def _assert_one_line_error(rc: int, err: str, expected: str, out: pathlib.Path) -> None:
    assert rc != 0
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("rtv rollout: error: ")
    assert expected in lines[0], lines[0]
    assert "Traceback" not in err
    assert not (out / "summary.json").exists()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("name", sorted(BAD_INPUTS))
def test_bad_input_in_process(
    name: str, models: dict, inputs: pathlib.Path, tmp_path: pathlib.Path, capfd: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    from deployments.generation.engine import WorldModelEngine

    def no_load(*args, **kwargs):
        raise AssertionError("bad input must be refused before the model is loaded")

    monkeypatch.setattr(WorldModelEngine, "from_pretrained", no_load)
    rc = cli.main(_bad_argv(name, models, inputs, tmp_path))
    captured = capfd.readouterr()
    _assert_one_line_error(rc, captured.err, BAD_INPUTS[name][2], tmp_path / "out")
    assert captured.out == ""


@pytest.mark.timeout(120)
@pytest.mark.parametrize("name", SUBPROCESS_CASES)
def test_bad_input_subprocess(name: str, models: dict, inputs: pathlib.Path, tmp_path: pathlib.Path) -> None:
    proc = _rtv(*_bad_argv(name, models, inputs, tmp_path))
    _assert_one_line_error(proc.returncode, proc.stderr, BAD_INPUTS[name][2], tmp_path / "out")


@pytest.mark.timeout(120)
def test_usage_error_is_one_line() -> None:
    proc = _rtv("rollout", "--model", "x")
    assert proc.returncode == 2
    assert len(proc.stderr.splitlines()) == 1 and "--prompt" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.timeout(120)
def test_engine_refusal_becomes_input_error(t2v_model: pathlib.Path, tmp_path: pathlib.Path) -> None:
    """Past the cheap checks, the engine's own ValueError still surfaces as one RolloutInputError line."""
    plan = prepare_rollout(t2v_model, "a red room", tmp_path / "out", num_blocks=1)
    plan.image = np.zeros((16, 16, 3), dtype=np.uint8)  # slip an image past validation
    with pytest.raises(RolloutInputError, match="text-to-video"):
        run_rollout(plan)
    assert not (tmp_path / "out" / "summary.json").exists()
