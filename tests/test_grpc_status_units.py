"""The pieces under the RPCs: the ETA, the status tracker, the proto mirror of SkipReason."""

from __future__ import annotations

import asyncio

import grpc
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.grpc_harness import run
from warmgate.server.api.convert import skip_reason_to_proto, status_to_proto
from warmgate.server.api.errors import to_grpc_status
from warmgate.server.control.eta import estimate_remaining
from warmgate.server.control.singleflight import SingleFlight
from warmgate.server.control.status import Identity, StatusTracker, WarmupState
from warmgate.server.core.errors import (
    FailedPrecondition,
    FieldViolation,
    InvalidArgument,
    ResourceExhausted,
    ShuttingDown,
    Unavailable,
    WarmgateError,
)
from warmgate.server.core.progress import ProgressEvent
from warmgate.server.core.results import (
    PhaseResult,
    PhaseStatus,
    SkipReason,
    WarmupOutcome,
    WarmupReport,
)
from warmgate.v1 import warmup_pb2 as pb

PHASES = ("a", "b", "c")
IDENTITY = Identity("hash", "tiny", "cpu", "torch")


def test_every_skip_reason_has_its_proto_value() -> None:
    for reason in SkipReason:
        assert pb.SkipReason.Name(skip_reason_to_proto(reason)) == f"SKIP_REASON_{reason.name}"
    assert skip_reason_to_proto(None) == pb.SKIP_REASON_UNSPECIFIED
    proto_names = set(pb.SkipReason.keys()) - {"SKIP_REASON_UNSPECIFIED"}
    assert proto_names == {f"SKIP_REASON_{r.name}" for r in SkipReason}


def test_eta_prefers_the_previous_run() -> None:
    eta = estimate_remaining(phases=PHASES, current="b", steps_done=1, steps_total=4,
                             phase_elapsed_s=1.0, finished_s={"a": 9.0},
                             previous_s={"b": 3.0, "c": 5.0})
    assert eta == pytest.approx(2.0 + 5.0)


def test_eta_from_this_runs_rates() -> None:
    # b: 1 s for 1 of 4 steps -> 3 s more; c: the mean of finished phases (a: 4 s).
    eta = estimate_remaining(phases=PHASES, current="b", steps_done=1, steps_total=4,
                             phase_elapsed_s=1.0, finished_s={"a": 4.0})
    assert eta == pytest.approx(3.0 + 4.0)
    assert estimate_remaining(phases=PHASES, current="a", steps_done=1, steps_total=2,
                              phase_elapsed_s=1.0, finished_s={}) is None
    assert estimate_remaining(phases=PHASES, current="c", steps_done=0, steps_total=2,
                              phase_elapsed_s=1.0, finished_s={"a": 1, "b": 1}) is None


@given(done=st.integers(0, 50), extra=st.integers(0, 50),
       elapsed=st.floats(0, 1e4, allow_nan=False), prev=st.floats(0, 1e4, allow_nan=False))
def test_eta_is_never_negative(done: int, extra: int, elapsed: float, prev: float) -> None:
    for previous in (None, {"a": prev, "c": prev}):
        eta = estimate_remaining(phases=PHASES, current="a", steps_done=done,
                                 steps_total=done + extra, phase_elapsed_s=elapsed,
                                 finished_s={"b": prev}, previous_s=previous)
        assert eta is None or eta >= 0


def _report(ok: bool) -> WarmupReport:
    status = PhaseStatus.RAN if ok else PhaseStatus.FAILED
    return WarmupReport(WarmupOutcome.SUCCEEDED if ok else WarmupOutcome.FAILED,
                        [PhaseResult("a", status, duration_s=2.0, detail="x")], 2.0, "hash")


def test_tracker_walks_the_state_machine() -> None:
    async def body() -> None:
        now = [0.0]
        t = StatusTracker(IDENTITY, clock=lambda: now[0])
        assert t.snapshot().state is WarmupState.PENDING and not t.snapshot().settled
        t.job_queued()
        t.begin("plan", PHASES)
        t.progress(ProgressEvent("a", 1, 2))
        now[0] = 1.0
        t.progress(ProgressEvent("a", 2, 2))
        now[0] = 1.5
        t.progress(ProgressEvent("b", 1, 2))
        s = t.snapshot()
        assert (s.state, s.current_phase, s.phase_index, s.num_phases) == \
            (WarmupState.RUNNING, "b", 1, 3)
        assert s.elapsed_s == 1.5 and s.estimated_remaining_s == pytest.approx(0.5 + 1.0)
        t.progress(ProgressEvent("a", 2, 2))  # a repeated final event does not move back
        assert t.snapshot().current_phase == "b"
        t.end_plan(_report(False))
        t.job_done()
        s = t.snapshot()
        assert s.state is WarmupState.FAILED and s.failure_reason == "a: x" and s.settled
        assert status_to_proto(s).state == pb.WARMUP_STATE_FAILED
        t.begin("plan", PHASES, previous=_report(True))
        t.end_plan(_report(True))
        assert t.snapshot().state is WarmupState.READY and t.snapshot().failure_reason == ""

    run(body())


def test_tracker_wakes_watchers_on_change() -> None:
    async def body() -> None:
        t = StatusTracker(IDENTITY)
        seen = t.version
        waiter = asyncio.ensure_future(t.wait_change(seen))
        await asyncio.sleep(0)
        assert not waiter.done()
        t.job_queued()
        await asyncio.wait_for(waiter, 1)
        await asyncio.wait_for(t.wait_change(seen), 1)  # already past: returns at once

    run(body())


def test_single_flight_keeps_only_what_keep_accepts() -> None:
    async def body() -> None:
        runs = []

        async def start() -> bool:
            runs.append(1)
            return len(runs) > 1

        flight: SingleFlight[str, bool] = SingleFlight(keep=lambda ok: ok)
        assert (await flight.run("k", start)).value is False
        assert not (await flight.run("k", start)).from_stored  # a failure was not kept
        assert (await flight.run("k", start)).from_stored
        assert (await flight.run("other", start)).from_stored is False
        assert len(runs) == 3

    run(body())


def test_error_mapping() -> None:
    status = to_grpc_status(InvalidArgument(FieldViolation("num_tokens", "must be >= 0")))
    assert status.code is grpc.StatusCode.INVALID_ARGUMENT
    assert status.details == "num_tokens: must be >= 0"
    assert status.trailing_metadata[0][0] == "grpc-status-details-bin"
    internal = to_grpc_status(ZeroDivisionError("division by zero"))
    assert internal.code is grpc.StatusCode.INTERNAL
    assert "ZeroDivisionError" in internal.details


def test_each_domain_error_maps_to_its_status_and_details() -> None:
    from google.rpc import error_details_pb2, status_pb2

    def decoded(exc: BaseException) -> tuple[grpc.StatusCode, str, list[str]]:
        status = to_grpc_status(exc)
        rich = status_pb2.Status.FromString(status.trailing_metadata[0][1])
        return status.code, status.details, [d.type_url.rsplit(".", 1)[-1] for d in rich.details]

    assert decoded(ShuttingDown()) == (grpc.StatusCode.UNAVAILABLE,
                                       "the server is shutting down", [])
    assert decoded(Unavailable("not ready")) == (grpc.StatusCode.UNAVAILABLE, "not ready", [])
    assert decoded(ResourceExhausted("queue full")) == (
        grpc.StatusCode.RESOURCE_EXHAUSTED, "queue full", [])
    assert decoded(FailedPrecondition("model", "failed to load")) == (
        grpc.StatusCode.FAILED_PRECONDITION, "model: failed to load", ["PreconditionFailure"])
    assert decoded(InvalidArgument(FieldViolation("a", "x"), FieldViolation("b", "y")))[2] == \
        ["BadRequest"]
    assert decoded(WarmgateError("a kind with no status of its own"))[0] is \
        grpc.StatusCode.UNKNOWN
    failure = error_details_pb2.PreconditionFailure()
    rich = status_pb2.Status.FromString(
        to_grpc_status(FailedPrecondition("model", "gone")).trailing_metadata[0][1])
    rich.details[0].Unpack(failure)
    assert (failure.violations[0].type, failure.violations[0].subject,
            failure.violations[0].description) == ("STATE", "model", "gone")


def test_an_undecodable_request_is_invalid_argument_naming_its_message_type() -> None:
    from warmgate.server.api.interceptor import REQUEST_FIELD, _check, _tolerant

    deserialize = _tolerant(pb.WarmupKernelsRequest.FromString)
    assert deserialize is not None
    assert deserialize(b"\x08\x01") == pb.WarmupKernelsRequest(force=True)
    with pytest.raises(InvalidArgument) as info:
        _check(deserialize(b"\x08"))  # a truncated varint
    (violation,) = info.value.violations
    assert violation.field == REQUEST_FIELD
    assert violation.description.startswith("not a valid warmgate.v1.WarmupKernelsRequest: ")
