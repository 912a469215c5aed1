"""`/v1/videos` end to end: a real `serve.run`, driven by the official `openai` SDK (and plain HTTP for the edges)."""

import base64
import io
import json
import os
import signal
import time
import urllib.error
import urllib.request
from types import SimpleNamespace

import av
import numpy as np
import openai
import pytest
from conftest import app_args, deployed, wait_for
from PIL import Image
from ray import serve

pytestmark = [pytest.mark.timeout(240), pytest.mark.filterwarnings("ignore::DeprecationWarning")]  # the SDK marks videos deprecated

APP, PREFIX = "videos-api", "/videos-api"
LEASE_S = 3.0
KEY = "sk-videos-test"
OTHER_KEY = "sk-videos-other-tenant"


@pytest.fixture(scope="module")
def served(serve_address, world_model_dir, tmp_path_factory):
    from deployments.app import build_app

    state = tmp_path_factory.mktemp("jobs-state")
    config = app_args(
        world_model_dir,
        num_replicas=1,
        max_sessions_per_replica=2,
        routing_stats_period_s=0.5,
        lease_timeout_s=LEASE_S,
        retry_after_s=2.0,
        jobs_db_path=str(state / "db" / "jobs.db"),
        jobs_content_dir=str(state / "videos"),
        max_queued_jobs=1,
        api_keys=[KEY, OTHER_KEY],
        jobs_in_flight_per_key=4,  # above what any test here keeps in flight under one key
        max_media_ahead_s=3.0,  # a viewer that reports nothing is held to real time 3 s ahead; a job is not
    )
    serve.run(build_app(config), name=APP, route_prefix=PREFIX)
    base = f"http://{serve_address}{PREFIX}"
    # The proxies learn the new route prefix a moment after serve.run returns (until then: 404).
    assert wait_for(lambda: http("GET", base + "/healthz")[0] == 200, 30)
    yield SimpleNamespace(base=base, state=state, model=world_model_dir.name)
    serve.delete(APP)


@pytest.fixture
def client(served):
    return openai.OpenAI(base_url=served.base + "/v1", api_key=KEY, max_retries=0, timeout=60)


def stats(deployment: str) -> dict:
    return serve.get_deployment_handle(deployment, app_name=APP).stats.remote().result(timeout_s=30)


def http(method: str, url: str, body: dict | None = None) -> tuple[int, dict, bytes]:
    data = None if body is None else json.dumps(body).encode()
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {KEY}"}
    request = urllib.request.Request(url, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            return response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read()


def decode(mp4: bytes) -> tuple[list, float, list[str]]:
    """Frames, the container's duration in seconds, and the top-level boxes in order."""
    with av.open(io.BytesIO(mp4)) as container:
        frames = [frame.to_ndarray(format="rgb24") for frame in container.decode(video=0)]
        duration = container.duration / av.time_base
    boxes, offset = [], 0
    while offset + 8 <= len(mp4):
        size = int.from_bytes(mp4[offset:offset + 4], "big")
        boxes.append(mp4[offset + 4:offset + 8].decode("latin-1"))
        if size < 8:
            break
        offset += size
    return frames, duration, boxes


def closest(image: np.ndarray, frames: list) -> int:
    """Which frame a (lossy) picture of one frame shows."""
    return int(np.argmin([np.abs(image.astype(int) - frame.astype(int)).mean() for frame in frames]))


def status_of(client, video_id: str) -> str | None:
    try:
        return client.videos.retrieve(video_id).status
    except (openai.APIConnectionError, openai.InternalServerError, openai.NotFoundError):
        return None  # the app is restarting a deployment


def running(client, video_id: str, min_progress: int = 1) -> bool:
    video = client.videos.retrieve(video_id)
    return video.status == "in_progress" and video.progress >= min_progress


def long_job(client, seconds: str = "120"):
    """81 blocks: still running whenever a test looks (tests delete it, or kill what runs it)."""
    return client.videos.create(prompt="a long road", seconds=seconds, extra_body={"fps": 8})


def test_create_and_poll_then_download_a_playable_mp4(client, served):
    video = client.videos.create_and_poll(prompt="a lighthouse at dawn", seconds="1", size="64x64",
                                          extra_body={"fps": 8, "seed": 3}, poll_interval_ms=200)
    assert video.status == "completed" and video.progress == 100 and video.error is None, video
    assert (video.object, video.model, video.seconds, video.size, video.prompt) == ("video", served.model, "1", "64x64", "a lighthouse at dawn")
    assert video.created_at <= video.completed_at < video.expires_at
    raw = client.videos.with_raw_response.download_content(video.id)
    assert raw.headers["content-type"] == "video/mp4"
    mp4 = raw.content
    frames, duration, boxes = decode(mp4)
    # 1 s at 8 fps rounds up to one whole block: 9 frames, 9/8 s, and moov before mdat (a player starts at once).
    assert len(frames) == 9 and frames[0].shape == (64, 64, 3)
    assert duration == pytest.approx(9 / 8, abs=0.01)
    assert boxes.index("moov") < boxes.index("mdat") and "moof" not in boxes
    assert client.videos.retrieve(video.id).model_dump() == video.model_dump()
    # The two previews OpenAI's API offers beside the video.
    thumbnail = client.videos.with_raw_response.download_content(video.id, variant="thumbnail")
    assert thumbnail.headers["content-type"] == "image/webp"
    with Image.open(io.BytesIO(thumbnail.content)) as image:
        assert image.format == "WEBP" and image.size == (64, 64)
        assert closest(np.asarray(image.convert("RGB")), frames) == 0  # the first frame
    sheet = client.videos.with_raw_response.download_content(video.id, variant="spritesheet")
    assert sheet.headers["content-type"] == "image/jpeg"
    with Image.open(io.BytesIO(sheet.content)) as image:
        assert image.format == "JPEG" and image.size == (3 * 64, 3 * 64)  # all 9 frames, 3 by 3
        last = np.asarray(image.convert("RGB"))[128:, 128:]
    assert closest(last, frames) == 8
    status, _, body = http("GET", f"{served.base}/v1/videos/{video.id}/content?variant=poster")
    assert status == 400 and json.loads(body)["error"]["param"] == "variant"


def test_an_action_script_steers_the_job(client):
    def render(**extra):
        video = client.videos.create_and_poll(prompt="a corridor", seconds="1", poll_interval_ms=200,
                                              extra_body={"fps": 8, "num_frames": 33, "seed": 11, **extra})
        assert video.status == "completed", video.error
        return decode(client.videos.download_content(video.id).read())[0]

    still = render()
    # An action script like examples/actions.json (one entry per block); the SDK sends forms, so as JSON text.
    moving = render(actions=json.dumps([[["w"], ["w"], ["w"]], [["l"], ["l"], ["l"]], [["w"], [], []]]))
    assert len(still) == len(moving) == 33
    # The script plays from the first frame on: the first block already differs, and the same job renders the same video.
    assert any((a != b).any() for a, b in zip(still[:9], moving[:9]))
    again = render(actions=json.dumps([[["w"], ["w"], ["w"]], [["l"], ["l"], ["l"]], [["w"], [], []]]))
    assert np.abs(np.stack(again).astype(int) - np.stack(moving)).mean() < 1


def test_a_remix_renders_the_video_again_under_a_new_prompt(client, served):
    source = client.videos.create_and_poll(prompt="a quiet street", seconds="1", poll_interval_ms=200,
                                           extra_body={"fps": 8, "actions": json.dumps([[["w"], ["w"], ["l"]]])})
    assert source.status == "completed" and source.seed is not None  # drawn by the replica, kept for the remix
    same = client.videos.poll(client.videos.remix(source.id, prompt="a quiet street").id, poll_interval_ms=200)
    night = client.videos.remix(source.id, prompt="a quiet street at night")
    assert (night.remixed_from_video_id, night.prompt, night.status) == (source.id, "a quiet street at night", "queued")
    night = client.videos.poll(night.id, poll_interval_ms=200)
    assert night.status == "completed" and (night.seed, night.size, night.seconds, night.num_frames) == (
        source.seed, source.size, source.seconds, source.num_frames)

    def frames(video):
        return np.stack(decode(client.videos.download_content(video.id).read())[0]).astype(int)

    original = frames(source)
    # Same prompt: the same video again (seed, length and actions kept); another prompt: another video.
    # How far another prompt moves the tiny random model's frames depends on the seed the replica drew
    # (0.02 to 5 seen over 24 seeds), so the bound is the same-prompt remix's own difference.
    same_diff, night_diff = (np.abs(frames(video) - original).mean() for video in (same, night))
    assert same_diff < 0.01 and night_diff > same_diff
    with pytest.raises(openai.NotFoundError):
        client.videos.remix("video_" + "e" * 32, prompt="x")
    status, _, body = http("POST", f"{served.base}/v1/videos/{source.id}/remix", {"prompt": "x", "seed": 3})
    assert status == 400 and json.loads(body)["error"]["param"] == "seed"
    running = long_job(client)
    with pytest.raises(openai.ConflictError) as not_yet:
        client.videos.remix(running.id, prompt="x")
    assert not_yet.value.response.json()["error"]["code"] == "video_not_ready"
    client.videos.delete(running.id)


def test_operations_this_server_does_not_offer_are_named_in_openais_error_shape(client, served):
    with pytest.raises(openai.APIStatusError) as extend:
        client.videos.extend(prompt="more", seconds="4", video=("clip.mp4", b"\x00" * 64, "video/mp4"))
    error = extend.value.response.json()["error"]
    assert error["code"] == "unsupported_operation" and "POST" in error["message"] and "/v1/videos/extensions" in error["message"]
    status, _, body = http("GET", served.base + "/v1/videos/characters/char_1/x")
    assert status == 404 and json.loads(body)["error"]["code"] == "unsupported_operation"
    status, _, body = http("GET", served.base + "/nothing-here")
    assert status == 404 and json.loads(body) == {"detail": "Not Found"}  # outside the video API: FastAPI's own


def test_each_key_sees_and_touches_only_its_own_videos(client, served):
    other = openai.OpenAI(base_url=served.base + "/v1", api_key=OTHER_KEY, max_retries=0, timeout=60)
    small = {"fps": 8, "num_frames": 9}
    mine = client.videos.create_and_poll(prompt="a private garden", seconds="1", extra_body=small, poll_interval_ms=200)
    theirs = other.videos.create_and_poll(prompt="their harbour", seconds="1", extra_body=small, poll_interval_ms=200)
    assert mine.status == theirs.status == "completed"
    # Another key's video is not found, exactly as one that never existed: listing, paging from it, reading,
    # downloading, remixing and deleting it.
    assert mine.id not in [v.id for v in other.videos.list(limit=100)]
    assert theirs.id not in [v.id for v in client.videos.list(limit=100)]
    for attempt in (
        lambda: other.videos.retrieve(mine.id),
        lambda: other.videos.download_content(mine.id),
        lambda: other.videos.remix(mine.id, prompt="stolen"),
        lambda: other.videos.delete(mine.id),
        lambda: other.videos.list(after=mine.id),
    ):
        with pytest.raises(openai.NotFoundError) as refused:
            attempt()
        assert refused.value.response.json()["error"]["message"] == f"No video found with id '{mine.id}'."
    # ...and still the owner's, whole.
    assert client.videos.retrieve(mine.id).status == "completed"
    assert client.videos.download_content(mine.id).read()[4:8] == b"ftyp"
    other.videos.delete(theirs.id)


def test_job_ids_that_are_paths_or_sql_are_not_found(served):
    for video_id in ("..%2F..%2Fetc%2Fpasswd", "video_%2E%2E%2F%2E%2E%2Fjobs.db", "video_'%20OR%20'1'='1", "video_" + "0" * 31 + "g",
                     "VIDEO_" + "0" * 32, "video_" + "0" * 32 + "%00"):
        for suffix in ("", "/content"):
            status, _, body = http("GET", f"{served.base}/v1/videos/{video_id}{suffix}")
            assert status == 404, (video_id, suffix, body)
            if suffix or "%2F" not in video_id:  # an encoded slash may end the route early: Starlette's own 404 then
                assert json.loads(body)["error"]["code"] in (None, "not_found", "unsupported_operation"), body
    status, _, body = http("GET", f"{served.base}/v1/videos?after=video_'%20OR%201=1--")
    assert status == 404 and "No video found" in json.loads(body)["error"]["message"]


def test_list_newest_first_with_pages(client):
    # Earlier tests' jobs (a remix among them) may still hold the one queue place under load: let them finish.
    assert wait_for(lambda: all(v.status not in ("queued", "in_progress") for v in client.videos.list(limit=100).data), 120)
    made = []
    for i in range(2):  # one at a time: the queue has one place, and a loaded replica may not have taken the first yet
        made.append(client.videos.create(prompt=f"scene {i}", seconds="1", extra_body={"fps": 8, "num_frames": 9}).id)
        assert wait_for(lambda: client.videos.retrieve(made[-1]).status == "completed", 60)
    page = client.videos.list(limit=1)
    assert [v.id for v in page.data] == [made[1]] and page.has_more
    everything = [v.id for v in client.videos.list(limit=1)]  # the SDK follows `after` page by page
    assert everything[:2] == [made[1], made[0]] and len(everything) == len(set(everything)) >= 3
    oldest_first = [v.id for v in client.videos.list(limit=100, order="asc").data]
    assert oldest_first.index(made[0]) < oldest_first.index(made[1])
    with pytest.raises(openai.NotFoundError):
        client.videos.list(after="video_" + "0" * 32)


def test_delete_while_running_stops_the_session_and_frees_its_slot(client, served):
    video = long_job(client)
    assert video.status in ("queued", "in_progress") and video.progress == 0
    assert wait_for(lambda: running(client, video.id), 60)  # progress moves block by block
    assert len(stats("WorldModel")["sessions"]) == 1
    deleted = client.videos.delete(video.id)
    assert (deleted.id, deleted.object, deleted.deleted) == (video.id, "video.deleted", True)
    with pytest.raises(openai.NotFoundError):
        client.videos.retrieve(video.id)
    assert wait_for(lambda: stats("WorldModel")["sessions"] == [], 10)
    assert stats("VideoJobs")["running"] == []
    leftovers = [p.name for p in served.state.joinpath("videos").rglob("*") if video.id in p.name]
    assert leftovers == []


def test_bad_input_gets_400_and_unknown_ids_404_in_openais_error_shape(client, served):
    with pytest.raises(openai.BadRequestError) as bad:
        client.videos.create(prompt="x", size="65x64")
    error = bad.value.response.json()["error"]
    assert error == {"message": "Invalid video request: size (width 65): must be a positive multiple of 16, got 65",
                     "type": "invalid_request_error", "param": "size", "code": "invalid_request"}
    status, _, body = http("POST", served.base + "/v1/videos", {"prompt": "x", "promt": "typo"})
    assert status == 400 and json.loads(body)["error"]["param"] is None and "promt: unknown field" in json.loads(body)["error"]["message"]
    status, _, body = http("POST", served.base + "/v1/videos", {"prompt": "x", "model": "sora-2"})
    assert status == 400 and json.loads(body)["error"]["code"] == "model_mismatch"
    with pytest.raises(openai.BadRequestError) as no_image:
        client.videos.create(prompt="x", input_reference=("start.png", png(), "image/png"))  # a multipart upload
    assert no_image.value.response.json()["error"]["param"] == "input_reference"
    assert "text-to-video and takes no start image" in no_image.value.response.json()["error"]["message"]
    with pytest.raises(openai.BadRequestError) as bad_actions:
        client.videos.create(prompt="x", seconds="1", extra_body={"actions": json.dumps([[["w"], ["q"], []]])})
    assert bad_actions.value.response.json()["error"]["param"] == "actions"
    with pytest.raises(openai.NotFoundError) as unknown:
        client.videos.retrieve("video_" + "f" * 32)
    assert unknown.value.response.json()["error"]["type"] == "invalid_request_error"
    for path in ("/v1/videos/nope", "/v1/videos/nope/content"):
        status, _, body = http("GET", served.base + path)
        assert status == 404 and set(json.loads(body)["error"]) == {"message", "type", "param", "code"}
    status, _, body = http("GET", served.base + "/v1/videos?limit=0")
    assert status == 400 and json.loads(body)["error"]["param"] == "limit"
    stranger = openai.OpenAI(base_url=served.base + "/v1", api_key="sk-wrong", max_retries=0, timeout=60)
    with pytest.raises(openai.AuthenticationError):  # the same API keys as every other route
        stranger.videos.list()


def test_jobs_wait_for_a_slot_and_a_full_queue_answers_503(client):
    # Two slots: two jobs run, the third waits in the queue (not over_capacity), the fourth finds it full.
    # A job counts as waiting until its session has started on a replica, so each starts before the next comes.
    first = long_job(client)
    assert wait_for(lambda: running(client, first.id, 0), 60)
    second = long_job(client)
    assert wait_for(lambda: running(client, second.id, 0), 60)
    third = long_job(client, seconds="1")
    with pytest.raises(openai.InternalServerError) as full:
        long_job(client)
    assert full.value.status_code == 503 and full.value.response.headers["retry-after"] == "2"
    assert full.value.response.json()["error"]["code"] == "over_capacity"
    time.sleep(1.0)
    assert client.videos.retrieve(third.id).status == "queued"
    status, _, body = http("GET", f"{client.base_url}videos/{third.id}/content")
    assert status == 409 and json.loads(body)["error"]["code"] == "video_not_ready"
    client.videos.delete(first.id)
    assert wait_for(lambda: client.videos.retrieve(third.id).status == "completed", 60)
    client.videos.delete(second.id)
    assert wait_for(lambda: stats("WorldModel")["sessions"] == [], 10)


def test_sync_answers_with_the_mp4_faster_than_real_time(served):
    began = time.monotonic()
    status, headers, body = http("POST", served.base + "/v1/videos/sync", {"prompt": "a harbour", "seconds": "20", "fps": 8})
    took = time.monotonic() - began
    assert status == 200 and headers["content-type"] == "video/mp4"
    frames, duration, _ = decode(body)
    assert len(frames) == 165 and duration == pytest.approx(165 / 8, abs=0.01)
    # The job reports what it stored, so flow control never paces it to playback (that would take 17 s or more).
    assert took < 12, took
    status, _, listed = http("GET", f"{served.base}/v1/videos/{headers['x-video-id']}")
    assert status == 200 and json.loads(listed)["status"] == "completed"


def test_a_job_survives_an_ingress_restart(client, served):
    video = long_job(client, seconds="30")
    assert wait_for(lambda: running(client, video.id, 0), 60)
    _, _, health = http("GET", served.base + "/healthz")
    os.kill(json.loads(health)["pid"], signal.SIGKILL)
    # The job runs in VideoJobs, not in the ingress: it goes on while Serve replaces the ingress.
    assert wait_for(lambda: status_of(client, video.id) == "completed", 90, interval=0.5)
    frames, duration, _ = decode(client.videos.download_content(video.id).read())
    assert len(frames) == client.videos.retrieve(video.id).num_frames and duration == pytest.approx(len(frames) / 8, abs=0.01)


def test_jobs_left_running_by_a_dead_owner_are_marked_failed(client, served):
    done = client.videos.create_and_poll(prompt="kept", seconds="1", extra_body={"fps": 8}, poll_interval_ms=200)
    video = long_job(client)
    assert wait_for(lambda: running(client, video.id), 60)
    old = stats("VideoJobs")["pid"]
    os.kill(old, signal.SIGKILL)
    # Serve starts a new owner; it marks what the old one left running as failed, and keeps the rest.
    assert wait_for(lambda: status_of(client, video.id) == "failed", 90, interval=0.5)
    failed = client.videos.retrieve(video.id)
    assert failed.error.code == "server_restarted" and failed.completed_at is not None
    assert stats("VideoJobs")["pid"] != old
    assert client.videos.retrieve(done.id).status == "completed"
    assert len(decode(client.videos.download_content(done.id).read())[0]) == 9
    # The orphaned session's lease lapses on the replica, which frees its slot.
    assert wait_for(lambda: stats("WorldModel")["sessions"] == [], LEASE_S + 10)


def test_an_uploaded_start_image_conditions_the_job_and_its_remix(serve_address, i2v_model_dir, tmp_path):
    # The image-to-video model in an app of its own: the SDK uploads the image as a multipart file.
    args = app_args(i2v_model_dir, num_replicas=1, jobs_db_path=str(tmp_path / "jobs.db"), jobs_content_dir=str(tmp_path / "videos"),
                    api_keys=[KEY])
    with deployed("videos-i2v", "/videos-i2v", args):
        base = f"http://{serve_address}/videos-i2v"
        assert wait_for(lambda: http("GET", base + "/healthz")[0] == 200, 30)
        client = openai.OpenAI(base_url=base + "/v1", api_key=KEY, max_retries=0, timeout=60)

        def frames(video_id: str) -> np.ndarray:
            return np.stack(decode(client.videos.download_content(video_id).read())[0]).astype(int)

        def render(image: bytes) -> tuple[object, np.ndarray]:
            video = client.videos.create_and_poll(prompt="a room", seconds="1", input_reference=("start.png", image, "image/png"),
                                                  poll_interval_ms=200, extra_body={"fps": 8, "seed": 5})
            assert video.status == "completed", video.error
            return video, frames(video.id)

        red, from_upload = render(png((255, 0, 0)))
        _, from_blue = render(png((0, 0, 255)))
        # The same image as a data URL in a JSON body.
        data_url = "data:image/png;base64," + base64.b64encode(png((255, 0, 0))).decode()
        body = {"prompt": "a room", "seconds": "1", "fps": 8, "seed": 5, "input_reference": {"image_url": data_url}}
        status, headers, _ = http("POST", base + "/v1/videos/sync", body)
        assert status == 200
        from_json = frames(headers["x-video-id"])
        assert len(from_upload) == 9 and np.abs(from_json - from_upload).mean() < 1
        assert np.abs(from_blue - from_upload).mean() > 1  # the image, not only the seed, shapes the video
        remix = client.videos.poll(client.videos.remix(red.id, prompt="a room").id, poll_interval_ms=200)
        again = np.stack(decode(client.videos.download_content(remix.id).read())[0]).astype(int)
        assert np.abs(again - from_upload).mean() < 1  # the remix starts from the same image
        with pytest.raises(openai.BadRequestError) as missing:
            client.videos.create(prompt="no image", seconds="1")
        assert "image" in missing.value.response.json()["error"]["message"]


def test_a_key_at_its_quota_gets_429_naming_the_limit_and_other_keys_go_on(serve_address, world_model_dir, tmp_path):
    """Quotas filled on purpose, on a served app of their own: one stored video and one job in flight per key."""
    args = app_args(world_model_dir, num_replicas=1, jobs_db_path=str(tmp_path / "jobs.db"), jobs_content_dir=str(tmp_path / "videos"),
                    api_keys=[KEY, OTHER_KEY], jobs_stored_per_key=1, jobs_in_flight_per_key=1, retry_after_s=2.0)
    with deployed("videos-quota", "/videos-quota", args):
        base = f"http://{serve_address}/videos-quota/v1"
        assert wait_for(lambda: http("GET", base[: -len("/v1")] + "/healthz")[0] == 200, 30)
        mine, other = (openai.OpenAI(base_url=base, api_key=key, max_retries=0, timeout=60) for key in (KEY, OTHER_KEY))
        small = {"fps": 8, "num_frames": 9}

        def refused(code: str, **create) -> openai.RateLimitError:
            with pytest.raises(openai.RateLimitError) as over:
                mine.videos.create(prompt="one too many", seconds="1", extra_body=small, **create)
            error = over.value.response.json()["error"]
            assert over.value.status_code == 429 and (error["type"], error["code"]) == ("insufficient_quota", code), error
            return over.value

        kept = mine.videos.create_and_poll(prompt="a kept garden", seconds="1", extra_body=small, poll_interval_ms=200)
        assert kept.status == "completed"
        refused("stored_videos_limit")
        theirs = other.videos.create_and_poll(prompt="their harbour", seconds="1", extra_body=small, poll_interval_ms=200)
        assert theirs.status == "completed"  # another key's quota is its own
        mine.videos.delete(kept.id)
        running_job = long_job(mine)
        over = refused("jobs_in_flight_limit")
        assert over.response.headers["retry-after"] == "2"
        mine.videos.delete(running_job.id)

        def create_again():
            try:
                return mine.videos.create(prompt="room again", seconds="1", extra_body=small)
            except openai.RateLimitError:
                return None  # the deleted job is still being stopped

        assert wait_for(create_again, 30)  # the slot is the key's again


def test_a_job_on_a_replica_that_dies_fails_with_replica_lost(client):
    # Last in the module: the WorldModel replica does not come back before the app is deleted.
    video = long_job(client)
    assert wait_for(lambda: running(client, video.id), 60)
    os.kill(stats("WorldModel")["pid"], signal.SIGKILL)
    assert wait_for(lambda: client.videos.retrieve(video.id).status == "failed", 30)
    failed = client.videos.retrieve(video.id)
    assert failed.error.code == "replica_lost" and 0 < failed.progress < 100


def png(colour=(0, 128, 255)) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (16, 16), colour).save(buffer, format="PNG")
    return buffer.getvalue()
