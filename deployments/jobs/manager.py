"""The jobs' life: queued -> in_progress -> completed | failed, with its record, its video and its expiry.

One `JobManager` lives in the single VideoJobs replica. It writes every
change to the store itself (one writer), runs each job as an asyncio task
through a `SessionRunner`, remuxes the finished stream to a progressive MP4
and puts it in the content store. When it starts, jobs an earlier owner left
queued or in progress are marked failed, not re-run: their callers asked for
one render and may already have given up. What a job rendered (its recipe
and start image) is kept with it, so a completed one can be remixed under a
new prompt. Pure asyncio, no Ray: the runner it is given does the serving.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np
from PIL import Image

from deployments.jobs.content import SPRITESHEET, START_IMAGE, THUMBNAIL, VIDEO, Asset, ContentStore
from deployments.jobs.records import (
    COMPLETED,
    FAILED,
    IN_PROGRESS,
    QUEUED,
    JobError,
    JobPage,
    JobRecord,
    JobsError,
    JobSpec,
    new_job_id,
    not_found,
    visible,
)
from deployments.jobs.runner import JobFailed
from deployments.jobs.store import JobStore
from deployments.media.previews import write_previews
from deployments.media.remux import remux_file
from deployments.protocol.video import decode_image_bytes

logger = logging.getLogger("ray.serve")

RESTARTED = JobError("server_restarted", "The server restarted while the job ran; create the video again.")


@dataclass(frozen=True)
class JobSettings:
    expiry_s: float
    max_queued: int
    retry_after_s: float
    # Per API key (a server without keys has no quotas); None: no limit.
    max_in_flight_per_key: int | None = None  # queued + in progress
    max_stored_per_key: int | None = None  # completed videos kept
    max_stored_bytes_per_key: int | None = None  # their bytes (video and previews)


class JobManager:
    def __init__(
        self,
        store: JobStore,
        content: ContentStore,
        runner,  # a SessionRunner (anything with its `run`)
        owner: str,
        settings: JobSettings,
        now: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        self.content = content
        self.runner = runner
        self.owner = owner
        self.settings = settings
        self._now = now
        # The store's connection belongs to the event loop's thread: only file and media work goes to threads.
        self._tasks: dict[str, asyncio.Task] = {}
        self._finished: dict[str, asyncio.Event] = {}
        self._waiting: set[str] = set()  # queued: no replica has taken them yet

    # -- start -----------------------------------------------------------------------
    def recover(self) -> list[str]:
        """Take over from earlier owners: fail what they left running, drop their partial files."""
        failed = self.store.take_over(self.owner, RESTARTED, self.settings.expiry_s)
        self.content.clear_scratch()
        if failed:
            logger.warning("video jobs: %d job(s) left unfinished by an earlier owner marked failed", len(failed))
        return failed

    # -- asking ------------------------------------------------------------------------
    def create(self, spec: JobSpec, remixed_from: str | None = None) -> JobRecord:
        self._check_quota(spec.key_id)
        if len(self._waiting) >= self.settings.max_queued:
            raise JobsError(
                JobsError.QUEUE_FULL,
                f"The video queue is full ({len(self._waiting)} jobs waiting); try again later.",
                retry_after_s=self.settings.retry_after_s,
            )
        request = spec.request
        record = JobRecord(
            id=new_job_id(),
            status=QUEUED,
            created_at=self._now(),
            model=spec.model,
            prompt=request.prompt,
            seconds=spec.seconds,
            size=spec.size,
            fps=request.fps,
            num_frames=spec.num_frames,
            seed=request.seed,
            owner=self.owner,
            remixed_from_video_id=remixed_from,
            key_id=spec.key_id,
        )
        self.store.insert(record, spec.recipe())
        self._waiting.add(record.id)
        self._finished[record.id] = asyncio.Event()
        self._tasks[record.id] = asyncio.create_task(self._run(record.id, spec), name=f"video-job-{record.id}")
        return record

    def _check_quota(self, key_id: str | None) -> None:
        """A key at one of its limits gets a 429 naming it; a server without keys has none."""
        if key_id is None:
            return
        limits = self.settings
        if limits.max_in_flight_per_key is not None and self.store.count(QUEUED, IN_PROGRESS, key_id=key_id) >= limits.max_in_flight_per_key:
            raise JobsError(JobsError.QUOTA, f"This API key has {limits.max_in_flight_per_key} videos queued or rendering, its limit; "
                            "wait for one to finish.", retry_after_s=limits.retry_after_s, param="jobs_in_flight")
        if limits.max_stored_per_key is not None and self.store.count(COMPLETED, key_id=key_id) >= limits.max_stored_per_key:
            raise JobsError(JobsError.QUOTA, f"This API key stores {limits.max_stored_per_key} videos, its limit; delete some first.",
                            param="stored_videos")
        stored = self.store.stored_bytes(key_id) if limits.max_stored_bytes_per_key is not None else 0
        if limits.max_stored_bytes_per_key is not None and stored >= limits.max_stored_bytes_per_key:
            raise JobsError(JobsError.QUOTA, f"This API key's videos take {stored} bytes, at or over its limit of "
                            f"{limits.max_stored_bytes_per_key}; delete some first.", param="stored_bytes")

    async def remix(self, source_id: str, prompt: str, key_id: str | None = None) -> JobRecord:
        """A new job rendering the completed job `source_id` again under `prompt` (its seed, size, actions, start image)."""
        source = self.get(source_id, key_id)
        if source.status != COMPLETED:
            raise JobsError(JobsError.NOT_READY, f"Video '{source_id}' can be remixed once it is completed; it is {source.status}.",
                            param="video_id")
        recipe = self.store.recipe(source_id)
        if recipe is None:
            raise JobsError(JobsError.NOT_FOUND, f"Video '{source_id}' was made by an older server that kept no recipe to remix.",
                            param="video_id")
        image = None
        if recipe.start_image:
            image = await asyncio.to_thread(self._start_image, source_id)
            if image is None:
                raise JobsError(JobsError.NOT_FOUND, f"The start image of video '{source_id}' is gone.", param="video_id")
        return self.create(recipe.remix(source, prompt, image), remixed_from=source_id)

    def get(self, job_id: str, key_id: str | None = None) -> JobRecord:
        """The job, if the caller's key may see it; another key's job is not found, exactly as a missing one."""
        record = self.store.get(job_id)
        if record is None or not visible(record, key_id):
            raise not_found(job_id)
        return record

    def page(self, limit: int, after: str | None = None, order: str = "desc", key_id: str | None = None) -> JobPage:
        return self.store.page(limit, after, order, key_id)

    async def wait(self, job_id: str, timeout_s: float, key_id: str | None = None) -> JobRecord:
        """The job once it finished, or as it stands after `timeout_s`."""
        record = self.get(job_id, key_id)
        event = self._finished.get(job_id)
        if not record.finished and event is not None:
            try:
                await asyncio.wait_for(event.wait(), timeout_s)
            except TimeoutError:
                pass
        return self.get(job_id)

    async def delete(self, job_id: str, key_id: str | None = None) -> None:
        """Cancel the job if it runs (its session ends, its slot frees), then drop its record and video."""
        self.get(job_id, key_id)
        task = self._tasks.get(job_id)
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            self._forget(job_id)  # a task cancelled before it started never ran its own cleanup
        self.store.delete(job_id)
        await asyncio.to_thread(self.content.delete, job_id)

    async def content_size(self, job_id: str, asset: Asset = VIDEO, key_id: str | None = None) -> int:
        record = self.get(job_id, key_id)
        if record.status != COMPLETED:
            raise JobsError(JobsError.NOT_READY, f"Video '{job_id}' has no content: it is {record.status}.", param="video_id")
        size = await asyncio.to_thread(self.content.size, job_id, asset)
        if size is None:  # a video finished by an older server, which made no previews
            raise JobsError(JobsError.NOT_FOUND, f"Video '{job_id}' has no {asset.name}.", param="variant")
        return size

    async def read_content(self, job_id: str, asset: Asset = VIDEO, key_id: str | None = None) -> Iterator[bytes]:
        """The asset's chunks; iterate them in a thread (each one reads the content store)."""
        await self.content_size(job_id, asset, key_id)
        return self.content.read(job_id, asset)

    def stats(self) -> dict:
        return {"owner": self.owner, "running": sorted(self._tasks), "waiting": sorted(self._waiting)}

    # -- expiry ------------------------------------------------------------------------
    async def remove_expired(self) -> list[str]:
        gone = []
        for job_id in self.store.expired():
            if job_id in self._tasks:
                continue  # never expire a job that still runs
            await asyncio.to_thread(self.content.delete, job_id)
            self.store.delete(job_id)
            gone.append(job_id)
        return gone

    async def expire_forever(self, interval_s: float) -> None:
        while True:
            try:
                gone = await self.remove_expired()
                if gone:
                    logger.info("video jobs: %d expired job(s) removed", len(gone))
            except Exception:  # a failing disk must not stop the next round
                logger.exception("video jobs: expiry round failed")
            await asyncio.sleep(interval_s)

    # -- one job -----------------------------------------------------------------------
    async def _run(self, job_id: str, spec: JobSpec) -> None:
        stream_file = self.content.scratch_path(job_id, ".fmp4")
        outputs = {asset: self.content.scratch_path(job_id, asset.suffix) for asset in (THUMBNAIL, SPRITESHEET, VIDEO)}
        progress = 0

        def started(seed: int) -> None:
            self._waiting.discard(job_id)
            self.store.update(job_id, self.owner, status=IN_PROGRESS, seed=seed)

        def block_done(blocks: int) -> None:
            nonlocal progress
            # 100 is for a job whose video can be downloaded: the last block still has to be remuxed and stored.
            percent = min(99, blocks * 100 // spec.num_blocks)
            if percent != progress:
                progress = percent
                self.store.update(job_id, self.owner, progress=percent)

        try:
            if spec.request.image is not None:
                await asyncio.to_thread(self._keep_start_image, job_id, spec.request.image)
            result = await self.runner.run(spec, stream_file, started, block_done)
            frames = await asyncio.to_thread(remux_file, stream_file, outputs[VIDEO])
            if frames != result.frames:
                logger.warning("video job %s: %d frames generated but %d remuxed", job_id, result.frames, frames)
            await asyncio.to_thread(write_previews, outputs[VIDEO], outputs[THUMBNAIL], outputs[SPRITESHEET])
            size = 0
            for asset, path in outputs.items():  # the video last: whoever sees it finds its previews too
                size += await asyncio.to_thread(self.content.put, job_id, path, asset)
            self._finish(job_id, COMPLETED, size=size)
        except asyncio.CancelledError:
            raise  # deleted: the record goes with it
        except JobFailed as exc:
            self._finish(job_id, FAILED, JobError(exc.code, exc.message))
        except Exception as exc:
            logger.exception("video job %s failed", job_id)
            self._finish(job_id, FAILED, JobError("internal_error", f"Rendering failed: {type(exc).__name__}"))
        finally:
            for path in (stream_file, *outputs.values()):
                path.unlink(missing_ok=True)
            self._forget(job_id)

    def _keep_start_image(self, job_id: str, image: np.ndarray) -> None:
        path = self.content.scratch_path(job_id, START_IMAGE.suffix)
        Image.fromarray(image).save(path, format="PNG")  # lossless: a remix starts from the same pixels
        self.content.put(job_id, path, START_IMAGE)

    def _start_image(self, job_id: str) -> np.ndarray | None:
        data = self.content.read_all(job_id, START_IMAGE)
        # Decoded as a start image from a request is: the same pixels the source job started from.
        return None if data is None else decode_image_bytes(data, max_pixels=sys.maxsize)

    def _forget(self, job_id: str) -> None:
        """The job no longer runs here: drop it from the queue and wake whoever waits on it."""
        self._waiting.discard(job_id)
        self._tasks.pop(job_id, None)
        event = self._finished.pop(job_id, None)
        if event is not None:
            event.set()

    def _finish(self, job_id: str, status: str, error: JobError | None = None, size: int = 0) -> None:
        if not self.store.finish(job_id, self.owner, status, self.settings.expiry_s, error, size):
            # Deleted meanwhile, or a newer owner took it over: the video is nobody's.
            self.content.delete(job_id)
