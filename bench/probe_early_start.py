"""Which library launches may start before the launch before them has finished (programmatic dependent
launch), read from a captured CUDA graph's edges instead of guessed (bench/NOTES_kernels.md, ninth session).

graphopt enqueues an empty kernel (``graphopt.lowering.barrier``) before every cuDNN / cuBLASLt launch because
cuDNN's kernels raced in a whole-ResNet-50 graph on the H200. The barrier costs 0.9-1.5 us a call at short
attention lengths, the whole of the attention bar's gap. It is needed only before a launch that may start
early and whose previous launch may itself have started early; whether a library kernel is launched that
way is visible in a capture: the edge into its kernel node has type
``CU_GRAPH_DEPENDENCY_TYPE_PROGRAMMATIC``.

For a few lowerings of representative signatures (attention, GemmAct, CBR: the first lowering of every
family, a provider's plans or one of graphopt's candidate kinds, those that call cuBLAS through CuPy included) this captures, on one stream: an ordinary marker
kernel, the lowering's launch *without* its barrier, the same launch again, the marker again; then it
reads every node and edge of the graph through the driver API (``cuGraphGetNodes``,
``cuGraphGetEdges_v2``, kernel names by ``cuFuncGetName`` / ``cuKernelGetName``: ctypes, because CuPy
exposes the graph handle but not its edges) and writes ``OUT/early_start_<gpu>.json``: per lowering, its
kernels, every edge (from, to, type, port) and ``early_start`` (an edge into one of its kernels is
programmatic), beside ``library_starts_early``: the reading the runtime makes with
``GRAPHOPT_MEASURE_BARRIERS=1`` (``graphopt.lowering.early_start``, whose graph reader this script
shares; the header's ``library_reader_problem`` is None when its positive control passed). The two must
agree. Nothing is timed; each lowering runs once eagerly first, outside the capture.

    python3 bench/probe_early_start.py --out OUT [--per-family 1]
"""

from __future__ import annotations

import argparse
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, HERE)

from lowering_bench import barrier_left_out, gpu_tag, provider_of, write_json  # noqa: E402

from graphopt.lowering import early_start  # noqa: E402
from graphopt.lowering.early_start import early_kernels, graph_structure  # noqa: E402
from graphopt.lowering.early_start import driver as _driver  # noqa: E402

def signatures():
    from graphopt.kernels.registry import signature_of

    h = "float16"
    return [
        ("attention s128 d64", signature_of("Attention", [(8, 16, 128, 64)] * 3, [h] * 3, {})),
        ("attention s128 d64 causal", signature_of("Attention", [(8, 16, 128, 64)] * 3, [h] * 3, {"causal": 1})),
        ("gemm_act 1024x768x3072 gelu", signature_of("GemmAct", [(8, 128, 768), (768, 3072), (3072,)], [h] * 3,
                                                    {"mode": "matmul", "activation": "Gelu"})),
        ("cbr 3x3 64->64 bs32 relu", signature_of("CBR", [(32, 64, 56, 56), (64, 64, 3, 3), (64,)], [h] * 3,
                                                  {"kernel_shape": [3, 3], "strides": [1, 1], "pads": [1, 1, 1, 1],
                                                   "dilations": [1, 1], "group": 1, "activation": "Relu"})),
        ("cbr 1x1 256->64 bs32 relu", signature_of("CBR", [(32, 256, 56, 56), (64, 256, 1, 1), (64,)], [h] * 3,
                                                   {"kernel_shape": [1, 1], "strides": [1, 1], "pads": [0, 0, 0, 0],
                                                    "dilations": [1, 1], "group": 1, "activation": "Relu"})),
        # ResNet-50's layer4 conv+residual+ReLU: where the H200's whole-graph race was first seen
        ("cbr 1x1 512->2048 7x7 bs32 residual relu",
         signature_of("CBR", [(32, 512, 7, 7), (2048, 512, 1, 1), (2048,), (32, 2048, 7, 7)], [h] * 4,
                      {"kernel_shape": [1, 1], "strides": [1, 1], "pads": [0, 0, 0, 0], "dilations": [1, 1],
                       "group": 1, "activation": "Relu"})),
        ("cbr 3x3 512->512 7x7 bs32 relu", signature_of("CBR", [(32, 512, 7, 7), (512, 512, 3, 3), (512,)], [h] * 3,
                                                        {"kernel_shape": [3, 3], "strides": [1, 1], "pads": [1, 1, 1, 1],
                                                         "dilations": [1, 1], "group": 1, "activation": "Relu"})),
    ]


def probe_one(lib, cand, sig, arch, marker) -> dict:
    """Capture marker, launch, launch, marker (the launch without its barrier) and read the graph."""
    import cupy

    from graphopt.kernels.check import output_shape
    from graphopt.lowering import build_lowering

    low = build_lowering(cand, sig, arch)
    xp = cupy
    inputs = [None if s is None else xp.asarray(xp.random.standard_normal(s), dtype=d)
              for s, d in zip(sig.input_shapes, [d or "float16" for d in sig.dtypes])]
    inputs = low.conform(inputs, xp)
    outputs = low.empty_outputs(len(inputs), [output_shape(sig)], inputs[0].dtype, xp)
    workspace = xp.empty(max(1, int(low.workspace_bytes)), dtype=xp.uint8) if low.workspace_bytes else None
    with barrier_left_out():  # the launch as it would run where the runtime left the barrier out
        low.launch(inputs, outputs, workspace)  # eager first: plans and modules load outside the capture
        cupy.cuda.get_current_stream().synchronize()
        stream = cupy.cuda.Stream(non_blocking=True)
        with stream:
            stream.begin_capture()
            try:
                marker((1,), (1,), ())
                low.launch(inputs, outputs, workspace)
                low.launch(inputs, outputs, workspace)
                marker((1,), (1,), ())
            finally:
                graph = stream.end_capture()
    structure = graph_structure(lib, graph.graph)
    early = early_kernels(structure)
    # the runtime's own reading (graphopt.lowering.early_start, GRAPHOPT_MEASURE_BARRIERS=1): it must agree
    measured = early_start.starts_early(low.unordered_launch, inputs, outputs, workspace)
    return {"key": cand.key(), "provider": provider_of(cand), "barrier_declared": bool(low.barrier),
            "early_start": bool(early), "early_kernels": early, "library_starts_early": measured, **structure}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--per-family", type=int, default=1,
                    help="lowerings probed per family (provider and candidate name: own kernels that call cuBLAS are a family "
                         "of their own) and signature")
    ap.add_argument("--vendor-per-family", type=int, default=None,
                    help="lowerings probed per vendor family (cuDNN, cuBLASLt: each plan a lowering) and signature "
                         "(default: --per-family); the plans the tuner chooses are rarely the first listed")
    ap.add_argument("--gpu-name", default=None)
    args = ap.parse_args(argv)
    import cupy

    from graphopt.kernels.registry import applicable
    from graphopt.kernels.source import device_arch

    lib = _driver()
    arch = device_arch()
    from graphopt.tune.gpus import detect_devices

    cc = detect_devices()[0].compute_capability
    marker = early_start.marker_kernel()  # the runtime reader's marker, loaded outside any capture
    cupy.cuda.get_current_stream().synchronize()
    print(f"library reader: {early_start.reader_problem() or 'positive control passed'}", flush=True)
    doc = {"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "command": " ".join(sys.argv),
           "gpu": cupy.cuda.runtime.getDeviceProperties(0)["name"].decode(),
           "library_reader_problem": early_start.reader_problem(),  # None: its positive control saw an early start
           "rows": []}
    path = os.path.join(args.out, f"early_start_{args.gpu_name or gpu_tag()}.json")
    for label, sig in signatures():
        ok, _ = applicable(sig, cc)
        taken: dict[tuple[str, str], int] = {}
        for cand in ok:
            prov = provider_of(cand)
            family = (prov, str(getattr(cand, "name", "")))
            limit = args.per_family if prov == "own" or args.vendor_per_family is None else args.vendor_per_family
            if taken.get(family, 0) >= limit:
                continue
            taken[family] = taken.get(family, 0) + 1
            try:
                row = {"signature": label, **probe_one(lib, cand, sig, arch, marker)}
            except Exception as exc:  # noqa: BLE001 - one lowering's failure is a row, not the end of the probe
                row = {"signature": label, "key": cand.key(), "provider": prov, "error": f"{type(exc).__name__}: {exc}"[:300]}
            doc["rows"].append(row)
            write_json(path, doc)
            print(f"{label:32s} {row['key'][:48]:48s} {row['provider']:10s} early_start={row.get('early_start')} "
                  f"library={row.get('library_starts_early')} {row.get('early_kernels') or row.get('error', '')}", flush=True)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
