#!/usr/bin/env bash
# One device call for the cuDNN provider: its GPU tests, then bench/cudnn_layers.py (fp16, bs1 and bs32).
#   run: bash bench/device_cudnn.sh   (from the repo root; carry .whl with nvidia-cudnn-frontend 1.32)
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >/dev/null 2>&1 || echo "wheel install failed"
export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1 GRAPHOPT_GPU_NO_PREBUILD=1 GRAPHOPT_KERNEL_CACHE=/tmp/gk
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python3 -c "import cudnn; print('cudnn frontend', cudnn.__version__, 'backend', cudnn.backend_version())"
{ echo "# tests/gpu/test_cudnn_provider_gpu.py, $(date -u +%FT%T+00:00), code at ${HEAD_COMMIT:-?}"
  echo "# command: GRAPHOPT_GPU_NO_PREBUILD=1 python3 -m pytest -q -s -rfE -p no:cacheprovider tests/gpu/test_cudnn_provider_gpu.py"
  timeout ${TEST_LIMIT:-170} python3 -m pytest -q -s -rfE --tb=short -p no:cacheprovider tests/gpu/test_cudnn_provider_gpu.py 2>&1
  echo "# exit status $?"; } > "$OUT/cudnn_gpu_tests_h200.txt"
tail -15 "$OUT/cudnn_gpu_tests_h200.txt"
timeout ${BENCH_LIMIT:-330} python3 bench/cudnn_layers.py --out "$OUT" --budget ${BENCH_BUDGET:-290} 2>&1 | tail -12
if [ -n "${E2E_GPT2:-}" ]; then  # the optimized GPT-2 on the runtime (no custom op on the host any more)
  timeout ${E2E_LIMIT:-200} python3 bench/e2e.py --quick --models gpt2 --batches 1 --no-compile --budget ${E2E_BUDGET:-170} --out "$OUT" 2>&1 | tail -15
fi
exit 0
