#!/usr/bin/env bash
# The GPU smoke test: every preset x attention backend x k in {0, 3} on fresh servers, one row
# each (bench/warm.py smoke). Run it first after any change to GPU code, before anything else
# on the GPU. Its table goes to stdout and to $OUT/<card>-smoke.txt, each run's own output to
# $OUT/smoke-logs.tgz. COMMIT names the commit run (default: git rev-parse HEAD; a copy of the
# tree without its .git history must be told).
#   OUT=/tmp/out bash bench/gpu_smoke.sh                         # everything
#   OUT=/tmp/out bash bench/gpu_smoke.sh --presets qwen3-30b-a3b # any flags of the command
set -uo pipefail
OUT=${OUT:-/tmp/warmgate-out}
mkdir -p "$OUT"
source bench/lib/gpu_env.sh  # the carried wheels, PYTHONPATH and $CARD
# One FlashInfer JIT cache for every server of the run: only the first pays the cold JIT.
export FLASHINFER_WORKSPACE_BASE=${FLASHINFER_WORKSPACE_BASE:-/tmp/fi-base}
echo "commit ${COMMIT:-$(git rev-parse HEAD)}" | tee "$OUT/$CARD-smoke.txt"
python3 bench/warm.py smoke --logs /tmp/smoke-logs "$@" 2>"$OUT/smoke.err" \
  | tee -a "$OUT/$CARD-smoke.txt"
rc=${PIPESTATUS[0]}
tar czf "$OUT/smoke-logs.tgz" -C /tmp smoke-logs
tail -3 "$OUT/smoke.err"
exit "$rc"
