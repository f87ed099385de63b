"""The start-up check config can make alone: an attention backend that cannot run here.

It raises ConfigError naming the setting, which load_server_config (warmgate.server.startup,
beside the checks that need the runner or the warmup plan) turns into one line naming the
flag and exit code 2: the runner would otherwise only find out after the server bound its
ports and said it was starting.
"""

from __future__ import annotations

from collections.abc import Mapping

from warmgate.server.config.attention_backends import backend_available
from warmgate.server.config.runner_config import ConfigError, RunnerConfig

# Backends whose kernels run only on a GPU. Triton's interpreter (TRITON_INTERPRET=1) runs
# triton kernels on the CPU, which the tests use; FlashInfer has no such mode.
_GPU_ONLY_BACKENDS = ("triton", "flashinfer")
TRITON_INTERPRET_VAR = "TRITON_INTERPRET"


def check_attention_backend(runner: RunnerConfig, environ: Mapping[str, str]) -> None:
    """The resolved backend can run on the resolved device, and its library is installed."""
    backend, device = runner.device.attention_backend, runner.device.device
    if backend in _GPU_ONLY_BACKENDS and not device.startswith("cuda"):
        interpreted = backend == "triton" and environ.get(TRITON_INTERPRET_VAR) == "1"
        if not interpreted:
            raise ConfigError("device.attention_backend",
                              f"{backend} needs a CUDA device but --device is {device}; "
                              "use --attention-backend torch (or auto) on a CPU")
    if not backend_available(backend):
        raise ConfigError("device.attention_backend",
                          f"{backend} was asked for but its Python package is not installed")
