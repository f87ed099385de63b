"""Issue 16 items 2-6: what the warmup warms when resources are tight, and that a plan
never succeeds when a path serving takes was skipped for lack of them."""

from __future__ import annotations

import subprocess
import sys

import pytest
from google.protobuf import json_format

from tests.runner_helpers import make_runner, tiny_config
from tests.warmup_fakes import Recorder, fake_runner, query_lens
from warmgate.server.config.runner_config import ConfigError
from warmgate.server.run_warmup import main as warmup_main
from warmgate.server.warmup import PhaseStatus, SkipReason, run_warmup_plan, warmup_kernels
from warmgate.server.warmup.kernels import decode_plan
from warmgate.server.warmup.shapes import check_config_capacity
from warmgate.v1 import warmup_pb2 as pb

# -- item 2: an explicit mixed_num_tokens below 3 skips; unset means the default -----------

@pytest.mark.parametrize("num_tokens", [0, 1, 2])
def test_explicit_small_mixed_num_tokens_skips(num_tokens: int) -> None:
    report = run_warmup_plan(make_runner(), mixed_num_tokens=num_tokens)
    mixed = report.phase("mixed")
    assert report.succeeded
    assert mixed.status is PhaseStatus.SKIPPED and mixed.skip_reason is SkipReason.NUM_TOKENS_LT_3


def test_unset_mixed_num_tokens_runs_the_default() -> None:
    mixed = run_warmup_plan(make_runner()).phase("mixed")
    assert mixed.status is PhaseStatus.RAN and mixed.num_tokens == 16


def test_warmup_cli_mixed_num_tokens_zero_skips(capsys: pytest.CaptureFixture[str]) -> None:
    code = warmup_main(["--model", "tiny", "--device", "cpu", "--mixed-num-tokens", "0",
                        "--json"])
    report = json_format.Parse(capsys.readouterr().out, pb.WarmupReport())
    mixed = next(p for p in report.phases if p.name == "mixed")
    assert code == 0
    assert mixed.status == pb.PHASE_STATUS_SKIPPED
    assert mixed.skip_reason == pb.SKIP_REASON_NUM_TOKENS_LT_3


# -- item 3: not even one request fits -> the plan fails, start-up exits 2 -----------------

def test_plan_fails_when_one_request_does_not_fit() -> None:
    report = run_warmup_plan(make_runner(num_blocks=1))
    assert not report.succeeded
    prefill = report.phase("kernels.prefill")
    assert prefill.status is PhaseStatus.FAILED and "--num-blocks" in prefill.detail
    for name in ("kernels.decode", "kernels.sampler", "mixed"):
        assert report.phase(name).skip_reason is SkipReason.EARLIER_PHASE_FAILED


def test_plan_fails_when_the_mixed_step_does_not_fit() -> None:
    # The kernels fit (3 tokens: 1 block of 4 per request); the 16-token mixed step needs 5.
    report = run_warmup_plan(make_runner(num_blocks=4, max_num_seqs=2))
    assert report.phase("kernels.decode").status is PhaseStatus.RAN
    mixed = report.phase("mixed")
    assert not report.succeeded
    assert mixed.status is PhaseStatus.FAILED and "--num-blocks" in mixed.detail


@pytest.mark.parametrize(("kwargs", "mixed", "flag"), [
    (dict(num_blocks=1), None, "--num-blocks"),
    (dict(num_blocks=4, max_num_seqs=2), None, "--num-blocks"),
    (dict(num_spec=3, max_model_len=8), None, "--max-model-len"),
    (dict(max_model_len=8), 16, "--mixed-num-tokens"),
])
def test_start_up_check_names_the_flag(kwargs: dict, mixed: int | None, flag: str) -> None:
    with pytest.raises(ConfigError) as info:
        check_config_capacity(tiny_config(**kwargs), mixed)
    assert flag in info.value.message


def test_start_up_check_passes_what_the_plan_can_warm() -> None:
    check_config_capacity(tiny_config(num_blocks=6, max_num_seqs=2), None)
    check_config_capacity(tiny_config(num_blocks=4, max_num_seqs=2), 2)  # mixed skips
    check_config_capacity(tiny_config(max_model_len=8), None)  # mixed default: 9 tokens


def test_mixed_warmup_longer_than_max_model_len_skips_touching_nothing() -> None:
    from tests.warmup_fakes import fail_execute, fail_sample
    from warmgate.server.warmup import run_mixed_prefill_decode_warmup

    result = run_mixed_prefill_decode_warmup(fake_runner(max_model_len=8), fail_execute,
                                             fail_sample, 16)
    assert not result and result.skip_reason is SkipReason.MAX_MODEL_LEN_TOO_SMALL
    assert "--mixed-num-tokens" in result.detail


def test_server_exits_2_with_one_line_naming_num_blocks() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "warmgate.server.main", "--device", "cpu", "--port", "0",
         "--metrics-port", "-1", "--num-blocks", "1"],
        capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    errors = [line for line in proc.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1 and "--num-blocks" in errors[0], proc.stderr


# -- item 4: the seed's batch size, with the extra steps fitted into its blocks ------------

def test_warms_the_seeds_batch_size_and_fits_the_extra_steps() -> None:
    runner = fake_runner(num_spec=3, max_num_seqs=64, max_num_batched_tokens=4096,
                         num_blocks=40)
    rec = Recorder()
    result = warmup_kernels(runner, rec.execute, rec.sample)
    prefill, decode = result.phases[0], result.phases[1]
    assert prefill.num_reqs == 39 and prefill.shapes["num_reqs"] == 39
    assert decode.shapes["extra_steps_num_reqs"] == 2
    assert len(rec.work_steps[0].scheduled_new_reqs) == 39
    # every decode shape of the plan still ran: 39 x 4, [4, 1], [1, 1], [4], [1]
    assert [query_lens(s)[0] for s in rec.work_steps[1:6]] == [
        [4] * 39, [4, 1], [1, 1], [4], [1]]
    held = set()
    for so in rec.steps:
        for r in so.scheduled_new_reqs:
            held.update(r.block_ids[0])
        for nb in so.scheduled_cached_reqs.new_block_ids:
            if nb:
                held.update(nb[0])
    assert max(held) <= 39  # never past the cache (block 0 is the null block)


# -- item 5: a small max_model_len caps the steps instead of failing -----------------------

def test_small_max_model_len_reaches_every_decode_shape() -> None:
    runner = make_runner(num_spec=3, max_model_len=16, block_size=16, max_num_batched_tokens=64)
    report = run_warmup_plan(runner)
    assert report.succeeded, [p.detail for p in report.phases if p.status is PhaseStatus.FAILED]
    assert report.phase("kernels.decode").num_steps == 5
    assert report.phase("kernels.decode").shapes["restated_requests"] >= 1


# -- item 6: one request runs no redundant step ---------------------------------------------

@pytest.mark.parametrize(("num_spec", "expected"), [
    (0, [[(0, False)]]), (2, [[(0, True)], [(0, False)]])])
def test_one_request_runs_each_decode_shape_once(num_spec: int, expected: list) -> None:
    assert decode_plan(1, num_spec) == expected
    rec = Recorder()
    result = warmup_kernels(fake_runner(num_spec=num_spec, max_num_seqs=1), rec.execute,
                            rec.sample)
    assert result.phases[1].num_steps == len(expected)
