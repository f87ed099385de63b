"""A tokenizer for a random-weight checkpoint, so the paths that need one (text prompts,
detokenization, structured output through xgrammar) run on preset shapes.

A byte-level BPE (as GPT-2, SmolLM2 and Llama 3 use) trained with the `tokenizers` library on
a small built-in text: every byte is a token, so any string (JSON, digits, punctuation) can be
produced; the vocabulary stays well under the model's, whose remaining ids have no text, as
real checkpoints pad theirs (Qwen: 151,665 tokens over 151,936 rows). EOS is
`<|endoftext|>`, written to generation_config.json where the server reads it.
"""

from __future__ import annotations

import json
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

EOS_TOKEN = "<|endoftext|>"
SPECIAL_TOKENS = (EOS_TOKEN, "<|im_start|>", "<|im_end|>")
# Enough for every byte, the specials and a few hundred merges.
MAX_TOKENIZER_VOCAB = 1024
MIN_MODEL_VOCAB = 300
_CORPUS = (
    'The capital of France is Paris. The capital of Italy is Rome. Yes, no, maybe.',
    '{"id": 12, "name": "alpha", "kind": "a", "tags": ["x", "y"], "ok": true, "n": null}',
    '[red,green,blue] (1+2)*3 = 9; 0 1 2 3 4 5 6 7 8 9 10 42 100 2026',
    'true false null "key": "value", {"a": [1, 2, 3]}, {"b": {"c": "d"}}',
    'Hello world! What is the answer? The answer is 42. name: alpha, beta, gamma.',
)


def train_byte_level_tokenizer(vocab_size: int) -> Tokenizer:
    """At most `vocab_size` tokens (the specials first: EOS is id 0)."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(list(_CORPUS) * 20, trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=list(SPECIAL_TOKENS), show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return tok


def tokenizer_vocab_size(model_vocab_size: int) -> int:
    """The tokenizer's size for a model of `model_vocab_size` rows: at most 3/4 of them."""
    if model_vocab_size < MIN_MODEL_VOCAB:
        raise ValueError(f"a byte-level tokenizer needs a vocabulary of at least "
                         f"{MIN_MODEL_VOCAB} (259 bytes and specials); this model has "
                         f"{model_vocab_size}")
    return min(MAX_TOKENIZER_VOCAB, model_vocab_size * 3 // 4)


def write_tokenizer(model_dir: Path, model_vocab_size: int) -> str:
    """tokenizer.json, tokenizer_config.json and generation_config.json (eos_token_id) in
    `model_dir`; kept when tokenizer.json is already there. Returns what it did."""
    if (model_dir / "tokenizer.json").exists():
        return f"kept {model_dir / 'tokenizer.json'}"
    tok = train_byte_level_tokenizer(tokenizer_vocab_size(model_vocab_size))
    model_dir.mkdir(parents=True, exist_ok=True)
    tok.save(str(model_dir / "tokenizer.json"))
    eos = tok.token_to_id(EOS_TOKEN)
    (model_dir / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": None,
         "eos_token": EOS_TOKEN, "unk_token": EOS_TOKEN}, indent=2) + "\n")
    generation = model_dir / "generation_config.json"
    config = json.loads(generation.read_text()) if generation.exists() else {}
    generation.write_text(json.dumps({**config, "eos_token_id": eos}, indent=2) + "\n")
    size = tok.get_vocab_size(with_added_tokens=True)
    return (f"tokenizer: byte-level BPE, {size} tokens of the model's {model_vocab_size}, "
            f"EOS {EOS_TOKEN!r} = {eos}")
