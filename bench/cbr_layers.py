"""CBR lowerings vs PyTorch eager on every distinct conv layer of ResNet-50 and MobileNetV2.

Run on the GPU:  python3 bench/cbr_layers.py --out bench/results  [--quick]

For each layer (torchvision shapes, 224x224 input), batch 1 and 32, fp16 and fp32: every applicable
candidate is built, checked against a float32 cuDNN result (TF32 off) of the same inputs, and timed
with graphopt.kernels.timing.cuda_event_timer (device time, inputs rotated beyond L2); PyTorch eager
(F.conv2d with bias, then the activation, plus the residual add where the layer has one;
cudnn.benchmark=True, default TF32 for fp32) is timed with the same timer in the same run.
floor_us = max(FLOPs / matrix peak, minimum bytes / copy bandwidth), both measured in this run.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

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


def env_header(command: str) -> dict:
    import cupy
    import torch

    props = cupy.cuda.runtime.getDeviceProperties(0)
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "gpu": props["name"].decode() if isinstance(props["name"], bytes) else props["name"],
        "compute_capability": cupy.cuda.Device().compute_capability,
        "sm_count": props["multiProcessorCount"],
        "l2_bytes": props["l2CacheSize"],
        "driver": cupy.cuda.runtime.driverGetVersion(),
        "cuda_runtime": cupy.cuda.runtime.runtimeGetVersion(),
        "nvrtc": ".".join(map(str, cupy.cuda.nvrtc.getVersion())),
        "cupy": cupy.__version__,
        "torch": torch.__version__,
        "cudnn": torch.backends.cudnn.version(),
        "python": platform.python_version(),
        "command": command,
        "timing": "graphopt.kernels.timing.cuda_event_timer: median of reps, CUDA events per launch, "
                  "spin-kernel prefill so host launch gaps are excluded (device time), inputs rotated over >=128 MiB",
    }


def measure_ceilings() -> dict:
    """Copy bandwidth (bytes read + written) and dense matrix peaks, on random data."""
    import torch

    from graphopt.kernels.timing import median

    out = {}
    n = 1 << 30  # 1 GiB each way
    a = torch.empty(n, dtype=torch.uint8, device="cuda").random_()
    b = torch.empty_like(a)
    for _ in range(3):
        b.copy_(a)
    ts = []
    for _ in range(10):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record(); b.copy_(a); e.record(); e.synchronize()
        ts.append(s.elapsed_time(e))
    out["copy_TBps"] = 2 * n / (median(ts) * 1e-3) / 1e12
    del a, b
    for name, dt, tf32 in (("fp16_TFLOPs", torch.float16, False), ("tf32_TFLOPs", torch.float32, True)):
        torch.backends.cuda.matmul.allow_tf32 = tf32
        m = 8192
        x = torch.randn(m, m, device="cuda", dtype=dt)
        y = torch.randn(m, m, device="cuda", dtype=dt)
        for _ in range(3):
            x @ y
        ts = []
        for _ in range(10):
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record(); x @ y; e.record(); e.synchronize()
            ts.append(s.elapsed_time(e))
        out[name] = 2 * m**3 / (median(ts) * 1e-3) / 1e12
    torch.backends.cuda.matmul.allow_tf32 = False
    return out


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


def time_candidates(sig, inputs_cp, out_shape, dtype, ref, tol, reps, arch):
    """{candidate key: (median us or inf, error or None)} for every applicable candidate."""
    import cupy

    from graphopt.kernels.registry import applicable
    from graphopt.kernels.timing import cuda_event_timer, median

    ok, _ = applicable(sig, tuple(int(c) for c in arch[3:5]) if len(arch) >= 5 else (9, 0))
    res = {}
    for cand in ok:
        key = cand.key()
        try:
            launch = cand.build(sig, arch)
            out = cupy.full(out_shape, cupy.nan, dtype=dtype)
            launch(inputs_cp, [out])
            y = out.astype(cupy.float32)
            err = float(cupy.linalg.norm(y - ref) / cupy.linalg.norm(ref))
            if not math.isfinite(err) or err > tol:
                res[key] = (math.inf, f"wrong result: normwise error {err:.2e} > {tol}")
                continue
            ts = cuda_event_timer(launch, inputs_cp, [out], warmup=3, reps=reps)
            res[key] = (median(ts) * 1e3, None)
        except Exception as exc:  # a failing candidate scores infinity and is reported
            res[key] = (math.inf, f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}")
    return res


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results"))
    ap.add_argument("--quick", action="store_true", help="a few layers only (smoke test)")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--batches", default="1,32")
    ap.add_argument("--dtypes", default="float16,float32")
    ap.add_argument("--report-kernels", action="store_true", help="print registers / local memory of every instance and exit")
    args = ap.parse_args(argv)
    if args.report_kernels:
        return report_kernels(args.out)

    import cupy
    import numpy as np
    import torch
    import torch.nn.functional as F

    from graphopt.lowering.contract import Signature
    from graphopt.kernels.geometry import conv_geom
    from graphopt.kernels.registry import all_kernel_instances
    from graphopt.kernels.source import device_arch, prebuild
    from graphopt.kernels.timing import cuda_event_timer, median

    torch.backends.cudnn.benchmark = True
    command = "python3 bench/cbr_layers.py " + " ".join(argv if argv is not None else sys.argv[1:])
    header = env_header(command)
    t0 = time.perf_counter()
    errors = prebuild(all_kernel_instances())
    header["prebuild_s"] = round(time.perf_counter() - t0, 1)
    header["prebuild_errors"] = errors
    header["ceilings"] = measure_ceilings()
    arch = device_arch()
    print(json.dumps(header, indent=1), flush=True)

    layers = [("resnet50",) + l for l in RESNET50] + [("mobilenetv2",) + l for l in MOBILENETV2]
    if args.quick:
        layers = [l for l in layers if l[1] in ("r50.stem", "r50.l1.c2", "r50.l3.c2", "r50.l1.c3", "mv2.s2.1.dw", "mv2.s3.1.pw")]
    stream = cupy.cuda.Stream(non_blocking=False)
    tstream = torch.cuda.ExternalStream(stream.ptr)
    rows = []
    rng = np.random.default_rng(0)
    for dtype in args.dtypes.split(","):
        tdt = {"float16": torch.float16, "float32": torch.float32}[dtype]
        peak = header["ceilings"]["fp16_TFLOPs" if dtype == "float16" else "tf32_TFLOPs"] * 1e12
        bw = header["ceilings"]["copy_TBps"] * 1e12
        for bs in [int(b) for b in args.batches.split(",")]:
            for (model, name, cin, cout, k, s, p, h, g, act, res) in layers:
                attrs = _attrs(k, s, p, g, act)
                xs, ws = (bs, cin, h, h), (cout, cin // g, k, k)
                shapes0 = [xs, ws, (cout,), None]
                geom = conv_geom(Signature.make("CBR", shapes0, [dtype] * 3, attrs))
                oshape = geom.out_shape
                shapes = [xs, ws, (cout,), oshape if res else None]
                sig = Signature.make("CBR", shapes, [dtype] * len(shapes), attrs)
                with stream:
                    (x, w, b, r), (tx, tw, tb, tr), ref_t = layer_data(rng, xs, ws, oshape, s, p, g, act, res, dtype, tstream)
                    stream.synchronize()
                    ref = cupy.asarray(ref_t)
                    tol = 1e-2 if dtype == "float16" else 3e-3
                    cand = time_candidates(sig, [x, w, b, r], oshape, dtype, ref, tol, args.reps, arch)

                    def torch_launch(ins, outs):
                        with torch.cuda.stream(tstream):
                            y = F.conv2d(ins[0], ins[1], ins[2], s, p, 1, g)
                            if res:
                                y = y + ins[3]
                            _act_torch(y, act)

                    tins = [tx, tw, tb, tr]
                    torch_ts = cuda_event_timer(torch_launch, tins, [torch.empty(oshape, dtype=tdt, device="cuda")], warmup=5, reps=args.reps)
                torch_us = median(torch_ts) * 1e3
                best_key = min(cand, key=lambda kk: cand[kk][0]) if cand else None
                best_us = cand[best_key][0] if best_key else math.inf
                # Fused-epilogue cost: the fastest implicit-GEMM config again with no bias, residual or activation.
                epi = None
                ig = [kk for kk in cand if kk.startswith("implicit_gemm") and math.isfinite(cand[kk][0])]
                if ig:
                    from graphopt.kernels.registry import candidate_from_key

                    kbest = min(ig, key=lambda kk: cand[kk][0])
                    a0 = dict(attrs, activation="none")
                    sig0 = Signature.make("CBR", [xs, ws, None, None], [dtype] * 2, a0)
                    with stream:
                        l0 = candidate_from_key("CBR", kbest).build(sig0, arch)
                        o0 = cupy.empty(oshape, dtype=dtype)
                        plain = median(cuda_event_timer(l0, [x, w, None, None], [o0], warmup=3, reps=args.reps)) * 1e3
                    epi = {"config": kbest, "fused_us": round(cand[kbest][0], 2), "plain_us": round(plain, 2),
                           "overhead": round(cand[kbest][0] / plain - 1.0, 4)}
                flops = geom.flops
                esz = 2 if dtype == "float16" else 4
                nbytes = esz * (int(np.prod(xs)) + int(np.prod(ws)) + cout + int(np.prod(oshape)) * (2 if res else 1))
                floor_us = max(flops / peak, nbytes / bw) * 1e6
                row = {
                    "model": model, "layer": name, "bs": bs, "dtype": dtype,
                    "x_shape": list(xs), "w_shape": list(ws), "stride": s, "pad": p, "groups": g, "activation": act, "residual": res,
                    "graphopt_us": round(best_us, 2), "torch_eager_us": round(torch_us, 2), "chosen": best_key,
                    "speedup_vs_torch": round(torch_us / best_us, 3) if best_us > 0 else None,
                    "floor_us": round(floor_us, 2), "flops": flops, "min_bytes": nbytes,
                    "graphopt_TFLOPs": round(flops / (best_us * 1e-6) / 1e12, 1) if math.isfinite(best_us) else 0,
                    "graphopt_TBps": round(nbytes / (best_us * 1e-6) / 1e12, 3) if math.isfinite(best_us) else 0,
                    "torch_TFLOPs": round(flops / (torch_us * 1e-6) / 1e12, 1),
                    "epilogue": epi,
                    "candidates": {kk: (None if not math.isfinite(v[0]) else round(v[0], 2)) for kk, v in cand.items()},
                    "failures": {kk: v[1] for kk, v in cand.items() if v[1]},
                }
                rows.append(row)
                print(f"{model:11s} {name:14s} bs{bs:<2d} {dtype:7s} graphopt {best_us:9.1f} us ({best_key})  torch {torch_us:9.1f} us  "
                      f"x{row['speedup_vs_torch']}  floor {floor_us:7.1f}  {row['graphopt_TFLOPs']} TF/s", flush=True)
                del x, w, b, r, tx, tw, tb, tr, ref, ref_t
                cupy.get_default_memory_pool().free_all_blocks()
            write_results(args.out, header, rows)  # after every (dtype, batch) group: partial runs keep their rows
    summary = write_results(args.out, header, rows)
    print(json.dumps(summary, indent=1))


def write_results(out_dir, header, rows):
    header["summary"] = summarize(rows)
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "cbr_layers_h200.json"), "w") as f:
        json.dump({"header": header, "rows": rows}, f, indent=1)
    with open(os.path.join(out_dir, "cbr_layers_h200.md"), "w") as f:
        f.write(markdown(header, rows))
    return header["summary"]


def report_kernels(out_dir: str):
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
    with open(os.path.join(out_dir, "cbr_layers_h200.kernels.json"), "w") as f:
        json.dump({"prebuild_errors": errors, "kernels": rep}, f, indent=1)


def summarize(rows) -> dict:
    out = {}
    for dtype in sorted({r["dtype"] for r in rows}):
        for bs in sorted({r["bs"] for r in rows}):
            sel = [r for r in rows if r["dtype"] == dtype and r["bs"] == bs and r["speedup_vs_torch"]]
            if not sel:
                continue
            sp = [r["speedup_vs_torch"] for r in sel]
            out[f"{dtype}_bs{bs}"] = {
                "layers": len(sel),
                "at_least_as_fast": sum(1 for v in sp if v >= 1.0),
                "fraction_at_least_as_fast": round(sum(1 for v in sp if v >= 1.0) / len(sp), 3),
                "geomean_speedup": round(math.exp(sum(math.log(v) for v in sp) / len(sp)), 3),
                "best_3x3_TFLOPs": max([r["graphopt_TFLOPs"] for r in sel if r["w_shape"][2] == 3 and r["groups"] == 1] or [0]),
                "epilogue_overhead_max": max([r["epilogue"]["overhead"] for r in sel if r.get("epilogue")] or [0]),
                "epilogue_overhead_median": sorted([r["epilogue"]["overhead"] for r in sel if r.get("epilogue")] or [0])[len([r for r in sel if r.get("epilogue")]) // 2],
            }
    return out


def markdown(header, rows) -> str:
    lines = [f"# CBR layers on {header['gpu']} ({header['date']})", "",
             f"Command: `{header['command']}`; CuPy {header['cupy']}, torch {header['torch']}, cuDNN {header['cudnn']}, "
             f"driver {header['driver']}, NVRTC {header['nvrtc']}.", "",
             f"Ceilings measured in this run: copy {header['ceilings']['copy_TBps']:.2f} TB/s, fp16 GEMM "
             f"{header['ceilings']['fp16_TFLOPs']:.0f} TFLOP/s, tf32 GEMM {header['ceilings']['tf32_TFLOPs']:.0f} TFLOP/s. "
             f"Timing: {header['timing']}.", "", "## Summary", "", "| dtype / batch | layers | >= torch | geomean speed-up | best 3x3 TFLOP/s |", "|---|---|---|---|---|"]
    for k, v in header.get("summary", {}).items():
        lines.append(f"| {k} | {v['layers']} | {v['at_least_as_fast']} ({v['fraction_at_least_as_fast']:.0%}) | {v['geomean_speedup']} | {v['best_3x3_TFLOPs']} |")
    lines += ["", "## Layers", "", "| model | layer | bs | dtype | graphopt us | torch eager us | speed-up | floor us | TFLOP/s | TB/s | chosen |",
              "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['model']} | {r['layer']} | {r['bs']} | {r['dtype']} | {r['graphopt_us']} | {r['torch_eager_us']} | "
                     f"{r['speedup_vs_torch']} | {r['floor_us']} | {r['graphopt_TFLOPs']} | {r['graphopt_TBps']} | {r['chosen']} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
