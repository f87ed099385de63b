#!/usr/bin/env bash
# One bench command on a baseline tree and on this checkout, alternated round by round in one
# GPU call, so a change is measured side by side with the commit before it on the same warm
# machine. The baseline is a folder holding that commit's server/ package, made on a machine
# with the git history and carried to the GPU one as an ignored path (build/ is ignored):
#   rm -rf build/base && mkdir -p build/base && git archive REF server | tar x -C build/base
# then, on the GPU machine (both arms run the bench scripts of this checkout):
#   NAME=ab-decode-triton BASE_COMMIT=REF bash bench/gpu_ab.sh bench/serve.py decode-latency \
#     --model llama-3.1-8b --backends triton
# Output: stdout and $OUT/<card>-$NAME.txt, each arm's run under a "=== round R: base|new" line.
set -uo pipefail
OUT=${OUT:-/tmp/warmgate-out}
mkdir -p "$OUT"
source bench/lib/gpu_env.sh  # the carried wheels, PYTHONPATH and $CARD
BASE=${BASE:-build/base}
case $BASE in /*) ;; *) BASE=$PWD/$BASE ;; esac  # PYTHONPATH needs it absolute
[ -d "$BASE/server/warmgate" ] || { echo "no baseline tree: $BASE/server/warmgate"; exit 2; }
[ $# -gt 0 ] || { echo "usage: bash bench/gpu_ab.sh SCRIPT [ARGS...]"; exit 2; }
NAME=${NAME:-ab}
FILE="$OUT/$CARD-$NAME.txt"
export FLASHINFER_WORKSPACE_BASE=${FLASHINFER_WORKSPACE_BASE:-/tmp/fi-base}
echo "commit ${COMMIT:-$(git rev-parse HEAD)} (new) against ${BASE_COMMIT:-$BASE} (base)" \
  | tee "$FILE"
echo "command: python3 $*; ${ROUNDS:-2} rounds, base then new in each" | tee -a "$FILE"
for round in $(seq "${ROUNDS:-2}"); do
  for arm in base new; do
    path=$PYTHONPATH
    [ "$arm" = base ] && path=$BASE/server:$PYTHONPATH  # ahead of this checkout's
    echo "=== round $round: $arm" | tee -a "$FILE"
    PYTHONPATH=$path timeout "${AB_TIMEOUT:-240}" python3 "$@" 2>>"$OUT/$NAME.err" \
      | tee -a "$FILE"
  done
done
tail -3 "$OUT/$NAME.err"
