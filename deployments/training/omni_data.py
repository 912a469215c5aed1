"""What the built-in thinker learns from: clips of the procedural world with a tone, and fixed questions.

A clip is what one `video.query` sees on the chat path: a few frames sampled at
the chat client's rate (2 frames/s by default) from a camera that holds one
motion over the clip (the world model's keys: `j` left, `l` right, `i` up,
`k` down, `w` forward, `s` back, or none), in one biome or switching
to another part-way (a prompt change), with the microphone's audio over the
same seconds: a low or high tone, steady or beeping, or silence, or no audio
at all. Moving forward or back, the camera passes the posts and trees it had
in view ahead (or that come into view ahead as it backs past them). The questions are a fixed, documented set (the model is a demo and a
test oracle, not an assistant), each with a few phrasings; the answers are
short and exact, so accuracy is a string match.

Per sampled frame the camera moves one to three latent frames' worth of a held
key (3 degrees or 0.1 units each): a world-model video at 16 frames/s sampled
at 2 frames/s moves two latent frames per sample.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from deployments.generation.camera import FOV_DEGREES, KeyMotion, Pose, quat_axis_angle, quat_to_matrix
from deployments.training.measures import block_motion
from deployments.training.trajectories import random_origin
from deployments.training.world import BIOME_NAMES, BIOMES, render, tall_landmarks

FPS = 2.0  # frames per second of a clip: the chat client's default
SAMPLE_RATE = 16_000  # the audio.chunk rate
MIN_FRAMES, MAX_FRAMES = 4, 16  # a query sees up to num_sample_frames (16 by default)
MAX_PITCH = math.radians(40.0)  # the world model's player turns back beyond this
MIN_TURN_PIXELS = 1.0  # a turn is drawn again from elsewhere until it moves the picture this much a frame
TURN_ATTEMPTS = 8

BIOME_ANSWERS = {
    "meadow": "a green meadow",
    "desert": "a sandy desert",
    "snow": "a snowy field",
    "shore": "an ocean shore",
    "forest": "a forest",
    "lava": "a lava field",
    "city": "a city plaza",
}
# answer -> the key held through the clip. Sideways it is the turn (`j`/`l`): a strafe (`a`/`d`) over an
# open shore moves nothing a 64x64 frame shows, so it would teach a guess.
MOTIONS = {"left": "j", "right": "l", "up": "i", "down": "k", "forward": "w", "back": "s", "still": None}
TURNS = ("left", "right", "up", "down")
TONE_HERTZ = {"low": 220.0, "high": 880.0}
NOTHING_HEARD = "nothing"
NOTHING_CHANGED = "nothing changed"

QUESTIONS = {
    "biome": ("Where are we?", "What place is this?", "What kind of landscape is this?", "Describe the scene."),
    "motion": ("Which way is the camera turning?", "Which way is the camera moving?", "What is moving?", "How does the view move?"),
    "tone": ("What do you hear?", "What sound is playing?", "Is there a sound?"),
    "change": ("What changed?", "How did the scene change?", "Did the place change?"),
    "count": ("How many posts or trees did we pass?", "How many trees or posts went by?", "Count the posts and trees we passed."),
}
KINDS = tuple(QUESTIONS)


@dataclass(frozen=True)
class Clip:
    """The frames of one query: the camera's motion and the biome (or a change of biome) over them."""

    frames: np.ndarray  # uint8 (T, H, W, 3), oldest first
    start_biome: str
    biome: str | None  # at the end of the clip; None where nobody can tell (a world-model clip mid-transition)
    motion: str  # a key of MOTIONS
    passed: int | None = None  # posts and trees the camera went past; None where nobody knows (the world model's clips)

    @property
    def seconds(self) -> float:
        return len(self.frames) / FPS


@dataclass(frozen=True)
class Sound:
    """The microphone over a clip's seconds (independent of what the camera shows)."""

    audio: np.ndarray | None  # float32 mono samples at SAMPLE_RATE; None: no audio sent
    tone: str  # "low steady", "high beeping", ...; "" for silence or no audio


def answer(kind: str, clip: Clip, sound: Sound) -> str:
    """The one right answer to a question of `kind` about a clip and its sound."""
    if kind == "biome":
        return BIOME_ANSWERS[clip.biome]
    if kind == "motion":
        return clip.motion
    if kind == "tone":
        pitch, _, pattern = sound.tone.partition(" ")
        return f"a {pitch} {pattern} tone" if sound.tone else NOTHING_HEARD
    if kind == "change":
        if clip.start_biome == clip.biome:
            return NOTHING_CHANGED
        return f"from {BIOME_ANSWERS[clip.start_biome]} to {BIOME_ANSWERS[clip.biome]}"
    if kind == "count":
        if clip.passed is None:
            raise ValueError("this clip's passed posts and trees are unknown: it cannot be asked to count them")
        return str(clip.passed)
    raise ValueError(f"unknown question kind {kind!r}; kinds are {', '.join(KINDS)}")


def answerable(kind: str, clip: Clip) -> bool:
    """Whether `clip` knows the answer to `kind` (a world-model clip cannot count what it passed, nor say
    where it ends when its last frames show no one place)."""
    if kind == "count":
        return clip.passed is not None
    return kind not in ("biome", "change") or clip.biome is not None


def passed(poses: list[Pose], weights: list[np.ndarray]) -> int:
    """The posts and trees the camera went past over a clip: in view ahead (within the horizontal field of view)
    at one end and behind the camera's plane at the other, both under the first frame's heading (a turn on the
    spot passes nothing), and drawn at both ends (a change of biome may take a landmark away)."""
    first, last = poses[0], poses[-1]
    half_view = math.tan(math.radians(FOV_DEGREES) / 2)
    heading = quat_to_matrix(np.array(first.rotation)).T

    def camera_xz(pose: Pose, point: tuple[float, float]) -> tuple[float, float]:
        offset = np.array([point[0], 0.0, point[1]]) - np.array(pose.translation)
        offset[1] = 0.0  # level: a landmark is passed by where it stands, not how tall it is
        x, _, z = heading @ offset
        return float(x), float(z)

    def ahead(pose: Pose, point) -> bool:
        x, z = camera_xz(pose, point)
        return z > 0 and abs(x) <= z * half_view

    def behind(pose: Pose, point) -> bool:
        return camera_xz(pose, point)[1] <= 0

    both = tall_landmarks(first.translation, weights[0]) & tall_landmarks(last.translation, weights[-1])
    return sum((ahead(first, p) and behind(last, p)) or (ahead(last, p) and behind(first, p)) for p in both)


def tone(pitch: str | None, pattern: str, seconds: float, rng: np.random.Generator) -> np.ndarray:
    """A tone (`pitch` low/high, `pattern` steady/beeping 4 times a second) or, for None, room noise only."""
    t = np.arange(int(round(seconds * SAMPLE_RATE))) / SAMPLE_RATE
    noise = rng.normal(0.0, 0.005, t.shape)
    if pitch is None:
        return noise.astype(np.float32)
    wave = float(rng.uniform(0.2, 0.5)) * np.sin(2 * math.pi * TONE_HERTZ[pitch] * t + rng.uniform(0, 2 * math.pi))
    if pattern == "beeping":
        wave = wave * (np.floor(t * 8 + rng.uniform(0, 1)) % 2 == 0)
    return (wave + noise).astype(np.float32)


def _poses(rng: np.random.Generator, origin: Pose, count: int, motion: str) -> list[Pose]:
    step = Pose() if MOTIONS[motion] is None else KeyMotion().delta((MOTIONS[motion],))
    per_frame = float(rng.uniform(1.0, 3.0))  # latent frames of the key per sampled frame
    pose = origin
    if motion in ("up", "down"):  # a pitch that stays within the player's range through the clip
        turn = KeyMotion().turn_radians
        per_frame = min(per_frame, 2 * MAX_PITCH / (max(count - 1, 1) * turn))
        span = (count - 1) * per_frame * turn
        low = -MAX_PITCH + span if motion == "up" else -MAX_PITCH  # "i" turns towards negative angles
        start = float(rng.uniform(low, low + max(2 * MAX_PITCH - span, 0.0)))
        pose = pose.compose(Pose(rotation=tuple(quat_axis_angle(0, start).tolist())))
    poses = [pose]
    for _ in range(count - 1):
        whole, part = divmod(per_frame, 1.0)
        for _ in range(int(whole)):
            pose = pose.compose(step)
        pose = pose.interpolate(pose.compose(step), part)
        poses.append(pose)
    return poses


def _past_a_landmark(rng: np.random.Generator, poses: list[Pose], weights: np.ndarray, motion: str) -> list[Pose]:
    """A walk moved (half the time) so that its path runs beside the post or tree nearest its start, a
    little to one side, somewhere along it: a random walk of a few metres passes one once in forty clips,
    and "how many did we pass?" would only ever be 0. The count is still `passed`'s: this only aims."""
    if rng.random() < 0.5:
        return poses
    start, end = np.array(poses[0].translation), np.array(poses[-1].translation)
    landmarks = tall_landmarks(poses[0].translation, weights)
    if not landmarks or np.allclose(start, end):
        return poses
    target = np.array(min(landmarks, key=lambda p: (p[0] - start[0]) ** 2 + (p[1] - start[2]) ** 2))
    path = (end - start)[[0, 2]]
    travel = float(np.linalg.norm(path))
    aside = float(rng.uniform(0.4, 1.0))
    # Far enough along the path that the end which sees it ahead (the start walking forward, the end backing
    # up) has it inside the field of view.
    seen = min(1.8 * aside / travel, 0.95)
    if seen >= 0.95:
        return poses
    along = float(rng.uniform(seen, 0.95))
    if motion == "back":
        along = 1.0 - along
    side = np.array([-path[1], path[0]]) / travel
    beside = target + side * aside * float(rng.choice([-1.0, 1.0]))
    shift = beside - (start + along * (end - start))[[0, 2]]
    return [Pose((p.translation[0] + float(shift[0]), p.translation[1], p.translation[2] + float(shift[1])), p.rotation) for p in poses]


def render_clip(seed: int, *, frames: int | None = None, size: int = 64, change: float = 0.3) -> Clip:
    """One clip, the same for the same arguments."""
    rng = np.random.default_rng([seed, 18])
    count = int(frames if frames is not None else rng.integers(MIN_FRAMES, MAX_FRAMES + 1))
    start = str(rng.choice(BIOME_NAMES))
    end = start
    if rng.random() < change:
        end = str(rng.choice([b for b in BIOME_NAMES if b != start]))
    motion = str(rng.choice(list(MOTIONS)))
    # A change blends over one to three frames, with at least one frame of each biome around it.
    first = int(rng.integers(1, max(count - 2, 2)))
    blend = int(rng.integers(1, 4))
    a, b = np.eye(len(BIOMES))[BIOME_NAMES.index(start)], np.eye(len(BIOMES))[BIOME_NAMES.index(end)]
    shares = [0.0 if start == end else 1.0 if i == count - 1 else float(np.clip((i - first + 1) / (blend + 1), 0.0, 1.0))
              for i in range(count)]
    for attempt in range(TURN_ATTEMPTS):
        poses = _poses(rng, random_origin(seed * TURN_ATTEMPTS + attempt), count, motion)
        if motion in ("forward", "back"):
            poses = _past_a_landmark(np.random.default_rng([seed, 18, 2]), poses, a, motion)
        weights = [(1 - share) * a + share * b for share in shares]
        video = np.stack([render(pose, w, size, size) for pose, w in zip(poses, weights)])
        if turn_shows(video, motion):
            break
    return Clip(video, start, end, motion, passed(poses, weights))


def turn_shows(frames: np.ndarray, motion: str) -> bool:
    """Whether a turn moves the picture the way it names, a pixel a frame at least (not a still, a move
    along the view, nor an empty horizon turned about, where a turn shows nothing anyone could name)."""
    if motion not in TURNS:
        return True
    dx, dy = block_motion(frames)
    along, sign = {"left": (dx, 1), "right": (dx, -1), "up": (dy, 1), "down": (dy, -1)}[motion]
    return along * sign >= MIN_TURN_PIXELS * (len(frames) - 1)


def draw_sound(rng: np.random.Generator, seconds: float, no_audio: float = 0.2) -> Sound:
    """No audio at all (`no_audio` of the time), room noise, or a low or high tone, steady or beeping."""
    if rng.random() < no_audio:
        return Sound(None, "")
    pitch = rng.choice(["low", "high", None])
    pattern = str(rng.choice(["steady", "beeping"]))
    audio = tone(None if pitch is None else str(pitch), pattern, seconds, rng)
    return Sound(audio, "" if pitch is None else f"{pitch} {pattern}")


def as_sent(frames: np.ndarray, rng: np.random.Generator, jpeg: float = 0.6, blur: float = 0.3) -> np.ndarray:
    """Frames as the chat path may deliver them: JPEG-compressed by the client (quality 50 to 95) and, as the
    world model makes them, a little soft; each with its probability, the same for the whole clip."""
    import io

    from PIL import Image, ImageFilter

    quality = int(rng.integers(50, 96)) if rng.random() < jpeg else None
    radius = float(rng.uniform(0.3, 1.0)) if rng.random() < blur else None
    if quality is None and radius is None:
        return frames
    out = []
    for frame in frames:
        image = Image.fromarray(frame)
        if radius is not None:
            image = image.filter(ImageFilter.GaussianBlur(radius))
        if quality is not None:
            buffer = io.BytesIO()
            image.save(buffer, format="JPEG", quality=quality)
            image = Image.open(io.BytesIO(buffer.getvalue())).convert("RGB")
        out.append(np.asarray(image))
    return np.stack(out)


def question(rng: np.random.Generator, kind: str) -> str:
    return str(rng.choice(QUESTIONS[kind]))
