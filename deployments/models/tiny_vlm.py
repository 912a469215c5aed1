"""A tiny random-weight Qwen2.5-Omni thinker checkpoint, built offline.

Why: the video-understanding deployment serves a Qwen2.5-Omni style model
(video frames + microphone audio + text in, streamed text out). Tests and CPU
runs need a checkpoint with the same classes, the same processor and the
same on-disk layout as the real `Qwen/Qwen2.5-Omni-*` thinker, but there is
no model hub here and the real weights are gigabytes. `make_tiny_vlm` writes
one in a fraction of a second (once transformers is imported): random
weights, a tiny config, the *real* processor classes (Qwen2-VL image/video
processors, `WhisperFeatureExtractor`) and a byte-level `Qwen2Tokenizer`
built locally with the `tokenizers` library, so the server's loading code
(`from_pretrained` / `AutoProcessor`) is the code that will load a real
checkpoint.

Design notes:
- The vocabulary is the 256 byte-level symbols (no merges) followed by the
  Qwen2.5-Omni special tokens in their real relative order. A real vocab
  (152k rows) would make the embedding alone tens of MB; with 270 rows the
  whole folder stays well under 1 MB. Every id the model can emit decodes.
- Token ids in `config.json` are taken from the tokenizer, never typed in,
  so they cannot drift apart.
- Image/video processor configs are saved with small pixel budgets
  (`size` = 4..64 merged 28x28 cells per frame). Images use it as is. For
  videos, `Qwen2_5OmniProcessor` passes its own class default size (100k to
  600k pixels per frame) on every call, and in transformers 5.x a saved
  config cannot override that class attribute, so a 64x64 frame would be
  upscaled to 336x336. Callers pass the saved size back explicitly:
  `videos_kwargs={"size": processor.video_processor.to_dict()["size"]}`,
  which is also right for a real checkpoint (its saved size is the default).
- The checkpoint is Qwen2.5-Omni rather than Qwen2.5-VL because the thinker
  takes audio (`input_features` + `feature_attention_mask`) natively.
"""

from __future__ import annotations

import os
import pathlib
from dataclasses import dataclass

import torch
from transformers import (
    GenerationConfig,
    Qwen2_5OmniProcessor,
    Qwen2_5OmniThinkerConfig,
    Qwen2_5OmniThinkerForConditionalGeneration,
    Qwen2Tokenizer,
    Qwen2VLImageProcessor,
    Qwen2VLVideoProcessor,
    WhisperFeatureExtractor,
)
from transformers.convert_slow_tokenizer import bytes_to_unicode

__all__ = ["VLMSpec", "build_vlm", "make_tiny_vlm"]

# The Qwen2.5-Omni added tokens, in the order the real tokenizer assigns them
# ids (151643...); the processor and chat template need all of these.
_SPECIAL_TOKENS: tuple[str, ...] = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|AUDIO|>",
    "<|audio_bos|>",
    "<|audio_eos|>",
    "<|box_end|>",
    "<|quad_start|>",
    "<|quad_end|>",
    "<|vision_bos|>",
    "<|vision_eos|>",
    "<|vision_pad|>",
    "<|IMAGE|>",
    "<|VIDEO|>",
)

# Patch 14 merged 2x2 gives a 28-pixel grid: 4..64 merged cells per frame
# keeps a 64x64 test frame at 56x56 and a 640x480 webcam frame tiny.
_MIN_PIXELS = 4 * 28 * 28
_MAX_PIXELS = 64 * 28 * 28

# The real Qwen2.5-Omni chat template (system prompt, vision/audio
# placeholders wrapped in bos/eos markers), so prompts are shaped like the
# ones a real checkpoint sees.
_CHAT_TEMPLATE = (
    "{% set audio_count = namespace(value=0) %}"
    "{% set image_count = namespace(value=0) %}"
    "{% set video_count = namespace(value=0) %}"
    "{% for message in messages %}"
    "{% if loop.first and message['role'] != 'system' %}"
    "<|im_start|>system\n"
    "You are Qwen, a virtual human developed by the Qwen Team, Alibaba Group, capable of "
    "perceiving auditory and visual inputs, as well as generating text and speech.<|im_end|>\n"
    "{% endif %}"
    "<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}"
    "{{ message['content'] }}<|im_end|>\n"
    "{% else %}"
    "{% for content in message['content'] %}"
    "{% if content['type'] == 'image' or 'image' in content or 'image_url' in content %}"
    "{% set image_count.value = image_count.value + 1 %}"
    "{% if add_vision_id %}Picture {{ image_count.value }}: {% endif %}"
    "<|vision_bos|><|IMAGE|><|vision_eos|>"
    "{% elif content['type'] == 'audio' or 'audio' in content or 'audio_url' in content %}"
    "{% set audio_count.value = audio_count.value + 1 %}"
    "{% if add_audio_id %}Audio {{ audio_count.value }}: {% endif %}"
    "<|audio_bos|><|AUDIO|><|audio_eos|>"
    "{% elif content['type'] == 'video' or 'video' in content %}"
    "{% set video_count.value = video_count.value + 1 %}"
    "{% if add_vision_id %}Video {{ video_count.value }}: {% endif %}"
    "<|vision_bos|><|VIDEO|><|vision_eos|>"
    "{% elif 'text' in content %}"
    "{{ content['text'] }}"
    "{% endif %}"
    "{% endfor %}"
    "<|im_end|>\n"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

_README = """# Tiny random-weight Qwen2.5-Omni thinker

Written by `deployments.models.tiny_vlm.make_tiny_vlm` for tests and CPU runs.
The weights are RANDOM: the model emits gibberish. The classes, processor and
file layout match a real Qwen2.5-Omni thinker checkpoint; the vocabulary is
byte-level (256 symbols + the Qwen2.5-Omni special tokens).

Load with `Qwen2_5OmniThinkerForConditionalGeneration.from_pretrained(dir)` and
`AutoProcessor.from_pretrained(dir)`. Call the processor with
`videos_kwargs={"size": processor.video_processor.to_dict()["size"], "fps": fps}`:
without it the processor's class default upscales every video frame.
"""


def _build_tokenizer() -> Qwen2Tokenizer:
    # Byte-level symbols first, specials after: every string is encodable
    # without merges and the special ids are stable across builds.
    vocab = {symbol: i for i, symbol in enumerate(bytes_to_unicode().values())}
    for token in _SPECIAL_TOKENS:
        vocab[token] = len(vocab)
    return Qwen2Tokenizer(
        vocab=vocab,
        merges=[],
        unk_token=None,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        extra_special_tokens=list(_SPECIAL_TOKENS),
        # Named multimodal tokens: Qwen2_5OmniProcessor reads them as
        # tokenizer attributes (tokenizer.image_token, .audio_bos_token, ...).
        image_token="<|IMAGE|>",
        video_token="<|VIDEO|>",
        audio_token="<|AUDIO|>",
        vision_bos_token="<|vision_bos|>",
        vision_eos_token="<|vision_eos|>",
        audio_bos_token="<|audio_bos|>",
        audio_eos_token="<|audio_eos|>",
        model_max_length=32768,
        padding_side="left",
    )


def _build_processor(tokenizer: Qwen2Tokenizer) -> Qwen2_5OmniProcessor:
    vision = {
        "min_pixels": _MIN_PIXELS,
        "max_pixels": _MAX_PIXELS,
        "patch_size": 14,
        "temporal_patch_size": 2,
        "merge_size": 2,
    }
    return Qwen2_5OmniProcessor(
        image_processor=Qwen2VLImageProcessor(**vision),
        # cap_pixels_per_frame set explicitly: left unset it warns on every call.
        video_processor=Qwen2VLVideoProcessor(**vision, cap_pixels_per_frame=True),
        # 16 mel bins to match the tiny audio encoder; otherwise Whisper defaults
        # (16 kHz, 30 s window padded to 3000 frames), as the real checkpoint.
        feature_extractor=WhisperFeatureExtractor(feature_size=16, return_attention_mask=True),
        tokenizer=tokenizer,
        chat_template=_CHAT_TEMPLATE,
    )


@dataclass(frozen=True)
class VLMSpec:
    """Sizes of a Qwen2.5-Omni thinker; the defaults are the tiny random test one's."""

    hidden: int = 64
    layers: int = 2
    heads: int = 4
    kv_heads: int = 2
    intermediate: int = 128
    mrope_section: tuple[int, int, int] = (2, 3, 3)  # sums to head_dim / 2: time, height, width
    vision_hidden: int = 32
    vision_depth: int = 2
    vision_heads: int = 2
    vision_intermediate: int = 64
    vision_full_attention: tuple[int, ...] = (1,)
    audio_hidden: int = 32
    audio_layers: int = 2
    audio_heads: int = 2
    audio_ffn: int = 64


def _build_config(tokenizer: Qwen2Tokenizer, spec: VLMSpec = VLMSpec()) -> Qwen2_5OmniThinkerConfig:
    ids = tokenizer.convert_tokens_to_ids
    hidden = spec.hidden
    if 2 * sum(spec.mrope_section) != hidden // spec.heads:
        raise ValueError(f"mrope_section {spec.mrope_section} must sum to half the head size {hidden // spec.heads}")
    text_config = {
        "vocab_size": len(tokenizer),
        "hidden_size": hidden,
        "intermediate_size": spec.intermediate,
        "num_hidden_layers": spec.layers,
        "num_attention_heads": spec.heads,
        "num_key_value_heads": spec.kv_heads,
        "max_position_embeddings": 32768,
        "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0, "mrope_section": list(spec.mrope_section)},
        "bos_token_id": ids("<|im_start|>"),
        "eos_token_id": ids("<|im_end|>"),
        "pad_token_id": ids("<|endoftext|>"),
        "tie_word_embeddings": False,
    }
    vision_config = {
        "depth": spec.vision_depth,
        "hidden_size": spec.vision_hidden,
        "intermediate_size": spec.vision_intermediate,
        "num_heads": spec.vision_heads,
        "patch_size": 14,
        "spatial_merge_size": 2,
        "temporal_patch_size": 2,
        "window_size": 112,
        "out_hidden_size": hidden,
        "fullatt_block_indexes": list(spec.vision_full_attention),
    }
    audio_config = {
        "num_mel_bins": 16,
        "encoder_layers": spec.audio_layers,
        "encoder_attention_heads": spec.audio_heads,
        "encoder_ffn_dim": spec.audio_ffn,
        "d_model": spec.audio_hidden,
        "max_source_positions": 1500,
        "n_window": 100,
        "output_dim": hidden,
    }
    return Qwen2_5OmniThinkerConfig(
        text_config=text_config,
        vision_config=vision_config,
        audio_config=audio_config,
        audio_token_index=ids("<|AUDIO|>"),
        image_token_index=ids("<|IMAGE|>"),
        video_token_index=ids("<|VIDEO|>"),
        audio_start_token_id=ids("<|audio_bos|>"),
        audio_end_token_id=ids("<|audio_eos|>"),
        # Not declared on the config class but read by get_rope_index; the
        # real checkpoint's config.json carries them too.
        vision_start_token_id=ids("<|vision_bos|>"),
        vision_end_token_id=ids("<|vision_eos|>"),
        # The real id is the "user" BPE token; with a byte vocab the role has
        # no single token, so point it at the turn marker instead.
        user_token_id=ids("<|im_start|>"),
        bos_token_id=ids("<|im_start|>"),
        eos_token_id=ids("<|im_end|>"),
        pad_token_id=ids("<|endoftext|>"),
        tie_word_embeddings=False,
        dtype="float32",
    )


def build_vlm(spec: VLMSpec = VLMSpec(), seed: int = 0) -> tuple[Qwen2_5OmniThinkerForConditionalGeneration, Qwen2_5OmniProcessor]:
    """A fresh thinker of `spec`'s sizes with its processor (the same seed, the same weights)."""
    tokenizer = _build_tokenizer()
    processor = _build_processor(tokenizer)
    config = _build_config(tokenizer, spec)
    # fork_rng keeps the caller's global RNG untouched while seeding init.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2_5OmniThinkerForConditionalGeneration(config).eval()
    # Stop on either end marker and pad with <|endoftext|>, as the real one.
    model.generation_config = GenerationConfig(
        bos_token_id=config.text_config.bos_token_id,
        eos_token_id=[tokenizer.convert_tokens_to_ids("<|im_end|>"), tokenizer.convert_tokens_to_ids("<|endoftext|>")],
        pad_token_id=config.text_config.pad_token_id,
    )
    return model, processor


def make_tiny_vlm(out_dir: str | os.PathLike[str], seed: int = 0, *, spec: VLMSpec = VLMSpec(), weights: dict | None = None,
                  readme: str = _README) -> pathlib.Path:
    """Write a Qwen2.5-Omni thinker checkpoint with its processor to `out_dir`: random weights from `seed`
    (byte-identical for the same seed), or the trained `weights` (a state dict) when given. Returns the folder."""
    out = pathlib.Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model, processor = build_vlm(spec, seed)
    if weights is not None:
        model.load_state_dict(weights, strict=True)

    model.save_pretrained(out)
    processor.save_pretrained(out)
    (out / "README.md").write_text(readme)
    return out
