#!/usr/bin/env bash
# One device call for the kernel work: GPU kernel tests, then kernel_explore, then the cubin cache back.
# Usage on the device (repository root):  bash bench/device_kernels.sh "$OUT" [pytest paths...]
# Every step has its own time limit so that what ran still comes back under $OUT.
set -u
OUT=${1:?usage: device_kernels.sh OUT [tests...]}; shift
TESTS=${*:-tests/gpu}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site:. GRAPHOPT_KERNEL_CACHE=${GRAPHOPT_KERNEL_CACHE:-/tmp/gk}
mkdir -p "$GRAPHOPT_KERNEL_CACHE"
[ -f .cubin/cubin.tar.xz ] && tar xJf .cubin/cubin.tar.xz -C "$GRAPHOPT_KERNEL_CACHE"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader
# Compile every kernel instance first (parallel NVRTC, its own limit): inside pytest the session
# fixture's compile counts against the first test's --timeout.
timeout ${PREBUILD_LIMIT:-240} python3 -c "
import time; t=time.perf_counter()
from graphopt.kernels.registry import all_kernel_instances; from graphopt.kernels.source import prebuild
jobs=all_kernel_instances(); errors=prebuild(jobs)
print(f'prebuilt {len(jobs)} kernel instances in {time.perf_counter()-t:.1f} s; failures: {errors}')" 2>&1 | tail -3 | tee "$OUT/prebuild.txt"
cmd="python3 -m pytest -q --tb=${TB:-line} -rfE --timeout 120 -p no:cacheprovider $TESTS"
{ echo "# tests on the lent H200, $(date -u +%FT%T+00:00), code at ${HEAD_COMMIT:-unknown commit} plus the working tree"
  echo "# command: PYTHONPATH=. GRAPHOPT_KERNEL_CACHE=/tmp/gk $cmd"
  timeout ${TEST_LIMIT:-300} $cmd 2>&1; echo "# exit status $?"; } | tee "$OUT/gpu_tests_h200.txt" | tail -25
if [ "${EXPLORE:-1}" = 1 ]; then
  timeout ${EXPLORE_LIMIT:-200} python3 bench/kernel_explore.py --out "$OUT" ${EXPLORE_ARGS:-} > "$OUT/kernel_explore_log.txt" 2>&1
  echo "kernel_explore exit $?"; grep -E "^(r50|mv2|GEMM)" "$OUT/kernel_explore_log.txt"
fi
tar cJf "$OUT/cubin.tar.xz" -C "$GRAPHOPT_KERNEL_CACHE" .
