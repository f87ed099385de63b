"""Bad input on every method of a live in-process server: random field values (hypothesis)
and raw corrupt bytes. Every call ends with a clean status, never UNKNOWN or INTERNAL; the
server stays SERVING and its memory does not grow.

Set WARMGATE_BAD_INPUT_SUMMARY=1 (and pytest -s) to print the status counts per method.
"""

from __future__ import annotations

import collections
import os
import random
from collections.abc import Callable, Iterator
from typing import Any

import grpc
import pytest
from google.rpc import error_details_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from grpc_status import rpc_status
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from tests.grpc_harness import FakeEngine, ServerThread, server_config
from warmgate.v1 import generate_pb2 as gen_pb
from warmgate.v1 import generate_pb2_grpc as gen_grpc
from warmgate.v1 import warmup_pb2 as pb
from warmgate.v1 import warmup_pb2_grpc as pb_grpc

Code = grpc.StatusCode
BUDGET = server_config().runner.scheduler.max_num_batched_tokens
CALL_S = 10.0
INT32 = st.integers(-2**31, 2**31 - 1)
# Half the draws near the valid range, where the boundaries are; the rest anywhere in int32.
TOKENS = st.integers(-3, BUDGET + 3) | INT32
# Where corrupt bytes may end: OK (they parsed), INVALID_ARGUMENT (they did not, or a field is
# out of range), FAILED_PRECONDITION (a server that cannot warm up), NOT_FOUND (a health
# service nobody registered), RESOURCE_EXHAUSTED (over the 4 MiB message limit).
CLEAN = {Code.OK, Code.INVALID_ARGUMENT, Code.FAILED_PRECONDITION, Code.NOT_FOUND,
         Code.RESOURCE_EXHAUSTED}
SETTINGS = settings(max_examples=50, deadline=None, database=None,
                    suppress_health_check=[HealthCheck.too_slow])
# (method, shape): unary, server-streaming or bidirectional.
METHODS = (
    ("/warmgate.v1.Warmup/WarmupKernels", "unary"),
    ("/warmgate.v1.Warmup/MixedWarmup", "unary"),
    ("/warmgate.v1.Warmup/GetStatus", "unary"),
    ("/warmgate.v1.Warmup/WatchStatus", "stream"),
    ("/grpc.health.v1.Health/Check", "unary"),
    ("/grpc.health.v1.Health/Watch", "stream"),
    ("/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo", "bidi"),
)
COUNTS: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)


@pytest.fixture(scope="module", autouse=True)
def _summary() -> Iterator[None]:
    yield
    if os.environ.get("WARMGATE_BAD_INPUT_SUMMARY"):
        for name, counts in sorted(COUNTS.items()):
            print(f"{name:<58} {dict(sorted(counts.items()))}")


@pytest.fixture(scope="module")
def ready() -> Iterator[grpc.Channel]:
    """A warmed-up server (fake runner: the validation under test is the server's own)."""
    with ServerThread(engine=FakeEngine(steps=1)) as server, \
            grpc.insecure_channel(server.target) as channel:
        pb_grpc.WarmupStub(channel).WarmupKernels(pb.WarmupKernelsRequest(), timeout=CALL_S)
        yield channel


@pytest.fixture(scope="module")
def real() -> Iterator[grpc.Channel]:
    """The tiny real runner, for boundary values (a new shape can cost a compile)."""
    with ServerThread() as server, grpc.insecure_channel(server.target) as channel:
        yield channel


@pytest.fixture(scope="module")
def broken() -> Iterator[grpc.Channel]:
    """A server whose model failed to load: warmups are FAILED_PRECONDITION."""
    with ServerThread(engine=FakeEngine(load_fails=True)) as server, \
            grpc.insecure_channel(server.target) as channel:
        yield channel


def outcome(label: str, call: Callable[[], Any]) -> tuple[Code, grpc.RpcError | None]:
    try:
        call()
        code, error = Code.OK, None
    except grpc.RpcError as exc:
        code, error = exc.code(), exc  # type: ignore[attr-defined]
    COUNTS[label][code.name] += 1
    assert code in CLEAN, (label, code, error)
    return code, error


def violations(error: grpc.RpcError | None) -> list[str]:
    status = rpc_status.from_call(error)  # type: ignore[arg-type]
    assert status is not None, "INVALID_ARGUMENT without a google.rpc.Status trailer"
    fields = []
    for detail in status.details:
        bad = error_details_pb2.BadRequest()
        if detail.Unpack(bad):
            fields += [v.field for v in bad.field_violations]
    return fields


def expect_range(code: Code, error: grpc.RpcError | None, field: str, value: int | None,
                 in_range: Code) -> None:
    if value is None or 0 <= value <= BUDGET:
        assert code is in_range, (field, value, code)
    else:
        assert code is Code.INVALID_ARGUMENT, (field, value, code)
        assert violations(error) == [field]


# -- typed requests with random field values --------------------------------------------

@SETTINGS
@given(force=st.booleans(), tokens=st.none() | TOKENS)
@example(force=True, tokens=BUDGET).via("the budget itself")
@example(force=False, tokens=BUDGET + 1).via("one over")
@example(force=False, tokens=-1).via("negative")
def test_warmup_kernels_fields(ready: grpc.Channel, broken: grpc.Channel, force: bool,
                               tokens: int | None) -> None:
    request = pb.WarmupKernelsRequest(force=force, mixed_num_tokens=tokens)
    for channel, in_range in ((ready, Code.OK), (broken, Code.FAILED_PRECONDITION)):
        stub = pb_grpc.WarmupStub(channel)
        code, error = outcome("WarmupKernels", lambda s=stub: s.WarmupKernels(
            request, timeout=CALL_S))
        expect_range(code, error, "mixed_num_tokens", tokens, in_range)


@SETTINGS
@given(force=st.booleans(), tokens=TOKENS)
@example(force=False, tokens=2**31 - 1).via("int32 max")
@example(force=True, tokens=-2**31).via("int32 min")
@example(force=False, tokens=0).via("zero: a skip, not an error")
def test_mixed_warmup_fields(ready: grpc.Channel, broken: grpc.Channel, force: bool,
                             tokens: int) -> None:
    request = pb.MixedWarmupRequest(num_tokens=tokens, force=force)
    for channel, in_range in ((ready, Code.OK), (broken, Code.FAILED_PRECONDITION)):
        stub = pb_grpc.WarmupStub(channel)
        code, error = outcome("MixedWarmup", lambda s=stub: s.MixedWarmup(
            request, timeout=CALL_S))
        expect_range(code, error, "num_tokens", tokens, in_range)


@pytest.mark.parametrize("tokens", [-2**31, -1, 0, 2, 3, BUDGET, BUDGET + 1, 2**31 - 1])
def test_mixed_warmup_boundaries_on_the_real_runner(real: grpc.Channel, tokens: int) -> None:
    stub = pb_grpc.WarmupStub(real)
    request = pb.MixedWarmupRequest(num_tokens=tokens, force=True)
    code, error = outcome("MixedWarmup (real runner)",
                          lambda: stub.MixedWarmup(request, timeout=CALL_S))
    expect_range(code, error, "num_tokens", tokens, Code.OK)


def first(stream: Any) -> Any:
    try:
        return next(stream)
    finally:
        stream.cancel()


@SETTINGS
@given(follow=st.booleans(), service=st.text(max_size=64))
@example(follow=True, service="\x00").via("NUL in a service name")
@example(follow=False, service="x" * 100_000).via("a 100 kB service name")
def test_status_and_health_fields(ready: grpc.Channel, follow: bool, service: str) -> None:
    stub, health = pb_grpc.WarmupStub(ready), health_pb2_grpc.HealthStub(ready)
    assert outcome("GetStatus", lambda: stub.GetStatus(pb.GetStatusRequest(),
                                                       timeout=CALL_S))[0] is Code.OK
    assert outcome("WatchStatus", lambda: first(stub.WatchStatus(
        pb.WatchStatusRequest(follow=follow), timeout=CALL_S)))[0] is Code.OK
    request = health_pb2.HealthCheckRequest(service=service)
    known = service in ("", "warmgate.v1.Warmup", "liveness")
    code, _ = outcome("Health/Check", lambda: health.Check(request, timeout=CALL_S))
    assert code is (Code.OK if known else Code.NOT_FOUND)
    assert outcome("Health/Watch", lambda: first(health.Watch(request, timeout=CALL_S)))[0] \
        is Code.OK  # an unknown service is watched as SERVICE_UNKNOWN


@SETTINGS
@given(host=st.text(max_size=32), field=st.sampled_from(
    ["file_by_filename", "file_containing_symbol", "list_services",
     "all_extension_numbers_of_type"]), value=st.text(max_size=64))
def test_reflection_fields(ready: grpc.Channel, host: str, field: str, value: str) -> None:
    request = reflection_pb2.ServerReflectionRequest(host=host, **{field: value})
    stub = reflection_pb2_grpc.ServerReflectionStub(ready)
    # Reflection reports a bad lookup inside its response (error_response), with status OK.
    assert outcome("ServerReflectionInfo", lambda: first(stub.ServerReflectionInfo(
        iter([request]), timeout=CALL_S)))[0] is Code.OK


# -- raw bytes ----------------------------------------------------------------------------

def raw_call(channel: grpc.Channel, method: str, shape: str, payload: bytes) -> Any:
    """Send bytes as they are: no serializer on either side."""
    if shape == "unary":
        return channel.unary_unary(method)(payload, timeout=CALL_S)
    if shape == "stream":
        return first(channel.unary_stream(method)(payload, timeout=CALL_S))
    return first(channel.stream_stream(method)(iter([payload]), timeout=CALL_S))


def check_raw(channel: grpc.Channel, payload: bytes) -> None:
    for method, shape in METHODS:
        code, error = outcome(method.rsplit("/", 1)[-1] + " (raw)",
                              lambda m=method, sh=shape: raw_call(channel, m, sh, payload))
        if code is Code.INVALID_ARGUMENT:
            assert violations(error), (method, payload[:32])


@settings(max_examples=50, deadline=None, database=None)
@given(payload=st.binary(max_size=512))
@example(payload=b"").via("empty: every field at its default")
@example(payload=b"\x08").via("a truncated varint")
@example(payload=b"\x08" + b"\xff" * 10 + b"\x01").via("an over-long varint")
@example(payload=b"\x0a\x02\xc3\x28").via("invalid UTF-8 in a string field")
@example(payload=b"\x12\xff\xff\xff\xff\x0f").via("a length prefix far past the end")
@example(payload=b"\x0b" * 2000).via("2,000 nested group starts")
@example(payload=b"\x10\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01").via("int32 field = -1")
@example(payload=b"\xf8\xff\xff\xff\x0f\x01").via("an unknown field number 2^28-1")
def test_raw_bytes_on_every_method(ready: grpc.Channel, payload: bytes) -> None:
    check_raw(ready, payload)


def test_an_oversized_message_is_resource_exhausted(ready: grpc.Channel) -> None:
    payload = b"\x0a\x80\x80\x80\x02" + b"x" * ((4 << 20) + 1)  # a 4 MiB + 1 B string field
    for method, shape in METHODS:
        assert outcome(method.rsplit("/", 1)[-1] + " (raw)", lambda m=method, sh=shape:
                       raw_call(ready, m, sh, payload))[0] is Code.RESOURCE_EXHAUSTED


def rss_kib() -> int:
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmRSS:"))


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="needs Linux /proc")
def test_server_serves_and_memory_stays_flat_after_thousands_of_bad_calls(
        ready: grpc.Channel) -> None:
    rng = random.Random(9)

    def payloads(n: int) -> Iterator[bytes]:
        for _ in range(n):
            yield rng.randbytes(rng.randrange(0, 256))

    for payload in payloads(50):  # warm the allocator and grpc's caches first
        check_raw(ready, payload)
    before = rss_kib()
    for payload in payloads(250):  # 1,750 calls over the seven methods
        check_raw(ready, payload)
    grown = rss_kib() - before
    print(f"RSS {before / 1024:.1f} MiB -> +{grown / 1024:.1f} MiB after 1,750 corrupt calls")
    assert grown < 32 * 1024, f"RSS grew {grown} KiB"
    health = health_pb2_grpc.HealthStub(ready)
    assert health.Check(health_pb2.HealthCheckRequest(), timeout=CALL_S).status == \
        health_pb2.HealthCheckResponse.SERVING
    status = pb_grpc.WarmupStub(ready).GetStatus(pb.GetStatusRequest(), timeout=CALL_S)
    assert status.state == pb.WARMUP_STATE_READY


# -- Generate (a real tiny runner: the request reaches the scheduler when it parses) -----

@pytest.fixture(scope="module")
def generating() -> Iterator[grpc.Channel]:
    with ServerThread(server_config("--max-model-len", "64")) as server, \
            grpc.insecure_channel(server.target) as channel:
        pb_grpc.WarmupStub(channel).WarmupKernels(pb.WarmupKernelsRequest(), timeout=60)
        yield channel


FLOATS = st.floats(width=32, allow_nan=True, allow_infinity=True)


@SETTINGS
@given(prompt=st.lists(st.integers(-3, 515) | INT32, max_size=6), temperature=FLOATS,
       top_k=st.integers(-2, 50) | INT32, top_p=st.none() | FLOATS,
       seed=st.none() | st.integers(0, 2**64 - 1),
       max_tokens=st.none() | st.integers(-2, 6) | INT32,
       stops=st.lists(st.integers(-2, 515) | INT32, max_size=3))
@example(prompt=[1] * 64, temperature=0.0, top_k=0, top_p=None, seed=None, max_tokens=1,
         stops=[]).via("a prompt that fills max_model_len")
def test_generate_fields(generating: grpc.Channel, prompt: list[int], temperature: float,
                         top_k: int, top_p: float | None, seed: int | None,
                         max_tokens: int | None, stops: list[int]) -> None:
    sampling = gen_pb.SamplingParams(temperature=temperature, top_k=top_k,
                                     stop_token_ids=stops)
    for name, value in (("top_p", top_p), ("seed", seed), ("max_tokens", max_tokens)):
        if value is not None:
            setattr(sampling, name, value)
    request = gen_pb.GenerateRequest(prompt_token_ids=prompt, sampling=sampling)
    stub = gen_grpc.GenerationStub(generating)
    code, error = outcome("Generate", lambda: list(stub.Generate(request, timeout=CALL_S)))
    assert code in (Code.OK, Code.INVALID_ARGUMENT), (code, error)
    if code is Code.INVALID_ARGUMENT:
        assert violations(error)


@settings(max_examples=50, deadline=None, database=None)
@given(payload=st.binary(max_size=256))
@example(payload=b"\x0a\x03\x01\x02\x03").via("a valid three-token prompt")
@example(payload=b"\x0a\x02\xff\xff").via("a truncated packed varint")
def test_raw_bytes_on_generate(generating: grpc.Channel, payload: bytes) -> None:
    method = "/warmgate.v1.Generation/Generate"
    code, error = outcome("Generate (raw)", lambda: list(
        generating.unary_stream(method)(payload, timeout=CALL_S)))
    assert code in (Code.OK, Code.INVALID_ARGUMENT, Code.RESOURCE_EXHAUSTED), code
    if code is Code.INVALID_ARGUMENT:
        assert violations(error), payload[:32]
