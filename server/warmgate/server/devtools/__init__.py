"""Tools for driving warmgate from outside its serving path: benchmarks and tests share them.

Why here, shipped with the server, rather than in bench/ or tests/: both need the same pieces
(a runner built and warmed from the server's own flags, batches chosen by the caller, random
batches, the `warmgate-server` subprocess harness, the Generate workload and its statistics,
random-weight checkpoints, the start-up log's timeline),
tests must not import benchmark scripts, and every `python bench/x.py` command has to run
from a plain `pip install -e` checkout, where the repository root is not on sys.path but the
installed package is. Nothing in the server imports this package.
"""
