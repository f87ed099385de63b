"""Incremental detokenization: a stream's token ids in, the text each step adds out.

A character can span several tokens (byte-level BPE pieces, byte-fallback tokens, emoji), and
decoding a prefix that ends inside one gives U+FFFD. So the text of new tokens is held back
while the decoded window ends with U+FFFD, and sent whole once the character completes. Each
step decodes only a window: the last token already sent that decoding keeps (for context: a
decoder's spacing depends on whether a token comes first, e.g. Llama's strip of the leading
space; special tokens are skipped, so they give none) plus the new ones; the delta is the
window's text past the context's. UTF-8 is self-synchronising, so a complete character never
changes when more tokens follow, and the deltas concatenate to the decode of all the ids.

One exception: a ByteFallback decoder (Llama 2-style <0xNN> tokens) turns a whole run of
byte tokens into U+FFFDs when the run is not valid UTF-8, so a byte token that follows can
undo a character the run already completed. With such a decoder, text is also held while the
last token (special tokens aside, when they are skipped) is a byte token: until the run ends.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

from tokenizers import Tokenizer

REPLACEMENT_CHARACTER = "\ufffd"
BYTE_FALLBACK_DECODER = "ByteFallback"


@dataclass(frozen=True)
class DecodeTraits:
    """What the detokenizer needs to know about a tokenizer (computed once per model)."""

    # The <0xNN> tokens, when the decoder merges runs of them (else empty).
    byte_fallback_ids: frozenset[int] = frozenset()
    special_ids: frozenset[int] = frozenset()

    @classmethod
    def of(cls, tokenizer: Tokenizer) -> DecodeTraits:
        decoder = json.dumps(json.loads(tokenizer.to_str()).get("decoder"))
        byte_ids: frozenset[int] = frozenset()
        if f'"{BYTE_FALLBACK_DECODER}"' in decoder:
            found = (tokenizer.token_to_id(f"<0x{b:02X}>") for b in range(256))
            byte_ids = frozenset(i for i in found if i is not None)
        special = frozenset(i for i, t in tokenizer.get_added_tokens_decoder().items()
                            if t.special)
        return cls(byte_ids, special)


class IncrementalDetokenizer:
    def __init__(self, tokenizer: Tokenizer, traits: DecodeTraits | None = None, *,
                 skip_special_tokens: bool = True) -> None:
        self._tokenizer = tokenizer
        self._traits = traits if traits is not None else DecodeTraits.of(tokenizer)
        self._skip_special_tokens = skip_special_tokens
        # Tokens decoding drops: they are no context.
        self._skipped = self._traits.special_ids if skip_special_tokens else frozenset()
        self._ids: list[int] = []
        # ids[_prefix:_read] is the context decoded with the new tokens; ids[:_read] is sent.
        self._prefix = 0
        self._read = 0

    def _decode(self, ids: Sequence[int]) -> str:
        return self._tokenizer.decode(list(ids), skip_special_tokens=self._skip_special_tokens)

    def push(self, token_ids: Sequence[int]) -> str:
        """The text that `token_ids` (the stream's next tokens) complete; "" while a character
        is still split."""
        self._ids.extend(token_ids)
        return self._advance(final=False)

    def flush(self) -> str:
        """At the end of the stream: whatever is held back, even an incomplete character (as
        U+FFFD, as decoding all the ids gives it)."""
        return self._advance(final=True)

    def _advance(self, *, final: bool) -> str:
        if self._read == len(self._ids):
            return ""
        sent = self._decode(self._ids[self._prefix:self._read])
        window = self._decode(self._ids[self._prefix:])
        if not final and (window.endswith(REPLACEMENT_CHARACTER) or self._in_byte_run()):
            return ""
        self._read = len(self._ids)
        # Before any kept token, the context stays the whole (empty-text) start of the stream.
        self._prefix = next((i for i in range(self._read - 1, self._prefix - 1, -1)
                             if self._ids[i] not in self._skipped), self._prefix)
        return window[len(sent):]

    def _in_byte_run(self) -> bool:
        if not self._traits.byte_fallback_ids:
            return False
        last = next((t for t in reversed(self._ids) if t not in self._skipped), None)
        return last in self._traits.byte_fallback_ids
