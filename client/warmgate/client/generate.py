"""Building Generate requests and reading their streams, shared by the sync and asyncio clients
and the CLI (so every caller spells the defaults the same way)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from warmgate.v1 import generate_pb2 as gen_pb


def generate_request(prompt_token_ids: Sequence[int] = (), *, prompt: str | None = None,
                     messages: Sequence[Mapping[str, str]] = (), temperature: float = 0.0,
                     top_k: int = 0, top_p: float | None = None, seed: int | None = None,
                     max_tokens: int | None = None, stop_token_ids: Sequence[int] = (),
                     ignore_eos: bool = False, request_id: str = "",
                     logprobs: int | None = None, prompt_logprobs: int | None = None,
                     presence_penalty: float = 0.0, frequency_penalty: float = 0.0,
                     repetition_penalty: float | None = None, min_p: float = 0.0,
                     min_tokens: int = 0, logit_bias: Mapping[int, float] | None = None,
                     json_schema: str | None = None, regex: str | None = None,
                     ebnf: str | None = None) -> gen_pb.GenerateRequest:
    """A GenerateRequest; unset options keep the server's defaults (greedy, 16 tokens).

    The prompt is one of prompt_token_ids, `prompt` (text) or `messages` (chat turns, each
    {"role": ..., "content": ...}); the text forms need a server whose model has a tokenizer.
    logprobs / prompt_logprobs: return each generated / prompt token's log probability with
    that many most likely tokens (0-20); the penalties, min_p, min_tokens and logit_bias
    (token id -> bias) are those of the proto's SamplingParams.
    Structured output: at most one of json_schema (JSON text), regex and ebnf, which the
    output must match (needs a model with a tokenizer too).
    """
    structured = {k: v for k, v in (("json_schema", json_schema), ("regex", regex),
                                    ("ebnf", ebnf)) if v is not None}
    if len(structured) > 1:
        raise ValueError(f"at most one of json_schema, regex and ebnf, got "
                         f"{' and '.join(structured)}")
    sampling = gen_pb.SamplingParams(temperature=temperature, top_k=top_k,
                                     stop_token_ids=list(stop_token_ids),
                                     ignore_eos=ignore_eos, presence_penalty=presence_penalty,
                                     frequency_penalty=frequency_penalty, min_p=min_p,
                                     min_tokens=min_tokens, logit_bias=dict(logit_bias or {}))
    for name, value in (("logprobs", logprobs), ("prompt_logprobs", prompt_logprobs),
                        ("repetition_penalty", repetition_penalty)):
        if value is not None:
            setattr(sampling, name, value)
    if top_p is not None:
        sampling.top_p = top_p
    if seed is not None:
        sampling.seed = seed
    if max_tokens is not None:
        sampling.max_tokens = max_tokens
    for name, text in structured.items():
        setattr(sampling, name, text)
    request = gen_pb.GenerateRequest(
        prompt_token_ids=list(prompt_token_ids), sampling=sampling, request_id=request_id,
        messages=[gen_pb.ChatMessage(role=m["role"], content=m["content"]) for m in messages])
    if prompt is not None:
        request.prompt = prompt
    return request


@dataclass
class Generation:
    """A finished stream, collected: every token, when each arrived, and the last message."""

    token_ids: list[int] = field(default_factory=list)
    # Server-side seconds since arrival, one per token (tokens of one step share a time).
    token_times_s: list[float] = field(default_factory=list)
    # The decoded text (empty when the server's model has no tokenizer).
    text: str = ""
    finish_reason: str = ""
    usage: gen_pb.GenerateUsage | None = None
    # With logprobs / prompt_logprobs asked for: one entry per token / prompt token after
    # the first.
    logprobs: list[gen_pb.TokenLogprobs] = field(default_factory=list)
    prompt_logprobs: list[gen_pb.TokenLogprobs] = field(default_factory=list)

    def add(self, message: gen_pb.GenerateResponse) -> None:
        self.token_ids += list(message.token_ids)
        self.logprobs += list(message.logprobs)
        self.prompt_logprobs += list(message.prompt_logprobs)
        self.text += message.text
        self.token_times_s += [message.time_since_arrival_s] * len(message.token_ids)
        if message.finish_reason != gen_pb.FINISH_REASON_UNSPECIFIED:
            self.finish_reason = gen_pb.FinishReason.Name(message.finish_reason) \
                .removeprefix("FINISH_REASON_").lower()
            self.usage = message.usage

    def to_dict(self) -> dict[str, object]:
        usage = self.usage
        return {
            "token_ids": self.token_ids,
            "text": self.text,
            "finish_reason": self.finish_reason,
            "token_times_s": [round(t, 6) for t in self.token_times_s],
            **({"logprobs": [_logprobs_dict(e) for e in self.logprobs]} if self.logprobs
               else {}),
            **({"prompt_logprobs": [_logprobs_dict(e) for e in self.prompt_logprobs]}
               if self.prompt_logprobs else {}),
            "usage": None if usage is None else {
                "prompt_tokens": usage.prompt_tokens,
                "completion_tokens": usage.completion_tokens,
                "num_steps": usage.num_steps,
                "num_preemptions": usage.num_preemptions,
                "num_draft_tokens": usage.num_draft_tokens,
                "num_accepted_draft_tokens": usage.num_accepted_draft_tokens,
                "queue_time_s": round(usage.queue_time_s, 6),
                "time_to_first_token_s": round(usage.time_to_first_token_s, 6),
            },
        }


def _logprobs_dict(entry: gen_pb.TokenLogprobs) -> dict[str, object]:
    return {"token_id": entry.token.token_id, "logprob": entry.token.logprob,
            "rank": entry.rank,
            "top": [{"token_id": t.token_id, "logprob": t.logprob} for t in entry.top]}
