"""What the server reports about itself: Prometheus metrics (warmup, RPCs, JIT, serving) and
the warmup's log lines."""
