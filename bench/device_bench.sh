#!/usr/bin/env bash
# Every device measurement, one STEP per device call (each within 9.5 minutes; the device's limit is 10).
#
#   bash bench/device_bench.sh STEP OUT          (from the repository root; OUT is the run tool's $OUT)
#
# Travels with the working tree (untracked, or named in the run tool's `carry` where ignored): .whl (the
# nvidia-cudnn-frontend and onnxconverter-common wheels; installed to /tmp/site),
# .cubin (cubin.tar.xz: every own kernel compiled for the device by bench/kernel_cache.py on the CPU machine)
# and .tuning (tuning.tar.xz: the tuning cache of an earlier call). The e2e steps write OUT/tuning.tar.xz:
# put it back as .tuning/tuning.tar.xz for the next call, so a tuning cut at the end of one call resumes in
# the next and a fully tuned model optimizes fast. PACK_CUBIN=1 also packs the machine's kernel cache as
# OUT/cubin.tar.xz (off by default: with every instance in it, it is over the size a call returns).
#
# Output files are named by the GPU the call got (GPU_TAG: h200, h100, ... from nvidia-smi; below, h200):
# results of different GPUs never merge.
# Steps, what they write under OUT, and how long they take:
#   e2e-cnn           bench/e2e.py, MODELS=resnet50,mobilenetv2,efficientnet_b0 (fp16; fp32 for resnet50)
#   e2e-transformers  bench/e2e.py, MODELS=gpt2,bert,vit_b16 (fp16; fp32 for bert)
#                     -> e2e_h200.json/.md, merged with bench/results/e2e_h200.json when the working tree
#                     has one (copy OUT's back there after every call). The whole 9.5 minutes: full tuning
#                     is never cut on purpose, so a row whose tuning does not finish says
#                     tuning_complete=false and the next call (with .tuning carried) resumes it. Repeat the
#                     step until every row is tuned (cold ResNet-50 bs32 tuning among own kernels alone took
#                     89 s on 2026-12-04; with every cuDNN plan more; measuring a row takes 0.5-2 min,
#                     torch.compile included). MODELS / BATCHES / DTYPES narrow a call;
#                     E2E_ARGS="--rows efficientnet_b0:1,mobilenetv2:32" runs those rows, in that order.
#   cbr               bench/cbr_layers.py fp16 bs1,32 -> cbr_layers_h200.json/.md; ~108 rows, each profiling
#                     every own config and cuDNN plan: expect 2-3 calls; later calls continue with --previous
#                     from OUT's table where an earlier call on the same machine wrote one, else from
#                     bench/results/cbr_layers_h200.json (copy OUT's back there between machines);
#                     CBR_ARGS="--only r50.stem,mv2.stem" re-measures those layers and keeps the other rows.
#   gemm              bench/gemm_act.py fp16 -> gemm_act_h200.json/.md (14 shapes; ~2-4 min)
#   transformer       bench/transformer_kernels.py -> transformer_kernels_h200.json/.md (~4-8 min; what does
#                     not fit is listed as skipped)
#   cache             bench/cache_speed.py --gpu $GPU_TAG --profile-warm: torchvision ResNet-50 cold + warm, GPT-2 124M cold,
#                     fresh tuning and kernel caches each -> cache_speed_h200.json (~3-6 min; the issue's
#                     bar is 60 s cold each and 5 s warm)
#   conformance       bench/conformance.py --device cuda -> conformance_h200.md (~2-5 min)
#   gpu-tests         pytest ${TESTS:-tests/gpu} -> gpu_tests_h200.txt (~5-9 min for all of tests/gpu)
#   capture-check     the captured-graph correctness tests (two nodes of one signature in one graph, compiled
#                     runs equal traced runs, step replay, declared layouts) -> gpu_tests_capture_h200.txt, then
#                     bench/e2e.py on ResNet-50 bs32 fp16, fully tuned -> e2e_h200.json/.md (~6-8 min): whether
#                     the tuned model's outputs now match torch's
#   diagnose          bench/diagnose_outputs.py on torch:${MODEL:-resnet50} at ${SHAPE:-input=32x3x224x224} fp16 with the
#                     carried .tuning (so the tuned choices come back from the cache) -> diagnose_<model>_h200.json:
#                     each runtime mode's error, then every custom node's own error on its real inputs; then
#                     the captured-graph tests of capture-check (~3-5 min)
#   breakdown         bench/plan_breakdown.py on MODELS / BATCHES (default GPT-2 and BERT at bs32) with the carried
#                     .tuning's choices -> plan_breakdown_h200.json/.md: each step's device time alone, by op
#                     and lowering (~2-4 min)
#   explore           bench/kernel_explore.py -> kernel_explore_h200.json (~3-4 min)
#   host              the run-path GPU tests (step replay, graph-output replay, the hold of the host-time
#                     method; HOST_TEST_LIMIT=0 skips them) -> gpu_tests_host_h200.txt (~1-2 min), then
#                     bench/host_overhead.py on HOST_MODELS / HOST_BATCHES (default ResNet-50 bs1 and bs32, GPT-2
#                     bs1; heuristic lowerings, or HOST_GPU_ARGS="--gpu auto --precision fp16 --io-fp16": the tuned ones)
#                     -> host_overhead_h200.json/.md (~3-5 min): host us/node with the GPU held, beside the
#                     idle-GPU figure (the method before 2026-12-05), the thread CPU time and per op
#   stem-breakdown    bench/stem_breakdown.py -> stem_breakdown_h200.json (~2 min): ResNet-50's and MobileNetV2's
#                     stems part by part (cuDNN's convolution alone, graphopt's pass, im2col's packing and GEMM)
#                     beside torch's convolution alone, with bias, with bias and activation
#   stem-engines      bench/stem_engines.py -> stem_engines_h200.json (~3 min): every engine of cuDNN's operation
#                     graph for a stem's convolution (default knobs) and every heuristic plan unfiltered, timed and
#                     checked, beside the kernels torch runs for it (torch.profiler)
#   align-probe       bench/align_probe.py -> align_probe_h200.json (~3 min): the first plans of cuDNN's fused CBR
#                     graph for eight ResNet-50 / MobileNetV2 layers and of its matmul graph for three GPT-2 / BERT
#                     projections, declared 16- and 32-byte aligned, tuner-timed
#   early-start       bench/probe_early_start.py -> early_start_h200.json (~1 min): which library launches
#                     start before their predecessor ends (programmatic edges in a captured graph)
#   ordering          the runtime's barrier rule (graphopt.runtime.ordering) and the measured barrier
#                     (graphopt.lowering.early_start): the whole-graph replay GPU tests (ResNet-50 with every CBR
#                     on cuDNN; GPT-2 with every GemmAct on cuDNN, barriers dropped, kept and measured) and
#                     tests/gpu/test_early_start_gpu.py -> gpu_tests_ordering_h200.txt, then bench/diagnose_capture.py on ResNet-50 bs32 fp16
#                     with the carried .tuning -> diagnose_capture_resnet50_h200.json (~2-4 min)
set -u
STEP=${1:?usage: device_bench.sh STEP OUT (steps: e2e-cnn e2e-transformers cbr gemm transformer cache conformance gpu-tests capture-check diagnose breakdown explore host early-start ordering stem-breakdown stem-engines align-probe)}
OUT=${2:?usage: device_bench.sh STEP OUT}
LIMIT=${LIMIT:-570}        # seconds for the whole call (9.5 minutes)
START=$SECONDS
mkdir -p "$OUT"
left() { echo $(( LIMIT - (SECONDS - START) - ${1:-30} )); }   # what is left, less a reserve for the tarballs

if ls .whl/*.whl >/dev/null 2>&1 && [ ! -f /tmp/site/.device_bench_installed ]; then  # once per machine
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >/dev/null 2>&1 \
    && touch /tmp/site/.device_bench_installed || echo "device_bench: wheel install failed"
fi
export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1 PYTHONFAULTHANDLER=1  # a crash in a library prints the Python stack (2026-12-06: a libcublas segfault said nothing else)
# with PACK_CUBIN=1 a step re-packs the kernel cache: on 2026-12-05 a step with 10 s of tests took 99 s, and
# xz at its default level on ~100 MB of cubins is the likeliest part of that overhead (not timed
# separately); threaded level 1 instead
export XZ_OPT=${XZ_OPT:--T0 -1}
export GRAPHOPT_KERNEL_CACHE=${GRAPHOPT_KERNEL_CACHE:-/tmp/gk}
export HEAD_COMMIT=${HEAD_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null)}
TUNING=${TUNING:-/tmp/graphopt_tuning}
mkdir -p "$GRAPHOPT_KERNEL_CACHE" "$TUNING"
[ -f .cubin/cubin.tar.xz ] && [ -z "$(ls -A "$GRAPHOPT_KERNEL_CACHE")" ] && tar xJf .cubin/cubin.tar.xz -C "$GRAPHOPT_KERNEL_CACHE"
[ -f .tuning/tuning.tar.xz ] && [ -z "$(ls -A "$TUNING")" ] && tar xJf .tuning/tuning.tar.xz -C "$TUNING"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null
# the output files' GPU suffix (h200, h100): the lent machine may be either; results of one GPU never merge with another's
GPU_TAG=${GPU_TAG:-$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 | grep -o 'H[0-9]\+' | tr H h)}
GPU_TAG=${GPU_TAG:-h200}
python3 -c "import cudnn; print('cudnn frontend', cudnn.__version__, 'backend', cudnn.backend_version())" 2>&1 | tail -1
echo "device_bench: step $STEP, code at $HEAD_COMMIT, $(date -u +%FT%TZ)"

exit_of() {  # exit_of NAME STATUS: a bench script's failure said plainly (its output goes through tee / tail,
  # which hid a segfault's status 139 on 2026-12-06), and kept in OUT/exit_status.txt
  [ "$2" = 0 ] && return 0
  local why=""
  [ "$2" = 124 ] && why=" (its time limit)"
  [ "$2" -gt 128 ] && [ "$2" != 137 ] && why=" (signal $(( $2 - 128 )): PYTHONFAULTHANDLER printed the Python stack in its log)"
  [ "$2" = 137 ] && why=" (killed: its time limit's -k, or memory)"
  echo "device_bench: $1 exited with status $2$why" | tee -a "$OUT/exit_status.txt"
}

cbr_previous() {  # the CBR table a run continues from: the one an earlier call on this machine wrote under OUT
  # (a warm machine keeps it; it holds that call's rows, which the checkout's copy does not), else the committed one
  if [ -f "$OUT/cbr_layers_$GPU_TAG.json" ]; then echo "$OUT/cbr_layers_$GPU_TAG.json"; else echo "bench/results/cbr_layers_$GPU_TAG.json"; fi
}

prebuild() {  # every own kernel instance compiled in parallel into $GRAPHOPT_KERNEL_CACHE (its own limit)
  timeout ${PREBUILD_LIMIT:-240} python3 -c "
import time; t=time.perf_counter()
from graphopt.kernels.registry import all_kernel_instances; from graphopt.kernels.source import prebuild
jobs=all_kernel_instances(); errors=prebuild(jobs)
print(f'prebuilt {len(jobs)} kernel instances in {time.perf_counter()-t:.1f} s; failures: {errors}')" 2>&1 | tail -3 | tee "$OUT/prebuild.txt"
}

e2e() {  # e2e MODELS: merge into the working tree's e2e_$GPU_TAG.json, tuning cache in $TUNING
  # --precision fp16 needs onnxconverter-common (carry its wheel in .whl): without it e2e.py falls back to
  # a torch fp16 export, a different graph whose rows are not comparable (2026-12-05: GPT-2 13.8 ms)
  python3 -c "import onnxconverter_common" 2>/dev/null \
    || echo "device_bench: WARNING onnxconverter-common is not importable: fp16 rows take the torch-fp16-export fallback"
  [ -f "bench/results/e2e_$GPU_TAG.json" ] && cp "bench/results/e2e_$GPU_TAG.json" "$OUT/e2e_$GPU_TAG.json"
  timeout -k 15 "$(left 20)" python3 bench/e2e.py --models "$1" --batches "${BATCHES:-1,32}" --dtypes "${DTYPES:-fp16,fp32}" \
    --cache-dir "$TUNING" --budget "$(left 45)" --out "$OUT" --gpu-name "$GPU_TAG" ${E2E_ARGS:-} 2>&1 | tee "$OUT/e2e_${STEP}_log.txt" | tail -60; exit_of bench/e2e.py "${PIPESTATUS[0]}"
  tar cJf "$OUT/tuning.tar.xz" -C "$TUNING" . 2>/dev/null
}

capture_tests() {  # the captured-graph correctness tests -> gpu_tests_capture_h200.txt
  # an array: the -k expression is one argument (a plain string split it at its spaces, and pytest
  # took "or" for a file: no test ran on 2026-12-04)
  local cmd=(python3 -m pytest -q -m gpu --tb=short -rfE -p no:cacheprovider tests/gpu/test_provider_cublaslt.py
             tests/gpu/test_cudnn_provider_gpu.py tests/gpu/test_layout_declared_gpu.py tests/gpu/test_runtime_compiled_gpu.py
             -k "captured or declared or traced or step_graphs")
  { echo "# GPU tests, $(date -u +%FT%T+00:00), code at $HEAD_COMMIT"; echo "# command: PYTHONPATH=. GRAPHOPT_GPU_NO_PREBUILD=1 ${cmd[*]}"
    GRAPHOPT_GPU_NO_PREBUILD=1 timeout -k 10 ${CAPTURE_LIMIT:-180} "${cmd[@]}" 2>&1; echo "# exit status $?"; } \
    | tee "$OUT/gpu_tests_capture_$GPU_TAG.txt" | tail -12
}

case "$STEP" in
  e2e-cnn) e2e "${MODELS:-resnet50,mobilenetv2,efficientnet_b0}" ;;
  e2e-transformers) e2e "${MODELS:-gpt2,bert,vit_b16}" ;;
  cbr)
    timeout -k 10 "$(left)" python3 bench/cbr_layers.py --out "$OUT" --dtypes "${DTYPES:-float16}" --batches "${BATCHES:-1,32}" \
      --budget "$(left 45)" --previous "$(cbr_previous)" --gpu-name "$GPU_TAG" ${CBR_ARGS:-} 2>&1 | tee "$OUT/cbr_layers_log.txt" | tail -30; exit_of bench/cbr_layers.py "${PIPESTATUS[0]}" ;;
  gemm)
    timeout -k 10 "$(left)" python3 bench/gemm_act.py --out "$OUT" --dtypes "${DTYPES:-float16}" --budget "$(left 45)" --gpu-name "$GPU_TAG" ${GEMM_ARGS:-} 2>&1 \
      | tee "$OUT/gemm_act_log.txt" | tail -25; exit_of bench/gemm_act.py "${PIPESTATUS[0]}" ;;
  transformer)
    timeout -k 10 "$(left)" python3 bench/transformer_kernels.py --out "$OUT" ${TRANSFORMER_ARGS:-} --budget "$(left 45)" --gpu-name "$GPU_TAG" 2>&1 \
      | tee "$OUT/transformer_kernels_log.txt" | tail -40; exit_of bench/transformer_kernels.py "${PIPESTATUS[0]}" ;;
  cache)
    timeout -k 10 "$(left)" python3 bench/cache_speed.py --gpu $GPU_TAG --limit ${CACHE_LIMIT:-150} --out-dir "$OUT" \
      ${CACHE_ARGS:---profile-warm} 2>&1 | tee "$OUT/cache_speed_log.txt" | tail -8; exit_of bench/cache_speed.py "${PIPESTATUS[0]}" ;;
  conformance)
    timeout -k 10 "$(left)" python3 bench/conformance.py --device cuda --out "$OUT/conformance_$GPU_TAG.md" 2>&1 | tail -15; exit_of bench/conformance.py "${PIPESTATUS[0]}"
    head -8 "$OUT/conformance_$GPU_TAG.md" 2>/dev/null ;;
  gpu-tests)
    [ "${PREBUILD:-1}" = 0 ] || prebuild  # inside pytest the session fixture's compile would count against the first test (PREBUILD=0: a few tests compile what they use)
    cmd="python3 -m pytest -q --tb=${TB:-short} -rfE -p no:cacheprovider ${PYTEST_ARGS:-} ${TESTS:-tests/gpu}"
    { echo "# GPU tests, $(date -u +%FT%T+00:00), code at $HEAD_COMMIT"; echo "# command: PYTHONPATH=. $cmd"
      timeout -k 10 "$(left)" $cmd 2>&1; echo "# exit status $?"; } | tee "$OUT/gpu_tests_$GPU_TAG.txt" | tail -30 ;;
  capture-check)
    capture_tests
    MODELS=resnet50 BATCHES=32 DTYPES=fp16 e2e resnet50 ;;
  diagnose)  # carry .tuning from a tuned call: the same choices, served from the cache
    GRAPHOPT_CACHE_DIR=$TUNING timeout -k 10 "$(left 60)" python3 bench/diagnose_outputs.py --model "torch:${MODEL:-resnet50}" \
      --shape "${SHAPE:-input=32x3x224x224}" --precision fp16 --time-limit "$(left 80)" --out "$OUT/diagnose_${MODEL:-resnet50}_$GPU_TAG.json" \
      2>&1 | tee "$OUT/diagnose_log.txt" | tail -80; exit_of bench/diagnose_outputs.py "${PIPESTATUS[0]}"
    CAPTURE_LIMIT=$(left 20) capture_tests ;;
  breakdown)  # the tuned plan's device time per step: carry .tuning from a tuned call (choices served from it)
    GRAPHOPT_CACHE_DIR=$TUNING timeout -k 10 "$(left)" python3 bench/plan_breakdown.py --models "${MODELS:-gpt2,bert}" \
      --batches "${BATCHES:-32,32}" --gpu-args "--gpu auto --precision fp16 --io-fp16" --out "$OUT" --gpu-name "$GPU_TAG" ${BREAKDOWN_ARGS:-} 2>&1 \
      | tee "$OUT/plan_breakdown_log.txt" | tail -90; exit_of bench/plan_breakdown.py "${PIPESTATUS[0]}" ;;
  explore)
    prebuild
    timeout -k 10 "$(left)" python3 bench/kernel_explore.py --out "$OUT" ${EXPLORE_ARGS:-} > "$OUT/kernel_explore_log.txt" 2>&1
    echo "kernel_explore exit $?"; grep -E "^(r50|mv2|GEMM)" "$OUT/kernel_explore_log.txt" | tail -30 ;;
  host)
    cmd=(python3 -m pytest -q -s -m gpu --tb=short -rfE -p no:cacheprovider tests/gpu/test_runtime_compiled_gpu.py
         -k "step_graphs or graph_output or host")
    [ "${HOST_TEST_LIMIT:-200}" -gt 0 ] && { echo "# GPU tests, $(date -u +%FT%T+00:00), code at $HEAD_COMMIT"; echo "# command: PYTHONPATH=. GRAPHOPT_GPU_NO_PREBUILD=1 ${cmd[*]}"
      GRAPHOPT_GPU_NO_PREBUILD=1 timeout -k 10 ${HOST_TEST_LIMIT:-200} "${cmd[@]}" 2>&1; echo "# exit status $?"; } \
      | tee "$OUT/gpu_tests_host_$GPU_TAG.txt" | tail -12
    # HOST_GPU_ARGS="--gpu auto --precision fp16 --io-fp16": the carried .tuning's choices (default: the heuristic's)
    GRAPHOPT_CACHE_DIR="$TUNING" timeout -k 10 "$(left)" python3 bench/host_overhead.py --out "$OUT" --models "${HOST_MODELS:-resnet50,resnet50,gpt2}" \
      --batches "${HOST_BATCHES:-1,32,1}" --optimize-timeout 150 --gpu-name "$GPU_TAG" ${HOST_GPU_ARGS:+--gpu-args "$HOST_GPU_ARGS"} \
      2>&1 | tee "$OUT/host_overhead_log.txt" | tail -20; exit_of bench/host_overhead.py "${PIPESTATUS[0]}" ;;
  stem-breakdown)  # an image stem's parts beside torch's (bench/stem_breakdown.py; NOTES_kernels, twelfth session)
    timeout -k 10 "$(left)" python3 bench/stem_breakdown.py --out "$OUT" --gpu-name "$GPU_TAG" ${STEM_ARGS:-} 2>&1 \
      | tee "$OUT/stem_breakdown_log.txt" | tail -20; exit_of bench/stem_breakdown.py "${PIPESTATUS[0]}" ;;
  stem-engines)  # every cuDNN engine of a stem's convolution, and torch's kernels for it (bench/stem_engines.py)
    timeout -k 10 "$(left)" python3 bench/stem_engines.py --out "$OUT" --gpu-name "$GPU_TAG" --budget "$(left 60)" ${ENGINE_ARGS:-} 2>&1 \
      | tee "$OUT/stem_engines_log.txt" | tail -30; exit_of bench/stem_engines.py "${PIPESTATUS[0]}" ;;
  align-probe)  # cuDNN's fused CBR plans with the tensors declared 16 and 32 bytes aligned (bench/align_probe.py)
    timeout -k 10 "$(left)" python3 bench/align_probe.py --out "$OUT" --gpu-name "$GPU_TAG" --budget "$(left 60)" ${ALIGN_ARGS:-} 2>&1 \
      | tee "$OUT/align_probe_log.txt" | tail -30; exit_of bench/align_probe.py "${PIPESTATUS[0]}" ;;
  early-start)  # which library launches start early (programmatic edges in a capture; NOTES_kernels, ninth session)
    timeout -k 10 "$(left)" python3 bench/probe_early_start.py --out "$OUT" --gpu-name "$GPU_TAG" ${EARLY_ARGS:-} 2>&1 \
      | tee "$OUT/early_start_log.txt" | tail -40; exit_of bench/probe_early_start.py "${PIPESTATUS[0]}" ;;
  ordering)  # the barrier rule: replays equal to eager with it, and the capture diagnosis with and without it
    cmd=(python3 -m pytest -q -s -m gpu --tb=short -rfE -p no:cacheprovider tests/gpu/test_runtime_compiled_gpu.py
         tests/gpu/test_early_start_gpu.py -k "whole_graph_of_cudnn or barriers_dropped or early_start or measured or reader")
    { echo "# GPU tests, $(date -u +%FT%T+00:00), code at $HEAD_COMMIT"; echo "# command: PYTHONPATH=. GRAPHOPT_GPU_NO_PREBUILD=1 ${cmd[*]}"
      GRAPHOPT_GPU_NO_PREBUILD=1 timeout -k 10 "${ORDER_TEST_LIMIT:-150}" "${cmd[@]}" 2>&1; echo "# exit status $?"; } \
      | tee "$OUT/gpu_tests_ordering_$GPU_TAG.txt" | tail -15
    GRAPHOPT_CACHE_DIR=$TUNING timeout -k 10 "$(left)" python3 bench/diagnose_capture.py --model torch:resnet50 \
      --shape "${SHAPE:-input=32x3x224x224}" --out "$OUT/diagnose_capture_resnet50_$GPU_TAG.json" 2>&1 \
      | tee "$OUT/diagnose_capture_log.txt" | tail -15; exit_of bench/diagnose_capture.py "${PIPESTATUS[0]}" ;;
  *) echo "device_bench: unknown step $STEP (e2e-cnn e2e-transformers cbr gemm transformer cache conformance gpu-tests capture-check diagnose breakdown explore host early-start ordering stem-breakdown stem-engines align-probe)"; exit 2 ;;
esac
if [ "${PACK_CUBIN:-0}" = 1 ]; then tar cJf "$OUT/cubin.tar.xz" -C "$GRAPHOPT_KERNEL_CACHE" . 2>/dev/null; fi  # off by default: bench/kernel_cache.py builds .cubin
echo "device_bench: step $STEP done in $((SECONDS - START)) s"
exit 0
