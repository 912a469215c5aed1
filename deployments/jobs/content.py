"""Where finished jobs' files live: a folder or any fsspec URL (s3://, gs://, ...).

Each job has up to four assets, one file each: its video (`<id>.mp4`), the
two previews OpenAI's API offers beside it (`<id>.thumbnail.webp`,
`<id>.spritesheet.jpg`), and its start image (`<id>.start.png`, kept so the
job can be remixed). A job renders into a local scratch folder (the mov muxer
needs a real file to move `moov` to the front) and each finished file is put
here in one piece, so a reader never sees half of one. Blocking calls: run
them in a thread.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import fsspec
from fsspec.implementations.local import LocalFileSystem

READ_CHUNK_BYTES = 1 << 20


@dataclass(frozen=True)
class Asset:
    name: str
    suffix: str  # after the job id in the file name
    media_type: str


VIDEO = Asset("video", ".mp4", "video/mp4")
THUMBNAIL = Asset("thumbnail", ".thumbnail.webp", "image/webp")
SPRITESHEET = Asset("spritesheet", ".spritesheet.jpg", "image/jpeg")
START_IMAGE = Asset("start_image", ".start.png", "image/png")
ASSETS = (VIDEO, THUMBNAIL, SPRITESHEET, START_IMAGE)
# What `GET /v1/videos/{id}/content?variant=` may ask for.
DOWNLOADS = {asset.name: asset for asset in (VIDEO, THUMBNAIL, SPRITESHEET)}


class ContentStore:
    def __init__(self, url: str, scratch_dir: str | Path | None = None) -> None:
        self.fs, root = fsspec.core.url_to_fs(url)
        self.root = root.rstrip("/")
        self.fs.makedirs(self.root, exist_ok=True)
        if scratch_dir is None:
            # Beside the videos when they are local (same disk: the final put is a rename), else in /tmp.
            local = isinstance(self.fs, LocalFileSystem)
            scratch_dir = Path(self.root) / ".partial" if local else Path(tempfile.gettempdir()) / "rtv-jobs-partial"
        self.scratch = Path(scratch_dir)
        self.scratch.mkdir(parents=True, exist_ok=True)

    def path(self, job_id: str, asset: Asset = VIDEO) -> str:
        return f"{self.root}/{job_id}{asset.suffix}"

    def scratch_path(self, job_id: str, suffix: str) -> Path:
        return self.scratch / f"{job_id}{suffix}"

    def clear_scratch(self, job_id: str | None = None) -> None:
        """A job's partial files, or (None) everything a previous owner left behind."""
        if job_id is None:
            shutil.rmtree(self.scratch, ignore_errors=True)
            self.scratch.mkdir(parents=True, exist_ok=True)
            return
        for leftover in self.scratch.glob(f"{job_id}.*"):
            leftover.unlink(missing_ok=True)

    def put(self, job_id: str, local_file: str | Path, asset: Asset = VIDEO) -> int:
        """Store the finished file as the job's `asset` (replacing any); returns its size."""
        local_file = Path(local_file)
        size = local_file.stat().st_size
        target = self.path(job_id, asset)
        if isinstance(self.fs, LocalFileSystem):
            self.fs.mv(str(local_file), target)  # a rename on the same disk: readers see all or nothing
        else:
            self.fs.put_file(str(local_file), target)  # object stores make an object visible whole
            local_file.unlink(missing_ok=True)
        return size

    def size(self, job_id: str, asset: Asset = VIDEO) -> int | None:
        try:
            return self.fs.size(self.path(job_id, asset))
        except FileNotFoundError:
            return None

    def read(self, job_id: str, asset: Asset = VIDEO, chunk_bytes: int = READ_CHUNK_BYTES) -> Iterator[bytes]:
        with self.fs.open(self.path(job_id, asset), "rb") as f:
            while data := f.read(chunk_bytes):
                yield data

    def read_all(self, job_id: str, asset: Asset) -> bytes | None:
        try:
            return self.fs.cat_file(self.path(job_id, asset))
        except FileNotFoundError:
            return None

    def delete(self, job_id: str) -> None:
        """Every asset of the job, and its partial files."""
        for asset in ASSETS:
            try:
                self.fs.rm_file(self.path(job_id, asset))
            except FileNotFoundError:
                pass
        self.clear_scratch(job_id)
