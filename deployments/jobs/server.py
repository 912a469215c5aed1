"""The VideoJobs deployment: one replica that owns the job records and runs the jobs. Thin.

It sits behind the ingress so jobs outlive any ingress replica (the ingress is
just HTTP), and there is exactly one of it so the SQLite file has one writer.
If it dies, Serve starts a new one, which marks what the old one left running
as failed; the sessions it held end on their replicas when their leases lapse.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

from deployments.config import AppConfig
from deployments.jobs.content import DOWNLOADS, ContentStore
from deployments.jobs.manager import JobManager, JobSettings
from deployments.jobs.records import JobPage, JobRecord, JobSpec
from deployments.jobs.runner import SessionRunner
from deployments.jobs.store import JobStore

LONGEST_EXPIRY_ROUND_S = 60.0


class VideoJobs:
    async def __init__(self, config: AppConfig, world) -> None:
        # Async: Serve runs it on the replica's event loop, where the jobs' tasks then live.
        owner = uuid.uuid4().hex
        store = JobStore(Path(config.jobs_db_path).expanduser().resolve())
        content = ContentStore(config.jobs_content_dir)
        settings = JobSettings(config.jobs_expiry_s, config.max_queued_jobs, config.retry_after_s,
                               config.jobs_in_flight_per_key, config.jobs_stored_per_key, config.jobs_stored_bytes_per_key)
        self.jobs = JobManager(store, content, SessionRunner(world, config.lease_timeout_s), owner, settings)
        self.jobs.recover()
        self._expiry = asyncio.create_task(self.jobs.expire_forever(min(config.jobs_expiry_s / 4, LONGEST_EXPIRY_ROUND_S)))

    async def create(self, spec: JobSpec, key_id: str | None = None) -> JobRecord:
        return self.jobs.create(dataclasses.replace(spec, key_id=key_id))

    # `key_id`: the caller's API key fingerprint; it sees only that key's jobs (None: a server without keys, all jobs).
    async def remix(self, source_id: str, prompt: str, key_id: str | None = None) -> JobRecord:
        return await self.jobs.remix(source_id, prompt, key_id)

    async def get(self, job_id: str, key_id: str | None = None) -> JobRecord:
        return self.jobs.get(job_id, key_id)

    async def page(self, limit: int, after: str | None, order: str, key_id: str | None = None) -> JobPage:
        return self.jobs.page(limit, after, order, key_id)

    async def wait(self, job_id: str, timeout_s: float, key_id: str | None = None) -> JobRecord:
        return await self.jobs.wait(job_id, timeout_s, key_id)

    async def delete(self, job_id: str, key_id: str | None = None) -> None:
        await self.jobs.delete(job_id, key_id)

    async def content_size(self, job_id: str, variant: str = "video", key_id: str | None = None) -> int:
        return await self.jobs.content_size(job_id, DOWNLOADS[variant], key_id)

    async def read_content(self, job_id: str, variant: str = "video", key_id: str | None = None) -> AsyncIterator[bytes]:
        """The job's MP4 (or one of its previews) in chunks (a streaming call)."""
        chunks = await self.jobs.read_content(job_id, DOWNLOADS[variant], key_id)
        while (data := await asyncio.to_thread(next, chunks, None)) is not None:
            yield data

    async def stats(self) -> dict:
        """For tests and operators."""
        return {"pid": os.getpid(), **self.jobs.stats()}
