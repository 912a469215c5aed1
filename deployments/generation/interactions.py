"""Interactions a user sends mid-stream, and how they shape each block.

Events wait until the next block boundary. A prompt switch blends the text
condition linearly over `transition_chunks` blocks (0 = at once); a camera
command moves the camera (`velocity`: a delta in the camera's own frame per
latent frame until replaced; `target`: to an absolute pose over
`transition_chunks` blocks); keyboard actions give one key set per latent frame
and queue behind earlier ones. Each event is reported as started (the first block
it shapes: for actions queued behind others, the block where their first frame
plays), active (every block it shapes) and completed (the block where its last
part took full effect, or where a later event replaced it).

Pure Python: no tensors, so the rules are easy to test and reuse.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from dataclasses import dataclass, field

import numpy as np

from deployments.contract.events import CameraCommand, Interaction
from deployments.contract.keys import KEYS
from deployments.generation.camera import KeyMotion, Pose, quat_normalize


class InteractionRefused(ValueError):
    """The session cannot take this interaction; generation goes on without it."""


class EventIdConflict(InteractionRefused):
    """The event id was already used in this session."""


def camera_pose(command: CameraCommand) -> Pose:
    """The pose a camera command names (its rotation normalized)."""
    return Pose(tuple(map(float, command.translation)), tuple(quat_normalize(np.array(command.rotation, dtype=float)).tolist()))


@dataclass(frozen=True)
class BlockPlan:
    """What one block is conditioned on, and which events it reports."""

    prompt_mix: tuple[tuple[str, float], ...]
    poses: tuple[Pose, ...]
    reference_pose: Pose
    started: tuple[str, ...]
    active: tuple[str, ...]
    completed: tuple[str, ...]


@dataclass
class _Blend:
    event_id: str
    start: dict[str, float]
    prompt: str
    blocks: int
    done: int = 0


@dataclass
class _Target:
    event_id: str
    start: Pose
    target: Pose
    frames: int
    done: int = 0


@dataclass
class _Velocity:
    event_id: str
    delta: Pose


@dataclass
class _Actions:
    event_id: str
    frames: deque = field(default_factory=deque)


def check_interaction(event: Interaction, accepts_camera: bool) -> None:
    """What a session can be told before its interaction is queued (the ingress checks the same, so a refusal
    comes instead of `queued`, as in the seed): raises InteractionRefused with the reason."""
    if not isinstance(event.event_id, str) or not event.event_id:
        raise InteractionRefused("event_id must be a non-empty string")
    if event.prompt is None and event.camera is None and event.actions is None:
        raise InteractionRefused("an interaction needs a prompt, a camera command or actions")
    if event.prompt is not None and (not isinstance(event.prompt, str) or not event.prompt.strip()):
        raise InteractionRefused("prompt must be a non-blank string")
    if isinstance(event.transition_chunks, bool) or not isinstance(event.transition_chunks, int) or event.transition_chunks < 0:
        raise InteractionRefused("transition_chunks must be an integer >= 0")
    if (event.camera is not None or event.actions is not None) and not accepts_camera:
        raise InteractionRefused("this model has no camera adapter: camera and keyboard actions are not supported")
    if event.camera is not None:
        if event.camera.mode not in ("velocity", "target"):
            raise InteractionRefused(f"camera mode must be 'velocity' or 'target', got {event.camera.mode!r}")
        try:
            camera_pose(event.camera)
        except (ValueError, TypeError) as exc:
            raise InteractionRefused(f"camera pose is invalid: {exc}") from None
    if event.actions is not None:
        if not event.actions:
            raise InteractionRefused("actions must list at least one latent frame of keys")
        for frame in event.actions:
            for key in frame:
                if key not in KEYS:
                    raise InteractionRefused(f"unknown key {key!r}; keys are {' '.join(sorted(KEYS))}")


class Director:
    """Per-session interaction state; `plan_block` is called once per block, in order."""

    def __init__(
        self,
        prompt: str,
        frames_per_block: int,
        accepts_camera: bool,
        key_motion: KeyMotion = KeyMotion(),
        remembered_ids: int = 4096,
    ) -> None:
        self.frames_per_block = frames_per_block
        self.accepts_camera = accepts_camera
        self.key_motion = key_motion
        self.mix: dict[str, float] = {prompt: 1.0}
        self.pose = Pose()
        self._pending: list[Interaction] = []
        self._blend: _Blend | None = None
        self._camera: _Velocity | _Target | None = None
        self._actions: deque[_Actions] = deque()
        self._open_parts: dict[str, set[str]] = {}
        self._started_ids: set[str] = set()  # reported as started, not yet completed
        self._seen_ids: OrderedDict[str, None] = OrderedDict()
        self._remembered_ids = remembered_ids

    # -- submission -------------------------------------------------------
    def submit(self, event: Interaction) -> None:
        """Validate and queue; raises InteractionRefused with the reason."""
        check_interaction(event, self.accepts_camera)
        if event.event_id in self._seen_ids:
            raise EventIdConflict(f"event_id {event.event_id!r} was already used in this session")
        self._seen_ids[event.event_id] = None
        if len(self._seen_ids) > self._remembered_ids:
            self._seen_ids.popitem(last=False)
        self._pending.append(event)

    @property
    def pending_ids(self) -> tuple[str, ...]:
        return tuple(e.event_id for e in self._pending)

    # -- one block ----------------------------------------------------------
    def plan_block(self) -> BlockPlan:
        started: list[str] = []
        completed: list[str] = []
        touched: list[str] = []

        def finish(event_id: str, part: str) -> None:
            parts = self._open_parts.get(event_id)
            if parts is None:
                return
            parts.discard(part)
            if not parts:
                del self._open_parts[event_id]
                self._started_ids.discard(event_id)
                completed.append(event_id)

        def touch(event_id: str) -> None:
            if event_id not in touched:
                touched.append(event_id)

        def start(event_id: str) -> None:
            if event_id not in self._started_ids:
                self._started_ids.add(event_id)
                started.append(event_id)
            touch(event_id)

        for event in self._pending:
            if event.prompt is not None or event.camera is not None:
                start(event.event_id)  # queued actions start when their first frame plays, below
            parts = self._open_parts.setdefault(event.event_id, set())
            if event.prompt is not None:
                if self._blend is not None:
                    finish(self._blend.event_id, "prompt")
                parts.add("prompt")
                self._blend = _Blend(event.event_id, dict(self.mix), event.prompt, event.transition_chunks)
            if event.camera is not None:
                if self._camera is not None:
                    finish(self._camera.event_id, "camera")
                parts.add("camera")
                pose = camera_pose(event.camera)
                if event.camera.mode == "velocity":
                    self._camera = _Velocity(event.event_id, pose)
                else:
                    frames = event.transition_chunks * self.frames_per_block
                    self._camera = _Target(event.event_id, self.pose, pose, frames)
            if event.actions is not None:
                parts.add("actions")
                self._actions.append(_Actions(event.event_id, deque(tuple(f) for f in event.actions)))
        self._pending = []

        if self._blend is not None:
            blend = self._blend
            touch(blend.event_id)
            blend.done += 1
            alpha = 1.0 if blend.blocks == 0 else min(1.0, blend.done / blend.blocks)
            mix = {p: w * (1.0 - alpha) for p, w in blend.start.items()}
            mix[blend.prompt] = mix.get(blend.prompt, 0.0) + alpha
            self.mix = {p: w for p, w in mix.items() if w > 1e-9}
            if alpha >= 1.0:
                self._blend = None
                finish(blend.event_id, "prompt")

        reference = self.pose
        poses = []
        for _ in range(self.frames_per_block):
            self._step_camera(touch, finish)
            self._step_actions(start, finish)
            poses.append(self.pose)

        return BlockPlan(
            prompt_mix=tuple(sorted(self.mix.items())),
            poses=tuple(poses),
            reference_pose=reference,
            started=tuple(started),
            active=tuple(touched),
            completed=tuple(completed),
        )

    def _step_camera(self, touch, finish) -> None:
        cam = self._camera
        if cam is None:
            return
        touch(cam.event_id)
        if isinstance(cam, _Velocity):
            self.pose = self.pose.compose(cam.delta)
            return
        cam.done += 1
        t = 1.0 if cam.frames == 0 else min(1.0, cam.done / cam.frames)
        self.pose = cam.start.interpolate(cam.target, t)
        if t >= 1.0:
            self._camera = None
            finish(cam.event_id, "camera")

    def _step_actions(self, start, finish) -> None:
        if not self._actions:
            return
        head = self._actions[0]
        start(head.event_id)
        self.pose = self.pose.compose(self.key_motion.delta(head.frames.popleft()))
        if not head.frames:
            self._actions.popleft()
            finish(head.event_id, "actions")
