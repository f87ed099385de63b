#!/usr/bin/env bash
# The MoE, FP8 and --deterministic evidence on the GPU, in runs of under ten minutes
# (PARTS picks what runs; keep a run under 600 s: a few entries per run):
#   served       bench/warm.py served per SERVED entry (model:backend:k): a fresh server,
#                first/steady TTFT, then REQUESTS random Generate requests with every sampling
#                option; compiles, autotunes and graph misses after ready (goal 0)
#   decode       bench/serve.py decode-latency per DECODE entry (model:backends): batch 1/8/64
#                against the HBM roofline of the active parameters (DECODE_ARGS: more of its
#                flags, e.g. --grouped-moe for both MoE paths side by side)
#   ready        bench/start.py time-to-ready per READY entry (model:backend): a checkpoint
#                written on the machine (the FP8 30B is ~31 GB of the 64 GB disk), a cold and
#                RUNS warm starts: warm_over_cold, cold_over_longest_compile
#   determinism  bench/serve.py determinism per DET entry (model:backend:k): PROBES probes alone
#                and inside BUSY random requests, bit for bit, and the cost against the default
#   OUT=/tmp/out PARTS=served SERVED="qwen3-30b-a3b:triton:0 qwen3-30b-a3b:triton:3" \
#     bash bench/gpu_models.sh
# Every output lands in one tarball, $OUT/gpu-models.tgz; the summaries go to stdout.
set -uo pipefail
FINAL=${OUT:-/tmp/warmgate-out}
OUT=/tmp/gpu-models
mkdir -p "$OUT" "$FINAL"
trap 'tar czf "$FINAL/gpu-models.tgz" -C "$OUT" .' EXIT
source bench/lib/gpu_env.sh  # the wheels in .whl/ and PYTHONPATH
# One FlashInfer JIT cache for every part of the call: only the first user pays the cold JIT.
export FLASHINFER_WORKSPACE_BASE=${FLASHINFER_WORKSPACE_BASE:-/tmp/fi-base}
PARTS=${PARTS:-served}
DEVICE=${DEVICE:-cuda}  # DEVICE=cpu SERVED=tiny:torch:0 DET=tiny:torch:0: a CPU dry run
MODELS="qwen3-30b-a3b qwen3-30b-a3b-fp8 llama-3.1-8b-fp8"
all_served() { for m in $MODELS; do for b in triton flashinfer; do for k in 0 3; do
  echo "$m:$b:$k"; done; done; done; }
SERVED=${SERVED:-$(all_served)}
REQUESTS=${REQUESTS:-600}
DECODE=${DECODE:-qwen3-30b-a3b:triton,flashinfer qwen3-30b-a3b-fp8:triton llama-3.1-8b-fp8:triton,flashinfer}
READY=${READY:-llama-3.1-8b-fp8:triton qwen3-30b-a3b-fp8:triton}
RUNS=${RUNS:-2}
DET=${DET:-llama-3.2-1b:triton:0 llama-3.2-1b:triton:3 llama-3.2-1b:flashinfer:0 llama-3.1-8b:triton:0}
PROBES=${PROBES:-20}
BUSY=${BUSY:-600}
SHAPE="--max-num-seqs 64 --max-num-batched-tokens 4096 --max-model-len 2048"
git rev-parse HEAD >"$OUT/commit.txt" 2>/dev/null || true
T0=$(date +%s)
stage() { echo "=== $1 (+$(( $(date +%s) - T0 )) s, $(date +%T))"; }

for part in $PARTS; do case $part in
served)
  for entry in $SERVED; do
    IFS=: read -r model backend k <<<"$entry"
    name="served-$model-$backend-k$k"
    stage "$name"
    timeout "${SERVED_TIMEOUT:-420}" python3 bench/warm.py served --requests "$REQUESTS" \
      --server-args "--model $model --device $DEVICE --attention-backend $backend --num-speculative-steps $k $SHAPE" \
      >"$OUT/$CARD-$name.txt" 2>"$OUT/$CARD-$name.err"
    echo "exit $?; $(grep -E '^(ttft|after_ready)' "$OUT/$CARD-$name.txt" | tr '\n' ' ')"
  done ;;
decode)
  for entry in $DECODE; do
    stage "decode latency: $entry"
    timeout "${DECODE_TIMEOUT:-300}" python3 bench/serve.py decode-latency --model "${entry%%:*}" \
      --backends "${entry#*:}" ${DECODE_ARGS:-} 2>"$OUT/$CARD-decode-${entry%%:*}.err" | tee -a "$OUT/$CARD-decode-latency.txt"
    tail -3 "$OUT/$CARD-decode-${entry%%:*}.err"
  done ;;
ready)
  for entry in $READY; do
    IFS=: read -r model backend <<<"$entry"
    name="time-to-ready-$model-$backend"
    stage "$name, $RUNS warm runs"
    timeout "${READY_TIMEOUT:-560}" python3 bench/start.py time-to-ready --write-checkpoint "$model" \
      --model-dir "/tmp/ckpt-$model" --attention-backend "$backend" --runs "$RUNS" \
      >"$OUT/$CARD-$name.txt" 2>"$OUT/$CARD-$name.err"
    echo "exit $?; $(grep -E '^(ready_over_floor|warm_over_cold|cold_over_longest_compile)' \
      "$OUT/$CARD-$name.txt" | tr '\n' ' ')"
    rm -rf "/tmp/ckpt-$model"  # the disk holds one large checkpoint at a time
  done ;;
determinism)
  for entry in $DET; do
    IFS=: read -r model backend k <<<"$entry"
    name="determinism-$model-$backend-k$k"
    stage "$name"
    timeout "${DET_TIMEOUT:-420}" python3 bench/serve.py determinism --probes "$PROBES" \
      --busy-requests "$BUSY" --streams 64 --model "$model" --device "$DEVICE" \
      --attention-backend "$backend" --num-speculative-steps "$k" \
      >"$OUT/$CARD-$name.txt" 2>"$OUT/$CARD-$name.err"
    echo "exit $?"; tail -4 "$OUT/$CARD-$name.txt"
  done ;;
*) echo "unknown part: $part (served, decode, ready or determinism)"; exit 2 ;;
esac; done
stage done
