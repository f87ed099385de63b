"""warmgate.v1.Generation: Generate streams over the serving loop.

Each call becomes a ServingRequest submitted to the ServingLoop; a driver task keeps the loop
running on the controller's worker thread (between warmup jobs, which it yields to) while any
request is left. The worker hands each step's events to the event loop with one
call_soon_threadsafe, and every stream reads its own queue. A stream that ends early (client
cancel, deadline) aborts its request, which frees its KV blocks at the next step boundary.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import grpc

from warmgate.server.api.generate_request import parse_generate_request
from warmgate.server.api.logprobs_proto import token_logprobs_to_proto
from warmgate.server.config.runner_config import RunnerConfig
from warmgate.server.config.serving_config import ServingConfig
from warmgate.server.control.controller import WarmupController
from warmgate.server.control.engine import WarmupEngine
from warmgate.server.core.errors import (
    FailedPrecondition,
    ResourceExhausted,
    ShuttingDown,
    Unavailable,
    WarmgateError,
)
from warmgate.server.core.failures import describe_failure, is_out_of_memory
from warmgate.server.serving.loop import ServingLoop
from warmgate.server.serving.ngram import NgramIndex
from warmgate.server.serving.request import ServingRequest, StepEvent, Usage
from warmgate.server.serving.scheduler import Scheduler, SchedulerLimits
from warmgate.server.telemetry.serving_metrics import ServingMetrics
from warmgate.server.text.detokenizer import IncrementalDetokenizer
from warmgate.server.text.model_text import ModelText
from warmgate.v1 import generate_pb2 as gen_pb
from warmgate.v1 import generate_pb2_grpc as gen_grpc

logger = logging.getLogger(__name__)

_FINISH = {"length": gen_pb.FINISH_REASON_LENGTH, "stop": gen_pb.FINISH_REASON_STOP,
           "max_model_len": gen_pb.FINISH_REASON_MAX_MODEL_LEN}
DRAIN_POLL_S = 0.05


@dataclass
class _Stream:
    req: ServingRequest
    queue: asyncio.Queue[StepEvent]
    # Turns the stream's tokens into text deltas; None when the model has no tokenizer.
    detokenizer: IncrementalDetokenizer | None = None
    num_sent: int = 0

    def text_of(self, event: StepEvent) -> str:
        if self.detokenizer is None:
            return ""
        text = self.detokenizer.push(event.token_ids)
        return text + self.detokenizer.flush() if event.finish_reason is not None else text


def _stream_error(error: BaseException) -> WarmgateError | BaseException:
    """A step's exception as what the stream ends with."""
    if isinstance(error, WarmgateError):
        return error
    if is_out_of_memory(error):
        return ResourceExhausted(describe_failure("serving", error))
    return error  # INTERNAL, logged by the error mapping


def _usage_to_proto(req: ServingRequest, usage: Usage, completion: int) -> gen_pb.GenerateUsage:
    first_token = usage.first_token_s if usage.first_token_s is not None else req.arrival_s
    scheduled = usage.first_scheduled_s if usage.first_scheduled_s is not None \
        else req.arrival_s
    return gen_pb.GenerateUsage(
        prompt_tokens=len(req.prompt_token_ids), completion_tokens=completion,
        num_steps=usage.num_steps, num_preemptions=usage.num_preemptions,
        num_draft_tokens=usage.num_draft_tokens,
        num_accepted_draft_tokens=usage.num_accepted_draft_tokens,
        queue_time_s=scheduled - req.arrival_s, time_to_first_token_s=first_token - req.arrival_s)


class GenerationService(gen_grpc.GenerationServicer):
    def __init__(self, controller: WarmupController, engine: WarmupEngine,
                 runner_config: RunnerConfig,
                 serving_config: ServingConfig, metrics: ServingMetrics | None = None,
                 text: ModelText | None = None) -> None:
        self._controller = controller
        self._text = text if text is not None else ModelText()
        self._engine = engine
        self._runner_config = runner_config
        self._config = serving_config
        self._metrics = metrics
        self._limits = SchedulerLimits.of_config(runner_config)
        self._streams: dict[str, _Stream] = {}
        self._serving: ServingLoop | None = None
        self._driver: asyncio.Task[None] | None = None
        self._ids = itertools.count()
        self._closing = False
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def serving_loop(self) -> ServingLoop | None:
        """The loop, once the first request built it (tests read its scheduler)."""
        return self._serving

    async def Generate(self, request: gen_pb.GenerateRequest,
                       context: grpc.aio.ServicerContext) -> AsyncIterator[gen_pb.GenerateResponse]:
        arrival = time.perf_counter()
        parsed = parse_generate_request(request, self._runner_config, self._text)
        serving = self._admit()
        req_id = f"gen-{next(self._ids)}"
        k = self._limits.num_speculative_steps
        drafter = NgramIndex(self._config.ngram_min, self._config.ngram_max) if k else None
        req = ServingRequest(req_id, parsed.prompt_token_ids, parsed.params, arrival, drafter)
        tokenizer = self._text.tokenizer
        stream = _Stream(req, asyncio.Queue(),
                         tokenizer.detokenizer() if tokenizer is not None else None)
        self._streams[req_id] = stream
        logger.debug("generate %s%s: %d prompt tokens from %s, max_tokens %d, stop ids %s",
                     req_id,
                     f" ({parsed.client_request_id})" if parsed.client_request_id else "",
                     len(req.prompt_token_ids), parsed.prompt_field, req.params.max_tokens,
                     list(req.params.stop_token_ids))
        if self._metrics is not None:
            self._metrics.observe_features(req.params)
        serving.submit(req)
        self._ensure_driver()
        outcome = "cancelled"
        try:
            while True:
                event = await stream.queue.get()
                if event.error is not None:
                    outcome = "error"
                    raise _stream_error(event.error)
                stream.num_sent += len(event.token_ids)
                message = gen_pb.GenerateResponse(
                    token_ids=event.token_ids, time_since_arrival_s=event.time_s - arrival,
                    num_accepted_draft_tokens=event.num_accepted_draft_tokens,
                    num_draft_tokens=event.num_draft_tokens, text=stream.text_of(event),
                    logprobs=token_logprobs_to_proto(event.logprobs),
                    prompt_logprobs=token_logprobs_to_proto(event.prompt_logprobs))
                if event.finish_reason is None:
                    yield message
                    continue
                outcome = event.finish_reason.value
                usage = event.usage or req.usage
                message.finish_reason = _FINISH[outcome]
                message.usage.CopyFrom(_usage_to_proto(req, usage, stream.num_sent))
                yield message
                return
        finally:
            self._streams.pop(req_id, None)
            if outcome in ("cancelled", "error"):
                serving.abort(req_id)  # a no-op for a request the scheduler already ended
                self._ensure_driver()
            if self._metrics is not None:
                self._metrics.observe_finish(outcome, req.usage, stream.num_sent, arrival)

    # -- admission ----------------------------------------------------------------------

    def _admit(self) -> ServingLoop:
        """The serving loop, if this server takes a Generate now; else the error why not."""
        if self._closing or self._controller.fatal_error is not None:
            raise ShuttingDown()
        if self._runner_config.model.is_pooling_model:
            raise FailedPrecondition("model", "an embedding (pooling) model does not generate "
                                     "tokens")
        if not self._controller.serving and not self._config.serve_before_ready:
            raise Unavailable(f"{self._controller.not_ready_reason()}; Generate is answered "
                              "once health is SERVING (or start the server with "
                              "--serve-before-ready)")
        runner = self._engine.runner
        if runner is None:
            raise Unavailable("this server's engine has no model runner" if self._engine.loaded
                              else "the model is still loading; Generate is taken once it is "
                              "loaded")
        limit = self._limits.max_num_seqs + self._config.max_waiting_requests
        if len(self._streams) >= limit:
            raise ResourceExhausted(f"{len(self._streams)} requests are running or queued "
                                    f"(max_num_seqs {self._limits.max_num_seqs} + "
                                    f"--max-waiting-requests "
                                    f"{self._config.max_waiting_requests}); retry later")
        return self._build_loop(runner)

    def prepare(self) -> None:
        """Build the serving loop now if the model is loaded (the controller calls this just
        before health turns SERVING): its block pool holds one entry per KV block, about a
        millisecond at a large GPU's 30k+ blocks, which the first request would pay for."""
        runner = self._engine.runner
        if runner is not None:
            self._build_loop(runner)

    def _build_loop(self, runner: Any) -> ServingLoop:
        """The serving loop, built once, on the event loop (its emits are scheduled there)."""
        if self._serving is None:
            self._loop = asyncio.get_running_loop()
            self._serving = ServingLoop(
                runner, Scheduler(self._limits), self._emit_threadsafe,
                on_step=self._metrics.observe_step if self._metrics is not None else None,
                on_occupancy=(self._metrics.observe_occupancy if self._metrics is not None
                              else None))
            logger.info("serving loop ready: %d KV blocks of %d tokens, max_num_seqs %d, "
                        "token budget %d", self._limits.num_blocks, self._limits.block_size,
                        self._limits.max_num_seqs, self._limits.max_num_batched_tokens)
        return self._serving

    # -- the driver ---------------------------------------------------------------------

    def _ensure_driver(self) -> None:
        if self._driver is None:
            self._driver = asyncio.ensure_future(self._drive())

    async def _drive(self) -> None:
        serving = self._serving
        assert serving is not None  # built by _admit before any driver starts
        try:
            while serving.has_work:
                await self._controller.run_serving(
                    lambda: serving.run(self._should_yield))
        except Exception as exc:  # ShuttingDown, a fatal device error, or a bug
            if not isinstance(exc, ShuttingDown):
                logger.exception("the serving loop failed; ending every stream")
            self._fail_all(exc)
        finally:
            # No await since the last has_work check: a request submitted after it finds
            # _driver None and starts a new driver.
            self._driver = None

    def _should_yield(self) -> bool:
        """Asked on the worker between steps: a warmup (or load) is waiting for the runner."""
        return self._controller.jobs_waiting > 0

    def _emit_threadsafe(self, events: list[StepEvent]) -> None:
        loop = self._loop
        if loop is not None and events:
            with contextlib.suppress(RuntimeError):  # the event loop is gone: nobody listens
                loop.call_soon_threadsafe(self._dispatch, events)

    def _dispatch(self, events: list[StepEvent]) -> None:
        for event in events:
            stream = self._streams.get(event.req_id)
            if stream is not None:
                stream.queue.put_nowait(event)

    def _fail_all(self, error: BaseException) -> None:
        now = time.perf_counter()
        for req_id, stream in list(self._streams.items()):
            stream.queue.put_nowait(StepEvent(req_id, [], now, error=error))

    # -- shutdown -----------------------------------------------------------------------

    async def drain(self, timeout: float) -> None:
        """Take no new requests; let the running ones finish for up to `timeout` s, then end
        the rest with UNAVAILABLE (their clients retry on another replica)."""
        self._closing = True
        deadline = time.monotonic() + timeout
        while self._streams and time.monotonic() < deadline:
            await asyncio.sleep(DRAIN_POLL_S)
        if self._streams:
            logger.info("shutdown: %d Generate streams cut after the %.1f s grace",
                        len(self._streams), timeout)
            self._fail_all(ShuttingDown())
