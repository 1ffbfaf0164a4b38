#!/usr/bin/env bash
# Set up tunehub, start the service on the embedded defaults (SQLite in $TUNEHUB_HOME, local CPU
# worker), tune a small demo GEMM through the API, print its best in one line, and keep serving.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export TUNEHUB_HOME="${TUNEHUB_HOME:-$HOME/.tunehub}"
port="${TUNEHUB_PORT:-8000}"
url="http://127.0.0.1:${port}"
# Writes need an API key: make one for this demo (it is stored hashed, so it is shown only now).
key=$(.venv/bin/tunehub keys create --scope write --name demo)
echo "API key for this demo (send it as X-API-Key; the dashboard asks for it): $key"
.venv/bin/tunehub serve --port "$port" &
server=$!
trap 'kill $server 2>/dev/null; wait $server 2>/dev/null' EXIT INT TERM
for _ in $(seq 1 120); do
  curl -fsS "$url/healthz" >/dev/null 2>&1 && break
  kill -0 "$server" 2>/dev/null || { echo "tunehub serve exited; see its log above" >&2; exit 1; }
  sleep 0.5
done
echo "submitting a demo job: matmul 256x256x256 float32, 24 trials"
job=$(curl -fsS -X POST "$url/api/v1/jobs" -H "X-API-Key: $key" -H 'content-type: application/json' -d '{
  "workload": {"op": "matmul", "m": 256, "n": 256, "k": 256, "dtype": "float32"},
  "budget": {"max_trials": 24, "max_secs": 180}}')
id=$(printf '%s' "$job" | .venv/bin/python -c 'import json,sys; print(json.load(sys.stdin)["id"])')
echo "job $id queued: watch it on $url/jobs/$id"
while :; do
  state=$(curl -fsS "$url/api/v1/jobs/$id" | .venv/bin/python -c 'import json,sys; j=json.load(sys.stdin); print(j["state"], j["trials_done"], sep=" ")')
  echo "  job $id: ${state% *} (${state#* } trials)"
  case "${state% *}" in succeeded|failed|cancelled) break ;; esac
  sleep 3
done
echo "dashboard: $url/  (Ctrl-C stops the service; give it the key above to cancel or submit)"
# The last line: the job's one best (the schedule the lookup serves, with its speedup over the
# library) and how a compiler looks it up.
lookup="curl '$url/api/v1/schedules/best?op=matmul&m=256&n=256&k=256&dtype=float32'"
curl -fsS "$url/api/v1/jobs/$id" | .venv/bin/python -c '
import json, sys
from tunehub.tuner.best import best_line
job = json.load(sys.stdin)
line = best_line(job["best"], job["workload_label"], job["target_label"])
print(f"{line}; lookup: {sys.argv[1]}")
' "$lookup"
wait $server
