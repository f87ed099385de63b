"""The serving rehearsal: real Generates through the server's own handler before health first
turns SERVING.

The warmup plan drives the runner directly. The code that serving wraps around it, once per
request or per step, is not on that path: the Generate handler, the serving driver and its
hand-off to the runner worker, the scheduler, the engine process's pipe and serving loop, and
the events' way back to the stream. Without a rehearsal all of it runs for the first time
under the first client's request (about 150 functions across the front and the engine
process run for the first time there). So two requests go through it. The first is greedy,
with a short prompt and room for many tokens. Once its first token is back, the second, a
longer seeded-random one, goes out, and its prompt goes in beside the first one's decode (a
mixed prefill+decode step). Once the second has its first token, the first is cut, as when a
client goes away (the abort path), and the second runs to its end.

So the loop runs a prefill, uniform decodes, a mixed step, an abort, each sampler flavour, and
the responses are serialized as gRPC would send them. They stay out of the request metrics (a
client never sent them); the steps they ran are counted like any other.
"""

from __future__ import annotations

import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from contextlib import aclosing
from contextvars import ContextVar
from dataclasses import dataclass

from warmgate.server.serving.limits import SchedulerLimits
from warmgate.v1 import generate_pb2 as gen_pb

# Set while the rehearsal's requests run (a task copies it to the tasks it starts): admission
# takes them before health is SERVING, and the request metrics leave them out.
REHEARSING: ContextVar[bool] = ContextVar("warmgate_rehearsing", default=False)

# The first request's tokens: room for its decodes to go on until the second's prompt is in
# (the hand-off back and forth takes a few of a small model's steps; it is cut after that).
FIRST_MAX_TOKENS = 64
SECOND_MAX_TOKENS = 4
# The second prompt: several KV blocks, still a small prefill on any model.
SECOND_PROMPT_LEN = 64

Generate = Callable[[gen_pb.GenerateRequest], AsyncGenerator[gen_pb.GenerateResponse, None]]


@dataclass(frozen=True)
class RehearsalResult:
    """What the two requests' streams carried, and how long they took."""

    num_tokens: int
    seconds: float


def _prompt(length: int, vocab_size: int, offset: int) -> list[int]:
    # Spread over the vocabulary, away from id 0 (often padding or a special token).
    return [(offset + 7 * i) % (vocab_size - 1) + 1 for i in range(length)]


def rehearsal_requests(limits: SchedulerLimits, vocab_size: int
                       ) -> tuple[gen_pb.GenerateRequest, gen_pb.GenerateRequest]:
    """The two requests, fitted to the model's length and the KV cache. The first prompt is
    2 + num_speculative_steps tokens long, as the warmup's prefills are, so its first step is
    a prefill and never taken for a uniform decode."""
    # Each request alone must fit the model's length and the whole KV cache (Generate
    # refuses one that does not); together they may wait for each other's blocks.
    room = min(limits.max_model_len, limits.max_tokens_in_cache)
    first_len = 2 + limits.num_speculative_steps
    first = gen_pb.GenerateRequest(prompt_token_ids=_prompt(first_len, vocab_size, 1),
                                   request_id="warmgate-rehearsal-greedy")
    first.sampling.max_tokens = max(1, min(FIRST_MAX_TOKENS, room - first_len))
    first.sampling.ignore_eos = True
    second_len = max(1, min(SECOND_PROMPT_LEN, room - SECOND_MAX_TOKENS))
    second = gen_pb.GenerateRequest(prompt_token_ids=_prompt(second_len, vocab_size, 3),
                                    request_id="warmgate-rehearsal-random")
    second.sampling.temperature = 1.0
    second.sampling.seed = 0
    second.sampling.max_tokens = max(1, min(SECOND_MAX_TOKENS, room - second_len))
    second.sampling.ignore_eos = True
    return first, second


async def _drain(stream: AsyncIterator[gen_pb.GenerateResponse]) -> int:
    """Read a stream to its end, serializing each message; the tokens it carried."""
    tokens = 0
    async for message in stream:
        tokens += _tokens(message)
    return tokens


async def rehearse(generate: Generate, first: gen_pb.GenerateRequest,
                   second: gen_pb.GenerateRequest) -> RehearsalResult:
    """Run both requests through `generate` (the Generate handler), the first cut once the
    second has its first token; whatever a stream raises is raised here."""
    mark = REHEARSING.set(True)
    try:
        start = time.perf_counter()
        async with aclosing(generate(first)) as stream:  # a stream cut short aborts its request
            tokens = _tokens(await anext(stream))
            async with aclosing(generate(second)) as later:
                tokens += _tokens(await anext(later))
                await stream.aclose()  # a client gone: the first request is aborted
                tokens += await _drain(later)
        return RehearsalResult(tokens, time.perf_counter() - start)
    finally:
        REHEARSING.reset(mark)


def _tokens(message: gen_pb.GenerateResponse) -> int:
    message.SerializeToString()  # as gRPC sends it
    return len(message.token_ids)
