#!/usr/bin/env bash
# The whole path on a GPU machine: `tunehub serve` finds the GPU and offers it as a target with its
# own worker; an HTTP job for that target is tuned by the GPU worker, its records land in the
# database, and a lookup answers from them. Prints every exchange.
set -uo pipefail
cd "$(dirname "$0")/.."
home=$(mktemp -d /tmp/tunehub-serve-XXXX)
port=8123
url="http://127.0.0.1:$port"
key=$(TUNEHUB_HOME="$home" python3 -m tunehub.cli keys create --scope write --name gpu-demo)
TUNEHUB_HOME="$home" TUNEHUB_GPUS=auto python3 -m tunehub.cli serve --port "$port" \
  > "$home/serve.log" 2>&1 &
server=$!
trap 'kill $server 2>/dev/null; wait $server 2>/dev/null' EXIT
for _ in $(seq 1 240); do
  curl -fsS "$url/healthz" >/dev/null 2>&1 && break
  kill -0 "$server" 2>/dev/null || { echo "serve exited:"; cat "$home/serve.log"; exit 1; }
  sleep 0.5
done
show() { python3 -c 'import json,sys; print(json.dumps(json.load(sys.stdin), indent=1))'; }
echo "== GET /healthz"; curl -fsS "$url/healthz" | show
echo "== GET /api/v1/targets"; curl -fsS "$url/api/v1/targets" | show
body='{"workload": {"m": 1024, "n": 1024, "k": 1024, "dtype": "float16", "b_layout": "col_major"},
       "target": "local-cuda:0", "template": "triton.gemm", "budget": {"max_trials": 12, "max_secs": 300}}'
echo "== POST /api/v1/jobs $body"
job=$(curl -fsS -X POST "$url/api/v1/jobs" -H "X-API-Key: $key" -H 'content-type: application/json' -d "$body")
echo "$job" | show
id=$(echo "$job" | python3 -c 'import json,sys; print(json.load(sys.stdin)["id"])')
for _ in $(seq 1 300); do
  state=$(curl -fsS "$url/api/v1/jobs/$id" | python3 -c 'import json,sys; j=json.load(sys.stdin); print(j["state"], j["trials_done"])')
  echo "job $id: $state"
  case "$state" in succeeded*|failed*|cancelled*) break ;; esac
  sleep 2
done
echo "== GET /api/v1/jobs/$id"; curl -fsS "$url/api/v1/jobs/$id" | show
echo "== GET /api/v1/jobs/$id/records (status, GFLOP/s, config)"
curl -fsS "$url/api/v1/jobs/$id/records" | python3 -c '
import json, sys
for r in json.load(sys.stdin)["items"]:
    print(r["trial"], r["status"], r["gflops"], r["config"], (r["error"] or "")[:120])'
echo "== GET /api/v1/jobs/$id/baselines"; curl -fsS "$url/api/v1/jobs/$id/baselines" | show
q="m=1024&n=1024&k=1024&dtype=float16&b_layout=col_major&target=local-cuda:0"
echo "== GET /api/v1/schedules/best?$q"; curl -fsS "$url/api/v1/schedules/best?$q" | show
echo "== the service's log (tail)"; tail -30 "$home/serve.log"
