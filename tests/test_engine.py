"""The causal engine on the tiny checkpoints: exactness, determinism, isolation, interactions, bounds."""

import json
import shutil

import numpy as np
import pytest
import torch

from deployments.contract.events import CameraCommand, Interaction
from deployments.generation.engine import SessionCancelled, WorldModelEngine
from deployments.generation.geometry import CheckpointError, read_geometry
from deployments.generation.interactions import InteractionRefused
from deployments.contract.session_spec import SessionSpec
from deployments.generation.vae_stream import StreamingDecoder

pytestmark = pytest.mark.timeout(300)


def rollout(engine, config, blocks, events=None):
    """Frames of `blocks` blocks; events[k] is submitted before block k."""
    session = engine.open_session(config)
    out = []
    for k in range(blocks):
        for event in (events or {}).get(k, []):
            session.submit(event)
        out.append(engine.generate_block(session))
    session.close()
    return out


def cfg(**kw):
    return SessionSpec(**({"prompt": "a red fox in snow", "height": 64, "width": 96, "seed": 7} | kw))


# -- geometry -----------------------------------------------------------------
def test_geometry_is_read_off_the_configs(world_model_dir):
    g = read_geometry(world_model_dir)
    assert (g.num_frames_per_block, g.sink_size, g.sliding_window_num_frames) == (3, 3, 12)
    assert (g.scale_factor_temporal, g.scale_factor_spatial, g.size_multiple) == (4, 8, 16)
    assert [g.frames_in_block(i) for i in range(3)] == [9, 12, 12] and g.frames_for_blocks(3) == 33


def test_checkpoint_without_ar_keys_is_refused_naming_them(world_model_dir, tmp_path):
    copy = shutil.copytree(world_model_dir, tmp_path / "not-causal")
    config_path = copy / "transformer" / "config.json"
    config = json.loads(config_path.read_text())
    for key in ("sink_size", "sliding_window_num_frames"):
        del config[key]
    config_path.write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match="missing transformer/config.json:sink_size, transformer/config.json:sliding_window_num_frames") as refused:
        WorldModelEngine.from_pretrained(copy)
    # The way out is named: the importer and the three flags that write the geometry.
    assert "rtv import-checkpoint" in str(refused.value)
    assert all(flag in str(refused.value) for flag in ("--frames-per-block", "--sink-size", "--window-frames"))


def test_a_stock_vae_config_without_scale_factors_reads_as_wan(world_model_dir, tmp_path):
    copy = shutil.copytree(world_model_dir, tmp_path / "stock-vae")
    config_path = copy / "vae" / "config.json"
    config = json.loads(config_path.read_text())
    del config["scale_factor_temporal"], config["scale_factor_spatial"]
    config_path.write_text(json.dumps(config))
    g = read_geometry(copy)
    assert (g.scale_factor_temporal, g.scale_factor_spatial) == (4, 8)


def test_missing_folder_is_refused(tmp_path):
    with pytest.raises(CheckpointError, match="does not exist"):
        WorldModelEngine.from_pretrained(tmp_path / "nowhere")


def test_stock_pipeline_loads_the_tiny_checkpoint(world_model_dir):
    from diffusers import WanPipeline

    pipe = WanPipeline.from_pretrained(world_model_dir)
    assert pipe.transformer.config.num_frames_per_block == 3


@pytest.mark.parametrize("height, width", [(0, 64), (64, 40), (-16, 64), (63, 64)])
def test_sizes_must_be_positive_multiples_of_16(engine, height, width):
    with pytest.raises(ValueError, match="positive multiple of 16"):
        engine.open_session(cfg(height=height, width=width))


def test_blank_prompt_is_refused(engine):
    with pytest.raises(ValueError, match="non-blank"):
        engine.open_session(cfg(prompt="  "))


# -- exactness ----------------------------------------------------------------
def test_cached_path_equals_block_causal_full_forward(world_model_dir, engine):
    from reference import BlockCausalReference

    session = engine.open_session(cfg())
    text = engine.text_condition(session, session.director.plan_block().prompt_mix)
    reference = BlockCausalReference(world_model_dir, frames_per_block=3)
    g = torch.Generator().manual_seed(0)
    shape = (1, 16, 3, 8, 12)
    clean = [torch.randn(shape, generator=g) for _ in range(4)]
    for block in clean:
        engine.forward(session, block, 0.0, text, commit=True)
        session.kv.advance(3)
    noisy = torch.randn(shape, generator=g)
    for sigma in session.sigmas:
        cached = engine.forward(session, noisy, sigma, text)
        full = reference.velocity_of_last_block(clean, noisy, sigma, text)
        assert (cached - full).abs().max().item() <= 1e-4
    # The oracle can tell a wrong cache apart: dropping a context block changes the answer.
    wrong = reference.velocity_of_last_block(clean[1:], noisy, session.sigmas[0], text)
    assert (engine.forward(session, noisy, session.sigmas[0], text) - wrong).abs().max().item() > 1e-3
    session.close()


def test_streaming_decode_equals_whole_clip_decode(engine):
    vae = engine.vae
    g = torch.Generator().manual_seed(1)
    latents = torch.randn((1, 16, 12, 8, 12), generator=g)
    whole = vae.decode(latents).sample
    decoder = StreamingDecoder(vae)
    chunks = [decoder.decode(latents[:, :, i : i + 3]) for i in range(0, 12, 3)]
    assert [c.shape[2] for c in chunks] == [9, 12, 12, 12]
    assert (torch.cat(chunks, dim=2) - whole).abs().max().item() <= 1e-6


def test_block_frames_have_the_documented_counts_and_format(engine):
    blocks = rollout(engine, cfg(), 3)
    assert [b.frames.shape for b in blocks] == [(9, 64, 96, 3), (12, 64, 96, 3), (12, 64, 96, 3)]
    assert all(b.frames.dtype == np.uint8 for b in blocks)
    assert [b.metadata.block_index for b in blocks] == [0, 1, 2]
    assert blocks[1].frames.std() > 0  # not a constant image


# -- determinism and isolation ------------------------------------------------
def test_same_seed_same_frames_other_seed_other_frames(engine):
    a = rollout(engine, cfg(seed=11), 2)
    b = rollout(engine, cfg(seed=11), 2)
    c = rollout(engine, cfg(seed=12), 2)
    assert all(np.array_equal(x.frames, y.frames) for x, y in zip(a, b))
    assert not np.array_equal(a[1].frames, c[1].frames)


def test_interleaved_sessions_match_their_solo_runs(engine):
    solo_a = rollout(engine, cfg(seed=1), 3)
    solo_b = rollout(engine, cfg(seed=2, prompt="a city at night"), 3)
    sa = engine.open_session(cfg(seed=1))
    sb = engine.open_session(cfg(seed=2, prompt="a city at night"))
    for k in range(3):
        assert np.array_equal(engine.generate_block(sa).frames, solo_a[k].frames)
        assert np.array_equal(engine.generate_block(sb).frames, solo_b[k].frames)


def test_a_batch_of_sessions_matches_their_solo_runs(engine):
    """Denoised together in one forward per step, each session still gets its own blocks."""
    configs = [cfg(seed=1), cfg(seed=2, prompt="a city at night"), cfg(seed=3, prompt="waves on rocks")]
    solo = [rollout(engine, c, 3) for c in configs]
    sessions = [engine.open_session(c) for c in configs]
    sessions[1].submit(Interaction(event_id="e", prompt="snow falls"))
    solo_b = rollout(engine, configs[1], 3, {0: [Interaction(event_id="e", prompt="snow falls")]})
    for k in range(3):
        batch = engine.generate_blocks(sessions)
        for b, expected in enumerate([solo[0][k], solo_b[k], solo[2][k]]):
            assert batch[b].metadata == expected.metadata
            assert (batch[b].latents - expected.latents).abs().max().item() < 1e-4
            assert np.abs(batch[b].frames.astype(int) - expected.frames.astype(int)).max() <= 1
    for session in sessions:
        session.close()


def test_deferred_decode_gives_the_same_frames_in_order(engine):
    """Frames decoded later (outside the engine lock, beside the next block) equal those decoded inline."""
    inline = rollout(engine, cfg(seed=9), 3)
    session = engine.open_session(cfg(seed=9))
    made = [engine.generate_blocks([session], decode=False)[0] for _ in range(2)]
    assert all(block.frames is None for block in made)
    assert [block.metadata.num_frames for block in made] == [9, 12]
    first = engine.decode_next(session)
    made.append(engine.generate_blocks([session], decode=False)[0])  # decodes may lag the blocks
    frames = [first, engine.decode_next(session), engine.decode_next(session)]
    for got, expected in zip(frames, inline):
        assert np.array_equal(got, expected.frames)
    with pytest.raises(RuntimeError, match="no block waiting"):
        engine.decode_next(session)
    session.close()


def test_sessions_decode_together_as_they_would_alone(engine):
    configs = [cfg(seed=21), cfg(seed=22, prompt="a city at night")]
    inline = [rollout(engine, c, 3) for c in configs]
    sessions = [engine.open_session(c) for c in configs]
    for k in range(3):
        engine.generate_blocks(sessions, decode=False)
        for got, expected in zip(engine.decode_many(sessions), inline):
            assert np.abs(got.astype(int) - expected[k].frames.astype(int)).max() <= 1
    fresh = engine.open_session(cfg(seed=23))
    engine.generate_blocks([fresh], decode=False)
    engine.generate_blocks(sessions, decode=False)
    with pytest.raises(ValueError, match="decode_key"):
        engine.decode_many([sessions[0], fresh])  # one has started its stream, the other not
    for session in sessions + [fresh]:
        session.close()


def test_a_cancelled_session_drops_out_of_its_batch(engine):
    solo = rollout(engine, cfg(seed=5), 1)[0]
    a, b = engine.open_session(cfg(seed=5)), engine.open_session(cfg(seed=6))
    b.cancel()
    kept, dropped = engine.generate_blocks([a, b])
    assert isinstance(dropped, SessionCancelled)
    assert (kept.latents - solo.latents).abs().max().item() < 1e-4
    other_size = engine.open_session(cfg(seed=7, width=64))
    with pytest.raises(ValueError, match="batch_key"):
        engine.generate_blocks([a, other_size])
    for session in (a, b, other_size):
        session.close()


def test_bfloat16_engine_runs_though_diffusers_keeps_some_tables_in_float32(world_model_dir):
    """The engine's compute dtype is the transformer's, not its first parameter's (a float32 table)."""
    engine = WorldModelEngine.from_pretrained(world_model_dir, dtype=torch.bfloat16, vae_dtype=torch.bfloat16)
    assert next(engine.transformer.parameters()).dtype == torch.float32  # what used to decide, wrongly
    assert engine.dtype == torch.bfloat16
    blocks = rollout(engine, cfg(), 2)
    assert [b.frames.shape[0] for b in blocks] == [9, 12] and blocks[1].frames.std() > 0


@pytest.mark.timeout(600)
def test_compiled_blocks_give_the_eager_blocks_and_compile_nothing_after_the_warm_up(world_model_dir, engine):
    """Regional torch.compile reads and writes the KV cache outside its graphs: one warm-up session through
    every context length compiles what every later session needs, prompt switches and keys included."""
    compiled = WorldModelEngine.from_pretrained(world_model_dir, compile_blocks=True)
    assert compiled.compiled and not engine.compiled and engine.compiled_graphs == 0
    rollout(compiled, cfg(seed=11, prompt="a warm-up prompt"), compiled.warm_up_blocks)
    graphs = compiled.compiled_graphs
    assert graphs > 0
    events = {2: [Interaction(event_id="p", prompt="waves on rocks")], 4: [Interaction(event_id="k", actions=(("w",), ("w", "l"), ("l",)))]}
    blocks = compiled.warm_up_blocks + 2
    got = rollout(compiled, cfg(), blocks, events)
    assert compiled.compiled_graphs == graphs, "a session after the warm-up compiled again"
    expected = rollout(engine, cfg(), blocks, events)
    for a, b in zip(got, expected):
        assert a.metadata == b.metadata
        assert (a.latents - b.latents).abs().max().item() < 1e-3
        assert np.abs(a.frames.astype(int) - b.frames.astype(int)).max() <= 2


def test_image_to_video_follows_the_image(i2v_model_dir):
    engine = WorldModelEngine.from_pretrained(i2v_model_dir)
    rng = np.random.default_rng(0)
    img_a = rng.integers(0, 256, (120, 200, 3), dtype=np.uint8)
    img_b = 255 - img_a
    a = rollout(engine, cfg(image=img_a), 2)
    a2 = rollout(engine, cfg(image=img_a), 2)
    b = rollout(engine, cfg(image=img_b), 2)
    assert a[0].frames.shape == (9, 64, 96, 3)
    assert np.array_equal(a[1].frames, a2[1].frames)
    assert not np.array_equal(a[0].frames, b[0].frames)
    with pytest.raises(ValueError, match="needs a start image"):
        engine.open_session(cfg())


def test_text_to_video_model_refuses_an_image(engine):
    with pytest.raises(ValueError, match="takes no start image"):
        engine.open_session(cfg(image=np.zeros((64, 96, 3), np.uint8)))


@pytest.fixture(scope="module")
def last_frame_dirs(tmp_path_factory):
    from deployments.models.tiny_world_model import WorldModelSpec, make_world_model

    root = tmp_path_factory.mktemp("last-frame")
    return {image: make_world_model(root / f"image-{image}", WorldModelSpec(last_frame_condition=True, image_conditioned=image))
            for image in (False, True)}


def conditions_seen(engine, session, blocks):
    """The condition channels of each block's forwards, as the transformer received them, and the blocks."""
    seen, made = [], []
    z = engine.vae.config.z_dim
    hook = engine.transformer.patch_embedding.register_forward_pre_hook(lambda m, args: seen.append(args[0][:, z:].clone()))
    try:
        for _ in range(blocks):
            seen.clear()
            made.append((engine.generate_block(session), seen[0]))
            assert all(torch.equal(c, seen[0]) for c in seen)  # every step and the commit see the same channels
    finally:
        hook.remove()
    return made


def test_last_frame_models_give_each_block_the_frame_before_it(last_frame_dirs):
    engine = WorldModelEngine.from_pretrained(last_frame_dirs[False])
    assert engine.last_frame_condition and engine.image_conditioned is False
    session = engine.open_session(cfg())
    made = conditions_seen(engine, session, 3)
    assert torch.count_nonzero(made[0][1]) == 0  # no start image: nothing is given to the first block
    for (before, _), (_, cond) in zip(made, made[1:]):
        last = before.latents[:, :, -1]
        for j in range(3):
            assert cond[0, :4, j, 0, 0].tolist() == [1.0 if c == min(j + 1, 3) else 0.0 for c in range(4)]
            torch.testing.assert_close(cond[:, 4:, j], last)
    session.close()
    assert session.last_latent is None
    with pytest.raises(ValueError, match="takes no start image"):
        engine.open_session(cfg(image=np.zeros((64, 96, 3), np.uint8)))


def test_last_frame_image_model_starts_from_the_image_at_distance_zero(last_frame_dirs):
    engine = WorldModelEngine.from_pretrained(last_frame_dirs[True])
    assert engine.image_conditioned is True
    image = np.random.default_rng(1).integers(0, 256, (64, 96, 3), dtype=np.uint8)
    session = engine.open_session(cfg(image=image))
    (first, cond), = conditions_seen(engine, session, 1)
    assert cond[0, :4, :, 0, 0].T.tolist() == [[1, 0, 0, 0], [0, 1, 0, 0], [0, 0, 1, 0]]
    torch.testing.assert_close(cond[:, 4:, 2], session.image_latent[:, :, 0])
    session.close()
    with pytest.raises(ValueError, match="needs a start image"):
        engine.open_session(cfg())


def test_a_reprojecting_model_gives_each_frame_the_last_frame_as_its_pose_sees_it(tmp_path):
    """With `last_frame_reprojection`, a camera turning right sees the given frame's content further left
    on each frame of the block; a camera at rest sees the frame as it is."""
    from deployments.contract.events import Interaction
    from deployments.models.tiny_world_model import WorldModelSpec, make_world_model

    engine = WorldModelEngine.from_pretrained(
        make_world_model(tmp_path / "reproject", WorldModelSpec(last_frame_condition=True, last_frame_reprojection=1.0)))
    assert engine.reprojection_ground_depth == 1.0
    session = engine.open_session(cfg())
    conditions_seen(engine, session, 1)
    b, z, _, h, w = session.last_latent.shape
    ramp = torch.arange(w, dtype=session.last_latent.dtype).expand(b, z, 1, h, w).clone()  # value = column
    session.last_latent = ramp.clone()
    (_, still), = conditions_seen(engine, session, 1)
    torch.testing.assert_close(still[:, 4:], ramp.expand(-1, -1, 3, -1, -1))
    session.last_latent = ramp.clone()
    session.submit(Interaction(event_id="turn", actions=(("l",),) * 3))
    (_, turning), = conditions_seen(engine, session, 1)
    inner = turning[:, 4:, :, :, 2:-2]  # away from the edge the view brings in
    shift = (inner - ramp[:, :, :, :, 2:-2]).mean(dim=(0, 1, 3, 4))
    assert (shift > 0).all() and (shift.diff() > 0).all(), shift  # content comes from further right, more each frame
    session.close()


def test_a_bad_reprojection_key_is_refused(last_frame_dirs, tmp_path):
    from deployments.generation.geometry import read_traits

    bad = tmp_path / "bad"
    shutil.copytree(last_frame_dirs[False], bad)
    config_path = bad / "transformer" / "config.json"
    config = json.loads(config_path.read_text())
    for value in (-1.0, 0, True, "1.0"):
        config_path.write_text(json.dumps(config | {"last_frame_reprojection": value}))
        with pytest.raises(CheckpointError, match="last_frame_reprojection must be the ground's depth"):
            read_traits(bad)
    config_path.write_text(json.dumps(config | {"last_frame_reprojection": 1.0, "last_frame_condition": False}))
    with pytest.raises(CheckpointError, match="last_frame_reprojection needs last_frame_condition"):
        read_traits(bad)


def test_a_last_frame_key_on_the_wrong_channels_is_refused(world_model_dir, tmp_path):
    from deployments.generation.geometry import read_traits

    bad = tmp_path / "bad"
    shutil.copytree(world_model_dir, bad)
    config_path = bad / "transformer" / "config.json"
    config = json.loads(config_path.read_text())
    config_path.write_text(json.dumps(config | {"last_frame_condition": True}))
    with pytest.raises(CheckpointError, match="last_frame_condition needs the image-to-video input channels"):
        read_traits(bad)
    config_path.write_text(json.dumps(config | {"last_frame_condition": "yes"}))
    with pytest.raises(CheckpointError, match="must be true or false"):
        read_traits(bad)


# -- interactions -------------------------------------------------------------
def changed_from(base, other):
    return [not np.array_equal(x.frames, y.frames) for x, y in zip(base, other)]


def test_prompt_switch_changes_frames_from_its_block_on(engine):
    base = rollout(engine, cfg(), 4)
    switched = rollout(engine, cfg(), 4, {2: [Interaction("p", prompt="a volcano erupting")]})
    assert changed_from(base, switched) == [False, False, True, True]
    assert switched[2].metadata.started_event_ids == ("p",)
    assert switched[2].metadata.completed_event_ids == ("p",)


def test_prompt_blend_reports_the_event_until_it_completes(engine):
    blocks = rollout(engine, cfg(), 5, {1: [Interaction("p", prompt="a volcano", transition_chunks=3)]})
    meta = [b.metadata for b in blocks]
    assert [m.started_event_ids for m in meta] == [(), ("p",), (), (), ()]
    assert [m.active_event_ids for m in meta] == [(), ("p",), ("p",), ("p",), ()]
    assert [m.completed_event_ids for m in meta] == [(), (), (), ("p",), ()]
    hard = rollout(engine, cfg(), 3, {1: [Interaction("p", prompt="a volcano")]})
    assert not np.array_equal(blocks[1].frames, hard[1].frames)  # half-way is not the end point


def test_camera_and_keyboard_change_the_video(engine):
    base = rollout(engine, cfg(), 3)
    moved = rollout(engine, cfg(), 3, {1: [Interaction("c", camera=CameraCommand("velocity", (0.0, 0.0, 0.3)))]})
    keys = rollout(engine, cfg(), 3, {1: [Interaction("k", actions=(("w",), ("w", "l"), ("l",)))]})
    assert changed_from(base, moved) == [False, True, True]
    assert changed_from(base, keys) == [False, True, True]
    assert keys[1].metadata.completed_event_ids == ("k",)
    assert moved[2].metadata.active_event_ids == ("c",)


def test_interaction_the_model_cannot_take_is_refused_and_generation_goes_on(plain_model_dir):
    engine = WorldModelEngine.from_pretrained(plain_model_dir)
    session = engine.open_session(cfg())
    engine.generate_block(session)
    with pytest.raises(InteractionRefused, match="no camera adapter"):
        session.submit(Interaction("c", camera=CameraCommand("velocity", (0.0, 0.0, 1.0))))
    block = engine.generate_block(session)
    assert block.frames.shape == (12, 64, 96, 3) and block.metadata.started_event_ids == ()


# -- bounds -------------------------------------------------------------------
def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


def test_memory_and_positions_stay_flat_over_200_blocks(plain_model_dir):
    engine = WorldModelEngine.from_pretrained(plain_model_dir)
    session = engine.open_session(cfg(height=32, width=32))
    geometry = engine.geometry
    held, rss = {}, {}
    for k in range(1, 201):
        if k == 37:
            session.submit(Interaction("p", prompt="another place", transition_chunks=2))
        engine.generate_block(session)
        assert session.kv.context_frames <= geometry.context_frames
        if k in (20, 200):
            held[k], rss[k] = session.memory_bytes(), rss_bytes()
    assert held[200] == held[20]
    assert rss[200] - rss[20] < 16 * 2**20, f"process grew by {(rss[200] - rss[20]) / 2**20:.1f} MiB"
    # RoPE tables only ever span sink + window + one block, however long the session.
    longest = max(key[0] for key in engine.transformer.rope._tables)
    assert longest == geometry.context_frames + geometry.num_frames_per_block
    assert session.kv.frames_committed == 600


def test_a_cancelled_session_stops_its_block(engine):
    from deployments.generation.engine import SessionCancelled

    session = engine.open_session(cfg())
    engine.generate_block(session)
    session.cancel()
    with pytest.raises(SessionCancelled):
        engine.generate_block(session)
    session.close()


def test_close_frees_the_session(engine):
    session = engine.open_session(cfg())
    engine.generate_block(session)
    assert session.memory_bytes() > 0
    session.close()
    assert session.kv.k is None and session.text_kv == {} and session.decoder.nbytes == 0
    with pytest.raises(RuntimeError, match="closed"):
        engine.generate_block(session)
    with pytest.raises(RuntimeError, match="closed"):
        session.submit(Interaction("x", prompt="y"))
