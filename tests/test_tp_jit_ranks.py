"""Issue 23 item 6: post-ready JIT, graph-miss and communicator set-up detection on every rank,
reported by rank 0. A worker's events travel over its reply pipe into rank 0's JIT monitor,
which counts them under the worker's rank and hands them to the metrics (`rank` label) and
to --strict-jit; the readiness a worker judges them by is rank 0's, sent with each call."""

from __future__ import annotations

import os
import time
from typing import Any

from prometheus_client import generate_latest

from tests.runner_helpers import prompt, tiny_config
from tests.serving_helpers import reference_greedy
from tests.tp_helpers import tp_runner
from warmgate.server.distributed.collectives_warmup import collective_plan, warm_collectives
from warmgate.server.distributed.replies import ReplyReader, ReplySender
from warmgate.server.jit import JitMonitor, StrictJitPolicy
from warmgate.server.jit.events import COMMUNICATOR_SETUP, CUDA_GRAPH_MISS, TRITON, JitEvent
from warmgate.server.telemetry.metrics import Metrics
from warmgate.server.warmup.plan import run_warmup_plan

WAIT_S = 30.0


def _eventually(predicate: Any, timeout: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.01)


def _scrape(metrics: Metrics) -> str:
    return generate_latest(metrics.registry).decode()


def test_a_workers_events_cross_its_reply_pipe_into_rank_0s_metrics() -> None:
    """The pipe itself, with observer events a worker would record: a compile and a graph
    miss after ready, a cache load before it."""
    monitor = JitMonitor()
    metrics = Metrics(tensor_parallel_size=2)
    monitor.add_listener(metrics.observe_jit)
    read_fd, write_fd = os.pipe()
    reader = ReplyReader({1: os.fdopen(read_fd, "rb")})
    sender = ReplySender(os.fdopen(write_fd, "wb"))
    worker = JitMonitor(rank=1)
    worker.add_listener(sender)
    worker.record(TRITON, name="early", compiled=False)  # before rank 0 listens: kept
    reader.relay_to(monitor.relay)
    worker.follow(True)  # rank 0 turned ready
    worker.record(TRITON, name="late_kernel")
    worker.record(CUDA_GRAPH_MISS, name="9 requests")
    sender.close()
    reader.join(WAIT_S)
    by_rank = monitor.snapshot_by_rank()
    assert by_rank[1].after_ready == {TRITON: 1} and by_rank[1].cache_hits == {TRITON: 1}
    assert by_rank[1].graph_misses_after_ready == 1
    assert by_rank[0].total_after_ready == 0 and monitor.snapshot() == by_rank[0]
    text = _scrape(metrics)
    assert 'warmgate_jit_compiles_total{after_ready="true",kind="triton",rank="1"} 1.0' in text
    assert 'warmgate_jit_compiles_total{after_ready="true",kind="triton",rank="0"} 0.0' in text
    assert 'warmgate_cuda_graph_misses_total{after_ready="true",rank="1"} 1.0' in text


def test_rank_labels_outside_the_group_fold_into_other() -> None:
    metrics = Metrics(tensor_parallel_size=2)
    metrics.observe_jit(JitEvent(kind=CUDA_GRAPH_MISS, compiled=True, after_ready=True,
                                 name="x", rank=7))
    assert 'warmgate_cuda_graph_misses_total{after_ready="true",rank="other"} 1.0' in \
        _scrape(metrics)


def test_a_communicator_set_up_on_a_worker_after_ready_is_rank_1_in_rank_0s_metrics() -> None:
    """gloo TP=2 on tiny, real worker process: the distributed phase sets up every collective
    on both ranks before ready; serving then sets up none; a collective kind the plan never
    ran (float64 all-reduce, run on both ranks after ready) is one set-up per rank, and
    rank 0's metrics show the worker's with rank="1"."""
    metrics = Metrics(tensor_parallel_size=2)
    reasons: list[str] = []
    with tp_runner(tiny_config(), 2) as runner:
        monitor: JitMonitor = runner.jit_monitor
        monitor.add_listener(metrics.observe_jit)
        monitor.add_listener(StrictJitPolicy("fail", reasons.append))
        report = run_warmup_plan(runner)
        assert report.succeeded, [(p.name, p.detail) for p in report.phases]
        # all_reduce (served dtype), all_gather (float32 logits), the timings' gather.
        _eventually(lambda: monitor.snapshot_by_rank().get(1) is not None
                    and monitor.snapshot_by_rank()[1].communicator_setups == 3)
        assert monitor.snapshot().communicator_setups == 3
        monitor.mark_ready()
        reference_greedy(runner, prompt(9), 6)  # planned traffic: nothing new on any rank
        reference_greedy(runner, prompt(3), 2)  # a step after: rank 1's events have been sent
        time.sleep(0.2)
        assert all(c.communicator_setups_after_ready == 0
                   for c in monitor.snapshot_by_rank().values())
        assert reasons == []

        plan = {**collective_plan(runner), "dtype": "float64", "all_gather_rows": []}
        runner._send("warm_collectives", plan)
        assert runner.tensor_parallel is not None
        warm_collectives(runner.tensor_parallel, runner, plan)
        _eventually(lambda: monitor.snapshot_by_rank()[1].communicator_setups_after_ready == 1)
        assert monitor.snapshot().communicator_setups_after_ready == 1
        text = _scrape(metrics)
    assert 'warmgate_communicator_setups_total{after_ready="true",rank="1"} 1.0' in text
    assert 'warmgate_communicator_setups_total{after_ready="true",rank="0"} 1.0' in text
    assert 'warmgate_communicator_setups_total{after_ready="false",rank="1"} 3.0' in text
    assert len(reasons) == 2 and all(r.startswith("communicator set-up after ready: "
                                                  f"{COMMUNICATOR_SETUP} all_reduce float64")
                                     for r in reasons), reasons
    assert any("on rank 1" in r for r in reasons), reasons
