import torch

from deployments.generation.kv_cache import KVLayout, RollingKVCache


def frame_block(layout: KVLayout, frame: int, frames: int = 1) -> torch.Tensor:
    """K/V for `frames` frames whose every value is the frame's index, so order is visible."""
    values = torch.arange(frame, frame + frames, dtype=torch.float32).repeat_interleave(layout.tokens_per_frame)
    return values.view(1, -1, 1, 1).expand(1, -1, layout.heads, layout.head_dim).clone()


def context_frames(cache: RollingKVCache) -> list[int]:
    k, v = cache.context(0)
    assert torch.equal(k, v)
    return k[0, :: cache.layout.tokens_per_frame, 0, 0].long().tolist()


def test_sink_and_window_in_temporal_order_as_the_window_rolls():
    layout = KVLayout(num_layers=2, sink_frames=3, window_frames=6, tokens_per_frame=4, heads=2, head_dim=8)
    cache = RollingKVCache(layout, torch.float32, "cpu")
    assert context_frames(cache) == []
    for block in range(7):
        first = block * 3
        for layer in range(layout.num_layers):
            cache.write(layer, frame_block(layout, first, 3), frame_block(layout, first, 3))
        cache.advance(3)
        n = first + 3
        expected = list(range(min(n, 3))) + list(range(max(3, n - 6), n))
        assert context_frames(cache) == expected
        assert cache.context_frames == len(expected) <= 9


def test_window_not_a_multiple_of_the_block_wraps_per_frame():
    layout = KVLayout(num_layers=1, sink_frames=1, window_frames=4, tokens_per_frame=2, heads=1, head_dim=2)
    cache = RollingKVCache(layout, torch.float32, "cpu")
    for block in range(5):
        cache.write(0, frame_block(layout, block * 3, 3), frame_block(layout, block * 3, 3))
        cache.advance(3)
    assert context_frames(cache) == [0, 11, 12, 13, 14]


def test_storage_is_allocated_up_front_and_never_grows():
    layout = KVLayout(num_layers=3, sink_frames=3, window_frames=9, tokens_per_frame=16, heads=2, head_dim=12)
    cache = RollingKVCache(layout, torch.float32, "cpu")
    assert cache.nbytes == layout.nbytes(torch.float32) == 2 * 3 * 12 * 16 * 2 * 12 * 4
    before = cache.k.data_ptr()
    for block in range(50):
        for layer in range(3):
            cache.write(layer, frame_block(layout, block * 3, 3), frame_block(layout, block * 3, 3))
        cache.advance(3)
    assert cache.k.data_ptr() == before and cache.nbytes == layout.nbytes(torch.float32)


def test_no_window_keeps_only_the_sink():
    layout = KVLayout(num_layers=1, sink_frames=3, window_frames=0, tokens_per_frame=1, heads=1, head_dim=2)
    cache = RollingKVCache(layout, torch.float32, "cpu")
    for block in range(3):
        cache.write(0, frame_block(layout, block * 3, 3), frame_block(layout, block * 3, 3))
        cache.advance(3)
    assert context_frames(cache) == [0, 1, 2]
