"""Random batches drawn from everything a runner configuration allows.

Each step picks a shape family, then fills it from the live requests: uniform decodes (every
request 1 + k tokens, k = 0 or the speculative length), prefills (whole prompts or chunks of
prompts longer than the token budget), mixed prefill + decode steps, and ragged ones (each
decode with its own draft count). Requests arrive with random prompt lengths up to the model
length and random sampling (greedy; temperature with or without top-k/top-p; seeded; and
each sampling feature - logprobs, prompt logprobs, penalties, min_p, min_tokens, logit_bias
- on about one request in four), and leave when they reach their length, the model length,
or at random (an abort). Requests are finished to make room when KV blocks run short.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, replace

from warmgate.server.devtools.batch_driver import BatchDriver, DrivenRequest, Work
from warmgate.server.runner.sampling import MAX_LOGPROBS
from warmgate.server.runner.scheduler_output import GREEDY, SamplingParams

MODES = ("uniform_decode", "prefill", "mixed", "ragged")
ABORT_PROBABILITY = 0.01
FEATURE_PROBABILITY = 0.25


@dataclass(frozen=True)
class Limits:
    max_num_seqs: int
    max_num_batched_tokens: int
    max_model_len: int
    num_spec: int
    vocab_size: int


def random_params(rng: random.Random) -> SamplingParams:
    kind = rng.choice(("greedy", "temperature", "top_k", "top_p", "top_k_top_p", "seeded"))
    if kind == "greedy":
        return GREEDY
    temperature = rng.choice((0.3, 0.7, 1.0, 1.5))
    top_k = rng.choice((1, 5, 50)) if kind in ("top_k", "top_k_top_p", "seeded") else 0
    top_p = rng.choice((0.5, 0.9, 0.99)) if kind in ("top_p", "top_k_top_p", "seeded") else 1.0
    seed = rng.randrange(2**31) if kind == "seeded" else None
    return SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, seed=seed)


def random_features(rng: random.Random, params: SamplingParams, vocab_size: int
                    ) -> SamplingParams:
    """Each sampling feature (runner/sampling_features.py) on about one request in four, so
    batches mix requests with and without every option."""
    def on() -> bool:
        return rng.random() < FEATURE_PROBABILITY

    min_tokens = rng.randint(1, 48) if on() else 0
    return replace(
        params,
        logprobs=rng.randint(0, MAX_LOGPROBS) if on() else None,
        prompt_logprobs=rng.randint(0, MAX_LOGPROBS) if on() else None,
        presence_penalty=rng.uniform(-2, 2) if on() else 0.0,
        frequency_penalty=rng.uniform(-2, 2) if on() else 0.0,
        repetition_penalty=rng.uniform(0.5, 2) if on() else 1.0,
        min_p=rng.uniform(0, 0.5) if on() else 0.0,
        min_tokens=min_tokens,
        # Stop ids are what min_tokens masks (this scheduler never stops on them).
        stop_token_ids=tuple(rng.sample(range(vocab_size), 2)) if min_tokens else (),
        logit_bias=tuple(sorted({rng.randrange(vocab_size): rng.uniform(-100, 100)
                                 for _ in range(rng.randint(1, 8))}.items())) if on() else ())


class BatchDrawer:
    def __init__(self, sched: BatchDriver, limits: Limits, rng: random.Random,
                 on_new_request: Callable[[DrivenRequest], None] | None = None) -> None:
        """`on_new_request` sees each request before it is added (e.g. to give it a grammar;
        it may change its params and max_new_tokens) and must draw from its own RNG, so the
        batches drawn stay those of the seed."""
        self.sched = sched
        self.limits = limits
        self.rng = rng
        self.on_new_request = on_new_request
        self._next_id = 0

    # -- requests -----------------------------------------------------------------------
    def _new_request(self) -> DrivenRequest:
        lim, rng = self.limits, self.rng
        room = lim.max_model_len - 1 - lim.num_spec  # at least one decode step fits
        # Mostly short prompts, some past the token budget (chunked prefill).
        top = rng.choice((16, 64, lim.max_num_batched_tokens, 2 * lim.max_num_batched_tokens))
        prompt_len = rng.randint(1, max(1, min(room, top)))
        max_new = rng.randint(1, max(1, min(48, room - prompt_len + 1)))
        prompt = [rng.randrange(lim.vocab_size) for _ in range(prompt_len)]
        self._next_id += 1
        params = random_features(rng, random_params(rng), lim.vocab_size)
        req = DrivenRequest(f"cov{self._next_id}", prompt, params, max_new)
        if self.on_new_request is not None:
            self.on_new_request(req)
        self.sched.add(req)
        return req

    def _retire(self) -> None:
        lim = self.limits
        for rid, req in list(self.sched.reqs.items()):
            full = req.num_computed_tokens + 1 + lim.num_spec > lim.max_model_len
            if req.done or (not req.prefilling and full) or \
                    self.rng.random() < ABORT_PROBABILITY:
                self.sched.finish(rid)

    def _decoders(self) -> list[DrivenRequest]:
        return [r for r in self.sched.reqs.values() if not r.prefilling]

    def _prefillers(self, want: int) -> list[DrivenRequest]:
        waiting = [r for r in self.sched.reqs.values() if r.prefilling]
        while len(waiting) < want and len(self.sched.reqs) < 3 * self.limits.max_num_seqs:
            waiting.append(self._new_request())
        self.rng.shuffle(waiting)
        return waiting[:want]

    # -- steps --------------------------------------------------------------------------
    def next_plan(self) -> tuple[str, dict[str, Work]]:
        self._retire()
        mode = self.rng.choice(MODES)
        plan = getattr(self, f"_{mode}")()
        if not plan:  # no decoder yet, or no room: a prefill always makes progress
            mode, plan = "prefill", self._prefill()
        while not plan:  # KV cache full of waiting requests: abort the oldest
            if not self.sched.reqs:
                raise RuntimeError("the KV cache cannot hold one prefill chunk; raise "
                                   "--num-blocks")
            self.sched.finish(next(iter(self.sched.reqs)))
            plan = self._prefill()
        return mode, plan

    def _drafts(self, k: int) -> tuple[int, ...]:
        return tuple(self.rng.randrange(self.limits.vocab_size) for _ in range(k))

    def _add(self, plan: dict[str, Work], budget: list[int], req: DrivenRequest,
             work: Work) -> bool:
        """Add work if the batch's requests, tokens and the free KV blocks allow it."""
        lim, sched = self.limits, self.sched
        if len(plan) >= lim.max_num_seqs or work.num_tokens > budget[0]:
            return False
        if req.num_computed_tokens + work.num_tokens > lim.max_model_len:
            return False
        reserved = sum(sched.blocks_needed(sched.reqs[r], w.num_tokens) for r, w in plan.items())
        if sched.blocks_needed(req, work.num_tokens) > sched.pool.num_free - reserved:
            return False
        plan[req.req_id] = work
        budget[0] -= work.num_tokens
        return True

    def _decode_into(self, plan: dict[str, Work], budget: list[int], count: int,
                     draft_count: int | None) -> None:
        decoders = self._decoders()
        self.rng.shuffle(decoders)
        for req in decoders[:count]:
            k = draft_count if draft_count is not None else self.rng.randint(
                0, self.limits.num_spec)
            self._add(plan, budget, req, Work(1 + k, self._drafts(k)))

    def _prefill_into(self, plan: dict[str, Work], budget: list[int], count: int) -> None:
        for req in self._prefillers(count):
            if budget[0] < 1:
                return
            whole = req.remaining_prompt
            chunk = whole if self.rng.random() < 0.5 else self.rng.randint(1, whole)
            self._add(plan, budget, req, Work(min(chunk, budget[0])))

    def _budget(self) -> list[int]:
        return [self.limits.max_num_batched_tokens]

    def _uniform_decode(self) -> dict[str, Work]:
        lim = self.limits
        k = lim.num_spec if lim.num_spec and self.rng.random() < 0.7 else 0
        plan: dict[str, Work] = {}
        count = self.rng.randint(1, lim.max_num_seqs)
        self._decode_into(plan, self._budget(), count, k)
        return plan

    def _prefill(self) -> dict[str, Work]:
        plan: dict[str, Work] = {}
        self._prefill_into(plan, self._budget(), self.rng.randint(1, self.limits.max_num_seqs))
        return plan

    def _mixed(self) -> dict[str, Work]:
        lim, budget = self.limits, self._budget()
        plan: dict[str, Work] = {}
        num_decode = self.rng.randint(1, max(1, lim.max_num_seqs - 1))
        k = lim.num_spec if self.rng.random() < 0.5 else 0
        self._decode_into(plan, budget, num_decode, k)
        if not plan or len(plan) >= lim.max_num_seqs:
            return {}
        self._prefill_into(plan, budget, self.rng.randint(1, lim.max_num_seqs - len(plan)))
        return plan

    def _ragged(self) -> dict[str, Work]:
        lim, budget = self.limits, self._budget()
        plan: dict[str, Work] = {}
        self._decode_into(plan, budget, self.rng.randint(1, lim.max_num_seqs), None)
        if len(plan) < lim.max_num_seqs and self.rng.random() < 0.5:
            self._prefill_into(plan, budget, self.rng.randint(1, lim.max_num_seqs - len(plan)))
        return plan
