"""devtools.steady_window: the window of a closed-loop run in which every stream is busy."""

from __future__ import annotations

import pytest

from warmgate.server.devtools.load_stats import RequestResult
from warmgate.server.devtools.steady_window import steady_window


def _stream(index: int, sent: float, first: float, gap: float, tokens: int) -> RequestResult:
    """A request sent at `sent` whose tokens arrive one a message from `first`, `gap` apart."""
    r = RequestResult(index, sent_s=sent)
    r.messages = [(first + i * gap, 1) for i in range(tokens)]
    r.finish_s = r.messages[-1][0]
    return r


def _closed_loop() -> list[RequestResult]:
    """Two streams, two requests each: stream A's requests 0 and 2, stream B's 1 and 3; B's
    first request starts decoding late (its prefill waited behind A's)."""
    a0 = _stream(0, 0.0, 1.0, 1.0, 4)  # tokens at 1, 2, 3, 4
    b0 = _stream(1, 0.0, 2.5, 1.0, 4)  # 2.5 .. 5.5
    a1 = _stream(2, 4.0, 5.0, 1.0, 4)  # 5 .. 8: goes when a0 finishes
    b1 = _stream(3, 5.5, 6.5, 1.0, 4)  # 6.5 .. 9.5
    return [a0, b0, a1, b1]


def test_the_window_runs_from_the_last_first_token_to_the_first_finish_with_none_queued() -> None:
    window = steady_window(_closed_loop(), streams=2)
    assert window is not None
    # Starts when b0 has its first token; a0's finish (4) let a1 go, b0's (5.5) let b1 go,
    # a1's (8) lets nobody go: the drain starts there.
    assert (window.start_s, window.end_s) == (2.5, 8.0)
    # Tokens arriving in (2.5, 8]: a0 at 3, 4; b0 at 3.5, 4.5, 5.5; a1 at 5..8; b1 at 6.5, 7.5.
    assert window.output_tokens == 2 + 3 + 4 + 2
    assert window.tokens_per_s == pytest.approx(11 / 5.5)
    # Gaps with both ends inside [2.5, 8]: a0 3->4; b0 three; a1 three; b1 6.5->7.5. The
    # prefill wait of a request (sent -> first token) is not a gap between tokens.
    assert window.itl_s.count == 1 + 3 + 3 + 1
    assert window.itl_s.max == pytest.approx(1.0)


def test_gaps_count_once_per_token_of_the_later_message() -> None:
    runs = _closed_loop()
    runs[3].messages = [(6.5, 1), (7.5, 2)]  # two tokens in one message, a gap of 1 s
    window = steady_window(runs, streams=2)
    assert window is not None
    assert window.itl_s.count == 1 + 3 + 3 + 2
    assert window.itl_s.p50 == pytest.approx(1.0)
    assert window.itl_s.mean == pytest.approx((7 * 1.0 + 2 * 0.5) / 9)


def test_a_burst_or_an_unfinished_run_has_no_steady_window() -> None:
    runs = _closed_loop()
    assert steady_window(runs[:2], streams=2) is None  # one request a stream: no loop
    runs[3].finish_s = None  # a stream that never finished: no end to read
    assert steady_window(runs, streams=2) is None
    with pytest.raises(ValueError, match="streams"):
        steady_window(runs, streams=0)
