"""What crosses between the front process and the engine process (engine_main.py).

Both directions are the step channel the tensor-parallel workers already use
(distributed/channel.py: a length-prefixed pickle over a private pipe): commands go down the
engine's stdin, everything else comes back on a second pipe. Messages are tuples whose first
item is one of the kinds below; their payloads are plain data (dataclasses, lists, numbers).
Exceptions cross as (class, args, attributes) (`error_to_wire`), so a stream ends with the
same status as in one process.
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from warmgate.server.core.failures import FatalDeviceError
from warmgate.server.runner.scheduler_output import SamplingParams, TokenLogprobs
from warmgate.server.serving.request import FinishReason, StepEvent, Usage

if TYPE_CHECKING:
    from warmgate.server.serving.request import ServingRequest

# front -> engine
LOAD = "load"  # () -> DONE PhaseResult
PLAN = "plan"  # (mixed_num_tokens, force) -> PROGRESS*, DONE WarmupReport
MIXED = "mixed"  # (num_tokens,) -> PROGRESS*, DONE WarmupReport
RUN = "run"  # () -> DONE None once the serving loop has no request left or yielded
SUBMIT = "submit"  # (RequestWire,)
ABORT = "abort"  # (req_id,)
YIELD = "yield"  # (): a warmup waits; the running RUN preempts and returns
CANCEL = "cancel"  # (): the server stops; the running PLAN/MIXED stops at its next step
READY = "ready"  # (bool,): the JIT monitor's readiness, ahead of the submits it covers
# (key, GrammarSpec, memory_bytes, hold) -> GRAMMAR_BUILT: build a grammar the front's probe
# accepted; hold: keep it for the request whose id is `key`, until its SUBMIT.
GRAMMAR_BUILD = "grammar_build"
GRAMMAR_RELEASE = "grammar_release"  # (key,): the request gave up; drop what is held for it
# engine -> front
DONE = "done"  # (value,): the job in flight ended
FAILED = "failed"  # (exception,): the job in flight raised
PROGRESS = "progress"  # (ProgressEvent,)
EVENTS = "events"  # (list[EventRow],): one emit of the serving loop
STEP = "step"  # (StepStats,)
OCCUPANCY = "occupancy"  # (Occupancy,)
JIT = "jit"  # (JitEvent,): as distributed/replies.py
CACHE_INFO = "cache_info"  # (dict | None,): the --cache-dir entry for GetStatus
LOST = "lost"  # (FatalDeviceError,): a tensor-parallel worker of the engine died
GRAMMAR_BUILT = "grammar_built"  # ((key, ErrorWire | None),): a GRAMMAR_BUILD's answer


@dataclass(frozen=True)
class RequestWire:
    """A ServingRequest as data: the engine rebuilds the n-gram drafter, and takes the
    grammar it built and holds for the request (GRAMMAR_BUILD) when `grammar` says so."""

    req_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    # time.perf_counter() on the front: CLOCK_MONOTONIC, the same clock in both processes.
    arrival_s: float
    grammar: bool = False

    @classmethod
    def of(cls, req: ServingRequest) -> RequestWire:
        if req.grammar is not None:  # a matcher of this process cannot cross
            raise ValueError(f"{req.req_id}: its grammar was built in the front, not in the "
                             "engine that serves it")
        return cls(req.req_id, list(req.prompt_token_ids), req.params, req.arrival_s,
                   req.engine_grammar)


# A StepEvent as a tuple: pickling 128 slotted dataclasses costs 7x the tuples' time on both
# sides, and a step sends one per running request (bench/serve.py engine-transport).
EventRow = tuple[str, list[int], float, int, int, "str | None", "Usage | None",
                 "ErrorWire | None", "list[TokenLogprobs] | None",
                 "list[TokenLogprobs] | None"]


def events_to_wire(events: list[StepEvent]) -> list[EventRow]:
    return [(e.req_id, e.token_ids, e.time_s, e.num_draft_tokens, e.num_accepted_draft_tokens,
             e.finish_reason.value if e.finish_reason is not None else None, e.usage,
             error_to_wire(e.error) if e.error is not None else None,
             e.logprobs or None, e.prompt_logprobs or None) for e in events]


def events_of_wire(rows: list[EventRow]) -> list[StepEvent]:
    return [StepEvent(req_id, tokens, time_s, drafts, accepted,
                      FinishReason(finish) if finish is not None else None, usage,
                      error_of_wire(error) if error is not None else None,
                      logprobs or [], prompt_logprobs or [])
            for (req_id, tokens, time_s, drafts, accepted, finish, usage, error, logprobs,
                 prompt_logprobs) in rows]


# An exception as (class, args, attributes): rebuilt without calling its constructor, so a
# class whose constructor takes other arguments than its message (GrammarDeadEnd,
# InvalidArgument) crosses with its type and fields, and its stream ends with the same status.
ErrorWire = tuple[type[BaseException], tuple[Any, ...], dict[str, Any]]


def error_to_wire(exc: BaseException) -> ErrorWire:
    crossed: ErrorWire = (type(exc), exc.args, dict(vars(exc)))
    try:
        pickle.loads(pickle.dumps(crossed))
    except Exception:  # an attribute that does not pickle: keep the type's name and message
        return RuntimeError, (f"{type(exc).__name__}: {exc}",), {}
    return crossed


def error_of_wire(crossed: ErrorWire) -> BaseException:
    cls, args, state = crossed
    exc = cls.__new__(cls)
    exc.args = args
    exc.__dict__.update(state)
    return exc


def failure_to_wire(exc: BaseException) -> tuple[ErrorWire, str | None]:
    """A job's exception as (error, fatal phase or None): a FatalDeviceError crosses as its
    cause and phase."""
    if isinstance(exc, FatalDeviceError):
        return error_to_wire(exc.cause), exc.phase
    return error_to_wire(exc), None


def failure_of_wire(crossed: ErrorWire, fatal_phase: str | None) -> BaseException:
    cause = error_of_wire(crossed)
    return cause if fatal_phase is None else FatalDeviceError(fatal_phase, cause)
