"""The sampling options on CUDA: the batched logits processors, min_p, the logprobs gather and
the greedy choice give the CPU's results on the same logits, and a warmed runner serving a
request with each option (mixed with plain ones, with and without speculation) compiles
nothing and misses no CUDA graph after ready."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest
import torch

from tests.gpu.warmed import warmed_cuda_runner
from tests.runner_helpers import prompt
from tests.serving_helpers import Served, greedy
from warmgate.server.jit.events import CUDA_GRAPH_MISS, JitEvent
from warmgate.server.runner.sampling import Sampler, TokenHistory, gather_logprobs
from warmgate.server.runner.sampling.processors import apply_logits_processors
from warmgate.server.runner.sampling.rows import SamplingRows
from warmgate.server.runner.sampling.warpers import min_p_filter
from warmgate.server.runner.scheduler_output import GREEDY, SamplingParams

pytestmark = pytest.mark.gpu
VOCAB = 32000
CUDA = torch.device("cuda")
CPU = torch.device("cpu")
# Element-wise float32 operations give the same bits on both devices; the reductions
# (softmax in min_p, log_softmax) may sum in another order.
ATOL = 1e-5
# log_softmax over 32000 logits sums in another order on each device.
LOGPROB_ATOL = 1e-4


def _params(rng: random.Random) -> SamplingParams:
    base = rng.choice([GREEDY, SamplingParams(temperature=0.8)])
    if rng.random() < 0.3:
        return base  # plain rows between the featured ones
    return replace(base, presence_penalty=rng.uniform(-2, 2),
                   frequency_penalty=rng.choice([0.0, rng.uniform(-2, 2)]),
                   repetition_penalty=rng.choice([1.0, 1.3, 0.8]),
                   min_tokens=rng.choice([0, 1000]), stop_token_ids=(1, 2),
                   logit_bias=tuple(sorted({rng.randrange(VOCAB): rng.uniform(-100, 100)
                                            for _ in range(5)}.items())))


def _history(rng: random.Random) -> TokenHistory:
    prompt_ids = [rng.randrange(VOCAB) for _ in range(rng.randrange(1, 200))]
    return TokenHistory(prompt_ids, [rng.choice(prompt_ids) for _ in range(rng.randrange(60))])


@pytest.mark.parametrize("seed", range(3))
def test_batched_processors_on_cuda_equal_the_cpu(seed: int) -> None:
    rng = random.Random(seed)
    n = 64
    params = [_params(rng) for _ in range(n)]
    hist = [_history(rng) for _ in range(n)]
    logits = torch.randn(n, VOCAB, generator=torch.Generator().manual_seed(seed)) * 5
    cpu = apply_logits_processors(logits, SamplingRows.of(params, hist, CPU))
    gpu = apply_logits_processors(logits.to(CUDA), SamplingRows.of(params, hist, CUDA))
    torch.testing.assert_close(gpu.cpu(), cpu, atol=ATOL, rtol=0)
    min_p = torch.tensor([rng.choice([0.0, 0.05, 0.5]) for _ in range(n)])
    torch.testing.assert_close(min_p_filter(cpu.to(CUDA), min_p.to(CUDA)).cpu(),
                               min_p_filter(cpu, min_p), atol=ATOL, rtol=0)
    greedy_params = [replace(p, temperature=0.0) for p in params]
    assert torch.equal(Sampler().sample(logits.to(CUDA), greedy_params, [None] * n,
                                        hist).cpu(),
                       Sampler().sample(logits, greedy_params, [None] * n, hist))
    tokens = [rng.randrange(VOCAB) for _ in range(n)]
    top = [rng.choice([0, 5, 20]) for _ in range(n)]
    want = gather_logprobs(logits, range(n), tokens, top)
    got = gather_logprobs(logits.to(CUDA), range(n), tokens, top)
    for w, g in zip(want, got, strict=True):
        assert g.token_id == w.token_id
        assert g.logprob == pytest.approx(w.logprob, abs=LOGPROB_ATOL)
        # A token within a rounding of the chosen one's logprob may count on one device
        # and not the other.
        assert abs(g.rank - w.rank) <= 2
        assert [t for t, _ in g.top] == [t for t, _ in w.top]


def test_verify_with_processors_on_cuda_equals_the_cpu() -> None:
    rng = random.Random(5)
    k, r = 3, 16
    params = [replace(_params(rng), temperature=0.0) for _ in range(r)]
    hist = [_history(rng) for _ in range(r)]
    logits = torch.randn(r * (k + 1), VOCAB, generator=torch.Generator().manual_seed(5))
    drafts = [[rng.randrange(VOCAB) for _ in range(k)] for _ in range(r)]
    want = Sampler().verify(logits, drafts, params, [None] * r, hist)
    assert Sampler().verify(logits.to(CUDA), drafts, params, [None] * r, hist) == want


def _featured() -> list[SamplingParams]:
    g = greedy(24)
    s = replace(g, temperature=0.8, top_k=20, seed=7)
    return [replace(s, logprobs=5), replace(g, prompt_logprobs=3),
            replace(s, presence_penalty=0.5), replace(g, frequency_penalty=0.5),
            replace(s, repetition_penalty=1.2), replace(s, min_p=0.1),
            replace(g, min_tokens=12, stop_token_ids=(1, 2)),
            replace(g, logit_bias=((5, 3.0), (6, -100.0)))]


@pytest.mark.parametrize("backend", ["triton", "flashinfer"])
@pytest.mark.parametrize("num_spec", [0, 3])
def test_requests_with_each_option_compile_nothing_after_warmup(backend: str,
                                                                num_spec: int) -> None:
    pytest.importorskip(backend)
    runner, monitor, report = warmed_cuda_runner(backend, num_spec)
    assert "logit_bias" in report.phase("kernels.sampler").shapes["sampler_paths"]
    late: list[JitEvent] = []
    monitor.add_listener(lambda e: late.append(e) if e.after_ready and (
        e.compiled or e.kind == CUDA_GRAPH_MISS) else None)
    featured = _featured()
    # Each option first alone (a request that first uses it), then all of them at once beside
    # plain requests.
    for i, params in enumerate(featured):
        served = Served(runner)
        req = served.submit(f"alone{i}", prompt(5 + 9 * i, offset=i), params)
        served.run()
        assert len(req.output_token_ids) == 24 or params.min_tokens
    served = Served(runner)
    reqs = [served.submit(f"r{i}", prompt(3 + 7 * i, offset=i), p)
            for i, p in enumerate([*featured, greedy(24), greedy(24)])]
    served.run()
    monitor.close()
    assert all(r.output_token_ids for r in reqs)
    assert not late, [e.describe() for e in late]
