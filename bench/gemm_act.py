"""GemmAct lowerings vs PyTorch eager on GPT-2 / BERT MLP shapes.

Run on the GPU:  python3 bench/gemm_act.py --out bench/results

Each row is one MLP projection y = act(x @ W + b) with x of shape (batch, seq, K) (MatMul mode,
W as [K, N], as the GPT-2 / BERT exports have it), fp16 and fp32. Every applicable candidate is
checked against a float32 (TF32 off) torch result and timed with cuda_event_timer; torch eager
(matmul, + bias, activation; default TF32 off for fp32 matmul) is timed with the same timer.
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

from cbr_layers import env_header, measure_ceilings, time_candidates  # noqa: E402

# (name, K, N, activation)
LAYERS = [
    ("gpt2.fc", 768, 3072, "GeluTanh"),
    ("gpt2.proj", 3072, 768, "none"),
    ("bert-base.fc", 768, 3072, "Gelu"),
    ("bert-large.fc", 1024, 4096, "Gelu"),
    ("bert-large.proj", 4096, 1024, "none"),
    ("gpt2-medium.fc", 1024, 4096, "GeluTanh"),
]
TOKENS = [(1, 128), (8, 512), (32, 128)]


def save(args, header, rows, command) -> dict:
    """Write gemm_act_h200.json and .md under args.out (called after every row: a run cut short keeps its rows)."""
    sp = {}
    for dtype in args.dtypes.split(","):
        s = [r["speedup_vs_torch"] for r in rows if r["dtype"] == dtype and r["speedup_vs_torch"]]
        if s:
            sp[dtype] = {"rows": len(s), "at_least_as_fast": sum(v >= 1 for v in s), "geomean_speedup": round(math.exp(sum(map(math.log, s)) / len(s)), 3)}
    header["summary"] = sp
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "gemm_act_h200.json"), "w") as f:
        json.dump({"header": header, "rows": rows}, f, indent=1)
    lines = [f"# GemmAct (MLP projections) on {header['gpu']} ({header['date']})", "", f"Command: `{command}`; CuPy {header['cupy']}, torch {header['torch']}.", "",
             f"Ceilings: copy {header['ceilings']['copy_TBps']:.2f} TB/s, fp16 {header['ceilings']['fp16_TFLOPs']:.0f} TFLOP/s, tf32 {header['ceilings']['tf32_TFLOPs']:.0f} TFLOP/s. Timing: {header['timing']}.", "",
             "Summary: " + json.dumps(sp), "",
             "| layer | tokens | dtype | graphopt us | torch eager us | speed-up | own best us | cuDNN best us | cuBLASLt best us | floor us | TFLOP/s | epilogue overhead | chosen |", "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['layer']} | {r['tokens'][0]}x{r['tokens'][1]} | {r['dtype']} | {r['graphopt_us']} | {r['torch_eager_us']} | {r['speedup_vs_torch']} | "
                     f"{r['own_best_us']} | {r['cudnn_best_us']} | {r['cublaslt_best_us']} | {r['floor_us']} | {r['graphopt_TFLOPs']} | {r['epilogue_overhead']} | {r['chosen']} |")
    with open(os.path.join(args.out, "gemm_act_h200.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    return sp


def provider_bests(cand: dict) -> dict:
    """``own_best_us``, ``cudnn_best_us``, ``cublaslt_best_us``: the fastest correct candidate of each
    source (None where it offered none that ran)."""
    out = {}
    for col, pick in (("own_best_us", lambda k: not k.startswith(("cudnn", "cublaslt"))),
                      ("cudnn_best_us", lambda k: k.startswith("cudnn")),
                      ("cublaslt_best_us", lambda k: k.startswith("cublaslt"))):
        ts = [v[0] for k, v in cand.items() if pick(k) and math.isfinite(v[0])]
        out[col] = round(min(ts), 2) if ts else None
    return out


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(HERE, "results"))
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--dtypes", default="float16,float32")
    ap.add_argument("--header-from", default=None, help="reuse ceilings from a cbr_layers json (same run)")
    ap.add_argument("--budget", type=float, default=math.inf, help="seconds; rows after it are skipped and the run says so")
    args = ap.parse_args(argv)

    import cupy
    import numpy as np
    import torch
    import torch.nn.functional as F

    from graphopt.lowering.contract import Signature
    from graphopt.kernels.registry import all_kernel_instances
    from graphopt.kernels.source import device_arch, prebuild
    from graphopt.kernels.timing import cuda_event_timer, median

    t_start = time.perf_counter()
    command = "python3 bench/gemm_act.py " + " ".join(argv if argv is not None else sys.argv[1:])
    header = env_header(command)
    header["complete"] = False
    t0 = time.perf_counter()
    header["prebuild_errors"] = prebuild(all_kernel_instances())
    header["prebuild_s"] = round(time.perf_counter() - t0, 1)
    if args.header_from and os.path.exists(args.header_from):
        with open(args.header_from) as f:
            header["ceilings"] = json.load(f)["header"]["ceilings"]
        header["ceilings_from"] = args.header_from
    else:
        header["ceilings"] = measure_ceilings()
    arch = device_arch()
    stream = cupy.cuda.Stream(non_blocking=False)
    tstream = torch.cuda.ExternalStream(stream.ptr)
    rng = np.random.default_rng(0)
    rows = []
    torch.backends.cuda.matmul.allow_tf32 = False
    for dtype in args.dtypes.split(","):
        peak = header["ceilings"]["fp16_TFLOPs" if dtype == "float16" else "tf32_TFLOPs"] * 1e12
        bw = header["ceilings"]["copy_TBps"] * 1e12
        for bsz, seq in TOKENS:
            for name, K, N, act in LAYERS:
                if time.perf_counter() - t_start > args.budget:
                    header["cut_short"] = f"budget of {args.budget:g} s spent: later rows were not measured"
                    continue
                ash, bsh = (bsz, seq, K), (K, N)
                attrs = {"mode": "matmul", "activation": act}
                sig = Signature.make("GemmAct", [ash, bsh, (N,)], [dtype] * 3, attrs)
                with stream:
                    a = cupy.asarray(rng.standard_normal(ash, dtype=np.float32)).astype(dtype)
                    w = cupy.asarray(rng.standard_normal(bsh, dtype=np.float32) / math.sqrt(K)).astype(dtype)
                    b = cupy.asarray(rng.standard_normal(N, dtype=np.float32)).astype(dtype)
                    ta, tw, tb = (torch.as_tensor(v, device="cuda") for v in (a, w, b))
                    tact = {"Gelu": lambda y: F.gelu(y), "GeluTanh": lambda y: F.gelu(y, approximate="tanh"), "none": lambda y: y}[act]
                    with torch.cuda.stream(tstream):
                        ref_t = tact(ta.float() @ tw.float() + tb.float())
                    stream.synchronize()
                    ref = cupy.asarray(ref_t)
                    tol = 1e-2 if dtype == "float16" else 3e-3
                    cand = time_candidates(sig, [a, w, b], (bsz, seq, N), dtype, ref, tol, args.reps, arch)

                    def torch_launch(ins, outs):
                        with torch.cuda.stream(tstream):
                            tact(torch.matmul(ins[0], ins[1]) + ins[2])

                    tts = cuda_event_timer(torch_launch, [ta, tw, tb], [torch.empty((bsz, seq, N), dtype=ta.dtype, device="cuda")],
                                           warmup=5, reps=args.reps)
                torch_us = median(tts) * 1e3
                best = min(cand, key=lambda kk: cand[kk][0]) if cand else None
                best_us = cand[best][0] if best else math.inf
                M = bsz * seq
                flops = 2 * M * N * K
                esz = 2 if dtype == "float16" else 4
                nbytes = esz * (M * K + K * N + N + M * N)
                floor_us = max(flops / peak, nbytes / bw) * 1e6
                # The cost of the fused epilogue: the same mma config with activation none and no bias.
                epi_cost = None
                if best and best.startswith("mma_gemm"):
                    from graphopt.kernels.registry import candidate_from_key

                    c0 = candidate_from_key("GemmAct", best)
                    sig0 = Signature.make("GemmAct", [ash, bsh, None], [dtype] * 3, {"mode": "matmul", "activation": "none"})
                    with stream:
                        l0 = c0.build(sig0, arch)
                        out0 = cupy.empty((bsz, seq, N), dtype=dtype)
                        plain = median(cuda_event_timer(l0, [a, w, None], [out0], warmup=3, reps=args.reps)) * 1e3
                    epi_cost = round(best_us / plain - 1.0, 4)
                row = {
                    "layer": name, "tokens": [bsz, seq], "M": M, "N": N, "K": K, "dtype": dtype, "activation": act,
                    "graphopt_us": round(best_us, 2), "torch_eager_us": round(torch_us, 2), "chosen": best,
                    "speedup_vs_torch": round(torch_us / best_us, 3) if best_us > 0 else None,
                    "floor_us": round(floor_us, 2),
                    "graphopt_TFLOPs": round(flops / (best_us * 1e-6) / 1e12, 1) if math.isfinite(best_us) else 0,
                    "torch_TFLOPs": round(flops / (torch_us * 1e-6) / 1e12, 1),
                    "epilogue_overhead": epi_cost,
                    **provider_bests(cand),
                    "candidates": {kk: (None if not math.isfinite(v[0]) else round(v[0], 2)) for kk, v in cand.items()},
                    "failures": {kk: v[1] for kk, v in cand.items() if v[1]},
                }
                rows.append(row)
                save(args, header, rows, command)
                print(f"{name:16s} {bsz}x{seq:<4d} {dtype:7s} graphopt {best_us:8.1f} us ({best})  torch {torch_us:8.1f} us  "
                      f"x{row['speedup_vs_torch']}  floor {floor_us:6.1f}  {row['graphopt_TFLOPs']} TF/s epi {epi_cost}", flush=True)
                cupy.get_default_memory_pool().free_all_blocks()
    header["complete"] = "cut_short" not in header
    sp = save(args, header, rows, command)
    print(json.dumps(sp, indent=1))


if __name__ == "__main__":
    main()
