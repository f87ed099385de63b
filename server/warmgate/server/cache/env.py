"""Point the compilers' caches into the entry, before any of them reads its variable.

When they are read: FlashInfer computes its workspace from FLASHINFER_WORKSPACE_BASE when
`flashinfer.jit.env` is imported; Triton reads TRITON_CACHE_DIR through `triton.knobs` on each
cache access (autotune results with `cache_results=True` go to the same cache; our kernels do
not autotune); inductor reads TORCHINDUCTOR_CACHE_DIR on first use (`cache_dir_utils.cache_dir`).
`warmgate.server` imports none of them before the runner is built (tests check it), so setting
the variables when the entry is opened, just before the runner is built, is early enough.

A variable the user already set is respected, and said so loudly: silently overriding it
(vllm PR 48806) sends a mounted cache volume unused.
"""

from __future__ import annotations

import logging
import os
from collections.abc import MutableMapping
from dataclasses import dataclass, field
from pathlib import Path

from warmgate.server.cache.shape_sweeps import ENV_VAR as SHAPE_SWEEP_ENV_VAR

logger = logging.getLogger(__name__)

# variable -> subdirectory of the entry
CACHE_ENV_VARS = {
    "TRITON_CACHE_DIR": "triton",
    "FLASHINFER_WORKSPACE_BASE": "flashinfer",
    "TORCHINDUCTOR_CACHE_DIR": "inductor",
    # Ours: the shape sweeps' kernel map.
    SHAPE_SWEEP_ENV_VAR: "shape_sweeps",
}


@dataclass
class EnvResult:
    applied: dict[str, str] = field(default_factory=dict)
    # variable -> the user's value, kept
    respected: dict[str, str] = field(default_factory=dict)


def apply_cache_env(entry: Path, environ: MutableMapping[str, str] | None = None) -> EnvResult:
    environ = os.environ if environ is None else environ
    result = EnvResult()
    for var, sub in CACHE_ENV_VARS.items():
        ours = str(entry / sub)
        theirs = environ.get(var)
        if theirs is not None and theirs != ours:
            result.respected[var] = theirs
            logger.warning(
                "%s is already set (%s): respecting it, so that cache lives there and NOT in "
                "the warmgate cache entry %s (no lock, no READY marker, not shared through "
                "--cache-dir). Unset %s to let --cache-dir manage it.", var, theirs, entry, var)
            continue
        Path(ours).mkdir(parents=True, exist_ok=True)
        environ[var] = ours
        result.applied[var] = ours
    return result


def repoint_cache_env(result: EnvResult, root: Path,
                      environ: MutableMapping[str, str] | None = None) -> EnvResult:
    """Move the variables `result` applied (never the user's own) under `root`."""
    environ = os.environ if environ is None else environ
    moved = EnvResult(respected=dict(result.respected))
    for var, sub in CACHE_ENV_VARS.items():
        if var in result.respected:
            continue
        ours = str(root / sub)
        Path(ours).mkdir(parents=True, exist_ok=True)
        environ[var] = ours
        moved.applied[var] = ours
    return moved
