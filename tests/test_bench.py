"""The benchmark suite runs: each benchmark at tiny sizes returns JSON with its keys. Timings are never asserted."""

from __future__ import annotations

import json

import pytest

from bench import (
    decoders,
    batching,
    common,
    length,
    media,
    pipelining,
    run_all,
    serving,
    understanding,
)

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module")
def models_root(tmp_path_factory):
    from deployments.models.tiny_world_model import make_models

    root = tmp_path_factory.mktemp("bench-models")
    make_models(root)
    return root


@pytest.fixture(scope="module")
def bench_url(serve_address, models_root):
    """The benches' app (one replica, 8 slots) on the test session's Ray and Serve."""
    from ray import serve

    from bench.served import APP_NAME
    from bench.served import app_args as bench_app_args
    from deployments.app import build_app

    serve.run(build_app(bench_app_args(models_root / "world-model", 1, 8)), name=APP_NAME, route_prefix="/")
    yield f"ws://{serve_address}"
    serve.delete(APP_NAME)


def run(module, models_root, *argv: str) -> dict:
    result = common.run_module(module, ["--models", str(models_root), *argv])
    json.dumps(result)  # JSON all the way down
    assert result["bench"] == module.__name__.rsplit(".", 1)[-1]
    assert {"params", "results", "targets", "seconds"} <= set(result)
    for t in result["targets"]:
        assert {"name", "value", "limit", "met"} <= set(t)
    return result


def test_serving(models_root, bench_url):
    result = run(serving, models_root, "--rounds", "1", "--blocks", "3", "--url", bench_url)
    r = result["results"]
    assert not r["served_errors"]
    # Every media chunk carries the replica's stamp; the interval estimate has one fewer.
    assert r["chunk_overhead"]["n"] == 3 and r["interval_overhead"]["n"] == 2 and r["first_chunk_overhead"]["n"] == 1
    assert r["chunk_overhead"]["p50_ms"] > 0  # the fragment arrives after its frames were ready
    assert {"engine_block", "served_interval", "replica_engine_block", "engine_first_chunk", "served_first_chunk"} <= set(r)
    assert len(result["targets"]) == 3


def test_batching(models_root, bench_url):
    result = run(batching, models_root, "--ks", "1,4", "--blocks", "2", "--rounds", "1", "--url", bench_url)
    by_k = result["results"]["by_k"]
    assert set(by_k) == {"1", "4"}
    assert all(row["aggregate_fps"] > 0 and not row["errors"] for row in by_k.values())
    assert by_k["4"]["session_interval"]["n"] == 4  # four sessions of two chunks: one interval each
    assert [t["name"] for t in result["targets"]] == ["aggregate fps K=4 / K=1"]


def test_length(models_root):
    r = run(length, models_root, "--blocks", "14", "--early", "3", "--window", "3", "--fresh", "2")["results"]
    assert r["early_blocks"] == [2, 3, 4] and r["late_blocks"] == [7, 14]  # two fresh sessions of 4 blocks beside A's last 8
    assert r["samples"] == {"fresh_early": 6, "a_late": 8}
    assert r["session_bytes_flat"] is True
    assert {"early", "late"} == set(r["memory"])


def test_length_refuses_a_session_too_short(models_root):
    with pytest.raises(ValueError, match="too short"):
        common.run_module(length, ["--models", str(models_root), "--blocks", "8", "--early", "3", "--window", "3", "--fresh", "1"])


def test_pipelining(models_root):
    r = run(pipelining, models_root, "--size", "64x64", "--blocks", "4", "--rounds", "1", "--steps", "2")["results"]
    assert r["steps"] == 2
    assert set(r["period_best_ms"]) == set(pipelining.MODES)
    assert all(r["period_best_ms"][mode] > 0 for mode in pipelining.MODES)
    assert {"denoise", "decode", "encode"} == set(r["stage_split_serial"])


def test_pipelining_picks_steps_from_the_stage_split(models_root):
    import json

    r = run(pipelining, models_root, "--size", "64x64", "--blocks", "3", "--rounds", "1")["results"]
    scheduler = json.loads((models_root / "world-model" / "scheduler" / "scheduler_config.json").read_text())
    own = len(scheduler.get("denoising_step_list") or [0] * 4)  # the checkpoint's own steps (the engine's four without a list)
    assert r["steps"] >= 1 and r["calibration"]["default_steps"] == own


def test_decoders(models_root):
    result = run(decoders, models_root, "--blocks", "2", "--rounds", "1", "--widths", "16,16,8,8")
    r = result["results"]
    assert r["vae_block"]["n"] == 1 and r["tiny_block"]["n"] == 1 and r["tiny_over_vae"] > 0
    assert r["tiny_parameters"] > 0 and r["frames_per_block"] == 12


def test_media(models_root):
    result = run(media, models_root, "--encode-sizes", "64x64", "--encode-frames", "12",
                 "--filter-sizes", "128x96,1280x720", "--filter-frames", "3", "--rounds", "1")
    r = result["results"]
    assert set(r["encode_ms_per_frame"]) == {"64x64"}
    assert set(r["frame_filter"]) == {"128x96", "1280x720"}
    assert all(row["same_decisions"] for row in r["frame_filter"].values())
    assert [t["name"] for t in result["targets"]] == ["frame filter fps / reference at 1280x720"]


def test_understanding(models_root):
    r = run(understanding, models_root, "--frames", "4,8", "--rounds", "1", "--size", "64x48")["results"]
    assert set(r["reread_by_frames"]) == set(r["live_by_frames"]) == {"4", "8"}
    assert r["reread_by_frames"]["8"]["prompt_tokens"] > r["reread_by_frames"]["4"]["prompt_tokens"]
    # The live session prefilled its pairs as the frames came, and the question saw all of them.
    assert [r["live_by_frames"][n]["frames_seen"] for n in ("4", "8")] == [4, 8]
    assert r["live_by_frames"]["8"]["prefill_per_pair_ms"] > 0
    assert r["ttft_8_over_4"] is not None and r["reread_ttft_8_over_4"] is not None


def test_run_all_records_a_failure_and_goes_on(models_root, tmp_path, monkeypatch):
    # An odd frame size is refused by the encoder: that benchmark fails, the next one still runs.
    monkeypatch.setitem(run_all.BENCHES, "media", (60, ["--encode-sizes", "63x63"]))
    monkeypatch.setitem(run_all.BENCHES, "understanding", (120, ["--frames", "4", "--rounds", "1", "--size", "64x48"]))
    out = tmp_path / "all.json"
    assert run_all.main(["--only", "media,understanding", "--quick", "--models", str(models_root), "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    assert {"machine", "targets", "benches", "seconds"} <= set(report)
    assert report["machine"]["cpu_count"] >= 1
    assert report["benches"]["media"]["error"].startswith("exit code")
    assert any("63x63" in line or "even" in line for line in report["benches"]["media"]["log_tail"])
    assert "targets" in report["benches"]["understanding"]
    assert {"bench": "media", "name": "(benchmark failed)", "met": False}.items() <= report["targets"][0].items()


def test_module_entry_points_name_themselves(capsys, models_root):
    assert common.main(media, ["--models", str(models_root), "--encode-sizes", "64x64", "--encode-frames", "12",
                               "--filter-sizes", "64x64", "--filter-frames", "2", "--rounds", "1"]) == 0
    assert json.loads(capsys.readouterr().out)["bench"] == "media"
