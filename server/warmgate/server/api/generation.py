"""warmgate.v1.Generation: Generate streams over the serving loop.

Each call is admitted (or refused with the reason), becomes a ServingRequest handed to the
ServingDriver (warmgate.server.control.serving_driver, which runs the loop on the runner
worker), and streams that request's events back as GenerateResponses. A stream that ends
early (client cancel, deadline) aborts its request, which frees its KV blocks at the next
step boundary.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

import grpc

from warmgate.server.api import rehearsal
from warmgate.server.api.generate_request import parse_generate_request_async
from warmgate.server.api.grammar_requests import GrammarRequests, grammar_stream_error
from warmgate.server.api.logprobs_proto import token_logprobs_to_proto
from warmgate.server.api.rehearsal import REHEARSING
from warmgate.server.api.stream_events import coalesce, gather
from warmgate.server.config.runner_config import RunnerConfig
from warmgate.server.config.serving_config import ServingConfig
from warmgate.server.control.controller import WarmupController
from warmgate.server.control.engine import WarmupEngine
from warmgate.server.control.remote_engine import RemoteEngine
from warmgate.server.control.serving_driver import ServingDriver
from warmgate.server.core.errors import (
    FailedPrecondition,
    ResourceExhausted,
    ShuttingDown,
    Unavailable,
    WarmgateError,
)
from warmgate.server.core.failures import describe_failure, is_out_of_memory
from warmgate.server.serving.limits import SchedulerLimits
from warmgate.server.serving.loop import ServingLoop
from warmgate.server.serving.ngram import NgramIndex
from warmgate.server.serving.request import ServingRequest, StepEvent, Usage
from warmgate.server.telemetry.serving_metrics import ServingMetrics
from warmgate.server.text.model_text import ModelText
from warmgate.v1 import generate_pb2 as gen_pb
from warmgate.v1 import generate_pb2_grpc as gen_grpc

if TYPE_CHECKING:
    # tokenizers (and jinja2 behind the chat template) load only for a model that has one.
    from warmgate.server.text.detokenizer import IncrementalDetokenizer

logger = logging.getLogger(__name__)

_FINISH = {"length": gen_pb.FINISH_REASON_LENGTH, "stop": gen_pb.FINISH_REASON_STOP,
           "max_model_len": gen_pb.FINISH_REASON_MAX_MODEL_LEN}
DRAIN_POLL_S = 0.05


@dataclass
class _Stream:
    req: ServingRequest
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
    error = grammar_stream_error(error)
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
                 runner_config: RunnerConfig, serving_config: ServingConfig,
                 metrics: ServingMetrics | None = None, text: ModelText | None = None) -> None:
        self._controller = controller
        self._text = text if text is not None else ModelText()
        self._engine = engine
        self._runner_config = runner_config
        self._config = serving_config
        self._metrics = metrics
        self._limits = SchedulerLimits.of_config(
            runner_config, async_scheduling=serving_config.async_scheduling)
        self._driver = ServingDriver(
            controller, self._limits,
            on_step=metrics.observe_step if metrics is not None else None,
            on_occupancy=metrics.observe_occupancy if metrics is not None else None)
        self._ids = itertools.count()
        self._grammars = GrammarRequests(
            self._text, runner_config.model.vocab_size, serving_config,
            metrics.observe_grammar_compile if metrics is not None else None,
            engine.process if isinstance(engine, RemoteEngine) else None)
        self._closing = False

    @property
    def text(self) -> ModelText:
        """The model's tokenizer, chat template and EOS ids, as this service serves them."""
        return self._text

    @property
    def serving_loop(self) -> ServingLoop | None:
        """The loop, once the first request built it (tests read its scheduler)."""
        return self._driver.serving_loop

    async def Generate(self, request: gen_pb.GenerateRequest,
                       context: grpc.aio.ServicerContext[gen_pb.GenerateRequest,
                                                         gen_pb.GenerateResponse],
                       ) -> AsyncIterator[gen_pb.GenerateResponse]:
        arrival = time.perf_counter()
        metrics = None if REHEARSING.get() else self._metrics
        parsed = await parse_generate_request_async(request, self._runner_config, self._text)
        self._admit()
        req_id = f"gen-{next(self._ids)}"
        structured = parsed.grammar is not None
        grammar = (await self._grammars.ready(parsed.grammar, req_id)
                   if parsed.grammar is not None else None)
        try:
            k = self._limits.num_speculative_steps
            drafter = NgramIndex(self._config.ngram_min, self._config.ngram_max) if k else None
            req = ServingRequest(req_id, parsed.prompt_token_ids, parsed.params, arrival,
                                 drafter, grammar, engine_grammar=structured and grammar is None)
            tokenizer = self._text.tokenizer
            stream = _Stream(req, tokenizer.detokenizer() if tokenizer is not None else None)
            logger.debug("generate %s%s: %d prompt tokens from %s, max_tokens %d, stop ids %s",
                         req_id,
                         f" ({parsed.client_request_id})" if parsed.client_request_id else "",
                         len(req.prompt_token_ids), parsed.prompt_field, req.params.max_tokens,
                         list(req.params.stop_token_ids))
            if metrics is not None:
                metrics.observe_features(req.params, structured=structured)
            queue = self._driver.submit(req)
        except BaseException:
            if structured:  # not submitted: what the engine holds for it goes
                self._grammars.release(req_id)
            raise
        outcome = "cancelled"
        held: StepEvent | None = None  # an error that followed tokens still to send
        interval = self._config.stream_interval
        try:
            while True:
                event = held if held is not None else await queue.get()
                event, held = coalesce(event, queue)
                if interval > 1 and stream.num_sent and held is None:  # the first goes at once
                    event, held = await gather(event, queue, interval)
                if event.error is not None:
                    outcome = "error"
                    raise _stream_error(event.error)
                if event.usage is not None:  # an engine process's counters (one process:
                    req.usage = event.usage  # the same object), for the metrics below
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
            self._driver.close(req_id, abort=outcome in ("cancelled", "error"))
            if metrics is not None:
                metrics.observe_finish(outcome, req.usage, stream.num_sent, arrival)

    # -- admission ----------------------------------------------------------------------

    def _admit(self) -> None:
        """Build the serving loop if this server takes a Generate now; else the error why not."""
        if self._closing or self._controller.fatal_error is not None:
            raise ShuttingDown()
        if self._runner_config.model.is_pooling_model:
            raise FailedPrecondition("model", "an embedding (pooling) model does not generate "
                                     "tokens")
        if not (self._controller.serving or self._config.serve_before_ready
                or REHEARSING.get()):
            raise Unavailable(f"{self._controller.not_ready_reason()}; Generate is answered "
                              "once health is SERVING (or start the server with "
                              "--serve-before-ready)")
        runner = self._engine.runner
        if runner is None:
            raise Unavailable("this server's engine has no model runner" if self._engine.loaded
                              else "the model is still loading; Generate is taken once it is "
                              "loaded")
        limit = self._limits.max_num_seqs + self._config.max_waiting_requests
        if self._driver.num_requests >= limit:
            raise ResourceExhausted(f"{self._driver.num_requests} requests are running or "
                                    f"queued (max_num_seqs {self._limits.max_num_seqs} + "
                                    f"--max-waiting-requests "
                                    f"{self._config.max_waiting_requests}); retry later")
        self._driver.build(runner)

    def prepare(self) -> None:
        """Build the serving loop now if the model is loaded (the controller calls this just
        before health turns SERVING): its block pool holds one entry per KV block, which the
        first request would otherwise pay for."""
        runner = self._engine.runner
        if runner is not None:
            self._driver.build(runner)
        self._grammars.prepare()

    async def rehearse(self) -> None:
        """Two requests through Generate before health first turns SERVING (see
        warmgate.server.api.rehearsal); raises what a stream raised."""
        if self._runner_config.model.is_pooling_model or self._engine.runner is None:
            return  # it serves no Generate (a pooling model; a test's engine without a runner)
        first, second = rehearsal.rehearsal_requests(self._limits,
                                                     self._runner_config.model.vocab_size)

        def generate(request: gen_pb.GenerateRequest
                     ) -> AsyncGenerator[gen_pb.GenerateResponse, None]:
            # Generate never reads its context; an async generator, so it can be closed.
            return cast(AsyncGenerator[gen_pb.GenerateResponse, None],
                        self.Generate(request, None))  # type: ignore[arg-type]

        result = await rehearsal.rehearse(generate, first, second)
        logger.info("serving rehearsal: 2 requests, %d tokens through Generate in %.1f ms",
                    result.num_tokens, result.seconds * 1e3)

    def launch_grammar_probes(self) -> None:
        """Start the grammar compile probes' zygote beside the model's load (see
        GrammarRequests.launch_probes_early)."""
        self._grammars.launch_probes_early()

    def build_grammar_backend_early(self) -> None:
        """An engine process warms its own grammar backend; this process's is built now."""
        self._grammars.build_backend_early()

    @property
    def grammar_probes_idle(self) -> int:
        """Grammar compile probes started and idle: the grammar requests that can start
        compiling at once."""
        return self._grammars.probes_idle

    @property
    def num_compiles_running(self) -> int:
        """Grammar compiles on their threads: a stop exits without joining them."""
        return self._grammars.num_compiles_running

    async def drain(self, timeout: float) -> None:
        """Take no new requests; let the running ones finish for up to `timeout` s, then end
        the rest with UNAVAILABLE (their clients retry on another replica)."""
        self._closing = True
        await self._grammars.close()  # a compile in progress is not worth the grace
        deadline = time.monotonic() + timeout
        while self._driver.num_requests and time.monotonic() < deadline:
            await asyncio.sleep(DRAIN_POLL_S)
        if self._driver.num_requests:
            logger.info("shutdown: %d Generate streams cut after the %.1f s grace",
                        self._driver.num_requests, timeout)
            self._driver.fail_all(ShuttingDown())
