"""bench/warm.py served: random Generate requests with every sampling option against a real
server, what it counted after ready, and first/steady TTFT."""

from __future__ import annotations

import random

import pytest

from tests.bench_harness import load_script, run_bench

served = load_script("bench/lib/served_coverage.py")

METRICS = """\
warmgate_jit_compiles_total{after_ready="false",kind="triton",rank="0"} 12.0
warmgate_jit_compiles_total{after_ready="true",kind="triton",rank="0"} 1.0
warmgate_jit_compiles_total{after_ready="true",kind="autotune",rank="0"} 2.0
warmgate_jit_compiles_total{after_ready="true",kind="autotune",rank="1"} 1.0
warmgate_jit_compiles_total{after_ready="true",kind="inductor",rank="0"} 0.0
warmgate_cuda_graph_misses_total{after_ready="false",rank="0"} 4.0
warmgate_cuda_graph_misses_total{after_ready="true",rank="0"} 3.0
"""


def test_after_ready_counts_each_kind_over_ranks_and_ignores_before_ready() -> None:
    counted = served.after_ready(METRICS)
    assert counted.compiles == {"autotune": 3, "triton": 1}
    assert counted.graph_misses == 3 and counted.total == 7
    assert served.after_ready(METRICS.replace('"true"', '"false"')).total == 0


def test_the_drawn_requests_use_every_sampling_option() -> None:
    requests = served.draw_requests(random.Random(0), 200, vocab=512, max_prompt=64,
                                    max_tokens=16)
    used = {o for _, kw in requests for o in served.options_used(kw)}
    assert used == {"greedy", "random", "seeded", "logprobs", "prompt_logprobs",
                    "repetition_penalty", "top_p", "presence_penalty", "frequency_penalty",
                    "min_p", "min_tokens", "logit_bias", "top_k"}
    assert all(1 <= len(p) <= 64 and kw["max_tokens"] >= kw["min_tokens"]
               for p, kw in requests)


@pytest.mark.slow
def test_a_real_server_serves_the_workload_with_nothing_after_ready() -> None:
    proc = run_bench("bench/warm.py", [
        "served", "--requests", "40", "--max-concurrency", "8", "--repeats", "2",
        "--gap-s", "0.01", "--server-args", "--model tiny --device cpu"], timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = {line.split(":")[0]: line for line in proc.stdout.splitlines() if ":" in line}
    assert "first/steady" in lines["ttft"]
    # Each of the 3 timed requests at the client and at the server (its own clock), the
    # server's time to first token inside the client's.
    client, server = (part.split()[1:] for part in
                      lines["ttft samples ms"].split(": ", 1)[1].split("; "))
    assert len(client) == len(server) == 3
    assert all(0 < float(s) < float(c) for c, s in zip(client, server, strict=True))
    # Each one's queue (arrival to its first scheduled step) inside the server's TTFT.
    queue = lines["ttft server queue ms"].split(": ", 1)[1].split()
    assert len(queue) == 3
    assert all(0 <= float(q) < float(s) for q, s in zip(queue, server, strict=True))
    assert "40 requests" in lines["workload"] and "errors 0" in lines["workload"]
    assert lines["after_ready"] == "after_ready: compiles 0 (none) graph_misses 0"
