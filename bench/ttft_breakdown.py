"""Diagnostic: where the first Generate after ready spends its time to first token, against
the steady requests, in one process (client and server share the clock).

    PYTHONPATH=client:server:. python bench/ttft_breakdown.py --model llama-3.2-1b --device cuda
"""

from __future__ import annotations

import asyncio
import functools
import random
import statistics
import sys
import time
from typing import Any

from tests.grpc_harness import serving
from warmgate.client.aio import AsyncWarmgateClient
from warmgate.server.runner.model_runner import ModelRunner
from warmgate.server.server_config import load_server_config
from warmgate.server.serving.loop import ServingLoop
from warmgate.server.serving.scheduler import Scheduler

LOG: list[tuple[str, float, float]] = []
PARTS = ("step", "schedule", "execute_model", "sample_tokens", "update")


def _wrap(cls: Any, name: str) -> None:
    orig = getattr(cls, name)

    @functools.wraps(orig)
    def timed(*a: Any, **k: Any) -> Any:
        t = time.perf_counter()
        try:
            return orig(*a, **k)
        finally:
            LOG.append((name, t, time.perf_counter() - t))

    setattr(cls, name, timed)


for _cls, _name in ((ServingLoop, "step"), (Scheduler, "schedule"), (Scheduler, "update"),
                    (ModelRunner, "execute_model"), (ModelRunner, "sample_tokens")):
    _wrap(_cls, _name)


async def one(c: AsyncWarmgateClient, prompt: list[int]) -> dict[str, float]:
    LOG.clear()
    sent = time.perf_counter()
    first = None
    async for m in c.generate(prompt, max_tokens=4):
        if first is None and m.token_ids:
            first = time.perf_counter() - sent
    steps = [e for e in LOG if e[0] == "step"]
    s0 = steps[0]
    inside = {n: d for n, t, d in LOG if s0[1] <= t <= s0[1] + s0[2] and n != "step"}
    return {"client": first or 0.0, "to_step": s0[1] - sent, "step": s0[2], **inside,
            "after_step": (first or 0.0) - (s0[1] - sent) - s0[2]}


async def body(flags: list[str], gap: float, repeats: int) -> None:
    config = load_server_config(["--host", "127.0.0.1", "--port", "0", "--metrics-port", "-1",
                                 "--no-warmup-on-start", *flags], environ={})
    vocab = config.runner.model.vocab_size
    rng = random.Random(0)
    async with serving(config) as s, AsyncWarmgateClient(f"127.0.0.1:{s.port}") as c:
        await c.warmup_kernels(timeout=600)
        try:
            async for _ in c.generate([], max_tokens=1):
                pass
        except Exception:  # INVALID_ARGUMENT: only the call set-up was wanted
            pass
        rows = []
        for _ in range(repeats + 1):
            await asyncio.sleep(gap)
            rows.append(await one(c, [rng.randrange(vocab) for _ in range(128)]))
    keys = ("client", "to_step", "step", "schedule", "execute_model", "sample_tokens",
            "update", "after_step")
    print("  ".join(f"{k:>13}" for k in ("ms", *keys)))
    print("  ".join(f"{v:>13}" for v in ("first", *(f"{rows[0].get(k, 0) * 1e3:.2f}"
                                                      for k in keys))))
    print("  ".join(f"{v:>13}" for v in ("steady median", *(
        f"{statistics.median(r.get(k, 0) for r in rows[1:]) * 1e3:.2f}" for k in keys))))


if __name__ == "__main__":
    asyncio.run(body(sys.argv[1:], 0.25, 20))
