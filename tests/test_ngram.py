"""The n-gram drafter proposes what a scan of the whole context would, whether its tokens came
one at a time (decode steps) or in bulk (a prompt, through numpy's windows)."""

from __future__ import annotations

import random

import pytest

from warmgate.server.serving.ngram import BULK_MIN_TOKENS, NgramIndex


def scan_proposal(tokens: list[int], min_n: int, max_n: int, k: int) -> list[int]:
    """The reference: for n from max_n down, the latest earlier end of the current n-gram
    suffix, and the k tokens that followed it (the stretch repeated when it is short)."""
    end = len(tokens) - 1
    for n in range(max_n, min_n - 1, -1):
        if end + 1 < n:
            continue
        suffix = tokens[end + 1 - n:]
        for prev in range(end - 1, n - 2, -1):
            if tokens[prev + 1 - n:prev + 1] == suffix:
                return [tokens[prev + 1 + i % (end - prev)] for i in range(k)]
    return []


@pytest.mark.parametrize("seed", range(12))
def test_proposals_match_a_scan_of_the_context(seed: int) -> None:
    rng = random.Random(seed)
    min_n = rng.randint(1, 3)
    max_n = rng.randint(min_n, 5)
    vocab = rng.choice([3, 8, 50, 70000])  # few ids repeat often; 70000 needs all 4 bytes
    index, tokens = NgramIndex(min_n, max_n), []
    bulks = 0
    for _ in range(30):
        size = rng.choice([1, 1, 2, 4, BULK_MIN_TOKENS, 100])
        chunk = [rng.randrange(vocab) for _ in range(size)]
        index.extend(chunk)
        tokens.extend(chunk)
        bulks += size >= BULK_MIN_TOKENS
        for k in (1, 3, 7):
            assert index.propose(k) == scan_proposal(tokens, min_n, max_n, k), (k, len(tokens))
    assert bulks and index.tokens == tokens


def test_a_bulk_prompt_and_one_token_at_a_time_index_the_same() -> None:
    rng = random.Random(5)
    prompt = [rng.randrange(20) for _ in range(500)]
    bulk, single = NgramIndex(1, 4), NgramIndex(1, 4)
    bulk.extend(prompt)
    for token in prompt:
        single.extend([token])
    assert bulk._last_end == single._last_end and bulk._match == single._match
    for token in [3, 4, 3, 4, 3]:
        bulk.extend([token])
        single.extend([token])
        assert bulk.propose(4) == single.propose(4)
