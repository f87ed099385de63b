"""Where a decode step's GPU time goes, kernel by kernel, with CUDA graphs on.

    python bench/serve.py step-kernels --model llama-3.1-8b --backends flashinfer \
        [--modes default,deterministic] [--pdl off|on|both] [--mixed-prompt 1024]

One runner per backend (and per mode: --deterministic's batch-invariant kernels beside the
default ones; and per --pdl arm: the Triton kernels launched with programmatic dependent
launch beside the same kernels without, one runner after the other) is built with random
weights, its requests prefilled to
--prompt-len tokens and graphs captured; then decode steps run under torch.profiler at each
batch size. Prints, per batch size: the step's wall time, the GPU time the kernels add up to,
their count, the HBM roofline of the step, and the kernels that take the most time per step
(grouped by name, with their launches per step and time per launch), so a kernel fusion or a
launch-bound tail shows as numbers. --mixed-prompt N: then the same batch's decodes beside one
new request's whole N-token prompt a step, the steps that set the ITL's tail at many streams.
Then the dense linears' decisions at those batch sizes (cuBLAS against the Triton GEMV, as
the warmup timed them): which one each launch is.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import defaultdict
from collections.abc import Callable

import torch
from decode_latency import PDL_ARMS, build, decode_s, mixed_s, prefill
from torch.profiler import ProfilerActivity, profile

from warmgate.server.config.runner_config import ConfigError, ModelConfig
from warmgate.server.devtools.batch_driver import BatchDriver, DrivenRequest
from warmgate.server.devtools.gpu_card import detect
from warmgate.server.devtools.roofline import Roofline
from warmgate.server.runner.linear_tuning import TuningRunner, linear_choices_of


def kernel_times(prof: profile, steps: int
                 ) -> tuple[dict[str, float], dict[str, float], int]:
    """Per kernel name: device microseconds per step and launches per step; and kernels
    launched per step."""
    per_name: dict[str, float] = defaultdict(float)
    launches: dict[str, float] = defaultdict(float)
    count = 0
    for event in prof.events():
        if event.device_type != torch.autograd.DeviceType.CUDA:
            continue
        per_name[event.name[:90]] += event.device_time_total / steps
        launches[event.name[:90]] += 1 / steps
        count += 1
    return dict(per_name), dict(launches), count // steps


def profile_steps(label: str, step: Callable[[int], float], steps: int, top: int) -> str:
    """`step(i)` three times unprofiled, then `steps` times under the profiler: the wall
    and kernel time per step, launches per step, and the `top` kernels by time."""
    for i in range(3):
        step(i)
    torch.cuda.synchronize()
    start = time.perf_counter()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for i in range(3, 3 + steps):
            step(i)
    wall_ms = 1000 * (time.perf_counter() - start) / steps
    times, counts, launches = kernel_times(prof, steps)
    total_us = sum(times.values())
    lines = [f"  {label}: wall {wall_ms:.3f} ms/step under the profiler, kernels "
             f"{total_us / 1000:.3f} ms/step, {launches} kernels/step"]
    for name, us in sorted(times.items(), key=lambda kv: -kv[1])[:top]:
        lines.append(f"    {us:9.1f} us {100 * us / total_us:5.1f}% {counts[name]:5.0f} x "
                     f"{us / counts[name]:7.2f} us  {name}")
    return "\n".join(lines)


def profile_batch(driver: BatchDriver, reqs: list[DrivenRequest], mixed_prompt: int,
                  steps: int, top: int) -> str:
    """The decode steps of `reqs`; with mixed_prompt, then the same decodes beside a new
    request's whole mixed_prompt-token prompt a step."""
    b = len(reqs)
    out = [profile_steps(f"batch {b}", lambda _: decode_s(driver, reqs), steps, top)]
    if mixed_prompt:
        out.append(profile_steps(
            f"batch {b} beside a {mixed_prompt}-token prompt",
            lambda i: mixed_s(driver, reqs, mixed_prompt, f"mixed{b}-{i}"), steps, top))
    return "\n".join(out)


def linear_decisions(runner: TuningRunner, batches: list[int]) -> list[str]:
    """The warmup's timed choice for each dense linear at the profiled batch sizes (the
    decode's row counts): which kernel the step's launches of each shape are."""
    choices = linear_choices_of(runner)
    if choices is None:
        return ["  dense linears: no choices (not the Triton ops, or --no-dense-gemv)"]
    from warmgate.server.kernels.linear_choices import LINEAR  # the ops imported it

    lines = []
    for d in choices.decisions:
        if d.m not in batches:
            continue
        # A fused op (silu_mul, norm) weighs its two launches, the linear on the better
        # kernel, against the fused Triton launch.
        default, triton = ("cuBLAS", "GEMV") if d.op == LINEAR else ("unfused", "fused")
        lines.append(f"  dense linear {d.op} {d.n}x{d.k} m{d.m}: {default} "
                     f"{d.default_s * 1e6:.1f} us, {triton} {d.gemv_s * 1e6:.1f} us -> "
                     f"{triton if d.gemv else default}")
    return lines


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="llama-3.2-1b")
    p.add_argument("--backends", default="triton,flashinfer")
    p.add_argument("--prompt-len", type=int, default=512)
    p.add_argument("--batches", default="1,64")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--top", type=int, default=14)
    p.add_argument("--mixed-prompt", type=int, default=0,
                   help="after each batch's decode steps, steps of the same decodes beside "
                        "one new request's whole prompt of this many tokens (0: none)")
    p.add_argument("--modes", default="default",
                   help="default, deterministic or both (comma-separated), one runner each")
    p.add_argument("--pdl", default="off", choices=sorted(PDL_ARMS),
                   help="each runner without --pdl (off), with it (on), or both, one runner "
                        "each, so the step's wall and gaps show beside each other")
    args = p.parse_args()
    modes = args.modes.split(",")
    if not set(modes) <= {"default", "deterministic"}:
        p.error(f"--modes {args.modes}: each is default or deterministic")
    if not torch.cuda.is_available():
        print("step-kernels needs a CUDA device", file=sys.stderr)
        return 2
    card = detect("cuda")
    print(card.describe(), flush=True)
    batches = [int(b) for b in args.batches.split(",")]
    mc = ModelConfig.from_preset(args.model)
    arms = [(b, m, pdl) for b in args.backends.split(",") for m in modes
            for pdl in PDL_ARMS[args.pdl]]
    for backend, mode, pdl in arms:
        try:
            runner = build(args.model, backend, args.prompt_len,
                           4 * len(batches) * args.steps + 64,
                           deterministic=mode == "deterministic", pdl=pdl,
                           mixed_prompt=args.mixed_prompt, sizes=tuple(batches))
        except ConfigError as exc:
            print(f"step-kernels: {backend} ({mode}, pdl {'on' if pdl else 'off'}): "
                  f"{exc.message}", file=sys.stderr)
            return 2
        driver = BatchDriver(runner)
        reqs = prefill(driver, max(batches), args.prompt_len, chunk=8)
        runner.capture_cuda_graphs()
        print(f"\n{args.model} {backend} ({mode}, pdl {'on' if pdl else 'off'}), context "
              f"~{args.prompt_len}, CUDA graphs, {args.steps} profiled steps per batch")
        for b in batches:
            roof = 1000 * Roofline.of(mc, b, args.prompt_len, bytes_per_s=card.bytes_per_s).step_s
            print(f"  (HBM roofline at batch {b}, {card.slug}: {roof:.3f} ms)")
            print(profile_batch(driver, reqs[:b], args.mixed_prompt, args.steps, args.top),
                  flush=True)
        print("\n".join(linear_decisions(runner, batches)), flush=True)
        del driver, reqs, runner
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
