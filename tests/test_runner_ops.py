"""TorchOps: the reference a Triton implementation will be held to."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from warmgate.server.runner.ops import TorchOps, build_cos_sin_cache

ops = TorchOps()


def test_rms_norm_with_and_without_residual() -> None:
    torch.manual_seed(0)
    x, res, w = torch.randn(5, 32), torch.randn(5, 32), torch.randn(32)
    out, new_res = ops.rms_norm(x, w, 1e-6)
    assert new_res is x
    want = x / (x.pow(2).mean(-1, keepdim=True) + 1e-6).sqrt() * w
    torch.testing.assert_close(out, want)
    out, new_res = ops.rms_norm(x, w, 1e-6, residual=res)
    torch.testing.assert_close(new_res, x + res)
    torch.testing.assert_close(out, ops.rms_norm(x + res, w, 1e-6)[0])


def test_silu_and_mul() -> None:
    x = torch.randn(3, 10)
    torch.testing.assert_close(ops.silu_and_mul(x), F.silu(x[:, :5]) * x[:, 5:])


def test_rotary_matches_complex_rotation_and_is_relative() -> None:
    torch.manual_seed(1)
    d, theta = 16, 10000.0
    cache = build_cos_sin_cache(64, d, theta)
    assert cache.shape == (64, d)
    q, k = torch.randn(4, 3, d), torch.randn(4, 1, d)
    pos = torch.tensor([0, 1, 7, 63])
    rq, _ = ops.rotary(q, k, pos, cache)
    # Reference: pair element i with i + d/2 as a complex number, rotate by pos * freq_i.
    freq = 1.0 / theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d)
    angle = pos[:, None].double() * freq  # [4, d/2]
    z = torch.complex(q[..., :d // 2].double(), q[..., d // 2:].double())
    z = z * torch.polar(torch.ones_like(angle), angle)[:, None, :]
    want = torch.cat([z.real, z.imag], dim=-1).float()
    torch.testing.assert_close(rq, want, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(rq[0], q[0])  # position 0 is the identity
    # Attention scores depend only on the distance between positions.
    def score(q_pos: int, k_pos: int) -> torch.Tensor:
        rq, _ = ops.rotary(q[:1], k[:1], torch.tensor([q_pos]), cache)
        _, rk = ops.rotary(q[:1], k[:1], torch.tensor([k_pos]), cache)
        return (rq[0, 0] * rk[0, 0]).sum()

    torch.testing.assert_close(score(10, 3), score(27, 20), atol=1e-4, rtol=1e-4)


def test_ops_keep_bfloat16() -> None:
    x = torch.randn(2, 8, dtype=torch.bfloat16)
    assert ops.rms_norm(x, torch.ones(8, dtype=torch.bfloat16), 1e-6)[0].dtype == torch.bfloat16
    assert ops.silu_and_mul(x).dtype == torch.bfloat16
    q = torch.randn(2, 2, 8, dtype=torch.bfloat16)
    rq, rk = ops.rotary(q, q[:, :1], torch.tensor([1, 2]), build_cos_sin_cache(4, 8, 1e4))
    assert rq.dtype == rk.dtype == torch.bfloat16
