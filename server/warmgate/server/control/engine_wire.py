"""What crosses between the front process and the engine process (engine_main.py).

Both directions are the step channel the tensor-parallel workers already use
(distributed/channel.py: a length-prefixed pickle over a private pipe): commands go down the
engine's stdin, everything else comes back on a second pipe. Messages are tuples whose first
item is one of the kinds below; their payloads are plain data (dataclasses, lists, numbers).
Exceptions cross through `portable_error`, which keeps their type wherever the type can be
rebuilt, so a stream ends with the same status as in one process.
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass
from typing import TYPE_CHECKING

from warmgate.server.core.failures import FatalDeviceError
from warmgate.server.runner.scheduler_output import SamplingParams

if TYPE_CHECKING:
    from warmgate.server.serving.grammar.spec import GrammarSpec
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
# engine -> front
DONE = "done"  # (value,): the job in flight ended
FAILED = "failed"  # (exception,): the job in flight raised
PROGRESS = "progress"  # (ProgressEvent,)
EVENTS = "events"  # (list[StepEvent],): one emit of the serving loop
STEP = "step"  # (StepStats,)
OCCUPANCY = "occupancy"  # (Occupancy,)
JIT = "jit"  # (JitEvent,): as distributed/replies.py
CACHE_INFO = "cache_info"  # (dict | None,): the --cache-dir entry for GetStatus
LOST = "lost"  # (FatalDeviceError,): a tensor-parallel worker of the engine died


@dataclass(frozen=True)
class RequestWire:
    """A ServingRequest as data: the engine rebuilds the n-gram drafter and the grammar's
    matcher (from the spec the front already compiled and validated)."""

    req_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    # time.perf_counter() on the front: CLOCK_MONOTONIC, the same clock in both processes.
    arrival_s: float
    grammar: GrammarSpec | None = None

    @classmethod
    def of(cls, req: ServingRequest) -> RequestWire:
        spec = getattr(req.grammar, "spec", None) if req.grammar is not None else None
        if req.grammar is not None and spec is None:
            raise ValueError(f"{req.req_id}: its grammar carries no spec to rebuild it from")
        return cls(req.req_id, list(req.prompt_token_ids), req.params, req.arrival_s, spec)


def _round_trips(exc: BaseException) -> bool:
    try:
        pickle.loads(pickle.dumps(exc))
    except Exception:
        return False
    return True


def portable_error(exc: BaseException) -> BaseException:
    """`exc`, or the nearest of its classes that survives pickling with its message (a
    GrammarDeadEnd becomes the GrammarViolation it is a kind of); its traceback stays here."""
    if _round_trips(exc):
        return exc.with_traceback(None)
    for cls in type(exc).__mro__:
        if not issubclass(cls, BaseException):
            continue
        try:
            rebuilt = cls(str(exc))
        except Exception:
            continue
        if _round_trips(rebuilt):
            return rebuilt
    return RuntimeError(f"{type(exc).__name__}: {exc}")


def failure_to_wire(exc: BaseException) -> tuple[BaseException, str | None]:
    """A job's exception as (portable cause, fatal phase or None): FatalDeviceError does not
    pickle (its constructor takes two arguments), so it crosses as its parts."""
    if isinstance(exc, FatalDeviceError):
        return portable_error(exc.cause), exc.phase
    return portable_error(exc), None


def failure_of_wire(cause: BaseException, fatal_phase: str | None) -> BaseException:
    return cause if fatal_phase is None else FatalDeviceError(fatal_phase, cause)
