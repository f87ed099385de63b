"""--host is one address for both listeners: gRPC and /metrics bind the same host, IPv6
included (`::1`, `[::1]`, and `::` dual stack)."""

from __future__ import annotations

import urllib.request

import pytest

from tests.grpc_harness import ServerThread, server_config
from warmgate.client.api import WarmgateClient
from warmgate.server.config.listen_address import grpc_address
from warmgate.server.telemetry.metrics import Metrics
from warmgate.server.telemetry.metrics_endpoint import MetricsEndpoint


def scrape(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as response:
        return response.read().decode()


@pytest.mark.parametrize(("host", "expected"), [
    ("0.0.0.0", "0.0.0.0:50051"), ("::", "[::]:50051"), ("[::]", "[::]:50051"),
    ("::1", "[::1]:50051"), ("localhost", "localhost:50051")])
def test_grpc_address(host: str, expected: str) -> None:
    assert grpc_address(host, 50051) == expected


@pytest.mark.parametrize("host", ["::1", "[::1]"])
def test_metrics_listen_on_an_ipv6_host(host: str) -> None:
    endpoint = MetricsEndpoint(Metrics(), host, 0)
    try:
        assert "warmgate_ready 0.0" in scrape(f"http://[::1]:{endpoint.port}/metrics")
    finally:
        endpoint.close()


def test_metrics_on_the_any_address_take_ipv4_and_ipv6() -> None:
    endpoint = MetricsEndpoint(Metrics(), "::", 0)
    try:
        for host in ("127.0.0.1", "[::1]"):
            assert "warmgate_ready" in scrape(f"http://{host}:{endpoint.port}/metrics")
    finally:
        endpoint.close()


def test_server_binds_grpc_and_metrics_on_the_same_ipv6_host() -> None:
    with ServerThread(server_config("--host", "::1")) as s:
        metrics_port = s.running.metrics_port
        assert metrics_port is not None
        with WarmgateClient(f"[::1]:{s.running.port}", timeout=10) as client:
            assert client.get_status().model == "tiny"
        assert "warmgate_warmup_state" in scrape(f"http://[::1]:{metrics_port}/metrics")
