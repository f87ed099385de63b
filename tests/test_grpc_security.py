"""TLS, mTLS, bearer tokens and the plaintext health port, against real in-process servers."""

from __future__ import annotations

import asyncio
import io
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from tests.certs import Pki, make_pki
from tests.grpc_harness import FakeEngine, ServerThread, run, server_config, serving
from warmgate.client.aio import AsyncWarmgateClient
from warmgate.client.cli import main
from warmgate.client.errors import WarmgateRpcError
from warmgate.client.exit_codes import EXIT_LOCAL, EXIT_OK, EXIT_RPC_ERROR
from warmgate.client.security import ClientSecurity
from warmgate.v1 import warmup_pb2 as pb
from warmgate.v1 import warmup_pb2_grpc as pb_grpc

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
TOKEN, ROTATED = "s3cret-token-0123456789", "next-token-9876543210"
CALL_S = 5.0  # a failed handshake answers at once; the bound only stops a hang


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture
def token_file(tmp_path: Path) -> Path:
    path = tmp_path / "tokens"
    path.write_text(f"{TOKEN}\n\n{ROTATED}\n")
    return path


def tls_flags(pki: Pki, *, mtls: bool = False) -> list[str]:
    flags = ["--tls-cert", str(pki.server_cert), "--tls-key", str(pki.server_key)]
    return [*flags, "--tls-client-ca", str(pki.ca)] if mtls else flags


async def code_of(call: object) -> grpc.StatusCode:
    try:
        await call  # type: ignore[misc]
    except WarmgateRpcError as exc:
        return exc.code
    return grpc.StatusCode.OK


def test_tls_serves_a_client_that_trusts_the_ca_and_refuses_plaintext(pki: Pki) -> None:
    async def body() -> None:
        async with serving(server_config(*tls_flags(pki)), FakeEngine()) as s:
            target = f"127.0.0.1:{s.port}"
            trusting = ClientSecurity.from_files(tls_ca=str(pki.ca))
            async with AsyncWarmgateClient(target, CALL_S, security=trusting) as c:
                assert (await c.warmup_kernels()).outcome == pb.WARMUP_OUTCOME_SUCCEEDED
                assert await c.health() == SERVING
            # The certificate names localhost too: checked against the override.
            by_name = ClientSecurity.from_files(tls_ca=str(pki.ca), server_name="localhost")
            async with AsyncWarmgateClient(target, CALL_S, security=by_name) as c:
                assert await c.health() == SERVING
            async with AsyncWarmgateClient(target, CALL_S) as plain:
                assert await code_of(plain.health()) is grpc.StatusCode.UNAVAILABLE
            # TLS with the system's roots does not trust a private CA.
            async with AsyncWarmgateClient(target, CALL_S,
                                           security=ClientSecurity(tls=True)) as c:
                assert await code_of(c.health()) is grpc.StatusCode.UNAVAILABLE

    run(body())


def test_mtls_needs_a_client_cert_signed_by_the_client_ca(pki: Pki) -> None:
    async def body() -> None:
        async with serving(server_config(*tls_flags(pki, mtls=True)), FakeEngine()) as s:
            target = f"127.0.0.1:{s.port}"
            no_cert = ClientSecurity.from_files(tls_ca=str(pki.ca))
            untrusted = ClientSecurity.from_files(tls_ca=str(pki.ca),
                                                  tls_cert=str(pki.other_client_cert),
                                                  tls_key=str(pki.other_client_key))
            for security in (no_cert, untrusted):
                async with AsyncWarmgateClient(target, CALL_S, security=security) as c:
                    assert await code_of(c.health()) is grpc.StatusCode.UNAVAILABLE
            good = ClientSecurity.from_files(tls_ca=str(pki.ca), tls_cert=str(pki.client_cert),
                                             tls_key=str(pki.client_key))
            async with AsyncWarmgateClient(target, CALL_S, security=good) as c:
                assert (await c.get_status()).state == pb.WARMUP_STATE_PENDING

    run(body())


def test_token_guards_the_mutating_rpcs_and_leaves_reads_and_probes_open(
        token_file: Path) -> None:
    async def body() -> None:
        config = server_config("--auth-token-file", str(token_file))
        async with serving(config, FakeEngine()) as s:
            target = f"127.0.0.1:{s.port}"
            for token in (None, "wrong-token", TOKEN[:-1], TOKEN + "x"):
                async with AsyncWarmgateClient(target, CALL_S,
                                               security=ClientSecurity(token=token)) as c:
                    for call in (c.warmup_kernels(), c.mixed_warmup(8)):
                        assert await code_of(call) is grpc.StatusCode.UNAUTHENTICATED
                    # Generate is protected too, though no list names it (deny by default).
                    with pytest.raises(WarmgateRpcError) as info:
                        await c.generate([1, 2, 3]).__anext__()
                    assert info.value.code is grpc.StatusCode.UNAUTHENTICATED
                    # Open: probes, reads and reflection.
                    assert await c.health() == NOT_SERVING
                    assert await c.health("liveness") == SERVING
                    assert (await c.get_status()).state == pb.WARMUP_STATE_PENDING
                    watch = c.watch_status(follow=True)
                    assert (await watch.__anext__()).state == pb.WARMUP_STATE_PENDING
                    await watch.aclose()
            await _reflection_lists_services(target)
            await _other_schemes_are_refused(target)
            assert s.controller.status().state.value == "pending"  # nothing ran
            refused = s.metrics.registry.get_sample_value("warmgate_rpc_requests_total", {
                "method": "/warmgate.v1.Warmup/WarmupKernels", "code": "UNAUTHENTICATED"})
            assert refused == 5  # 4 clients, and the raw call
            for token in (TOKEN, ROTATED):  # every line of the file is accepted
                async with AsyncWarmgateClient(target, CALL_S,
                                               security=ClientSecurity(token=token)) as c:
                    assert (await c.warmup_kernels(force=True)).outcome == \
                        pb.WARMUP_OUTCOME_SUCCEEDED
                    assert await c.health() == SERVING

    run(body())


async def _reflection_lists_services(target: str) -> None:
    async with grpc.aio.insecure_channel(target) as channel:
        stub = reflection_pb2_grpc.ServerReflectionStub(channel)
        request = reflection_pb2.ServerReflectionRequest(list_services="")
        async for response in stub.ServerReflectionInfo(iter([request]), timeout=CALL_S):
            names = {s.name for s in response.list_services_response.service}
            assert {"warmgate.v1.Warmup", "warmgate.v1.Generation"} <= names
            break


async def _other_schemes_are_refused(target: str) -> None:
    async with grpc.aio.insecure_channel(target) as channel:
        stub = pb_grpc.WarmupStub(channel)
        for value in (f"Basic {TOKEN}", TOKEN, "Bearer", f"Bearer  {TOKEN}x"):
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await stub.MixedWarmup(pb.MixedWarmupRequest(num_tokens=8), timeout=CALL_S,
                                       metadata=(("authorization", value),))
            assert info.value.code() is grpc.StatusCode.UNAUTHENTICATED
        # Refused before parsing: corrupt bytes without a token are UNAUTHENTICATED too.
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await channel.unary_unary("/warmgate.v1.Warmup/WarmupKernels")(
                b"\xff\xff", timeout=CALL_S)
        assert info.value.code() is grpc.StatusCode.UNAUTHENTICATED
        # The scheme is case-insensitive (RFC 7235).
        report = await stub.MixedWarmup(pb.MixedWarmupRequest(num_tokens=8), timeout=CALL_S,
                                        metadata=(("authorization", f"bearer {TOKEN}"),))
        assert report.outcome == pb.WARMUP_OUTCOME_SUCCEEDED


def test_health_port_is_plaintext_health_only_beside_tls_and_tokens(
        pki: Pki, token_file: Path) -> None:
    async def body() -> None:
        config = server_config(*tls_flags(pki, mtls=True), "--auth-token-file",
                               str(token_file), "--health-port", "0")
        async with serving(config, FakeEngine()) as s:
            assert s.health_port not in (None, 0, s.port)
            async with grpc.aio.insecure_channel(f"127.0.0.1:{s.health_port}") as probe:
                health = health_pb2_grpc.HealthStub(probe)
                check = health_pb2.HealthCheckRequest(service="")
                assert (await health.Check(check, timeout=CALL_S)).status == NOT_SERVING
                warmup = pb_grpc.WarmupStub(probe)
                with pytest.raises(grpc.aio.AioRpcError) as info:
                    await warmup.GetStatus(pb.GetStatusRequest(), timeout=CALL_S)
                assert info.value.code() is grpc.StatusCode.UNIMPLEMENTED
                # One HealthServicer: readiness set through the main port shows here at once.
                mtls = ClientSecurity.from_files(
                    token_file=str(token_file), tls_ca=str(pki.ca),
                    tls_cert=str(pki.client_cert), tls_key=str(pki.client_key))
                async with AsyncWarmgateClient(f"127.0.0.1:{s.port}", CALL_S,
                                               security=mtls) as c:
                    await c.warmup_kernels()
                assert (await health.Check(check, timeout=CALL_S)).status == SERVING
                watch = health.Watch(check, timeout=CALL_S)
                assert (await watch.read()).status == SERVING
                stop = asyncio.ensure_future(s.stop(0.5))
                assert (await watch.read()).status == NOT_SERVING  # graceful stop, probes see it
                watch.cancel()
                await stop

    run(body())


def test_cli_takes_token_and_tls_from_flags_or_environment(pki: Pki, token_file: Path) -> None:
    def cli(*argv: str, env: dict[str, str] | None = None) -> tuple[int, str]:
        out, err = io.StringIO(), io.StringIO()
        code = main(["--target", s.target, *argv], out=out, err=err, environ=env or {})
        return code, err.getvalue()

    config = server_config(*tls_flags(pki, mtls=True), "--auth-token-file", str(token_file))
    with ServerThread(config, FakeEngine()) as s:
        client_cert = ["--tls-cert", str(pki.client_cert), "--tls-key", str(pki.client_key)]
        code, err = cli("--tls-ca", str(pki.ca), *client_cert, "warmup")
        assert code == EXIT_RPC_ERROR and "UNAUTHENTICATED" in err
        assert cli("--tls-ca", str(pki.ca), *client_cert, "--token-file", str(token_file),
                   "warmup")[0] == EXIT_OK
        env = {"WARMGATE_CLIENT_TLS_CA": str(pki.ca), "WARMGATE_CLIENT_TOKEN_FILE":
               str(token_file), "WARMGATE_CLIENT_TLS_CERT": str(pki.client_cert),
               "WARMGATE_CLIENT_TLS_KEY": str(pki.client_key)}
        assert cli("mixed", "--num-tokens", "8", env=env)[0] == EXIT_OK
        # No client certificate: the handshake fails, reported as an RPC error.
        code, err = cli("--tls-ca", str(pki.ca), "status")
        assert code == EXIT_RPC_ERROR and "UNAVAILABLE" in err
        # A token file that is not there is a local error, one line naming it, before any RPC.
        code, err = cli("--token-file", str(token_file) + ".missing", "status")
        assert code == EXIT_LOCAL and ".missing" in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("with_tokens", [False, True], ids=["open", "tokens"])
def test_the_start_up_line_says_who_may_force_a_warmup(
        with_tokens: bool, token_file: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Without tokens anyone who reaches the port may preempt every stream with a forced
    warmup: the line that says the server is up says so, and what restricts it."""
    flags = ["--auth-token-file", str(token_file)] if with_tokens else []

    async def body() -> str:
        with caplog.at_level("INFO", logger="warmgate.server.app"):
            async with serving(server_config(*flags), engine=FakeEngine()):
                pass
        [line] = [r.getMessage() for r in caplog.records
                  if r.getMessage().startswith("serving warmgate.v1.Warmup on ")]
        return line

    line = run(body())
    warning = "no auth: any client may force a warmup"
    if with_tokens:
        assert line.endswith("(model tiny, cpu, torch attention; plaintext, bearer token "
                             "auth)"), line
    else:
        assert warning in line and "preempts every stream" in line, line
        assert "--auth-token-file restricts them" in line, line
