"""Session slots from the memory budget: the formula and the measured decoder cache."""

import torch

from deployments.world_model.capacity import SessionFootprint, measure_footprint, session_slots


def test_footprint_counts_the_kv_cache_the_decoder_cache_and_scratch(engine):
    small = measure_footprint(engine, 64, 64)
    large = measure_footprint(engine, 128, 128)
    assert small.kv_bytes == engine.kv_layout(64, 64).nbytes(engine.dtype)
    assert small.vae_bytes > 0 and small.scratch_bytes > 0
    # Four times the pixels: four times the tokens and the decoder's cached frames.
    assert large.kv_bytes == 4 * small.kv_bytes and large.vae_bytes > 3 * small.vae_bytes


def test_slots_on_cpu_come_from_the_cap():
    footprint = SessionFootprint(10, 10, 10)
    assert session_slots(footprint, 3, 0.9, torch.device("cpu")) == 3
    assert session_slots(footprint, None, 0.9, torch.device("cpu")) == 4
