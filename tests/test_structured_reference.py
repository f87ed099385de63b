"""Structured output on the real SmolLM2-135M-Instruct checkpoint, over randomized JSON schemas
(objects of string, integer, enum, array and nested object properties, several seeds), plus
regex and EBNF grammars, batched beside each other, with and without speculative decoding:

- every output that completed (finish STOP) parses with json.loads and validates against its
  schema (jsonschema), or fully matches its regex / grammar;
- greedy constrained output equals the unconstrained greedy output (the runner's own, which
  tests/test_reference_smollm2.py checks equals transformers') up to the first position where
  the grammar forbids the unconstrained token: there a fresh matcher fed the shared prefix
  must reject it;
- and at every position of every constrained output, against transformers' logits for the
  same sequence (float32): where the grammar allows transformers' greedy token, that is the
  token produced; where it does not, the token produced is the best one the grammar allows
  (logits within LOGIT_TIE of each other count as a tie).
"""

from __future__ import annotations

import json
import random
import re
from typing import Any

import pytest
import torch

from tests.reference_helpers import runner_for
from tests.serving_helpers import Served
from tests.text_helpers import smollm2_dir
from warmgate.server.runner.sampling.grammar_mask import apply_token_bitmask
from warmgate.server.runner.scheduler_output import SamplingParams
from warmgate.server.serving.grammar.backend import grammar_backend
from warmgate.server.serving.grammar.spec import GrammarSpec
from warmgate.server.serving.request import FinishReason
from warmgate.server.text.model_text import load_model_text

jsonschema = pytest.importorskip("jsonschema")
transformers = pytest.importorskip("transformers")
pytest.importorskip("gguf")
# A 135M-parameter model on the CPU, two batched runs per test.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

MAX_TOKENS = 64
# The plain row beside the constrained ones: as long as a typical JSON row (they end after
# 9-60 tokens), and no longer, since each batch runs until its longest row ends: a plain row
# of MAX_TOKENS ran on alone after them, and so did its reference, checking nothing more.
PLAIN_TOKENS = 32
# Seeds per k: each run draws its own schemas.
SEEDS = {0: (0, 1), 3: (3, 4)}
SCHEMAS_PER_SEED = 2
# Our float32 logits and transformers' differ by float rounding; closer than this is a tie.
LOGIT_TIE = 1e-3
WORDS = ("city", "name", "color", "size", "count", "title", "year", "tags", "owner", "kind")


def random_schema(rng: random.Random, depth: int = 0) -> dict[str, Any]:
    """An object schema of 1-4 properties drawn from a small generator."""
    props: dict[str, Any] = {}
    for key in rng.sample(WORDS, rng.randint(1, 4)):
        kind = rng.choice(["string", "integer", "enum", "array"]
                          + (["object"] if depth == 0 else []))
        if kind == "string":
            props[key] = {"type": "string", "maxLength": rng.randint(3, 20)}
        elif kind == "integer":
            props[key] = {"type": "integer", "minimum": 0, "maximum": rng.choice([9, 99, 2025])}
        elif kind == "enum":
            props[key] = {"enum": rng.sample(["red", "green", "blue", "small", "large"], 3)}
        elif kind == "array":
            props[key] = {"type": "array", "items": {"type": rng.choice(["string", "integer"])},
                          "maxItems": 3}
        else:
            props[key] = random_schema(rng, depth + 1)
    required = [k for k in props if rng.random() < 0.7] or [next(iter(props))]
    return {"type": "object", "properties": props, "required": required,
            "additionalProperties": False}


@pytest.fixture(scope="module")
def model() -> dict[str, Any]:
    directory = smollm2_dir()
    runners = {k: runner_for(directory, max_model_len=512, num_spec=k, max_num_seqs=8)
               for k in (0, 3)}
    text = load_model_text(runners[0].config.model)
    backend = grammar_backend(text, runners[0].config.model.vocab_size)
    hf = transformers.AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32)
    return {"runners": runners, "text": text, "backend": backend, "hf": hf.eval()}


def _prompt(model: dict[str, Any], task: str) -> list[int]:
    return list(model["text"].tokenizer.encode_chat([{"role": "user", "content": task}]))


def _run(model: dict[str, Any], k: int, cases: list[tuple[list[int], GrammarSpec | None]],
         max_tokens: list[int] | None = None) -> list[Any]:
    """All cases as one batch (the serving loop), greedy, each case up to its max_tokens
    (MAX_TOKENS by default); the requests back, in order."""
    served = Served(model["runners"][k])
    reqs = []
    for i, (prompt, spec) in enumerate(cases):
        params = SamplingParams(temperature=0.0,
                                max_tokens=MAX_TOKENS if max_tokens is None else max_tokens[i],
                                stop_token_ids=model["text"].eos_token_ids)
        req = served.submit(f"r{i}", prompt, params)
        if spec is not None:
            req.grammar = model["backend"].matcher(spec)
        reqs.append(req)
    served.run()
    return reqs


def _lengths(reqs: list[Any]) -> list[int]:
    """Each request's output length: what an unconstrained reference for it needs to run
    (_check_against_reference reads no further)."""
    return [len(r.output_token_ids) for r in reqs]


def _first_difference(a: list[int], b: list[int]) -> int | None:
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), None)


def _check_against_reference(model: dict[str, Any], spec: GrammarSpec, constrained: list[int],
                             reference: list[int]) -> bool:
    """True when they diverged (at a token the grammar forbids), False when equal."""
    i = _first_difference(constrained, reference)
    if i is None:
        return False
    matcher = model["backend"].matcher(spec)
    for token in constrained[:i]:
        matcher.accept(token)
    mask = torch.zeros(1, matcher.bitmask_width, dtype=torch.int32)
    matcher.matcher.fill_next_token_bitmask(mask, 0)
    word = int(mask[0, reference[i] // 32])
    assert not (word >> (reference[i] % 32)) & 1, (
        f"position {i}: the grammar allows the reference's token {reference[i]} but the "
        f"constrained output took {constrained[i]}")
    return True


@torch.no_grad()
def _check_every_position(model: dict[str, Any], spec: GrammarSpec, prompt: list[int],
                          constrained: list[int]) -> int:
    """Returns the positions where the grammar allowed transformers' greedy token."""
    ids = torch.tensor([prompt + constrained])
    logits = model["hf"](ids).logits[0, len(prompt) - 1:-1].float()  # row i predicts token i
    matcher = model["backend"].matcher(spec)
    mask = torch.zeros(1, matcher.bitmask_width, dtype=torch.int32)
    agreed = 0
    for i, token in enumerate(constrained):
        matcher.matcher.fill_next_token_bitmask(mask, 0)
        allowed = apply_token_bitmask(logits[i][None], mask)[0]
        best = float(allowed.max())
        assert torch.isfinite(allowed[token]), f"position {i}: token {token} not allowed"
        assert float(allowed[token]) >= best - LOGIT_TIE, (
            f"position {i}: took {token} ({float(allowed[token]):.4f}) but the grammar "
            f"allows {int(allowed.argmax())} ({best:.4f})")
        agreed += int(torch.isfinite(allowed[int(logits[i].argmax())]))
        matcher.accept(token)
    return agreed


@pytest.mark.parametrize("k", [0, 3])
def test_random_schemas_parse_validate_and_follow_the_unconstrained_reference(
        model: dict[str, Any], k: int) -> None:
    tokenizer = model["text"].tokenizer
    schemas = [random_schema(random.Random(seed * 100 + n))
               for seed in SEEDS[k] for n in range(SCHEMAS_PER_SEED)]
    prompts = [_prompt(model, "Reply with a JSON object matching this JSON schema, nothing "
                              f"else:\n{json.dumps(s)}") for s in schemas]
    specs = [GrammarSpec("json_schema", json.dumps(s)) for s in schemas]
    # Constrained rows share their batches with a plain one.
    constrained = _run(model, k, [*zip(prompts, specs, strict=True), (prompts[0], None)],
                       [MAX_TOKENS] * len(prompts) + [PLAIN_TOKENS])
    # Each reference runs only as long as its constrained output, the part the
    # first-difference check reads; the first at least as long as the plain row beside the
    # constrained ones (the same prompt), to be compared with it whole.
    plain = constrained[-1].output_token_ids
    reference = _run(model, k, [(p, None) for p in prompts],
                     [max(len(plain), len(constrained[0].output_token_ids)),
                      *_lengths(constrained[1:len(prompts)])])
    assert plain == reference[0].output_token_ids[:len(plain)]
    completed = diverged = agreed = positions = 0
    for prompt, schema, spec, got, ref in zip(prompts, schemas, specs, constrained, reference,
                                              strict=False):
        if got.finish_reason is FinishReason.STOP:
            completed += 1
            value = json.loads(tokenizer.decode(got.output_token_ids))
            jsonschema.validate(value, schema)
        diverged += _check_against_reference(model, spec, got.output_token_ids,
                                             ref.output_token_ids)
        agreed += _check_every_position(model, spec, prompt, got.output_token_ids)
        positions += len(got.output_token_ids)
    # Most end within MAX_TOKENS; the rest were cut by it (and proved nothing above).
    assert completed >= len(schemas) * 3 // 4, completed
    print(f"k={k}: {completed}/{len(schemas)} completed, {diverged} diverged from the "
          "unconstrained reference where the grammar forbade its token; transformers' greedy "
          f"token allowed (and taken) at {agreed} of {positions} positions")


@pytest.mark.parametrize("k", [0, 3])
def test_regex_and_ebnf_outputs_match_and_follow_the_reference(model: dict[str, Any],
                                                               k: int) -> None:
    date = r"[12][0-9]{3}-[01][0-9]-[0-3][0-9]"
    answer = 'root ::= ("Yes" | "No") ", " [A-Z][a-z]+ "."'
    cases = [
        ("When did the Second World War end? Reply with the date only.",
         GrammarSpec("regex", date), lambda t: re.fullmatch(date, t)),
        ("Is Paris the capital of France? Answer yes or no, then name the country.",
         GrammarSpec("ebnf", answer), lambda t: re.fullmatch(r"(Yes|No), [A-Z][a-z]+\.", t)),
    ]
    prompts = [_prompt(model, task) for task, _, _ in cases]
    constrained = _run(model, k, [(p, spec) for p, (_, spec, _) in zip(prompts, cases,
                                                                        strict=True)])
    reference = _run(model, k, [(p, None) for p in prompts], _lengths(constrained))
    for p, (_, spec, check), got, ref in zip(prompts, cases, constrained, reference,
                                             strict=True):
        text = model["text"].tokenizer.decode(got.output_token_ids)
        assert got.finish_reason is FinishReason.STOP and check(text), text
        _check_against_reference(model, spec, got.output_token_ids, ref.output_token_ids)
        _check_every_position(model, spec, p, got.output_token_ids)
