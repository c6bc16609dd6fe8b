#!/usr/bin/env bash
# The runtime's device work, one step per call (each fits the device's 10-minute command limit):
#   bash bench/device_runtime.sh "$OUT" tests        # tests/gpu/test_runtime_gpu.py + test_blas_capture.py (~3-6 min)
#   bash bench/device_runtime.sh "$OUT" conformance  # ONNX node tests on cuda -> $OUT/conformance_h200.md (~2-5 min)
#   bash bench/device_runtime.sh "$OUT" e2e          # bench/e2e.py --quick -> $OUT/e2e_h200.{json,md} (~6 min)
# Run from the repository root. Same set-up as bench/device_kernels.sh (wheels in .whl/, cubin cache in .cubin/).
set -u
OUT=${1:?usage: device_runtime.sh OUT tests|conformance|e2e}; STEP=${2:?usage: device_runtime.sh OUT tests|conformance|e2e}
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >/dev/null 2>&1
fi
export PYTHONPATH=/tmp/site:. GRAPHOPT_KERNEL_CACHE=${GRAPHOPT_KERNEL_CACHE:-/tmp/gk}
mkdir -p "$GRAPHOPT_KERNEL_CACHE"
[ -f .cubin/cubin.tar.xz ] && tar xJf .cubin/cubin.tar.xz -C "$GRAPHOPT_KERNEL_CACHE"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
case "$STEP" in
  tests)
    cmd="python3 -m pytest -q -s --tb=short -rfE -p no:cacheprovider tests/gpu/test_runtime_gpu.py tests/gpu/test_blas_capture.py"
    { echo "# runtime GPU tests, $(date -u +%FT%T+00:00), code at ${HEAD_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null)}"
      echo "# command: PYTHONPATH=. $cmd"
      timeout ${TEST_LIMIT:-540} $cmd 2>&1; echo "# exit status $?"; } | tee "$OUT/runtime_gpu_tests_h200.txt" | tail -40 ;;
  conformance)
    timeout ${CONF_LIMIT:-540} python3 bench/conformance.py --device cuda --out "$OUT/conformance_h200.md" 2>&1 | tail -15
    head -8 "$OUT/conformance_h200.md" 2>/dev/null ;;
  e2e)
    timeout ${E2E_LIMIT:-420} python3 bench/e2e.py --quick --budget ${E2E_BUDGET:-330} --out "$OUT" 2>&1 | tee "$OUT/e2e_log.txt" | tail -40 ;;
  *) echo "unknown step $STEP (tests|conformance|e2e)"; exit 2 ;;
esac
[ -d "$GRAPHOPT_KERNEL_CACHE" ] && tar cJf "$OUT/cubin.tar.xz" -C "$GRAPHOPT_KERNEL_CACHE" . 2>/dev/null
exit 0
