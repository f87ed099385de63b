#!/usr/bin/env bash
# Where the server's host time goes while it serves: bench/serve.py throughput as a closed loop
# at STREAMS streams (SERVER_ARGS the server's flags), with py-spy sampling its engine process
# and its front from the engine's start to the bench's end, then bench/lib/pyspy_summary.py on
# the engine's samples under the serving loop (the warmup's are left out). py-spy comes with
# the wheels in .whl/ (/tmp/site/bin). NAME names the outputs: $OUT/<card>-NAME.txt (the
# bench's table, then the summary) and $OUT/<card>-NAME-logs/ (both raw profiles, gzipped).
#   NAME=profile-serving-llama-3.2-1b SERVER_ARGS="--model llama-3.2-1b --device cuda \
#     --attention-backend triton --max-num-seqs 128 --max-num-batched-tokens 8192 \
#     --max-model-len 1024" bash bench/gpu_profile_serving.sh
set -uo pipefail
OUT=${OUT:-/tmp/warmgate-out}
mkdir -p "$OUT"
source bench/lib/gpu_env.sh  # the carried wheels, PYTHONPATH and $CARD
SPY=${SPY:-/tmp/site/bin/py-spy}
command -v "$SPY" >/dev/null || SPY=py-spy
NAME=${NAME:-profile-serving}
FILE="$OUT/$CARD-$NAME.txt"
LOGS="$OUT/$CARD-$NAME-logs"
mkdir -p "$LOGS"
echo "commit ${COMMIT:-$(git rev-parse HEAD)}" | tee "$FILE"
timeout "${BENCH_TIMEOUT:-300}" python3 bench/serve.py throughput --streams "${STREAMS:-128}" \
  --prompt-len 512 --output-len 256 --requests-per-stream "${PER_STREAM:-5}" \
  --client-processes "${CLIENTS:-4}" --server-args "${SERVER_ARGS:?the server flags}" \
  >>"$FILE" 2>"$LOGS/bench.err" &
bench=$!
engine=""
for _ in $(seq 480); do  # the engine process starts with the server
  engine=$(pgrep -f "[w]armgate.server.engine_main" | head -1)
  [ -n "$engine" ] && break
  sleep 0.25
done
[ -n "$engine" ] || { echo "no engine process came up"; wait $bench; exit 1; }
front=$(ps -o ppid= -p "$engine" | tr -d ' ')
for role in engine front; do
  pid=$engine; [ $role = front ] && pid=$front
  "$SPY" record -p "$pid" -r "${RATE:-250}" -f raw -o "$LOGS/$role.raw" --nonblocking \
    -d 1000 >"$LOGS/$role.log" 2>&1 &
done
wait $bench
sleep 2
pkill -INT -f "[p]y-spy record"
sleep 3
python3 bench/lib/pyspy_summary.py "$LOGS/engine.raw" --top "${TOP:-30}" | tee -a "$FILE"
gzip -f "$LOGS"/*.raw
