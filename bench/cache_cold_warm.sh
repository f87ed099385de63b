#!/usr/bin/env bash
# Cold vs warm `warmgate-server --warmup-only --cache-dir` with FlashInfer, on the GPU machine:
#   bash bench/cache_cold_warm.sh            (from the repo root; wheels as gpu_session.sh)
# Run 1 fills a fresh cache directory (every JIT cold), run 2 starts a new process on the same
# directory (a pod restart). Prints both totals, the ratio, and the cold run's FlashInfer phase:
# each module's build time, the longest one, and the wall time of the two-thread build.
# SEQUENTIAL=1 adds a third, cold run with WARMGATE_FLASHINFER_PARALLEL_JIT=0 to compare.
set -euo pipefail
MODEL=${MODEL:-llama-3.2-1b} DEVICE=${DEVICE:-cuda} DTYPE=${DTYPE:-bfloat16}
BACKEND=${BACKEND:-flashinfer}  # DEVICE=cpu DTYPE=float32 BACKEND=torch MODEL=tiny: a CPU dry run
OUT=${OUT:-/tmp/warmgate-out}
DIR=$(mktemp -d /tmp/warmgate-cache.XXXXXX)
mkdir -p "$OUT"
if [ "$DEVICE" != cpu ] && [ -d .whl ] && [ ! -d /tmp/site ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
    --target /tmp/site .whl/*.whl
fi
export PYTHONPATH=/tmp/site:$PWD/client:$PWD/server:$PWD PYTHONUNBUFFERED=1
# --cache-dir points these into its entry; set, they would be respected (and the run not cold).
unset TRITON_CACHE_DIR TORCHINDUCTOR_CACHE_DIR FLASHINFER_WORKSPACE_BASE
FLAGS=(--warmup-only --json --cache-dir "$DIR" --model "$MODEL" --device "$DEVICE" --dtype "$DTYPE"
       --attention-backend "$BACKEND" --max-num-seqs 64 --max-num-batched-tokens 4096
       --metrics-port -1)
run() {  # name, extra env...
  local name=$1; shift
  echo "=== $name ($(date +%T))" >&2
  env "$@" python3 -m warmgate.server.main "${FLAGS[@]}" >"$OUT/cache_$name.json" \
    2>"$OUT/cache_$name.log" || { tail -30 "$OUT/cache_$name.log"; exit 1; }
}
run cold
run warm
if [ "${SEQUENTIAL:-0}" = 1 ]; then
  FLAGS[3]=$(mktemp -d /tmp/warmgate-cache-seq.XXXXXX)
  run cold_sequential WARMGATE_FLASHINFER_PARALLEL_JIT=0
fi
python3 - "$OUT" <<'PY'
import json, pathlib, sys
out = pathlib.Path(sys.argv[1])
# The report is protobuf JSON (as `warmgate --json warmup`): durations "1.5s", int64 as
# strings, shapes values JSON text; flatten those back to numbers here.
def secs(d):
    return float(d.rstrip("s"))
def load(name):
    p = out / f"cache_{name}.json"
    if not p.exists():
        return None
    r = json.loads(p.read_text())
    r["total_duration_s"] = secs(r["total_duration"])
    for ph in r["phases"]:
        ph["duration_s"] = secs(ph["duration"])
        ph["shapes"] = {k: json.loads(v) for k, v in ph["shapes"].items()}
        ph["cache_hits"], ph["cache_misses"] = int(ph["cache_hits"]), int(ph["cache_misses"])
    return r
def fi(r):
    return next(p for p in r["phases"] if p["name"] == "flashinfer")
cold, warm, seq = load("cold"), load("warm"), load("cold_sequential")
print(f"{'run':18} {'entry':8} {'total_s':>9} {'flashinfer_s':>13} {'decode_s':>9} "
      f"{'prefill_s':>10} {'longest_s':>10} {'fi_wall_s':>10} parallel")
for name, r in (("cold", cold), ("warm", warm), ("cold_sequential", seq)):
    if r is None:
        continue
    f, s = fi(r), fi(r)["shapes"]
    print(f"{name:18} {r['compile_cache']['state']:8} {r['total_duration_s']:9.2f} "
          f"{f['duration_s']:13.2f} {s.get('decode_s', 0):9.2f} {s.get('prefill_s', 0):10.2f} "
          f"{s.get('longest_module_s', 0):10.2f} {s.get('wall_s', 0):10.2f} {s.get('parallel')}")
print(f"cold/warm total: {cold['total_duration_s'] / warm['total_duration_s']:.1f}x "
      f"({cold['total_duration_s']:.2f} s -> {warm['total_duration_s']:.2f} s)")
s = fi(cold)["shapes"]
if "wall_s" in s:
    print(f"cold FlashInfer: longest single module {s['longest_module_s']:.2f} s vs two-thread "
          f"wall {s['wall_s']:.2f} s (sum of modules {s['decode_s'] + s['prefill_s']:.2f} s)")
else:
    print("FlashInfer phase did not run:", fi(cold)["detail"])
print("per-phase cache hits (warm):",
      {p["name"]: (p["cache_hits"], p["cache_misses"]) for p in warm["phases"]
       if p["cache_hits"] or p["cache_misses"]})
PY
echo "cache entry: $(ls "$DIR")  (reports and logs in $OUT/cache_*)"
