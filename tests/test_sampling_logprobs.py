"""Logprobs and prompt logprobs against transformers: a tiny random Llama saved by
transformers, served by warmgate through the scheduler (chunked prefill, with and without
speculative decoding), must return log_softmax of transformers' logits at every position.

Tolerance: 2e-4 absolute on float32 logprobs (the logits themselves agree to 1e-4,
test_reference_tiny.py; log_softmax adds one logsumexp of the same order).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.reference_helpers import runner_for
from tests.serving_helpers import Served
from warmgate.server.runner.model_runner import ModelRunner
from warmgate.server.runner.sampling import gather_logprobs
from warmgate.server.runner.scheduler_output import SamplingParams

transformers = pytest.importorskip("transformers")

VOCAB = 256
MAX_LEN = 96
ATOL = 2e-4


def _hf_model(directory: Path) -> Any:
    config = transformers.LlamaConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16,
        max_position_embeddings=MAX_LEN, rms_norm_eps=1e-5,
        bos_token_id=None, eos_token_id=None, pad_token_id=None)
    torch.manual_seed(3)
    model = transformers.LlamaForCausalLM(config).to(torch.float32).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if not name.endswith("norm.weight"):
                p.copy_(torch.randn_like(p) / p.shape[-1] ** 0.5)
    model.save_pretrained(directory)
    return model


@pytest.fixture(scope="module")
def hf(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Path]:
    directory = tmp_path_factory.mktemp("tiny_llama")
    return _hf_model(directory), directory


def test_gather_logprobs_is_log_softmax_with_ranks_and_top_n() -> None:
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(5, 50, generator=gen)
    want = torch.log_softmax(logits, dim=-1)
    got = gather_logprobs(logits, [4, 0, 2], [7, 3, 49], [0, 3, 20])
    for entry, row, token, n in zip(got, [4, 0, 2], [7, 3, 49], [0, 3, 20], strict=True):
        assert entry.token_id == token
        assert entry.logprob == pytest.approx(want[row, token].item(), abs=1e-6)
        assert entry.rank == int((want[row] > want[row, token]).sum()) + 1
        values, ids = want[row].topk(n)
        assert [t for t, _ in entry.top] == ids.tolist()
        assert [v for _, v in entry.top] == pytest.approx(values.tolist(), abs=1e-6)


@pytest.mark.parametrize("num_spec", [0, 2])
def test_served_logprobs_equal_transformers_log_softmax(hf: tuple[Any, Path],
                                                        num_spec: int) -> None:
    model, directory = hf
    runner = runner_for(directory, max_model_len=MAX_LEN, num_spec=num_spec)
    # A 16-token budget: the 40-token prompt arrives in three chunks.
    config = dataclasses.replace(runner.config, scheduler=dataclasses.replace(
        runner.config.scheduler, max_num_batched_tokens=16))
    served = Served(ModelRunner(config))
    gen = torch.Generator().manual_seed(1)
    prompt = torch.randint(0, VOCAB, (40,), generator=gen).tolist()
    # The bias makes every token 17 (so the drafter's repeats get accepted), while the
    # logprobs stay the model's own.
    params = SamplingParams(temperature=0.0, max_tokens=12, logprobs=4, prompt_logprobs=2,
                            logit_bias=((17, 100.0),))
    served.submit("r", prompt, params)
    served.submit("plain", prompt[:9], SamplingParams(temperature=0.0, max_tokens=5))
    served.run()
    events = [e for e in served.events if e.req_id == "r"]
    tokens = [t for e in events for t in e.token_ids]
    assert tokens == [17] * 12
    assert [len(e.logprobs) for e in events] == [len(e.token_ids) for e in events]
    assert all(not e.logprobs for e in served.events if e.req_id == "plain")
    with torch.no_grad():
        want = torch.log_softmax(model(torch.tensor([prompt + tokens])).logits[0].float(), -1)
    generated = [lp for e in events for lp in e.logprobs]
    for i, (token, entry) in enumerate(zip(tokens, generated, strict=True)):
        row = want[len(prompt) - 1 + i]
        assert entry.token_id == token
        assert entry.logprob == pytest.approx(row[token].item(), abs=ATOL)
        assert entry.rank == int((row > row[token]).sum()) + 1
        assert [t for t, _ in entry.top] == row.topk(4).indices.tolist()
    assert [e.prompt_logprobs != [] for e in events] == [True] + [False] * (len(events) - 1)
    prompt_lp = events[0].prompt_logprobs
    assert [e.token_id for e in prompt_lp] == prompt[1:]
    for p, entry in enumerate(prompt_lp):
        assert entry.logprob == pytest.approx(want[p, prompt[p + 1]].item(), abs=ATOL)
        assert [t for t, _ in entry.top] == want[p].topk(2).indices.tolist()
    if num_spec:
        assert any(e.num_accepted_draft_tokens for e in events)  # logprobs of drafts too


def test_prompt_logprobs_survive_preemption_once_each() -> None:
    """A preempted request recomputes its prompt: its prompt logprobs still come once, one
    per prompt token, equal to the request's alone; generated logprobs follow its tokens."""
    from tests.runner_helpers import make_runner, prompt

    params = SamplingParams(temperature=0.0, max_tokens=30, logprobs=1, prompt_logprobs=1)
    prompts = [prompt(40, offset=i) for i in range(3)]
    alone = {}
    for i, p in enumerate(prompts):
        served = Served(make_runner())
        served.submit(f"r{i}", p, params)
        served.run()
        alone[f"r{i}"] = served.events
    # 40 blocks of 4 tokens: three 70-token requests cannot all stay.
    served = Served(make_runner(num_blocks=41, max_num_batched_tokens=32))
    reqs = [served.submit(f"r{i}", p, params) for i, p in enumerate(prompts)]
    served.run()
    assert sum(r.usage.num_preemptions for r in reqs) > 0
    for r, p in zip(reqs, prompts, strict=True):
        events = [e for e in served.events if e.req_id == r.req_id]
        first = alone[r.req_id]
        assert [t for e in events for t in e.token_ids] == [t for e in first
                                                            for t in e.token_ids]
        got = [e for ev in events for e in ev.prompt_logprobs]
        want = first[0].prompt_logprobs
        assert [e.token_id for e in got] == p[1:]
        assert [e.logprob for e in got] == pytest.approx([e.logprob for e in want], abs=1e-4)
        assert [e.token_id for ev in events for e in ev.logprobs] == r.output_token_ids
