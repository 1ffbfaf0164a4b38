#!/usr/bin/env bash
# The compiler integrations' GPU benchmarks, in steps that each fit a 10-minute command, run
# from the repo root on the GPU machine (results and logs go to $OUT):
#   bash benchmarks/compilers_gpu.sh autotune        # autotune_share: 2nd process, 0 do_bench
#   bash benchmarks/compilers_gpu.sh tune            # tune the block's 8 GEMM shapes (~4 min)
#   bash benchmarks/compilers_gpu.sh prefill         # compile_block, prefill case
#   bash benchmarks/compilers_gpu.sh decode          # compile_block, decode case
#   bash benchmarks/compilers_gpu.sh all             # the four, one after another
# The tuned shapes live in $CB_HOME (default /tmp/tunehub-compile-block) between steps.
# Extra arguments after the step go to compile_block.py (e.g. --mlp 14336 --dtype bfloat16;
# give the same ones to tune, prefill and decode).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-/tmp/out}"
CB_HOME="${CB_HOME:-/tmp/tunehub-compile-block}"
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
step_tune() {
  python3 benchmarks/compile_block.py --home "$CB_HOME" --contenders none \
    --trials "${TRIALS:-12}" --job-secs "${JOB_SECS:-25}" "$@" \
    --out "$OUT/compile_block-tune-$stamp.json" 2>&1 | tee -a "$OUT/compile_block.log"
}
step_prefill() {
  python3 benchmarks/compile_block.py --home "$CB_HOME" --skip-tune --cases prefill "$@" \
    --out "$OUT/compile_block-prefill-$stamp.json" 2>&1 | tee -a "$OUT/compile_block.log"
}
step_decode() {
  python3 benchmarks/compile_block.py --home "$CB_HOME" --skip-tune --cases decode "$@" \
    --out "$OUT/compile_block-decode-$stamp.json" 2>&1 | tee -a "$OUT/compile_block.log"
}

case "$step" in
  autotune|tune|prefill|decode) "step_$step" "$@" ;;
  all) step_autotune; step_tune "$@"; step_prefill "$@"; step_decode "$@" ;;
  *) sed -n 2,10p "$0"; exit 2 ;;
esac
