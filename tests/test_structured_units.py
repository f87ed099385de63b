"""Structured output's parts on their own: the TokenizerInfo built from tokenizer.json equals
xgrammar's from_huggingface, xgrammar's errors as one line, per-draft-position bitmask rows
with rollback, the runner's row layout and the sampler's mask (greedy, stochastic and
speculative verification). The compile cache and its bound: test_grammar_compiles.py."""

from __future__ import annotations

import json

import pytest
import torch
import xgrammar as xgr
from tokenizers import Tokenizer

from tests.text_helpers import train_tokenizer
from warmgate.server.runner.request_state import RequestState, ScheduledRequest
from warmgate.server.runner.sampling.grammar_mask import apply_token_bitmask
from warmgate.server.runner.sampling.sampler import Sampler
from warmgate.server.runner.scheduler_output import (
    GREEDY,
    GrammarOutput,
    ModelRunnerOutput,
    SamplingParams,
)
from warmgate.server.runner.token_bitmask import TokenBitmaskBuffer
from warmgate.server.serving.grammar.backend import GrammarBackend
from warmgate.server.serving.grammar.spec import (
    GrammarError,
    GrammarSpec,
    GrammarViolation,
    one_line,
)
from warmgate.server.serving.grammar.tokenizer_info import tokenizer_info_of
from warmgate.server.serving.limits import SchedulerLimits
from warmgate.server.serving.request import ServingRequest
from warmgate.server.serving.scheduler import Scheduler

VOCAB = 512  # the tiny model's: larger than the trained tokenizers, as padded vocabularies are
EOS = 2


@pytest.fixture(scope="module", params=["byte_level", "byte_fallback"])
def tokenizer(request: pytest.FixtureRequest) -> Tokenizer:
    return train_tokenizer(request.param)


@pytest.fixture(scope="module")
def backend() -> GrammarBackend:
    return GrammarBackend(tokenizer_info_of(train_tokenizer("byte_level"), VOCAB, [EOS]))


def test_tokenizer_info_equals_xgrammars_from_huggingface(tokenizer: Tokenizer) -> None:
    transformers = pytest.importorskip("transformers")
    hf = transformers.PreTrainedTokenizerFast(tokenizer_object=tokenizer)
    ref = xgr.TokenizerInfo.from_huggingface(hf, vocab_size=VOCAB, stop_token_ids=[EOS])
    ours = tokenizer_info_of(tokenizer, VOCAB, [EOS])
    assert ours.vocab_type == ref.vocab_type
    assert ours.add_prefix_space == ref.add_prefix_space
    assert ours.vocab_size == ref.vocab_size == VOCAB
    assert ours.decoded_vocab == ref.decoded_vocab
    assert ours.stop_token_ids == [EOS]
    assert ours.special_token_ids == ref.special_token_ids


def test_tokenizer_info_needs_stop_ids() -> None:
    with pytest.raises(ValueError, match="end-of-sequence"):
        tokenizer_info_of(train_tokenizer("byte_level"), VOCAB, [])


@pytest.mark.parametrize(("spec", "words"), [
    (GrammarSpec("json_schema", "[1,"), "Failed to parse JSON"),
    (GrammarSpec("regex", "a{2"), "regex"),
    (GrammarSpec("ebnf", "root ::= ("), "EBNF"),
])
def test_compile_errors_are_one_line_naming_the_field(backend: GrammarBackend,
                                                       spec: GrammarSpec, words: str) -> None:
    with pytest.raises(GrammarError) as info:
        backend.compile(spec)
    assert info.value.field == f"sampling.{spec.kind}"
    assert words in info.value.message and "\n" not in info.value.message
    assert info.value.message.startswith(f"not a valid {spec.kind}: ")


def test_one_line_drops_the_cpp_prefix_and_caps_the_length() -> None:
    exc = RuntimeError("[08:25:31] /project/cpp/x.cc:94: Check failed: (a) is false: Bad "
                       "thing\n  at line 2")
    assert one_line(exc) == "Bad thing at line 2"
    assert len(one_line(RuntimeError("x" * 1000))) == 300


def _allowed(bitmask: torch.Tensor, row: int) -> set[int]:
    words = bitmask[row].tolist()
    return {t for t in range(VOCAB) if (words[t // 32] >> (t % 32)) & 1}


def _ids(tok: Tokenizer, text: str) -> list[int]:
    return list(tok.encode(text, add_special_tokens=False).ids)


def test_draft_rows_are_the_masks_after_each_draft_and_the_matcher_rolls_back(
        backend: GrammarBackend) -> None:
    tok = train_tokenizer("byte_level")
    spec = GrammarSpec("json_schema", json.dumps(
        {"type": "object", "properties": {"capital": {"type": "string"}},
         "required": ["capital"]}))
    grammar = backend.matcher(spec)
    drafts = _ids(tok, '{"capital": "Paris"}')
    assert len(drafts) >= 3
    rows = torch.zeros(len(drafts) + 1, grammar.bitmask_width, dtype=torch.int32)
    grammar.fill_rows(rows, 0, drafts)
    # The reference: a second matcher stepped through the same drafts.
    ref = backend.matcher(spec)
    expected = torch.zeros_like(rows)
    for j, token in enumerate(drafts):
        ref.matcher.fill_next_token_bitmask(expected, j)
        assert token in _allowed(expected, j)
        assert not ref.accept(token)
    ref.matcher.fill_next_token_bitmask(expected, len(drafts))
    assert torch.equal(rows, expected)
    assert _allowed(rows, len(drafts)) == {EOS}  # complete: only the end-of-sequence
    # Rolled back: the request's matcher still sits before the drafts.
    again = torch.zeros(1, grammar.bitmask_width, dtype=torch.int32)
    grammar.matcher.fill_next_token_bitmask(again, 0)
    assert torch.equal(again[0], rows[0])
    # A draft the grammar rejects: its own row forbids it; the rows after stay all-allowed.
    bad = [drafts[0], _ids(tok, "x")[0], drafts[1]]
    rows = torch.zeros(4, grammar.bitmask_width, dtype=torch.int32)
    grammar.fill_rows(rows, 0, bad)
    assert bad[1] not in _allowed(rows, 1)
    assert (rows[2:] == -1).all()
    for token in drafts:
        terminated = grammar.accept(token)
    assert not terminated and grammar.accept(EOS) and grammar.is_terminated
    with pytest.raises(GrammarViolation):
        grammar.accept(drafts[0])


def _scheduled(req_id: str, drafts: tuple[int, ...]) -> ScheduledRequest:
    state = RequestState(req_id, [1, 2, 3], GREEDY, [1], 3, output_token_ids=[4])
    return ScheduledRequest(state, num_computed_tokens=3, num_scheduled_tokens=1 + len(drafts),
                            draft_token_ids=drafts)


def test_the_runner_lays_rows_out_in_logits_order_with_plain_rows_all_allowed() -> None:
    buf = TokenBitmaskBuffer(max_rows=16, vocab_size=VOCAB, device=torch.device("cpu"))
    sampling = [_scheduled("plain", (7, 7)), _scheduled("a", (5,)), _scheduled("b", ())]
    src = torch.arange(3 * buf.width, dtype=torch.int32).reshape(3, buf.width)
    out = buf.layout(sampling, GrammarOutput(["a", "b"], src))
    assert out is not None and out.shape == (6, buf.width)
    assert (out[:3] == -1).all()  # plain: 1 + 2 rows
    assert torch.equal(out[3:], src)
    assert buf.layout(sampling, None) is None
    assert buf.layout(sampling, GrammarOutput([], None)) is None
    with pytest.raises(ValueError, match="samples nothing"):
        buf.layout(sampling, GrammarOutput(["gone"], src[:1]))
    with pytest.raises(ValueError, match="has 3 rows"):
        buf.layout(sampling, GrammarOutput(["b"], src))
    with pytest.raises(ValueError, match="int32"):
        buf.layout(sampling, GrammarOutput(["b"], src[:1].long()))


def _mask(allowed: list[set[int]]) -> torch.Tensor:
    width = (VOCAB + 31) // 32
    out = torch.zeros(len(allowed), width, dtype=torch.int32)
    for r, tokens in enumerate(allowed):
        for t in tokens:
            out[r, t // 32] |= torch.tensor(1 << (t % 32), dtype=torch.int64).to(torch.int32)
    return out


def test_sampling_draws_only_allowed_tokens_and_leaves_plain_rows_alone() -> None:
    torch.manual_seed(0)
    logits = torch.randn(4, VOCAB)
    allowed = [{3, 77}, set(range(VOCAB)), {500, 31, 32}, {0}]
    bitmask = _mask(allowed)
    bitmask[1] = -1
    masked = apply_token_bitmask(logits, bitmask)
    assert masked is not logits  # the model's own logits stay as they were (logprobs)
    for r, tokens in enumerate(allowed):
        keep = torch.tensor([t in tokens for t in range(VOCAB)])
        assert torch.equal(masked[r][keep], logits[r][keep])
        assert torch.isinf(masked[r][~keep]).all()
    sampler = Sampler()
    params = [GREEDY, GREEDY, SamplingParams(temperature=1.0, top_k=2), GREEDY]
    for _ in range(20):
        tokens = sampler.sample(logits, params, [None] * 4, token_bitmask=bitmask).tolist()
        assert [t in a for t, a in zip(tokens, allowed, strict=True)] == [True] * 4
        assert tokens[1] == int(logits[1].argmax())  # the plain row: today's choice
    # Verification: row j of a request is the mask after its first j drafts.
    drafts = [[3], [9]]
    verify_mask = _mask([{3}, {40}, set(range(VOCAB)), set(range(VOCAB))])
    out, accepted = sampler.verify(logits, drafts, [GREEDY, GREEDY], [None, None],
                                   token_bitmask=verify_mask)
    assert out[0] == [3, 40] and accepted[0] == 1
    first = int(logits[2].argmax())  # request 1's rows are unconstrained
    assert out[1] == ([9, int(logits[3].argmax())] if first == 9 else [first])


class _RejectingGrammar:
    def accept(self, token: int) -> bool:
        raise GrammarViolation(f"token {token} is not allowed")


def test_a_token_its_grammar_rejects_ends_that_request_alone() -> None:
    sched = Scheduler(SchedulerLimits(max_num_seqs=4, max_num_batched_tokens=64, block_size=4,
                                      num_blocks=16, max_model_len=32))
    bad = ServingRequest("bad", [1, 2, 3], SamplingParams(temperature=0.0), 0.0)
    bad.grammar = _RejectingGrammar()  # type: ignore[assignment]
    good = ServingRequest("good", [4, 5], SamplingParams(temperature=0.0), 0.0)
    sched.add(bad)
    sched.add(good)
    plan = sched.schedule(0.0)
    events = sched.update(plan, ModelRunnerOutput(["bad", "good"], [[7], [8]]), 1.0)
    by_id = {e.req_id: e for e in events}
    assert isinstance(by_id["bad"].error, GrammarViolation)
    assert by_id["good"].token_ids == [8] and by_id["good"].error is None
    assert [r.req_id for r in sched.running] == ["good"]
