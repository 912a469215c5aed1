"""A text tokenizer built on this machine, for checkpoints that cannot be downloaded.

Byte-level BPE with no merges: every string maps to its UTF-8 bytes, so any
prompt tokenizes without a trained vocabulary and two different prompts never
collapse onto the same ids (a word-level vocabulary would map unseen words to
`<unk>` and make prompt switches invisible).
"""

from __future__ import annotations

import os
from pathlib import Path

PAD, EOS, UNK = "<pad>", "</s>", "<unk>"


def build_byte_tokenizer(out_dir: str | os.PathLike, model_max_length: int = 512) -> Path:
    """Save a `PreTrainedTokenizerFast` that `AutoTokenizer.from_pretrained` loads back."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    specials = [PAD, EOS, UNK]
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {token: i for i, token in enumerate(specials + sorted(alphabet))}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token=UNK))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.TemplateProcessing(
        single=f"$A {EOS}", pair=f"$A {EOS} $B {EOS}", special_tokens=[(EOS, vocab[EOS])]
    )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token=PAD,
        eos_token=EOS,
        unk_token=UNK,
        model_max_length=model_max_length,
    )
    out = Path(out_dir)
    fast.save_pretrained(out)
    return out


def vocab_size() -> int:
    """Size of the vocabulary `build_byte_tokenizer` writes (3 specials + 256 bytes)."""
    return 3 + 256
