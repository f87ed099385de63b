"""--deterministic end to end on the CPU, through the serving scheduler and loop: greedy and
seeded probes give the same tokens and logprobs alone (k = 0, a roomy server) and inside a
random busy workload (mixed prefill and decode, chunked prompts, preemption forced by a
small KV cache) for k = 0, 1 and 3; on `tiny` and on a SmolLM2-135M-shaped random model.
The default mode, same workload, differs somewhere."""

from __future__ import annotations

import dataclasses
import random
from typing import Any

import pytest

from tests.runner_helpers import tiny_config
from tests.serving_helpers import Served
from warmgate.server.config.rope_config import RopeConfig
from warmgate.server.config.runner_config import RunnerConfig
from warmgate.server.runner.model_runner import ModelRunner
from warmgate.server.runner.scheduler_output import SamplingParams

# SmolLM2-135M's widths (config.json of HuggingFaceTB/SmolLM2-135M), two of its 30 layers.
SMOLLM2_SHAPED: dict[str, Any] = dict(
    vocab_size=49152, hidden_size=576, num_layers=2, num_heads=9, num_kv_heads=3, head_dim=64,
    intermediate_size=1536, tie_word_embeddings=True, rms_norm_eps=1e-5,
    rope=RopeConfig(theta=100000.0))
MODELS = {"tiny": {}, "smollm2-shaped": SMOLLM2_SHAPED}
# The SmolLM2-shaped runs take most of this file's time: slow, run with --slow (and in CI).
HEAVY_SLOW = ["tiny", pytest.param("smollm2-shaped", marks=pytest.mark.slow)]
NEW_TOKENS = 10
Outputs = dict[str, list[tuple[int, float]]]


def config(model: str, deterministic: bool, **kw: Any) -> RunnerConfig:
    c = tiny_config(max_model_len=96, **{**MODELS[model], **kw})
    return dataclasses.replace(c, numerics=dataclasses.replace(c.numerics,
                                                               deterministic=deterministic))


def probes(vocab: int) -> dict[str, tuple[list[int], SamplingParams]]:
    rng = random.Random(7)
    out = {}
    for i, n in enumerate((9, 23, 14, 31)):
        cycle = [rng.randrange(vocab) for _ in range(5)]  # repeats, so n-grams draft
        prompt = [cycle[j % 5] if j % 3 else rng.randrange(vocab) for j in range(n)]
        params = (SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, logprobs=2) if i % 2
                  else SamplingParams(temperature=0.8, top_p=0.9, seed=1000 + i,
                                      max_tokens=NEW_TOKENS, logprobs=2))
        out[f"probe{i}"] = (prompt, params)
    return out


def served_outputs(served: Served, reqs: dict[str, tuple[list[int], SamplingParams]]
                   ) -> tuple[Outputs, int]:
    """Submit reqs, run to the end: each probe's (token, logprob) and the preemptions."""
    handles = {rid: served.submit(rid, p, sp) for rid, (p, sp) in reqs.items()}
    served.run()
    out = {rid: [(lp.token_id, lp.logprob) for e in served.events if e.req_id == rid
                 for lp in e.logprobs] for rid in reqs if rid.startswith("probe")}
    for rid, toks in out.items():
        assert [t for t, _ in toks] == handles[rid].output_token_ids
    return out, sum(h.usage.num_preemptions for h in handles.values())


def alone(model: str, deterministic: bool) -> Outputs:
    """Each probe in a server of its own, k = 0."""
    out: Outputs = {}
    for rid, req in probes(MODELS[model].get("vocab_size", 512)).items():
        served = Served(ModelRunner(config(model, deterministic)))
        out.update(served_outputs(served, {rid: req})[0])
    return out


def busy(model: str, deterministic: bool, k: int, seed: int) -> tuple[Outputs, int]:
    """The probes among random companions, in random order, in a server whose KV cache
    cannot hold them all (preemption) and whose token budget chunks the prompts."""
    vocab = MODELS[model].get("vocab_size", 512)
    rng = random.Random(seed)
    reqs = dict(probes(vocab))
    for i in range(8):
        n = rng.randrange(1, 60)
        params = rng.choice([SamplingParams(temperature=0.0, max_tokens=rng.randrange(1, 20)),
                             SamplingParams(temperature=1.0, max_tokens=rng.randrange(1, 20),
                                            logprobs=1),
                             SamplingParams(temperature=0.7, seed=rng.randrange(99),
                                            max_tokens=rng.randrange(1, 20))])
        reqs[f"c{i}"] = ([rng.randrange(vocab) for _ in range(n)], params)
    order = list(reqs)
    rng.shuffle(order)
    served = Served(ModelRunner(config(model, deterministic, num_spec=k, num_blocks=40,
                                       max_num_batched_tokens=24, max_num_seqs=6)))
    return served_outputs(served, {rid: reqs[rid] for rid in order})


@pytest.mark.parametrize("model", HEAVY_SLOW)
def test_deterministic_outputs_match_alone_inside_busy_batches_and_across_k(model: str) -> None:
    reference = alone(model, deterministic=True)
    preemptions = 0
    for k in (0, 1, 3):
        got, preempted = busy(model, deterministic=True, k=k, seed=k)
        preemptions += preempted
        for rid, ref in reference.items():
            assert got[rid] == ref, f"{rid}, k={k}: differs from its output alone"
    assert preemptions > 0  # the small KV cache did force the preemption path


@pytest.mark.parametrize("model", HEAVY_SLOW)
def test_the_default_mode_differs_on_the_same_workload(model: str) -> None:
    reference = alone(model, deterministic=False)
    got, _ = busy(model, deterministic=False, k=0, seed=0)
    assert any(got[rid] != ref for rid, ref in reference.items())
