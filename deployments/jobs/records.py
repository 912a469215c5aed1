"""What a video job is: the request it runs, the record the store keeps, and how asking about one can fail.

Plain dataclasses, pickled between the ingress and the VideoJobs replica; the
OpenAI wire shape is built from them in `deployments/protocol/videos.py`.
"""

from __future__ import annotations

import dataclasses
import json
import uuid
from dataclasses import dataclass, field

import numpy as np

from deployments.contract.events import Interaction
from deployments.contract.session_spec import SessionSpec

QUEUED = "queued"
IN_PROGRESS = "in_progress"
COMPLETED = "completed"
FAILED = "failed"
ACTIVE = (QUEUED, IN_PROGRESS)
FINISHED = (COMPLETED, FAILED)

ID_PREFIX = "video_"
ACTIONS_EVENT_ID = "actions"  # the event id of a job's action script


def new_job_id() -> str:
    return ID_PREFIX + uuid.uuid4().hex


@dataclass(frozen=True)
class JobSpec:
    """A validated job: the session a replica runs, plus what the job object reports about it."""

    request: SessionSpec
    model: str
    seconds: str
    size: str
    num_frames: int
    # Keyboard actions, one key set per latent frame, submitted as one interaction when the session opens.
    actions: tuple[tuple[str, ...], ...] | None = None
    key_id: str | None = None  # the API key that asked (its fingerprint; None on a server without keys)

    @property
    def num_blocks(self) -> int:
        return self.request.num_blocks or 1

    def session_spec(self) -> SessionSpec:
        """The session a replica runs; the action script is submitted before block 0, so it plays from the
        first frame and the same job renders the same video every time (a remix of it too)."""
        if not self.actions:
            return self.request
        actions = Interaction(event_id=ACTIONS_EVENT_ID, actions=self.actions)
        return dataclasses.replace(self.request, interactions=(*self.request.interactions, actions))

    def recipe(self) -> Recipe:
        request = self.request
        return Recipe(request.width, request.height, request.num_blocks, request.num_inference_steps, request.flow_shift,
                      self.actions, request.image is not None)


@dataclass(frozen=True)
class Recipe:
    """What a job rendered besides its prompt and seed, kept with its record so it can be remixed.

    The start image is not in here (it is a content asset); `start_image` says whether there is one.
    """

    width: int
    height: int
    num_blocks: int | None
    num_inference_steps: int | None
    flow_shift: float | None
    actions: tuple[tuple[str, ...], ...] | None
    start_image: bool

    def to_json(self) -> str:
        fields = dict(self.__dict__)
        fields["actions"] = None if self.actions is None else [list(keys) for keys in self.actions]
        return json.dumps(fields)

    @classmethod
    def from_json(cls, text: str) -> Recipe:
        fields = json.loads(text)
        if fields["actions"] is not None:
            fields["actions"] = tuple(tuple(keys) for keys in fields["actions"])
        return cls(**fields)

    def remix(self, source: JobRecord, prompt: str, image: np.ndarray | None) -> JobSpec:
        """The source job again with another prompt: same seed, size, length, steps, actions and start image."""
        request = SessionSpec(  # a fresh session id
            prompt=prompt,
            height=self.height,
            width=self.width,
            fps=source.fps,
            seed=source.seed,
            num_blocks=self.num_blocks,
            num_inference_steps=self.num_inference_steps,
            flow_shift=self.flow_shift,
            image=image,
        )
        return JobSpec(request, source.model, source.seconds, source.size, source.num_frames, self.actions, source.key_id)


@dataclass(frozen=True)
class JobError:
    code: str
    message: str


@dataclass(frozen=True)
class JobRecord:
    id: str
    status: str  # queued | in_progress | completed | failed
    created_at: float
    model: str
    prompt: str
    seconds: str
    size: str
    fps: int
    num_frames: int
    progress: int = 0
    seed: int | None = None  # known once a replica opened the session (it draws one when not asked)
    completed_at: float | None = None
    expires_at: float | None = None  # set when the job finishes: the record and its video go then
    error: JobError | None = None
    owner: str = ""  # the VideoJobs replica that runs (or ran) it
    remixed_from_video_id: str | None = None
    key_id: str | None = None  # the API key it belongs to (a fingerprint, never the key); None: a server without keys
    bytes: int = 0  # what its video and previews take in the content store, once completed

    @property
    def finished(self) -> bool:
        return self.status in FINISHED


@dataclass(frozen=True)
class JobPage:
    data: list[JobRecord] = field(default_factory=list)
    has_more: bool = False


class JobsError(Exception):
    """A question about jobs the owner cannot answer as asked; `kind` says why (the ingress maps it to HTTP)."""

    NOT_FOUND = "not_found"
    NOT_READY = "not_ready"  # no content (yet)
    QUEUE_FULL = "queue_full"
    QUOTA = "quota"  # the key holds as many jobs or stored videos as it may

    def __init__(self, kind: str, message: str, retry_after_s: float | None = None, param: str | None = None) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.retry_after_s = retry_after_s
        self.param = param

    def __reduce__(self):
        # Ray pickles exceptions raised in a replica; keep every field across the trip.
        return (type(self), (self.kind, self.message, self.retry_after_s, self.param))


def visible(record: JobRecord, key_id: str | None) -> bool:
    """Whether a caller with `key_id` may see `record`: every job on a server without keys, else only its key's."""
    return key_id is None or record.key_id == key_id


def not_found(job_id: str, param: str | None = None) -> JobsError:
    return JobsError(JobsError.NOT_FOUND, f"No video found with id '{job_id}'.", param=param)
