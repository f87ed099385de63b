"""--deterministic's batched draws (the warpers on the per-row Triton softmax and cumsum,
kernels/row_reductions.py, with top-k ties in index order): every seeded or greedy row gets
the same probabilities, bit for bit, and the same token alone and inside batches of other
compositions, tied logits included; the batch is drawn in one pass, not row by row; and the
tokens are those of the per-row torch path on the same logits and seeds.

Runs in the Triton interpreter on the CPU (compiled kernels when a GPU is present).
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Sequence
from functools import partial
from typing import Any

import pytest
import torch

pytest.importorskip("triton")

from tests.kernel_device import kernel_device
from tests.runner_helpers import tiny_config
from warmgate.server.core.results import PhaseStatus
from warmgate.server.kernels import row_reductions
from warmgate.server.kernels.row_argmax import row_argmax
from warmgate.server.kernels.row_reductions import row_cumsum, row_softmax
from warmgate.server.runner.default_ops import sampler_warper_ops
from warmgate.server.runner.model_runner import ModelRunner
from warmgate.server.runner.sampling import Sampler, SeededStream, warpers
from warmgate.server.runner.sampling.seeded import make_generator
from warmgate.server.runner.sampling.warper_ops import (
    TORCH_WARPER_OPS,
    WarperOps,
    canonical_top,
    invariant_warper_ops,
)
from warmgate.server.runner.sampling.warpers import choose_tokens, probabilities
from warmgate.server.runner.scheduler_output import GREEDY, SamplingParams
from warmgate.server.warmup.determinism import run_determinism_check

DEVICE = kernel_device(row_reductions._row_softmax_kernel)
VOCAB = 1000
# 256-column chunks: a vocabulary row is 4 chunks, and top_k 300 spans two.
INVARIANT = invariant_warper_ops(partial(row_softmax, block=256),
                                 partial(row_cumsum, block=256), name="triton-256")
# The rows whose tokens must not move: every warper alone and mixed, top_k under, at and over
# a chunk, no top_k (the full sort), and greedy.
SEEDED = (
    SamplingParams(temperature=0.7, top_k=50, seed=11),
    SamplingParams(temperature=1.0, top_p=0.9, seed=12),
    SamplingParams(temperature=0.8, top_k=300, top_p=0.95, seed=13),
    SamplingParams(temperature=1.2, min_p=0.05, seed=14),
    SamplingParams(temperature=0.9, top_k=20, top_p=0.8, min_p=0.02, seed=15),
    SamplingParams(temperature=0.5, seed=16),
    SamplingParams(temperature=1.1, top_k=256, seed=17),
)
TARGETS = (*SEEDED, GREEDY)
# Companions: unseeded rows (their noise is free) with other widths, and more of the above.
COMPANIONS = (SamplingParams(temperature=1.0), SamplingParams(top_k=5),
              SamplingParams(top_k=700, top_p=0.5), SamplingParams(min_p=0.2), *TARGETS)


def _logits(rows: int, seed: int) -> torch.Tensor:
    """Random logits; every fourth row keeps a random ~10 % of the vocabulary (the rest -inf,
    as a grammar's mask leaves it)."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, VOCAB, generator=gen) * 3
    masked = torch.rand(rows, VOCAB, generator=gen) > 0.1
    masked[:, 0] = False
    x[::4] = x[::4].masked_fill(masked[::4], float("-inf"))
    return x.to(DEVICE)


def _generators(params: Sequence[SamplingParams], position: int
                ) -> list[torch.Generator | None]:
    """A fresh generator per seeded row, from its (seed, output position) alone."""
    return [make_generator(p.seed, position, torch.device(DEVICE)) if p.is_seeded and
            p.seed is not None else None for p in params]


def _batch_around(row: torch.Tensor, p: SamplingParams, size: int, pos: int,
                  rng: random.Random) -> tuple[torch.Tensor, list[SamplingParams]]:
    """`size` rows of random logits and companion parameters with (row, p) at `pos`."""
    x = _logits(size, seed=rng.randrange(1 << 30))
    x[pos] = row
    params = [rng.choice(COMPANIONS) for _ in range(size)]
    params[pos] = p
    return x, params


@pytest.mark.parametrize("target", range(len(TARGETS)))
def test_a_row_draws_the_same_bits_alone_and_in_batches_of_any_composition(
        target: int) -> None:
    p = TARGETS[target]
    row = _logits(4, seed=target)[target % 4]  # the -inf-masked row for target 0 and 4
    alone_probs = probabilities(row[None].clone(), [p], INVARIANT)[0]
    alone = choose_tokens(row[None].clone(), [p], _generators([p], 3), True, INVARIANT)
    rng = random.Random(target)
    for size in (3, 8):
        for pos in sorted({0, size // 2, size - 1}):
            x, params = _batch_around(row, p, size, pos, rng)
            probs = probabilities(x, params, INVARIANT)
            # A greedy row's token is its argmax, whatever the warpers made of it.
            assert p.is_greedy or torch.equal(probs[pos], alone_probs), (
                f"{p} at {pos} of {size}: max |diff| "
                f"{(probs[pos] - alone_probs).abs().max().item():.3g}")
            tokens = choose_tokens(x, params, _generators(params, 3), True, INVARIANT)
            assert int(tokens[pos]) == int(alone[0]), f"{p} at {pos} of {size}"


def test_tied_logits_keep_the_same_tokens_whatever_the_top_k_width() -> None:
    """bf16 logits tie often. A row whose k-th and (k+1)-th values tie keeps the same one of
    them, so the same probabilities, whether the batch's top-k width is its own k, a
    companion's larger k or the whole vocabulary (a companion without top_k)."""
    gen = torch.Generator().manual_seed(21)
    x = ((torch.randn(2, VOCAB, generator=gen) * 4).round() / 4).to(DEVICE)  # steps of 0.25
    targets = [SamplingParams(temperature=0.9, top_k=20, top_p=0.9, seed=1),
               SamplingParams(temperature=0.7, top_k=50, seed=2)]
    companions = [SamplingParams(top_k=300), SamplingParams(top_p=0.95), SamplingParams()]
    for row, p in zip(x, targets, strict=True):
        ranked = row.sort(descending=True).values
        assert ranked[p.top_k - 1] == ranked[p.top_k]  # the tie the test is about
        alone = probabilities(row[None].clone(), [p], INVARIANT)[0]
        for other in companions:
            both = probabilities(torch.stack([x[0], row]), [other, p], INVARIANT)[1]
            assert torch.equal(both, alone), f"{p} beside {other}"
            assert int((both > 0).sum()) <= p.top_k


def test_the_batched_path_picks_the_per_row_paths_tokens() -> None:
    """The same distribution semantics: on random logits (no ties) the one-pass draw on the
    per-row kernels and the per-row torch draw agree on every seeded and greedy row, over
    several output positions (several noises)."""
    rng = random.Random(5)
    params = [*TARGETS, *TARGETS, SamplingParams(top_k=5), SamplingParams(temperature=1.0)]
    rng.shuffle(params)
    compared = differing = 0
    for position in range(6):
        x = _logits(len(params), seed=100 + position)
        batched = choose_tokens(x, params, _generators(params, position), True, INVARIANT)
        per_row = choose_tokens(x, params, _generators(params, position), True,
                                TORCH_WARPER_OPS)
        for i, p in enumerate(params):
            if p.is_seeded or p.is_greedy:
                compared += 1
                differing += int(batched[i]) != int(per_row[i])
    assert compared == 6 * 2 * len(TARGETS) and differing == 0


def test_the_batched_path_draws_all_rows_in_one_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    """With batch-invariant warper ops, sample() and verify() reach `probabilities` once with
    every drawn row (the per-row loop is what they replace); torch's still go row by row."""
    calls: list[tuple[int, str]] = []
    real = warpers.probabilities

    def spy(x: torch.Tensor, params: Any, ops: WarperOps) -> torch.Tensor:
        calls.append((x.shape[0], ops.name))
        return real(x, params, ops)

    monkeypatch.setattr(warpers, "probabilities", spy)
    params = [SEEDED[0], GREEDY, SEEDED[2], SamplingParams(temperature=1.0)]
    streams = [SeededStream(p.seed, 0) if p.seed is not None else None for p in params]
    x = _logits(4, seed=7)
    Sampler(row_wise=True, warper_ops=INVARIANT).sample(x, params, streams)
    assert calls == [(4, "triton-256")]
    calls.clear()
    Sampler(row_wise=True, warper_ops=INVARIANT).verify(
        _logits(6, seed=8), [[1], [], [2, 3]], params[:3], streams[:3])
    assert calls == [(6, "triton-256")]
    calls.clear()
    Sampler(row_wise=True).sample(x, params, streams)
    assert calls == [(1, "torch")] * 3  # three drawn rows, each alone


def test_sampler_warper_ops_follow_the_ops_choice() -> None:
    """The per-row kernels only under --deterministic where the ops are Triton (CUDA with a
    GPU backend); torch's otherwise, and the CPU's --deterministic keeps its per-row loop.
    The chunked argmax wherever the ops are Triton, in both modes."""
    base = tiny_config()
    det = dataclasses.replace(base, numerics=dataclasses.replace(base.numerics,
                                                                 deterministic=True))

    def on(config: Any, device: str, backend: str) -> Any:
        return dataclasses.replace(config, device=dataclasses.replace(
            config.device, device=device, attention_backend=backend))

    assert sampler_warper_ops(base) is TORCH_WARPER_OPS
    assert sampler_warper_ops(on(base, "cuda", "torch")) is TORCH_WARPER_OPS
    assert sampler_warper_ops(on(det, "cpu", "torch")) is TORCH_WARPER_OPS
    default_gpu = sampler_warper_ops(on(base, "cuda", "triton"))
    assert default_gpu.argmax is row_argmax and not default_gpu.batch_invariant
    assert default_gpu.softmax is TORCH_WARPER_OPS.softmax
    chosen = sampler_warper_ops(on(det, "cuda", "flashinfer"))
    assert chosen.batch_invariant and chosen.softmax is row_softmax
    assert chosen.cumsum is row_cumsum and chosen.top is canonical_top
    assert chosen.argmax is row_argmax
    # What the runner gets runs the draw batched with the kernels' own chunk size.
    params = [SEEDED[2], GREEDY, SEEDED[4]]
    x = _logits(3, seed=9)
    alone = choose_tokens(x[2:].clone(), params[2:], _generators(params[2:], 0), True, chosen)
    both = choose_tokens(x, params, _generators(params, 0), True, chosen)
    assert int(both[2]) == int(alone[0]) and int(both[1]) == int(x[1].argmax())


def test_the_determinism_phase_passes_with_batched_draws(monkeypatch: pytest.MonkeyPatch
                                                       ) -> None:
    """End to end, with drafts (k = 3): the warmup's probes (greedy and seeded) give the same
    tokens and logprobs alone and inside busy batches when the runner's sampler draws its
    rows together on the per-row kernels, as it does on CUDA."""
    backend = "torch" if DEVICE == "cpu" else "triton"  # CUDA refuses torch attention here
    c = tiny_config(num_spec=3, device=DEVICE, attention_backend=backend)
    runner = ModelRunner(dataclasses.replace(c, numerics=dataclasses.replace(
        c.numerics, deterministic=True)))
    runner.sampler = Sampler(log_softmax=runner.ops.log_softmax, row_wise=True,
                             warper_ops=INVARIANT)
    drawn: list[int] = []
    real = warpers.probabilities

    def spy(x: torch.Tensor, params: Any, ops: WarperOps) -> torch.Tensor:
        drawn.append(x.shape[0])
        return real(x, params, ops)

    monkeypatch.setattr(warpers, "probabilities", spy)
    phase = run_determinism_check(runner, runner.execute_model, runner.sample_tokens)
    assert phase.status is PhaseStatus.RAN, phase.detail
    assert max(drawn) > 1  # some steps drew several rows in one pass
