#!/usr/bin/env bash
# The device calls the open issues still need (bench/NOTES_e2e.md and NOTES_kernels.md, 2026-12-07), one
# per run-tool call (each within its 600 s limit). The nineteenth session got an H100 for three calls at 23060c6
# (44's attention rows, 47, 46; NOTES_kernels), then refusals. What remains, in this order: ``auto`` = 50 on an
# H200 (issue 20's erf-GELU 50 MB row and attention at 4096 keys), 48 elsewhere (the LLaMA end to end with grouped
# K/V fused at fp16; 51, 53 and a first 48 ran on an H100 at 0b17732, twentieth session); then 45 (the dynamo GPT-2),
# 43 (the dynamo CNNs); 3 and 4 for the whole suite; 52 or 54 when little device time is left.
# The twenty-first session (2026-12-08) got no machine (every request refused, then "no new device machine is
# lent"): all of the above remains. Its changes ride along: 48 now measures the LLaMA with its runtime causal
# mask as causal=1 (rewrite/mask_grid.py), 45 the dynamo GPT-2 with packed Q/K/V and no head Transposes.
# The eighteenth session's notes follow. The eighteenth session's H200 ran 34, 3, 4, 40, 32's rows and
# 38's layer rows with 39 at 805f74b: every acceptance row of issues 15 and 20 is measured on an H200 at that
# commit but one (bias+GELU erf at 50 MB, 0.76 of a same-size copy). First call of a session: ``auto`` = 41 (the
# faster erf-GELU's rows and tests, and the dynamo GPT-2 export with its tied lm_head folded), then on an H200
# 3 and 4 (the whole GPU suite in halves, for the changes since 805f74b), 42 (attention at 4096 keys) and 43
# (the dynamo CNN exports), elsewhere 38 and 39.
# .cubin: bench/kernel_cache.py builds the compiled-kernel cache on this CPU machine for the device's NVRTC
# (13.0) and sm_90, so a fresh machine reads every instance instead of compiling them (~140 s on 16 cores).
# 24 and 28 are 34's parts with more (24: the GPU tests of the twelfth and thirteenth sessions' changes, which
# 22 also runs; 28: the stems part by part).
# Then 13, 5 (the CBR and GemmAct tables with torch's graph columns), 16 (the barrier rule end to end); 18 + 19 or
# 3 + 4 are the suite in halves; 25 and 26 are 24 cut for a short budget (27: 28's second step alone). Older
# numbers are kept to repeat earlier measurements.
#
#   bash bench/device_remaining.sh N "$OUT"        (N = 0..54 or auto; carry .whl, .cubin, .tuning; name nvidia-h200)
#
# .whl (the wheels the device lacks) on a fresh checkout:
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
#     --platform manylinux2014_x86_64 -d .whl nvidia-cudnn-frontend==1.32.0 onnxconverter-common onnx-graphsurgeon
# .tuning comes back from a call (tuning.tar.xz) and does not outlive the session; .cubin comes from bench/kernel_cache.py
# (a device call's own cubin.tar.xz is over the size that comes back once the cache holds every instance).
#
# Results come back named by the GPU the call got (h200 / h100): put them under bench/results/ and the
# returned cubin.tar.xz / tuning.tar.xz back into .cubin/ and .tuning/ before the next call. Partial tables
# merge into the full ones without dropping rows: e2e with `python3 bench/e2e_report.py DEST.json SRC.json...`,
# cbr_layers.py reads the full table itself (--previous), transformer tables with
# `python3 bench/transformer_kernels.py --merge MEM.json ATTN.json --previous bench/results/transformer_kernels_h200.json
# --gpu-name h200 --out bench/results` (a run of one table only: give its file for both).
set -u
N=${1:?usage: device_remaining.sh N OUT (N = 0..54 or auto)}
OUT=${2:?usage: device_remaining.sh N OUT}
export HEAD_COMMIT=${HEAD_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null)}
case "$N" in
  0)  # the change no GPU ran yet (the held softmax forms' exponent as exp2; the held rows ran on the H100 at
      # f22d389): its GPU tests (the held rows, fully masked rows, [B, S, H, D]), then the memory table
      # (softmax rows) and the BERT fp32 bs32 row whose attention takes it
    T=tests/gpu/test_attention_gpu.py  # node ids: device_bench.sh word-splits TESTS (a -k expression would break)
    TESTS="$T::test_held_softmax $T::test_fully_masked_rows $T::test_nan_and_inf_scores_give_the_references_rows $T::test_attention_candidate_reads_bshd" \
      bash bench/device_calls.sh "$OUT/t" gpu-tests:150
    TRANSFORMER_ARGS="--tables memory --dtypes float16,float32" bash bench/device_calls.sh "$OUT/m" transformer:230
    MODELS=bert DTYPES=fp32 E2E_ARGS="--rows bert:32:fp32 --measure-reserve 45" bash bench/device_calls.sh "$OUT/e" e2e-cnn:180 ;;
  1)  # issue 15: MobileNetV2 bs1's torch.compile peer and the fp32 rows (ResNet-50, BERT at bs1 and bs32), then
      # EfficientNet-B0 bs32 (the H100's row predates the global-pool kernel: its host time is the one over 15 us)
    MODELS=mobilenetv2,resnet50,bert,efficientnet_b0 DTYPES=fp16,fp32 \
    E2E_ARGS="--rows mobilenetv2:1,resnet50:1:fp32,resnet50:32:fp32,bert:1:fp32,bert:32:fp32,efficientnet_b0:32 --measure-reserve 45" \
      bash bench/device_calls.sh "$OUT" e2e-cnn:560 ;;
  2)  # issue 20 and issue 15 item 6: cold/warm tuning first (a machine's first cold tuning is the slower
      # one: 64.7 s against 45.6 s on the H100; the record's earlier_cold_runs_on_machine says which),
      # then GPU conformance and the memory-bound table (every kernel and the same-size copy graph-timed
      # since e3b0e72: the H200's table of 2026-12-04 predates that); best on a fresh machine
    CACHE_LIMIT=150 bash bench/device_calls.sh "$OUT/k" cache:200
    bash bench/device_calls.sh "$OUT/c" conformance:120
    TRANSFORMER_ARGS="--tables memory --dtypes float16" bash bench/device_calls.sh "$OUT/m" transformer:200 ;;
  3)  # issue 20: the whole GPU suite, first half
    TESTS="tests/gpu/test_[a-m]*.py" bash bench/device_calls.sh "$OUT/a" gpu-tests:560 ;;
  4)  # issue 20: the whole GPU suite, second half
    TESTS="tests/gpu/test_[n-z]*.py" bash bench/device_calls.sh "$OUT/b" gpu-tests:560 ;;
  5)  # issue 20: the CBR layer table again (stems, depthwise_nhwc), continuing from the committed rows
    bash bench/device_calls.sh "$OUT" cbr:560 ;;
  6)  # issue 20's cold bar: cold ResNet-50 with the batched timing turns (H100, fresh machine: 55.1 s),
      # then with 8 workers (45.6 s there on a machine that had run one cold tuning; 64.7 s on a fresh
      # one, NOTES_e2e); fresh tuning and kernel caches each
    CACHE_LIMIT=150 CACHE_ARGS="--models resnet50" bash bench/device_calls.sh "$OUT/l" cache:190
    mkdir -p /tmp/device_calls/w8
    GRAPHOPT_TUNE_WORKERS=8 CACHE_LIMIT=150 CACHE_ARGS="--models resnet50 --out /tmp/device_calls/w8/cache_speed_w8.json" \
      bash bench/device_calls.sh "$OUT/w" cache:190 ;;
  7)  # cold ResNet-50 with CUDA's eager module loading (refuted on the H100: 70.2 s, the cuDNN plans'
      # first executions are not lazy module loads; NOTES_e2e)
    mkdir -p /tmp/device_calls/eager
    CUDA_MODULE_LOADING=EAGER CACHE_LIMIT=150 CACHE_ARGS="--models resnet50 --out /tmp/device_calls/eager/cache_speed_eager.json" \
      bash bench/device_calls.sh "$OUT/e" cache:190 ;;
  8)  # issue 15 on the H200 in one call: call 1's rows (its EfficientNet-B0 bs32 row is an H100 matter:
      # the H200's, 13.7 us/node, passes), then the GPU conformance table
    MODELS=mobilenetv2,resnet50,bert DTYPES=fp16,fp32 \
    E2E_ARGS="--rows mobilenetv2:1,resnet50:1:fp32,resnet50:32:fp32,bert:1:fp32,bert:32:fp32 --measure-reserve 45" \
      bash bench/device_calls.sh "$OUT/e" e2e-cnn:460
    bash bench/device_calls.sh "$OUT/c" conformance:100 ;;
  9)  # is a machine's first cold tuning slow because the driver JIT-compiles cuDNN's kernels (273 modules in one
      # cold ResNet-50 on the H100, NOTES_e2e)? Three cold runs on one machine, graphopt's caches fresh each
      # time: the first; one with the driver's JIT cache emptied; one with it kept. The second against the
      # third is the JIT cache's share, the first against the second the rest of a fresh machine's penalty.
    for run in first emptied kept; do
      [ "$run" = emptied ] && rm -rf ~/.nv/ComputeCache
      mkdir -p /tmp/device_calls/$run
      CACHE_LIMIT=150 CACHE_ARGS="--models resnet50 --out /tmp/device_calls/$run/cache_speed_jit_$run.json" \
        bash bench/device_calls.sh "$OUT/$run" cache:180
    done ;;
  10) # ran on a fresh H100 at 29889f8 (NOTES_e2e, sixth session): is the rest of a fresh machine's first-cold-run
      # penalty reading cuDNN / cuBLAS / NVRTC from disk? Cold ResNet-50 runs on one machine: as found, then
      # with those libraries evicted from the page cache and the JIT and CuPy caches emptied, twice (at
      # 29889f8 the two runs compared graphopt reading the libraries ahead, off and on: it changed nothing,
      # 40.4 s against 41.5, and was removed)
    for run in found evicted evicted2; do
      if [ "$run" != found ]; then
        python3 bench/page_cache.py evict --json /tmp/device_calls/evict_$run.json
        rm -rf ~/.nv/ComputeCache ~/.cupy/kernel_cache
      fi
      mkdir -p /tmp/device_calls/$run
      python3 bench/page_cache.py resident
      CACHE_LIMIT=150 CACHE_ARGS="--models resnet50 --out /tmp/device_calls/$run/cache_speed_fresh_$run.json" \
        bash bench/device_calls.sh "$OUT/$run" cache:170
      python3 bench/page_cache.py resident
    done ;;
  11) # the H200 with about 400 s: what no other call gave yet, shortest first: GPU conformance (issue 15
      # item 6), the cold / warm ResNet-50 with brief timing (issue 20's bar), then call 8's e2e rows
    bash bench/device_calls.sh "$OUT/c" conformance:90
    CACHE_LIMIT=120 CACHE_ARGS="--models resnet50" bash bench/device_calls.sh "$OUT/k" cache:140
    MODELS=mobilenetv2,resnet50,bert DTYPES=fp16,fp32 \
    E2E_ARGS="--rows mobilenetv2:1,resnet50:1:fp32,resnet50:32:fp32,bert:1:fp32,bert:32:fp32 --measure-reserve 45" \
      bash bench/device_calls.sh "$OUT/e" e2e-cnn:${E2E_S:-300} ;;
  12) # issue 20's attention bar with SDPA timed inside a CUDA graph like graphopt's choice (since 3046fea; the
      # H200's 15 of 16 had SDPA timed eagerly, ~2.5 us a call more than every margin; NOTES_kernels), torch's
      # backends forced one by one, and graphopt's choice with and without its stream barrier (eighth session)
    TRANSFORMER_ARGS="--tables attention" bash bench/device_calls.sh "$OUT/a" transformer:300 ;;
  13) # issue 20's CBR and GemmAct tables from scratch with torch's same ops also timed in a CUDA graph (since
      # aef1455; NOTES_kernels): this call drops the committed CBR rows on the device's copy of the tree;
      # commit the returned cbr_layers_<gpu>.json, then call 5 continues from it
    rm -f bench/results/cbr_layers_h200.json bench/results/cbr_layers_h100.json
    bash bench/device_calls.sh "$OUT/g" gemm:150
    bash bench/device_calls.sh "$OUT/r" cbr:400 ;;
  14) # which library launches start early (programmatic edges in a capture of each lowering without its
      # barrier). Ran at 8ee61e3 on an H100 with the first plan of each family (NOTES_kernels, tenth session:
      # only cuDNN's runtime-compiled matmul); now up to 24 plans of each vendor family, ResNet-50's layer4
      # conv+residual (the H200 race) included: whether the plans the tuner picks may run without a barrier
    EARLY_ARGS="--vendor-per-family 24" bash bench/device_calls.sh "$OUT/p" early-start:240 ;;
  15) # the attention bar with the runtime's barrier rule (graphopt.runtime.ordering, tenth session): which launches
      # start early (call 14), the rule's correctness (whole-graph replays equal eager, barriers dropped and
      # kept; ResNet-50's capture diagnosis), then the attention table with the placed timing
      # (bench/placed_timing.py: graphopt's choice and SDPA each after the same ordinary launch)
    bash bench/device_calls.sh "$OUT/p" early-start:100
    bash bench/device_calls.sh "$OUT/o" ordering:200
    TRANSFORMER_ARGS="--tables attention" bash bench/device_calls.sh "$OUT/a" transformer:${ATTN_S:-270} ;;
  16) # the barrier rule end to end (prediction in NOTES_kernels, tenth session: GPT-2 bs1 3-7 % faster, ResNet-50
      # unchanged): each e2e row now also times the model with every barrier kept, paired with the default
    MODELS=gpt2,bert,resnet50 DTYPES=fp16 E2E_ARGS="--rows gpt2:1,bert:1,resnet50:32 --measure-reserve 45" \
      bash bench/device_calls.sh "$OUT/e" e2e-transformers:560 ;;
  17) # the measured barrier (graphopt.lowering.early_start, opt-in GRAPHOPT_MEASURE_BARRIERS=1; NOTES_kernels, tenth
      # session): its GPU tests and the replays with it (the ordering step), the probe's library reading beside
      # its own for up to 24 plans a family, then the attention table with it on (the tuner's own figure, the
      # chosen plan back to back, then runs without the barrier wherever the plan cannot start early)
    bash bench/device_calls.sh "$OUT/o" ordering:150
    EARLY_ARGS="--vendor-per-family 24" bash bench/device_calls.sh "$OUT/p" early-start:150
    GRAPHOPT_MEASURE_BARRIERS=1 TRANSFORMER_ARGS="--tables attention" bash bench/device_calls.sh "$OUT/a" transformer:270 ;;
  18) # the H200 in three calls of under 600 s (eleventh session: ~1,600 s of device time left): the GPU suite's
      # first half (issue 15's last item; 149 s on the H100), then the two stems of the CBR table (the only
      # H200 misses at bs32; the H100 re-run, cbr_layers_h100.md, own stem kernel, passes both)
    TESTS="tests/gpu/test_[a-m]*.py" bash bench/device_calls.sh "$OUT/a" gpu-tests:300
    CBR_ARGS="--only r50.stem,mv2.stem" bash bench/device_calls.sh "$OUT/r" cbr:260 ;;
  19) # the GPU suite's second half (354 s on the H100), then the memory-bound table (fp16)
    TESTS="tests/gpu/test_[n-z]*.py" bash bench/device_calls.sh "$OUT/b" gpu-tests:400
    TRANSFORMER_ARGS="--tables memory --dtypes float16" bash bench/device_calls.sh "$OUT/m" transformer:170 ;;
  20) # the attention bar with the placed timing, then GPT-2 cold / warm (the H200's last cold bar not measured)
    TRANSFORMER_ARGS="--tables attention" bash bench/device_calls.sh "$OUT/t" transformer:300
    CACHE_LIMIT=150 CACHE_ARGS="--models gpt2" bash bench/device_calls.sh "$OUT/k" cache:260 ;;
  21) # any GPU: cuBLASLt's im2col variant for image stems (eleventh session): its GPU tests, then the two stems of
      # the CBR table with it among the candidates (prediction in graphopt/providers/cublaslt.py: ResNet-50's stem
      # at bs32 ~80-90 us against cuDNN's 192 on the H100), then the measured barrier's GPU tests and replays
    TESTS="tests/gpu/test_provider_cublaslt.py" PYTEST_ARGS="-k im2col" bash bench/device_calls.sh "$OUT/i" gpu-tests:120
    CBR_ARGS="--only r50.stem,mv2.stem" bash bench/device_calls.sh "$OUT/r" cbr:240
    bash bench/device_calls.sh "$OUT/o" ordering:150 ;;
  22) # the H200 with one call's time: the whole GPU suite in one step (488 s of tests on the H100 at 8ee61e3, 540 s at
      # bf317c9, ~200 tests more since; cut at ~98.5 % by its 585 s on the H100 at 8d93194), cut by its own limit before
      # the run tool's; the 30 slowest tests listed (3 + 4 run it in halves, each within one call)
    PYTEST_ARGS="--durations=30" bash bench/device_calls.sh "$OUT/s" gpu-tests:585 ;;
  23) # call 21 for a budget of ~300 s: the im2col variant's GPU tests, then the two stems at bs32 only
    TESTS="tests/gpu/test_provider_cublaslt.py" PYTEST_ARGS="-k im2col" bash bench/device_calls.sh "$OUT/i" gpu-tests:90
    BATCHES=32 CBR_ARGS="--only r50.stem,mv2.stem" bash bench/device_calls.sh "$OUT/r" cbr:${CBR_S:-180} ;;
  24) # the twelfth and thirteenth sessions' changes (~450 s): the GPU tests of cudnn_split / cudnn_split_cpad, of the
      # capture helper the cuDNN CBR tests now share, of the measured barrier (the GPT-2 test now checks the replays
      # first), of the fp16 erf-GELU pass (per element and through cublaslt_act), of the held softmax (its exp, max
      # and store without special-value tests, thirteenth session); the two stems with cudnn_split among the
      # candidates (prediction in NOTES_kernels: ResNet-50's at bs32 160-180 us against torch channels_last's
      # 189.0); the bias+GELU and softmax rows of the memory table (predictions: 268 MB bias+GELU 72-78 us, the
      # BERT-base s128 softmax 10.1 -> 8.4-9.3 us; the vector epilogue with two loads a thread timed beside it,
      # fifteenth session); the attention table with the measured barrier is call 28
    G=tests/gpu
    A=$G/test_attention_gpu.py
    TESTS="$G/test_cudnn_split_gpu.py $G/test_cudnn_cpad_gpu.py $G/test_cudnn_provider_gpu.py::test_a_plan_captures_in_a_cuda_graph_and_replays $G/test_early_start_gpu.py $G/test_gemm_act_gpu.py::test_the_vector_pass_gelu_per_element $G/test_gemm_act_gpu.py::test_two_loads_a_thread_match_one $G/test_provider_cublaslt.py::test_act_variant_for_activations_without_an_epilogue $A::test_held_softmax $A::test_vector_softmax $A::test_fully_masked_rows $A::test_nan_and_inf_scores_give_the_references_rows $A::test_rows_masked_with_a_finite_fill_are_uniform $A::test_attention_candidate_reads_bshd $G/test_provider_cublaslt.py::test_im2col_variant_for_image_stems $G/test_provider_cublaslt.py::test_im2col_variant_captures_its_packing" \
      bash bench/device_calls.sh "$OUT/i" gpu-tests:220
    CBR_ARGS="--only r50.stem,mv2.stem" bash bench/device_calls.sh "$OUT/r" cbr:110
    TRANSFORMER_ARGS="--tables memory --kernels gelu,softmax --dtypes float16" bash bench/device_calls.sh "$OUT/m" transformer:120 ;;
  25) # call 24 for ~300 s of device time: its GPU tests and the memory rows (no stems)
    G=tests/gpu
    A=$G/test_attention_gpu.py
    TESTS="$G/test_cudnn_split_gpu.py $G/test_gemm_act_gpu.py::test_the_vector_pass_gelu_per_element $A::test_held_softmax $A::test_fully_masked_rows $A::test_nan_and_inf_scores_give_the_references_rows" \
      bash bench/device_calls.sh "$OUT/i" gpu-tests:150
    TRANSFORMER_ARGS="--tables memory --kernels gelu,softmax --dtypes float16" bash bench/device_calls.sh "$OUT/m" transformer:110 ;;
  26) # the twelfth session's last ~250 s of device time: cudnn_split's, the GELU pass's and the measured barrier's
      # GPU tests (no prebuild: they compile what they use), then the two stems at bs32 (budget 40 s); the
      # kernel cache is not re-packed (over the size that comes back). The bias+GELU rows stay for call 24.
    G=tests/gpu
    export PACK_CUBIN=0
    PREBUILD=0 TESTS="$G/test_cudnn_split_gpu.py $G/test_gemm_act_gpu.py::test_the_vector_pass_gelu_per_element $G/test_early_start_gpu.py" \
      bash bench/device_calls.sh "$OUT/i" gpu-tests:95
    BATCHES=32 CBR_ARGS="--only r50.stem,mv2.stem" bash bench/device_calls.sh "$OUT/r" cbr:90 ;;
  27) # why the stems miss (after 24): each part of ResNet-50's and MobileNetV2's stems at bs32 beside torch's parts
      # (bench/stem_breakdown.py): cuDNN's convolution alone, the bias + activation pass, im2col's packing and GEMM
    bash bench/device_calls.sh "$OUT/s" stem-breakdown:200 ;;
  28) # after 24: the attention table with the measured barrier on (call 17's last step); then the two rows issue
      # 15 holds to 0.8 of torch.compile, ResNet-50 bs32 (0.790 paired on the H200 before im2col's stem, which the
      # H100 measured at 142 us against the fused cuDNN plan's 194: 0.747 there) and GPT-2 bs1; then the stems
      # part by part (call 27) with what is left
    PACK_CUBIN=0 GRAPHOPT_MEASURE_BARRIERS=1 TRANSFORMER_ARGS="--tables attention" bash bench/device_calls.sh "$OUT/a" transformer:${ATTN_S:-210}
    MODELS=resnet50,gpt2 DTYPES=fp16 E2E_ARGS="--rows resnet50:32,gpt2:1 --measure-reserve 45" bash bench/device_calls.sh "$OUT/e" e2e-cnn:${E2E_S:-200}
    PACK_CUBIN=0 bash bench/device_calls.sh "$OUT/s" stem-breakdown:${BREAKDOWN_S:-80} ;;
  29) # the stems on any GPU (thirteenth session): im2col's packing through a shared-memory tile (its GPU tests, then the
      # stem breakdown: prediction 234.9 -> 50-90 us for the packing on the H100), why torch's convolution alone beats
      # every cuDNN plan graphopt is offered for ResNet-50's stem (84.5 us against 192.4 on the H100,
      # stem_breakdown_h100_34c2a8f: torch's kernels, every engine id of the conv-only graph, every heuristic plan
      # without graphopt's inexact-notes filter), and the early-start test fixed after 34c2a8f
    G=tests/gpu
    PACK_CUBIN=0 PREBUILD=0 TESTS="$G/test_provider_cublaslt.py::test_im2col_variant_for_image_stems $G/test_provider_cublaslt.py::test_im2col_variant_captures_its_packing $G/test_early_start_gpu.py $G/test_attention_gpu.py::test_rows_masked_with_a_finite_fill_are_uniform $G/test_attention_gpu.py::test_held_softmax" \
      bash bench/device_calls.sh "$OUT/t" gpu-tests:${TESTS_S:-150}
    PACK_CUBIN=0 bash bench/device_calls.sh "$OUT/s" stem-breakdown:${BREAKDOWN_S:-120}
    PACK_CUBIN=0 PREBUILD=0 bash bench/device_calls.sh "$OUT/e" stem-engines:${ENGINES_S:-200} ;;
  30) # why torch's run of cuDNN engine 47 (TILE_SIZE=2, LDGA=0, TILEK=2, STAGES=0, LDGC=1) on ResNet-50's stem takes
      # 61 us and graphopt's run of the same engine and knobs ~200 (H100, fourteenth session, NOTES_kernels): both
      # executions under cuDNN's API log, the diff of their descriptors (prediction: the tensors' byte alignment,
      # 32 for torch), and the configuration timed with the tensors declared 16 and 32 (~40 s a stem); then
      # cudnn_split_a32 (the split form with that declaration, since removed): its GPU tests, and the two stems' CBR rows
      # (prediction, NOTES_kernels: ResNet-50's stem at bs32 ~106 us on the H100 if the declaration is the key)
    PACK_CUBIN=0 PREBUILD=0 ENGINE_ARGS="--torch-plan-only --only r50.stem,mv2.stem" \
      bash bench/device_calls.sh "$OUT/d" stem-engines:${ENGINES_S:-160}
    PACK_CUBIN=0 PREBUILD=0 TESTS="tests/gpu/test_cudnn_split_gpu.py" bash bench/device_calls.sh "$OUT/t" gpu-tests:${TESTS_S:-200}
    CBR_ARGS="--only r50.stem,mv2.stem" bash bench/device_calls.sh "$OUT/r" cbr:${CBR_S:-120} ;;
  31) # after 30: do cuDNN's fused CBR plans also pick other kernels with the tensors declared 32-byte aligned?
      # (bench/align_probe.py, eight layers, the first 4 plans each, ~3 min; prediction in NOTES_kernels)
    PACK_CUBIN=0 PREBUILD=0 bash bench/device_calls.sh "$OUT/p" align-probe:${ALIGN_S:-300} ;;
  32) # depthwise_nhwc's forms (NOTES_kernels: the fourteenth session's tiled form, refuted on the H100; the sixteenth
      # session's conflict-free weight tile and held-register forms, predicted to take MobileNetV2's ten bs32
      # depthwise layers from 308.8 to 200-250 us on the H100): their GPU tests, the depthwise rows of the CBR
      # table, then MobileNetV2 bs32 end to end against torch.compile (0.99 paired on the H200 before them)
    PACK_CUBIN=0 PREBUILD=0 TESTS="tests/gpu/test_cbr_gpu.py" PYTEST_ARGS="-k depthwise" bash bench/device_calls.sh "$OUT/t" gpu-tests:${TESTS_S:-200}
    PACK_CUBIN=0 CBR_ARGS="--batches 32 --only mv2.b0.dw,mv2.s1.0.dw,mv2.s1.1.dw,mv2.s2.0.dw,mv2.s2.1.dw,mv2.s3.1.dw,mv2.s4.1.dw,mv2.s5.1.dw" \
      bash bench/device_calls.sh "$OUT/r" cbr:${CBR_S:-150}
    MODELS=mobilenetv2 DTYPES=fp16 E2E_ARGS="--rows mobilenetv2:32 --measure-reserve 45" bash bench/device_calls.sh "$OUT/e" e2e-cnn:${E2E_S:-200} ;;
  33) # any GPU (fifteenth session, NOTES_kernels): the model's own end pads in cuDNN's convolution and the stems'
      # plans noted REDUCED_PRECISION_REDUCTION: does engine 63 (torch's first-layer engine) build for ResNet-50's
      # stem on graphopt's graph now, with what error; the cuDNN provider's and split form's GPU tests (every
      # graph's padding changed); the stems and the stride-2 layers (their end pad was 0, now 1) at bs1 and bs32.
      # Prediction: ResNet-50's stem ~106 us at bs32 on the H100 (cudnn_split on engine 63; im2col 142.6),
      # the stride-2 layers within +-3 %
    PACK_CUBIN=0 PREBUILD=0 ENGINE_ARGS="--torch-plan-only --only r50.stem" \
      bash bench/device_calls.sh "$OUT/d" stem-engines:${ENGINES_S:-100}
    PACK_CUBIN=0 PREBUILD=0 TESTS="tests/gpu/test_cudnn_provider_gpu.py tests/gpu/test_cudnn_split_gpu.py" \
      bash bench/device_calls.sh "$OUT/t" gpu-tests:${TESTS_S:-200}
    CBR_ARGS="--only r50.stem,mv2.stem,r50.l2.c2s2,r50.l3.c2s2,r50.l4.c2s2,mv2.s1.0.dw,mv2.s2.0.dw" \
      bash bench/device_calls.sh "$OUT/r" cbr:${CBR_S:-150} ;;
  34) # the H200's acceptance rows that changed since it last ran (556fae7), in one call of ~560 s: the two stems at
      # bs32 (issue 20's one CBR miss there, r50.stem; im2col and engine 63 since), the bias+GELU and softmax rows
      # (the two memory rows under 0.8 of a same-size copy there), the attention table with the measured barrier
      # (four placed rows above 1.000 there), then ResNet-50 bs32 and GPT-2 bs1 end to end (issue 15's 0.8 rows).
      # With 22 (the whole GPU suite) it is what both issues still need measured on an H200.
    BATCHES=32 PACK_CUBIN=0 CBR_ARGS="--only r50.stem,mv2.stem" bash bench/device_calls.sh "$OUT/r" cbr:${CBR_S:-100}
    PACK_CUBIN=0 PREBUILD=0 TRANSFORMER_ARGS="--tables memory --kernels gelu,softmax --dtypes float16" \
      bash bench/device_calls.sh "$OUT/m" transformer:${MEM_S:-80}
    PACK_CUBIN=0 PREBUILD=0 GRAPHOPT_MEASURE_BARRIERS=1 TRANSFORMER_ARGS="--tables attention" \
      bash bench/device_calls.sh "$OUT/a" transformer:${ATTN_S:-170}
    MODELS=resnet50,gpt2 DTYPES=fp16 E2E_ARGS="--rows resnet50:32,gpt2:1 --measure-reserve 45" \
      bash bench/device_calls.sh "$OUT/e" e2e-cnn:${E2E_S:-220} ;;
  35) # any GPU (fifteenth session): where MobileNetV2's bs32 depthwise layers spend their time (NOTES_kernels: the
      # tiled form removed the re-reads and the index arithmetic and mv2.s1.1.dw stayed at 67.7 us against a 19.4 us
      # floor): every depthwise_nhwc form timed on three layers (the per-pixel ones also with their grid capped at
      # 2048, 1056 and 528 blocks: prediction in NOTES_kernels), then Nsight Compute's counters for mv2.s1.1.dw
      mkdir -p "$OUT/dw"
      PYTHONPATH=. timeout -k 10 ${DW_S:-180} python3 bench/dw_profile.py --out "$OUT/dw" 2>&1 | tail -20
      PYTHONPATH=. timeout -k 10 ${NCU_S:-240} ncu --clock-control none --kernel-name regex:depthwise --launch-count 24 \
        --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy --section SchedulerStats \
        --section WarpStateStats --section LaunchStats --csv --log-file "$OUT/dw/ncu_mv2_s1_1_dw.csv" \
        python3 bench/dw_profile.py --out "$OUT/dw" --ncu --layers mv2.s1.1.dw 2>&1 | tail -20
      echo "dw_profile: $(ls "$OUT/dw" | wc -l) files" ;;
  36) # any GPU, ~100 s on a warm cache (sixteenth session, NOTES_kernels): depthwise_nhwc's GPU tests, then every
      # form timed on three MobileNetV2 bs32 layers (the conflict-free weight tile, the interior path without
      # per-tap checks and the one-dispatch activation; prediction: mv2.s1.1.dw 58.7 -> 40-48 us on the H100)
    PACK_CUBIN=0 PREBUILD=0 TESTS="tests/gpu/test_cbr_gpu.py" PYTEST_ARGS="-k depthwise" bash bench/device_calls.sh "$OUT/t" gpu-tests:${TESTS_S:-140}
    mkdir -p "$OUT/dw"
    PYTHONPATH=. timeout -k 10 ${DW_S:-150} python3 bench/dw_profile.py --out "$OUT/dw" --caps 4096,1056 2>&1 | tail -40
    echo "dw_profile: $(ls "$OUT/dw" | wc -l) files" ;;
  37) # 34 without its end-to-end rows, for a budget of ~400 s on an H200: the two stems at bs32, the bias+GELU and
      # softmax rows, the attention table with the measured barrier
    BATCHES=32 PACK_CUBIN=0 CBR_ARGS="--only r50.stem,mv2.stem" bash bench/device_calls.sh "$OUT/r" cbr:${CBR_S:-100}
    PACK_CUBIN=0 PREBUILD=0 TRANSFORMER_ARGS="--tables memory --kernels gelu,softmax --dtypes float16" \
      bash bench/device_calls.sh "$OUT/m" transformer:${MEM_S:-80}
    PACK_CUBIN=0 PREBUILD=0 GRAPHOPT_MEASURE_BARRIERS=1 TRANSFORMER_ARGS="--tables attention" \
      bash bench/device_calls.sh "$OUT/a" transformer:${ATTN_S:-170} ;;
  38) # any GPU, ~500 s (seventeenth session, NOTES_kernels): the GPU tests the cut suite (22 at 8d93194) did not
      # reach and the two-loads test with its normwise fp32 bound; the one-dispatch activation in stem_conv and
      # direct_conv, measured nowhere yet (prediction: mv2.stem bs32 5-15 % faster than 54.9 us, the direct_k3 bs1
      # depthwise rows 5-15 %); then ResNet-50 bs32 and GPT-2 bs1 end to end (the stem's ~60 us on the H100)
    G=tests/gpu
    PACK_CUBIN=0 PREBUILD=0 TESTS="$G/test_gemm_act_gpu.py::test_two_loads_a_thread_match_one $G/test_runtime_gpu.py $G/test_timing_rotation_gpu.py $G/test_transformer_tuning_gpu.py $G/test_tune_gpu.py" \
      PYTEST_ARGS="--durations=15" bash bench/device_calls.sh "$OUT/t" gpu-tests:${TESTS_S:-180}
    PACK_CUBIN=0 CBR_ARGS="--batches 1,32 --only mv2.stem,mv2.b0.dw,mv2.s1.0.dw,mv2.s1.1.dw,mv2.s2.0.dw,mv2.s2.1.dw,mv2.s3.0.dw,mv2.s3.1.dw,mv2.s4.1.dw,mv2.s5.0.dw,mv2.s5.1.dw" \
      bash bench/device_calls.sh "$OUT/r" cbr:${CBR_S:-100}
    MODELS=resnet50,gpt2 DTYPES=fp16 E2E_ARGS="--rows resnet50:32,gpt2:1 --measure-reserve 45" \
      bash bench/device_calls.sh "$OUT/e" e2e-cnn:${E2E_S:-220} ;;
  39) # any GPU, ~120 s (seventeenth session, NOTES_kernels): what holds depthwise_nhwc now. Its instructions an
      # output fell by roughly half (SASS) and mv2.s1.1.dw only 58.7 -> 49.4 us: Nsight Compute's issue rate,
      # warp stalls and occupancy of every form on mv2.s1.1.dw (at 3ea205c: issue-bound, 0.74 a scheduler)
    mkdir -p "$OUT/dw"
    PYTHONPATH=. timeout -k 10 ${NCU_S:-240} ncu --clock-control none --kernel-name regex:depthwise --launch-count 24 \
      --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy --section SchedulerStats \
      --section WarpStateStats --section LaunchStats --section InstructionStats --csv --log-file "$OUT/dw/ncu_mv2_s1_1_dw.csv" \
      python3 bench/dw_profile.py --out "$OUT/dw" --ncu --layers mv2.s1.1.dw 2>&1 | tail -20
    xz -T0 -9 "$OUT/dw/ncu_mv2_s1_1_dw.csv" 2>/dev/null
    echo "dw_profile: $(ls "$OUT/dw" | wc -l) files" ;;
  40) # any GPU, ~350 s (seventeenth session, NOTES_e2e): fold_transposes on a dynamo export. GPT-2 exported by the
      # dynamo exporter (bench/torch_models.py VARIANTS) beside the TorchScript export, bs1 and bs32 fp16 in one
      # call: before the pass four Transposes a layer stayed around its attention, now none (prediction:
      # gpt2_dynamo within 0.05 ms of gpt2 at bs1, where 48 copies would have cost 0.10-0.15 ms on the H200)
    MODELS=gpt2_dynamo,gpt2 DTYPES=fp16 E2E_ARGS="--rows gpt2_dynamo:1,gpt2:1,gpt2_dynamo:32 --measure-reserve 45" \
      bash bench/device_calls.sh "$OUT/e" e2e-transformers:${E2E_S:-400} ;;
  41) # best on an H200, ~540 s (eighteenth session, NOTES_kernels / NOTES_e2e): what 805f74b's H200 run left.
      # The erf-GELU for 16-bit outputs as one ex2 of a fitted erfc (prediction: the 50 MB row 18.0 -> 15.3-16.0 us,
      # 0.86-0.90 of a same-size copy, the only memory row under 0.8 there): its GPU tests (GELU values, two loads,
      # GemmAct's activations), the bias+GELU rows; then GPT-2's dynamo export with its tied lm_head folded
      # (prediction: within 0.05 ms of gpt2 at bs1 and 0.2 ms at bs32, from 0.835 / 5.196 ms).
    G=tests/gpu/test_gemm_act_gpu.py
    PACK_CUBIN=0 TESTS="$G::test_the_vector_pass_gelu_per_element $G::test_two_loads_a_thread_match_one $G::test_gemm_activation" \
      bash bench/device_calls.sh "$OUT/t" gpu-tests:${TESTS_S:-150}
    PACK_CUBIN=0 PREBUILD=0 TRANSFORMER_ARGS="--tables memory --kernels gelu --dtypes float16" \
      bash bench/device_calls.sh "$OUT/m" transformer:${MEM_S:-60}
    MODELS=gpt2_dynamo,gpt2 DTYPES=fp16 E2E_ARGS="--rows gpt2_dynamo:1,gpt2:1,gpt2_dynamo:32 --measure-reserve 45" \
      bash bench/device_calls.sh "$OUT/e" e2e-transformers:${E2E_S:-330} ;;
  42) # any GPU, ~250 s (eighteenth session): the attention rows at 4096 keys, which 805f74b's H200 run skipped for
      # its time budget (at 556fae7 two of the four were 0.3 / 0.9 % slower back to back), with the measured barrier as 34 runs it
    PACK_CUBIN=0 GRAPHOPT_MEASURE_BARRIERS=1 TRANSFORMER_ARGS="--tables attention --seqs 4096" \
      bash bench/device_calls.sh "$OUT/a" transformer:${ATTN_S:-240} ;;
  44) # best on an H200, ~460 s (nineteenth session): issue 20's two unmeasured acceptance rows first, for a
      # session whose checkout lost .cubin and .tuning (41's e2e part tunes cold, so it waits for a rebuilt .cubin):
      # 41's erf-GELU GPU tests and bias+GELU rows, then 42's attention rows at 4096 keys
    G=tests/gpu/test_gemm_act_gpu.py
    PACK_CUBIN=0 TESTS="$G::test_the_vector_pass_gelu_per_element $G::test_two_loads_a_thread_match_one $G::test_gemm_activation" \
      bash bench/device_calls.sh "$OUT/t" gpu-tests:${TESTS_S:-150}
    PACK_CUBIN=0 PREBUILD=0 TRANSFORMER_ARGS="--tables memory --kernels gelu --dtypes float16" \
      bash bench/device_calls.sh "$OUT/m" transformer:${MEM_S:-60}
    PACK_CUBIN=0 GRAPHOPT_MEASURE_BARRIERS=1 TRANSFORMER_ARGS="--tables attention --seqs 4096" \
      bash bench/device_calls.sh "$OUT/a" transformer:${ATTN_S:-240} ;;
  45) # any GPU, ~330 s: 41's e2e part alone (GPT-2's dynamo export beside the TorchScript one), after 44
    MODELS=gpt2_dynamo,gpt2 DTYPES=fp16 E2E_ARGS="--rows gpt2_dynamo:1,gpt2:1,gpt2_dynamo:32 --measure-reserve 45" \
      bash bench/device_calls.sh "$OUT/e" e2e-transformers:${E2E_S:-330} ;;
  46) # any GPU, ~400 s (nineteenth session): the GPU test files that exercise what changed since 805f74b's whole-suite
      # run (its 10,050 tests passed on the H200): the erf-GELU epilogue (GemmAct, the new ops' kernels), the K
      # attention without a transpose (k_transposed=0, own kernels and cuDNN), grouped K/V (kv_groups), the fp16
      # runtime's saturating cast.
      # Steps 3 and 4 are the whole suite
    TESTS="tests/gpu/test_gemm_act_gpu.py tests/gpu/test_new_op_kernels.py tests/gpu/test_attention_gpu.py tests/gpu/test_provider_cudnn_attn_norm.py tests/gpu/test_runtime_gpu.py" \
      bash bench/device_calls.sh "$OUT/g" gpu-tests:${TESTS_S:-400} ;;
  47) # best on an H200, ~420 s (nineteenth session, NOTES_kernels): grouped-query attention (kv_groups, rule
      # attention_grouped_kv), never run on a GPU: its GPU tests (every own candidate after the head repeat, cuDNN's
      # plans on grouped K/V), then the attention table at kv_groups 4 (16 query heads, 4 K/V heads) against SDPA
      # with enable_gqa (prediction: cuDNN's plan reads the grouped heads, at most SDPA's time and within 5 % of the
      # plain rows of the same shape, 68.3 / 218.5 us at hd 128; the two repeat_kv copies it saves, ~84 MB at either
      # length, would take ~20 us more)
    A=tests/gpu/test_attention_gpu.py C=tests/gpu/test_provider_cudnn_attn_norm.py
    PACK_CUBIN=0 PREBUILD=0 TESTS="$A::test_attention_candidate_reads_grouped_kv $C::test_attention_plans_for_every_form" \
      bash bench/device_calls.sh "$OUT/t" gpu-tests:${TESTS_S:-170}
    PACK_CUBIN=0 GRAPHOPT_MEASURE_BARRIERS=1 TRANSFORMER_ARGS="--tables attention --kv-groups 4 --seqs 512,2048" \
      bash bench/device_calls.sh "$OUT/g" transformer:${ATTN_S:-230} ;;
  48) # any GPU, ~500 s (nineteenth session, NOTES_e2e): a LLaMA end to end (bench/torch_models.py "llama": TinyLlama-1.1B's
      # layer shape, 32 query and 4 K/V heads, 4 layers, seq 128; dynamo export, torch's default), whose grouped-query
      # attention, RMSNorm, RoPE and SwiGLU all fuse (prediction: graphopt / torch.compile 0.7-0.9 at bs1, launch-bound
      # like GPT-2's 0.74; 0.9-1.05 at bs32, where ~2 TFLOP of GEMMs dominate both)
    MODELS=llama_dynamo DTYPES=fp16 E2E_ARGS="--rows llama_dynamo:1,llama_dynamo:32 --measure-reserve 45" \
      bash bench/device_calls.sh "$OUT/e" e2e-transformers:${E2E_S:-500} ;;
  49) # any GPU, ~120 s (nineteenth session, NOTES_kernels): the host-overhead test's one failure on an H100 at 23060c6
      # (gpt2_dynamo_op18, 20.4 us per node, bar 15): host time by op and the steps that wait for the device, then
      # the test itself
    timeout 150 python3 bench/host_per_op.py --out "$OUT" 2>&1 | tail -20
    timeout 120 python3 -m pytest -q -p no:cacheprovider "tests/gpu/test_runtime_gpu.py::test_host_overhead_per_node_without_cuda_graphs" -s 2>&1 \
      | tee "$OUT/host_overhead_test.txt" | tail -12 ;;
  50) # an H200, ~420 s (nineteenth session): issue 20's two rows no H200 has measured at HEAD, without step 44's GPU tests
      # (the erf-GELU's passed on an H100 at 23060c6) and with time for a fresh machine's compiles: the bias+GELU rows
      # (prediction: the 50 MB erf row 18.0 -> 15.3-16.0 us, 0.86-0.90 of a same-size copy), then attention at 4096 keys
    PACK_CUBIN=0 PREBUILD=0 TRANSFORMER_ARGS="--tables memory --kernels gelu --dtypes float16" \
      bash bench/device_calls.sh "$OUT/m" transformer:${MEM_S:-150}
    PACK_CUBIN=0 GRAPHOPT_MEASURE_BARRIERS=1 TRANSFORMER_ARGS="--tables attention --seqs 4096" \
      bash bench/device_calls.sh "$OUT/a" transformer:${ATTN_S:-240} ;;
  51) # not an H200, ~450 s: the host-overhead diagnosis (49), then grouped-query attention's tests and rows again (47)
      # for the repeat's strided copies (repeat_copies), which no GPU has run
    bash "$0" 49 "$OUT"
    TESTS_S=${TESTS_S:-170} ATTN_S=${ATTN_S:-200} bash "$0" 47 "$OUT" ;;
  52) # ~200 s, for a call with little device time left (nineteenth session): on an H200 the bias+GELU rows (issue 20's
      # erf row at 50 MB, step 50's first half); elsewhere the grouped-query tests, for the repeat's strided copies
    case "$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)" in
      *H200*) PACK_CUBIN=0 PREBUILD=0 TRANSFORMER_ARGS="--tables memory --kernels gelu --dtypes float16" \
                bash bench/device_calls.sh "$OUT/m" transformer:${MEM_S:-170} ;;
      *) PACK_CUBIN=0 PREBUILD=0 TESTS="tests/gpu/test_attention_gpu.py::test_attention_candidate_reads_grouped_kv tests/gpu/test_provider_cudnn_attn_norm.py::test_grouped_kv_plans_on_repeated_heads tests/gpu/test_provider_cudnn_attn_norm.py::test_grouped_sdpa_captures_in_a_cuda_graph" \
           bash bench/device_calls.sh "$OUT/t" gpu-tests:${TESTS_S:-170} ;;
    esac ;;
  53) # any GPU, ~300 s (twentieth session): SkipRMSNorm (RMSNorm's skip input and sum output, rule skip_rmsnorm(_sum))
      # and RoPE reading the head split ([B, S, H, D], x_bshd=1, rule rope_x_bshd; rope.cu reads X's rows by stride now),
      # never run on a GPU: every own norm config and cuDNN plan on the RMSNorm forms (-k rms), every RoPE case (-k RoPE),
      # then the LLaMA-family exports on CUDA (their residual Adds now in the norms, Q/K Transposes in the RoPEs) and
      # the recorded cuDNN lowerings in the runtime
    PACK_CUBIN=0 PYTEST_ARGS="-k rms" TESTS="tests/gpu/test_norm_gpu.py tests/gpu/test_provider_cudnn_attn_norm.py" \
      bash bench/device_calls.sh "$OUT/r" gpu-tests:${TESTS_S:-150}
    PACK_CUBIN=0 PYTEST_ARGS="-k RoPE" TESTS="tests/gpu/test_new_op_kernels.py" \
      bash bench/device_calls.sh "$OUT/p" gpu-tests:${TESTS3_S:-80}
    N=tests/gpu/test_new_op_kernels.py::test_optimized_exports_run_the_new_lowerings_on_cuda
    PACK_CUBIN=0 PREBUILD=0 TESTS="$N tests/gpu/test_provider_cudnn_attn_norm.py::test_recorded_cudnn_lowerings_run_in_the_runtime" \
      bash bench/device_calls.sh "$OUT/e" gpu-tests:${TESTS2_S:-100} ;;
  54) # ~230 s, a last short call (twentieth session): on an H200 52's bias+GELU rows (issue 20's erf row at 50 MB);
      # elsewhere 48's bs1 row alone (LLaMA with grouped K/V fused at fp16 since restore_dims)
    case "$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)" in
      *H200*) bash "$0" 52 "$OUT" ;;
      *) MODELS=llama_dynamo DTYPES=fp16 E2E_ARGS="--rows llama_dynamo:1 --measure-reserve 30" \
           bash bench/device_calls.sh "$OUT/e" e2e-transformers:${E2E_S:-200} ;;
    esac ;;
  43) # any GPU, ~450 s (eighteenth session, NOTES_e2e): the CNNs exported by dynamo (torch's default exporter),
      # whose global pooling is ReduceMean, now GlobalAveragePool (reduce_to_global_pool), so their graphs after
      # cleanup are the TorchScript exports' (prediction: each bs32 row within 3 % of its TorchScript row's
      # graphopt time; EfficientNet-B0's 16 squeeze-excitation pools would otherwise cut its NHWC region)
    MODELS=efficientnet_b0_dynamo,resnet50_dynamo,mobilenetv2_dynamo DTYPES=fp16 \
      E2E_ARGS="--rows efficientnet_b0_dynamo:32,resnet50_dynamo:32,mobilenetv2_dynamo:32 --measure-reserve 45" \
      bash bench/device_calls.sh "$OUT/e" e2e-cnn:${E2E_S:-500} ;;
  auto) # the first call of a session (AUTO_N overrides): on an H200 50 (issue 20's two rows no H200 has measured at
      # HEAD: the erf-GELU's 50 MB row and attention at 4096 keys; needs neither .cubin nor .tuning), elsewhere 48 (the
      # LLaMA rows again: the twentieth session's H100 run measured them before restore_dims let grouped K/V fuse in
      # the fp16 conversion, and before the twenty-first session's runtime causal mask became causal=1; 51 and 53
      # ran on an H100 at 0b17732); then 45, 43, 46
    gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
    case "$gpu" in *H200*) n=50 ;; *) n=48 ;; esac
    echo "device_remaining: auto -> ${AUTO_N:-$n} ($gpu)"
    exec bash "$0" "${AUTO_N:-$n}" "$OUT" ;;
  *) echo "device_remaining.sh: N must be 0..54 or auto" >&2; exit 2 ;;
esac
