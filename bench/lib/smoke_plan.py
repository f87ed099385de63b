"""The smoke test's matrix and its reading, apart from the processes that run it: which
configurations there are, how much device memory each needs, which run at once, and what a
run's output says (bench/lib/smoke.py runs them)."""

from __future__ import annotations

import functools
import re
import statistics
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field

from warmgate.server.config.attention_backends import head_dim_problem
from warmgate.server.config.presets import preset_names
from warmgate.server.config.runner_config import ModelConfig
from warmgate.server.devtools.roofline import kv_bytes_per_token, num_params

# One shape for every configuration: small enough that a warmup takes seconds and several
# servers share one card, large enough that every path serving takes is there (ragged
# batches past 256 tokens: the MoE alignment's torch path; preemption under 50 requests).
MAX_NUM_SEQS, MAX_BATCHED_TOKENS, MAX_MODEL_LEN, BLOCK_SIZE = 16, 512, 1024, 16
NUM_BLOCKS = MAX_NUM_SEQS * (MAX_MODEL_LEN // BLOCK_SIZE) + 1
SHAPE_FLAGS = (f"--max-num-seqs {MAX_NUM_SEQS} --max-num-batched-tokens {MAX_BATCHED_TOKENS} "
               f"--max-model-len {MAX_MODEL_LEN} --block-size {BLOCK_SIZE} "
               f"--num-blocks {NUM_BLOCKS}")
# What a server holds besides weights and KV cache: the CUDA context, graph pool,
# activations, the attention libraries' workspaces; counted generously until a run's
# measured peaks say otherwise (the smoke's --overhead-gib).
OVERHEAD_BYTES = 4 * 2**30
# The share of the device's memory the running servers' estimates may add up to (the
# smoke's --memory-share).
MEMORY_SHARE = 0.9
TTFT_LIMIT = 1.15  # the default of the smoke's --ttft-limit


@dataclass(frozen=True)
class SmokeConfig:
    preset: str
    backend: str
    k: int
    overhead_bytes: int = OVERHEAD_BYTES  # counted for a server beside weights and KV cache

    @property
    def name(self) -> str:
        return f"{self.preset}:{self.backend}:k{self.k}"

    def server_args(self, device: str) -> str:
        return (f"--model {self.preset} --device {device} --attention-backend {self.backend} "
                f"--num-speculative-steps {self.k} {SHAPE_FLAGS}")


def matrix(presets: list[str] | None, backends: list[str], ks: list[int],
           overhead_bytes: int = OVERHEAD_BYTES) -> list[SmokeConfig]:
    """Every preset (or those named) x backend x k."""
    names = preset_names() if presets is None else presets
    unknown = sorted(set(names) - set(preset_names()))
    if unknown:
        raise ValueError(f"unknown presets {unknown}; presets: {', '.join(preset_names())}")
    return [SmokeConfig(p, b, k, overhead_bytes) for p in names for b in backends for k in ks]


def weights_and_kv_bytes(config: SmokeConfig) -> int:
    """A server's weights (FP8 projections at a byte, the rest in bf16) and its KV cache at
    the smoke's shape: what it holds besides its overhead."""
    model = ModelConfig.from_preset(config.preset)
    weights = num_params(model) * (1.1 if model.fp8 is not None else 2)
    return int(weights + NUM_BLOCKS * BLOCK_SIZE * kv_bytes_per_token(model))


@functools.cache  # the scheduler asks it of every running configuration, every loop
def memory_bytes(config: SmokeConfig) -> int:
    """Device memory a server of this configuration needs, about."""
    return weights_and_kv_bytes(config) + config.overhead_bytes


def fits(config: SmokeConfig, total_bytes: int, share: float = MEMORY_SHARE) -> bool:
    return memory_bytes(config) <= share * total_bytes


def why_not(config: SmokeConfig, total_bytes: int, share: float = MEMORY_SHARE) -> str | None:
    """Why this configuration gets a row instead of a run, or None: the card cannot hold
    it, or the backend has no kernels for the model's head size (the server refuses it)."""
    problem = head_dim_problem(config.backend, ModelConfig.from_preset(config.preset).head_dim)
    if problem is not None:
        return f"does not apply: {problem}"
    if not fits(config, total_bytes, share):
        return (f"does not fit: needs about {memory_bytes(config) / 2**30:.0f} GiB, the card "
                f"has {total_bytes / 2**30:.0f} GiB")
    return None


def run_order(configs: list[SmokeConfig], alone: Collection[str]) -> list[SmokeConfig]:
    """The largest first (they bound the run's length; the small ones fill in beside them),
    but the first run of each backend in `alone` a small one: it pays the backend's cold
    compile alone, before that backend's other runs start and would each pay it again."""
    by_size = sorted(configs, key=lambda c: (-memory_bytes(c), c.name))
    firsts: list[SmokeConfig] = []
    for backend in dict.fromkeys(c.backend for c in configs if c.backend in alone):
        firsts.append(min((c for c in configs if c.backend == backend),
                          key=lambda c: (memory_bytes(c), c.name)))
    return firsts + [c for c in by_size if c not in firsts]


@dataclass
class SmokeRow:
    config: SmokeConfig
    exit_code: int | None = None  # None: not run
    ready_s: float | None = None
    ttft_ratio: float | None = None
    compiles: int | None = None  # after ready, other than autotunes
    autotunes: int | None = None
    graph_misses: int | None = None
    errors: int | None = None
    note: str = ""
    wall_s: float = 0.0
    peak_bytes: int | None = None  # device memory its processes held at most; None: unread
    tail: list[str] = field(default_factory=list)
    ttft_limit: float = TTFT_LIMIT  # first/steady TTFT above it is a fault
    # The SM clock (MHz) before the first TTFT request's gap, and the steady ones' median.
    ttft_clocks: tuple[int, float] | None = None
    # The slowest steady TTFT over their median: a first request past the limit but no slower
    # than a steady one shares their jitter rather than paying for something cold.
    ttft_slowest_steady: float | None = None

    @property
    def clean(self) -> bool:
        return self.exit_code is not None and not self.faults()

    def faults(self) -> list[str]:
        """What keeps a run that ended from being clean, each with its figure."""
        out = [] if self.exit_code == 0 else [f"exit {self.exit_code}"]
        for name in ("compiles", "autotunes", "graph_misses", "errors"):
            value = getattr(self, name)
            if value != 0:
                out.append(f"{name.replace('_', ' ')} {'unread' if value is None else value}")
        if self.ttft_ratio is None or self.ttft_ratio > self.ttft_limit:
            context = [] if self.ttft_clocks is None else [
                "first at {} MHz, steady {:.0f}".format(*self.ttft_clocks)]
            if self.ttft_slowest_steady is not None:
                context.append(f"slowest steady {self.ttft_slowest_steady:.2f}")
            detail = f" ({'; '.join(context)})" if context else ""
            out.append("TTFT unread" if self.ttft_ratio is None else
                       f"first/steady TTFT {self.ttft_ratio:.2f} > {self.ttft_limit}{detail}")
        return out


_READY = re.compile(r"^ready in ([\d.]+) s", re.M)
_TTFT = re.compile(r"^ttft: .* first/steady ([\d.]+)", re.M)
_CLOCKS = re.compile(r"^ttft sm clock MHz: (\d+)((?: \d+)+)$", re.M)
_SAMPLES = re.compile(r"^ttft samples ms: client [\d.]+((?: [\d.]+)+);", re.M)
_ERRORS = re.compile(r"^workload: .* errors (0|\{.*\})$", re.M)
_AFTER = re.compile(r"^after_ready: compiles (\d+) \((.*)\) graph_misses (\d+)", re.M)
_KIND = re.compile(r"(\w+) (\d+)")


def read_served(row: SmokeRow, output: str) -> SmokeRow:
    """Fill the row from `bench/warm.py served`'s output (whatever of it there is)."""
    if m := _READY.search(output):
        row.ready_s = float(m.group(1))
    if m := _TTFT.search(output):
        row.ttft_ratio = float(m.group(1))
    if m := _CLOCKS.search(output):
        row.ttft_clocks = (int(m.group(1)), statistics.median(map(int, m.group(2).split())))
    if m := _SAMPLES.search(output):
        steady = [float(t) for t in m.group(1).split()]
        row.ttft_slowest_steady = max(steady) / statistics.median(steady)
    if m := _ERRORS.search(output):
        row.errors = 0 if m.group(1) == "0" else sum(
            int(n) for n in re.findall(r": (\d+)", m.group(1)))
    if m := _AFTER.search(output):
        kinds = {k: int(n) for k, n in _KIND.findall(m.group(2))}
        row.autotunes = kinds.get("autotune", 0)
        row.compiles = int(m.group(1)) - row.autotunes
        row.graph_misses = int(m.group(3))
    return row


def _cell(value: float | int | None, fmt: str) -> str:
    """The value in `fmt` ("7.1f", "8d"), or a dash as wide."""
    if value is not None:
        return format(value, fmt)
    return "-".rjust(int(re.match(r"\d+", fmt).group()))  # type: ignore[union-attr]


HEADER = (f"{'configuration':34} {'ready s':>7} {'TTFT f/s':>8} {'compiles':>8} "
          f"{'autotunes':>9} {'misses':>6} {'errors':>6} {'exit':>4} {'est GiB':>7} "
          f"{'peak GiB':>8}  note")


def format_row(row: SmokeRow) -> str:
    peak = None if row.peak_bytes is None else row.peak_bytes / 2**30
    return (f"{row.config.name:34} {_cell(row.ready_s, '7.1f')} {_cell(row.ttft_ratio, '8.2f')} "
            f"{_cell(row.compiles, '8d')} {_cell(row.autotunes, '9d')} "
            f"{_cell(row.graph_misses, '6d')} {_cell(row.errors, '6d')} "
            f"{_cell(row.exit_code, '4d')} {memory_bytes(row.config) / 2**30:7.1f} "
            f"{_cell(peak, '8.1f')}  {row.note or ('clean' if row.clean else 'NOT clean')}")


def ttft_summary(rows: Sequence[SmokeRow]) -> str | None:
    """How many rows' first request went past the TTFT limit, and in how many of those a
    steady request took at least as long as the first (jitter the steady ones share, where a
    path left cold would slow the first alone); None when no row went past."""
    slow = [r for r in rows if r.ttft_ratio is not None and r.ttft_ratio > r.ttft_limit]
    if not slow:
        return None
    shared = [r for r in slow
              if r.ttft_slowest_steady is not None and r.ttft_slowest_steady >= r.ttft_ratio]
    return (f"first/steady TTFT past the limit in {len(slow)} rows; in {len(shared)} of them a "
            f"steady request took at least as long as the first")
