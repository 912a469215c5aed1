"""A tiny causal video decoder (the TAEHV family's shape), streaming per session.

The full Wan VAE decoder is the exact path and costs as much as a third of a
block on a GPU. This decoder is a stack of 2D convolutions with one frame of
memory per residual block: each block mixes a frame's features with the same
block's input one frame earlier, and a 1x1 "time grow" convolution turns one
latent frame into several output frames. So a block of latents decodes in
one batched pass over its frames, carrying only each memory block's last
input to the next block.

The module layout (`decoder.<index>.<param>`) is the one of the published
TAEHV decoders (madebyollin/taehv: `taew2_1.pth` for Wan 2.1's latents,
16 channels, 8x in space and 4x in time), established from that project's
public code: Clamp, conv, ReLU, then three stages of three memory blocks,
upsample, time grow and a 3x3 projection, then ReLU and the output conv.
`TinyVideoDecoder.load_published` reads such a file (its encoder is ignored;
a time-grow weight with more output channels than the configured stride is
cut to its last-timestep rows, as that project does). Which latent scaling a
published file expects is that file's; this module decodes whatever latents
it is given, and the engine gives it the raw latents the Wan VAE decodes.

Output: frames in [-1, 1], the first `frames_to_trim` of a stream dropped, so
that with 4x in time a stream's first latent frame gives one frame and every
later one four, as the Wan VAE does: a first block of 3 latent frames makes 9
frames, later blocks 12.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

CONFIG_NAME = "config.json"
WEIGHTS_NAME = "model.safetensors"


@dataclass(frozen=True)
class TinyDecoderConfig:
    latent_channels: int = 16
    patch_size: int = 1  # output pixels per side of each output channel group (pixel shuffle)
    widths: tuple[int, int, int, int] = (256, 128, 64, 64)
    time_upscale: tuple[bool, bool, bool] = (False, True, True)  # per stage: x2 in time
    space_upscale: tuple[bool, bool, bool] = (True, True, True)  # per stage: x2 in space
    # Trained for its model (not random weights for timing): `video_decoder: auto` then picks it.
    trained: bool = False

    @property
    def time_factor(self) -> int:
        return 2 ** sum(self.time_upscale)

    @property
    def space_factor(self) -> int:
        return 2 ** sum(self.space_upscale) * self.patch_size

    @classmethod
    def for_vae(cls, latent_channels: int, spatial: int, temporal: int, widths: tuple[int, int, int, int], **fields) -> "TinyDecoderConfig":
        """The decoder that undoes a VAE's scale factors (1, 2, 4 or 8 each): its upsamples sit in the last
        stages, where the channels are fewest, as the published decoders place theirs."""
        config = cls(latent_channels=latent_channels, widths=tuple(widths), space_upscale=_last_stages(spatial, "spatial"),
                     time_upscale=_last_stages(temporal, "temporal"), **fields)
        assert (config.space_factor, config.time_factor) == (spatial, temporal)
        return config

    @classmethod
    def from_dict(cls, data: dict) -> "TinyDecoderConfig":
        known = {k: tuple(v) if isinstance(v, list) else v for k, v in data.items() if k in cls.__dataclass_fields__}
        return cls(**known)


def _last_stages(factor: int, name: str) -> tuple[bool, bool, bool]:
    doublings = factor.bit_length() - 1
    if isinstance(factor, bool) or not isinstance(factor, int) or factor < 1 or 2**doublings != factor or doublings > 3:
        raise ValueError(f"a tiny decoder upsamples by 1, 2, 4 or 8; the VAE's {name} factor is {factor!r}")
    return tuple(stage >= 3 - doublings for stage in range(3))


def _conv(n_in: int, n_out: int, bias: bool = True) -> nn.Conv2d:
    return nn.Conv2d(n_in, n_out, 3, padding=1, bias=bias)


class _SoftClamp(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(x / 3) * 3


class _MemoryBlock(nn.Module):
    """A residual block that sees its own input one frame earlier beside the current one."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.conv = nn.Sequential(_conv(width * 2, width), nn.ReLU(), _conv(width, width), nn.ReLU(), _conv(width, width))
        self.skip = nn.Identity()
        self.act = nn.ReLU()

    def forward(self, x: torch.Tensor, past: torch.Tensor) -> torch.Tensor:
        return self.act(self.conv(torch.cat([x, past], 1)) + self.skip(x))


class _TimeGrow(nn.Module):
    """Each frame's features -> `stride` consecutive frames' features (a 1x1 conv, then a reshape)."""

    def __init__(self, width: int, stride: int) -> None:
        super().__init__()
        self.stride = stride
        self.conv = nn.Conv2d(width, width * stride, 1, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        frames, channels, h, w = x.shape
        return self.conv(x).reshape(frames * self.stride, channels, h, w)


class TinyVideoDecoder(nn.Module):
    def __init__(self, config: TinyDecoderConfig = TinyDecoderConfig()) -> None:
        super().__init__()
        self.config = config
        w = config.widths
        layers: list[nn.Module] = [_SoftClamp(), _conv(config.latent_channels, w[0]), nn.ReLU()]
        for stage in range(3):
            layers += [_MemoryBlock(w[stage]) for _ in range(3)]
            layers += [
                nn.Upsample(scale_factor=2 if config.space_upscale[stage] else 1),
                _TimeGrow(w[stage], 2 if config.time_upscale[stage] else 1),
                _conv(w[stage], w[stage + 1], bias=False),
            ]
        layers += [nn.ReLU(), _conv(w[3], 3 * config.patch_size**2)]
        self.decoder = nn.Sequential(*layers)
        self.memory_layers = [i for i, layer in enumerate(self.decoder) if isinstance(layer, _MemoryBlock)]

    @property
    def frames_to_trim(self) -> int:
        """Frames a stream's first latent makes beyond the one a causal video VAE gives it."""
        return self.config.time_factor - 1

    # -- decoding --------------------------------------------------------------
    def run(self, latents: torch.Tensor, memory: list[torch.Tensor | None]) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """Latents (N, z, F, h, w) after the frames `memory` remembers -> frames (N, 3, F * time_factor, H, W)
        in [-1, 1], untrimmed, and the memory after them. All of a call's frames go through each layer
        at once; a memory block reads the frame before each one (from `memory` for the first)."""
        n, _, frames, _, _ = latents.shape
        x = latents.permute(0, 2, 1, 3, 4).reshape(n * frames, *latents.shape[1:2], *latents.shape[3:])
        new_memory = []
        for i, layer in enumerate(self.decoder):
            if isinstance(layer, _MemoryBlock):
                t = x.shape[0] // n
                seq = x.view(n, t, *x.shape[1:])
                before = memory[len(new_memory)]
                first = torch.zeros_like(seq[:, :1]) if before is None else before.unsqueeze(1).to(seq)
                past = torch.cat([first, seq[:, :-1]], 1).reshape(x.shape)
                new_memory.append(seq[:, -1].clone())
                x = layer(x, past)
            else:
                x = layer(x)
        if self.config.patch_size > 1:
            x = F.pixel_shuffle(x, self.config.patch_size)
        t = x.shape[0] // n
        pixels = x.clamp(0, 1).view(n, t, *x.shape[1:]).permute(0, 2, 1, 3, 4)
        return pixels * 2 - 1, new_memory

    @torch.no_grad()
    def decode_video(self, latents: torch.Tensor) -> torch.Tensor:
        """A whole clip at once (training, tests): (N, z, F, h, w) -> (N, 3, T, H, W) in [-1, 1], trimmed."""
        pixels, _ = self.run(latents, [None] * len(self.memory_layers))
        return pixels[:, :, self.frames_to_trim :]

    # -- weights ---------------------------------------------------------------
    @classmethod
    def from_pretrained(cls, folder: str | Path, dtype: torch.dtype = torch.float32) -> "TinyVideoDecoder":
        from safetensors.torch import load_file

        folder = Path(folder)
        config = TinyDecoderConfig.from_dict(json.loads((folder / CONFIG_NAME).read_text()))
        model = cls(config)
        model.load_state_dict(load_file(str(folder / WEIGHTS_NAME)))
        return model.to(dtype).eval()

    def save_pretrained(self, folder: str | Path) -> None:
        from safetensors.torch import save_file

        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / CONFIG_NAME).write_text(json.dumps(asdict(self.config), indent=2) + "\n")
        save_file({k: v.contiguous() for k, v in self.state_dict().items()}, str(folder / WEIGHTS_NAME))

    def load_published(self, state_dict: dict[str, torch.Tensor]) -> None:
        """A published TAEHV-family state dict (encoder and decoder): the decoder's tensors, checked by name
        and shape (strict: a missing, extra or misshapen decoder tensor raises, naming it)."""
        ours = self.state_dict()
        picked = {}
        for key, value in state_dict.items():
            if not key.startswith("decoder."):
                continue
            index = int(key.split(".")[1])
            if isinstance(self.decoder[index], _TimeGrow) and key in ours and value.shape[0] > ours[key].shape[0]:
                value = value[-ours[key].shape[0] :]  # a stride-1 time grow keeps the last timestep's rows
            if key in ours and value.shape != ours[key].shape:
                raise ValueError(f"{key}: shape {tuple(value.shape)} in the file, {tuple(ours[key].shape)} in this decoder")
            picked[key] = value
        missing, unexpected = sorted(set(ours) - set(picked)), sorted(set(picked) - set(ours))
        if missing or unexpected:
            raise ValueError(f"decoder tensors missing: {missing[:5]}, unexpected: {unexpected[:5]}")
        self.load_state_dict(picked)


@dataclass
class TinyStreamingDecoder:
    """One session's state in a tiny decoder's stream: each memory block's last input, and how many
    frames are still to be trimmed from the stream's start. Same interface as `StreamingDecoder`."""

    model: TinyVideoDecoder
    memory: list[torch.Tensor | None] = field(default_factory=list)
    to_trim: int = -1

    def __post_init__(self) -> None:
        if not self.memory:
            self.memory = [None] * len(self.model.memory_layers)
        if self.to_trim < 0:
            self.to_trim = self.model.frames_to_trim

    @property
    def started(self) -> bool:
        return self.memory[0] is not None

    def batch_key(self) -> tuple:
        return ("tiny", self.started, self.to_trim)

    def decode(self, raw_latents: torch.Tensor) -> torch.Tensor:
        return decode_tiny_together([self], [raw_latents])[0]

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.memory if t is not None)

    def close(self) -> None:
        self.memory = [None] * len(self.memory)


@torch.no_grad()
def decode_tiny_together(decoders: list[TinyStreamingDecoder], raw_latents: list[torch.Tensor]) -> list[torch.Tensor]:
    """Each session's next latents in one batch; each stream advances as if alone (same `batch_key` needed)."""
    if len({d.batch_key() for d in decoders}) > 1:
        raise ValueError("decoders of one batch must be at the same point of their streams")
    model = decoders[0].model
    weight = next(model.parameters())
    memory = [None if m is None else torch.cat([d.memory[i] for d in decoders]) for i, m in enumerate(decoders[0].memory)]
    pixels, after = model.run(torch.cat(raw_latents).to(weight), memory)
    trim, made = decoders[0].to_trim, pixels.shape[2]
    pixels = pixels[:, :, trim:]
    for b, decoder in enumerate(decoders):
        decoder.memory = [m[b : b + 1] for m in after]
        decoder.to_trim = max(0, trim - made)
    return [pixels[b : b + 1] for b in range(len(decoders))]
