"""A motion sensor set into a Qwen2.5-Omni thinker's weights before training: which way the picture moves.

Learning the direction of a turn from the language-model loss alone failed on
this world (held-out turns at chance after hours, and a probe on the vision
tower's own tokens at chance for left against right): the scenes are
sparsely textured, and the sign of a shift is a product of two things a
patch shows (how its brightness changes between the two frames of the
temporal patch, and which way its brightness slopes), which no linear filter
gives and the tower never found. A hand-made statistic of that product,
summed over patches, tells left from right on 98 % of the training clips.

So the sensor puts that statistic where training can read it, in the same
architecture and the same state-dict keys (a checkpoint with a sensor loads
wherever the thinker loads):

- three patch-embedding channels: the patch's change between its two
  frames, and its left-to-right and top-to-bottom slope;
- four hidden units of the first block's gated MLP that multiply them
  (silu(a) * b - silu(-a) * b = a * b) into two channels, horizontal and
  vertical motion, which the rest of the tower carries untouched;
- four hidden units of the patch merger that sum each over the merged 2x2
  patches (gelu(h) - gelu(-h) = h) and add them to every video token along
  two fixed directions.

The channels taken were features of the trained tower; the readers of those
channels are cleared and training, which goes on from here, rebuilds what
they held. Scales come from the clips given, so each new channel is about as
large as the tower's others.
"""

from __future__ import annotations

import torch

# Residual channels of the vision tower: change, x slope, y slope, x motion, y motion (the last five).
SENSOR_CHANNELS = 5
# Hidden units used in the first block's MLP and in the merger (the last four of each).
SENSOR_UNITS = 4
# How large a video token's motion (a turn's, as most moving patches see it) is against the token itself.
MOTION_SHARE = 0.5


def _layout(visual) -> tuple[slice, slice, range]:
    """Where the sensor sits in a vision tower: its residual channels, its first-block MLP units, its merger units."""
    width = visual.patch_embed.proj.out_channels
    hidden = visual.blocks[0].mlp.gate_proj.out_features
    merged = visual.merger.mlp[0].out_features
    return slice(width - SENSOR_CHANNELS, width), slice(hidden - SENSOR_UNITS, hidden), range(merged - SENSOR_UNITS, merged)


def _filters(patch: int, temporal: int) -> torch.Tensor:
    """(3, C=3, T, P, P): the change, the x slope and the y slope of a patch's grey level."""
    change = torch.zeros(3, temporal, patch, patch)
    change[:, -1], change[:, 0] = 1.0, -1.0
    x_slope = torch.zeros(3, temporal, patch, patch)
    x_slope[..., -2:], x_slope[..., :2] = 1.0, -1.0
    y_slope = torch.zeros(3, temporal, patch, patch)
    y_slope[..., -2:, :], y_slope[..., :2, :] = 1.0, -1.0
    return torch.stack([change, x_slope, y_slope]) / 3.0


@torch.no_grad()
def install_motion_sensor(model: torch.nn.Module, pixel_rows: torch.Tensor, grid_thw: torch.Tensor) -> None:
    """Set the sensor into `model` (a Qwen2.5-Omni thinker) in place, scaled on `pixel_rows` (the processor's
    `pixel_values_videos` of a few clips, with their `video_grid_thw`)."""
    visual = _visual(model)
    embed = visual.patch_embed.proj
    width = embed.out_channels
    sensor, units, merged_units = _layout(visual)
    change, x_slope, y_slope, x_motion, y_motion = range(sensor.start, sensor.stop)
    dtype = embed.weight.dtype
    rows = pixel_rows.to(dtype)

    # Nothing that read or wrote these channels keeps doing so: they mean something new now.
    for block in visual.blocks:
        for reader in (block.attn.q, block.attn.k, block.attn.v, block.mlp.gate_proj, block.mlp.up_proj):
            reader.weight[:, sensor] = 0
        for writer in (block.attn.proj, block.mlp.down_proj):
            writer.weight[sensor] = 0
            writer.bias[sensor] = 0
        block.norm1.weight[sensor] = 1
        block.norm2.weight[sensor] = 1
    merger = visual.merger
    merger.ln_q.weight[sensor] = 1
    groups = merger.mlp[0].in_features // width  # patches merged into one token
    for g in range(groups):
        merger.mlp[0].weight[:, g * width + sensor.start : (g + 1) * width] = 0

    # The patch embedding: three filters, each scaled to the tower's typical channel size.
    t, p = embed.kernel_size[0], embed.kernel_size[1]
    filters = _filters(p, t).to(dtype)
    embed.weight[sensor] = 0
    typical = (rows @ embed.weight.reshape(width, -1)[: sensor.start].T).std(0).median()
    for channel, f in zip((change, x_slope, y_slope), filters):
        response = rows @ f.reshape(-1)
        embed.weight[channel] = f * (typical / response.std().clamp_min(1e-6))

    # The first block's MLP: x motion = change * x slope, y motion = change * y slope.
    mlp = visual.blocks[0].mlp
    for unit, (factor, out, sign) in zip(range(units.start, units.start + SENSOR_UNITS),
                                         ((x_slope, x_motion, 1), (x_slope, x_motion, -1), (y_slope, y_motion, 1), (y_slope, y_motion, -1))):
        mlp.gate_proj.weight[unit] = 0
        mlp.gate_proj.bias[unit] = 0
        mlp.gate_proj.weight[unit, change] = sign
        mlp.up_proj.weight[unit] = 0
        mlp.up_proj.bias[unit] = 0
        mlp.up_proj.weight[unit, factor] = 1
        mlp.down_proj.weight[:, unit] = 0
        mlp.down_proj.weight[out, unit] = sign

    # Scale the products to the tower's typical size, measured after the first block.
    first = _output_of(visual.blocks[0], visual, rows, grid_thw)
    for out, unit_pair in ((x_motion, (units.start, units.start + 1)), (y_motion, (units.start + 2, units.start + 3))):
        size = first[:, out].std().clamp_min(1e-6)
        for unit in unit_pair:
            mlp.down_proj.weight[out, unit] *= typical / size

    # The merger: sum each motion channel over the merged patches (gelu(h) - gelu(-h) = h) and add it to every
    # video token along a fixed direction that spans all the token's channels. Spread, not in a channel of its
    # own, so every weight of the language model that reads a video token sees some of it, and the features
    # the merger made before stay as they were.
    directions = token_directions(merger.mlp[2].out_features, dtype)
    for unit, (source, direction, sign) in zip(merged_units, ((x_motion, 0, 1), (x_motion, 0, -1), (y_motion, 1, 1), (y_motion, 1, -1))):
        merger.mlp[0].weight[unit] = 0
        merger.mlp[0].bias[unit] = 0
        for g in range(groups):
            merger.mlp[0].weight[unit, g * width + source] = sign
        merger.mlp[2].weight[:, unit] = sign * directions[direction]
    tokens = _merged(visual, rows, grid_thw)
    motion = _motion(visual, rows, grid_thw)
    token_size = tokens.norm(dim=-1).median()
    for axis, pair in enumerate((merged_units[:2], merged_units[2:])):
        size = motion[:, axis].abs().quantile(0.9).clamp_min(1e-6)  # most patches see no edge move: size by those that do
        for unit in pair:
            merger.mlp[2].weight[:, unit] *= MOTION_SHARE * token_size / size


def token_directions(width: int, dtype=torch.float32) -> torch.Tensor:
    """(2, width): the fixed unit directions of x and y motion in a video token (orthogonal, every entry used)."""
    generator = torch.Generator().manual_seed(18)
    q, _ = torch.linalg.qr(torch.randn(width, 2, generator=generator))
    return q.T.contiguous().to(dtype)


def _motion(visual, rows: torch.Tensor, grid_thw: torch.Tensor) -> torch.Tensor:
    """(tokens, 2): each video token's x and y motion, as the merger's sensor units sum them."""
    h = _output_of(visual.merger.mlp[1], visual, rows, grid_thw)[:, _layout(visual)[2].start :]
    return torch.stack([h[:, 0] - h[:, 1], h[:, 2] - h[:, 3]], dim=-1)


def has_motion_sensor(model: torch.nn.Module) -> bool:
    """Whether `model`'s patch embedding already holds the sensor's three filters (weights trained with it)."""
    visual = _visual(model)
    embed = visual.patch_embed.proj
    t, p = embed.kernel_size[0], embed.kernel_size[1]
    start = _layout(visual)[0].start
    rows = embed.weight[start : start + 3].detach().float()
    filters = _filters(p, t).float()
    return bool(torch.nn.functional.cosine_similarity(rows.flatten(1), filters.flatten(1)).min() > 0.999)


def freeze_motion_sensor(model: torch.nn.Module) -> list:
    """Keep the sensor as set while the rest trains: its weights get no gradient (so Adam leaves them), and
    nothing learns to write into its channels. Returns the hooks' handles."""
    visual = _visual(model)
    sensor, units, merged = _layout(visual)
    merged_units = slice(merged.start, merged.stop)
    merger = visual.merger
    frozen: list[tuple[torch.nn.Parameter, tuple]] = [(visual.patch_embed.proj.weight, (sensor,)), (merger.ln_q.weight, (sensor,))]
    for block in visual.blocks:
        for writer in (block.attn.proj, block.mlp.down_proj):
            frozen += [(writer.weight, (sensor,)), (writer.bias, (sensor,))]
        frozen += [(block.norm2.weight, (sensor,))]
    mlp = visual.blocks[0].mlp
    for reader in (mlp.gate_proj, mlp.up_proj):
        frozen += [(reader.weight, (units,)), (reader.bias, (units,))]
    frozen += [(merger.mlp[0].weight, (merged_units,)), (merger.mlp[0].bias, (merged_units,)),
               (merger.mlp[2].weight, (slice(None), merged_units))]
    masks: dict[int, torch.Tensor] = {}
    for parameter, index in frozen:
        mask = masks.setdefault(id(parameter), torch.ones_like(parameter))
        mask[index] = 0
    by_id = {id(p): p for p, _ in frozen}
    return [by_id[key].register_hook(lambda grad, mask=mask: grad * mask) for key, mask in masks.items()]


def _visual(model: torch.nn.Module) -> torch.nn.Module:
    return model.model.visual if hasattr(model, "model") and hasattr(model.model, "visual") else model.visual


def _output_of(module: torch.nn.Module, visual, rows: torch.Tensor, grid_thw: torch.Tensor) -> torch.Tensor:
    """What `module` (a part of the vision tower) gives when the tower sees `rows`."""
    captured = {}
    handle = module.register_forward_hook(lambda _m, _i, out: captured.setdefault("out", out))
    try:
        visual(rows, grid_thw=grid_thw)
    finally:
        handle.remove()
    return captured["out"]


def _merged(visual, rows: torch.Tensor, grid_thw: torch.Tensor) -> torch.Tensor:
    out = visual(rows, grid_thw=grid_thw)
    return out.pooler_output if hasattr(out, "pooler_output") else out


def motion_readings(model: torch.nn.Module, pixel_rows: torch.Tensor, grid_thw: torch.Tensor) -> tuple[float, float]:
    """The x and y motion the video tokens carry, averaged over one clip's tokens."""
    visual = _visual(model)
    with torch.no_grad():
        motion = _motion(visual, pixel_rows.to(visual.patch_embed.proj.weight.dtype), grid_thw)
    return float(motion[:, 0].mean()), float(motion[:, 1].mean())

