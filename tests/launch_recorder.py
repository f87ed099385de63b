"""A stand-in for a Triton kernel in tests of launch decisions: it records each launch's grid
and keyword (compile-time) arguments instead of running anything."""

from __future__ import annotations

from collections.abc import Callable


class LaunchRecorder:
    """kernel[grid](*args, **kwargs) records (grid, kwargs) in `launches`."""

    def __init__(self) -> None:
        self.launches: list[tuple[tuple[int, ...], dict[str, object]]] = []

    def __getitem__(self, grid: tuple[int, ...]) -> Callable[..., None]:
        def launch(*args: object, **kwargs: object) -> None:
            self.launches.append((grid, kwargs))
        return launch
