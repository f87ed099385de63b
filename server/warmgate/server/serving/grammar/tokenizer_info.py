"""xgrammar's TokenizerInfo from the model directory's tokenizer.json.

The server reads tokenizer.json with the `tokenizers` package (no transformers), so this does
what xgrammar's TokenizerInfo.from_huggingface does for a fast tokenizer: the vocabulary by id
(padded to the model's vocab_size, so the bitmask covers every logit), the vocabulary type and
prefix-space flag xgrammar detects from the serialized tokenizer, cross-checked against the
vocabulary itself, and the model's EOS ids as the stop tokens that end a grammar.
tests/test_structured_tokenizer_info.py checks the result equals from_huggingface's.
"""

from __future__ import annotations

from collections.abc import Sequence

import xgrammar as xgr
from tokenizers import Tokenizer


def tokenizer_info_of(tokenizer: Tokenizer, vocab_size: int,
                      stop_token_ids: Sequence[int]) -> xgr.TokenizerInfo:
    """vocab_size: the model's (its lm_head rows), at least the tokenizer's."""
    if not stop_token_ids:
        raise ValueError("a grammar needs the model's end-of-sequence ids to end on")
    vocab = tokenizer.get_vocab(with_added_tokens=True)
    encoded = [""] * vocab_size
    for token, idx in vocab.items():
        if idx < vocab_size:
            encoded[idx] = token
    metadata = xgr.TokenizerInfo._detect_metadata_from_hf(tokenizer.to_str())
    vocab_type, add_prefix_space = metadata["vocab_type"], metadata["add_prefix_space"]
    from_vocab = xgr.TokenizerInfo._detect_vocab_type_from_vocab(vocab)
    if from_vocab is not None and from_vocab != vocab_type:
        # As from_huggingface: the vocabulary is decisive evidence for its own encoding.
        vocab_type = from_vocab
        add_prefix_space = _adds_prefix_space(tokenizer, from_vocab)
    return xgr.TokenizerInfo(encoded, vocab_type, vocab_size=vocab_size,
                             stop_token_ids=list(stop_token_ids),
                             add_prefix_space=add_prefix_space)


def _adds_prefix_space(tokenizer: Tokenizer, vocab_type: xgr.VocabType) -> bool:
    tokens = tokenizer.encode("a", add_special_tokens=False).tokens
    if not tokens or not tokens[0]:
        return False
    prefix = "\u2581" if vocab_type == xgr.VocabType.BYTE_FALLBACK else "\u0120"
    return tokens[0].startswith(prefix)
