"""Video jobs without Ray: the SQLite store, the content store, and a job's life in the manager (fake runner)."""

import asyncio
import dataclasses
import io

import av
import numpy as np
import pytest
from handclock import Clock

from deployments.jobs.content import SPRITESHEET, START_IMAGE, THUMBNAIL, VIDEO, ContentStore
from deployments.jobs.manager import JobManager, JobSettings
from deployments.jobs.records import (
    COMPLETED,
    FAILED,
    IN_PROGRESS,
    QUEUED,
    JobError,
    JobRecord,
    JobsError,
    JobSpec,
    Recipe,
)
from deployments.jobs.runner import JobFailed, RunResult
from deployments.jobs.store import JobStore
from deployments.media.fmp4 import FragmentedMP4Encoder
from deployments.contract.session_spec import SessionSpec

pytestmark = pytest.mark.timeout(60)


def record(job_id: str, owner: str = "a", status: str = QUEUED, created_at: float = 1.0) -> JobRecord:
    return JobRecord(id=job_id, status=status, created_at=created_at, model="m", prompt="p", seconds="1", size="64x64",
                     fps=8, num_frames=9, owner=owner)


@pytest.fixture
def clock():
    return Clock(1_700_000_000.0)


@pytest.fixture
def store(tmp_path, clock):
    s = JobStore(tmp_path / "state" / "jobs.db", now=clock)
    yield s
    s.close()


# -- store ---------------------------------------------------------------------------
def test_records_round_trip_and_survive_a_new_connection(tmp_path, store, clock):
    store.insert(record("video_1"))
    assert store.update("video_1", "a", status=IN_PROGRESS, seed=2**63 - 1, progress=40)
    store.close()
    again = JobStore(tmp_path / "state" / "jobs.db", now=clock)
    got = again.get("video_1")
    assert (got.status, got.seed, got.progress, got.prompt, got.fps) == (IN_PROGRESS, 2**63 - 1, 40, "p", 8)
    assert again.get("video_nope") is None
    again.close()


def test_the_database_is_durable_on_commit(store):
    # WAL, and every commit synced (synchronous FULL = 2): a crash right after an answer loses nothing.
    assert store._db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert store._db.execute("PRAGMA synchronous").fetchone()[0] == 2


def test_finish_sets_progress_and_expiry_and_keeps_the_error(store, clock):
    store.insert(record("video_ok"))
    store.insert(record("video_bad"))
    store.update("video_bad", "a", progress=33)
    assert store.finish("video_ok", "a", COMPLETED, expiry_s=100)
    assert store.finish("video_bad", "a", FAILED, expiry_s=100, error=JobError("replica_lost", "gone"))
    ok, bad = store.get("video_ok"), store.get("video_bad")
    assert (ok.progress, ok.completed_at, ok.expires_at, ok.error) == (100, clock.t, clock.t + 100, None)
    assert (bad.progress, bad.status, bad.error) == (33, FAILED, JobError("replica_lost", "gone"))
    with pytest.raises(ValueError):
        store.finish("video_ok", "a", IN_PROGRESS, expiry_s=1)


def test_only_the_owner_writes_and_a_new_owner_fails_what_was_left_running(store):
    store.insert(record("video_q", owner="old"))
    store.insert(record("video_r", owner="old", status=IN_PROGRESS))
    store.insert(record("video_done", owner="old", status=COMPLETED))
    taken = store.take_over("new", JobError("server_restarted", "restarted"), expiry_s=10)
    assert sorted(taken) == ["video_q", "video_r"]
    for job_id in taken:
        got = store.get(job_id)
        assert (got.status, got.owner, got.error.code) == (FAILED, "new", "server_restarted") and got.expires_at is not None
    assert store.get("video_done").status == COMPLETED
    # The old owner, if it still runs, can no longer write to them.
    assert not store.update("video_r", "old", progress=90)
    assert not store.finish("video_r", "old", COMPLETED, expiry_s=10)
    assert store.get("video_r").status == FAILED


def test_pages_newest_first_with_after_and_order(store):
    for i in range(5):
        store.insert(record(f"video_{i}", created_at=float(i)))
    page = store.page(2)
    assert [r.id for r in page.data] == ["video_4", "video_3"] and page.has_more
    page = store.page(2, after="video_3")
    assert [r.id for r in page.data] == ["video_2", "video_1"] and page.has_more
    page = store.page(2, after="video_1")
    assert [r.id for r in page.data] == ["video_0"] and not page.has_more
    assert [r.id for r in store.page(10, order="asc").data] == [f"video_{i}" for i in range(5)]
    assert [r.id for r in store.page(2, after="video_2", order="asc").data] == ["video_3", "video_4"]
    with pytest.raises(JobsError) as refused:
        store.page(2, after="video_nope")
    assert refused.value.kind == JobsError.NOT_FOUND and refused.value.param == "after"


def test_expired_lists_finished_jobs_whose_time_is_up(store, clock):
    store.insert(record("video_a"))
    store.insert(record("video_b"))
    store.insert(record("video_running"))
    store.finish("video_a", "a", COMPLETED, expiry_s=10)
    store.finish("video_b", "a", FAILED, expiry_s=20)
    assert store.expired() == []
    clock.t += 15
    assert store.expired() == ["video_a"]
    clock.t += 10
    assert store.expired() == ["video_a", "video_b"]
    assert store.delete("video_a") and not store.delete("video_a")
    assert store.count(QUEUED) == 1


def test_recipes_round_trip_and_a_database_from_an_older_server_gains_their_columns(tmp_path, clock):
    import sqlite3

    path = tmp_path / "old.db"
    old = sqlite3.connect(path)
    old.execute("CREATE TABLE jobs (seq INTEGER PRIMARY KEY AUTOINCREMENT, id TEXT NOT NULL UNIQUE, owner TEXT NOT NULL, "
                "status TEXT NOT NULL, progress INTEGER NOT NULL DEFAULT 0, created_at REAL NOT NULL, completed_at REAL, "
                "expires_at REAL, model TEXT NOT NULL, prompt TEXT NOT NULL, seconds TEXT NOT NULL, size TEXT NOT NULL, "
                "fps INTEGER NOT NULL, num_frames INTEGER NOT NULL, seed TEXT, error TEXT)")
    old.execute("INSERT INTO jobs (id, owner, status, created_at, model, prompt, seconds, size, fps, num_frames) "
                "VALUES ('video_old', 'a', 'completed', 1.0, 'm', 'p', '1', '64x64', 8, 9)")
    old.commit()
    old.close()
    store = JobStore(path, now=clock)
    assert store.get("video_old").remixed_from_video_id is None and store.recipe("video_old") is None
    recipe = Recipe(64, 48, 3, 4, 5.0, (("w",), (), ("w", "l")), start_image=True)
    store.insert(JobRecord(id="video_new", status=QUEUED, created_at=2.0, model="m", prompt="p", seconds="1", size="64x48",
                           fps=8, num_frames=9, owner="a", remixed_from_video_id="video_old"), recipe)
    assert store.recipe("video_new") == recipe and store.get("video_new").remixed_from_video_id == "video_old"
    assert store.recipe("video_nope") is None
    store.close()


def test_jobs_errors_keep_their_fields_through_pickling():
    import pickle

    error = pickle.loads(pickle.dumps(JobsError(JobsError.QUEUE_FULL, "full", retry_after_s=3.0, param="x")))
    assert (error.kind, error.message, error.retry_after_s, error.param) == (JobsError.QUEUE_FULL, "full", 3.0, "x")


# -- content -------------------------------------------------------------------------
def test_content_store_puts_reads_and_deletes(tmp_path):
    content = ContentStore(str(tmp_path / "videos"))
    assert content.scratch == tmp_path / "videos" / ".partial"
    part = content.scratch_path("video_x", ".mp4")
    part.write_bytes(b"x" * 3_000_000)
    assert content.put("video_x", part) == 3_000_000 and not part.exists()
    assert content.size("video_x") == 3_000_000
    assert b"".join(content.read("video_x")) == b"x" * 3_000_000
    content.scratch_path("video_x", ".fmp4").write_bytes(b"partial")
    for asset in (THUMBNAIL, SPRITESHEET, START_IMAGE):
        part = content.scratch_path("video_x", asset.suffix)
        part.write_bytes(asset.name.encode())
        content.put("video_x", part, asset)
    assert content.read_all("video_x", THUMBNAIL) == b"thumbnail" and content.size("video_x", START_IMAGE) == 11
    content.delete("video_x")
    assert [content.size("video_x", asset) for asset in (VIDEO, THUMBNAIL, SPRITESHEET, START_IMAGE)] == [None] * 4
    assert list(content.scratch.iterdir()) == [] and list((tmp_path / "videos").iterdir()) == [content.scratch]
    assert content.read_all("video_x", THUMBNAIL) is None
    content.delete("video_x")  # twice is fine


def test_content_store_takes_an_fsspec_url():
    content = ContentStore("memory://rtv-test-videos")
    local = content.scratch_path("video_m", ".mp4")
    local.write_bytes(b"abc")
    content.put("video_m", local)
    assert b"".join(content.read("video_m")) == b"abc" and content.size("video_m") == 3
    content.delete("video_m")
    assert content.size("video_m") is None


# -- manager (fake runner) ---------------------------------------------------------
def fmp4(frames: int, size: int = 32) -> bytes:
    encoder = FragmentedMP4Encoder(size, size, 8)
    data = encoder.encode(np.zeros((frames, size, size, 3), np.uint8)).data
    return data + encoder.close().data


def spec(blocks: int = 3, **request) -> JobSpec:
    request = SessionSpec(**{"session_id": "s", "prompt": "a lake", "height": 32, "width": 32, "fps": 8, "num_blocks": blocks,
                                **request})
    return JobSpec(request, model="m", seconds="1", size="32x32", num_frames=9)


class FakeRunner:
    """Writes a real fMP4 block by block; `gate` holds it before the first block (a job waiting for a slot)."""

    def __init__(self, fail: JobFailed | None = None) -> None:
        self.gate = asyncio.Event()
        self.fail = fail
        self.cancelled = 0
        self.specs = []  # what it was asked to run

    async def run(self, spec, out, started, block_done):
        self.specs.append(spec)
        try:
            await self.gate.wait()
            started(spec.request.seed if spec.request.seed is not None else 7)
            if self.fail:
                raise self.fail
            for block in range(spec.num_blocks):
                block_done(block + 1)
                await asyncio.sleep(0)
            out.write_bytes(fmp4(9))
            return RunResult(spec.num_blocks, 9)
        except asyncio.CancelledError:
            self.cancelled += 1
            raise


def manager(tmp_path, clock, runner, **settings) -> JobManager:
    store = JobStore(tmp_path / "jobs.db", now=clock)
    content = ContentStore(str(tmp_path / "videos"))
    values = {"expiry_s": 100.0, "max_queued": 2, "retry_after_s": 3.0, **settings}
    return JobManager(store, content, runner, "owner-1", JobSettings(**values), now=clock)


def test_a_job_runs_to_a_progressive_mp4(tmp_path, clock):
    async def go():
        runner = FakeRunner()
        jobs = manager(tmp_path, clock, runner)
        created = jobs.create(spec())
        assert created.status == QUEUED and created.id.startswith("video_")
        with pytest.raises(JobsError) as refused:
            await jobs.content_size(created.id)
        assert refused.value.kind == JobsError.NOT_READY
        runner.gate.set()
        done = await jobs.wait(created.id, 10)
        return jobs, done, b"".join(await jobs.read_content(done.id)), await jobs.content_size(done.id)

    jobs, done, data, size = asyncio.run(go())
    assert (done.status, done.progress, done.seed, done.expires_at) == (COMPLETED, 100, 7, clock.t + 100)
    assert size == len(data)
    with av.open(io.BytesIO(data)) as container:
        assert container.format.name.startswith("mov") and sum(1 for _ in container.decode(video=0)) == 9
    assert list(jobs.content.scratch.iterdir()) == []
    # Its previews are stored beside it (tests/test_previews.py checks what they show).
    assert jobs.content.read_all(done.id, THUMBNAIL)[8:12] == b"WEBP"
    assert jobs.content.read_all(done.id, SPRITESHEET)[:3] == b"\xff\xd8\xff"


def test_a_remix_renders_the_completed_job_again_under_a_new_prompt(tmp_path, clock):
    image = np.arange(32 * 48 * 3, dtype=np.uint8).reshape(32, 48, 3)
    actions = (("w",), (), ("l",))

    async def go():
        runner = FakeRunner()
        runner.gate.set()
        jobs = manager(tmp_path, clock, runner)
        source = await jobs.wait(jobs.create(JobSpec(spec(num_inference_steps=2, flow_shift=4.0, image=image).request,
                                                     "m", "1", "32x32", 9, actions)).id, 10)
        runner.gate.clear()
        waiting = jobs.create(spec())
        with pytest.raises(JobsError) as not_yet:
            await jobs.remix(waiting.id, "x")
        runner.gate.set()
        remix = await jobs.remix(source.id, "a lake at night")
        return jobs, runner, source, remix, await jobs.wait(remix.id, 10), not_yet.value

    jobs, runner, source, remix, remixed, not_yet = asyncio.run(go())
    assert not_yet.kind == JobsError.NOT_READY and "once it is completed" in not_yet.message
    assert (remix.remixed_from_video_id, remix.prompt, remix.status) == (source.id, "a lake at night", QUEUED)
    assert remixed.status == COMPLETED and remixed.seed == source.seed == 7
    first, again = runner.specs[0], runner.specs[-1]
    # Everything but the prompt (and the session id) is the source's, the seed its replica drew included.
    assert again.request.prompt == "a lake at night" and again.request.session_id != first.request.session_id
    assert again.request.seed == 7 and again.actions == actions
    for name in ("height", "width", "fps", "num_blocks", "num_inference_steps", "flow_shift"):
        assert getattr(again.request, name) == getattr(first.request, name), name
    assert np.array_equal(again.request.image, image)
    assert (again.model, again.seconds, again.size, again.num_frames) == (first.model, first.seconds, first.size, first.num_frames)

    async def after_a_restart():
        runner = FakeRunner()
        runner.gate.set()
        fresh = JobManager(JobStore(tmp_path / "jobs.db", now=clock), ContentStore(str(tmp_path / "videos")), runner, "owner-2",
                           JobSettings(100.0, 2, 3.0), now=clock)
        fresh.recover()
        remix = await fresh.remix(remixed.id, "a lake in fog")  # a remix of a remix
        await fresh.wait(remix.id, 10)
        await fresh.delete(source.id)
        with pytest.raises(JobsError) as gone:
            await fresh.remix(source.id, "y")
        return runner.specs[0], gone.value

    third, gone = asyncio.run(after_a_restart())
    assert third.request.seed == 7 and np.array_equal(third.request.image, image) and third.actions == actions
    assert gone.kind == JobsError.NOT_FOUND


def test_queue_limit_delete_while_waiting_and_failures(tmp_path, clock):
    async def go():
        runner = FakeRunner()
        jobs = manager(tmp_path, clock, runner)
        first, second = jobs.create(spec()), jobs.create(spec())
        with pytest.raises(JobsError) as full:
            jobs.create(spec())
        await asyncio.sleep(0)  # both wait in the runner for a slot
        await jobs.delete(first.id)  # cancels it there
        third = jobs.create(spec())  # the queue has room again
        with pytest.raises(JobsError) as gone:
            jobs.get(first.id)
        runner.gate.set()
        return jobs, full.value, gone.value, [await jobs.wait(j.id, 10) for j in (second, third)], runner

    _, full, gone, finished, runner = asyncio.run(go())
    assert full.kind == JobsError.QUEUE_FULL and full.retry_after_s == 3.0
    assert gone.kind == JobsError.NOT_FOUND and runner.cancelled == 1
    assert [j.status for j in finished] == [COMPLETED, COMPLETED]

    async def failing():
        runner = FakeRunner(JobFailed("replica_lost", "The generation replica was lost while rendering"))
        runner.gate.set()
        jobs = manager(tmp_path / "f", clock, runner)
        return await jobs.wait(jobs.create(spec()).id, 10)

    failed = asyncio.run(failing())
    assert failed.status == FAILED and failed.error == JobError("replica_lost", "The generation replica was lost while rendering")


def test_a_new_manager_fails_jobs_left_running_and_expiry_removes_videos(tmp_path, clock):
    async def leave_one_running():
        jobs = manager(tmp_path, clock, FakeRunner())
        return jobs.create(spec()).id  # the loop ends with it still waiting: the owner "died"

    left = asyncio.run(leave_one_running())
    (tmp_path / "videos" / ".partial" / f"{left}.fmp4").write_bytes(b"half")

    async def restart_and_expire():
        runner = FakeRunner()
        runner.gate.set()
        jobs = JobManager(JobStore(tmp_path / "jobs.db", now=clock), ContentStore(str(tmp_path / "videos")), runner, "owner-2",
                          JobSettings(100.0, 2, 3.0), now=clock)
        assert jobs.recover() == [left]
        done = await jobs.wait(jobs.create(spec()).id, 10)
        clock.t += 101
        return jobs, done, await jobs.remove_expired()

    jobs, done, gone = asyncio.run(restart_and_expire())
    assert sorted(gone) == sorted([left, done.id])
    assert jobs.store.get(done.id) is None and jobs.content.size(done.id) is None
    assert list((tmp_path / "videos" / ".partial").iterdir()) == []


def keyed(key_id: str | None, blocks: int = 1) -> JobSpec:
    return dataclasses.replace(spec(blocks), key_id=key_id)


def test_each_key_sees_only_its_own_jobs_and_a_server_without_keys_sees_all(tmp_path, clock):
    async def go():
        runner = FakeRunner()
        runner.gate.set()
        jobs = manager(tmp_path, clock, runner, max_queued=8)
        a = await jobs.wait(jobs.create(keyed("key-a")).id, 10)
        b = await jobs.wait(jobs.create(keyed("key-b")).id, 10)
        refused = []
        for attempt in (lambda: jobs.get(a.id, "key-b"), lambda: jobs.remix(a.id, "x", "key-b"), lambda: jobs.delete(a.id, "key-b"),
                        lambda: jobs.content_size(a.id, key_id="key-b"), lambda: jobs.wait(a.id, 1, "key-b")):
            with pytest.raises(JobsError) as info:
                result = attempt()
                if asyncio.iscoroutine(result):
                    await result
            refused.append(info.value)
        with pytest.raises(JobsError) as after:
            jobs.page(10, after=a.id, key_id="key-b")
        remix = await jobs.wait((await jobs.remix(a.id, "again", "key-a")).id, 10)
        return jobs, a, b, refused, after.value, remix

    jobs, a, b, refused, after, remix = asyncio.run(go())
    assert all(e.kind == JobsError.NOT_FOUND and e.message == f"No video found with id '{a.id}'." for e in refused)
    assert after.kind == JobsError.NOT_FOUND
    assert [r.id for r in jobs.page(10, key_id="key-a").data] == [remix.id, a.id]  # a remix belongs to its source's key
    assert [r.id for r in jobs.page(10, key_id="key-b").data] == [b.id]
    assert [r.id for r in jobs.page(10).data] == [remix.id, b.id, a.id]  # no keys configured: as before, every job
    assert jobs.get(a.id, "key-a").key_id == "key-a" and jobs.store.get(a.id).bytes > 0


def test_per_key_quotas_answer_with_the_limit_they_hit(tmp_path, clock):
    async def go():
        runner = FakeRunner()
        jobs = manager(tmp_path, clock, runner, max_queued=8, max_in_flight_per_key=1, max_stored_per_key=2)
        first = jobs.create(keyed("key-a"))
        with pytest.raises(JobsError) as in_flight:
            jobs.create(keyed("key-a"))
        other = jobs.create(keyed("key-b"))  # another key's quota is its own
        anonymous = [jobs.create(keyed(None)) for _ in range(3)]  # a server without keys has no quotas
        runner.gate.set()
        for job in (first, other, *anonymous):
            await jobs.wait(job.id, 10)
        await jobs.wait(jobs.create(keyed("key-a")).id, 10)
        with pytest.raises(JobsError) as stored:
            jobs.create(keyed("key-a"))
        used = jobs.store.stored_bytes("key-a")
        await jobs.delete(first.id, "key-a")  # deleting frees the quota
        freed = jobs.create(keyed("key-a"))
        await jobs.wait(freed.id, 10)
        bytes_limited = manager(tmp_path / "bytes", clock, runner, max_stored_bytes_per_key=1)
        await bytes_limited.wait(bytes_limited.create(keyed("key-a")).id, 10)
        with pytest.raises(JobsError) as too_big:
            bytes_limited.create(keyed("key-a"))
        return in_flight.value, stored.value, used, too_big.value

    in_flight, stored, used, too_big = asyncio.run(go())
    assert (in_flight.kind, in_flight.param, in_flight.retry_after_s) == (JobsError.QUOTA, "jobs_in_flight", 3.0)
    assert "1 videos queued or rendering" in in_flight.message
    assert (stored.kind, stored.param) == (JobsError.QUOTA, "stored_videos") and "stores 2 videos" in stored.message
    assert used > 0 and (too_big.kind, too_big.param) == (JobsError.QUOTA, "stored_bytes")


def test_a_quota_refusal_is_a_429_in_openais_shape():
    from deployments.ingress.videos_api import _from_jobs_error

    error = _from_jobs_error(JobsError(JobsError.QUOTA, "This API key stores 2 videos, its limit; delete some first.", param="stored_videos"))
    assert error.status == 429 and error.body()["error"] == {
        "message": "This API key stores 2 videos, its limit; delete some first.", "type": "insufficient_quota",
        "param": None, "code": "stored_videos_limit",
    }
    assert _from_jobs_error(JobsError(JobsError.QUOTA, "busy", retry_after_s=3.0, param="jobs_in_flight")).headers() == {"Retry-After": "3"}
