"""GenerateRequest (proto) -> a checked prompt and SamplingParams, or INVALID_ARGUMENT naming
every offending field. Needs only the resolved config, so it answers before the model loads."""

from __future__ import annotations

import math
from dataclasses import dataclass

from warmgate.server.api.prompt import prompt_token_ids, prompt_token_ids_async
from warmgate.server.api.sampling_options import sampling_options
from warmgate.server.config.runner_config import RunnerConfig
from warmgate.server.config.sampling_limits import GREEDY_BELOW_TEMPERATURE
from warmgate.server.core.errors import FieldViolation, InvalidArgument
from warmgate.server.runner.scheduler_output import SamplingParams
from warmgate.server.serving.grammar.spec import GrammarSpec, grammar_unavailable_reason
from warmgate.server.serving.limits import SchedulerLimits
from warmgate.server.text.errors import PromptError
from warmgate.server.text.model_text import ModelText
from warmgate.v1 import generate_pb2 as gen_pb

DEFAULT_MAX_TOKENS = 16
MAX_REQUEST_ID_CHARS = 128
# Stop ids are checked one by one per generated token; thousands would be a mistake.
MAX_STOP_TOKEN_IDS = 64
# Longer grammars are refused before they reach the compiler (whose time grows with them).
MAX_GRAMMAR_CHARS = 100_000


@dataclass(frozen=True)
class ParsedRequest:
    prompt_token_ids: list[int]
    params: SamplingParams
    client_request_id: str
    # Which request field the prompt came in: prompt_token_ids, prompt or messages.
    prompt_field: str = "prompt_token_ids"
    # Structured output: the grammar the output must match (compiled by the caller).
    grammar: GrammarSpec | None = None


def _first_outside(values: list[int], vocab_size: int) -> int | None:
    return next((i for i, t in enumerate(values) if not 0 <= t < vocab_size), None)


async def parse_generate_request_async(request: gen_pb.GenerateRequest, config: RunnerConfig,
                                       text: ModelText) -> ParsedRequest:
    """parse_generate_request, with the prompt tokenized (and its chat template rendered)
    off the event loop."""
    try:
        prompt: tuple[str, list[int]] | PromptError = await prompt_token_ids_async(request,
                                                                                   text)
    except PromptError as exc:
        prompt = exc
    return parse_generate_request(request, config, text, prompt)


def parse_generate_request(request: gen_pb.GenerateRequest, config: RunnerConfig,
                           text: ModelText | None = None,
                           prompt_ids: tuple[str, list[int]] | PromptError | None = None
                           ) -> ParsedRequest:
    """`text` (the model's tokenizer and EOS ids) defaults to none: token ids only;
    `prompt_ids`, the prompt's (field, token ids) or why it has none, when already known."""
    text = text if text is not None else ModelText()
    vocab, max_len = config.model.vocab_size, config.model.max_model_len
    bad: list[FieldViolation] = []
    field, prompt = "prompt_token_ids", list[int]()
    try:
        if isinstance(prompt_ids, PromptError):
            raise prompt_ids
        field, prompt = prompt_ids if prompt_ids is not None else prompt_token_ids(request,
                                                                                   text)
    except PromptError as exc:
        bad += [FieldViolation(f, exc.message) for f in exc.fields]
    else:
        if (i := _first_outside(prompt, vocab)) is not None:
            bad.append(FieldViolation(f"prompt_token_ids[{i}]" if field == "prompt_token_ids"
                                      else field, f"{prompt[i]} is outside the vocabulary "
                                      f"[0, {vocab})"))
        elif len(prompt) >= max_len:
            bad.append(FieldViolation(field, f"{len(prompt)} tokens leave no room to generate "
                                      f"under max_model_len = {max_len}"))
    s = request.sampling
    # No upper bound (config.sampling_limits says why).
    if not math.isfinite(s.temperature) or s.temperature < 0:
        bad.append(FieldViolation("sampling.temperature",
                                  f"must be a finite number >= 0, got {s.temperature}"))
    if s.top_k < 0:
        bad.append(FieldViolation("sampling.top_k", f"must be >= 0 (0 keeps all), got "
                                  f"{s.top_k}"))
    top_p = s.top_p if s.HasField("top_p") else 1.0
    if not 0.0 < top_p <= 1.0:  # also false for NaN
        bad.append(FieldViolation("sampling.top_p", f"must be in (0, 1], got {top_p}"))
    max_tokens = s.max_tokens if s.HasField("max_tokens") else DEFAULT_MAX_TOKENS
    if max_tokens < 1:
        bad.append(FieldViolation("sampling.max_tokens", f"must be >= 1, got {max_tokens}"))
    stops = list(s.stop_token_ids)
    if len(stops) > MAX_STOP_TOKEN_IDS:
        bad.append(FieldViolation("sampling.stop_token_ids", f"{len(stops)} ids, at most "
                                  f"{MAX_STOP_TOKEN_IDS}"))
    elif (i := _first_outside(stops, vocab)) is not None:
        bad.append(FieldViolation(f"sampling.stop_token_ids[{i}]", f"{stops[i]} is outside "
                                  f"the vocabulary [0, {vocab})"))
    options = sampling_options(s, vocab, max_tokens, bad)
    if len(request.request_id) > MAX_REQUEST_ID_CHARS:
        bad.append(FieldViolation("request_id", f"{len(request.request_id)} characters, at "
                                  f"most {MAX_REQUEST_ID_CHARS}"))
    grammar = _grammar_spec(s, text, bad)
    if not bad:
        _check_fits_cache(config, len(prompt), max_tokens, bad)
    if bad:
        raise InvalidArgument(*bad)
    temperature = float(s.temperature) if s.temperature >= GREEDY_BELOW_TEMPERATURE else 0.0
    # The model's EOS ids stop a request through the same path as the caller's stop ids.
    eos = () if s.ignore_eos else tuple(t for t in text.eos_token_ids if t not in stops)
    params = SamplingParams(temperature=temperature, top_k=s.top_k, top_p=top_p,
                            seed=s.seed if s.HasField("seed") else None, max_tokens=max_tokens,
                            stop_token_ids=tuple(stops) + eos, **options)
    return ParsedRequest(prompt, params, request.request_id, field, grammar)


def _grammar_spec(s: gen_pb.SamplingParams, text: ModelText, bad: list[FieldViolation]
                  ) -> GrammarSpec | None:
    """The request's grammar, checked as far as it can be without compiling it."""
    kind = s.WhichOneof("structured")
    if kind is None:
        return None
    spec = GrammarSpec(kind, getattr(s, kind))
    reason = grammar_unavailable_reason(text)
    if reason is not None:
        bad.append(FieldViolation(spec.field, reason))
    elif not spec.text.strip():
        bad.append(FieldViolation(spec.field, "is empty"))
    elif len(spec.text) > MAX_GRAMMAR_CHARS:
        bad.append(FieldViolation(spec.field, f"{len(spec.text)} characters, at most "
                                  f"{MAX_GRAMMAR_CHARS}"))
    if s.min_tokens > 0 and not any(v.field == "sampling.min_tokens" for v in bad):
        # A complete grammar allows only EOS, which min_tokens forbids: every token would be
        # masked, and the sampler would draw from nothing.
        bad.append(FieldViolation("sampling.min_tokens", f"cannot be combined with {spec.field}: "
                                  "the grammar decides where the output ends"))
    return spec


def _check_fits_cache(config: RunnerConfig, prompt_len: int, max_tokens: int,
                      bad: list[FieldViolation]) -> None:
    """A request the whole KV cache cannot hold would wait (or be preempted) forever."""
    num_blocks = config.cache.num_blocks or 0
    capacity = SchedulerLimits.of_config(config).max_tokens_in_cache
    longest = min(prompt_len + max_tokens, config.model.max_model_len)
    if longest > capacity:
        bad.append(FieldViolation("sampling.max_tokens", f"prompt + max_tokens reach {longest} "
                                  f"tokens but the whole KV cache holds {capacity} "
                                  f"({num_blocks - 1} blocks of {config.cache.block_size}); "
                                  f"ask for fewer tokens or raise the server's --num-blocks"))
