#!/usr/bin/env bash
# An orchestrator step: before shifting traffic to a new revision, block until every pod of it
# has finished warmup, and stop the rollout if one fails.
#
#   deploy/examples/rollout-gate.sh NAMESPACE DEPLOYMENT [TIMEOUT_S] [-- SHIFT_COMMAND...]
#   deploy/examples/rollout-gate.sh warmgate warmgate 900 -- \
#     kubectl argo rollouts promote warmgate -n warmgate
#
# `warmgate wait` (the thin client, no torch: README.md, Install) exits 0 once the pod's
# health is SERVING, 1 as soon as its warmup FAILED (waiting longer will not help: abort now
# instead of sitting out the startupProbe's budget), 2 on timeout, 3 on an RPC error and 64
# on a bad command line (never read as a timeout). kubectl's
# `rollout status` would also wait for Ready, but cannot tell "compiling, give it time" from
# "failed, roll back", and does not apply to pods kept out of traffic (a canary).
#
# Inside the cluster (a CI runner or controller pod; label it warmgate.dev/orchestrator=true
# for the NetworkPolicy) each pod IP is dialled directly; elsewhere each pod is reached
# through `kubectl port-forward`.
set -euo pipefail

usage() { echo "usage: $0 NAMESPACE DEPLOYMENT [TIMEOUT_S] [-- SHIFT_COMMAND...]" >&2; exit 64; }
[[ $# -ge 2 ]] || usage
ns=$1 deploy=$2
shift 2
timeout_s=900
if [[ $# -gt 0 && $1 != "--" ]]; then timeout_s=$1; shift; fi
if [[ $# -gt 0 ]]; then [[ $1 == "--" ]] || usage; shift; fi
shift_cmd=("$@")

# The newest ReplicaSet of the Deployment is the revision being rolled out.
revision=$(kubectl -n "$ns" get deployment "$deploy" \
  -o jsonpath='{.metadata.annotations.deployment\.kubernetes\.io/revision}')
hash=$(kubectl -n "$ns" get replicasets -l app.kubernetes.io/name=warmgate \
  -o jsonpath="{range .items[?(@.metadata.annotations.deployment\.kubernetes\.io/revision=='$revision')]}{.metadata.labels.pod-template-hash}{end}")
[[ -n $hash ]] || { echo "no ReplicaSet for revision $revision of $deploy" >&2; exit 1; }

# Pods are created by the ReplicaSet over a few seconds; wait for them to exist and get an IP.
want=$(kubectl -n "$ns" get deployment "$deploy" -o jsonpath='{.spec.replicas}')
deadline=$((SECONDS + timeout_s))
while :; do
  mapfile -t pods < <(kubectl -n "$ns" get pods -l "pod-template-hash=$hash" \
    -o jsonpath='{range .items[?(@.status.podIP)]}{.metadata.name}{" "}{.status.podIP}{"\n"}{end}')
  [[ ${#pods[@]} -ge $want ]] && break
  (( SECONDS < deadline )) || { echo "timed out waiting for $want pods of revision $revision" >&2; exit 2; }
  sleep 2
done

gate_pod() {  # NAME IP -> warmgate wait's exit code
  local name=$1 ip=$2 left=$((deadline - SECONDS)) rc
  (( left > 0 )) || return 2
  if [[ -n ${KUBERNETES_SERVICE_HOST:-} ]]; then
    warmgate --target "$ip:50051" wait --timeout "$left"
    return
  fi
  local port=$((20000 + RANDOM % 20000))
  kubectl -n "$ns" port-forward "pod/$name" "$port:50051" >/dev/null &
  local pf=$!
  # warmgate wait retries while the forward comes up (UNAVAILABLE), so no sleep is needed.
  rc=0
  warmgate --target "127.0.0.1:$port" wait --timeout "$left" || rc=$?
  kill "$pf" 2>/dev/null || true
  wait "$pf" 2>/dev/null || true
  return "$rc"
}

for entry in "${pods[@]}"; do
  read -r name ip <<<"$entry"
  rc=0
  gate_pod "$name" "$ip" || rc=$?
  case $rc in
    0) echo "$name: warm" ;;
    1) echo "$name: warmup FAILED; not shifting traffic" >&2
       kubectl -n "$ns" logs "$name" --tail=20 >&2 || true
       exit 1 ;;
    2) echo "$name: still not warm after ${timeout_s}s; not shifting traffic" >&2; exit 2 ;;
    64) echo "$name: warmgate rejected its command line (a bug in this script)" >&2; exit 64 ;;
    *) echo "$name: warmgate exited $rc (RPC error); not shifting traffic" >&2; exit "$rc" ;;
  esac
done

echo "revision $revision of $ns/$deploy is warm (${#pods[@]} pods)"
if [[ ${#shift_cmd[@]} -gt 0 ]]; then
  "${shift_cmd[@]}"
else
  echo "no SHIFT_COMMAND given: shift traffic now (promote, patch weights, ...)"
fi
