"""The model runner package.

`ModelRunner` is imported lazily so that light modules here (batch classification, the
scheduler-output types) stay importable without building anything heavy.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from warmgate.server.config.runner_config import RunnerConfig, resolve_runner_config

if TYPE_CHECKING:
    from warmgate.server.runner.model_runner import ModelRunner


def build_runner(config: RunnerConfig) -> ModelRunner:
    """Resolve every "auto" in config, then construct the runner (weights, KV cache, backend)."""
    from warmgate.server.runner.model_runner import ModelRunner

    return ModelRunner(resolve_runner_config(config))


def __getattr__(name: str) -> Any:
    if name == "ModelRunner":
        from warmgate.server.runner.model_runner import ModelRunner

        return ModelRunner
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["ModelRunner", "build_runner"]
