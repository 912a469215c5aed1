"""The web pages in a real browser: headless Debian Chromium driven by playwright-core.

The node scripts in tests/browser/ (player.mjs, chat.mjs) open the pages of a real `serve.run`, drive
them and print one JSON line; these tests run them, check that JSON and keep the screenshots under
artifacts/browser/. `.ci/run` installs `chromium` (apt) and playwright-core (`npm ci` in tests/browser).
"""

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from conftest import app_args

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = ROOT / "tests" / "browser"
ARTIFACTS = ROOT / "artifacts" / "browser"
CHROMIUM = Path("/usr/bin/chromium")
NODE = shutil.which("node")
SCRIPT_TIMEOUT_S = 180

pytestmark = pytest.mark.skipif(
    NODE is None or not CHROMIUM.exists(),
    reason="needs node and Debian's /usr/bin/chromium (`apt-get install chromium`; .ci/run installs both)",
)

APP = "browser-pages"


@pytest.fixture(scope="module")
def base_url(serve_address, world_model_dir, omni_dir):
    from ray import serve

    from deployments.app import build_app

    config = app_args(world_model_dir, understanding_model=str(omni_dir), chat_min_new_tokens=8, chat_max_new_tokens=24)
    serve.run(build_app(config), name=APP, route_prefix="/")  # the pages use absolute paths: /static/..., /v1/...
    yield f"http://{serve_address}"
    serve.delete(APP)


def run_script(name: str, base_url: str, *args: str) -> dict:
    """Run tests/browser/NAME.mjs against the server (with the script's own `args`); returns its JSON line
    (saved beside the screenshots)."""
    if not (SCRIPTS / "node_modules" / "playwright-core").is_dir():
        pytest.fail("playwright-core is not installed: run `npm ci` in tests/browser (.ci/run does)")
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run(
        [NODE, str(SCRIPTS / f"{name}.mjs"), base_url, str(ARTIFACTS), *args],
        cwd=SCRIPTS,
        capture_output=True,
        check=False,  # the JSON line says what failed
        text=True,
        timeout=SCRIPT_TIMEOUT_S,
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    assert lines, f"{name}.mjs printed no JSON (exit {proc.returncode}); stderr: {proc.stderr[-2000:]}"
    result = json.loads(lines[-1])
    (ARTIFACTS / f"{name}.json").write_text(json.dumps(result, indent=2))
    print(f"{name}.mjs: {lines[-1]}")
    assert result["ok"], f"{name}.mjs failed: {result.get('error')}; page errors: {result.get('errors')}; screenshot: {result['screenshot']}"
    assert proc.returncode == 0
    assert Path(result["screenshot"]).stat().st_size > 0
    assert result["page_errors"] == [] and result["console_errors"] == []
    return result


@pytest.mark.timeout(240)
def test_player_plays_the_stream_and_sends_the_keyboard(base_url):
    r = run_script("player", base_url)
    assert r["url_after_load"].endswith("/?debug=1") and r["kept_key"] == "page-key-123" and r["referrer_policy"] == "no-referrer"
    # The codecs string came from the stream's init segment (avcC: Constrained Baseline, level by size).
    assert re.fullmatch(r"avc1\.42C0[0-9A-F]{2}", r["codec"]), r["codec"]
    # Media Source Extensions decoded frames and the playhead moved, with no media error.
    assert r["after"]["decoded"] > r["before"]["decoded"] > 0
    assert r["after"]["current_time"] > r["before"]["current_time"] > 0
    assert r["end"]["error"] is None and r["media_errors"] == [] and r["errors"] == []
    assert r["stats"]["ttff_ms"] is not None and r["stats"]["blocks"] >= 2
    # W held: shown, sent as one block of actions, queued by the server, then started in a later chunk.
    key = r["key"]
    assert key["held_shown"] == "W"
    assert key["actions_keys"] == ["w"] and key["event_id"].startswith("keys-")
    assert key["queued"] is True
    assert key["started_block"] is not None and key["chunk_index"] is not None and key["chunk_after_send"] is True
    # Stop: the server ends the session and says it was stopped.
    assert r["done"]["type"] == "session.done" and r["done"]["stopped"] is True
    assert r["generation"]["accepts_camera"] is True and r["generation"]["frames_per_block"] >= 1
    assert Path(r["screenshot_live"]).stat().st_size > 0


@pytest.mark.timeout(240)
def test_chat_answers_a_question_about_the_fake_camera(base_url):
    r = run_script("chat", base_url)
    assert r["errors"] == []
    # The fake camera's JPEG frames and the fake microphone's PCM16 audio reached the server.
    assert r["frames_sent"] >= 3 and r["kept"] >= 1 and r["kept"] + r["dropped"] == r["frames_sent"]
    assert r["audio_chunks"] >= 4 and r["audio_seconds"] > 0.5
    # One question, its answer streamed in pieces and shown as it came.
    [answer] = r["answers"]
    assert answer["question"] == "What do you see and hear?" and answer["done"] is True
    assert answer["deltas"] >= 2 and answer["text"]
    assert r["first_piece_shown"]["shown"]
    assert r["answer_shown"] == answer["text"]
    assert answer["start"]["frames"] >= 1
    assert answer["start"]["audio_seconds"] > 0  # the tiny Omni thinker takes audio: the worklet's PCM got there
    # End: EVS statistics over every frame sent, then session.done.
    evs = r["evs"]
    assert evs["total_count"] == r["frames_sent"] and evs["retained_count"] == r["kept"]
    assert "kept" in r["evs_shown"] and r["done"] is True
    assert Path(r["screenshot_answer"]).stat().st_size > 0
