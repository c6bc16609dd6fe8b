"""CBR: the lowering the tuner would choose against PyTorch eager, on every distinct conv layer of
ResNet-50 and MobileNetV2 (torchvision shapes, 224x224 input), issue 20's "Benchmarks".

Run on the GPU:  python3 bench/cbr_layers.py --out bench/results [--batches 1,32] [--dtypes float16] [--budget 500]

For each layer, batch and dtype: every candidate of graphopt.kernels.registry (graphopt's own kernels
and every provider's plans: cuDNN, cuBLASLt where it applies) is built, checked and timed by the
tuner's own backend in its isolated worker (bench/lowering_bench.TunerChoice; a capturable lowering
is timed inside a CUDA graph). ``graphopt_us`` / ``chosen`` = the fastest correct candidate (what
``graphopt optimize`` records); ``<provider>_best_us`` = the fastest correct candidate of each
provider (``own_best_us``, ``cudnn_best_us``, ``cublaslt_best_us``; null where it has none).
PyTorch eager conv+bias(+residual)+activation with cudnn.benchmark=True, in NCHW
(``torch_eager_us``) and channels_last (``torch_channels_last_us``), is timed with the same timer.
floor_us = max(FLOPs / fp16-or-tf32 GEMM peak, minimum bytes / copy bandwidth), both measured here.

Rows are written after every layer to OUT/cbr_layers_<gpu-name>.json and .md; layers past --budget seconds
are listed as skipped. ``--previous FILE`` starts from an earlier run's rows (same format) and
skips the (layer, bs, dtype) rows it already has, so several device calls complete one table.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, HERE)

from lowering_bench import (GPU_NAME_HELP, Budget, TunerChoice, env_header, geomean, gpu_tag, measure_ceilings, prebuild_all,  # noqa: E402,F401
                            torch_graph_or_reason, torch_us, write_atomic, write_json)

FORMAT = 2  # rows with per-provider columns (the 2026-12-02 file, own kernels only, has no "format")
PROVIDERS = ("own", "cudnn", "cudnn_nchw", "cudnn_cpad", "cudnn_split", "cublaslt")  # cudnn_cpad, cudnn_split: the stems only

# (name, Cin, Cout, k, stride, pad, H_in, groups, activation, residual)
RESNET50 = [
    ("r50.stem", 3, 64, 7, 2, 3, 224, 1, "Relu", False),
    ("r50.l1.c1a", 64, 64, 1, 1, 0, 56, 1, "Relu", False),
    ("r50.l1.c2", 64, 64, 3, 1, 1, 56, 1, "Relu", False),
    ("r50.l1.c3", 64, 256, 1, 1, 0, 56, 1, "Relu", True),
    ("r50.l1.ds", 64, 256, 1, 1, 0, 56, 1, "none", False),
    ("r50.l1.c1", 256, 64, 1, 1, 0, 56, 1, "Relu", False),
    ("r50.l2.c1a", 256, 128, 1, 1, 0, 56, 1, "Relu", False),
    ("r50.l2.c2s2", 128, 128, 3, 2, 1, 56, 1, "Relu", False),
    ("r50.l2.c3", 128, 512, 1, 1, 0, 28, 1, "Relu", True),
    ("r50.l2.ds", 256, 512, 1, 2, 0, 56, 1, "none", False),
    ("r50.l2.c1", 512, 128, 1, 1, 0, 28, 1, "Relu", False),
    ("r50.l2.c2", 128, 128, 3, 1, 1, 28, 1, "Relu", False),
    ("r50.l3.c1a", 512, 256, 1, 1, 0, 28, 1, "Relu", False),
    ("r50.l3.c2s2", 256, 256, 3, 2, 1, 28, 1, "Relu", False),
    ("r50.l3.c3", 256, 1024, 1, 1, 0, 14, 1, "Relu", True),
    ("r50.l3.ds", 512, 1024, 1, 2, 0, 28, 1, "none", False),
    ("r50.l3.c1", 1024, 256, 1, 1, 0, 14, 1, "Relu", False),
    ("r50.l3.c2", 256, 256, 3, 1, 1, 14, 1, "Relu", False),
    ("r50.l4.c1a", 1024, 512, 1, 1, 0, 14, 1, "Relu", False),
    ("r50.l4.c2s2", 512, 512, 3, 2, 1, 14, 1, "Relu", False),
    ("r50.l4.c3", 512, 2048, 1, 1, 0, 7, 1, "Relu", True),
    ("r50.l4.ds", 1024, 2048, 1, 2, 0, 14, 1, "none", False),
    ("r50.l4.c1", 2048, 512, 1, 1, 0, 7, 1, "Relu", False),
    ("r50.l4.c2", 512, 512, 3, 1, 1, 7, 1, "Relu", False),
]


def _mobilenet_v2():
    """torchvision mobilenet_v2 convs; ReLU6 is Clip(0, 6); projections have no activation."""
    rows, seen = [], set()

    def add(name, cin, cout, k, s, p, h, g, act, res):
        key = (cin, cout, k, s, p, h, g, act, res)
        if key not in seen:
            seen.add(key)
            rows.append((name, cin, cout, k, s, p, h, g, act, res))

    add("mv2.stem", 3, 32, 3, 2, 1, 224, 1, "Relu6", False)
    h, cin = 112, 32
    add("mv2.b0.dw", 32, 32, 3, 1, 1, h, 32, "Relu6", False)
    add("mv2.b0.pw", 32, 16, 1, 1, 0, h, 1, "none", False)
    cin = 16
    for bi, (t, c, n, s) in enumerate([(6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2), (6, 320, 1, 1)], 1):
        for i in range(n):
            stride = s if i == 0 else 1
            hid = cin * t
            add(f"mv2.s{bi}.{i}.exp", cin, hid, 1, 1, 0, h, 1, "Relu6", False)
            add(f"mv2.s{bi}.{i}.dw", hid, hid, 3, stride, 1, h, hid, "Relu6", False)
            h = h // stride
            add(f"mv2.s{bi}.{i}.pw", hid, c, 1, 1, 0, h, 1, "none", stride == 1 and cin == c)
            cin = c
    add("mv2.head", 320, 1280, 1, 1, 0, 7, 1, "Relu6", False)
    return rows


MOBILENETV2 = _mobilenet_v2()


def _act_torch(y, act):
    import torch.nn.functional as F

    if act == "Relu":
        return F.relu(y)
    if act == "Relu6":
        return F.relu6(y)
    return y


def layer_data(rng, xs, ws, oshape, s, p, g, act, res, dtype, tstream):
    """One layer's random CuPy inputs (x, w, b, r), the same as torch tensors, and torch's float32
    result with TF32 off (the reference), computed on ``tstream``."""
    import cupy
    import numpy as np
    import torch
    import torch.nn.functional as F

    cout, fan_in = ws[0], ws[1] * ws[2] * ws[3]
    x = cupy.asarray(rng.standard_normal(xs, dtype=np.float32)).astype(dtype)
    w = cupy.asarray(rng.standard_normal(ws, dtype=np.float32) / math.sqrt(fan_in)).astype(dtype)
    b = cupy.asarray(rng.standard_normal(cout, dtype=np.float32)).astype(dtype)
    r = cupy.asarray(rng.standard_normal(oshape, dtype=np.float32)).astype(dtype) if res else None
    tx, tw, tb = (torch.as_tensor(v, device="cuda") for v in (x, w, b))
    tr = torch.as_tensor(r, device="cuda") if res else None
    with torch.cuda.stream(tstream):
        torch.backends.cudnn.allow_tf32 = False
        ref_t = F.conv2d(tx.float(), tw.float(), tb.float(), s, p, 1, g)
        if res:
            ref_t = ref_t + tr.float()
        ref_t = _act_torch(ref_t, act)
        torch.backends.cudnn.allow_tf32 = True
    return (x, w, b, r), (tx, tw, tb, tr), ref_t


def _attrs(k, s, p, g, act):
    a = {"kernel_shape": [k, k], "strides": [s, s], "pads": [p, p, p, p], "dilations": [1, 1], "group": g}
    if act == "Relu":
        a["activation"] = "Relu"
    elif act == "Relu6":
        a.update(activation="Clip", clip_min=0.0, clip_max=6.0)
    else:
        a["activation"] = "none"
    return a


def report_kernels(out_dir: str, gpu_name: str):
    """Registers, local memory (spills) and shared memory of every compiled instance."""
    from graphopt.kernels.registry import all_kernel_instances
    from graphopt.kernels.source import get_kernel, prebuild

    t0 = time.perf_counter()
    errors = prebuild(all_kernel_instances())
    print(f"prebuild {time.perf_counter() - t0:.1f} s, errors: {errors}")
    rep = {}
    for src, expr in all_kernel_instances():
        if (src, expr) in errors:
            continue
        k = get_kernel(src, expr)
        rep[expr] = {"regs": k.num_regs, "local_bytes": k.local_size_bytes, "static_smem": k.shared_size_bytes, "max_threads": k.max_threads_per_block}
        print(f"{expr:45s} regs {k.num_regs:4d} local {k.local_size_bytes:5d} smem {k.shared_size_bytes:6d} maxthr {k.max_threads_per_block}")
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, f"cbr_layers_{gpu_name}.kernels.json"), "w") as f:
        json.dump({"prebuild_errors": errors, "kernels": rep}, f, indent=1)




def layer_list(models) -> list[tuple]:
    out = []
    if "resnet50" in models:
        out += [("resnet50",) + layer for layer in RESNET50]
    if "mobilenetv2" in models:
        out += [("mobilenetv2",) + layer for layer in MOBILENETV2]
    return out


def load_previous(path: str | None) -> list[dict]:
    if not path or not os.path.exists(path):
        return []
    with open(path) as f:
        doc = json.load(f)
    return doc.get("rows", []) if doc.get("header", {}).get("format") == FORMAT else []


def kept_rows(previous: list[dict], only: set | None, batches: list[int], dtypes: list[str]) -> list[dict]:
    """The earlier rows a run with ``--only`` keeps: all but those it measures again (its layers at its
    batches and dtypes). A bs32-only rerun of some layers keeps their bs1 rows."""
    if not only:
        return list(previous)
    return [r for r in previous if not (r["layer"] in only and r["bs"] in batches and r["dtype"] in dtypes)]


def skip_for_time(rows: list[dict], skipped: list[str], earlier: dict, name: str, bs: int, dtype: str) -> None:
    """A layer the budget did not reach: listed as skipped, and its earlier row (``--previous``), if any, kept:
    an ``--only`` rerun cut by its budget once dropped the rows it had meant to measure again."""
    kept = earlier.get((name, bs, dtype))
    if kept is not None:
        rows.append(kept)
    skipped.append(f"{name} bs{bs} {dtype}" + (" (its earlier row kept)" if kept is not None else ""))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.path.join(HERE, "results"))
    ap.add_argument("--models", default="resnet50,mobilenetv2")
    ap.add_argument("--batches", default="1,32")
    ap.add_argument("--dtypes", default="float16")
    ap.add_argument("--reps", type=int, default=20, help="torch timings")
    ap.add_argument("--budget", type=float, default=500.0, help="seconds; layers past it are skipped and listed")
    ap.add_argument("--previous", default=None, help="an earlier run's cbr_layers_<gpu>.json: keep its rows, skip them")
    ap.add_argument("--gpu-name", default=None, help=GPU_NAME_HELP)
    ap.add_argument("--quick", action="store_true", help="a few layers only (smoke test)")
    ap.add_argument("--only", default=None, help="these layers only (names, comma-separated, e.g. r50.stem,mv2.stem); "
                                                  "with --previous their earlier rows at this run's batches and dtypes are replaced, "
                                                  "the others kept")
    ap.add_argument("--report-kernels", action="store_true", help="print registers / local memory of every instance and exit")
    args = ap.parse_args(argv)
    args.gpu_name = args.gpu_name or gpu_tag()
    bad = [m for m in args.models.split(",") if m not in ("resnet50", "mobilenetv2")]
    bad += [d for d in args.dtypes.split(",") if d not in ("float16", "float32")]
    if bad:
        ap.error(f"unknown model or dtype: {', '.join(bad)} (models: resnet50, mobilenetv2; dtypes: float16, float32)")
    unknown = set(args.only.split(",")) - {x[1] for x in layer_list(args.models.split(","))} if args.only else set()
    if unknown:  # refused before minutes of device set-up
        ap.error(f"--only: unknown layer(s) {', '.join(sorted(unknown))}")
    if args.report_kernels:
        return report_kernels(args.out, args.gpu_name)
    budget = Budget(args.budget)

    import cupy
    import numpy as np
    import torch
    import torch.nn.functional as F

    from graphopt.kernels.geometry import conv_geom
    from graphopt.kernels.registry import signature_of
    from graphopt.lowering.contract import Signature

    torch.backends.cudnn.benchmark = True
    header = env_header("python3 bench/cbr_layers.py " + " ".join(argv if argv is not None else sys.argv[1:]))
    header["format"] = FORMAT
    header.update(prebuild_all())
    header["ceilings"] = measure_ceilings()
    print(json.dumps(header, indent=1), flush=True)
    only = set(args.only.split(",")) if args.only else None
    previous = load_previous(args.previous)
    rows = kept_rows(previous, only, [int(b) for b in args.batches.split(",")], args.dtypes.split(","))
    done = {(r["layer"], r["bs"], r["dtype"]) for r in rows}
    # a row this run meant to measure again but did not reach keeps its earlier measurement (never dropped)
    earlier = {(r["layer"], r["bs"], r["dtype"]): r for r in previous}
    skipped: list[str] = []
    layers = layer_list(args.models.split(","))
    if args.quick:
        layers = [x for x in layers if x[1] in ("r50.stem", "r50.l1.c2", "r50.l3.c2", "r50.l1.c3", "mv2.s2.1.dw", "mv2.s3.1.pw")]
    if only:
        layers = [x for x in layers if x[1] in only]

    def save():
        header["summary"] = summarize(rows)
        header["skipped_for_time"] = skipped
        header["elapsed_s"] = round(args.budget - budget.left(), 1)
        write_json(os.path.join(args.out, f"cbr_layers_{args.gpu_name}.json"), {"header": header, "rows": rows})
        write_atomic(os.path.join(args.out, f"cbr_layers_{args.gpu_name}.md"), markdown(header, rows))

    with TunerChoice() as tuner:
        for dtype in args.dtypes.split(","):
            tdt = {"float16": torch.float16, "float32": torch.float32}[dtype]
            peak = header["ceilings"]["fp16_TFLOPs" if dtype == "float16" else "tf32_TFLOPs"] * 1e12
            bw = header["ceilings"]["copy_TBps"] * 1e12
            torch.backends.cudnn.allow_tf32 = dtype == "float32"
            for bs in [int(b) for b in args.batches.split(",")]:
                for (model, name, cin, cout, k, s, p, h, g, act, res) in layers:
                    if (name, bs, dtype) in done:
                        continue
                    if budget.left() < 15:
                        skip_for_time(rows, skipped, earlier, name, bs, dtype)
                        continue
                    attrs = _attrs(k, s, p, g, act)
                    xs, ws = (bs, cin, h, h), (cout, cin // g, k, k)
                    geom = conv_geom(Signature.make("CBR", [xs, ws, (cout,), None], [dtype] * 3, attrs))
                    oshape = geom.out_shape
                    shapes = [xs, ws, (cout,)] + ([oshape] if res else [])  # as a model's node has them
                    sig = signature_of("CBR", shapes, [dtype] * len(shapes), attrs)
                    row = {"model": model, "layer": name, "bs": bs, "dtype": dtype, "x_shape": list(xs), "w_shape": list(ws),
                           "stride": s, "pad": p, "groups": g, "activation": act, "residual": res}
                    try:
                        t0 = time.perf_counter()
                        choice = tuner.profile(sig)
                        row["profile_s"] = round(time.perf_counter() - t0, 1)
                        tx = torch.randn(xs, device="cuda", dtype=tdt)
                        tw = torch.randn(ws, device="cuda", dtype=tdt) / math.sqrt(ws[1] * k * k)
                        tb = torch.randn(cout, device="cuda", dtype=tdt)
                        tr = torch.randn(oshape, device="cuda", dtype=tdt) if res else None

                        def conv(x, w, b, r):
                            y = F.conv2d(x, w, b, s, p, 1, g)
                            return _act_torch(y + r if r is not None else y, act)

                        out = torch.empty(oshape, device="cuda", dtype=tdt)
                        t_nchw = torch_us(conv, [tx, tw, tb, tr], out, args.reps)
                        cl = [v.to(memory_format=torch.channels_last) if v is not None and v.dim() == 4 else v
                              for v in (tx, tw, tb, tr)]
                        t_cl = torch_us(conv, cl, out.to(memory_format=torch.channels_last), args.reps)
                        # torch's same ops in a CUDA graph, timed as graphopt's choice is (the peers are eager)
                        g_nchw, why_nchw = torch_graph_or_reason(conv, [tx, tw, tb, tr], args.reps)
                        g_cl, why_cl = torch_graph_or_reason(conv, cl, args.reps)
                        graphs = [t for t in (g_nchw, g_cl) if t]
                        if why_nchw or why_cl:
                            row["torch_graph_error"] = why_nchw or why_cl
                        esz = 2 if dtype == "float16" else 4
                        nbytes = esz * (int(np.prod(xs)) + int(np.prod(ws)) + cout + int(np.prod(oshape)) * (2 if res else 1))
                        best = choice["best_by_provider"]
                        gus = choice["graphopt_us"]
                        row.update({
                            "graphopt_us": gus, "chosen": choice["chosen"], "chosen_provider": choice["chosen_provider"],
                            **{f"{pv}_best_us": (best.get(pv) or {}).get("us") for pv in PROVIDERS},
                            "best_by_provider": best,
                            "torch_eager_us": t_nchw, "torch_channels_last_us": t_cl,
                            "floor_us": round(max(geom.flops / peak, nbytes / bw) * 1e6, 2),
                            "vs_torch_nchw": round(t_nchw / gus, 3) if gus else None,
                            "vs_best_torch": round(min(t_nchw, t_cl) / gus, 3) if gus else None,
                            "torch_graph_us": g_nchw, "torch_channels_last_graph_us": g_cl,
                            "vs_best_torch_graph": round(min(graphs) / gus, 3) if gus and graphs else None,
                            "graphopt_TFLOPs": round(geom.flops / (gus * 1e-6) / 1e12, 1) if gus else None,
                            # own configurations under "candidates" (what bench/prune_configs.py ranks)
                            "candidates": {kk: v for kk, v in choice["candidates"].items() if choice["provider"][kk] == "own"},
                            "provider_candidates": {kk: v for kk, v in choice["candidates"].items() if choice["provider"][kk] != "own"},
                            "failures": choice["failures"], "pruned": choice["pruned"],
                        })
                    except Exception as exc:  # noqa: BLE001 - one broken layer must not end the run
                        row["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"
                    rows.append(row)
                    print(f"{name:14s} bs{bs:<2d} {dtype:7s} graphopt {row.get('graphopt_us')} us ({row.get('chosen')}) "
                          f"own {row.get('own_best_us')} cudnn {row.get('cudnn_best_us')} cublaslt {row.get('cublaslt_best_us')} "
                          f"torch {row.get('torch_eager_us')} / CL {row.get('torch_channels_last_us')} "
                          f"floor {row.get('floor_us')} {row.get('error', '')}", flush=True)
                    cupy.get_default_memory_pool().free_all_blocks()
                    torch.cuda.empty_cache()
                    save()
    save()
    print(json.dumps(header["summary"], indent=1))
    return 0


def summarize(rows) -> dict:
    out = {}
    for dtype in sorted({r["dtype"] for r in rows}):
        for bs in sorted({r["bs"] for r in rows}):
            sel = [r for r in rows if r["dtype"] == dtype and r["bs"] == bs and r.get("vs_best_torch")]
            if sel:
                out[f"{dtype}_bs{bs}"] = {
                    "layers": len(sel),
                    "at_least_as_fast_as_best_torch": sum(r["vs_best_torch"] >= 1.0 for r in sel),
                    "geomean_vs_torch_nchw": geomean(r["vs_torch_nchw"] for r in sel),
                    "geomean_vs_best_torch": geomean(r["vs_best_torch"] for r in sel),
                    # torch's same ops captured in a CUDA graph, timed as graphopt's choice is (no eager gaps)
                    "at_least_as_fast_as_best_torch_graph": f"{sum(r['vs_best_torch_graph'] >= 1.0 for r in sel if r.get('vs_best_torch_graph'))} "
                                                            f"of {sum(bool(r.get('vs_best_torch_graph')) for r in sel)}",
                    "chosen_provider": {pv: sum(r.get("chosen_provider") == pv for r in sel) for pv in PROVIDERS},
                }
    return out


def markdown(header, rows) -> str:
    lines = [f"# CBR layers on {header['gpu']} ({header['date']})", "",
             f"Command: `{header['command']}`; CuPy {header['cupy']}, torch {header['torch']}, cuDNN {header.get('torch_cudnn', header.get('cudnn'))}, "
             f"driver {header['driver']}, NVRTC {header['nvrtc']}; providers {header.get('providers')}.", "",
             f"Ceilings measured in this run: copy {header['ceilings']['copy_TBps']:.2f} TB/s, fp16 GEMM "
             f"{header['ceilings']['fp16_TFLOPs']:.0f} TFLOP/s, tf32 GEMM {header['ceilings']['tf32_TFLOPs']:.0f} TFLOP/s. "
             f"Timing: {header['timing']}. graphopt = the tuner's choice (fastest correct candidate of every provider).", "",
             "## Summary", "", "```", json.dumps(header.get("summary", {}), indent=1), "```", "",
             "`x best torch graph`: against the faster of torch NCHW and channels_last with the same ops captured in a CUDA "
             "graph, timed as graphopt's choice is (the torch columns are eager).", "",
             "| model | layer | bs | dtype | graphopt us | chosen | own us | cuDNN us | cuBLASLt us | torch NCHW us | "
             "torch CL us | x best torch | x best torch graph | floor us |", "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['model']} | {r['layer']} | {r['bs']} | {r['dtype']} | error: {r['error']} | | | | | | | | | |")
            continue
        lines.append(f"| {r['model']} | {r['layer']} | {r['bs']} | {r['dtype']} | {r['graphopt_us']} | `{r['chosen']}` | "
                     f"{r['own_best_us']} | {r['cudnn_best_us']} | {r['cublaslt_best_us']} | {r['torch_eager_us']} | "
                     f"{r['torch_channels_last_us']} | {r['vs_best_torch']} | {r.get('vs_best_torch_graph', '-')} | {r['floor_us']} |")
    if header.get("skipped_for_time"):
        lines += ["", "Skipped for the time budget: " + ", ".join(header["skipped_for_time"])]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
