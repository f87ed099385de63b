#!/usr/bin/env bash
# The GPU smoke test: every preset x attention backend x k in {0, 3} on fresh servers, one row
# each (bench/warm.py smoke). Run it first after any change to GPU code, before anything else
# on the GPU. Its table goes to stdout and to $OUT/<card>-smoke.txt, each run's own output to
# $OUT/smoke-logs.tgz. COMMIT names the commit run (default: git rev-parse HEAD; a copy of the
# tree without its .git history must be told); NAME the result file (default smoke: a second
# run in one call, e.g. the MoE presets at 600 requests, takes another).
#   OUT=/tmp/out bash bench/gpu_smoke.sh                         # everything
#   OUT=/tmp/out bash bench/gpu_smoke.sh --presets qwen3-30b-a3b # any flags of the command
set -uo pipefail
OUT=${OUT:-/tmp/warmgate-out}
mkdir -p "$OUT"
source bench/lib/gpu_env.sh  # the carried wheels, PYTHONPATH and $CARD
# One FlashInfer JIT cache for every server of the run: only the first pays the cold JIT.
export FLASHINFER_WORKSPACE_BASE=${FLASHINFER_WORKSPACE_BASE:-/tmp/fi-base}
NAME=${NAME:-smoke}
echo "commit ${COMMIT:-$(git rev-parse HEAD)}" | tee "$OUT/$CARD-$NAME.txt"
python3 bench/warm.py smoke --logs "/tmp/$NAME-logs" "$@" 2>"$OUT/$NAME.err" \
  | tee -a "$OUT/$CARD-$NAME.txt"
rc=${PIPESTATUS[0]}
tar czf "$OUT/$NAME-logs.tgz" -C /tmp "$NAME-logs"
tail -3 "$OUT/$NAME.err"
exit "$rc"
