#!/usr/bin/env bash
# Everything the GPU machine is for, in one run (caches die with the machine, so one run fills
# and reuses them): install the wheels in .whl/ (docs/pending-gpu-runs.md), then each stage with
# its own time limit, logs to $OUT.
#   STAGES="sanity tests warmup bench" bash bench/gpu_session.sh   (also: spec, cache, coverage,
#   first, first-nosweep, probe, segments, breakdown, profile, touch, serve, serve-nosweep)
set -uo pipefail
OUT=${OUT:-/tmp/warmgate-out}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl >"$OUT/pip.log" 2>&1 || { cat "$OUT/pip.log"; exit 1; }
export PYTHONPATH=/tmp/site:$PWD/client:$PWD/server:$PWD PYTHONUNBUFFERED=1
# Caches in known, empty places: the first FlashInfer warmup below is cold by construction.
export FLASHINFER_WORKSPACE_BASE=/tmp/fi-base TRITON_CACHE_DIR=/tmp/triton-cache
STAGES=${STAGES:-sanity tests warmup bench}
stage() { echo "=== $1 ($(date +%T))"; }

for s in $STAGES; do case $s in
sanity)
  stage sanity
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm --format=csv | tee "$OUT/gpu.txt"
  python3 -c "import torch, triton, flashinfer, grpc; print(torch.__version__, triton.__version__, flashinfer.__version__, grpc.__version__)" ;;
tests)
  stage tests
  timeout ${TEST_TIMEOUT:-240} python3 -m pytest -q -x tests/gpu -p no:cacheprovider -s 2>&1 | tee "$OUT/tests_gpu.log" | grep -E "relative|passed|failed|error|Error" | tail -30 ;;
warmup|warmup-fi|warmup-other)
  backends="flashinfer flashinfer triton torch"
  [ "$s" = warmup-fi ] && backends="flashinfer flashinfer"
  [ "$s" = warmup-other ] && backends="triton torch"
  for b in $backends; do
    stage "warmup llama-3.2-1b $b"
    timeout 300 python3 -m warmgate.server.run_warmup --model llama-3.2-1b --attention-backend $b \
      --max-num-seqs 64 --max-num-batched-tokens 2048 --max-model-len 2048 2>"$OUT/warmup_$b.err" \
      | tee -a "$OUT/warmup_tables.txt"
    tail -3 "$OUT/warmup_$b.err"
  done ;;
spec)
  stage "warmup llama-3.2-1b flashinfer k=3"
  timeout 300 python3 -m warmgate.server.run_warmup --model llama-3.2-1b --attention-backend flashinfer \
    --num-speculative-steps 3 --max-num-seqs 64 --max-num-batched-tokens 2048 --max-model-len 2048 \
    2>"$OUT/warmup_spec.err" | tee -a "$OUT/warmup_tables.txt" ;;
bench)
  stage "bench decode latency"
  timeout 240 python3 bench/serve.py decode-latency --steps 20 --json "$OUT/decode_latency.json" 2>"$OUT/decode.err" \
    | tee "$OUT/decode_latency.txt"; tail -5 "$OUT/decode.err"
  stage "bench kernels"
  timeout 90 python3 bench/serve.py kernels 2>&1 | tee "$OUT/kernels_gpu.txt" | tail -20 ;;
cache)
  # Cold vs warm --warmup-only --cache-dir; later stages reuse its FlashInfer JIT.
  stage "cache cold vs warm"
  timeout 260 bash bench/cache_cold_warm.sh 2>&1 | tail -20
  entry=$(ls -d /tmp/warmgate-cache.*/*/flashinfer 2>/dev/null | head -1)
  [ -n "$entry" ] && export FLASHINFER_WORKSPACE_BASE=$entry ;;
coverage)
  # compiles_after_ready and cuda_graph_misses_after_ready must be 0 for each backend, plain
  # and speculative. Entries are backend:k, or model:backend:k for another preset.
  for entry in ${COVERAGE:-flashinfer:0 triton:3 flashinfer:3 triton:0}; do
    IFS=: read -r -a f <<<"$entry"
    if [ ${#f[@]} -eq 3 ]; then m=${f[0]} b=${f[1]} k=${f[2]}; else m=llama-3.2-1b b=${f[0]} k=${f[1]}; fi
    stage "coverage $m $b k=$k"
    timeout 150 python3 bench/warm.py coverage --device cuda --model "$m" --attention-backend "$b" \
      --num-speculative-steps "$k" --max-num-seqs 16 --max-num-batched-tokens 1024 \
      --max-model-len 1024 --batches 2000 2>"$OUT/coverage_${m}_${b}_k$k.err" \
      | tee "$OUT/coverage_${m}_${b}_k$k.txt" | tail -6
  done ;;
first)
  # First batch after ready over the steady median, per batch class, warmup on vs off.
  stage "first batch llama-3.2-1b ${FIRST_BACKEND:-triton}"
  timeout ${FIRST_TIMEOUT:-240} python3 bench/warm.py first-request --mode batch --device cuda --model llama-3.2-1b \
    --attention-backend ${FIRST_BACKEND:-triton} --max-num-seqs 16 --max-num-batched-tokens 1024 \
    --max-model-len 1024 --trials ${FIRST_TRIALS:-3} --gap-s ${FIRST_GAP:-0.1} \
    ${FIRST_CLASSES:+--classes "$FIRST_CLASSES"} ${FIRST_SKIP_OFF:+--skip-off} \
    2>"$OUT/first_batch.err" | tee "$OUT/first_batch.txt" | tail -14 ;;
profile)
  # Host time per function, first batch against steady steps, and GPU busy time per step.
  for k in 0 3; do
    stage "step profile llama-3.2-1b triton k=$k"
    timeout 150 python3 bench/warm.py first-request --mode profile --device cuda --model llama-3.2-1b \
      --attention-backend triton --max-num-seqs 16 --max-num-batched-tokens 1024 \
      --max-model-len 1024 --num-speculative-steps $k \
      2>>"$OUT/step_profile.err" | tee -a "$OUT/step_profile.txt" | grep -E "first|busy"
  done ;;
first-nosweep)
  # The same without the compile phase's dense GEMM sweep: what the sweep buys.
  stage "first batch llama-3.2-1b ${FIRST_BACKEND:-triton} --no-shape-sweeps"
  timeout ${FIRST_TIMEOUT:-240} python3 bench/warm.py first-request --mode batch --device cuda --model llama-3.2-1b \
    --attention-backend ${FIRST_BACKEND:-triton} --max-num-seqs 16 --max-num-batched-tokens 1024 \
    --max-model-len 1024 --no-shape-sweeps 2>"$OUT/first_batch_nosweep.err" \
    | tee "$OUT/first_batch_nosweep.txt" | tail -14 ;;
probe)
  # Is a first step after ready slow for being first, or for the idle / other work before it?
  for a in "--first prefill" "--first decode --num-speculative-steps 3"; do
    stage "first probe llama-3.2-1b triton $a ${CUDA_MODULE_LOADING:+(CUDA_MODULE_LOADING=$CUDA_MODULE_LOADING)}"
    timeout 120 python3 bench/warm.py first-request --mode probe --device cuda --model llama-3.2-1b \
      --attention-backend triton --max-num-seqs 16 --max-num-batched-tokens 1024 \
      --max-model-len 1024 $a 2>>"$OUT/first_probe.err" | tee -a "$OUT/first_probe.txt"
  done ;;
segments)
  # Which allocations of the first steps after ready need new CUDA segments (cudaMalloc).
  for a in "--first prefill" "--first decode --num-speculative-steps 3"; do
    stage "segments llama-3.2-1b triton $a"
    timeout 120 python3 bench/warm.py first-request --mode probe --device cuda --model llama-3.2-1b \
      --attention-backend triton --max-num-seqs 16 --max-num-batched-tokens 1024 \
      --max-model-len 1024 --trace-segments $a 2>>"$OUT/segments.err" | tee -a "$OUT/segments.txt"
  done ;;
breakdown)
  # Where the first Generate's time to first token goes, against steady requests.
  for i in $(seq ${BREAKDOWN_TRIALS:-3}); do
    stage "ttft breakdown llama-3.2-1b triton #$i"
    timeout 120 python3 bench/warm.py first-request --mode breakdown --model llama-3.2-1b --device cuda \
      --attention-backend triton --max-num-seqs 64 --max-num-batched-tokens 2048 \
      --max-model-len 2048 --num-speculative-steps 3 2>>"$OUT/breakdown.err" | tee -a "$OUT/breakdown.txt"
  done ;;
touch)
  # Where a first batch's extra time goes after warmup (cuBLAS per-shape state, host ops).
  stage "first touch llama-3.2-1b triton"
  timeout 120 python3 bench/warm.py first-request --mode touch --device cuda --model llama-3.2-1b \
    --attention-backend triton --max-num-seqs 16 --max-num-batched-tokens 1024 \
    --max-model-len 1024 --no-shape-sweeps 2>"$OUT/first_touch.err" \
    | grep -v USDT | tee "$OUT/first_touch.txt" ;;
serve)
  # Generate's first TTFT after ready / steady median (warmup on, off) and 64-stream
  # throughput without and with speculative decoding, on fresh server processes.
  stage "generate ttft + throughput llama-3.2-1b ${SERVE_BACKEND:-triton}"
  timeout ${SERVE_TIMEOUT:-330} python3 bench/warm.py first-request --mode ttft --server-args "--model llama-3.2-1b \
    --device cuda --attention-backend ${SERVE_BACKEND:-triton} --max-num-seqs 64 \
    --max-num-batched-tokens 2048 --max-model-len 2048" --prompt-len 128 --max-tokens 16 \
    --repeats 20 --trials ${SERVE_TRIALS:-3} --off-trials ${SERVE_OFF_TRIALS:-${SERVE_TRIALS:-3}} --streams 64 --num-speculative-steps 3 --output-len fixed:128 \
    ${SERVE_SKIP_THROUGHPUT:+--skip-throughput} --out "$OUT/ttft_first.json" 2>"$OUT/ttft_first.err" | tee "$OUT/ttft_first.txt"
  tail -5 "$OUT/ttft_first.err" ;;
serve-nosweep)
  # TTFT only, without the compile phase's dense GEMM sweep: what the sweep buys a first request.
  stage "generate ttft llama-3.2-1b ${SERVE_BACKEND:-triton} --no-shape-sweeps"
  timeout 200 python3 bench/warm.py first-request --mode ttft --server-args "--model llama-3.2-1b --device cuda \
    --attention-backend ${SERVE_BACKEND:-triton} --max-num-seqs 64 --max-num-batched-tokens 2048 \
    --max-model-len 2048 --no-shape-sweeps" --prompt-len 128 --max-tokens 16 --repeats 20 \
    --trials ${SERVE_TRIALS:-3} --num-speculative-steps 3 --skip-throughput --out "$OUT/ttft_nosweep.json" \
    2>"$OUT/ttft_nosweep.err" | tee "$OUT/ttft_nosweep.txt" ;;
esac; done
stage done
