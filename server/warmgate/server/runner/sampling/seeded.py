"""Per-position random streams for seeded requests.

A seeded request's noise for output position n comes only from a generator seeded with
(seed, n), so its tokens depend neither on its batch companions nor on how its positions were
split into steps (preemption, a token budget trimming its drafts, a warmup in between, k
itself).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

_MASK64 = (1 << 64) - 1


def _mix(seed: int, position: int) -> int:
    """splitmix64 of (seed, position): neighbouring positions get unrelated generator states."""
    z = (seed * 0x9E3779B97F4A7C15 + position + 0x9E3779B97F4A7C15) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return (z ^ (z >> 31)) >> 1  # manual_seed takes a non-negative int64


def make_generator(seed: int, position: int, device: torch.device) -> torch.Generator:
    """The generator for one seeded request's output position."""
    gen = torch.Generator(device=device)
    gen.manual_seed(_mix(seed, position))
    return gen


@dataclass(frozen=True)
class SeededStream:
    """A seeded request's random stream from the first position this step samples: the
    logits row for output position `start + j` draws only from make_generator(seed, start + j)."""

    seed: int
    start: int

    def generators(self, num_rows: int, device: torch.device) -> list[torch.Generator]:
        return [make_generator(self.seed, self.start + j, device) for j in range(num_rows)]
