"""Do cuDNN's fused CBR and matmul plans pick faster kernels when graphopt declares its tensors 32-byte aligned? (GPU)

cuDNN's frontend declares every tensor 16-byte aligned unless told otherwise (``Tensor_attributes::
default_alignment``, "pointer alignment assumed by the backend when selecting engines"); torch declares its
pointers' alignment, up to 32. On ResNet-50's stem the same engine and knobs ran 61 us for torch and ~200 for
graphopt (H100, 2026-12-07; ``bench/NOTES_kernels.md``), which is why a ``cudnn_split_a32`` form existed for stems
(removed: it timed as the 16-byte form; the difference was the end padding).
Graphopt runs 25-32 of ResNet-50's 53 convolutions as cuDNN's fused graphs: if the declaration moves their
kernels too, every cuDNN provider should declare what the runtime's 256-byte arena guarantees. GemmAct's
cuDNN matmul graphs (6 of 16 GPT-2 / BERT shapes on the H100) are asked the same.

For each layer (a ``bench/cbr_layers.py`` convolution, or a ``bench/gemm_act.py`` projection at 128 tokens a
sequence): the graph's first ``--plans`` plans as graphopt lists them, built twice (the
frontend's 16, and 32 through ``cudnn.declare_alignment``), each checked and timed by the tuner's own
``profile_node`` (numerical gate, CUDA-graph timing, brief timing for plans that cannot win) in this process.

    python3 bench/align_probe.py --out DIR [--layers r50.l1.c2,...] [--batch 32] [--plans 4] [--budget 200]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))

from cbr_layers import MOBILENETV2, RESNET50, _attrs  # noqa: E402
from gemm_act import LAYERS as GEMM_LAYERS  # noqa: E402
from lowering_bench import GPU_NAME_HELP, env_header, gpu_tag, write_atomic  # noqa: E402

DEFAULT_LAYERS = ("r50.stem,r50.l1.c2,r50.l1.c3,r50.l2.c2s2,r50.l3.c2,r50.l4.c1a,r50.l4.c2,mv2.s2.1.exp,"
                  "gpt2.c_attn,gpt2.mlp.c_fc,bert.output")
NAME_A32 = "cudnn_a32probe"  # the probe's own candidate name: never in a tuning cache
SEQ = 128  # tokens a sequence for the GemmAct layers


def _a32_graph_for(sig, tag: str = ""):
    """The graph ``cudnn`` (CBR) or ``cudnn_matmul`` (GemmAct) builds for ``sig``, declared 32-byte aligned."""
    from graphopt.providers import cudnn as base
    from graphopt.providers import cudnn_matmul

    make = base.conv_graph if sig.op == "CBR" else cudnn_matmul.matmul_graph
    return base.listed(sig, make, "|a32probe" + tag, alignment=32)


def family(op: str):
    """(candidate class, its reason function, its listed graph, the 32-byte twin class) of ``cudnn``'s CBR
    or ``cudnn_matmul``'s GemmAct (the twin built here: the providers stay free of a probe's class)."""
    from dataclasses import dataclass

    from graphopt.providers import cudnn as base
    from graphopt.providers import cudnn_matmul

    cls, reason, graph_for = ((base.CudnnConv, base.conv_reason, base._graph_for) if op == "CBR" else
                              (cudnn_matmul.CudnnMatmul, cudnn_matmul.matmul_reason, cudnn_matmul._graph_for))

    @dataclass(frozen=True)
    class Twin(cls):
        def graphs(self):
            return _a32_graph_for

    return cls, reason, graph_for, Twin


def gemm_sig(layer: tuple, batch: int, dtype: str):
    """The GemmAct signature of a ``gemm_act`` layer tuple (name, K, N, activation) at ``batch`` x ``SEQ`` tokens."""
    from gemm_act import NO_BIAS

    from graphopt.kernels.registry import signature_of

    name, k, n, act = layer
    bias = name not in NO_BIAS
    return signature_of("GemmAct", [(batch, SEQ, k), (k, n), (n,) if bias else None], [dtype, dtype, dtype if bias else ""],
                        {"mode": "matmul", "activation": act})


def layer_sig(layer: tuple, batch: int, dtype: str):
    """The CBR signature of a ``cbr_layers`` layer tuple (name, Cin, Cout, k, stride, pad, H, groups, act, res)."""
    from graphopt.kernels.geometry import conv_geom
    from graphopt.kernels.registry import signature_of
    from graphopt.lowering.contract import Signature

    _name, cin, cout, k, s, p, h, g, act, res = layer
    attrs = _attrs(k, s, p, g, act)
    xs, ws = (batch, cin, h, h), (cout, cin // g, k, k)
    out = conv_geom(Signature.make("CBR", [xs, ws, (cout,), None], [dtype] * 3, attrs)).out_shape
    shapes = [xs, ws, (cout,)] + ([out] if res else [])
    return signature_of("CBR", shapes, [dtype] * len(shapes), attrs)


def paired(results: dict, plain: list[str], a32: list[str]) -> list[dict]:
    """One row per plan name: its time as listed (16) and declared 32, from the profile's ``{key: us}``
    (None: failed or not timed), and their ratio."""
    rows = []
    for p_key, a_key in zip(plain, a32):
        name = p_key.split(":plan=", 1)[1]
        u16, u32 = results.get(p_key), results.get(a_key)
        rows.append({"plan": name, "us_16": u16, "us_32": u32,
                     "ratio_32_over_16": round(u32 / u16, 3) if u16 and u32 else None})
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--layers", default=DEFAULT_LAYERS)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--dtype", default="float16")
    ap.add_argument("--plans", type=int, default=4, help="the first N plans of each graph")
    ap.add_argument("--budget", type=float, default=200.0)
    ap.add_argument("--gpu-name", default=None, help=GPU_NAME_HELP)
    args = ap.parse_args(argv)

    import cupy

    from graphopt.kernels.source import device_arch
    from graphopt.providers import cudnn as base
    from graphopt.tune.profiler import profile_node
    from graphopt.tune.runners import InlineRunner
    from graphopt.tune.tuner import kernels_backend

    if base.unavailable():
        print(f"align_probe: {base.unavailable()}", file=sys.stderr)
        return 1
    backend, why = kernels_backend()
    if backend is None:
        print(f"align_probe: {why}", file=sys.stderr)
        return 1
    header = env_header("python3 bench/align_probe.py " + " ".join(argv if argv is not None else sys.argv[1:]))
    tag = gpu_tag(args.gpu_name)
    arch, cc = device_arch(), tuple(int(c) for c in cupy.cuda.Device().compute_capability)
    runner = InlineRunner(backend.timer, backend.checker, backend.buffers, arch)
    convs = {layer[0]: layer for layer in RESNET50 + MOBILENETV2}
    gemms = {layer[0]: layer for layer in GEMM_LAYERS}
    start, rows = time.monotonic(), []
    for name in args.layers.split(","):
        if name not in convs and name not in gemms:
            rows.append({"layer": name, "error": "unknown layer (bench/cbr_layers.py RESNET50, MOBILENETV2; bench/gemm_act.py LAYERS)"})
            continue
        if time.monotonic() - start > args.budget:
            rows.append({"layer": name, "skipped": "budget"})
            continue
        sig = layer_sig(convs[name], args.batch, args.dtype) if name in convs else gemm_sig(gemms[name], args.batch, args.dtype)
        row = {"layer": name, "op": sig.op, "bs": args.batch, "dtype": args.dtype}
        try:
            cls, reason, graph_for, twin = family(sig.op)
            plain = base.plan_candidates(cls, base.NAME, sig.op, sig, reason, graph_for, limit=args.plans)[1:]
            aligned = base.plan_candidates(twin, NAME_A32, sig.op, sig, reason, _a32_graph_for, limit=args.plans)[1:]
            res = profile_node(sig, plain + aligned, timer=backend.timer, checker=backend.checker, buffers=backend.buffers,
                               compute_capability=cc, arch=arch, runner=runner)
            times = {r.candidate: (round(r.ms * 1e3, 2) if r.ok else None) for r in res.results}
            row["plans"] = paired(times, [c.key() for c in plain], [c.key() for c in aligned])
            row["failures"] = {r.candidate: r.reason for r in res.results if not r.ok and r.reason}
        except Exception as e:  # noqa: BLE001 - one layer's failure is its row's, the others still run
            row["error"] = (str(e).splitlines() or [type(e).__name__])[0][:200]
        rows.append(row)
        print(json.dumps(row), flush=True)
        write(args.out, tag, header, rows)
    write(args.out, tag, header, rows)
    return 0


def write(out_dir: str, tag: str, header: dict, rows: list) -> None:
    write_atomic(os.path.join(out_dir, f"align_probe_{tag}.json"), json.dumps({"header": header, "rows": rows}, indent=1))
    lines = [f"# cuDNN CBR and matmul plans declared 16- and 32-byte aligned on {header.get('gpu', tag)} ({header.get('date', '')})",
             "", f"Command: `{header.get('command', '')}`. us: the tuner's timing of each plan (CUDA graph; a plan that "
             "cannot win is timed briefly); -: failed or not timed.", "",
             "| layer | plan | us (16) | us (32) | 32 / 16 |", "|---|---|---:|---:|---:|"]
    for r in rows:
        if "plans" not in r:
            lines.append(f"| {r['layer']} | {r.get('error') or r.get('skipped')} | | | |")
            continue
        for p in r["plans"]:
            fmt = lambda v: "-" if v is None else v  # noqa: E731
            lines.append(f"| {r['layer']} | `{p['plan']}` | {fmt(p['us_16'])} | {fmt(p['us_32'])} | {fmt(p['ratio_32_over_16'])} |")
    write_atomic(os.path.join(out_dir, f"align_probe_{tag}.md"), "\n".join(lines) + "\n")


if __name__ == "__main__":
    sys.exit(main())
