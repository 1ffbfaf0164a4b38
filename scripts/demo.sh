#!/usr/bin/env bash
# Set up tunehub, start the service on the embedded defaults (SQLite in $TUNEHUB_HOME, local CPU
# worker), tune a small demo GEMM through the API, print its best in one line, and keep serving.
# The demo's own lines start with "demo:"; the setup's and the service's logs go to files it
# names.
set -euo pipefail
cd "$(dirname "$0")/.."
say() { echo "demo: $*"; }
export TUNEHUB_HOME="${TUNEHUB_HOME:-$HOME/.tunehub}"
port="${TUNEHUB_PORT:-8000}"
url="http://127.0.0.1:${port}"
mkdir -p "$TUNEHUB_HOME"
setup_log="$TUNEHUB_HOME/demo-setup.log"
log="$TUNEHUB_HOME/demo-serve.log"
say "setting up .venv (scripts/setup.sh; its log goes to $setup_log)"
if ! bash scripts/setup.sh >"$setup_log" 2>&1; then
  say "setup failed; the end of its log ($setup_log):" >&2
  tail -n 20 "$setup_log" >&2
  exit 1
fi
# Writes need an API key: make one for this demo (it is stored hashed, so it is shown only now).
key=$(.venv/bin/tunehub keys create --scope write --name demo 2>"$log") || { cat "$log" >&2; exit 1; }
say "API key for this demo (send it as X-API-Key; the dashboard asks for it): $key"
say "starting tunehub serve on $url; its log goes to $log"
.venv/bin/tunehub serve --port "$port" >>"$log" 2>&1 &
server=$!
trap 'kill $server 2>/dev/null; wait $server 2>/dev/null' EXIT INT TERM
for _ in $(seq 1 120); do
  curl -fsS "$url/healthz" >/dev/null 2>&1 && break
  if ! kill -0 "$server" 2>/dev/null; then
    say "tunehub serve exited; the end of its log ($log):" >&2
    tail -n 20 "$log" >&2
    exit 1
  fi
  sleep 0.5
done
job=$(curl -fsS -X POST "$url/api/v1/jobs" -H "X-API-Key: $key" -H 'content-type: application/json' -d '{
  "workload": {"op": "matmul", "m": 256, "n": 256, "k": 256, "dtype": "float32"},
  "budget": {"max_trials": 24, "max_secs": 180}}')
id=$(printf '%s' "$job" | .venv/bin/python -c 'import json,sys; print(json.load(sys.stdin)["id"])')
say "tuning matmul 256x256x256 float32, 24 trials, as job $id (on the dashboard: $url/jobs/$id)"
# Progress lines at most every 3 s, then the job's best in one line: the schedule the lookup
# serves, with its speedup over the library.
if ! .venv/bin/tunehub watch "$id" --url "$url" --every 3; then
  say "job $id did not succeed; the service's log: $log" >&2
  exit 1
fi
say "done in ${SECONDS} s; a compiler looks it up with:" \
  "curl '$url/api/v1/schedules/best?op=matmul&m=256&n=256&k=256&dtype=float32'"
say "dashboard: $url/ (serving until Ctrl-C; give it the key above to cancel or submit)"
wait $server
