"""Whether `--pdl` (programmatic dependent launch, kernels/pdl.py) can run where the runner is
resolved: a CUDA device of compute capability 9.0 or newer (Hopper's griddepcontrol
instructions), the Triton ops in use (only they take it), and a Triton that has the launch
option and the device calls. Anything else is refused at start-up naming the flag: on an
older GPU the kernels' PTX would fail to compile at the first forward, and without the Triton
ops the flag would silently change nothing.
"""

from __future__ import annotations

import dataclasses
import importlib

from warmgate.server.config.config_error import ConfigError

PDL_FIELD = "compilation.pdl"
# Hopper: the first compute capability with griddepcontrol (PTX ISA 7.8, sm_90).
PDL_MIN_CAPABILITY = (9, 0)


def triton_launches_pdl() -> bool:
    """Whether the installed Triton has the `launch_pdl` launch option and
    tl.extra.cuda.gdc_wait / gdc_launch_dependents (merged into Triton in April 2025: 3.6
    has them)."""
    try:  # imported by name: triton ships no type information
        cuda_language = importlib.import_module("triton.language.extra.cuda")
        compiler = importlib.import_module("triton.backends.nvidia.compiler")
    except ImportError:
        return False
    options = {f.name for f in dataclasses.fields(compiler.CUDAOptions)}
    return ("launch_pdl" in options and hasattr(cuda_language, "gdc_wait")
            and hasattr(cuda_language, "gdc_launch_dependents"))


def check_pdl(device: str, attention_backend: str, capability: tuple[int, int] | None,
              triton_ok: bool | None = None) -> None:
    """ConfigError naming --pdl unless this resolved device and backend can launch with PDL.
    `capability` (default: the device's) and `triton_ok` (default: triton_launches_pdl())
    are there for tests."""
    if not device.startswith("cuda"):
        raise ConfigError(PDL_FIELD, "programmatic dependent launch needs a CUDA GPU of "
                          f"compute capability 9.0 or newer (Hopper); --device is {device}")
    if attention_backend == "torch":
        raise ConfigError(PDL_FIELD, "programmatic dependent launch applies to the Triton "
                          "ops, which run with --attention-backend triton or flashinfer; "
                          "it is torch")
    if capability is None:
        import torch

        capability = torch.cuda.get_device_capability(device)
    if tuple(capability) < PDL_MIN_CAPABILITY:
        raise ConfigError(PDL_FIELD, "programmatic dependent launch needs compute capability "
                          f"9.0 or newer (Hopper); {device} is {capability[0]}.{capability[1]}")
    if not (triton_launches_pdl() if triton_ok is None else triton_ok):
        raise ConfigError(PDL_FIELD, "the installed Triton has no launch_pdl launch option "
                          "or no tl.extra.cuda.gdc_wait: programmatic dependent launch needs "
                          "a newer one (Triton 3.6 has both)")
