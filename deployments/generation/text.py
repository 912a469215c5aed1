"""Prompt -> text-encoder states the way Wan pipelines make them, with a small cache.

Sessions often share prompts (and a prompt blend revisits both ends), so the
last few encodings are kept.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping

import torch


def prompt_states(tokenizer, text_encoder, prompts: list[str], max_length: int) -> torch.Tensor:
    """(N, max_length, dim): each prompt's states, zero past its last token (as Wan pads).

    No `no_grad` here: training the text encoder goes through this same function.
    """
    inputs = tokenizer(
        [p.strip() for p in prompts],
        padding="max_length",
        max_length=max_length,
        truncation=True,
        add_special_tokens=True,
        return_attention_mask=True,
        return_tensors="pt",
    )
    device = text_encoder.device
    mask = inputs.attention_mask.to(device)
    states = text_encoder(inputs.input_ids.to(device), mask).last_hidden_state
    return states * mask.unsqueeze(-1).to(states.dtype)


class PromptEncoder:
    def __init__(self, tokenizer, text_encoder, max_length: int | None = None, cache_size: int = 32) -> None:
        self.tokenizer = tokenizer
        self.text_encoder = text_encoder
        # Wan's text length is 512; a checkpoint whose tokenizer says less (the built-in one) uses that.
        self.max_length = max_length or min(512, int(getattr(tokenizer, "model_max_length", 512) or 512))
        self.cache_size = cache_size
        self._cache: OrderedDict[str, torch.Tensor] = OrderedDict()

    @torch.no_grad()
    def encode(self, prompt: str) -> torch.Tensor:
        """(1, max_length, dim): the prompt's states, zero past its last token (as Wan pads)."""
        cached = self._cache.get(prompt)
        if cached is not None:
            self._cache.move_to_end(prompt)
            return cached
        states = prompt_states(self.tokenizer, self.text_encoder, [prompt], self.max_length)
        self._cache[prompt] = states
        if len(self._cache) > self.cache_size:
            self._cache.popitem(last=False)
        return states

    def encode_mix(self, mix: Mapping[str, float]) -> torch.Tensor:
        """A weighted sum of prompts' states: how a prompt switch blends one text into another."""
        total = None
        for prompt, weight in mix.items():
            term = self.encode(prompt) * weight
            total = term if total is None else total + term
        if total is None:
            raise ValueError("empty prompt mix")
        return total
