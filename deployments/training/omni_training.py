"""`rtv train-omni`: the built-in thinker learns to answer the fixed questions about the procedural world.

Every example goes through the server's own `UnderstandingEngine.build_inputs`
(the processor, the chat template, the video and audio placement the chat path
uses), with the answer and `<|im_end|>` appended as the assistant's turn; the
loss is the answer's tokens only. Clips are rendered once (`WORK/clips.pt`);
each step draws clips, a question kind and a phrasing, and a fresh sound for
the clip's seconds, so the audio never repeats, and sends the frames as a client
would (JPEG, sometimes soft as the world model makes them). With `world_clips`, a
share of the steps draws instead from clips the built-in world model made
(`WORK/world_clips.pt`, deployments/training/omni_world_clips.py). Accuracy is
the greedy answer (as served) equal to the right one, per question kind, on
clips from seeds the training never drew (from `HELD_OUT_SEED` up), the
renderer's and, with `world_clips`, the world model's (`world` in the report).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

from deployments.training.files import torch_save_atomic
from deployments.training.lr_schedule import warmup_cosine
from deployments.training.omni_data import FPS, KINDS, QUESTIONS, TURNS, Clip, Sound, answer, answerable, as_sent, draw_sound, question, render_clip

HELD_OUT_SEED = 1_000_000  # evaluation clips come from seeds at and above this one; training from below
SENSOR_CALIBRATION_CLIPS = 64  # the first training clips, on which the motion sensor's scales are measured


@dataclass(frozen=True)
class Phase:
    """A stretch of training with its own question mix and learning rate (a warm-up, then a cosine down to a
    tenth of it), on a fresh optimizer as a run of its own would be."""

    steps: int
    # At 2e-3 the vision tower's features grew to a thousand times the text embeddings' size within 1,500
    # steps and the answers stayed at the prior (what the question alone predicts).
    lr: float = 1e-3
    # How often each kind is asked: the camera's motion is the hardest to see, so it is asked most.
    kind_weights: tuple[float, ...] = (1.0, 2.0, 1.0, 1.0, 0.5)  # KINDS order: biome, motion, tone, change, count
    # Share of the examples drawn from the world model's clips (None: the run's `world_share`).
    world_share: float | None = None


# What `rtv train-omni` runs by default, in the order the shipped weights' chain of runs learned (the weights
# README has both): the place and the tone first, on the renderer's clips, without the motion sensor; then the
# sensor set in and the motion asked most; then the world model's clips mixed in, the place asked most and the
# tone again; then "what changed" alone (mixed in from the start, it stays at its prior), and everything again,
# twice, at falling rates. The sensor set into random weights at the first step left turns near the prior (0.58
# after 15,100 steps); set here, turns reach 0.90, but the tone is heard only 0.88 of the time, so the shipped
# weights still come from the chain.
RECIPE = (
    Phase(5000, 1e-3, (2.0, 2.0, 1.0, 1.0, 0.5), world_share=0.0),
    Phase(3500, 7e-4, (1.0, 3.0, 0.5, 1.0, 0.5), world_share=0.0),
    Phase(2000, 3e-4, (3.0, 2.0, 2.0, 1.0, 1.0)),
    Phase(800, 3e-4, (0.0, 0.0, 0.0, 1.0, 0.0)),
    Phase(800, 2e-4, (2.0, 3.0, 2.0, 4.0, 1.0)),
    Phase(600, 1e-4, (3.0, 3.0, 3.0, 2.0, 1.0)),
)
RECIPE_SENSOR_PHASE = 1


@dataclass(frozen=True)
class OmniTraining:
    phases: tuple[Phase, ...] = RECIPE
    batch: int = 6  # examples per optimizer step (one forward each: their lengths differ)
    warmup: int = 100
    clips: int = 1600
    eval_clips: int = 60
    eval_every: int = 2000  # and at the end of each phase
    checkpoint_every: int = 250
    workers: int = 2  # processes rendering clips and making the world model's
    # Training processes, each taking its share of every step's examples (their gradients summed, so a
    # step is the same sum as in one process): one thread each on two cores is 1.8 times one process's pace.
    procs: int = 1
    # Clips the built-in world model makes, drawn for `world_share` of the examples (0: the renderer's only).
    world_clips: int = 1000
    world_share: float = 0.45
    # Times a world-model clip with a prompt switch is drawn for each time one holding its prompt is: the
    # transition is what reads as a move forward or leaves the old place named.
    world_change_weight: int = 3
    world_eval_clips: int = 42
    # Share of the place and tone questions, on a clip that holds one place, asked of only 1 to 3 of its frames:
    # a frame filter may keep that few, and an answer about a lone frame ran on past its end ("a lava fieldy to").
    short_share: float = 0.15
    # The thinker has the motion sensor (deployments/training/omni_motion.py): set into the weights where
    # phase `motion_sensor_phase` begins (0: before the first step) unless they already hold it, and kept as set
    # while the rest trains.
    motion_sensor: bool = True
    motion_sensor_phase: int = RECIPE_SENSOR_PHASE

    def __post_init__(self) -> None:
        if not 0 <= self.motion_sensor_phase < len(self.phases):
            raise ValueError(f"motion_sensor_phase {self.motion_sensor_phase} names none of the {len(self.phases)} phases")

    @property
    def steps(self) -> int:
        return sum(phase.steps for phase in self.phases)

    def first_step(self, phase: int) -> int:
        return sum(p.steps for p in self.phases[:phase])

    def phase_at(self, step: int) -> tuple[Phase, int]:
        """The phase `step` belongs to and the step it began at."""
        first = 0
        for phase in self.phases:
            if step < first + phase.steps:
                return phase, first
            first += phase.steps
        raise ValueError(f"step {step} is past the last phase")

    def smoke(self) -> "OmniTraining":
        return OmniTraining(phases=(Phase(3),), batch=2, warmup=1, clips=4, eval_clips=2, eval_every=3, checkpoint_every=3, workers=1,
                            world_clips=0, world_eval_clips=2, motion_sensor=False, motion_sensor_phase=0)


def render_clips(seeds: list[int], workers: int) -> list[Clip]:
    """Clips of `seeds`, in order, rendered by `workers` processes."""
    if workers <= 1:
        return [render_clip(s) for s in seeds]
    with ProcessPoolExecutor(workers) as pool:
        return list(pool.map(render_clip, seeds, chunksize=8))


def example(engine, frames: np.ndarray, audio, text: str, reply: str):
    """The model inputs of one question with its answer as the assistant's turn, and labels on the answer only."""
    inputs = engine.build_inputs(list(frames), audio, text, fps=FPS)
    ids = engine.tokenizer(reply + "<|im_end|>", add_special_tokens=False, return_tensors="pt")["input_ids"].to(engine.device)
    inputs["input_ids"] = torch.cat([inputs["input_ids"], ids], dim=1)
    inputs["attention_mask"] = torch.cat([inputs["attention_mask"], torch.ones_like(ids)], dim=1)
    labels = torch.full_like(inputs["input_ids"], -100)
    labels[:, -ids.shape[1] :] = ids
    return inputs, labels


def install_sensor(engine, clips: list[Clip]) -> None:
    """The motion sensor, scaled on `clips` as the processor gives them to the thinker."""
    from deployments.training.omni_motion import install_motion_sensor

    inputs = [engine.build_inputs(list(clip.frames), None, QUESTIONS["motion"][0], fps=FPS) for clip in clips]
    install_motion_sensor(engine.model, torch.cat([i["pixel_values_videos"] for i in inputs]),
                          torch.cat([i["video_grid_thw"] for i in inputs]))


def draw_kind(rng: np.random.Generator, clip: Clip, weights: np.ndarray) -> str | None:
    """A question kind by `weights` (KINDS order) among those `clip` can answer; None if it can answer none of them."""
    usable = weights * np.array([answerable(k, clip) for k in KINDS])
    if usable.sum() <= 0:
        return None
    return KINDS[int(rng.choice(len(KINDS), p=usable / usable.sum()))]


def draw_example(rng: np.random.Generator, clips: list[Clip], world: list[Clip], config: OmniTraining,
                 phase: Phase) -> tuple[np.ndarray, Sound, str, str]:
    """One training example: the frames as a client sends them, the sound over their seconds, a question and its answer."""
    weights = np.array(phase.kind_weights) / sum(phase.kind_weights)
    share = config.world_share if phase.world_share is None else phase.world_share
    pool = world if world and rng.random() < share else clips
    clip = pool[int(rng.integers(len(pool)))]
    kind = draw_kind(rng, clip, weights)
    if kind is None:  # a world-model clip, asked only what it cannot answer
        clip = clips[int(rng.integers(len(clips)))]
        kind = draw_kind(rng, clip, weights)
    frames = clip.frames
    if config.short_share and kind in ("biome", "tone") and clip.start_biome == clip.biome and rng.random() < config.short_share:
        count = int(rng.integers(1, 4))
        at = int(rng.integers(max(1, len(frames) - count + 1)))
        frames = frames[at : at + count]
    sound = draw_sound(rng, len(frames) / FPS)
    return as_sent(frames, rng), sound, question(rng, kind), answer(kind, clip, sound)


# Accuracies reported beside each kind's, over the clips where the kind's usual answer would hide a miss:
# (kind, which clips). "turn": a turning camera (left, right, up, down), of which the issue asks 90 %;
# "biome_holding": clips that show one place throughout (no change, or one that never showed);
# "change_switched": clips that switched place (elsewhere "nothing changed" is right);
# "count_passing": walks that passed something (elsewhere "0" is right most of the time).
SUBSETS: dict[str, tuple[str, Callable[[Clip], bool]]] = {
    "turn": ("motion", lambda clip: clip.motion in TURNS),
    "biome_holding": ("biome", lambda clip: clip.start_biome == clip.biome),
    "change_switched": ("change", lambda clip: clip.start_biome != clip.biome),
    "count_passing": ("count", lambda clip: bool(clip.passed)),
}


def evaluate(engine, clips: list[Clip], seed: int = 0) -> dict:
    """Per question kind (and per `SUBSETS` entry): the share of greedy answers (as the server gives them)
    equal to the right one."""
    rng = np.random.default_rng([seed, 99])
    right: dict[str, list[bool]] = {k: [] for k in (*KINDS, *SUBSETS)}
    wrong: dict[str, list] = {k: [] for k in KINDS}
    engine.model.eval()
    for clip in clips:
        sound = draw_sound(rng, clip.seconds)
        for kind in KINDS:
            text = question(rng, kind)
            if not answerable(kind, clip):
                continue
            expected = answer(kind, clip, sound)
            got = engine.answer(list(clip.frames), sound.audio, text, fps=FPS, max_new_tokens=48).strip()
            right[kind].append(got == expected)
            for name, (of_kind, includes) in SUBSETS.items():
                if kind == of_kind and includes(clip):
                    right[name].append(got == expected)
            if got != expected and len(wrong[kind]) < 3:
                wrong[kind].append({"question": text, "expected": expected, "got": got})
    accuracy = {k: round(float(np.mean(v)), 3) if v else None for k, v in right.items()}
    return {"accuracy": accuracy, "clips": len(clips), "wrong_examples": wrong}


def evaluate_all(engine, rendered: list[Clip], made: list[Clip], seed: int = 0) -> dict:
    """The renderer's held-out clips' report, with the world model's (when there are any) under `world`."""
    report = evaluate(engine, rendered, seed)
    if made:
        report["world"] = evaluate(engine, made, seed)
    return report


def made_clips(work: Path, config: OmniTraining, seed: int, log: Callable[[dict], None]) -> tuple[list[Clip], list[Clip]]:
    """The world model's clips to train on and to evaluate on. Kept in WORK with the palettes that label them
    (they take 2.5 s each on a core), and grown there when a later run asks for more."""
    from deployments.training.omni_world_clips import biome_palettes, made_world_clips, shipped_world_model

    files = {name: work / f"{name}.pt" for name in ("world_clips", "world_held_out", "world_palettes")}
    kept = {name: torch.load(file, weights_only=False) if file.is_file() else None for name, file in files.items()}
    world, held_out = kept["world_clips"] or [], kept["world_held_out"] or []
    if len(world) >= config.world_clips and len(held_out) == config.world_eval_clips:
        return world[: config.world_clips], held_out
    began = time.time()
    palettes = kept["world_palettes"]
    if palettes is None:
        with shipped_world_model() as engine:
            palettes = biome_palettes(engine)
        torch_save_atomic(palettes, files["world_palettes"])
    if len(world) < config.world_clips:
        world += made_world_clips(list(range(seed * config.world_clips + len(world), (seed + 1) * config.world_clips)), palettes, config.workers)
        torch_save_atomic(world, files["world_clips"])
    if len(held_out) != config.world_eval_clips:
        held_out = made_world_clips(list(range(HELD_OUT_SEED, HELD_OUT_SEED + config.world_eval_clips)), palettes, config.workers)
        torch_save_atomic(held_out, files["world_held_out"])
    log({"stage": "world_clips", "clips": len(world), "held_out": len(held_out), "seconds": round(time.time() - began, 1)})
    return world[: config.world_clips], held_out


def rendered_clips(work: Path, config: OmniTraining, seed: int, log: Callable[[dict], None]) -> list[Clip]:
    """The renderer's training clips, rendered once into WORK/clips.pt."""
    clips_file = work / "clips.pt"
    if clips_file.is_file():
        return torch.load(clips_file, weights_only=False)
    began = time.time()
    first = seed * config.clips
    if first + config.clips > HELD_OUT_SEED:
        raise ValueError(f"training clips must come from seeds below {HELD_OUT_SEED}: lower --seed or --clips")
    clips = render_clips(list(range(first, first + config.clips)), config.workers)
    torch_save_atomic(clips, clips_file)
    log({"stage": "render", "clips": len(clips), "seconds": round(time.time() - began, 1)})
    return clips


def train_omni(work: Path, config: OmniTraining = OmniTraining(), *, seed: int = 0, init: Path | None = None,
               log: Callable[[dict], None] = print) -> tuple[torch.nn.Module, object, dict]:
    """Train the built-in thinker (from `init`, a checkpoint folder, or fresh); resumes from WORK/checkpoint.pt.
    With `config.procs` above 1, this process is rank 0 and the others are started here. Returns the model,
    its processor and the last evaluation."""
    import multiprocessing

    work.mkdir(parents=True, exist_ok=True)
    clips = rendered_clips(work, config, seed, log)
    made = made_clips(work, config, seed, log) if config.world_clips else ([], [])
    if config.procs == 1:
        return train_rank(Rank(0, 1), work, config, seed, init, clips, made, log)
    rendezvous = work / "rendezvous"
    rendezvous.unlink(missing_ok=True)
    context = multiprocessing.get_context("spawn")  # a forked child would inherit this process's OpenMP pool
    others = [context.Process(target=_other_rank, args=(Rank(r, config.procs, rendezvous), work, config, seed, init, torch.get_num_threads()))
              for r in range(1, config.procs)]
    for process in others:
        process.start()
    try:
        return train_rank(Rank(0, config.procs, rendezvous), work, config, seed, init, clips, made, log)
    finally:
        for process in others:
            process.join(timeout=60)
            if process.is_alive():
                process.kill()
        rendezvous.unlink(missing_ok=True)


@dataclass(frozen=True)
class Rank:
    """One training process of `procs`; they meet through the file `rendezvous` (gloo, on this host)."""

    index: int
    procs: int
    rendezvous: Path | None = None

    def examples(self, batch: int) -> int:
        """This rank's share of a step's `batch` examples."""
        return batch // self.procs + (self.index < batch % self.procs)


def _other_rank(rank: Rank, work: Path, config: OmniTraining, seed: int, init: Path | None, threads: int) -> None:
    torch.set_num_threads(threads)
    clips = rendered_clips(work, config, seed, lambda record: None)
    made = made_clips(work, config, seed, lambda record: None) if config.world_clips else ([], [])
    train_rank(rank, work, config, seed, init, clips, made, lambda record: None)


def train_rank(rank: Rank, work: Path, config: OmniTraining, seed: int, init: Path | None, clips: list[Clip],
               made: tuple[list[Clip], list[Clip]], log: Callable[[dict], None]) -> tuple[torch.nn.Module, object, dict]:
    from datetime import timedelta

    import torch.distributed as dist

    from deployments.models.builtin_omni_model import BUILTIN_OMNI_SPEC
    from deployments.models.tiny_vlm import build_vlm
    from deployments.understanding.engine import UnderstandingEngine

    torch.manual_seed(seed)
    model, processor = build_vlm(BUILTIN_OMNI_SPEC, seed)
    if init is not None:
        from deployments.models.builtin_omni_model import load_shipped

        model.load_state_dict(load_shipped(init), strict=True)
    engine = UnderstandingEngine(model, processor, model_type="qwen2_5_omni_thinker", model_name="omni")
    world, world_held_out = made
    world = [clip for clip in world for _ in range(config.world_change_weight if clip.start_biome != clip.biome else 1)]
    # Rank 0 asks the renderer's held-out clips, rank 1 (or 0 alone) the world model's.
    held_out = render_clips(list(range(HELD_OUT_SEED, HELD_OUT_SEED + config.eval_clips)), config.workers) if rank.index == 0 else []
    if rank.index != min(1, rank.procs - 1):
        world_held_out = []
    if rank.procs > 1:
        dist.init_process_group("gloo", init_method=f"file://{rank.rendezvous}", rank=rank.index, world_size=rank.procs,
                                timeout=timedelta(minutes=20))
    try:
        return _train(rank, work, config, seed, engine, clips, world, held_out, world_held_out, log)
    finally:
        if rank.procs > 1:
            dist.destroy_process_group()


def _train(rank: Rank, work: Path, config: OmniTraining, seed: int, engine, clips: list[Clip], world: list[Clip],
           held_out: list[Clip], world_held_out: list[Clip], log: Callable[[dict], None]) -> tuple[torch.nn.Module, object, dict]:
    model = engine.model
    checkpoint = work / "checkpoint.pt"
    start, optimizer_state = 0, None
    if checkpoint.is_file():
        state = torch.load(checkpoint, weights_only=False)
        model.load_state_dict(state["model"])
        optimizer_state, start = state["optimizer"], state["step"]
    broadcast_weights(rank, model)
    sensor_step = None
    if config.motion_sensor:
        from deployments.training.omni_motion import has_motion_sensor

        # Weights that hold the sensor already keep it as set from the first step.
        sensor_step = start if has_motion_sensor(model) else max(start, config.first_step(config.motion_sensor_phase))
    report: dict = {}
    began, running, optimizer = time.time(), None, None
    for step in range(start, config.steps):
        phase, first = config.phase_at(step)
        if step == sensor_step:
            sensor_in(rank, engine, clips, log)
        if optimizer is None or step == first:
            # Drawn afresh where each phase begins, so a run that stopped there and resumed draws what one
            # that never stopped does (resumed within a phase, it draws anew from that step).
            rng = np.random.default_rng([seed, step] if rank.procs == 1 else [seed, step, rank.index])
            optimizer = torch.optim.AdamW(model.parameters(), lr=phase.lr, weight_decay=0.01)
            if optimizer_state is not None and step != first:
                optimizer.load_state_dict(optimizer_state)
        model.train()
        for group in optimizer.param_groups:
            group["lr"] = warmup_cosine(step - first, phase.steps, config.warmup, phase.lr, phase.lr / 10)
        total = 0.0
        for _ in range(rank.examples(config.batch)):
            frames, sound, text, reply = draw_example(rng, clips, world, config, phase)
            inputs, labels = example(engine, frames, sound.audio, text, reply)
            loss = model(**inputs, labels=labels).loss / config.batch
            loss.backward()
            total += loss.item()
        if rank.procs > 1:
            total = sum_gradients(model, total)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        running = total if running is None else 0.95 * running + 0.05 * total
        done = step + 1
        ends_phase = done == first + phase.steps
        if step % 25 == 0 or ends_phase:
            log({"stage": "omni", "step": step, "loss": round(total, 4), "loss_avg": round(running, 4),
                 "lr": round(optimizer.param_groups[0]["lr"], 6), "elapsed_s": round(time.time() - began, 1)})
        if rank.index == 0 and (done % config.checkpoint_every == 0 or ends_phase):
            torch_save_atomic({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": done, "config": asdict(config)}, checkpoint)
        if done % config.eval_every == 0 or ends_phase:
            report = evaluate_ranks(rank, engine, held_out, world_held_out, seed)
            log({"stage": "omni", "step": done, "eval": report["accuracy"], **({"world": report["world"]["accuracy"]} if "world" in report else {})})
    if not report:
        report = evaluate_ranks(rank, engine, held_out, world_held_out, seed)
    if rank.index == 0:
        (work / "eval.json").write_text(json.dumps(report, indent=2) + "\n")
    return model.eval(), engine.processor, report


def broadcast_weights(rank: Rank, model: torch.nn.Module) -> None:
    """Every rank takes rank 0's weights."""
    if rank.procs > 1:
        import torch.distributed as dist

        for tensor in model.state_dict().values():
            dist.broadcast(tensor, 0)


def sensor_in(rank: Rank, engine, clips: list[Clip], log: Callable[[dict], None]) -> None:
    """The motion sensor set into the weights unless they hold it already (on every rank alike), then kept as set."""
    from deployments.training.omni_motion import freeze_motion_sensor, has_motion_sensor

    if not has_motion_sensor(engine.model):
        install_sensor(engine, clips[:SENSOR_CALIBRATION_CLIPS])
        broadcast_weights(rank, engine.model)
        log({"stage": "motion_sensor", "calibration_clips": min(len(clips), SENSOR_CALIBRATION_CLIPS)})
    freeze_motion_sensor(engine.model)


def sum_gradients(model: torch.nn.Module, loss: float) -> float:
    """Every rank's gradients summed into each (one all-reduce of one flat buffer); returns the summed loss.
    A parameter no rank's examples reached keeps no gradient, as in one process."""
    import torch.distributed as dist

    params = [p for p in model.parameters() if p.requires_grad]
    flat = torch.cat([torch.zeros(p.numel()) if p.grad is None else p.grad.reshape(-1) for p in params]
                     + [torch.tensor([p.grad is not None for p in params], dtype=torch.float32), torch.tensor([loss])])
    dist.all_reduce(flat)
    offset = 0
    reached = flat[-len(params) - 1 : -1]
    for index, p in enumerate(params):
        p.grad = flat[offset : offset + p.numel()].view_as(p).clone() if reached[index] > 0 else None
        offset += p.numel()
    return float(flat[-1])


def evaluate_ranks(rank: Rank, engine, held_out: list[Clip], world_held_out: list[Clip], seed: int) -> dict:
    """`evaluate_all`, its two sets asked on two ranks at once when there are two."""
    if rank.procs == 1:
        return evaluate_all(engine, held_out, world_held_out, seed)
    import torch.distributed as dist

    mine = {"rendered": evaluate(engine, held_out, seed)} if held_out else {}
    if world_held_out:
        mine["world"] = evaluate(engine, world_held_out, seed)
    parts: list = [None] * rank.procs
    dist.all_gather_object(parts, mine)
    merged = {name: report for part in parts for name, report in part.items()}
    return {**merged["rendered"], **({"world": merged["world"]} if "world" in merged else {})}
