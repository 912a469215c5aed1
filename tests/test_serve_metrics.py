"""Prometheus metrics after real sessions: the counts match what the sessions did."""

import asyncio
import base64
import io
import re
import time
import urllib.request

import numpy as np
import pytest
import websockets
from conftest import app_args
from PIL import Image
from ray import serve
from wsclient import run_to_end, send, start

pytestmark = pytest.mark.timeout(240)

APP, PREFIX = "video-metrics", "/metrics-app"
SAMPLE = re.compile(r'^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(\{(?P<labels>[^}]*)\})? (?P<value>\S+)$')


def scrape(url: str) -> list[tuple[str, dict, float]]:
    text = urllib.request.urlopen(url, timeout=10).read().decode()
    out = []
    for line in text.splitlines():
        match = SAMPLE.match(line)
        if match and not line.startswith("#"):
            labels = dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', match["labels"] or ""))
            out.append((match["name"], labels, float(match["value"])))
    return out


def total(samples, name: str, **labels) -> float:
    return sum(v for n, l, v in samples if n == name and l.get("application") == APP and all(l.get(k) == w for k, w in labels.items()))


def jpeg() -> str:
    buffer = io.BytesIO()
    Image.fromarray(np.full((48, 64, 3), 90, np.uint8)).save(buffer, format="JPEG")
    return base64.b64encode(buffer.getvalue()).decode()


def test_metrics_count_sessions_frames_interactions_errors_and_filtered_frames(serve_address, metrics_url, world_model_dir, omni_dir):
    from deployments.app import build_app
    serve.run(build_app(app_args(world_model_dir, understanding_model=str(omni_dir), chat_min_new_tokens=4, chat_max_new_tokens=8)), name=APP, route_prefix=PREFIX)
    try:
        async def video():
            ws, t, first = await start(serve_address, PREFIX + "/v1/realtime/video", prompt="counted", num_frames=33)
            async with ws:
                await send(ws, {"type": "session.interaction", "interaction": {"event_id": "a", "event": {"prompt": "other"}}})
                await send(ws, {"type": "session.interaction", "interaction": {"event_id": "a", "event": {"prompt": "again"}}})
                await send(ws, {"type": "session.dance"})
                await run_to_end(ws, t)
            return t

        async def chat():
            async with websockets.connect(f"ws://{serve_address}{PREFIX}/v1/video/chat/stream", max_size=None) as ws:
                await ws.send('{"type": "session.config"}')
                for _ in range(3):
                    await ws.send(f'{{"type": "video.frame", "data": "{jpeg()}"}}')
                await ws.send('{"type": "video.query", "text": "hello?"}')
                await ws.send('{"type": "video.done"}')
                async for _ in ws:
                    pass

        t = asyncio.run(video())
        assert t.done is not None and {e["code"] for e in t.errors} == {"event_id_conflict", "unknown_type"}
        asyncio.run(chat())

        want = {
            ("ray_rtv_session_starts_total", (("endpoint", "video"), ("outcome", "accepted"))): 1,
            ("ray_rtv_session_starts_total", (("endpoint", "chat"), ("outcome", "accepted"))): 1,
            ("ray_rtv_frames_generated_total", (("endpoint", "video"),)): 33,
            ("ray_rtv_interactions_total", (("endpoint", "video"), ("outcome", "queued"))): 1,
            ("ray_rtv_interactions_total", (("endpoint", "video"), ("outcome", "applied"))): 1,
            ("ray_rtv_errors_total", (("endpoint", "video"), ("code", "event_id_conflict"))): 1,
            ("ray_rtv_errors_total", (("endpoint", "video"), ("code", "unknown_type"))): 1,
            ("ray_rtv_evs_frames_total", (("decision", "kept"),)): 1,
            ("ray_rtv_evs_frames_total", (("decision", "dropped"),)): 2,
            ("ray_rtv_block_latency_seconds_count", (("endpoint", "video"),)): 3,
            ("ray_rtv_time_to_first_chunk_seconds_count", (("endpoint", "video"),)): 1,
        }
        deadline = time.monotonic() + 60
        while True:
            samples = scrape(metrics_url)
            got = {key: total(samples, key[0], **dict(key[1])) for key in want}
            if got == want or time.monotonic() > deadline:
                break
            time.sleep(2)
        assert got == want
        # Gauges: both replicas are idle again, every slot free.
        assert total(samples, "ray_rtv_sessions_active", endpoint="video") == 0
        assert total(samples, "ray_rtv_slots_free", endpoint="video") == 4
    finally:
        serve.delete(APP)
