"""The incremental detokenizer: whatever the tokens and however a stream groups them into
steps, the deltas concatenate to decoding all the ids, and a character split across tokens
(byte-level pieces, byte-fallback tokens, emoji) is never sent half."""

from __future__ import annotations

import functools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer

from tests.text_helpers import MULTIBYTE_TEXT, smollm2_dir, train_tokenizer
from warmgate.server.text.detokenizer import (
    REPLACEMENT_CHARACTER,
    DecodeTraits,
    IncrementalDetokenizer,
)

TOKENIZERS = {kind: train_tokenizer(kind) for kind in ("byte_level", "byte_fallback")}
TRAITS: dict[Tokenizer, DecodeTraits] = {}


def traits(tokenizer: Tokenizer) -> DecodeTraits:
    if tokenizer not in TRAITS:
        TRAITS[tokenizer] = DecodeTraits.of(tokenizer)
    return TRAITS[tokenizer]



def stream_text(tokenizer: Tokenizer, ids: list[int], steps: list[int]) -> list[str]:
    """The deltas of a stream of `ids` arriving in steps of the given sizes (cycled)."""
    detok = IncrementalDetokenizer(tokenizer, traits(tokenizer))
    deltas, i, n = [], 0, 0
    while i < len(ids):
        size = steps[n % len(steps)] if steps else 1
        deltas.append(detok.push(ids[i:i + size]))
        i, n = i + size, n + 1
    deltas.append(detok.flush())
    return deltas


def check_stream(tokenizer: Tokenizer, ids: list[int], steps: list[int]) -> None:
    deltas = stream_text(tokenizer, ids, steps)
    full = tokenizer.decode(ids, skip_special_tokens=True)
    assert "".join(deltas) == full
    if REPLACEMENT_CHARACTER not in full:
        assert not any(REPLACEMENT_CHARACTER in d for d in deltas), deltas


def token_streams(tokenizer: Tokenizer) -> st.SearchStrategy[list[int]]:
    """Random ids (any piece, valid UTF-8 or not), mixed with the ids of real multi-byte
    text (emoji, CJK, accents: characters made of several tokens)."""
    vocab = tokenizer.get_vocab_size(with_added_tokens=True)
    real = tokenizer.encode(MULTIBYTE_TEXT + " The capital of France is Paris.").ids
    chunk = st.integers(0, len(real) - 1).flatmap(
        lambda start: st.integers(start + 1, len(real)).map(lambda end: real[start:end]))
    single = st.integers(0, vocab - 1).map(lambda t: [t])
    return st.lists(chunk | single, max_size=12).map(
        lambda parts: [t for part in parts for t in part])


@pytest.mark.parametrize("kind", sorted(TOKENIZERS))
@settings(max_examples=300, deadline=None, database=None)
@given(data=st.data())
def test_deltas_concatenate_to_the_full_decode(kind: str, data: st.DataObject) -> None:
    tokenizer = TOKENIZERS[kind]
    ids = data.draw(token_streams(tokenizer), label="ids")
    steps = data.draw(st.lists(st.integers(1, 4), max_size=5), label="step sizes")
    check_stream(tokenizer, ids, steps)


@pytest.mark.parametrize(("kind", "expected"), [
    ("byte_level", ["a", "\U0001F600", "b"]),
    # A byte-fallback run is held until a token that ends it: a later byte could still make
    # the run invalid, which decodes the whole run as U+FFFDs.
    ("byte_fallback", ["a", "\U0001F600b"]),
])
def test_a_split_character_comes_whole(kind: str, expected: list[str]) -> None:
    tokenizer = TOKENIZERS[kind]
    ids = tokenizer.encode("a\U0001F600b").ids
    assert len(ids) >= 4  # the emoji is several tokens in both vocabularies
    deltas = stream_text(tokenizer, ids, [1])
    assert [d for d in deltas if d] == expected


@pytest.mark.parametrize("kind", sorted(TOKENIZERS))
def test_a_stream_that_ends_inside_a_character_flushes_what_decoding_gives(kind: str) -> None:
    tokenizer = TOKENIZERS[kind]
    ids = tokenizer.encode("ok \U0001F600").ids[:-1]  # the emoji's last byte missing
    deltas = stream_text(tokenizer, ids, [1])
    assert REPLACEMENT_CHARACTER in deltas[-1]  # sent only at the end, by flush
    assert "".join(deltas) == tokenizer.decode(ids)


def test_special_tokens_are_left_out() -> None:
    tokenizer = TOKENIZERS["byte_level"]
    end = tokenizer.token_to_id("<|im_end|>")
    ids = [*tokenizer.encode("Paris").ids, end]
    assert "".join(stream_text(tokenizer, ids, [1])) == "Paris"


@functools.cache
def smollm2_tokenizer() -> Tokenizer:
    return Tokenizer.from_file(str(smollm2_dir() / "tokenizer.json"))


@pytest.mark.slow
@settings(max_examples=300, deadline=None, database=None)
@given(data=st.data())
def test_smollm2_deltas_concatenate_to_the_full_decode(data: st.DataObject) -> None:
    tokenizer = smollm2_tokenizer()
    ids = data.draw(token_streams(tokenizer), label="ids")
    steps = data.draw(st.lists(st.integers(1, 4), max_size=5), label="step sizes")
    check_stream(tokenizer, ids, steps)


def test_a_skipped_special_token_is_no_context_for_the_next_tokens_spacing() -> None:
    """Llama-style decoders strip the leading space of the first token decoded: the token
    after a skipped special one is not first, and keeps its space."""
    tokenizer = TOKENIZERS["byte_fallback"]
    end = tokenizer.token_to_id("<|im_end|>")
    ids = [*tokenizer.encode("Paris!", add_special_tokens=False).ids, end,
           *tokenizer.encode(" Rome", add_special_tokens=False).ids]
    for steps in ([1], [2], [3]):
        check_stream(tokenizer, ids, steps)
