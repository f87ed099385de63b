"""--deterministic over gRPC: GetStatus and the warmup report say so, the plan's determinism
phase ran (SKIPPED without the flag), and every Generate request ended counts in
warmgate_deterministic_requests_total."""

from __future__ import annotations

import pytest

from tests.grpc_harness import run, server_config, serving
from warmgate.client.aio import AsyncWarmgateClient
from warmgate.client.render import report_table, status_text
from warmgate.v1 import warmup_pb2 as pb

METRIC = "warmgate_deterministic_requests_total"


@pytest.mark.parametrize("deterministic", [True, False])
def test_status_report_phase_and_metric_follow_the_flag(deterministic: bool) -> None:
    flags = ["--deterministic"] if deterministic else []

    async def body() -> None:
        async with serving(server_config(*flags)) as s, \
                AsyncWarmgateClient(f"127.0.0.1:{s.port}") as c:
            report = await c.warmup_kernels()
            assert report.outcome == pb.WARMUP_OUTCOME_SUCCEEDED
            assert report.deterministic is deterministic
            phase = next(p for p in report.phases if p.name == "determinism")
            if deterministic:
                assert phase.status == pb.PHASE_STATUS_RAN
            else:
                assert phase.status == pb.PHASE_STATUS_SKIPPED
                assert phase.skip_reason == pb.SKIP_REASON_NOT_DETERMINISTIC
            status = await c.get_status()
            assert status.deterministic is deterministic
            assert status.last_report.deterministic is deterministic
            # What `warmgate status` and the report table print.
            assert ("deterministic" in status_text(status).splitlines()[1]) is deterministic
            assert ("deterministic" in report_table(report).splitlines()[-1]) is deterministic
            for _ in range(2):
                async for _message in c.generate([1, 2, 3], max_tokens=3):
                    pass
            assert s.metrics.registry.get_sample_value(METRIC) == (2 if deterministic else 0)

    run(body(), 120)
