"""bench/import_rollout.py at toy sizes on the CPU: the published-style import rolls out frame for frame as the native model.

Run as the GPU machine runs it (`python -m bench.import_rollout`, a subprocess): its stages put SIGALRM under
their own limits, which would cancel pytest-timeout's alarm in this process.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.timeout(600)
def test_imported_checkpoint_rolls_out_as_the_native_one(tmp_path):
    out = tmp_path / "import_rollout.json"
    cmd = [sys.executable, "-m", "bench.import_rollout", "--spec", "small", "--size", "64x64", "--device", "cpu",
           "--dtype", "float32", "--blocks", "2", "--work", str(tmp_path / "work"), "--out", str(out), "--timeout", "240"]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=580, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout)
    assert result == json.loads(out.read_text())  # the final document, not a partial one
    assert result["errors"] == [], result["errors"]
    assert set(result["stage_seconds"]) >= {"build", "publish", "import", "weights", "rollout_native", "rollout_imported", "compare"}

    # The importer saw the published wrapping and original naming, and wrote back every native tensor unchanged.
    assert "from 'generator_ema'" in result["import"]["log"][-1] and "converted" in result["import"]["log"][-1]
    assert result["weights"]["identical"] and result["weights"]["tensors"] == result["publish"]["tensors"]

    for side in ("rollout_native", "rollout_imported"):
        r = result[side]
        assert r["chunks_delivered"] == 2 and r["matches_offline_frame_timeline"]
        assert (r["height"], r["width"], r["device"], r["dtype"]) == (64, 64, "cpu", "float32")
        assert len(r["chunk_latency_seconds"]) == 2
    compare = result["compare"]
    assert compare["identical"] and compare["max_abs_diff"] == 0
    assert compare["frames"] == result["rollout_native"]["frames_delivered"] > 0
    assert "rollout_native_again" not in result  # only run when the two differ
    assert result["verdict"] == {"weights_identical": True, "frames_identical": True, "max_abs_pixel_diff": 0, "stages_failed": []}
