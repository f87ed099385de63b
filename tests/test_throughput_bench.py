"""bench/serve.py throughput: the roofline it compares against, and a run against a real
server process on the CPU."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from warmgate.server.config.runner_config import ModelConfig
from warmgate.server.devtools.roofline import (
    Roofline,
    active_params,
    num_params,
    weight_bytes_per_step,
)

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(("preset", "published"), [
    # The parameter counts the checkpoints' model cards and safetensors indexes give.
    ("llama-3.2-1b", 1_235_814_400), ("llama-3.1-8b", 8_030_261_248),
    ("qwen2.5-1.5b", 1_543_714_304), ("mistral-7b", 7_248_023_552),
    ("qwen3-30b-a3b", 30_532_122_624), ("mixtral-8x7b", 46_702_792_704)])
def test_parameter_counts_match_the_published_ones(preset: str, published: int) -> None:
    assert num_params(ModelConfig.from_preset(preset)) == published


def test_the_roofline_reads_the_weights_once_and_every_streams_kv() -> None:
    model = ModelConfig.from_preset("llama-3.1-8b")
    # An untied embedding table is looked up, not read: the step reads the head in full.
    assert weight_bytes_per_step(model) == 2 * (8_030_261_248 - 128256 * 4096)
    one = Roofline.of(model, 1, 0, bytes_per_s=1e12)
    assert one.step_s == pytest.approx(weight_bytes_per_step(model) / 1e12)
    # 64 streams of 640 tokens add 64 * 640 tokens of K and V in 32 layers of 8 x 128 heads.
    many = Roofline.of(model, 64, 640, bytes_per_s=1e12)
    assert many.step_s - one.step_s == pytest.approx(64 * 640 * 2 * 32 * 8 * 128 * 2 / 1e12)
    assert many.tokens_per_s == pytest.approx(64 / many.step_s)


@pytest.mark.parametrize(("preset", "active"), [
    # Every weight but the experts a token is not routed to: 120 of Qwen3's 128 per layer,
    # 6 of Mixtral's 8 ("3.3B activated", "12.9B active parameters" in the model cards).
    ("qwen3-30b-a3b", 30_532_122_624 - 48 * 120 * 3 * 2048 * 768),
    ("mixtral-8x7b", 46_702_792_704 - 32 * 6 * 3 * 4096 * 14336)])
def test_a_moe_step_reads_only_the_experts_it_routes_to(preset: str, active: int) -> None:
    model = ModelConfig.from_preset(preset)
    assert active_params(model) == active
    embed = model.vocab_size * model.hidden_size
    assert weight_bytes_per_step(model) == 2 * (active - embed)
    # More tokens touch more experts: towards every expert of every layer, never past it.
    reads = [active_params(model, n) for n in (1, 2, 64, 4096)]
    assert reads == sorted(reads) and reads[1] > reads[0]
    assert reads[-1] == pytest.approx(num_params(model), rel=1e-6)
    one = Roofline.of(model, 1, 0, bytes_per_s=3.35e12)
    batch = Roofline.of(model, 64, 0, bytes_per_s=3.35e12)
    assert batch.step_s == pytest.approx(weight_bytes_per_step(model, tokens=64) / 3.35e12)
    assert batch.step_s > one.step_s


def _throughput(tmp_path: Path, *args: str) -> tuple[str, list[dict]]:
    """bench/serve.py throughput against a tiny CPU server: its stdout and its JSON rows."""
    out = tmp_path / "rows.json"
    proc = subprocess.run(
        [sys.executable, "bench/serve.py", "throughput", "--server-args",
         "--model tiny --device cpu", "--prompt-len", "12", *args, "--json", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=240, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout, json.loads(out.read_text())


@pytest.mark.slow
def test_a_sweep_against_a_server_process_gives_every_token(tmp_path: Path) -> None:
    stdout, rows = _throughput(tmp_path, "--streams", "1,3", "--output-len", "5")
    assert [(r["streams"], r["output_tokens"], r["errors"]) for r in rows] == [(1, 5, 0),
                                                                              (3, 15, 0)]
    assert all(r["tokens_per_s"] > 0 for r in rows)
    # A reader slower than the steps gets its queued tokens in one message (the server
    # coalesces them), so on a loaded machine a row can have no gap to measure: NaN, never 0.
    assert all(r["itl_p50_s"] > 0 or math.isnan(r["itl_p50_s"]) for r in rows)
    assert any(r["itl_p50_s"] > 0 for r in rows)
    assert "ITL p50" in stdout


@pytest.mark.slow
def test_a_closed_loop_reads_its_rows_over_the_steady_window(tmp_path: Path) -> None:
    # Read by two client processes (bench/lib/client_processes.py): one stream each.
    stdout, (row,) = _throughput(tmp_path, "--streams", "2", "--output-len", "6",
                                 "--requests-per-stream", "3", "--peak-tflops", "1",
                                 "--client-processes", "2")
    assert (row["streams"], row["output_tokens"], row["errors"]) == (2, 36, 0)
    # Prompts only add work: the served ceiling is under the decode roofline.
    assert 0 < row["ceiling_tokens_per_s"] < row["roofline_tokens_per_s"]
    assert row["tokens_over_ceiling"] == pytest.approx(row["tokens_per_s"]
                                                       / row["ceiling_tokens_per_s"])
    assert "steps: decode" in stdout
    # The window is part of the run: between the first wave's last first token and the
    # drain, so shorter than the wall time the tokens/s of a burst would divide by.
    assert row["window_s"] > 0
    assert row["tokens_per_s"] * row["window_s"] < 36
    assert "closed loop of 3 requests a stream" in stdout
