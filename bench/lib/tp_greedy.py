"""Greedy tokens at tensor-parallel size N against TP=1, prompt by prompt.

    python bench/serve.py tp-greedy --model llama-3.1-8b --device cuda --dtype bfloat16 \
        --attention-backend flashinfer --tensor-parallel-size 2 --prompts 20 --tokens 16

Both runners warm up first (the plan, CUDA graphs included), then each of --prompts seeded
random prompts (16..512 tokens) is decoded greedily alone for --tokens tokens on each. Prints,
per prompt, whether the tokens agree and, where they first differ, the step and the largest
logit gap up to there; last `prompts_equal: K/N`. In bf16 a sum of partial products in
another order (the all-reduce) can flip a near-tie; the gap says how near it was.
"""

from __future__ import annotations

import argparse
import dataclasses
import random
from typing import Any

import torch

from warmgate.server.config.server_config import RUNNER_FLAGS, add_options
from warmgate.server.devtools.batch_driver import BatchDriver, DrivenRequest, Work
from warmgate.server.runner.scheduler_output import GREEDY
from warmgate.server.startup import checked_runner_config
from warmgate.server.warmup.plan import load_runner, run_warmup_plan


def greedy(runner: Any, prompt: list[int], tokens: int) -> tuple[list[int], list[torch.Tensor]]:
    """One request alone: the prompt in steps of the token budget, then one token a step;
    each step's logits."""
    sched = BatchDriver(runner)
    sched.add(DrivenRequest("p", list(prompt), GREEDY, max_new_tokens=tokens))
    logits: list[torch.Tensor] = []
    while not sched.reqs["p"].done:
        req = sched.reqs["p"]
        budget = runner.config.scheduler.max_num_batched_tokens
        sched.step({"p": Work(min(req.remaining_prompt, budget) if req.prefilling else 1)})
        if len(runner.last_logits):  # a chunk that ends before the prompt does samples nothing
            logits.append(runner.last_logits[-1].float().cpu())
    out = list(sched.reqs["p"].output_token_ids)
    sched.finish("p")
    sched.flush()  # the finish reaches the runner
    return out, logits


def run(config: Any, prompts: list[list[int]], tokens: int) -> list[tuple[list[int], Any]]:
    runner, _ = load_runner(config)
    try:
        report = run_warmup_plan(runner)
        if not report.succeeded:
            raise SystemExit(f"warmup failed: {[(p.name, p.detail) for p in report.phases]}")
        return [greedy(runner, p, tokens) for p in prompts]
    finally:
        if hasattr(runner, "close"):
            runner.close()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_options(p, RUNNER_FLAGS, environ={})
    p.add_argument("--prompts", type=int, default=20)
    p.add_argument("--tokens", type=int, default=16)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    config = checked_runner_config(args)
    size = config.parallel.tensor_parallel_size
    rng = random.Random(args.seed)
    vocab = config.model.vocab_size
    longest = max(16, min(512, config.model.max_model_len - args.tokens - 1))
    prompts = [[rng.randrange(vocab) for _ in range(rng.randint(16, longest))]
               for _ in range(args.prompts)]
    single = dataclasses.replace(config, parallel=dataclasses.replace(config.parallel,
                                                                      tensor_parallel_size=1))
    expected = run(single, prompts, args.tokens)
    got = run(config, prompts, args.tokens)
    equal = 0
    for i, ((want, want_logits), (have, have_logits)) in enumerate(zip(expected, got,
                                                                      strict=True)):
        first = next((j for j, (a, b) in enumerate(zip(want, have, strict=True)) if a != b),
                     None)
        upto = len(want) if first is None else first + 1
        gap = max((a - b).abs().max().item()
                  for a, b in zip(want_logits[:upto], have_logits[:upto], strict=True))
        equal += first is None
        print(f"prompt {i:2d} ({len(prompts[i])} tokens): "
              + ("equal" if first is None else f"differs at token {first}")
              + f", max logit gap {gap:.4g}")
    print(f"tensor_parallel_size {size} vs 1, {args.tokens} greedy tokens")
    print(f"prompts_equal: {equal}/{len(prompts)}")


if __name__ == "__main__":
    main()
