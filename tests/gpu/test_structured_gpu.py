"""Structured output on CUDA: xgrammar's Triton bitmask kernel masks exactly what its CPU
kernel masks, at the row counts and vocabulary sizes serving sees; and after a warmup whose
structured phase ran, grammar requests beside plain ones (with and without drafts) compile
nothing and miss no CUDA graph."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch

from tests.runner_helpers import prompt, tiny_config, with_model
from tests.serving_helpers import Served, greedy
from tests.text_helpers import write_tiny_model
from warmgate.server.jit import JitMonitor
from warmgate.server.jit.events import CUDA_GRAPH_MISS, JitEvent
from warmgate.server.runner.sampling.grammar_mask import apply_token_bitmask
from warmgate.server.serving.grammar.backend import grammar_backend
from warmgate.server.serving.grammar.spec import GrammarSpec
from warmgate.server.serving.request import FinishReason
from warmgate.server.text.model_text import load_model_text
from warmgate.server.warmup.plan import load_runner, run_warmup_plan

pytestmark = pytest.mark.gpu
EOS = 2


@pytest.mark.parametrize("vocab", [512, 49152, 128256])
@pytest.mark.parametrize("rows", [1, 3, 16, 17, 64, 255])
def test_bitmask_apply_on_cuda_equals_cpu(vocab: int, rows: int) -> None:
    gen = torch.Generator().manual_seed(vocab + rows)
    logits = torch.randn(rows, vocab, generator=gen)
    width = (vocab + 31) // 32
    bitmask = torch.randint(-2**31, 2**31 - 1, (rows, width), generator=gen, dtype=torch.int64
                            ).to(torch.int32)
    bitmask[0] = -1  # an unconstrained row beside constrained ones
    on_cpu = apply_token_bitmask(logits, bitmask)
    on_cuda = apply_token_bitmask(logits.cuda(), bitmask.cuda())
    assert torch.equal(on_cuda.cpu(), on_cpu)
    assert torch.equal(on_cpu[0], logits[0])
    if rows > 1:  # row 0 is the unconstrained one; the random rows mask some tokens
        assert torch.isinf(on_cpu[1:]).any()


@pytest.mark.parametrize("num_spec", [0, 3])
def test_grammar_requests_after_warmup_compile_nothing(tmp_path: Path, num_spec: int) -> None:
    pytest.importorskip("triton")
    directory = write_tiny_model(tmp_path, eos_token_id=EOS)
    config = with_model(tiny_config(device="cuda", dtype="bfloat16", attention_backend="triton",
                                    num_spec=num_spec, max_num_seqs=8,
                                    max_num_batched_tokens=128, block_size=16,
                                    num_blocks=128, max_model_len=128),
                        weights_path=str(directory))
    monitor = JitMonitor()
    runner, load_phase = load_runner(config, jit_monitor=monitor)
    report = run_warmup_plan(runner, load_phase=load_phase)
    assert report.succeeded, report.to_dict()
    structured = next(p for p in report.phases if p.name == "structured")
    assert structured.status.value == "RAN", structured.detail
    assert structured.shapes["apply_row_counts"] == runner.token_bitmask.max_rows
    monitor.mark_ready()
    late: list[JitEvent] = []
    monitor.add_listener(lambda e: late.append(e) if e.after_ready and (
        e.compiled or e.kind == CUDA_GRAPH_MISS) else None)
    backend = grammar_backend(load_model_text(runner.config.model),
                              runner.config.model.vocab_size)
    regex = r"(yes|no), [0-9]{2}!"
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}
    served = Served(runner)
    reqs = []
    for i in range(8):
        req = served.submit(f"r{i}", prompt(3 + 5 * i, offset=i, vocab=400),
                            greedy(200, stop=(EOS,)))
        if i % 3 == 0:
            req.grammar = backend.matcher(GrammarSpec("regex", regex))
        elif i % 3 == 1:
            req.grammar = backend.matcher(GrammarSpec("json_schema", json.dumps(schema)))
        reqs.append(req)
    served.run()
    monitor.close()
    assert not late, [e.describe() for e in late]
    tokenizer = load_model_text(runner.config.model).tokenizer
    assert tokenizer is not None
    completed_json = 0
    for i, req in enumerate(reqs):
        text = tokenizer.decode(req.output_token_ids)
        if i % 3 == 0:  # a regex of bounded length always completes
            assert req.finish_reason is FinishReason.STOP and re.fullmatch(regex, text), text
        elif i % 3 == 1 and req.finish_reason is FinishReason.STOP:
            # Random weights may spend 200 tokens on the whitespace JSON allows.
            assert isinstance(json.loads(text)["ok"], bool), text
            completed_json += 1
    assert completed_json >= 1
