#!/usr/bin/env bash
# The first request after ready on FlashInfer at configurations the other benches do not use,
# in one run of under ten minutes. PARTS picks what runs (default: all of "tests fixed
# probe long"; "configs" is its own call):
#   tests    the GPU tests that cover ragged graphs on both backends (and FlashInfer's JIT)
#   fixed    first/steady TTFT at llama-3.2-1b, k=0, 48 seqs, budget 4096, length 8192, a
#            300-token prompt: FlashInfer (ragged graphs), triton, FlashInfer without ragged
#            graphs (its prefill wrapper eagerly), fresh servers each (FIXED_RUNS)
#   probe    the eager FlashInfer path's first 1x300 prefill vs the next, in one process, and
#            the CUDA segments the first steps allocate
#   long     a 2000-token prompt on FlashInfer with and without ragged graphs
#   configs  CONFIGS random server configurations per backend, CONFIGS_TIMEOUT s each (bench/warm.py first-request
#            --mode configs)
#   breakdown  the first request's TTFT split into the serving loop's parts against the steady
#            ones (bench/warm.py first-request --mode breakdown), at the fixed configuration
#   breakdown-k3  the same at the random configurations' worst, k=3 (the open question)
#   OUT=/tmp/out PARTS="tests fixed" bash bench/gpu_first_request.sh
# Every output lands in one tarball, $OUT/gpu-first-request.tgz (one file to copy back from the
# GPU machine); the summaries go to stdout.
set -uo pipefail
FINAL=${OUT:-/tmp/warmgate-out}
OUT=/tmp/gpu-first-request
mkdir -p "$OUT" "$FINAL"
# The tarball is written however the call ends (a part's timeout, the call's own limit).
trap 'tar czf "$FINAL/gpu-first-request.tgz" -C "$OUT" .' EXIT
source bench/lib/gpu_env.sh  # the wheels in .whl/ and PYTHONPATH
PARTS=${PARTS:-tests fixed probe long}
FIXED_RUNS=${FIXED_RUNS:-3}
TRITON_RUNS=${TRITON_RUNS:-$FIXED_RUNS}
EAGER_RUNS=${EAGER_RUNS:-2}
CONFIGS=${CONFIGS:-12}
MODEL=${MODEL:-llama-3.2-1b}
SHAPE="--max-num-seqs 48 --max-num-batched-tokens 4096 --max-model-len 8192"
git rev-parse HEAD >"$OUT/commit.txt" 2>/dev/null || true
T0=$(date +%s)
stage() { echo "=== $1 (+$(( $(date +%s) - T0 )) s, $(date +%T))"; }
fr() { python3 bench/warm.py first-request "$@"; }
configs() {  # configs NAME BACKEND RUNS "CONFIG" [server args]
  fr --mode configs --model "$MODEL" --device cuda --backends "$2" --configs "$3" \
    --config "$4" "--server-args=${5:-}" --vocab-size 128000 --repeats 15 --gap-s 0.5 \
    --json "$OUT/$1.json" 2>"$OUT/$1.err" | tee "$OUT/$1.txt" | tail -4
}

for part in $PARTS; do case $part in
tests)
  stage "tests/gpu: ragged graphs and serving on both backends"
  timeout 300 python3 -m pytest -q -x tests/gpu/test_backends_gpu.py tests/gpu/test_serving_gpu.py \
    2>&1 | tee "$OUT/gpu-tests.txt" | tail -5 ;;
fixed)
  stage "fixed configuration, $FIXED_RUNS fresh servers per arm"
  configs ${CARD}-first-request-fixed-flashinfer flashinfer "$FIXED_RUNS" "0 48 4096 8192 16 300"
  configs ${CARD}-first-request-fixed-triton triton "$TRITON_RUNS" "0 48 4096 8192 16 300"
  configs ${CARD}-first-request-fixed-flashinfer-eager flashinfer "$EAGER_RUNS" \
    "0 48 4096 8192 16 300" "--no-ragged-cuda-graphs" ;;
probe)
  stage "probe: the eager FlashInfer path's first 1x300 prefill"
  timeout 120 python3 bench/warm.py first-request --mode probe --device cuda --model "$MODEL" \
    --attention-backend flashinfer --no-ragged-cuda-graphs $SHAPE --num-blocks 8192 \
    --prefill-shape 1x300 2>&1 | grep -v "^\(INFO\|DEBUG\)" | tee "$OUT/probe-flashinfer-eager.txt" | tail -20
  timeout 120 python3 bench/warm.py first-request --mode probe --device cuda --model "$MODEL" \
    --attention-backend flashinfer --no-ragged-cuda-graphs $SHAPE --num-blocks 8192 \
    --prefill-shape 1x300 --trace-segments 2>&1 | grep -v "^\(INFO\|DEBUG\)" \
    >"$OUT/probe-flashinfer-eager-segments.txt"; tail -30 "$OUT/probe-flashinfer-eager-segments.txt" ;;
long)
  stage "a 2000-token prompt: FlashInfer with and without ragged graphs"
  configs ${CARD}-long-prompt-flashinfer flashinfer 1 "0 48 4096 8192 16 2000"
  configs ${CARD}-long-prompt-flashinfer-eager flashinfer 1 "0 48 4096 8192 16 2000" \
    "--no-ragged-cuda-graphs"
  configs ${CARD}-long-prompt-triton triton 1 "0 48 4096 8192 16 2000" ;;
configs)
  for b in flashinfer triton; do
    stage "$CONFIGS random configurations on $b"
    timeout "${CONFIGS_TIMEOUT:-280}" python3 bench/warm.py first-request --mode configs --model "$MODEL" --device cuda \
      --backends "$b" --configs "$CONFIGS" --seed 1 --vocab-size 128000 --repeats 8 --gap-s 0.3 \
      --json "$OUT/${CARD}-first-request-configs-$b.json" 2>"$OUT/configs-$b.err" \
      | tee "$OUT/${CARD}-first-request-configs-$b.txt" | tail -$((CONFIGS + 3))
  done ;;
breakdown)
  for arm in "flashinfer" "flashinfer --no-ragged-cuda-graphs" "triton"; do
    stage "breakdown: $arm"
    timeout 120 python3 bench/warm.py first-request --mode breakdown --gap-s 0.5 --repeats 20 \
      --prompt-len 300 --model "$MODEL" --device cuda --attention-backend $arm $SHAPE \
      --log-level WARNING 2>&1 | tee -a "$OUT/${CARD}-first-request-breakdown.txt" | tail -4
  done ;;
breakdown-k3)
  # The random configurations' worst (k=3, 69 seqs, budget 6603, length 12665, a 392-token
  # prompt), split into the serving loop's parts: where a k>0 first request's time goes.
  for b in ${BREAKDOWN_BACKENDS:-flashinfer triton}; do
    stage "breakdown at k=3: $b"
    timeout 150 python3 bench/warm.py first-request --mode breakdown --gap-s 0.3 --repeats 30 \
      --prompt-len 392 --model "$MODEL" --device cuda --attention-backend $b \
      --num-speculative-steps 3 --max-num-seqs 69 --max-num-batched-tokens 6603 \
      --max-model-len 12665 --log-level WARNING 2>&1 \
      | tee -a "$OUT/${CARD}-first-request-breakdown-k3.txt" | tail -4
  done ;;
*) echo "unknown part: $part"; exit 2 ;;
esac; done
stage done
