"""Where an image stem's time goes, part by part, beside torch's parts (GPU; one run, one JSON + table).

The CBR table (``bench/cbr_layers.py``) times whole lowerings. ResNet-50's 7x7 / 2 stem at bs32 fp16 is the
one layer where torch channels_last still wins on the H200 (189.0 us against cuDNN's fused 195.2), and
``cublaslt_im2col`` ran at 213.8 against a prediction of 80-125 (``bench/NOTES_kernels.md``, twelfth
session). This script times, for ResNet-50's and MobileNetV2's stems:

- torch channels_last (``cudnn.benchmark``): the convolution alone, with its bias, with bias and activation,
  eager (CUDA events, device time) and inside a CUDA graph;
- cuDNN's convolution alone, every plan (``cudnn_split`` on the signature without bias and activation,
  which then runs no pass), and graphopt's bias + activation pass alone on the same output
  (``epilogue_gemm_vec``): the two halves of ``cudnn_split``;
- ``cublaslt_im2col``'s packing kernel alone (``im2col_rows``) and its GEMM alone (the GemmAct
  [N*OH*OW, Kp] x [Kp, M] + bias + activation through every cuBLASLt algorithm);
- the whole node through the tuner, per provider (what the CBR table records).

    python3 bench/stem_breakdown.py --out DIR [--batch 32] [--reps 30]

Writes ``DIR/stem_breakdown_<gpu>.json`` and ``.md``; every figure in microseconds, the median of
``--reps`` repetitions timed with CUDA events (graphopt's capturable lowerings inside a CUDA graph, as
the tuner times them).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))

from lowering_bench import GPU_NAME_HELP, TunerChoice, env_header, gpu_tag, torch_graph_ms, torch_us, write_atomic  # noqa: E402

# name: (x shape at batch 1, w shape, stride, pad, activation, extra attributes)
STEMS = {
    "r50.stem": ((3, 224, 224), (64, 3, 7, 7), 2, 3, "Relu", {}),
    "mv2.stem": ((3, 224, 224), (32, 3, 3, 3), 2, 1, "Clip", {"clip_min": 0.0, "clip_max": 6.0}),
}


def cbr_sig(x, w, s, p, act, extra, dtype, bias=True):
    from graphopt.lowering.contract import Signature

    attrs = dict({"strides": [s, s], "pads": [p] * 4, "kernel_shape": list(w[2:]), "activation": act}, **extra)
    return Signature.make("CBR", [x, w, (w[0],) if bias else None, None], [dtype, dtype, dtype if bias else "", ""], attrs)


def timed_us(launch, ins, outs, reps: int) -> float:
    """Median device time of ``launch(ins, outs)`` in us, inside a CUDA graph (graphopt's timer)."""
    from graphopt.kernels.timing import cuda_event_timer, median

    launch.capturable = True
    return round(median(cuda_event_timer(launch, ins, outs, warmup=3, reps=reps)) * 1e3, 2)


def _profile(tuner, sig, providers: tuple) -> dict:
    """The tuner's profile of ``sig`` over ``providers``' candidates only (``lowering_bench.provider_of`` names)."""
    tuner.providers = providers
    return tuner.profile(sig)


def torch_parts(x, w, s, p, act, extra, dtype, reps: int) -> dict:
    import torch
    import torch.nn.functional as F

    torch.backends.cudnn.benchmark = True
    dt = getattr(torch, dtype)
    xt = torch.randn(x, device="cuda", dtype=dt).to(memory_format=torch.channels_last)
    wt = (torch.randn(w, device="cuda", dtype=dt) * 0.1).to(memory_format=torch.channels_last)
    bt = torch.randn(w[0], device="cuda", dtype=dt)

    def activation(y):
        return F.relu(y) if act == "Relu" else torch.clamp(y, extra.get("clip_min", 0.0), extra.get("clip_max", 6.0))

    forms = {"conv": lambda: F.conv2d(xt, wt, None, s, p), "conv+bias": lambda: F.conv2d(xt, wt, bt, s, p),
             "conv+bias+act": lambda: activation(F.conv2d(xt, wt, bt, s, p))}
    out = {}
    y = forms["conv"]()
    for name, fn in forms.items():
        out[f"torch_{name}_us"] = torch_us(lambda *_: fn(), [], y, reps=reps)
        try:
            out[f"torch_{name}_graph_us"] = round(torch_graph_ms(lambda i: fn(), reps=reps) * 1e3, 2)
        except Exception as exc:  # noqa: BLE001 - a capture torch refuses is a fact of the row
            out[f"torch_{name}_graph_us"] = None
            out[f"torch_{name}_graph_error"] = f"{type(exc).__name__}: {exc}"[:200]
    return out


def own_parts(tuner, x, w, s, p, act, extra, dtype, reps: int) -> dict:
    import cupy
    import numpy as np

    from graphopt.kernels import geometry as geo
    from graphopt.kernels.gemm_act import vector_epilogue_launcher
    from graphopt.lowering.contract import Signature
    from graphopt.providers import cublaslt, cublaslt_problem

    out: dict = {}
    sig = cbr_sig(x, w, s, p, act, extra, dtype)
    g = geo.conv_geom(sig)
    rows = g.N * g.OH * g.OW
    # cuDNN's convolution alone: cudnn_split on the node without bias and activation runs no pass
    bare = cbr_sig(x, w, s, p, "none", {}, dtype, bias=False)
    conv = _profile(tuner, bare, ("cudnn_split",))
    out["cudnn_conv_only_us"] = conv["graphopt_us"]
    out["cudnn_conv_only_plans"] = {k: v for k, v in conv["candidates"].items() if k.startswith("cudnn_split")}
    # graphopt's bias + activation pass alone over the NHWC output
    y = cupy.random.standard_normal(rows * g.M, dtype=cupy.float32).astype(dtype)
    bias = cupy.random.standard_normal(g.M, dtype=cupy.float32).astype(dtype)
    run = vector_epilogue_launcher(dtype, rows * g.M, g.M, geo.act_args(sig))
    out["epilogue_pass_us"] = timed_us(lambda i, o: run(o[0], i[0], 1.0, 1.0), [bias], [y], reps)
    # cublaslt_im2col's packing alone, then its GEMM alone
    if cublaslt_problem.im2col_reason(sig) is None:
        pack = cublaslt._Im2col.of(sig)
        xa = cupy.random.standard_normal(g.N * g.C * g.H * g.W, dtype=cupy.float32).astype(dtype).reshape(x)
        wa = cupy.random.standard_normal(g.M * g.C * g.KH * g.KW, dtype=cupy.float32).astype(dtype).reshape(w)
        ws = cupy.empty(pack.nbytes, dtype=cupy.uint8)
        out["im2col_pack_us"] = timed_us(lambda i, o: pack.launch(i[0], i[1], o[0].data.ptr), [xa, wa], [ws], reps)
        kp = cublaslt_problem.im2col_depth(g.C * g.KH * g.KW, dtype)
        gemm = Signature.make("GemmAct", [(rows, kp), (g.M, kp), (g.M,)], [dtype] * 3,
                              dict({"mode": "gemm", "transB": 1, "activation": act}, **extra))
        res = _profile(tuner, gemm, ("cublaslt",))
        out["im2col_gemm_us"] = (res["best_by_provider"].get("cublaslt") or {}).get("us")
        out["im2col_gemm_key"] = (res["best_by_provider"].get("cublaslt") or {}).get("key")
        out["im2col_bytes"] = {"cols": int(rows * kp * np.dtype(dtype).itemsize), "y": int(rows * g.M * np.dtype(dtype).itemsize)}
    # the whole node, per provider
    whole = _profile(tuner, sig, ("cudnn", "cudnn_split", "cudnn_cpad", "cublaslt", "own"))
    out["node_us"] = whole["graphopt_us"]
    out["node_chosen"] = whole["chosen"]
    out["node_best_by_provider"] = whole["best_by_provider"]
    out["failures"] = whole["failures"]
    return out


def stem_arguments(description: str, reps: int, only: str) -> argparse.ArgumentParser:
    """The arguments the stem probes share: ``--out``, ``--batch``, ``--dtype``, ``--reps``, ``--only`` (stem
    names, comma-separated; ``only`` the default, "" for all) and ``--gpu-name``."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--out", required=True)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--dtype", default="float16")
    ap.add_argument("--reps", type=int, default=reps)
    ap.add_argument("--only", default=only, help=f"comma-separated stem names of STEMS ({', '.join(STEMS)}; "
                                                 f"default: {only or 'all'})")
    ap.add_argument("--gpu-name", default=None, help=GPU_NAME_HELP)
    return ap


def main(argv=None) -> int:
    args = stem_arguments(__doc__.splitlines()[0], reps=30, only="").parse_args(argv)
    header = env_header("python3 bench/stem_breakdown.py " + " ".join(argv if argv is not None else sys.argv[1:]))
    tag = gpu_tag(args.gpu_name)
    rows = []
    names = [n for n in STEMS if not args.only or n in args.only.split(",")]
    with TunerChoice() as tuner:
        for name in names:
            xs, w, s, p, act, extra = STEMS[name]
            x = (args.batch,) + xs
            row = {"layer": name, "bs": args.batch, "dtype": args.dtype, "x": list(x), "w": list(w)}
            row.update(torch_parts(x, w, s, p, act, extra, args.dtype, args.reps))
            row.update(own_parts(tuner, x, w, s, p, act, extra, args.dtype, args.reps))
            rows.append(row)
            print(json.dumps({k: v for k, v in row.items() if not isinstance(v, dict)}), flush=True)
            _write(args.out, tag, header, rows)
    return 0


def _write(out_dir: str, tag: str, header: dict, rows: list) -> None:
    write_atomic(os.path.join(out_dir, f"stem_breakdown_{tag}.json"), json.dumps({"header": header, "rows": rows}, indent=1))
    cols = ["torch_conv_us", "torch_conv+bias+act_us", "torch_conv+bias+act_graph_us", "cudnn_conv_only_us",
            "epilogue_pass_us", "im2col_pack_us", "im2col_gemm_us", "node_us"]
    lines = [f"# Stem breakdown on {header.get('gpu', tag)} ({header.get('date', '')})", "",
             f"Command: `{header.get('command', '')}`. Device time in us, medians (graphopt's parts inside a CUDA graph).", "",
             "| layer | bs | " + " | ".join(cols) + " | chosen |", "|---|---:|" + "---:|" * len(cols) + "---|"]
    for r in rows:
        lines.append(f"| {r['layer']} | {r['bs']} | " + " | ".join(str(r.get(c)) for c in cols) + f" | `{r.get('node_chosen')}` |")
    write_atomic(os.path.join(out_dir, f"stem_breakdown_{tag}.md"), "\n".join(lines) + "\n")


if __name__ == "__main__":
    sys.exit(main())
