"""gRPC server options the main server and the health process share (no grpc import here)."""

from __future__ import annotations

# Calls that arrived but no handler has taken yet: above gRPC's soft limit (1,000) it rejects
# new calls at random (CANCELLED before any handler runs, so no metric sees them), all of
# them at its hard limit (3,000). A burst of probes or status watches queues there while the
# event loop works through it; deadlines still end calls that wait too long.
MAX_PENDING_CALLS = 50_000
# so_reuseport 0: otherwise a second server silently binds the same port and shares it.
SERVER_OPTIONS = (("grpc.so_reuseport", 0),
                  ("grpc.server.max_pending_requests", MAX_PENDING_CALLS),
                  ("grpc.server.max_pending_requests_hard_limit", MAX_PENDING_CALLS))
