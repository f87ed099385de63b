#!/usr/bin/env bash
# The GPU smoke test: every preset x attention backend x k in {0, 3} on fresh servers, one row
# each (bench/warm.py smoke). Run it first after any change to GPU code, before anything else
# on the GPU. Its table goes to stdout and to $OUT/<card>-smoke.txt, each run's own output to
# $OUT/smoke-logs/.
#   OUT=/tmp/out bash bench/gpu_smoke.sh                         # everything
#   OUT=/tmp/out bash bench/gpu_smoke.sh --presets qwen3-30b-a3b # any flags of the command
set -uo pipefail
OUT=${OUT:-/tmp/warmgate-out}
mkdir -p "$OUT"
source bench/lib/gpu_env.sh  # the carried wheels, PYTHONPATH and $CARD
# One FlashInfer JIT cache for every server of the run: only the first pays the cold JIT.
export FLASHINFER_WORKSPACE_BASE=${FLASHINFER_WORKSPACE_BASE:-/tmp/fi-base}
git rev-parse HEAD 2>/dev/null | sed 's/^/commit /' | tee "$OUT/$CARD-smoke.txt"
python3 bench/warm.py smoke --logs "$OUT/smoke-logs" "$@" 2>"$OUT/smoke.err" \
  | tee -a "$OUT/$CARD-smoke.txt"
rc=${PIPESTATUS[0]}
tail -3 "$OUT/smoke.err"
exit "$rc"
