"""Issue 20 on the GPU: the profiler probe of the sampler rows' kernel map, the GEMM sweep's
coverage of every GEMM a forward runs outside a graph after ready, and the staged weight reader
(pinned slices, side stream) into CUDA tensors."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import save_file

from tests.gpu.warmed import tiny_cuda_config
from tests.runner_helpers import MiniScheduler, make_runner, prompt
from tests.test_eager_padding import traffic
from warmgate.server.config.weight_files import read_header
from warmgate.server.runner.attention import backend_available
from warmgate.server.runner.eager_tokens import EAGER_TOKEN_GRANULE
from warmgate.server.runner.model_runner import ModelRunner
from warmgate.server.runner.weight_stream import stream_into
from warmgate.server.warmup import run_warmup_plan
from warmgate.server.warmup.gemm_shapes import gemm_plan, gemm_sweep
from warmgate.server.warmup.kernel_probe import covering_sizes
from warmgate.server.warmup.sampler_rows import sampler_sweeps, sweep_sampler_rows
from warmgate.server.warmup.size_sweeps import profile_sweep

pytestmark = pytest.mark.gpu


def test_the_profiler_sees_each_m_and_few_first_launches() -> None:
    weight = torch.randn(6144, 2048, device="cuda", dtype=torch.bfloat16)
    signatures = profile_sweep(gemm_sweep(weight, 512))
    assert len(signatures) == 512
    assert all(signatures), "every M launched at least one kernel"
    sizes = covering_sizes(signatures)
    assert sizes[0] == 1 and len(sizes) < 512 // 4, sizes
    # Deterministic: a second profile makes the same choices.
    assert covering_sizes(profile_sweep(gemm_sweep(weight, 512))) == sizes


def _cuda_runner(backend: str, num_spec: int, sizes: tuple[int, ...] | None = None
                 ) -> ModelRunner:
    if not backend_available(backend):
        pytest.skip(f"{backend} is not installed")
    return ModelRunner(tiny_cuda_config(backend, num_spec, sizes, num_blocks=512))


def _warm_runner(backend: str, num_spec: int, sizes: tuple[int, ...] | None) -> ModelRunner:
    runner = _cuda_runner(backend, num_spec, sizes)
    report = run_warmup_plan(runner)
    assert report.succeeded, [p.detail for p in report.phases]
    return runner


def _random_traffic(runner: ModelRunner, num_spec: int, rounds: int = 12) -> None:
    """Rounds of 1..max_num_seqs new requests of random lengths, prefilled in random chunks
    beside the ones already decoding, then decoded with drafts."""
    sched = MiniScheduler(runner)
    rng = random.Random(0)
    for r in range(rounds):
        ids = [f"r{r}_{i}" for i in range(rng.randint(1, runner.max_num_reqs))]
        for i, rid in enumerate(ids):
            sched.add(rid, prompt(rng.randint(1, 40), offset=i))
        while True:
            left = {rid: max(0, sched.reqs[rid].remaining_prompt) for rid in ids}
            if not any(left.values()):
                break
            sched.step({rid: min(n, rng.randint(1, 24)) if n else 1 + num_spec
                        for rid, n in left.items()},
                       drafts={rid: [3] * num_spec for rid, n in left.items() if not n})
        for _ in range(2):
            sched.step(drafts={rid: [3] * num_spec for rid in ids})
        for rid in ids:
            sched.finish(rid)


@pytest.mark.parametrize(("backend", "num_spec", "sizes"),
                         [("triton", 0, None), ("triton", 3, (1, 2, 4)), ("torch", 0, None),
                          ("flashinfer", 3, None)])
def test_every_eager_gemm_after_ready_is_at_a_swept_size(
        backend: str, num_spec: int, sizes: tuple[int, ...] | None,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The GEMM sweep covers eager_token_counts and the head's rows: no forward outside a
    graph, and no logits, after ready at a size the sweep did not run."""
    runner = _warm_runner(backend, num_spec, sizes)
    swept = {tuple(w.shape): set(ms) for w, ms in gemm_plan(runner)}
    head = runner.model.embed_tokens if runner.model.lm_head is None else runner.model.lm_head
    eager: list[int] = []
    rows: list[int] = []
    forward, logits = runner._eager_forward, runner.model.compute_logits

    def eager_forward(ids: torch.Tensor, pos: torch.Tensor, meta: Any) -> torch.Tensor:
        eager.append(meta.num_tokens)
        return forward(ids, pos, meta)

    def compute_logits(hidden: torch.Tensor) -> torch.Tensor:
        rows.append(hidden.shape[0])
        return logits(hidden)

    monkeypatch.setattr(runner, "_eager_forward", eager_forward)
    monkeypatch.setattr(runner.model, "compute_logits", compute_logits)
    _random_traffic(runner, num_spec)
    # A step whose requests all end mid-prompt asks for 0 rows: no GEMM runs at all.
    assert rows and set(rows) - {0} <= swept[tuple(head.shape)]
    assert set(eager) <= set(runner.eager_token_counts()), sorted(set(eager))
    layer = tuple(runner.model.layers[0].o_proj.shape)
    if eager:
        assert set(eager) <= swept[layer]
    if not runner.attention_backend.supports_ragged_graphs:  # prefills run eagerly, padded
        assert len(set(eager)) > 3 and all(n % EAGER_TOKEN_GRANULE == 0 for n in eager
                                           if n > runner.max_num_reqs * (1 + num_spec))


@pytest.mark.parametrize("backend", ["torch", "triton", "flashinfer"])
@pytest.mark.parametrize("num_spec", [0, 2])
def test_padded_eager_batches_match_unpadded_ones_on_cuda(backend: str, num_spec: int) -> None:
    """The padding tokens of an eager batch reach no request on every backend (the CPU test
    checks the torch reference to float32 precision; bf16 GEMMs at another M may round
    differently, hence the tolerance)."""
    plain, padded = _cuda_runner(backend, num_spec), _cuda_runner(backend, num_spec)
    assert padded.eager_granule == EAGER_TOKEN_GRANULE
    plain.eager_granule = 1
    plain_counts: list[int] = []
    padded_counts: list[int] = []
    expected = traffic(plain, num_spec, plain_counts)
    got = traffic(padded, num_spec, padded_counts)
    assert set(padded_counts) - set(plain_counts), "some batch was padded"
    for a, b in zip(got, expected, strict=True):
        torch.testing.assert_close(a, b, rtol=3e-2, atol=3e-2)
        if a.shape[0]:  # a step of prefill chunks only has no logits rows
            assert (a.argmax(-1) == b.argmax(-1)).float().mean() > 0.9
    for kv_padded, kv_plain in zip(padded.kv_caches, plain.kv_caches, strict=True):
        torch.testing.assert_close(kv_padded[:, 1:], kv_plain[:, 1:], rtol=3e-2, atol=3e-2)


def test_the_sampler_rows_learn_a_smaller_map_on_cuda(tmp_path: Path) -> None:
    runner = make_runner(device="cuda", dtype="bfloat16", num_spec=2, max_num_seqs=64)
    sweeps = sampler_sweeps(runner)
    full = sum(s.max_size for s in sweeps)
    assert all(profile_sweep(s)[0] for s in sweeps), "size 1 of every sweep launched kernels"
    assert sweep_sampler_rows(runner, kernel_dir=tmp_path) == full  # learns
    assert sweep_sampler_rows(runner, kernel_dir=tmp_path) < full // 2  # uses it


@pytest.mark.parametrize("file_dtype", [torch.bfloat16, torch.float32])
def test_staged_reader_fills_cuda_tensors(tmp_path: Path, file_dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(0)
    tensors = {f"t{i}": torch.randn(n, 257, generator=gen).to(file_dtype)
               for i, n in enumerate((1, 3, 700, 40_000))}
    path = tmp_path / "model.safetensors"
    save_file(tensors, str(path))
    header = read_header(path)
    targets = {n: torch.zeros(t.shape, dtype=torch.bfloat16, device="cuda")
               for n, t in tensors.items()}
    stats = stream_into([(path, header[n], targets[n]) for n in tensors], torch.device("cuda"),
                        slice_bytes=1 << 20, num_readers=4)
    assert stats.staged
    for name, t in tensors.items():
        assert torch.equal(targets[name].cpu(), t.to(torch.bfloat16)), name
