#!/usr/bin/env bash
# The H200 evidence for sampling options: bench/warm.py coverage with every sampling option
# and grammar rows (JSON schema / regex / EBNF through xgrammar) drawn at random, 2,000 batches
# after ready for triton and flashinfer at k=0 and k=3 (about 4 minutes), then bench/warm.py first-request --mode options
# (the first request that uses each option after ready / steady) on FIRST_SERVERS fresh servers
# per backend in turn (default 3, class order shuffled per server; ~60-80 s per server per
# backend, so ~6-8 minutes at 3). Together that is over 10 minutes: where one command is limited
# to 10, run PARTS=coverage and PARTS=first as two calls. The model is llama-3.2-1b's shapes
# with random weights and a small trained tokenizer (written once into $CKPT). Each command's
# raw stdout goes to $OUT/<name>.txt, stderr beside it in <name>.err (xgrammar warns there about
# the random drafts it rejects), the options runs' JSON (every server's requests) to
# $OUT/first-options-<backend>.json.
#   OUT=/tmp/out bash bench/gpu_options.sh        (PARTS="coverage" or "first" runs one half;
#   COVERAGE="triton:3 flashinfer:0" picks coverage runs, backend:k; FIRST_K=0 for the options
#   runs, FIRST_SERVERS=1 for one server per backend, FIRST_BACKENDS=triton for one backend,
#   FIRST_CACHE_DIR=<dir> gives the options servers one --cache-dir per backend under it: the
#   first server fills it, the next ones start warm, as a restarted pod does, and sweep only
#   the sizes the kernel maps keep; FIRST_STEADY=5 takes 5 steady requests per class per server
#   instead of 10, so more servers fit in one call: each server gives each class one first
#   request, and more of those is what narrows the ratio)
# Coverage runs two lanes at once (flashinfer's in the background: its cold JIT, 70-90 s once per
# machine, overlaps the triton runs); each coverage process gets empty Triton and Inductor caches
# of its own, so no run's compiles after ready are hidden by (or mistaken for) another's. The
# first-request runs go one at a time, alone on the machine, since they time requests; each of
# their servers gets empty Triton and Inductor caches of its own too (its warmup compiles again,
# before ready, so not counted).
set -uo pipefail
OUT=${OUT:-/tmp/warmgate-out}
mkdir -p "$OUT"
source bench/lib/gpu_env.sh  # the wheels in .whl/ and PYTHONPATH
export FLASHINFER_WORKSPACE_BASE=${FLASHINFER_WORKSPACE_BASE:-/tmp/fi-base}
CKPT=${CKPT:-/tmp/ckpt-1b-text}
FIRST_K=${FIRST_K:-3}
FIRST_SERVERS=${FIRST_SERVERS:-3}
FIRST_BACKENDS=${FIRST_BACKENDS:-triton flashinfer}
FIRST_CACHE_DIR=${FIRST_CACHE_DIR:-}
FIRST_STEADY=${FIRST_STEADY:-10}
PARTS=${PARTS:-coverage first}
COVERAGE=${COVERAGE:-flashinfer:0 flashinfer:3 triton:0 triton:3}
LIMITS="--max-num-seqs 16 --max-num-batched-tokens 1024 --max-model-len 1024"
T0=$(date +%s)
stage() { echo "=== $1 (+$(( $(date +%s) - T0 )) s, $(date +%T))"; }

stage "checkpoint llama-3.2-1b + tokenizer -> $CKPT"
python3 -c "from pathlib import Path; from warmgate.server.devtools.checkpoint import write_checkpoint
print(write_checkpoint('llama-3.2-1b', Path('$CKPT'), 'cuda', 'bfloat16', tokenizer=True))" \
  2>&1 | tee "$OUT/$CARD-checkpoint.txt"

coverage() {  # coverage BACKEND K
  local name="coverage-$1-k$2" caches rc
  caches=$(mktemp -d /tmp/warmgate-caches.XXXX)
  TRITON_CACHE_DIR=$caches/triton TORCHINDUCTOR_CACHE_DIR=$caches/inductor timeout 300 \
    python3 bench/warm.py coverage --device cuda --model "$CKPT" --attention-backend "$1" \
    --num-speculative-steps "$2" $LIMITS --batches 2000 >"$OUT/$CARD-$name.txt" 2>"$OUT/$CARD-$name.err"
  rc=$?
  echo "$name: exit $rc after +$(( $(date +%s) - T0 )) s; $(grep -E '^(structured rows|structured_failures|cuda_graph_misses_after_ready|compiles_after_ready)' "$OUT/$CARD-$name.txt" | tr '\n' ' ')"
}
lane() {  # lane BACKEND: that backend's coverage runs, in order
  local entry
  for entry in $COVERAGE; do
    if [ "${entry%%:*}" = "$1" ]; then coverage "$1" "${entry##*:}"; fi
  done
}
if [[ " $PARTS " == *" coverage "* ]]; then
  stage "coverage ($COVERAGE): the flashinfer lane in the background, triton's in the foreground"
  lane flashinfer &
  fi_lane=$!
  lane triton
  wait "$fi_lane"
fi

if [[ " $PARTS " == *" first "* ]]; then
  for b in $FIRST_BACKENDS; do
    stage "first request per option, $b, k=$FIRST_K, $FIRST_SERVERS servers${FIRST_CACHE_DIR:+, --cache-dir $FIRST_CACHE_DIR/$b}"
    timeout $(( 60 + 120 * FIRST_SERVERS )) python3 bench/warm.py first-request --mode options \
      --model-dir "$CKPT" --servers "$FIRST_SERVERS" --steady "$FIRST_STEADY" --shuffle \
      --server-args "--device cuda --attention-backend $b --num-speculative-steps $FIRST_K $LIMITS${FIRST_CACHE_DIR:+ --cache-dir $FIRST_CACHE_DIR/$b}" \
      --out "$OUT/$CARD-first-options-$b.json" >"$OUT/$CARD-first-options-$b.txt" 2>"$OUT/$CARD-first-options-$b.err"
    echo "exit $?"
    cat "$OUT/$CARD-first-options-$b.txt"
    tail -3 "$OUT/$CARD-first-options-$b.err"
  done
fi
stage done
