"""A compile cache that survives restarts and is shared across pods (`--cache-dir`).

Importing this package imports neither torch, triton nor flashinfer.
"""

from warmgate.server.cache.env import CACHE_ENV_VARS, apply_cache_env
from warmgate.server.cache.key import cache_key, key_inputs
from warmgate.server.cache.store import HIT, MISS, REBUILT, CacheInfo, CompileCache

__all__ = ["CACHE_ENV_VARS", "HIT", "MISS", "REBUILT", "CacheInfo", "CompileCache",
           "apply_cache_env", "cache_key", "key_inputs"]
