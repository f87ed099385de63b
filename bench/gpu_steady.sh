#!/usr/bin/env bash
# The steady state on the GPU in one run: the GPU tests, where a decode step's GPU time
# goes, and served throughput side by side per arm. PARTS picks what runs (default all three):
#   tests       tests/gpu, every file (TESTS narrows it), no -x: every failure is listed
#   kernels     bench/serve.py step-kernels for each KERNEL_MODELS entry (model:backends)
#   kernelbench bench/serve.py kernels: the Triton decode kernel's split rules and tiles
#   decode      bench/serve.py decode-latency for each DECODE entry (model:backends; DECODE_ARGS:
#               more of its flags)
#   throughput  bench/serve.py throughput for each SERVE entry (model:backend:streams), once
#               per arm of ARMS (';'-separated extra server flags; "-" is the defaults), the
#               arms of one entry back to back so they are compared side by side;
#               PER_STREAM=R > 1 makes each round a closed loop of R requests a stream;
#               CLIENTS=P deals the streams over P client processes (a Python client reads
#               about 20,000 messages a second: bench/lib/client_processes.py)
#   OUT=/tmp/out PARTS="kernels" bash bench/gpu_steady.sh
# Every output lands in one tarball, $OUT/gpu-steady.tgz (one file to copy back from the GPU
# machine); the summaries go to stdout.
set -uo pipefail
FINAL=${OUT:-/tmp/warmgate-out}
OUT=/tmp/gpu-steady
mkdir -p "$OUT" "$FINAL"
trap 'tar czf "$FINAL/gpu-steady.tgz" -C "$OUT" .' EXIT
source bench/lib/gpu_env.sh  # the wheels in .whl/ and PYTHONPATH
# One FlashInfer JIT cache for every part of the call: only the first user pays the cold JIT.
export FLASHINFER_WORKSPACE_BASE=${FLASHINFER_WORKSPACE_BASE:-/tmp/fi-base}
PARTS=${PARTS:-tests kernels throughput}
TESTS=${TESTS:-tests/gpu}
KERNEL_MODELS=${KERNEL_MODELS:-llama-3.2-1b:triton,flashinfer llama-3.1-8b:flashinfer,triton}
DECODE=${DECODE:-llama-3.1-8b:torch,triton,flashinfer}
SERVE=${SERVE:-llama-3.2-1b:triton:1,128 llama-3.1-8b:flashinfer:1,64,128}
ARMS=${ARMS:--}
T0=$(date +%s)
stage() { echo "=== $1 (+$(( $(date +%s) - T0 )) s, $(date +%T))"; }

for part in $PARTS; do case $part in
tests)
  stage "tests: $TESTS"
  # shellcheck disable=SC2086  # TESTS is a list of paths
  timeout "${TEST_TIMEOUT:-420}" python3 -m pytest -q $TESTS -p no:cacheprovider -rfE 2>&1 \
    | tee "$OUT/$CARD-tests-gpu.txt" | grep -E "^(FAILED|ERROR)|passed|failed" | tail -30 ;;
kernels)
  for entry in $KERNEL_MODELS; do
    stage "step kernels: $entry"
    timeout "${KERNELS_TIMEOUT:-150}" python3 bench/serve.py step-kernels --model "${entry%%:*}" \
      --backends "${entry#*:}" 2>"$OUT/$CARD-step-kernels-${entry%%:*}.err" \
      | tee -a "$OUT/$CARD-step-kernels.txt"
    tail -3 "$OUT/$CARD-step-kernels-${entry%%:*}.err"
  done ;;
kernelbench)
  stage "decode attention kernel: split rules and tiles"
  timeout "${KERNELS_TIMEOUT:-150}" python3 bench/serve.py kernels 2>"$OUT/$CARD-kernels.err" \
    | tee "$OUT/$CARD-kernels.txt"
  tail -3 "$OUT/$CARD-kernels.err" ;;
decode)
  for entry in $DECODE; do
    stage "decode latency: $entry"
    timeout "${DECODE_TIMEOUT:-200}" python3 bench/serve.py decode-latency --model "${entry%%:*}" \
      --backends "${entry#*:}" ${DECODE_ARGS:-} 2>"$OUT/$CARD-decode-${entry%%:*}.err" | tee -a "$OUT/$CARD-decode-latency.txt"
    tail -3 "$OUT/$CARD-decode-${entry%%:*}.err"
  done ;;
throughput)
  for entry in $SERVE; do
    IFS=: read -r model backend streams <<<"$entry"
    IFS=';' read -r -a arms <<<"$ARMS"
    for arm in "${arms[@]}"; do
      extra=""; [ "$arm" != "-" ] && extra=$arm
      name="throughput-$model-$backend${extra:+-$(echo "$extra" | tr -d ' -' | cut -c1-40)}"
      stage "throughput $model $backend streams $streams ${extra:-(defaults)}"
      timeout "${SERVE_TIMEOUT:-240}" python3 bench/serve.py throughput --streams "$streams" \
        --prompt-len 512 --output-len 256 --rounds "${ROUNDS:-2}" \
        --requests-per-stream "${PER_STREAM:-1}" --client-processes "${CLIENTS:-1}" \
        --server-args "--model $model --attention-backend $backend --max-num-seqs 128 --max-num-batched-tokens 8192 --max-model-len 1024 $extra" \
        --json "$OUT/$CARD-$name.json" 2>"$OUT/$CARD-$name.err" | tee "$OUT/$CARD-$name.txt"
      tail -3 "$OUT/$CARD-$name.err"
    done
  done ;;
*) echo "unknown part: $part"; exit 2 ;;
esac; done
stage done
