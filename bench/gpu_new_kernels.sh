#!/usr/bin/env bash
# The kernels that have run only in the Triton interpreter so far, on the GPU in one run of
# under ten minutes each, beside what they replace (PARTS picks what runs; keep a run under
# 600 s: "tests moe gemv qknorm" took 300 s on a fresh H100 with the tests cut at 240 s,
# "attention sampler invariant" 90 s):
#   tests      their CPU test files compiled for the GPU, and tests/gpu files that cover them
#   moe        bench/serve.py decode-latency, qwen3-30b-a3b on triton, the per-slot MoE path
#              beside the grouped GEMMs it replaces at <= 2 tokens (--grouped-moe; goal: batch 1
#              <= 2x the roofline of the active parameters)
#   gemv       bench/serve.py dense-gemv: cuBLAS against the Triton GEMV per projection shape
#              at 1-16 rows, as fractions of the card's bandwidth, and what the warmup picks
#   invariant  the batch-invariant matmul (--deterministic) with its K split, beside cuBLAS and
#              the unsplit kernel, bits checked
#   attention  --deterministic's fixed-split attention beside the default decode kernel and
#              the unsplit varlen kernel, bits checked
#   sampler    bench/lib/sampler_gpu.py: choose_tokens at 1-128 sampled rows over a 128,256
#              vocabulary, the default path beside --deterministic's old per-row loop and its
#              batched draw on the per-row softmax/cumsum kernels, bits checked
#   qknorm     bench/lib/qk_norm_rope_gpu.py: Qwen3's two per-head q/k RMSNorm launches a layer
#              against the norms inside the rope + KV-cache kernel, outputs compared
#   pdl        --pdl (programmatic dependent launch): tests/gpu/test_pdl_gpu.py (the same tokens
#              and logits, bit for bit, with and without it), then bench/serve.py decode-latency
#              of llama-3.1-8b on triton without and with it (--pdl both)
#   OUT=/tmp/out PARTS="gemv invariant attention" bash bench/gpu_new_kernels.sh
# Every output lands in one tarball, $OUT/gpu-new-kernels.tgz; the summaries go to stdout.
set -uo pipefail
FINAL=${OUT:-/tmp/warmgate-out}
OUT=/tmp/gpu-new-kernels
mkdir -p "$OUT" "$FINAL"
trap 'tar czf "$FINAL/gpu-new-kernels.tgz" -C "$OUT" .' EXIT
source bench/lib/gpu_env.sh  # the wheels in .whl/ and PYTHONPATH
echo "commit ${COMMIT:-$(git rev-parse HEAD 2>/dev/null)}" >"$OUT/commit.txt"
PARTS=${PARTS:-tests moe}
TESTS=${TESTS:-tests/test_moe_gemv.py tests/test_moe_router.py tests/test_moe_routing_kernels.py tests/test_triton_kernels.py tests/test_batch_invariant_split_k.py \
tests/test_fixed_split_attention.py tests/test_fixed_split_backend.py tests/test_dense_gemv.py \
tests/test_row_reductions.py tests/test_sampler_invariant_draws.py \
tests/test_rope_qk_norm_kernel.py tests/gpu/test_rope_cache_gpu.py tests/gpu/test_moe_gpu.py tests/gpu/test_dense_gemv_gpu.py tests/gpu/test_deterministic_gpu.py}
T0=$(date +%s)
stage() { echo "=== $1 (+$(( $(date +%s) - T0 )) s, $(date +%T))"; }
# name, timeout, command...: its stdout to $OUT/$CARD-name.txt and the screen, stderr's tail
bench() {
  local name=$1 limit=$2; shift 2
  stage "$name: $*"
  timeout "$limit" "$@" 2>"$OUT/$CARD-$name.err" | tee "$OUT/$CARD-$name.txt"
  tail -3 "$OUT/$CARD-$name.err"
}

for part in $PARTS; do case $part in
tests)
  stage "tests: $TESTS"
  # shellcheck disable=SC2086  # TESTS is a list of paths
  # -v prints each test's outcome as it ends, so a run the timeout cuts still names its
  # failures (the -rfE summary comes only at the end); 420 s leaves room for a fresh
  # machine's FlashInfer JIT (about 90 s) inside the rope-cache tests.
  timeout "${TEST_TIMEOUT:-420}" python3 -m pytest -v $TESTS -p no:cacheprovider -rfE 2>&1 \
    | tee "$OUT/$CARD-tests-new-kernels.txt" \
    | grep -E " (FAILED|ERROR)|^(FAILED|ERROR)|passed|failed" | tail -30
  [ "${PIPESTATUS[0]}" = 124 ] && echo "tests: cut by the ${TEST_TIMEOUT:-420} s timeout" ;;
moe)
  bench decode-latency-moe-paths 280 python3 bench/serve.py decode-latency \
    --model qwen3-30b-a3b --backends triton --grouped-moe ;;
gemv)
  bench dense-gemv 120 python3 bench/serve.py dense-gemv ;;
invariant)
  for model in llama-3.2-1b llama-3.1-8b; do
    bench "invariant-matmul-$model" 90 python3 bench/lib/invariant_matmul_gpu.py --model "$model"
  done ;;
attention)
  bench fixed-split-attention-llama-3.2-1b 150 python3 bench/lib/fixed_split_attention_gpu.py \
    --model llama-3.2-1b --capacity 2048
  bench fixed-split-attention-llama-3.1-8b 150 python3 bench/lib/fixed_split_attention_gpu.py \
    --model llama-3.1-8b --capacity 8192 ;;
sampler)
  bench sampler-draws 90 python3 bench/lib/sampler_gpu.py ;;
qknorm)
  bench qk-norm-rope 90 python3 bench/lib/qk_norm_rope_gpu.py ;;
pdl)
  bench pdl-tests 240 python3 -m pytest -v tests/gpu/test_pdl_gpu.py tests/test_pdl_ptx.py \
    -p no:cacheprovider -rfE
  bench decode-latency-pdl-llama-3.1-8b 330 python3 bench/serve.py decode-latency \
    --model llama-3.1-8b --backends triton --pdl both ;;
*) echo "unknown part: $part (tests, moe, gemv, invariant, attention, sampler, qknorm or pdl)"
   exit 2 ;;
esac; done
stage done
