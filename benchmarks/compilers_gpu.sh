#!/usr/bin/env bash
# The compiler integrations' GPU benchmarks, in steps that each fit a 10-minute command, run
# from the repo root on the GPU machine (results and logs go to $OUT):
#   bash benchmarks/compilers_gpu.sh autotune        # autotune_share: 2nd process, 0 do_bench
#   bash benchmarks/compilers_gpu.sh route           # inductor_route: generated code, mapping
#   bash benchmarks/compilers_gpu.sh tune            # tune the models' GEMM shapes (~4 min)
#   bash benchmarks/compilers_gpu.sh gpt2|llama|vit  # compile_models, one model's two cases
#   bash benchmarks/compilers_gpu.sh extras          # training, offline, dynamic shapes
#   bash benchmarks/compilers_gpu.sh all             # all of them, one after another
# The tuned shapes live in $CB_HOME (default /tmp/tunehub-compile-models) between steps; a
# warm GPU machine keeps it between commands. Extra arguments after the step go to
# compile_models.py (give the same ones to tune and the models).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-/tmp/out}"
CB_HOME="${CB_HOME:-/tmp/tunehub-compile-models}"
mkdir -p "$OUT"
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH="/tmp/site:$PWD"
else
  export PYTHONPATH="$PWD"
fi
export PYTHONUNBUFFERED=1
stamp=$(date -u +%Y%m%dT%H%M%S)
step="${1:-}"
shift || true

step_autotune() {
  python3 benchmarks/autotune_share.py --out "$OUT/autotune_share-$stamp.json" "$@" \
    2>&1 | tee -a "$OUT/autotune_share.log"
}
step_route() {
  python3 benchmarks/inductor_route.py --out "$OUT/inductor_route-$stamp.json" "$@" \
    2>&1 | tee -a "$OUT/inductor_route.log"
}
step_tune() {
  python3 benchmarks/compile_models.py --home "$CB_HOME" --tune-only \
    --extras train-fp32,train-bf16 --trials "${TRIALS:-12}" --job-secs "${JOB_SECS:-15}" "$@" \
    --out "$OUT/compile_models-tune-$stamp.json" 2>&1 | tee -a "$OUT/compile_models.log"
}
step_model() {
  local model=$1
  shift
  python3 benchmarks/compile_models.py --home "$CB_HOME" --skip-tune --models "$model" "$@" \
    --out "$OUT/compile_models-$model-$stamp.json" 2>&1 | tee -a "$OUT/compile_models.log"
}
step_extras() {
  python3 benchmarks/compile_models.py --home "$CB_HOME" --skip-tune --models gpt2 \
    --cases none --extras offline,train-fp32,train-bf16,dynamic "$@" \
    --out "$OUT/compile_models-extras-$stamp.json" 2>&1 | tee -a "$OUT/compile_models.log"
}

case "$step" in
  autotune|route|tune|extras) "step_$step" "$@" ;;
  gpt2|llama|vit) step_model "$step" "$@" ;;
  all) step_autotune; step_route; step_tune "$@"; step_model gpt2 "$@"; step_model llama "$@"
       step_model vit "$@"; step_extras "$@" ;;
  *) sed -n 2,10p "$0"; exit 2 ;;
esac
