#!/usr/bin/env bash
# One GPU machine's steps for the triton.gemm issue, run from the repo root on the lent machine:
#   bash benchmarks/gpu_run.sh smoke service        # a quick tune, the service end to end
#   bash benchmarks/gpu_run.sh bench "4096x4096x4096 16x4096x4096" [trials]
#   bash benchmarks/gpu_run.sh dataset "square_4096 odd_1000x3000x777" [deadline secs]
# Wheels the image lacks travel in .whl/ (see ../shared/tools/device-wheels.sh); results go to
# $OUT (logs and JSON), which the device tool brings back.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-/tmp/out}"
mkdir -p "$OUT"
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH="/tmp/site:$PWD"
else
  export PYTHONPATH="$PWD"
fi
export PYTHONUNBUFFERED=1 TUNEHUB_COMMIT="${TUNEHUB_COMMIT:-}"

step_smoke() {
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.limit --format=csv
  python3 -c 'import torch, triton; print("torch", torch.__version__, "cuda", torch.version.cuda, "triton", triton.__version__, torch.cuda.get_device_name(0))'
  TUNEHUB_HOME=/tmp/th-smoke python3 -m tunehub.cli -v tune 2048 2048 2048 --dtype float16 \
    --b-layout col_major --device cuda:0 --trials 16 2>&1 | tail -25
  TUNEHUB_HOME=/tmp/th-smoke python3 -m tunehub.cli lookup 2048 2048 2048 --dtype float16 \
    --b-layout col_major --target "$(TUNEHUB_HOME=/tmp/th-smoke python3 -c '
from tunehub.db import SqlScheduleStore, database_url
s = SqlScheduleStore(database_url())
print(next(t.target_key for t in s.list_targets() if t.kind == "cuda"))')"
}

step_service() {
  bash benchmarks/gpu_service_demo.sh 2>&1 | tee "$OUT/service.log"
}

step_bench() {
  local cases=() trials="${2:-64}"
  for c in $1; do cases+=(--case "$c"); done
  python3 benchmarks/gpu_gemm.py "${cases[@]}" --trials "$trials" \
    --out "$OUT/gpu_gemm-$(date -u +%Y%m%dT%H%M%S).json" 2>&1 | tee -a "$OUT/bench.log" \
    | grep -v " INFO "
}

step_dataset() {
  local names=() deadline="${2:-420}"
  for w in $1; do names+=(--workload "$w"); done
  mkdir -p "$OUT/datasets"
  python3 benchmarks/collect_gpu_dataset.py "${names[@]}" --out "$OUT/datasets" \
    --deadline-secs "$deadline" 2>&1 | tee -a "$OUT/dataset.log" | grep -v " INFO "
}

case "${1:-}" in
  smoke|service) for s in "$@"; do "step_$s"; done ;;
  bench) step_bench "$2" "${3:-64}" ;;
  dataset) step_dataset "$2" "${3:-420}" ;;
  *) sed -n 2,7p "$0"; exit 2 ;;
esac
