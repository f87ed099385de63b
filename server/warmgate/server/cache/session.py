"""The engine's two touch points with the cache, kept out of engine.py."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

from warmgate.server.cache.degrade import cache_write_failure
from warmgate.server.cache.store import ERROR, CacheInfo, CompileCache
from warmgate.server.config.runner_config import RunnerConfig, resolve_runner_config
from warmgate.server.core.phases import LOAD
from warmgate.server.core.results import WarmupReport

logger = logging.getLogger(__name__)


def open_compile_cache(cache: CompileCache | None, config: RunnerConfig) -> None:
    """Open the entry (sets the compilers' cache variables); a failure only turns it off."""
    if cache is None or cache.info.state:
        return
    try:
        cache.open(resolve_runner_config(config))
    except Exception as exc:  # never take the server down over its cache
        logger.exception("compile cache %s could not be opened", cache.root)
        cache.close()
        cache.info = CacheInfo(state=ERROR, directory=str(cache.root), detail=str(exc))
        cache.degrade(f"opening the entry raised {type(exc).__name__}: {exc}")


def run_plan_with_cache(cache: CompileCache | None,
                        run_plan: Callable[[], WarmupReport]) -> WarmupReport:
    """run_plan(), then settle the entry. A plan that failed because the cache could not be
    written (a full disk mid-warmup) degrades the cache and runs once more, compiling into
    the private cache: the cache's trouble is never the warmup's."""
    report = _run_or_abandon(cache, run_plan)
    if cache is not None and cache.filling and not report.succeeded:
        entry = Path(cache.entry) if cache.entry is not None else None
        reason = cache_write_failure(report, entry)
        if reason is not None:
            cache.degrade(reason)
            logger.info("running the warmup plan again, with the private compile cache")
            report = _run_or_abandon(cache, run_plan)
    return settle_compile_cache(cache, report)


def _run_or_abandon(cache: CompileCache | None,
                    run_plan: Callable[[], WarmupReport]) -> WarmupReport:
    try:
        return run_plan()
    except BaseException:  # a stop (WarmupCancelled) or a fatal device error: no READY
        if cache is not None:
            cache.abandon("the warmup was stopped")
        raise


def settle_compile_cache(cache: CompileCache | None, report: WarmupReport) -> WarmupReport:
    """READY after a successful plan, no marker after a failed one; the report says which
    entry it used and in what state the entry was found."""
    if cache is None:
        return report
    if cache.filling:
        if report.succeeded:
            cache.commit(report.total_duration_s)
        else:
            cache.abandon()
    report.compile_cache = cache.refresh_size(force=True).to_dict()
    for p in report.phases:
        if p.name == LOAD:
            p.shapes["compile_cache"] = cache.info.state
    return report
