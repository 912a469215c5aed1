"""An exact oracle for the cached path: one full forward with a block-causal mask.

Context tokens get timestep 0 (they are clean), the current block's tokens the
noise level under test; block b attends to blocks 0..b. Valid while the whole
rollout fits in sink + window, where the cache drops nothing.
"""

from __future__ import annotations

import torch
from diffusers import WanTransformer3DModel
from diffusers.models.attention_dispatch import dispatch_attention_fn

from deployments.generation.attention import apply_rotary


class MaskedSelfAttn:
    def __init__(self, head_dim: int) -> None:
        self.head_dim = head_dim
        self.mask: torch.Tensor | None = None

    def __call__(self, attn, hidden_states, encoder_hidden_states=None, attention_mask=None, rotary_emb=None):
        q = attn.norm_q(attn.to_q(hidden_states)).unflatten(2, (-1, self.head_dim))
        k = attn.norm_k(attn.to_k(hidden_states)).unflatten(2, (-1, self.head_dim))
        v = attn.to_v(hidden_states).unflatten(2, (-1, self.head_dim))
        q, k = apply_rotary(q, *rotary_emb), apply_rotary(k, *rotary_emb)
        out = dispatch_attention_fn(q, k, v, attn_mask=self.mask, dropout_p=0.0, is_causal=False)
        return attn.to_out[1](attn.to_out[0](out.flatten(2, 3).type_as(q)))


class BlockCausalReference:
    def __init__(self, model_dir, frames_per_block: int) -> None:
        self.transformer = WanTransformer3DModel.from_pretrained(model_dir, subfolder="transformer").eval()
        self.frames_per_block = frames_per_block
        self.proc = MaskedSelfAttn(self.transformer.config.attention_head_dim)
        self.transformer.set_attn_processor(
            {name: self.proc for name in self.transformer.attn_processors if ".attn1." in name}
            | {name: proc for name, proc in self.transformer.attn_processors.items() if ".attn2." in name}
        )

    @torch.no_grad()
    def velocity_of_last_block(self, clean_blocks: list[torch.Tensor], noisy: torch.Tensor, sigma: float, text: torch.Tensor) -> torch.Tensor:
        latents = torch.cat([*clean_blocks, noisy], dim=2)
        _, _, frames, h, w = latents.shape
        p = self.transformer.config.patch_size
        tokens_per_frame = (h // p[1]) * (w // p[2])
        frame_of_token = torch.arange(frames).repeat_interleave(tokens_per_frame)
        block_of_token = frame_of_token // self.frames_per_block
        self.proc.mask = (block_of_token[None, :] <= block_of_token[:, None])[None, None]
        last = block_of_token == block_of_token[-1]
        timestep = torch.where(last, sigma * 1000.0, 0.0)[None].float()
        out = self.transformer(latents, timestep, text, return_dict=False)[0]
        return out[:, :, -noisy.shape[2] :]
