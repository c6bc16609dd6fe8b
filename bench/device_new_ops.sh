#!/usr/bin/env bash
# One device call for the RoPE / GroupNorm / GatedMLP lowerings: their GPU tests, then bench/new_ops.py
# (each against torch eager). Usage on the device (repository root):  bash bench/device_new_ops.sh "$OUT"
# Every step has its own time limit (together under 10 minutes) so that what ran still comes back under $OUT.
set -u
OUT=${1:?usage: device_new_ops.sh OUT}
mkdir -p "$OUT"
export PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH} GRAPHOPT_KERNEL_CACHE=${GRAPHOPT_KERNEL_CACHE:-/tmp/gk} GRAPHOPT_GPU_NO_PREBUILD=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader
cmd="python3 -m pytest -q -m gpu --tb=${TB:-short} -rfE -p no:cacheprovider tests/gpu/test_new_op_kernels.py"
{ echo "# tests on the lent GPU, $(date -u +%FT%T+00:00); command: $cmd"
  timeout ${TEST_LIMIT:-300} $cmd 2>&1; echo "# exit status $?"; } | tee "$OUT/gpu_new_op_kernels.txt" | tail -25
timeout ${BENCH_LIMIT:-270} python3 bench/new_ops.py --out "$OUT" --budget-s ${BENCH_BUDGET:-240} 2>&1 | tee "$OUT/new_ops_log.txt" | tail -20
echo "bench exit ${PIPESTATUS[0]}"
