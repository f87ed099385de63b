"""The small-M dense kernel (kernels.dense_gemv) against F.linear, and its launch plan
(kernels.gemv_plan), on the CPU through the Triton interpreter.

Every row count 1..16, widths that are multiples of 16 but not powers of two and widths with
odd tails (a partial last N tile and K step), bf16/fp16/fp32, with and without a bias, with K
split into ranges and not; with SiLU-and-mul fused into the input, the unfused kernels' bits.
The plan gives one launch for every M of a bucket (one compiled
binary), splits K only where the N tiles leave SMs idle, and never makes an empty range.

On a machine with CUDA the interpreter is not forced and the same checks run on the GPU."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("triton")

from tests.kernel_device import kernel_device
from tests.paged_reference import rel_err
from warmgate.server.kernels.activation import silu_and_mul
from warmgate.server.kernels.dense_gemv import (
    _gemv_kernel,
    dense_gemv,
    gemv_applies,
    silu_mul_gemv,
)
from warmgate.server.kernels.gemv_plan import MAX_ROWS, GemvLaunch, cdiv, gemv_launch
from warmgate.server.kernels.norm_gemv import (
    norm_act_applies,
    norm_act_gemv,
    norm_gemv,
    norm_gemv_applies,
)
from warmgate.server.kernels.rms_norm import rms_norm

DEVICE = kernel_device(_gemv_kernel)
H100_SMS = 132
# Against F.linear in the same dtype: both accumulate in float32 and round once, so they
# differ by the rounding of the output (and the order of the float32 sums).
TOLERANCE = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1e-2}


def _operands(m: int, n: int, k: int, dtype: torch.dtype, seed: int = 0, bias: bool = False
              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=gen).to(DEVICE, dtype)
    w = (torch.randn(n, k, generator=gen) / k ** 0.5).to(DEVICE, dtype)
    b = torch.randn(n, generator=gen).to(DEVICE, dtype) if bias else None
    return x, w, b


def _check(out: torch.Tensor, x: torch.Tensor, w: torch.Tensor,
           b: torch.Tensor | None) -> None:
    ref = F.linear(x, w, b)
    assert out.shape == ref.shape and out.dtype == x.dtype
    assert rel_err(out, ref) < TOLERANCE[x.dtype], (tuple(x.shape), tuple(w.shape), x.dtype)


@pytest.mark.parametrize(("n", "k"), [(48, 80), (112, 208)])
def test_every_row_count_matches_f_linear(n: int, k: int) -> None:
    for m in range(1, MAX_ROWS + 1):
        x, w, _ = _operands(m, n, k, torch.bfloat16, seed=m)
        _check(dense_gemv(x, w), x, w, None)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize(("n", "k"), [(37, 70), (33, 129), (80, 1040)])
def test_odd_tails_and_a_bias_in_every_dtype(dtype: torch.dtype, n: int, k: int) -> None:
    for m in (1, 3, 16):
        for bias in (False, True):
            x, w, b = _operands(m, n, k, dtype, seed=m, bias=bias)
            _check(dense_gemv(x, w, b), x, w, b)


@pytest.mark.parametrize("m", [1, 7])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_k_split_into_ranges_matches(m: int, dtype: torch.dtype) -> None:
    """Three K ranges summed by the second kernel, the last range shorter, the bias added
    once after the sum."""
    n, k = 40, 336
    block_m = 1 if m == 1 else MAX_ROWS
    launch = GemvLaunch(block_m=block_m, block_n=16, block_k=64, splits=3, k_per_split=128,
                        num_warps=4, num_stages=1)
    x, w, b = _operands(m, n, k, dtype, seed=5, bias=True)
    _check(dense_gemv(x, w, b, launch=launch), x, w, b)


def test_a_one_row_launch_is_refused_for_more_rows() -> None:
    x, w, _ = _operands(2, 48, 80, torch.bfloat16)
    with pytest.raises(ValueError, match="a launch of 1 rows for 2 rows"):
        dense_gemv(x, w, launch=gemv_launch(48, 80, 1, 2, H100_SMS))


def test_a_split_small_n_shape_takes_the_second_kernel() -> None:
    """The plan itself splits a narrow N over a long K, and the result is right."""
    n, k = 64, 2048
    launch = gemv_launch(n, k, 4, 2, H100_SMS)
    assert launch.splits > 1
    x, w, b = _operands(4, n, k, torch.bfloat16, seed=2, bias=True)
    _check(dense_gemv(x, w, b, sm_count=H100_SMS), x, w, b)


def test_what_the_kernel_takes_and_refuses() -> None:
    x, w, b = _operands(2, 48, 80, torch.bfloat16, bias=True)
    assert gemv_applies(x, w, b) and gemv_applies(x, w, None)
    wide = torch.zeros(MAX_ROWS + 1, 80, dtype=torch.bfloat16, device=DEVICE)
    misaligned = torch.zeros(81, dtype=torch.bfloat16, device=DEVICE)[1:].view(1, 80)
    refused = {
        "no rows": (x[:0], w, None), "17 rows": (wide, w, None),
        "another dtype": (x.float(), w, None), "not contiguous": (x.t().contiguous().t(), w, None),
        "misaligned": (misaligned, w, None), "K differs": (x[:, :64].contiguous(), w, None),
        "bias shape": (x, w, b[:40]), "bias dtype": (x, w, b.float()),
    }
    for why, (xx, ww, bb) in refused.items():
        assert not gemv_applies(xx, ww, bb), why
        with pytest.raises(ValueError, match="dense_gemv"):
            dense_gemv(xx, ww, bb)


# ---------------------------------------------------------------- SiLU-and-mul fused in

@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize(("n", "k", "launch"), [
    (48, 80, None), (37, 70, None),
    (40, 336, GemvLaunch(block_m=MAX_ROWS, block_n=16, block_k=64, splits=3, k_per_split=128,
                         num_warps=4, num_stages=1))])
def test_silu_mul_fused_is_the_unfused_gemv_to_the_bit(
        dtype: torch.dtype, n: int, k: int, launch: GemvLaunch | None) -> None:
    """The activation computed and rounded in the kernel as silu_and_mul stores it: the same
    bits as silu_and_mul then dense_gemv, and F.linear's result within its tolerance."""
    for m in (1, 3, 16):
        if launch is not None and m == 1:
            continue  # a 16-row launch; the one-row split is covered below
        gate_up, w, _ = _operands(m, n, 2 * k, dtype, seed=m)
        w = w[:, :k].contiguous()
        act = silu_and_mul(gate_up)
        fused = silu_mul_gemv(gate_up, w, launch=launch)
        assert torch.equal(fused, dense_gemv(act, w, launch=launch)), (n, k, m, dtype)
        _check(fused, act, w, None)


def test_silu_mul_fused_split_at_one_row() -> None:
    gate_up, w, _ = _operands(1, 40, 672, torch.bfloat16, seed=9)
    w = w[:, :336].contiguous()
    launch = GemvLaunch(block_m=1, block_n=8, block_k=64, splits=3, k_per_split=128,
                        num_warps=4, num_stages=1)
    fused = silu_mul_gemv(gate_up, w, launch=launch)
    assert torch.equal(fused, dense_gemv(silu_and_mul(gate_up), w, launch=launch))


def test_silu_mul_takes_gate_and_up_of_twice_the_width() -> None:
    gate_up, w, _ = _operands(2, 48, 160, torch.bfloat16)
    w = w[:, :80].contiguous()
    assert gemv_applies(gate_up, w, None, silu_mul=True)
    assert not gemv_applies(gate_up, w, None)
    with pytest.raises(ValueError, match="twice its width"):
        silu_mul_gemv(gate_up[:, :80].contiguous(), w)


# ---------------------------------------------------------------- RMSNorm fused in

@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize(("n", "k", "residual", "bias", "launch"), [
    (48, 80, True, False, None), (37, 300, False, True, None), (64, 256, True, True, None),
    (40, 336, True, False, GemvLaunch(block_m=1, block_n=8, block_k=64, splits=3,
                                      k_per_split=128, num_warps=4, num_stages=1))])
@pytest.mark.parametrize("m", [1, 3, MAX_ROWS])
def test_the_norm_fused_in_is_rms_norm_then_the_gemv(
        dtype: torch.dtype, n: int, k: int, residual: bool, bias: bool,
        launch: GemvLaunch | None, m: int) -> None:
    """Each row's new residual is rms_norm's to the bit (program 0 of the grid stores them),
    the product the unfused GEMV's on rms_norm's output (a normalised row may differ by an
    ulp where its sum of squares adds in another order); without a residual the rows
    themselves are the new residual, as rms_norm returns them. One row and the 16-row tiles."""
    if launch is not None and m > 1:
        launch = GemvLaunch(block_m=MAX_ROWS, block_n=16, block_k=64, splits=3,
                            k_per_split=128, num_warps=4, num_stages=1)
    x, w, b = _operands(m, n, k, dtype, seed=k, bias=bias)
    gen = torch.Generator().manual_seed(n)
    res = torch.randn(m, k, generator=gen).to(DEVICE, dtype) if residual else None
    norm_w = torch.randn(k, generator=gen).to(DEVICE, dtype)
    normed, want_res = rms_norm(x, norm_w, 1e-6, res)
    want = dense_gemv(normed, w, b, launch=launch)
    out, new_res = norm_gemv(x, res, norm_w, 1e-6, w, b, launch=launch)
    assert torch.equal(new_res, want_res)
    assert (new_res is x) is (res is None)
    assert out.dtype == dtype and out.shape == (m, n)
    assert rel_err(out, want) < TOLERANCE[dtype] / 10


def test_what_the_norm_fused_gemv_takes_and_refuses() -> None:
    x, w, b = _operands(2, 48, 80, torch.bfloat16, bias=True)
    row, norm_w = x[:1], torch.ones(80, dtype=torch.bfloat16, device=DEVICE)
    assert norm_gemv_applies(row, row, norm_w, w, b) and norm_gemv_applies(row, None, norm_w, w,
                                                                             None)
    wide = torch.zeros(MAX_ROWS + 1, 80, dtype=torch.bfloat16, device=DEVICE)
    assert norm_gemv_applies(x, x, norm_w, w, b)  # 2..16 rows: the tl.dot tiles
    refused = {"17 rows": (wide, wide, norm_w), "residual dtype": (row, row.float(), norm_w),
               "norm width": (row, row, norm_w[:64]), "norm dtype": (row, row, norm_w.float())}
    for why, (xx, rr, nn) in refused.items():
        assert not norm_gemv_applies(xx, rr, nn, w, b), why
        with pytest.raises(ValueError, match="norm_gemv"):
            norm_gemv(xx, rr, nn, 1e-6, w, b)


# ---------------------------------------------------------------- RMSNorm and SiLU-and-mul

@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize(("inter", "k"), [(24, 80), (37, 300), (64, 256)])
@pytest.mark.parametrize("m", [1, 3, MAX_ROWS])
def test_norm_and_act_fused_are_norm_gemv_then_silu_and_mul_to_the_bit(
        dtype: torch.dtype, inter: int, k: int, m: int) -> None:
    """Each program's gate rows and the up rows of the same columns, rounded as norm_gemv
    stores the product, then the activation as silu_and_mul computes it: the same bits, a
    partial last tile of columns (37) included; the new residual is rms_norm's."""
    x, w, _ = _operands(m, 2 * inter, k, dtype, seed=inter + m)
    gen = torch.Generator().manual_seed(k)
    res = torch.randn(m, k, generator=gen).to(DEVICE, dtype)
    norm_w = torch.randn(k, generator=gen).to(DEVICE, dtype)
    assert norm_act_applies(x, res, norm_w, w)
    act, new_res = norm_act_gemv(x, res, norm_w, 1e-6, w)
    gate_up, want_res = norm_gemv(x, res, norm_w, 1e-6, w)
    assert act.shape == (m, inter)
    assert torch.equal(act, silu_and_mul(gate_up)), (inter, k, m, dtype)
    assert torch.equal(new_res, want_res)


def test_what_the_norm_and_act_fused_gemv_refuses() -> None:
    """An odd count of gate/up rows has no halves; a launch that splits K would need the
    activation after the splits' sum, which this kernel does not do: refused, and
    norm_act_applies says so beforehand for the plan's launch."""
    x, w, _ = _operands(1, 48, 80, torch.bfloat16)
    norm_w = torch.ones(80, dtype=torch.bfloat16, device=DEVICE)
    assert not norm_act_applies(x, x, norm_w, w[:47].contiguous())
    with pytest.raises(ValueError, match="even count"):
        norm_act_gemv(x, x, norm_w, 1e-6, w[:47].contiguous())
    split = GemvLaunch(block_m=1, block_n=8, block_k=16, splits=2, k_per_split=48,
                       num_warps=4, num_stages=1)
    with pytest.raises(ValueError, match="one K range"):
        norm_act_gemv(x, x, norm_w, 1e-6, w, launch=split)
    narrow = _operands(1, 8, 4096, torch.bfloat16)[1]  # 8 rows: the plan splits K
    wide_x = torch.zeros(1, 4096, dtype=torch.bfloat16, device=DEVICE)
    assert not norm_act_applies(wide_x, wide_x, torch.ones_like(wide_x[0]), narrow)


# ---------------------------------------------------------------- the plan

# llama-3.2-1b and llama-3.1-8b: qkv, o, gate/up, down, the head.
MODEL_SHAPES = [(3072, 2048), (2048, 2048), (16384, 2048), (2048, 8192), (128256, 2048),
                (6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336), (128256, 4096)]


@pytest.mark.parametrize(("n", "k"), [*MODEL_SHAPES, (37, 70), (33, 129)])
def test_one_launch_per_bucket_and_no_empty_range(n: int, k: int) -> None:
    for element_bytes in (2, 4):
        one = gemv_launch(n, k, 1, element_bytes, H100_SMS)
        many = {gemv_launch(n, k, m, element_bytes, H100_SMS) for m in range(2, MAX_ROWS + 1)}
        assert len(many) == 1, "M 2..16 must share one launch: one compiled binary"
        for launch in (one, *many):
            assert launch.block_n in (4, 8, 16, 32, 64) and launch.block_k >= 16
            if launch.splits > 1:
                assert launch.k_per_split % launch.block_k == 0
                assert (launch.splits - 1) * launch.k_per_split < k, "an empty K range"
                assert 2 * cdiv(n, launch.block_n) < H100_SMS, "split while the N tiles fill SMs"
            else:
                assert launch.k_per_split == k
        assert one.block_m == 1 and next(iter(many)).block_m == MAX_ROWS


def test_wide_weights_fill_the_gpu_without_a_split() -> None:
    """Every 8B and 1B projection and head runs unsplit, over the whole of K: one row with
    programs for every SM, 2..16 rows with at least half the SMs."""
    for n, k in MODEL_SHAPES:
        for m in (1, 4):
            launch = gemv_launch(n, k, m, 2, H100_SMS)
            assert launch.splits == 1, (n, k, m, launch)
            per_sm = 1 if m == 1 else 0.5
            assert cdiv(n, launch.block_n) >= per_sm * H100_SMS, (n, k, m, launch)


def test_a_narrow_weight_splits_k_only_below_half_the_sms() -> None:
    """The 16-row tiles of a 512-wide weight make 32 programs: K splits; a 2048-wide one's
    make 128, most of the SMs, and K does not."""
    assert gemv_launch(512, 4096, 8, 2, H100_SMS).splits > 1
    assert gemv_launch(2048, 4096, 8, 2, H100_SMS).splits == 1


def test_rows_outside_the_buckets_are_refused() -> None:
    for m in (0, MAX_ROWS + 1):
        with pytest.raises(ValueError, match=r"1\.\.16 rows"):
            gemv_launch(64, 64, m, 2, H100_SMS)
