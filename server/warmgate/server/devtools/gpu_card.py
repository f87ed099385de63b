"""Which GPU a bench runs on, and its memory bandwidth: the figure every roofline divides by.

A roofline is only as right as its bandwidth: an H100 SXM's HBM3 moves about 3.35 TB/s, an
H200's HBM3e 4.8 TB/s, so one constant for both puts every ratio measured on the other card
off by 1.43x. The bandwidth comes from a table of known cards (the vendor's figure, the one
published rooflines use), found by the name the driver reports; a device-to-device copy
measured once checks it (a copy reaches about 0.8-0.9 of the figure on HBM cards) and stands in
for a card the table does not know. The card's short name (`h100`, `h200`) names the result
files, so a figure never travels under another card's name.

    python -m warmgate.server.devtools.gpu_card          # one line: name, figure, copy
    python -m warmgate.server.devtools.gpu_card --slug   # h100, h200, ... (for file names)
"""

from __future__ import annotations

import argparse
import platform
import re
import time
from dataclasses import dataclass

# (pattern on the driver's name, slug, bytes/s, dense bfloat16 FLOP/s), the most specific
# first: an H100 NVL's name contains "H100" too. Figures are the vendors' data-sheet ones (the
# FLOP/s dense, half the sparse figure; devtools.served_ceiling divides by them).
KNOWN_CARDS: tuple[tuple[str, str, float, float], ...] = (
    (r"GH200.*144|GH200.*HBM3e", "gh200-144gb", 4.9e12, 989e12),
    (r"GH200", "gh200", 4.0e12, 989e12),
    (r"H200", "h200", 4.8e12, 989e12),
    (r"H100.*NVL", "h100-nvl", 3.9e12, 835e12),
    (r"H100.*PCIe", "h100-pcie", 2.0e12, 756e12),
    (r"H100", "h100", 3.35e12, 989e12),  # SXM, 80 GB HBM3
    (r"H800", "h800", 3.35e12, 989e12),
    (r"H20\b", "h20", 4.0e12, 148e12),
    (r"B200", "b200", 8.0e12, 2250e12),
    (r"A100.*80GB", "a100-80gb", 2.039e12, 312e12),
    (r"A100", "a100", 1.555e12, 312e12),
    (r"L40S", "l40s", 0.864e12, 362e12),
    (r"L4\b", "l4", 0.3e12, 121e12),
)
# Each known card's dense bfloat16 peak by slug.
PEAK_BF16_FLOPS: dict[str, float] = {slug: peak for _, slug, _, peak in KNOWN_CARDS}
# Bytes each copy of the check moves one way; large enough that launch overhead vanishes
# (on a CPU, whose memory the roofline of a CPU run divides by, a quarter of it).
COPY_BYTES = {"cuda": 1 << 30, "cpu": 1 << 28}


@dataclass(frozen=True)
class Card:
    name: str  # as the driver reports it
    slug: str  # for file names: h100, h200, ...
    table_bytes_per_s: float | None  # the known figure; None for a card the table lacks
    copy_bytes_per_s: float | None  # read + write of a device-to-device copy; None if unmeasured

    @property
    def bytes_per_s(self) -> float:
        """The roofline's bandwidth: the table's figure, else what the copy measured."""
        if self.table_bytes_per_s is not None:
            return self.table_bytes_per_s
        if self.copy_bytes_per_s is None:
            raise ValueError(f"{self.name}: not a known card and no copy measured")
        return self.copy_bytes_per_s

    def describe(self) -> str:
        table = (f"{self.table_bytes_per_s / 1e12:.2f} TB/s (known card)"
                 if self.table_bytes_per_s is not None else "not a known card")
        if self.copy_bytes_per_s is None:
            return f"card: {self.name} ({self.slug}): roofline bandwidth {table}"
        copy = f"device-to-device copy {self.copy_bytes_per_s / 1e12:.2f} TB/s"
        if self.table_bytes_per_s is not None:
            copy += f" ({self.copy_bytes_per_s / self.table_bytes_per_s:.2f} of it)"
        else:
            copy += " (the roofline uses it)"
        return f"card: {self.name} ({self.slug}): roofline bandwidth {table}; {copy}"


def known_card(name: str) -> tuple[str, float | None]:
    """(slug, bytes/s) of a driver name; an unknown card's slug is its name made file-safe."""
    for pattern, slug, bandwidth, _ in KNOWN_CARDS:
        if re.search(pattern, name, re.IGNORECASE):
            return slug, bandwidth
    slug = re.sub(r"[^a-z0-9]+", "-", name.lower().removeprefix("nvidia ")).strip("-")
    return slug or "unknown", None


def copy_bandwidth(device: str, nbytes: int | None = None, repeats: int = 10) -> float:
    """Bytes/s a device-to-device copy reads and writes, best of `repeats` (after one to
    warm up)."""
    import torch

    kind = torch.device(device).type
    nbytes = COPY_BYTES.get(kind, COPY_BYTES["cpu"]) if nbytes is None else nbytes
    src = torch.empty(nbytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    dst.copy_(src)
    cuda = src.is_cuda
    best = float("inf")
    for _ in range(repeats):
        if cuda:
            torch.cuda.synchronize(src.device)
        start = time.perf_counter()
        dst.copy_(src)
        if cuda:
            torch.cuda.synchronize(src.device)
        best = min(best, time.perf_counter() - start)
    return 2 * nbytes / best


def detect(device: str = "cuda", *, measure: bool = True) -> Card:
    """The card `device` names, its table figure and (with `measure`) the copy check. A CPU
    device is no known card: its roofline divides by the copy it measures."""
    import torch

    dev = torch.device(device)
    if dev.type == "cuda":
        name = torch.cuda.get_device_name(dev)
        slug, bandwidth = known_card(name)
    else:
        name, slug, bandwidth = f"CPU {platform.machine()}", "cpu", None
    copy = copy_bandwidth(device) if measure else None
    return Card(name, slug, bandwidth, copy)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default=None, help="default: cuda when there is one, else cpu")
    p.add_argument("--slug", action="store_true", help="print only the card's short name")
    args = p.parse_args(argv)
    if args.device is None:
        import torch

        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    card = detect(args.device, measure=not args.slug)
    print(card.slug if args.slug else card.describe())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
