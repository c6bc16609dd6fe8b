"""Quick exploration of mma_gemm configurations on a few representative layers (fp16).

Run on the GPU:  python3 bench/kernel_explore.py --out bench/results [--families ...] [--batches 32]

For each layer every applicable candidate of the chosen families is built, checked against a float32
cuDNN result and timed with cuda_event_timer (device time, inputs rotated beyond L2), next to torch
eager in the same run. It prints the five fastest per layer and writes
``kernel_explore_h200.json`` (every timing) so that the tile / stage families can be pruned from
data. The NCHW->NHWC transpose that ``implicit_gemm_nhwc`` counts is also timed on its own.
A GEMM row (GemmAct, transB, 4096^3-ish) gives the raw kernel's TFLOP/s against torch.matmul.
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

from cbr_layers import MOBILENETV2, RESNET50, _act_torch, _attrs, env_header, layer_data, measure_ceilings  # noqa: E402

DEFAULT_LAYERS = ("r50.l1.c2", "r50.l2.c2", "r50.l3.c2", "r50.l4.c2", "r50.l3.c2s2", "r50.l1.c3", "r50.l3.c1a",
                  "r50.l4.c1", "r50.l2.c1a", "mv2.s1.0.exp", "mv2.s3.1.pw")


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(HERE, "results"))
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--batches", default="32,1")
    ap.add_argument("--layers", default=",".join(DEFAULT_LAYERS))
    ap.add_argument("--families", default="implicit_gemm_nhwc,pointwise_gemm,cublas,cublas_ws",
                    help="candidate families (name prefixes) to time")
    ap.add_argument("--prebuild-all", action="store_true", help="compile every kernel instance first (fills the cubin cache)")
    ap.add_argument("--pipelined-only", action="store_true", help="only st>=3 configs (plus the old family's 64x64)")
    args = ap.parse_args(argv)

    import cupy
    import numpy as np
    import torch
    import torch.nn.functional as F

    from graphopt.lowering.contract import Signature
    from graphopt.kernels.geometry import conv_geom
    from graphopt.kernels.registry import applicable
    from graphopt.kernels.source import device_arch, get_kernel, instance, prebuild
    from graphopt.kernels.timing import cuda_event_timer, median

    torch.backends.cudnn.benchmark = True
    command = "python3 bench/kernel_explore.py " + " ".join(argv if argv is not None else sys.argv[1:])
    header = env_header(command)
    header["ceilings"] = measure_ceilings()
    arch = device_arch()
    fams = tuple(args.families.split(","))
    wanted = set(args.layers.split(","))
    layers = [l for l in RESNET50 + MOBILENETV2 if l[0] in wanted]

    def keep(c):
        if c.name not in fams:
            return False
        if args.pipelined_only and c.param("st", 2) == 2:
            return c.param("bm") == 64 and c.param("bn") == 64 and c.param("bk") == 64 and c.param("splitk") == 1
        return True

    # Prebuild every instance the chosen candidates of these layers need (parallel NVRTC).
    jobs = []
    sigs = []
    for bs in [int(b) for b in args.batches.split(",")]:
        for (name, cin, cout, k, s, p, h, g, act, res) in layers:
            attrs = _attrs(k, s, p, g, act)
            xs, ws = (bs, cin, h, h), (cout, cin // g, k, k)
            geom = conv_geom(Signature.make("CBR", [xs, ws, (cout,), None], ["float16"] * 3, attrs))
            shapes = [xs, ws, (cout,), geom.out_shape if res else None]
            sig = Signature.make("CBR", shapes, ["float16"] * len(shapes), attrs)
            ok, _ = applicable(sig, (9, 0))
            cands = [c for c in ok if keep(c)]
            sigs.append((bs, name, cin, cout, k, s, p, h, g, act, res, attrs, xs, ws, geom, sig, cands))
            for c in cands:
                jobs += c.kernels(sig)
    jobs.append(("elementwise.cu", "spin"))
    if args.prebuild_all:
        from graphopt.kernels.registry import all_kernel_instances

        jobs = all_kernel_instances() + jobs
    t0 = time.perf_counter()
    header["prebuild_errors"] = {f"{a}|{b}": e for (a, b), e in prebuild(jobs).items()}
    header["prebuild_s"] = round(time.perf_counter() - t0, 1)
    header["instances"] = len(set(jobs))
    print(json.dumps(header, indent=1), flush=True)

    stream = cupy.cuda.Stream(non_blocking=False)
    tstream = torch.cuda.ExternalStream(stream.ptr)
    rng = np.random.default_rng(0)
    rows = []
    peak = header["ceilings"]["fp16_TFLOPs"] * 1e12
    for (bs, name, cin, cout, k, s, p, h, g, act, res, attrs, xs, ws, geom, sig, cands) in sigs:
        oshape = geom.out_shape
        with stream:
            (x, w, b, r), (tx, tw, tb, tr), ref_t = layer_data(rng, xs, ws, oshape, s, p, g, act, res, "float16", tstream)
            stream.synchronize()
            ref = cupy.asarray(ref_t)
            times = {}
            for c in cands:
                key = c.key()
                try:
                    launch = c.build(sig, arch)
                    out = cupy.full(oshape, cupy.nan, dtype="float16")
                    launch([x, w, b, r], [out])
                    err = float(cupy.linalg.norm(out.astype(cupy.float32) - ref) / cupy.linalg.norm(ref))
                    if not math.isfinite(err) or err > 1e-2:
                        times[key] = f"wrong result: normwise error {err:.2e}"
                        continue
                    times[key] = round(median(cuda_event_timer(launch, [x, w, b, r], [out], warmup=3, reps=args.reps)) * 1e3, 2)
                except Exception as exc:
                    times[key] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}"

            def torch_launch(ins, outs):
                with torch.cuda.stream(tstream):
                    y = F.conv2d(ins[0], ins[1], ins[2], s, p, 1, g)
                    if res:
                        y = y + ins[3]
                    _act_torch(y, act)

            torch_us = median(cuda_event_timer(torch_launch, [tx, tw, tb, tr], [torch.empty(oshape, dtype=torch.float16, device="cuda")],
                                               warmup=5, reps=args.reps)) * 1e3
            tr_us = None
            if k > 1 and cin % 32 == 0:
                trk = get_kernel("elementwise.cu", instance("nchw_to_nhwc", "float16"))
                xn = cupy.empty((bs, h, h, cin), dtype="float16")
                HW = h * h

                def tr_launch(ins, outs):
                    trk((-(-HW // 32), -(-cin // 32), bs), (32, 8), (ins[0], outs[0], np.int32(cin), np.int32(HW)))

                tr_us = round(median(cuda_event_timer(tr_launch, [x], [xn], warmup=3, reps=args.reps)) * 1e3, 2)
        ok = {kk: v for kk, v in times.items() if isinstance(v, float)}
        top = sorted(ok, key=ok.get)[:6]
        best = ok[top[0]] if top else math.inf
        row = {"layer": name, "bs": bs, "torch_us": round(torch_us, 2), "best_us": best, "best": top[0] if top else None,
               "speedup": round(torch_us / best, 3) if top else 0, "TFLOPs": round(geom.flops / (best * 1e-6) / 1e12, 1) if top else 0,
               "floor_compute_us": round(geom.flops / peak * 1e6, 2), "nhwc_transpose_us": tr_us, "times": times}
        rows.append(row)
        print(f"{name:13s} bs{bs:<2d} torch {torch_us:8.1f}  best {best:8.1f} x{row['speedup']:<6} {row['TFLOPs']:6.1f} TF/s  transpose {tr_us}", flush=True)
        for kk in top:
            print(f"      {ok[kk]:8.1f}  {kk}")
        bad = {kk: v for kk, v in times.items() if not isinstance(v, float)}
        for kk, v in list(bad.items())[:5]:
            print(f"      FAIL {kk}: {v}")
        del x, w, b, r, tx, tw, tb, tr, ref, ref_t
        cupy.get_default_memory_pool().free_all_blocks()

    # Raw GEMM throughput of the GemmAct family (transB mode 1 and MatMul mode 0) vs torch.matmul.
    gemm_rows = []
    for (M, N, K, transb) in ((4096, 4096, 4096, 1), (4096, 4096, 4096, 0), (8192, 3072, 768, 0)):
        attrs = {"mode": "gemm", "transA": 0, "transB": transb, "alpha": 1.0, "beta": 1.0, "activation": "none"}
        bshape = (N, K) if transb else (K, N)
        try:
            sig = Signature.make("GemmAct", [(M, K), bshape, None], ["float16", "float16"], attrs)
        except Exception as exc:
            gemm_rows.append({"shape": [M, N, K, transb], "error": str(exc)})
            continue
        ok_c, _ = applicable(sig, (9, 0))
        cands = [c for c in ok_c if c.name in ("cublas", "cublas_ws")
                 or (c.name == "mma_gemm" and (c.param("st", 2) > 2 or (c.param("bm"), c.param("bn")) == (128, 128)))]
        prebuild([j for c in cands for j in c.kernels(sig)])
        with stream:
            a = cupy.asarray(rng.standard_normal((M, K), dtype=np.float32)).astype("float16")
            bm_ = cupy.asarray(rng.standard_normal(bshape, dtype=np.float32) / math.sqrt(K)).astype("float16")
            ta, tb_ = torch.as_tensor(a, device="cuda"), torch.as_tensor(bm_, device="cuda")
            ref = cupy.asarray((ta.float() @ (tb_.float().T if transb else tb_.float())))
            times = {}
            for c in cands:
                try:
                    launch = c.build(sig, arch)
                    out = cupy.full((M, N), cupy.nan, dtype="float16")
                    launch([a, bm_, None], [out])
                    err = float(cupy.linalg.norm(out.astype(cupy.float32) - ref) / cupy.linalg.norm(ref))
                    if not math.isfinite(err) or err > 1e-2:
                        times[c.key()] = f"wrong result {err:.2e}"
                        continue
                    times[c.key()] = round(median(cuda_event_timer(launch, [a, bm_, None], [out], warmup=3, reps=args.reps)) * 1e3, 2)
                except Exception as exc:
                    times[c.key()] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}"

            def tmm(ins, outs):
                with torch.cuda.stream(tstream):
                    torch.matmul(ins[0], ins[1].T if transb else ins[1], out=outs[0])

            t_us = median(cuda_event_timer(tmm, [ta, tb_], [torch.empty((M, N), dtype=torch.float16, device="cuda")], warmup=3, reps=args.reps)) * 1e3
        ok = {kk: v for kk, v in times.items() if isinstance(v, float)}
        top = sorted(ok, key=ok.get)[:5]
        fl = 2 * M * N * K
        gr = {"shape": [M, N, K, transb], "torch_us": round(t_us, 2), "torch_TFLOPs": round(fl / t_us / 1e6, 1),
              "best": top[0] if top else None, "best_TFLOPs": round(fl / ok[top[0]] / 1e6, 1) if top else 0, "times": times}
        gemm_rows.append(gr)
        print(f"GEMM {M}x{N}x{K} tB={transb}: torch {gr['torch_TFLOPs']} TF/s; best {gr['best_TFLOPs']} TF/s")
        for kk in top:
            print(f"      {fl / ok[kk] / 1e6:7.1f} TF/s  {kk}")
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "kernel_explore_h200.json"), "w") as f:
        json.dump({"header": header, "rows": rows, "gemm": gemm_rows}, f, indent=1)


if __name__ == "__main__":
    main()
