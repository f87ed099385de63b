#!/usr/bin/env bash
# The H200 evidence of time to ready against the floor, in runs of under 10 minutes
# each (caches die with the machine, and a call is limited to 10 minutes):
#   PARTS=1b     bench/start.py time-to-ready on llama-3.2-1b's shapes, flashinfer then triton,
#                RUNS warm starts each (default 5; about 250 s and 130 s)
#   PARTS=8b     the same on llama-3.1-8b's shapes (a 16 GB checkpoint written on the machine),
#                BACKENDS_8B (default flashinfer), RUNS_8B warm starts (default 2)
#   PARTS=first  bench/gpu_options.sh's first request per option after ready / steady, one
#                server per backend (FIRST_SERVERS, FIRST_STEADY pass through)
#   OUT=/tmp/out PARTS="8b first" bash bench/gpu_ready.sh
# Each run's stdout goes to $OUT/<card>-time-to-ready-<preset>-<backend>.txt as the bench printed
# it, its servers' stamped logs into one tarball ($OUT/ready-logs.tgz: one file to copy
# back from the GPU machine). The run that fills a backend's --cache-dir is its cold start.
set -uo pipefail
OUT=${OUT:-/tmp/warmgate-out}
mkdir -p "$OUT"
source bench/lib/gpu_env.sh  # the wheels in .whl/ and PYTHONPATH
PARTS=${PARTS:-1b}
RUNS=${RUNS:-5}
RUNS_8B=${RUNS_8B:-2}
BACKENDS_8B=${BACKENDS_8B:-flashinfer}
LOGS=/tmp/ready-logs
git rev-parse HEAD >"$OUT/commit.txt" 2>/dev/null || true
T0=$(date +%s)
stage() { echo "=== $1 (+$(( $(date +%s) - T0 )) s, $(date +%T))"; }

ready() {  # ready PRESET CKPT BACKEND RUNS
  local name="${CARD}-time-to-ready-$1-$3"
  stage "$name, $4 warm runs"
  timeout 560 python3 bench/start.py time-to-ready --write-checkpoint "$1" --model-dir "$2" \
    --attention-backend "$3" --runs "$4" --log-dir "$LOGS/$1-$3" >"$OUT/$name.txt" 2>"$OUT/$name.err"
  echo "exit $?; $(grep -E '^(ready_over_floor|warm_over_cold|cold_over_longest_compile)' \
    "$OUT/$name.txt" | tr '\n' ' ')"
}

for part in $PARTS; do case $part in
1b)
  ready llama-3.2-1b /tmp/ckpt-1b flashinfer "$RUNS"
  ready llama-3.2-1b /tmp/ckpt-1b triton "$RUNS" ;;
8b)
  for b in $BACKENDS_8B; do ready llama-3.1-8b /tmp/ckpt-8b "$b" "$RUNS_8B"; done ;;
first)
  stage "first request per option (bench/gpu_options.sh PARTS=first)"
  OUT=$OUT PARTS=first FIRST_SERVERS=${FIRST_SERVERS:-1} FIRST_STEADY=${FIRST_STEADY:-5} \
    bash bench/gpu_options.sh ;;
*) echo "unknown part: $part (1b, 8b or first)"; exit 2 ;;
esac; done
[ -d "$LOGS" ] && tar czf "$OUT/ready-logs.tgz" -C "$LOGS" .
stage done
