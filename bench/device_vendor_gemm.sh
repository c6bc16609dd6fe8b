#!/usr/bin/env bash
# One device call for the cuBLASLt and cuDNN-matmul providers: their GPU tests, then bench/gemm_act.py
# (fp16; own kernels, cuDNN plans and cuBLASLt algorithms against torch eager), each with its own time limit.
#   run: OUT=... bash bench/device_vendor_gemm.sh   (from the repo root; carry .whl with nvidia-cudnn-frontend 1.32)
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >/dev/null 2>&1 || echo "wheel install failed"
export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1 GRAPHOPT_GPU_NO_PREBUILD=1 GRAPHOPT_KERNEL_CACHE=/tmp/gk
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python3 -c "from graphopt.providers import provider_reasons; print(provider_reasons())" 2>&1 | tail -2
for t in cublaslt cudnn_matmul; do
  { echo "# tests/gpu/test_provider_$t.py, $(date -u +%FT%T+00:00), code at ${HEAD_COMMIT:-?}"
    echo "# command: GRAPHOPT_GPU_NO_PREBUILD=1 python3 -m pytest -q -s -rfE -p no:cacheprovider tests/gpu/test_provider_$t.py"
    timeout ${TEST_LIMIT:-150} python3 -m pytest -q -s -rfE --tb=short -p no:cacheprovider tests/gpu/test_provider_$t.py 2>&1
    echo "# exit status $?"; } > "$OUT/provider_${t}_gpu_tests_h200.txt"
  tail -12 "$OUT/provider_${t}_gpu_tests_h200.txt"
done
timeout ${BENCH_LIMIT:-260} python3 bench/gemm_act.py --out "$OUT" --dtypes float16 --budget ${BENCH_BUDGET:-230} 2>&1 | tail -45
exit 0
