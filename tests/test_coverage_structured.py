"""Grammar rows in the coverage workload (devtools/structured_rows.py) on a random-weight
checkpoint with the tokenizer devtools writes: constrained requests run the real xgrammar path,
every token they produce is one their grammar allows, completed outputs parse, and a runner
that ignored the bitmask would be caught; bench/warm.py coverage and bench/warm.py first-request
--mode options run on such a checkpoint."""

from __future__ import annotations

import argparse
import json
import random
import statistics
from pathlib import Path

import pytest

from tests.bench_harness import load_script, run_bench
from tests.runner_helpers import tiny_config, with_model
from warmgate.server.devtools.batch_driver import BatchDriver
from warmgate.server.devtools.checkpoint import write_checkpoint
from warmgate.server.devtools.random_batches import BatchDrawer, Limits
from warmgate.server.devtools.structured_rows import GRAMMARS, ConstrainedSampling
from warmgate.server.devtools.text_files import EOS_TOKEN
from warmgate.server.runner.model_runner import ModelRunner
from warmgate.server.serving.grammar.spec import grammar_unavailable_reason
from warmgate.server.text.model_text import load_model_text

OPTION_CLASSES = ["plain", "logprobs", "prompt_logprobs", "presence_penalty",
                  "frequency_penalty", "repetition_penalty", "min_p", "min_tokens", "logit_bias",
                  "json_schema", "regex", "ebnf"]
# EOS ignored and no stop ids: each request produces exactly --max-tokens.
UNSTOPPABLE_CLASSES = set(OPTION_CLASSES) - {"min_tokens", "json_schema", "regex", "ebnf"}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("tiny-text")
    write_checkpoint("tiny", directory, "cpu", "float32", tokenizer=True)
    return directory


def _runner(model_dir: Path, num_spec: int) -> ModelRunner:
    return ModelRunner(with_model(tiny_config(num_spec=num_spec), weights_path=str(model_dir)))


def _drive(runner: ModelRunner, steps: int, *, ignore_bitmask: bool = False
           ) -> ConstrainedSampling:
    sched = BatchDriver(runner)
    if ignore_bitmask:  # a runner whose sampler never sees the grammar rows
        sample = runner.sample_tokens
        runner.sample_tokens = lambda _grammar: sample(None)  # type: ignore[method-assign]
    structured = ConstrainedSampling(runner, sched, random.Random(1), share=0.5).install()
    cfg = runner.config
    limits = Limits(cfg.scheduler.max_num_seqs, cfg.scheduler.max_num_batched_tokens,
                    cfg.model.max_model_len, cfg.speculative.num_speculative_steps,
                    cfg.model.vocab_size)
    drawer = BatchDrawer(sched, limits, random.Random(0), structured.admit)
    for _ in range(steps):
        sched.step(drawer.next_plan()[1])
    for rid in list(sched.reqs):
        sched.finish(rid)
    sched.flush()
    structured.close()
    return structured


def test_the_written_tokenizer_fits_the_model_and_ends_grammars_on_its_eos(
        model_dir: Path) -> None:
    text = load_model_text(_runner(model_dir, 0).config.model)
    assert text.tokenizer is not None and grammar_unavailable_reason(text) is None
    assert 259 < text.tokenizer.vocab_size < 512  # every byte, the specials, some merges
    assert text.eos_token_ids == (text.tokenizer.tokenizer.token_to_id(EOS_TOKEN),)
    ids = text.tokenizer.encode_prompt('{"ok": true, "kind": "a"}')
    assert text.tokenizer.decode(ids) == '{"ok": true, "kind": "a"}'
    # Kept as written when asked again; the weights are reused.
    assert "reused" in write_checkpoint("tiny", model_dir, "cpu", "float32", tokenizer=True)


def test_a_reused_checkpoint_without_a_tokenizer_gets_one(tmp_path: Path) -> None:
    write_checkpoint("tiny", tmp_path, "cpu", "float32")
    assert not (tmp_path / "tokenizer.json").exists()
    assert "tokenizer: byte-level BPE" in write_checkpoint("tiny", tmp_path, "auto", "auto",
                                                           tokenizer=True)
    assert json.loads((tmp_path / "generation_config.json").read_text())["eos_token_id"] == 0


def test_the_checks_accept_the_language_and_refuse_the_rest() -> None:
    good = {"json_schema": '{"ok": false, "kind": "b"}', "regex": "yes, 42!",
            "ebnf": "[red,7]"}
    bad = {"json_schema": '{"ok": 1, "kind": "b"}', "regex": "yes 42!", "ebnf": "[red,]"}
    for kind, grammar in GRAMMARS.items():
        assert grammar.check(good[kind]) and not grammar.check(bad[kind]), kind


@pytest.mark.parametrize("num_spec", [0, 3])
@pytest.mark.slow
def test_constrained_rows_obey_their_grammars_and_completed_outputs_parse(
        model_dir: Path, num_spec: int) -> None:
    structured = _drive(_runner(model_dir, num_spec), 80)
    assert structured.failures == [], structured.describe()
    counts = structured.counts
    assert structured.num_rows > 0 and sum(counts[f"{k} requests"] for k in GRAMMARS) >= 6
    complete = sum(counts[f"{k} complete"] for k in GRAMMARS)
    assert complete >= 2 and complete == sum(counts[f"{k} parsed"] for k in GRAMMARS)
    assert (structured.num_draft_rows > 0) == (num_spec > 0)
    assert "structured_failures: 0" in structured.describe()


def test_a_runner_that_ignored_the_bitmask_is_caught(model_dir: Path) -> None:
    structured = _drive(_runner(model_dir, 0), 20, ignore_bitmask=True)
    assert not structured.ok
    assert any("is not allowed by the request's grammar" in f for f in structured.failures)


@pytest.mark.slow
def test_coverage_runs_grammar_rows_on_a_checkpoint_it_writes(tmp_path: Path) -> None:
    proc = run_bench("bench/warm.py coverage", ["--write-checkpoint", "tiny", "--model",
                                           str(tmp_path / "ckpt"), "--batches", "60",
                                           "--num-speculative-steps", "3", "--max-num-seqs",
                                           "4", "--max-num-batched-tokens", "64",
                                           "--max-model-len", "128"])
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "wrote tiny to" in proc.stdout and "tokenizer: byte-level BPE" in proc.stdout
    assert "structured       RAN" in proc.stdout
    line = next(x for x in proc.stdout.splitlines() if x.startswith("structured rows:"))
    assert "none" not in line and "0 violations" in line
    assert "structured_failures: 0" in proc.stdout
    assert proc.stdout.rstrip().endswith("compiles_after_ready: 0")


@pytest.mark.slow
def test_first_request_options_reports_every_class_on_each_server(tmp_path: Path) -> None:
    out = tmp_path / "options.json"
    proc = run_bench("bench/warm.py first-request", [
        "--mode", "options", "--write-checkpoint", "tiny", "--model-dir", str(tmp_path / "m"),
        "--server-args", "--device cpu --max-num-seqs 4 --max-num-batched-tokens 64 "
        "--max-model-len 128 --num-speculative-steps 2", "--steady", "2", "--prompt-len", "8",
        "--max-tokens", "6", "--gap-s", "0", "--servers", "2", "--shuffle", "--out", str(out)])
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads(out.read_text())
    assert [c["class"] for c in report["classes"]] == OPTION_CLASSES
    assert report["setup"]["num_speculative_steps"] == 2 and report["setup"]["servers"] == 2
    orders = [s["order"] for s in report["servers"]]
    assert len(orders) == 2 and all(o[0] == "plain" and sorted(o) == sorted(OPTION_CLASSES)
                                    for o in orders)
    for server in report["servers"]:
        assert server["phases"]["structured"] == server["phases"]["kernels.sampler"] == "RAN"
        for c in server["classes"]:  # every server's own requests are kept
            assert c["error"] == "" and len(c["steady"]) == 2 and c["first"]["tokens"] >= 1
    for c in report["classes"]:
        assert c["error"] == "" and c["servers_ok"] == 2, c
        assert c["compiles_after_ready"] == c["graph_misses_after_ready"] == 0
        own = [next(x for x in s["classes"] if x["class"] == c["class"])
               for s in report["servers"]]
        for x in own:  # the mean decode step: what follows the first token over its steps
            for t in (x["first"], *x["steady"]):
                if c["class"] in UNSTOPPABLE_CLASSES:
                    assert t["tokens"] == 6, (c["class"], t)
                assert t["steps"] >= 2 and t["decode_step_s"] == pytest.approx(
                    (t["total_s"] - t["ttft_s"]) / (t["steps"] - 1))
        for a in ("ttft_s", "total_s", "server_ttft_s", "decode_step_s"):
            # N ratios, their median, med/med
            assert c[f"{a}_ratios"] == [x[f"{a}_ratio"] for x in own]
            assert c[f"{a}_ratio_median"] == pytest.approx(
                statistics.median(c[f"{a}_ratios"]), abs=1e-3)
            assert c[f"{a}_med_over_med"] == pytest.approx(
                c[f"first_median_{a}"] / c[f"steady_median_{a}"], rel=1e-3)
            assert c[f"steady_median_{a}"] == pytest.approx(statistics.median(
                t[a] for x in own for t in x["steady"]), abs=1e-6)
    assert report["worst"]["ttft_s"]["class"] in OPTION_CLASSES
    assert report["compiles_after_ready"] == report["graph_misses_after_ready"] == 0
    lines = proc.stdout.splitlines()
    table = lines.index(next(x for x in lines if x.startswith("class ")))
    rows = {x.split()[0]: x.split() for x in lines[table + 1:table + 1 + len(OPTION_CLASSES)]}
    assert list(rows) == OPTION_CLASSES
    # class, 10 figures, the decode step's ratio, tokens, steps, compiles, misses
    assert len(rows["json_schema"]) == 15
    per_server = lines.index(next(x for x in lines if x.startswith("per server")))
    row = lines[per_server + 1 + OPTION_CLASSES.index("json_schema")].split()
    assert row[0] == "json_schema" and len(row) == 6  # class, 2 TTFT | 2 whole request
    assert sum(x.startswith("server ") and "ready in" in x for x in lines) == 2
    assert "worst first/steady by the median of 2 ratios: TTFT" in proc.stdout
    assert "compiles_after_ready: 0" in proc.stdout


def test_options_requests_ignore_eos_outside_the_grammar_classes() -> None:
    # A request that drew EOS as its first token had one step and no decode step to time
    # (a CI run failed on it); a grammar request needs several tokens to end.
    options = load_script("bench/lib/first_request_options.py")
    args = argparse.Namespace(temperature=0.7, max_tokens=6, seeded=False, same_grammar=False)
    for name in OPTION_CLASSES:
        kwargs = options.request_kwargs(name, 0, args, 512, random.Random(0))
        assert kwargs["ignore_eos"] == (name not in options.GRAMMAR_CLASSES), name
        assert kwargs["max_tokens"] == 6 and kwargs["temperature"] == 0.7
