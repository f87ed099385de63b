"""--deterministic's CPU ops, op by op: a row's result is the same bits alone and inside any
batch, where the default path's GEMM (MKL) is not; the torch attention backend, the MoE
block and the sampler's draws likewise."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import pytest
import torch

from tests.runner_helpers import tiny_config
from warmgate.server.config.runner_config import ConfigError, resolve_runner_config
from warmgate.server.runner.deterministic_ops import RowwiseTorchOps
from warmgate.server.runner.moe import MoEBlock
from warmgate.server.runner.ops import TorchOps
from warmgate.server.runner.sampling import warpers
from warmgate.server.runner.sampling.seeded import make_generator
from warmgate.server.runner.sampling.warpers import choose_tokens
from warmgate.server.runner.scheduler_output import GREEDY, SamplingParams
from warmgate.server.startup import load_server_config

# SmolLM2-135M's projection and head shapes, and tiny's: (N, K) of weight [N, K].
SHAPES = [(960, 576), (576, 576), (3072, 576), (576, 1536), (49152, 576), (128, 64)]
BATCHES = (2, 5, 16, 33)
Op = Callable[[torch.Tensor], torch.Tensor]


def rows_that_differ(op: Op, x: torch.Tensor) -> list[int]:
    """Rows of op(x) that are not bit-identical to op on that row alone."""
    full = op(x)
    return [i for i in range(x.shape[0]) if not torch.equal(full[i], op(x[i:i + 1].clone())[0])]


@pytest.mark.parametrize(("n", "k"), SHAPES)
def test_the_rowwise_linear_is_batch_invariant_where_the_default_gemm_is_not(n: int,
                                                                           k: int) -> None:
    gen = torch.Generator().manual_seed(n + k)
    w = torch.randn(n, k, generator=gen) * 0.05
    bias = torch.randn(n, generator=gen)
    default_differs = 0
    for m in BATCHES:
        x = torch.randn(m, k, generator=gen)
        assert rows_that_differ(lambda a: RowwiseTorchOps().linear(a, w, bias), x) == []
        default_differs += len(rows_that_differ(lambda a: TorchOps().linear(a, w), x))
    # MKL's GEMM for M > 1 rounds differently from its M = 1 path: without the row-wise
    # routing a token's projections depend on its step's token count.
    assert default_differs > 0


@pytest.mark.parametrize("hidden", [64, 576])
def test_rowwise_norm_activation_and_log_softmax_are_batch_invariant(hidden: int) -> None:
    gen = torch.Generator().manual_seed(hidden)
    ops = RowwiseTorchOps()
    weight = torch.randn(hidden, generator=gen)
    for m in BATCHES:
        x = torch.randn(m, hidden, generator=gen)
        res = torch.randn(m, hidden, generator=gen)
        assert rows_that_differ(lambda a: ops.rms_norm(a, weight, 1e-6)[0], x) == []
        normed, summed = ops.rms_norm(x, weight, 1e-6, res)
        assert torch.equal(normed, ops.rms_norm(x + res, weight, 1e-6)[0])
        assert torch.equal(summed, x + res)
        assert rows_that_differ(ops.silu_and_mul, torch.randn(m, 2 * hidden, generator=gen)) == []
        assert rows_that_differ(ops.log_softmax,
                                torch.randn(m, 85 * hidden, generator=gen)) == []


def test_rowwise_ops_compute_what_the_default_ops_compute() -> None:
    gen = torch.Generator().manual_seed(1)
    x, w = torch.randn(7, 64, generator=gen), torch.randn(96, 64, generator=gen)
    ref, det = TorchOps(), RowwiseTorchOps()
    torch.testing.assert_close(det.linear(x, w), ref.linear(x, w))
    torch.testing.assert_close(det.rms_norm(x, w[0], 1e-6)[0], ref.rms_norm(x, w[0], 1e-6)[0])
    torch.testing.assert_close(det.silu_and_mul(x), ref.silu_and_mul(x))
    torch.testing.assert_close(det.log_softmax(w), ref.log_softmax(w))


def test_the_rowwise_moe_block_is_batch_invariant() -> None:
    config = tiny_config(architecture="qwen3_moe", num_experts=4, num_experts_per_tok=2,
                         moe_intermediate_size=32).model
    gen = torch.Generator().manual_seed(3)
    block = MoEBlock(config, torch.device("cpu"), torch.float32, row_wise=True)
    for p in block.parameters():
        p.copy_(torch.randn(p.shape, generator=gen) * 0.1)
    x = torch.randn(21, config.hidden_size, generator=gen)
    assert rows_that_differ(block, x) == []


def test_a_seeded_row_draws_the_same_token_alone_and_beside_other_rows(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # The CPU's softmax, sort and cumsum happen to be row invariant, so the tokens alone
    # cannot show the batched path's risk (CUDA kernels chosen by the row count): the draw
    # must also reach `probabilities` one row at a time.
    rows_seen: list[int] = []
    real = warpers.probabilities

    def spy(x: torch.Tensor, params: Any, *reductions: Any) -> torch.Tensor:
        rows_seen.append(x.shape[0])
        return real(x, params, *reductions)

    monkeypatch.setattr(warpers, "probabilities", spy)
    gen = torch.Generator().manual_seed(5)
    logits = torch.randn(6, 4096, generator=gen)
    seeded = SamplingParams(temperature=0.7, top_p=0.9, top_k=50, seed=99)
    params = [GREEDY, seeded, SamplingParams(temperature=1.0), seeded, GREEDY, seeded]

    def gens() -> list[torch.Generator | None]:
        return [make_generator(99, i, torch.device("cpu")) if p.seed is not None else None
                for i, p in enumerate(params)]

    batched = choose_tokens(logits, params, gens(), row_wise=True)
    assert rows_seen == [1, 1, 1, 1]  # the four drawn rows, each alone
    for i, p in enumerate(params):
        if p.seed is None and not p.is_greedy:
            continue  # unseeded: a fresh draw each time, nothing to compare
        alone = choose_tokens(logits[i:i + 1], [p], [gens()[i]], row_wise=True)
        assert int(batched[i]) == int(alone[0])


def test_deterministic_mode_refuses_compile_and_the_torch_backend_on_cuda() -> None:
    base = tiny_config()
    det = dataclasses.replace(base, numerics=dataclasses.replace(base.numerics,
                                                                 deterministic=True))
    compiled = dataclasses.replace(det, compilation=dataclasses.replace(det.compilation,
                                                                        compile=True))
    with pytest.raises(ConfigError) as err:
        resolve_runner_config(compiled, cuda_available=False)
    assert err.value.field_name == "compilation.compile"
    on_cuda = dataclasses.replace(det, device=dataclasses.replace(det.device, device="cuda"))
    with pytest.raises(ConfigError) as err:
        resolve_runner_config(on_cuda, cuda_available=True)
    assert err.value.field_name == "device.attention_backend"
    sharded = dataclasses.replace(det, parallel=dataclasses.replace(det.parallel,
                                                                    tensor_parallel_size=2))
    with pytest.raises(ConfigError) as err:
        resolve_runner_config(sharded, cuda_available=False)
    assert err.value.field_name == "parallel.tensor_parallel_size"
    assert det.config_hash() != base.config_hash()


def test_the_server_refuses_deterministic_with_compile_naming_the_flag(
        capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        load_server_config(["--device", "cpu", "--deterministic", "--compile"], environ={})
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "argument --compile: --compile does not combine with --deterministic" in err
    assert "Traceback" not in err
    on = load_server_config(["--device", "cpu"], environ={"WARMGATE_DETERMINISTIC": "1"})
    assert on.runner.numerics.deterministic
