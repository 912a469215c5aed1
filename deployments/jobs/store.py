"""Job records in SQLite: one file, one writer (the VideoJobs replica), survives every other process.

Every change a running job makes is guarded by its owner: when a new owner
starts it takes over the rows a previous one left queued or in progress
(marking them failed), and from then on a previous owner that still lives
(a rolling update) can no longer write to them. No Ray, no asyncio: each call
is one short transaction, made from the owner's event loop.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path

from deployments.jobs.records import (
    ACTIVE,
    FAILED,
    FINISHED,
    JobError,
    JobPage,
    JobRecord,
    Recipe,
    not_found,
)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,  -- creation order: lists page on it
    id TEXT NOT NULL UNIQUE,
    owner TEXT NOT NULL,
    status TEXT NOT NULL,
    progress INTEGER NOT NULL DEFAULT 0,
    created_at REAL NOT NULL,
    completed_at REAL,
    expires_at REAL,
    model TEXT NOT NULL,
    prompt TEXT NOT NULL,
    seconds TEXT NOT NULL,
    size TEXT NOT NULL,
    fps INTEGER NOT NULL,
    num_frames INTEGER NOT NULL,
    seed TEXT,  -- up to 2**63 - 1: kept as text so no driver rounds it
    error TEXT,  -- JSON {"code", "message"}
    remixed_from TEXT,
    recipe TEXT,  -- JSON Recipe: what a remix renders again
    key_id TEXT,  -- the API key's fingerprint (never the key); NULL on a server without keys
    bytes INTEGER NOT NULL DEFAULT 0  -- the content store's bytes for this job, once completed
);
CREATE INDEX IF NOT EXISTS jobs_by_status ON jobs (status);
CREATE INDEX IF NOT EXISTS jobs_by_expiry ON jobs (expires_at);
"""
_INDEXES = "CREATE INDEX IF NOT EXISTS jobs_by_key ON jobs (key_id, seq);"

# Columns added since the first release, with their types: a database made by an older server gains them.
_ADDED_COLUMNS = {"remixed_from": "TEXT", "recipe": "TEXT", "key_id": "TEXT", "bytes": "INTEGER NOT NULL DEFAULT 0"}
_COLUMNS = ("id, owner, status, progress, created_at, completed_at, expires_at, model, prompt, seconds, size, fps, "
            "num_frames, seed, error, remixed_from, key_id, bytes")
_PLACEHOLDERS = ", ".join("?" for _ in _COLUMNS.split(", "))


class JobStore:
    def __init__(self, path: str | Path, now: Callable[[], float] = time.time) -> None:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        self._now = now
        # Autocommit: each statement is its own transaction; WAL keeps readers (a backup, sqlite3 CLI) off the writer.
        self._db = sqlite3.connect(path, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        # FULL: each commit's WAL frames reach the disk before it returns, so a crash loses no finished job.
        self._db.execute("PRAGMA synchronous=FULL")
        self._db.execute("PRAGMA busy_timeout=5000")
        self._db.executescript(_SCHEMA)
        present = {row[1] for row in self._db.execute("PRAGMA table_info(jobs)")}
        for name, kind in _ADDED_COLUMNS.items():
            if name not in present:
                self._db.execute(f"ALTER TABLE jobs ADD COLUMN {name} {kind}")
        self._db.executescript(_INDEXES)

    def close(self) -> None:
        self._db.close()

    # -- writes ------------------------------------------------------------------------
    def insert(self, record: JobRecord, recipe: Recipe | None = None) -> None:
        self._db.execute(
            f"INSERT INTO jobs ({_COLUMNS}, recipe) VALUES ({_PLACEHOLDERS}, ?)",
            (*_row(record), None if recipe is None else recipe.to_json()),
        )

    def update(self, job_id: str, owner: str, **fields) -> bool:
        """Set `fields` (progress, seed, status) on a job this owner still holds; False when it does not."""
        allowed = {"progress", "seed", "status"}
        if not fields or set(fields) - allowed:
            raise ValueError(f"update takes {sorted(allowed)}, got {sorted(fields)}")
        if "seed" in fields and fields["seed"] is not None:
            fields["seed"] = str(fields["seed"])
        sets = ", ".join(f"{name} = ?" for name in fields)
        cursor = self._db.execute(f"UPDATE jobs SET {sets} WHERE id = ? AND owner = ?", (*fields.values(), job_id, owner))
        return cursor.rowcount == 1

    def finish(self, job_id: str, owner: str, status: str, expiry_s: float, error: JobError | None = None, size: int = 0) -> bool:
        """Completed or failed, now; the record expires `expiry_s` later. `size`: the bytes its content takes."""
        if status not in FINISHED:
            raise ValueError(f"a job finishes as one of {FINISHED}, not {status!r}")
        now = self._now()
        # A failed job keeps the progress it reached: that says how far it got.
        cursor = self._db.execute(
            "UPDATE jobs SET status = ?, progress = CASE WHEN ? = 'completed' THEN 100 ELSE progress END, "
            "completed_at = ?, expires_at = ?, error = ?, bytes = ? WHERE id = ? AND owner = ?",
            (status, status, now, now + expiry_s, _error_json(error), size, job_id, owner),
        )
        return cursor.rowcount == 1

    def take_over(self, owner: str, error: JobError, expiry_s: float) -> list[str]:
        """Fail the jobs earlier owners left queued or in progress (they died, or are being replaced); their ids."""
        marks = ", ".join("?" for _ in ACTIVE)
        rows = self._db.execute(f"SELECT id FROM jobs WHERE status IN ({marks}) AND owner != ?", (*ACTIVE, owner)).fetchall()
        ids = [row[0] for row in rows]
        now = self._now()
        for job_id in ids:
            self._db.execute(
                "UPDATE jobs SET owner = ?, status = ?, completed_at = ?, expires_at = ?, error = ? WHERE id = ?",
                (owner, FAILED, now, now + expiry_s, _error_json(error), job_id),
            )
        return ids

    def delete(self, job_id: str) -> bool:
        return self._db.execute("DELETE FROM jobs WHERE id = ?", (job_id,)).rowcount == 1

    # -- reads -------------------------------------------------------------------------
    def get(self, job_id: str) -> JobRecord | None:
        row = self._db.execute(f"SELECT {_COLUMNS} FROM jobs WHERE id = ?", (job_id,)).fetchone()
        return None if row is None else _record(row)

    def recipe(self, job_id: str) -> Recipe | None:
        """What the job rendered (None for an unknown job, or one made by a server that kept no recipe)."""
        row = self._db.execute("SELECT recipe FROM jobs WHERE id = ?", (job_id,)).fetchone()
        return None if row is None or row[0] is None else Recipe.from_json(row[0])

    def page(self, limit: int, after: str | None = None, order: str = "desc", key_id: str | None = None) -> JobPage:
        """`limit` jobs, newest first (`desc`) or oldest first (`asc`), after the job `after`, of `key_id`'s jobs
        (every job when None); raises JobsError (an `after` the key cannot see is not found)."""
        if order not in ("asc", "desc"):
            raise ValueError(f"order must be 'asc' or 'desc', got {order!r}")
        where, args = _of_key(key_id)
        if after is not None:
            row = self._db.execute(f"SELECT seq FROM jobs WHERE id = ? AND {where}", (after, *args)).fetchone()
            if row is None:
                raise not_found(after, param="after")
            where, args = where + (" AND seq < ?" if order == "desc" else " AND seq > ?"), [*args, row[0]]
        rows = self._db.execute(
            f"SELECT {_COLUMNS} FROM jobs WHERE {where} ORDER BY seq {order.upper()} LIMIT ?", (*args, limit + 1)
        ).fetchall()
        return JobPage([_record(row) for row in rows[:limit]], has_more=len(rows) > limit)

    def count(self, *statuses: str, key_id: str | None = None) -> int:
        where, args = _of_key(key_id)
        marks = ", ".join("?" for _ in statuses)
        return self._db.execute(f"SELECT COUNT(*) FROM jobs WHERE status IN ({marks}) AND {where}", (*statuses, *args)).fetchone()[0]

    def stored_bytes(self, key_id: str | None = None) -> int:
        where, args = _of_key(key_id)
        return self._db.execute(f"SELECT COALESCE(SUM(bytes), 0) FROM jobs WHERE {where}", args).fetchone()[0]

    def expired(self) -> list[str]:
        """Finished jobs whose time is up, oldest first."""
        rows = self._db.execute(
            "SELECT id FROM jobs WHERE expires_at IS NOT NULL AND expires_at <= ? ORDER BY expires_at", (self._now(),)
        ).fetchall()
        return [row[0] for row in rows]


def _of_key(key_id: str | None) -> tuple[str, tuple]:
    """The WHERE clause that keeps `key_id`'s jobs (all of them when None)."""
    return ("1", ()) if key_id is None else ("key_id = ?", (key_id,))


def _error_json(error: JobError | None) -> str | None:
    return None if error is None else json.dumps({"code": error.code, "message": error.message})


def _row(r: JobRecord) -> tuple:
    seed = None if r.seed is None else str(r.seed)
    return (r.id, r.owner, r.status, r.progress, r.created_at, r.completed_at, r.expires_at, r.model, r.prompt,
            r.seconds, r.size, r.fps, r.num_frames, seed, _error_json(r.error), r.remixed_from_video_id, r.key_id, r.bytes)


def _record(row: tuple) -> JobRecord:
    (job_id, owner, status, progress, created_at, completed_at, expires_at, model, prompt,
     seconds, size, fps, num_frames, seed, error, remixed_from, key_id, size_bytes) = row
    error = None if error is None else JobError(**json.loads(error))
    return JobRecord(
        id=job_id, status=status, created_at=created_at, model=model, prompt=prompt, seconds=seconds, size=size,
        fps=fps, num_frames=num_frames, progress=progress, seed=None if seed is None else int(seed),
        completed_at=completed_at, expires_at=expires_at, error=error, owner=owner, remixed_from_video_id=remixed_from,
        key_id=key_id, bytes=size_bytes,
    )
