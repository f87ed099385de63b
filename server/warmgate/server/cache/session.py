"""The engine's two touch points with the cache, kept out of engine.py."""

from __future__ import annotations

import logging

from warmgate.server.cache.store import ERROR, CacheInfo, CompileCache
from warmgate.server.config import RunnerConfig, resolve_runner_config
from warmgate.server.warmup.results import WarmupReport

logger = logging.getLogger(__name__)


def open_compile_cache(cache: CompileCache | None, config: RunnerConfig) -> None:
    """Open the entry (sets the compilers' cache variables); a failure only turns it off."""
    if cache is None or cache.info.state:
        return
    try:
        cache.open(resolve_runner_config(config))
    except Exception as exc:  # never take the server down over its cache
        logger.exception("compile cache %s could not be opened; running without it",
                         cache.root)
        cache.close()
        cache.info = CacheInfo(state=ERROR, directory=str(cache.root), detail=str(exc))


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
        if p.name == "load":
            p.shapes["compile_cache"] = cache.info.state
    return report
