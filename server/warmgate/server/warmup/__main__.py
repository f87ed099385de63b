"""`python -m warmgate.server.warmup`: run the whole plan and print the phase table."""

from __future__ import annotations

import argparse
import json
import logging
import sys

from warmgate.server.config import (
    CacheConfig,
    CompilationConfig,
    ConfigError,
    DeviceConfig,
    ModelConfig,
    RunnerConfig,
    SchedulerConfig,
    SpeculativeConfig,
)
from warmgate.server.jit import JitMonitor
from warmgate.server.presets import preset_names
from warmgate.server.warmup.plan import load_runner, run_warmup_plan
from warmgate.server.warmup.table import format_phase_table


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m warmgate.server.warmup",
                                description="Warm every kernel path of a model runner once and "
                                            "print how long each phase took.")
    p.add_argument("--model", default="tiny", help=f"preset ({', '.join(preset_names())})")
    p.add_argument("--device", default="auto")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--attention-backend", default="auto")
    p.add_argument("--num-speculative-steps", type=int, default=0)
    p.add_argument("--max-num-seqs", type=int, default=8)
    p.add_argument("--max-num-batched-tokens", type=int, default=256)
    p.add_argument("--num-blocks", type=int, default=None)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--max-model-len", type=int, default=None)
    p.add_argument("--mixed-num-tokens", type=int, default=None)
    p.add_argument("--pooling", action="store_true", help="run the pooling (embedding) variant")
    p.add_argument("--compile", action="store_true",
                   help="torch.compile the dense layers (adds the compile phase's buckets)")
    p.add_argument("--json", action="store_true", help="print the report as JSON instead")
    return p


def build_config(args: argparse.Namespace) -> RunnerConfig:
    overrides: dict[str, object] = {"is_pooling_model": args.pooling}
    if args.max_model_len is not None:
        overrides["max_model_len"] = args.max_model_len
    return RunnerConfig(
        model=ModelConfig.from_preset(args.model, **overrides),
        cache=CacheConfig(block_size=args.block_size, num_blocks=args.num_blocks),
        scheduler=SchedulerConfig(max_num_seqs=args.max_num_seqs,
                                  max_num_batched_tokens=args.max_num_batched_tokens),
        speculative=SpeculativeConfig(num_speculative_steps=args.num_speculative_steps),
        device=DeviceConfig(device=args.device, dtype=args.dtype,
                            attention_backend=args.attention_backend),
        compilation=CompilationConfig(compile=args.compile),
    )


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        config = build_config(args)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    monitor = JitMonitor()  # so the table's phases carry their compile counts
    runner, load_phase = load_runner(config, jit_monitor=monitor)
    report = run_warmup_plan(runner, load_phase=load_phase,
                             mixed_num_tokens=args.mixed_num_tokens)
    print(json.dumps(report.to_dict(), indent=2) if args.json else format_phase_table(report))
    return 0 if report.succeeded else 1


if __name__ == "__main__":
    sys.exit(main())
