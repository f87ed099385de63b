"""The longest text (in UTF-8 bytes) that can still tokenize to fewer than max_model_len
tokens, so a longer prompt is refused before it is tokenized (4 MB took 2.5 s of CPU).

Sound for a tokenizer that drops no input: every token then covers at most as many input
bytes as its own string has in UTF-8 (Metaspace writes a space as the 3-byte U+2581,
byte-fallback tokens are `<0xNN>`), or characters under a ByteLevel pre-tokenizer (which
writes each byte as one character), so n bytes give at least n / longest tokens. A
normalizer can shrink the text before that: Unicode normalization and lowercasing by at most
3x (fullwidth letters, the Kelvin sign, conjoining jamo: 3 bytes to 1), counted as 4;
Replace by its pattern's length over its replacement's. Where input can vanish (a
normalizer that strips or deletes, a pre-tokenizer that drops whitespace, an unknown token
that fuses a whole run), there is no bound, and the prompt is only tokenized off the event
loop.
"""

from __future__ import annotations

import json
from typing import Any

from tokenizers import Tokenizer

# A token covers at least one character, up to 4 bytes of UTF-8.
MIN_TOKEN_BYTES = 4
UNICODE_SHRINK = 4
_UNICODE_NORMALIZERS = frozenset({"NFC", "NFD", "NFKC", "NFKD", "Lowercase"})
_KEEPING_PRE_TOKENIZERS = frozenset({"ByteLevel", "Metaspace", "Digits", "Punctuation",
                                     "UnicodeScripts"})


def _shrink(normalizer: dict[str, Any] | None) -> float | None:
    """How many times shorter (in bytes) the normalizer can make a text; None: unbounded."""
    if normalizer is None:
        return 1.0
    kind = normalizer.get("type")
    if kind == "Sequence":
        total = 1.0
        for step in normalizer.get("normalizers", []):
            factor = _shrink(step)
            if factor is None:
                return None
            total *= factor
        return total
    if kind in _UNICODE_NORMALIZERS:
        return float(UNICODE_SHRINK)
    if kind == "Prepend":
        return 1.0
    if kind == "Replace":
        pattern = normalizer.get("pattern", {}).get("String")
        content = str(normalizer.get("content", ""))
        if not isinstance(pattern, str) or not content:
            return None  # a regex, or a deletion
        return max(1.0, len(pattern.encode()) / len(content.encode()))
    return None


def _keeps_all(pre_tokenizer: dict[str, Any] | None) -> bool:
    if pre_tokenizer is None:
        return True
    kind = pre_tokenizer.get("type")
    if kind == "Sequence":
        return all(_keeps_all(p) for p in pre_tokenizer.get("pretokenizers", []))
    if kind == "Split":
        return pre_tokenizer.get("behavior") != "Removed"
    return kind in _KEEPING_PRE_TOKENIZERS


def _byte_level(pre_tokenizer: dict[str, Any] | None) -> bool:
    if pre_tokenizer is None:
        return False
    if pre_tokenizer.get("type") == "Sequence":
        return any(_byte_level(p) for p in pre_tokenizer.get("pretokenizers", []))
    return pre_tokenizer.get("type") == "ByteLevel"


def _fuses_unknown(model: dict[str, Any]) -> bool:
    """Whether one unknown token can stand for a whole run of input."""
    kind = model.get("type")
    if kind == "BPE":
        return bool(model.get("unk_token") and model.get("fuse_unk")
                    and not model.get("byte_fallback"))
    if kind == "Unigram":
        return model.get("unk_id") is not None and not model.get("byte_fallback")
    return kind != "BPE"  # WordLevel and WordPiece map a whole word to one unknown token


def max_prompt_bytes(tokenizer: Tokenizer, max_model_len: int) -> tuple[int | None, str]:
    """(the bound, or None; a phrase saying why, for the log and the refusal)."""
    spec = json.loads(tokenizer.to_str())
    shrink = _shrink(spec.get("normalizer"))
    if shrink is None:
        return None, f"its normalizer ({spec['normalizer'].get('type')}) may delete text"
    if not _keeps_all(spec.get("pre_tokenizer")):
        return None, (f"its pre-tokenizer ({spec['pre_tokenizer'].get('type')}) may drop "
                      "text")
    if _fuses_unknown(spec.get("model", {})):
        return None, "one unknown token may stand for a whole run of text"
    # Under a ByteLevel pre-tokenizer each character of a model token stands for one byte
    # (some are 2 bytes in UTF-8); added tokens match the raw text.
    per_char = _byte_level(spec.get("pre_tokenizer"))
    added = {t.content for t in tokenizer.get_added_tokens_decoder().values()}
    longest = max([MIN_TOKEN_BYTES, *(len(t.encode("utf-8", "surrogatepass"))
                                      for t in added)])
    for token in tokenizer.get_vocab(with_added_tokens=False):
        longest = max(longest, len(token) if per_char else
                      len(token.encode("utf-8", "surrogatepass")))
    bound = int(max_model_len * longest * shrink)
    why = (f"max_model_len {max_model_len} x {longest} bytes, the longest token"
           + (f", x {shrink:g} for the normalizer" if shrink != 1 else ""))
    return bound, why
