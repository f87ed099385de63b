"""--mode breakdown: where the first Generate after ready spends its time to first token, against
the steady requests, in one process (client and server share the clock).

    python bench/warm.py first-request --mode breakdown [--gap-s 0.25 --repeats 20] \
        --model llama-3.2-1b --device cuda --num-speculative-steps 3   (server flags)

The serving loop runs in this process (--no-engine-process), where the timers can wrap it; the
client's time around the step is therefore the in-process server's. Every request follows
--gap-s of idleness; a first request faster than the steady median
here, with slower ones across fresh server processes, points at run-to-run host noise.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import random
import statistics
import time
from collections.abc import Iterator, Sequence

from method_timer import time_calls

from warmgate.client.aio import AsyncWarmgateClient
from warmgate.client.errors import WarmgateRpcError
from warmgate.server.app import create_server
from warmgate.server.runner.model_runner import ModelRunner
from warmgate.server.serving.loop import ServingLoop
from warmgate.server.serving.scheduler import Scheduler
from warmgate.server.startup import load_server_config

LOG: list[tuple[str, float, float]] = []
PARTS = ("step", "schedule", "execute_model", "sample_tokens", "update")


def _log(name: str, start: float, seconds: float) -> None:
    """(name, start, seconds) of one call, from whichever thread made it."""
    LOG.append((name, start, seconds))


@contextlib.contextmanager
def instrumented() -> Iterator[None]:
    timed = ((ServingLoop, "step"), (Scheduler, "schedule"), (Scheduler, "update"),
             (ModelRunner, "execute_model"), (ModelRunner, "sample_tokens"))
    undo = [time_calls(cls, name, functools.partial(_log, name)) for cls, name in timed]
    try:
        yield
    finally:
        for restore in undo:
            restore()


async def one(c: AsyncWarmgateClient, prompt: list[int]) -> dict[str, float]:
    """One request's client TTFT, split at its first step (the prefill that samples the
    first token): before it, its parts, and after it (emit -> the client has the token)."""
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


async def body(flags: Sequence[str], gap: float, repeats: int, prompt_len: int) -> None:
    # The loop in this process (--no-engine-process): the timers wrap its classes here.
    config = load_server_config(["--host", "127.0.0.1", "--port", "0", "--metrics-port", "-1",
                                 "--no-warmup-on-start", "--no-engine-process", *flags],
                                environ={})
    vocab = config.runner.model.vocab_size
    rng = random.Random(0)
    server = await create_server(config)
    try:
        async with AsyncWarmgateClient(f"127.0.0.1:{server.port}") as c:
            await c.warmup_kernels(timeout=600)
            try:
                async for _ in c.generate([], max_tokens=1):
                    pass
            except WarmgateRpcError:  # INVALID_ARGUMENT: only the call set-up was wanted
                pass
            rows = []
            for _ in range(repeats + 1):
                await asyncio.sleep(gap)
                rows.append(await one(c, [rng.randrange(vocab) for _ in range(prompt_len)]))
    finally:
        await server.stop(0, wait_for_runner=True)
    keys = ("client", "to_step", "step", "schedule", "execute_model", "sample_tokens",
            "update", "after_step")
    print("  ".join(f"{k:>13}" for k in ("ms", *keys)))
    print("  ".join(f"{v:>13}" for v in ("first", *(f"{rows[0].get(k, 0) * 1e3:.2f}"
                                                      for k in keys))))
    print("  ".join(f"{v:>13}" for v in ("steady median", *(
        f"{statistics.median(r.get(k, 0) for r in rows[1:]) * 1e3:.2f}" for k in keys))))


def main(argv: list[str], prog: str | None = None) -> int:
    """argv: server flags, after optional --gap-s S --repeats N --prompt-len L."""
    # No abbreviations: every other flag is the server's, passed through whole.
    p = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0],
                                allow_abbrev=False)
    p.add_argument("--gap-s", type=float, default=0.25)
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--prompt-len", type=int, default=128)
    args, flags = p.parse_known_args(argv)
    with instrumented():
        asyncio.run(body(flags, args.gap_s, args.repeats, args.prompt_len))
    return 0

