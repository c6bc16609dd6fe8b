#!/usr/bin/env bash
# One device call for the measurements: cbr_layers (fp16, then fp32 if time is left), gemm_act,
# cache_speed, e2e --quick. Each step has its own limit; what finished comes back under $OUT.
# Usage (repository root):  HEAD_COMMIT=abc1234 bash bench/device_perf.sh "$OUT"
set -u
OUT=${1:?usage: device_perf.sh OUT}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site:. GRAPHOPT_KERNEL_CACHE=${GRAPHOPT_KERNEL_CACHE:-/tmp/gk}
mkdir -p "$GRAPHOPT_KERNEL_CACHE" "$OUT/fp32"
[ -f .cubin/cubin.tar.xz ] && tar xJf .cubin/cubin.tar.xz -C "$GRAPHOPT_KERNEL_CACHE"
echo "code at ${HEAD_COMMIT:-unknown commit}"
step() { local limit=$1 log=$2; shift 2; [ "$limit" -gt 0 ] || { echo "[$log] skipped"; return; }; local t=$SECONDS; timeout "$limit" "$@" > "$OUT/$log" 2>&1; echo "[$log] exit $? after $((SECONDS - t)) s"; tail -${TAIL:-6} "$OUT/$log"; }
TAIL=14 step ${CBR16_LIMIT:-240} cbr_layers_fp16.log python3 bench/cbr_layers.py --out "$OUT" --dtypes float16 --batches ${CBR_BATCHES:-1,32} --reps ${REPS:-10}
step ${GEMM_LIMIT:-60} gemm_act.log python3 bench/gemm_act.py --header-from "$OUT/cbr_layers_h200.json" --out "$OUT" --dtypes float16 --reps ${REPS:-10}
TAIL=12 step ${CACHE_LIMIT:-420} cache_speed.log python3 bench/cache_speed.py --gpu h200 --limit 150 --out-dir "$OUT"
[ "${E2E_LIMIT:-0}" -gt 0 ] && TAIL=25 step "$E2E_LIMIT" e2e_log.txt python3 bench/e2e.py --quick --budget $((E2E_LIMIT - 20)) --out "$OUT"
[ "${CBR32_LIMIT:-0}" -gt 0 ] && step "$CBR32_LIMIT" cbr_layers_fp32.log python3 bench/cbr_layers.py --out "$OUT/fp32" --dtypes float32 --reps ${REPS:-10}
exit 0
