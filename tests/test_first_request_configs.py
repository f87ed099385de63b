"""bench/warm.py first-request --mode configs: random server configurations, each on a fresh
server, the first request after ready against steady ones."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from tests.bench_harness import load_script, run_bench

configs = load_script("bench/lib/first_request_configs.py")


@pytest.mark.parametrize("seed", range(20))
def test_drawn_configurations_stay_in_their_ranges_and_fit_their_prompt(seed: int) -> None:
    shape = configs.draw_shape(random.Random(seed), max_tokens=16, model_len_cap=4096)
    assert configs.K_RANGE[0] <= shape.k <= configs.K_RANGE[1]
    assert configs.SEQS_RANGE[0] <= shape.max_num_seqs <= configs.SEQS_RANGE[1]
    assert configs.BUDGET_RANGE[0] <= shape.max_num_batched_tokens <= configs.BUDGET_RANGE[1]
    assert configs.MODEL_LEN_RANGE[0] <= shape.max_model_len <= 4096
    assert shape.block_size in configs.BLOCK_SIZES
    # The prompt, its output and a step's drafts fit the model length.
    assert 1 <= shape.prompt_len <= shape.max_model_len - 16 - configs.K_RANGE[1] - 1


def test_a_fixed_configuration_parses_and_a_wrong_one_is_refused() -> None:
    shape = configs.parse_shape("3 69 6603 12665 16 392")
    assert shape.flags() == ["--num-speculative-steps", "3", "--max-num-seqs", "69",
                             "--max-num-batched-tokens", "6603", "--max-model-len", "12665",
                             "--block-size", "16"]
    with pytest.raises(Exception, match="six integers"):
        configs.parse_shape("3 69")


@pytest.mark.slow
def test_random_configurations_on_tiny_print_the_worst_first(tmp_path: Path) -> None:
    out = tmp_path / "results.json"
    proc = run_bench("bench/warm.py", [
        "first-request", "--mode", "configs", "--model", "tiny", "--device", "cpu",
        "--backends", "torch", "--configs", "2", "--repeats", "2", "--max-tokens", "4",
        "--gap-s", "0.01", "--max-model-len-cap", "2048", "--json", str(out)], timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = json.loads(out.read_text())
    assert len(rows) == 2
    assert all(r["compiles_after_ready"] == 0 and r["graph_misses_after_ready"] == 0
               and len(r["steady"]) == 2 and r["ttft_ratio"] > 0 for r in rows)
    table = proc.stdout[proc.stdout.index("backend "):].splitlines()
    ratios = [float(line.split()[-6]) for line in table[1:3]]
    assert ratios == sorted(ratios, reverse=True)  # the worst first
    assert table[3].startswith("torch: 2 configurations; first/steady TTFT worst ")


@pytest.mark.slow
def test_a_configuration_whose_server_fails_is_reported_and_the_run_exits_1() -> None:
    proc = run_bench("bench/warm.py", [
        "first-request", "--mode", "configs", "--model", "tiny", "--device", "cpu",
        "--backends", "torch", "--configs", "1", "--config", "0 4 256 512 0 8",
        "--repeats", "1", "--max-tokens", "4", "--gap-s", "0.01"], timeout=300)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "FAILED:" in proc.stdout and "failed: torch k=0" in proc.stdout


class _Message:
    def __init__(self, token_ids: list[int]) -> None:
        self.token_ids = token_ids


class _Client:
    """Generate's stream as a loaded reader gets it: the tokens in the messages given."""

    def __init__(self, messages: list[list[int]]) -> None:
        self.messages = messages

    def generate(self, prompt: list[int], **kwargs: object) -> list[_Message]:
        return [_Message(ids) for ids in self.messages]


def test_a_stream_coalesced_into_one_message_times_no_decode_step() -> None:
    coalesced = configs.timed_request(_Client([[1, 2, 3, 4]]), [5], 4, 10)
    assert coalesced.ttft_s > 0 and coalesced.decode_step_s != coalesced.decode_step_s  # NaN
    spread = configs.timed_request(_Client([[1], [2, 3], [4]]), [5], 4, 10)
    assert spread.decode_step_s > 0
    shape = configs.parse_shape("0 4 256 512 16 8")
    result = configs.ConfigResult("torch", shape, 1.0, spread, [coalesced, spread])
    assert result.steady_step_s == spread.decode_step_s  # the untimed one left out
    untimed = configs.ConfigResult("torch", shape, 1.0, spread, [coalesced, coalesced])
    lines = configs.report([untimed, result])
    assert lines[-1].startswith("torch: 2 configurations; first/steady TTFT worst ")
    assert "decode step worst 1.00, median 1.00" in lines[-1]
