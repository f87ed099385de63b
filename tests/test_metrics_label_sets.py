"""Labelled counters exist at 0 from start-up, so ratios and increase() have a series to read
(a pod whose compile-cache lookups all missed still shows a 0 % hit ratio, not No data)."""

from __future__ import annotations

from prometheus_client import generate_latest

from warmgate.server.serving.loop import STEP_KINDS
from warmgate.server.telemetry.metrics import CACHES, COMPILE_KINDS, Metrics
from warmgate.server.telemetry.serving_metrics import (
    FINISH_REASONS,
    GRAMMAR_COMPILE_OUTCOMES,
    REQUEST_FEATURES,
)


def test_known_label_sets_are_exported_at_zero_before_any_event() -> None:
    text = generate_latest(Metrics().registry).decode()
    for cache in CACHES:
        assert f'warmgate_compile_cache_hits_total{{cache="{cache}"}} 0.0' in text
        assert f'warmgate_compile_cache_misses_total{{cache="{cache}"}} 0.0' in text
    for kind in COMPILE_KINDS:
        for after_ready in ("true", "false"):
            assert (f'warmgate_jit_compiles_total{{after_ready="{after_ready}",kind="{kind}",'
                    'rank="0"} 0.0') in text
    for after_ready in ("true", "false"):
        for name in ("warmgate_cuda_graph_misses_total", "warmgate_communicator_setups_total"):
            assert f'{name}{{after_ready="{after_ready}",rank="0"}} 0.0' in text
    for reason in FINISH_REASONS:
        assert f'warmgate_generate_requests_total{{finish_reason="{reason}"}} 0.0' in text
    for feature in REQUEST_FEATURES:
        assert f'warmgate_generate_request_features_total{{feature="{feature}"}} 0.0' in text
    for outcome in GRAMMAR_COMPILE_OUTCOMES:
        assert f'warmgate_grammar_compile_seconds_count{{outcome="{outcome}"}} 0.0' in text
    for kind in STEP_KINDS:
        assert f'warmgate_step_duration_seconds_count{{kind="{kind}"}} 0.0' in text
        assert f'warmgate_step_prompt_tokens_total{{kind="{kind}"}} 0.0' in text


def test_every_tensor_parallel_rank_has_its_jit_series_at_zero() -> None:
    text = generate_latest(Metrics(tensor_parallel_size=3).registry).decode()
    for rank in ("0", "1", "2"):
        for name in ("warmgate_cuda_graph_misses_total", "warmgate_communicator_setups_total"):
            assert f'{name}{{after_ready="true",rank="{rank}"}} 0.0' in text
        assert (f'warmgate_jit_compiles_total{{after_ready="true",kind="triton",rank="{rank}"}} '
                "0.0") in text
    assert 'rank="3"' not in text
