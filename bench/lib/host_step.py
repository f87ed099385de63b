"""Host time per served step: the serving loop over a real runner whose forward is negligible
(the `tiny` preset on the CPU), N streams in steady decode, each step split into its parts.

    python bench/serve.py host-step [--streams 128 --prompt-len 64 --steps 60] \
        [--baseline REF] [--num-speculative-steps 3]   (and any other runner flag; defaults:
        the tiny model on the CPU, --max-num-seqs 128, --max-model-len 1024, a budget of 8192)

Parts (milliseconds per step, each part's median over the timed steps):
  schedule   Scheduler.schedule (which requests, drafts, blocks, the SchedulerOutput)
  prepare    the runner's host input preparation: validating the SchedulerOutput,
             InputBatch.update_states, InputBatch.prepare_inputs (positions, block table,
             slot mapping, token ids, attention metadata, the copies), the batch's shape
  forward    the model and the logits (small here by construction; not host work)
  sample     ModelRunner.sample_tokens (sampling or draft verification, the host copy)
  update     Scheduler.update (tokens appended, stop checks, the step's events)
  respond    the step's events to GenerateResponse messages, as the Generate stream does
  other      the rest of ServingLoop.step
--baseline REF runs the same measurement on the server and client of git commit REF (in a
subprocess, back to back, same flags) and prints both, and whether their tokens are equal.
--overlap measures this tree's loop serially and with --async-scheduling, back to back, and
prints both and whether their tokens are equal. With overlap, `sample` is the launch of the
sampling plus the wait for the step before's tokens, and the step's host parts run while the
device runs the step before (on a GPU the device then idles only for host - device step).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import hashlib
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from typing import Any

from method_timer import time_calls

PARTS = ("schedule", "prepare", "forward", "sample", "update", "respond", "other", "step")
LOG: dict[str, float] = {}  # the current step's seconds per part
STEPS: list[dict[str, float]] = []  # each finished step's


def _timed(owner: Any, name: str, part: str) -> Callable[[], None]:
    """Add the seconds of every call of owner.name to LOG[part]; returns the undo."""
    def record(_start: float, seconds: float) -> None:
        LOG[part] = LOG.get(part, 0.0) + seconds
        if part == "step":
            STEPS.append(dict(LOG))
            LOG.clear()

    return time_calls(owner, name, record)


@contextlib.contextmanager
def instrumented() -> Iterator[None]:
    from warmgate.server.runner import input_batch, model, model_runner
    from warmgate.server.serving import loop, scheduler

    overlap = []
    with contextlib.suppress(ImportError):  # a --baseline tree from before the overlap
        from warmgate.server.runner.async_output import AsyncModelOutput, DeviceTokens

        # Not sample_tokens_async itself: on the host path it calls sample_tokens.
        overlap = [_timed(model_runner, "sample_on_device", "sample"),
                   _timed(DeviceTokens, "launch", "sample"),
                   _timed(AsyncModelOutput, "get", "sample")]

    runner = model_runner.ModelRunner
    undo = [_timed(scheduler.Scheduler, "schedule", "schedule"),
            _timed(model_runner, "validate_scheduler_output", "prepare"),
            _timed(input_batch.InputBatch, "update_states", "prepare"),
            _timed(input_batch.InputBatch, "prepare_inputs", "prepare"),
            _timed(runner, "_batch_shape", "prepare"),
            _timed(runner, "_run_model", "forward"),
            _timed(model.LlamaModel, "compute_logits", "forward"),
            _timed(runner, "sample_tokens", "sample"),
            _timed(scheduler.Scheduler, "update", "update"),
            *overlap,
            _timed(loop.ServingLoop, "step", "step")]
    try:
        yield
    finally:
        for u in reversed(undo):
            u()


def respond(events: list[Any], arrival: float) -> None:
    """Each event as the GenerateResponse its stream sends."""
    from warmgate.server.api.logprobs_proto import token_logprobs_to_proto
    from warmgate.v1 import generate_pb2 as gen_pb

    t = time.perf_counter()
    for e in events:
        gen_pb.GenerateResponse(
            token_ids=e.token_ids, time_since_arrival_s=e.time_s - arrival,
            num_accepted_draft_tokens=e.num_accepted_draft_tokens,
            num_draft_tokens=e.num_draft_tokens, text="",
            logprobs=token_logprobs_to_proto(e.logprobs),
            prompt_logprobs=token_logprobs_to_proto(e.prompt_logprobs))
    LOG["respond"] = LOG.get("respond", 0.0) + time.perf_counter() - t


def measure(args: argparse.Namespace, async_scheduling: bool = False) -> dict[str, Any]:
    """Per-part medians (seconds) over the timed steps, the step count and the tokens' hash."""
    import random

    import torch

    from warmgate.server.devtools.runner_setup import build, runner_config
    from warmgate.server.runner.scheduler_output import SamplingParams
    from warmgate.server.serving.limits import SchedulerLimits
    from warmgate.server.serving.loop import ServingLoop
    from warmgate.server.serving.ngram import NgramIndex
    from warmgate.server.serving.request import ServingRequest
    from warmgate.server.serving.scheduler import Scheduler

    # One thread: the forward is not what is measured, and torch's threads spinning against
    # another process on a shared CPU made it 20x slower in some runs.
    torch.set_num_threads(1)
    runner, _, _ = build(runner_config(args))
    config = runner.config  # resolved: the KV blocks it allocated
    k = config.speculative.num_speculative_steps
    arrival = time.perf_counter()
    limits = SchedulerLimits.of_config(config)
    if async_scheduling:
        limits = dataclasses.replace(limits, async_scheduling=True)
    scheduler = Scheduler(limits)
    serving = ServingLoop(runner, scheduler, lambda events: respond(events, arrival))
    rng = random.Random(0)
    vocab = config.model.vocab_size
    # No stop token: every stream decodes for the whole measurement (ignore_eos).
    params = SamplingParams(temperature=0.0,
                            max_tokens=config.model.max_model_len - args.prompt_len)
    reqs = [ServingRequest(f"s{i}", [rng.randrange(vocab) for _ in range(args.prompt_len)],
                           params, arrival, NgramIndex(1, 4) if k else None)
            for i in range(args.streams)]
    for r in reqs:
        serving.submit(r)
    with instrumented():
        # Prefill every stream, then a few decode steps, before the timed ones.
        while any(r.num_computed_tokens < len(r.prompt_token_ids) for r in reqs):
            serving.step()
        for _ in range(args.warm_steps):
            serving.step()
        STEPS.clear()
        for _ in range(args.steps):
            serving.step()
    if len(scheduler.running) != args.streams:
        raise SystemExit(f"{len(scheduler.running)} of {args.streams} streams still running: "
                         "raise --max-model-len, or lower --steps or --prompt-len")
    # Read the step still in flight (with overlap), so both modes hold the same tokens.
    serving.run(lambda: True)
    for step in STEPS:
        step["other"] = step["step"] - sum(v for p, v in step.items() if p != "step")
    medians = {p: statistics.median(step.get(p, 0.0) for step in STEPS) for p in PARTS}
    tokens = hashlib.sha256(repr([r.output_token_ids for r in reqs]).encode()).hexdigest()[:16]
    return {"median": medians, "steps": len(STEPS), "backend": config.device.attention_backend,
            "tokens": tokens}


def table(label: str, result: dict[str, Any]) -> list[str]:
    median = result["median"]
    return [f"{label:<10}" + "".join(f"{median[p] * 1e3:>10.3f}" for p in PARTS)
            + f"{hostt(result) * 1e3:>10.3f}  {result['tokens']}"]


def hostt(result: dict[str, Any]) -> float:
    """The host parts' medians summed."""
    return float(sum(v for p, v in result["median"].items() if p not in ("forward", "step")))


def header() -> str:
    return f"{'ms/step':<10}" + "".join(f"{p:>10}" for p in PARTS) + f"{'host':>10}  tokens"


def baseline(ref: str, argv: list[str]) -> dict[str, Any]:
    """The same measurement on commit ref's server and client, in a subprocess."""
    root = subprocess.run(["git", "rev-parse", "--show-toplevel"], capture_output=True,
                          text=True, check=True).stdout.strip()
    with tempfile.TemporaryDirectory() as tmp:
        archive = subprocess.run(["git", "-C", root, "archive", ref, "server", "client"],
                                 capture_output=True, check=True).stdout
        subprocess.run(["tar", "-x", "-C", tmp], input=archive, check=True)
        env = {**os.environ, "PYTHONPATH": f"{tmp}/server{os.pathsep}{tmp}/client"}
        out = subprocess.run([sys.executable, __file__, "--json", *argv], env=env,
                             capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"the baseline at {ref} failed:\n{out.stderr}")
    import json

    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def main(argv: list[str], prog: str | None = None) -> int:
    from warmgate.server.config.server_config import RUNNER_FLAGS, add_options

    p = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0],
                                allow_abbrev=False)
    p.add_argument("--streams", type=int, default=128)
    p.add_argument("--prompt-len", type=int, default=64)
    p.add_argument("--warm-steps", type=int, default=5)
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--baseline", metavar="REF",
                   help="also measure git commit REF's server (e.g. main), back to back")
    p.add_argument("--rounds", type=int, default=1,
                   help="measurements of each tree, alternated with --baseline")
    p.add_argument("--overlap", action="store_true",
                   help="measure the loop serially and with --async-scheduling, alternated")
    p.add_argument("--json", action="store_true", help=argparse.SUPPRESS)
    # The server's runner flags; a model whose forward is small, and a budget and length
    # that prefill every stream at once and leave room for the timed steps at k=3.
    add_options(p, RUNNER_FLAGS, environ={}, defaults={
        "--device": "cpu", "--model": "tiny", "--max-num-seqs": "128",
        "--max-model-len": "1024", "--max-num-batched-tokens": "8192"})
    args = p.parse_args(argv)
    if args.overlap and args.baseline:
        p.error("--overlap compares this tree's two modes; --baseline another tree: pick one")
    if args.json:
        import json

        print(json.dumps(measure(args)))
        return 0
    rest = [a for i, a in enumerate(argv)
            if a != "--baseline" and (i == 0 or argv[i - 1] != "--baseline")
            and not a.startswith("--baseline=")]
    rows: list[str] = []
    base: list[dict[str, Any]] = []
    now: list[dict[str, Any]] = []
    for _ in range(args.rounds):  # alternated, so drift in the machine's load hits both
        if args.baseline:
            base.append(baseline(args.baseline, rest))
            rows += table(args.baseline[:10], base[-1])
        if args.overlap:
            base.append(measure(args))
            rows += table("serial", base[-1])
        now.append(measure(args, async_scheduling=args.overlap))
        rows += table("async" if args.overlap else "this tree", now[-1])
    print(f"{args.streams} streams in steady decode, prompt {args.prompt_len}, "
          f"{now[0]['steps']} timed steps, k={args.num_speculative_steps}, "
          f"max_num_seqs {args.max_num_seqs}, model {args.model}, {now[0]['backend']} attention "
          f"on {args.device}; ms per step, each part's median over the steps; host: the "
          "parts but forward, summed")
    print(header())
    print("\n".join(rows))
    if args.baseline or args.overlap:
        ratio = statistics.median(hostt(n) for n in now) / statistics.median(
            hostt(b) for b in base)
        same = {r["tokens"] for r in now} == {r["tokens"] for r in base}
        what = "async / serial" if args.overlap else f"this tree / {args.baseline}"
        print(f"host time, median over rounds, {what}: "
              f"{ratio:.2f}; tokens {'equal' if same else 'DIFFER'}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
