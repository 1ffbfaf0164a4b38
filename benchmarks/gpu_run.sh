#!/usr/bin/env bash
# One GPU machine's steps for the triton.gemm issue, run from the repo root on the lent machine:
#   bash benchmarks/gpu_run.sh smoke service        # a quick tune, the service end to end
#   bash benchmarks/gpu_run.sh check                  # correctness matrix, a process a variant
#   bash benchmarks/gpu_run.sh splitk                 # one-kernel split-K: its check + timings
#   bash benchmarks/gpu_run.sh waves                  # wave-quantised shapes: configs past the space
#   bash benchmarks/gpu_run.sh streamk                # stream-K probe: timings, Nsight Compute
#   bash benchmarks/gpu_run.sh tiles check_variant    # chosen configs vs cuBLAS; VARIANT's checks
#   bash benchmarks/gpu_run.sh atomic                 # split-K by fp32 atomics: probe timings
#   bash benchmarks/gpu_run.sh padk                   # PAD_K: one padding launch vs two copies
#   MATCH="padK x144x" bash benchmarks/gpu_run.sh check_match   # check cases whose label matches
#   bash benchmarks/gpu_run.sh bench "4096x4096x4096 16x4096x4096" [trials]
#   bash benchmarks/gpu_run.sh dataset "square_4096 odd_1000x3000x777" [deadline secs]
#     (DATASET_ARGS="--configs 500" to sample fewer configs a workload)
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

step_check() {
  # One process a variant, each stopped (with its stack dumped) when one case hangs, so a
  # hung kernel costs 20 s and the other variants are still checked.
  local v
  for v in tiled persistent tma ws; do
    mkdir -p "$OUT/check_$v"
    timeout 150 python3 benchmarks/triton_kernel_check.py --out "$OUT/check_$v" \
      --budget-secs 300 --skip timing xproc --variants "$v" --case-secs 20 \
      >"$OUT/check_$v/run.log" 2>&1
    echo "check $v rc=$?"
    grep -v '^case' "$OUT/check_$v/run.log" | tail -6
    tail -1 "$OUT/check_$v/run.log"
  done
  (cd "$OUT" && tar czf check.tgz check_* && rm -rf check_*)
}

step_splitk() {
  # The one-kernel split-K (variant 'splitk'): (a) its part of the check matrix, in one
  # process with check's hang guard; (b) side by side with the two-kernel split-K, the best
  # of a few non-split configs and cuBLAS on four long-K shapes (benchmarks/probes/gpu_splitk.py:
  # ~63 kernels compiled by a CPU pool first, graph replay, L2 flushed, 3 rounds). Each part
  # is capped so the step stays under 4 minutes.
  mkdir -p "$OUT/check_splitk"
  timeout 100 python3 benchmarks/triton_kernel_check.py --out "$OUT/check_splitk" \
    --budget-secs 240 --skip timing xproc --variants splitk --case-secs 20 \
    >"$OUT/check_splitk/run.log" 2>&1
  echo "check splitk rc=$?"
  grep -v '^case' "$OUT/check_splitk/run.log" | tail -8
  tail -1 "$OUT/check_splitk/run.log"
  (cd "$OUT" && tar czf check_splitk.tgz check_splitk && rm -rf check_splitk)
  timeout 130 python3 benchmarks/probes/gpu_splitk.py --budget-secs 105 \
    --out "$OUT/gpu_splitk-$(date -u +%Y%m%dT%H%M%S).json" 2>&1 | tee "$OUT/splitk.log"
  echo "gpu_splitk rc=${PIPESTATUS[0]}"
}

step_waves() {
  # The shapes whose tiles leave SMs idle, with configs the space leaves out (split-K past two
  # waves) and tiles that share an SM, beside the search's pick and cuBLAS (and its kernels).
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.limit --format=csv
  timeout 420 python3 benchmarks/probes/gpu_waves.py \
    --out "$OUT/gpu_waves-$(date -u +%Y%m%dT%H%M%S).json" 2>&1 | tee "$OUT/waves.log"
  echo "gpu_waves rc=${PIPESTATUS[0]}"
}

step_streamk() {
  # Stream-K (benchmarks/probes/gpu_streamk.py, its own kernel: not a variant of the template): its
  # timings beside the last search's pick and cuBLAS on the wave-quantised shapes, each
  # contender checked first; then Nsight Compute on two shapes.
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.limit --format=csv
  timeout 330 python3 benchmarks/probes/gpu_streamk.py --budget-secs 280 \
    --out "$OUT/gpu_streamk-$(date -u +%Y%m%dT%H%M%S).json" 2>&1 | tee "$OUT/streamk.log"
  echo "gpu_streamk rc=${PIPESTATUS[0]}"
  for s in 1536x1536x1536:bfloat16 1024x1024x1024:float16; do
    timeout 200 python3 benchmarks/probes/gpu_streamk.py --ncu "$s" --out-dir "$OUT" | tee -a "$OUT/streamk.log"
  done
}

step_tiles() {
  # Chosen configs beside cuBLAS, no search (benchmarks/probes/gpu_tiles.py; its default plan: the
  # composite tiles of 'tma' on the wave-quantised shapes).
  timeout 330 python3 benchmarks/probes/gpu_tiles.py --budget-secs 280 ${TILES_ARGS:-} \
    --out "$OUT/gpu_tiles-$(date -u +%Y%m%dT%H%M%S).json" 2>&1 | tee "$OUT/tiles.log"
  echo "gpu_tiles rc=${PIPESTATUS[0]}"
}

step_atomic() {
  # Split-K whose partials meet by fp32 atomics (benchmarks/probes/gpu_atomic.py: the template's
  # splitk_atomic and the probe's TMA-loaded and tree kernels), beside splitk, the search's
  # pick and cuBLAS on the long-K shapes; then Nsight Compute on 256x256x65536.
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.limit --format=csv
  timeout 330 python3 benchmarks/probes/gpu_atomic.py \
    --out "$OUT/gpu_atomic-$(date -u +%Y%m%dT%H%M%S).json" 2>&1 | tee "$OUT/atomic.log"
  echo "gpu_atomic rc=${PIPESTATUS[0]}"
  timeout 200 python3 benchmarks/probes/gpu_atomic.py \
    --ncu "$OUT/gpu_atomic_ncu-$(date -u +%Y%m%dT%H%M%S).csv" | tee -a "$OUT/atomic.log"
}

step_padk() {
  # PAD_K on the odd-K shapes (benchmarks/probes/gpu_padk.py): the template's one padding launch, the
  # two torch copies it replaced and a GEMM on operands padded once, beside cuBLAS; profiled.
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.limit --format=csv
  timeout 330 python3 benchmarks/probes/gpu_padk.py --budget-secs 280 \
    --out "$OUT/gpu_padk-$(date -u +%Y%m%dT%H%M%S).json" 2>&1 | tee "$OUT/padk.log"
  echo "gpu_padk rc=${PIPESTATUS[0]}"
}

step_check_match() {
  # The check matrix's cases whose config label contains one of MATCH's words.
  mkdir -p "$OUT/check_match"
  timeout 200 python3 benchmarks/triton_kernel_check.py --out "$OUT/check_match" \
    --budget-secs 300 --skip timing xproc --match ${MATCH:-padK} --case-secs 20 \
    >"$OUT/check_match/run.log" 2>&1
  echo "check match rc=$?"
  grep -v '^case' "$OUT/check_match/run.log" | tail -8
  (cd "$OUT" && tar czf check_match.tgz check_match && rm -rf check_match)
}

step_check_variant() {
  # One variant's part of the check matrix (VARIANT=tma ...), with check's hang guard.
  local v="${VARIANT:-tma}"
  mkdir -p "$OUT/check_$v"
  timeout 200 python3 benchmarks/triton_kernel_check.py --out "$OUT/check_$v" \
    --budget-secs 300 --skip timing xproc --variants "$v" --case-secs 20 \
    >"$OUT/check_$v/run.log" 2>&1
  echo "check $v rc=$?"
  grep -v '^case' "$OUT/check_$v/run.log" | tail -8
  (cd "$OUT" && tar czf "check_$v.tgz" "check_$v" && rm -rf "check_$v")
}

step_bench() {
  local cases=() trials="${2:-64}"
  for c in $1; do cases+=(--case "$c"); done
  python3 benchmarks/gpu_gemm.py "${cases[@]}" --trials "$trials" ${BENCH_ARGS:-} \
    --out "$OUT/gpu_gemm-$(date -u +%Y%m%dT%H%M%S).json" 2>&1 | tee -a "$OUT/bench.log" \
    | grep -v " INFO "
}

step_dataset() {
  local names=() deadline="${2:-420}"
  for w in $1; do names+=(--workload "$w"); done
  mkdir -p "$OUT/datasets"
  python3 benchmarks/collect_gpu_dataset.py "${names[@]}" --out "$OUT/datasets" \
    --deadline-secs "$deadline" ${DATASET_ARGS:-} 2>&1 | tee -a "$OUT/dataset.log" | grep -v " INFO "
}

case "${1:-}" in
  smoke|service|check|check_variant|check_match|splitk|waves|streamk|tiles|atomic|padk)
    for s in "$@"; do "step_$s"; done ;;
  bench) step_bench "$2" "${3:-64}" ;;
  dataset) step_dataset "$2" "${3:-420}" ;;
  *) sed -n 2,8p "$0"; exit 2 ;;
esac
