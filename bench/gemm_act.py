"""GemmAct: the lowering the tuner would choose against PyTorch eager on GPT-2 / BERT-base projection and
MLP shapes (issue 20's "Benchmarks").

Run on the GPU:  python3 bench/gemm_act.py --out bench/results [--dtypes float16] [--budget 300]

Each row is one projection y = act(x @ W + b), x of shape (batch, 128, K), W as [K, N] (MatMul mode,
as the exports have it). Every candidate of graphopt.kernels.registry (own kernels, cuBLASLt and
cuDNN when their providers offer GemmAct) is profiled by the tuner's own backend
(bench/lowering_bench.TunerChoice); ``graphopt_us`` is the fastest correct one, ``<provider>_best_us``
each provider's best. torch eager (matmul, + bias, activation; TF32 off for fp32) is timed with the
same timer. Rows are written after every shape to OUT/gemm_act_<gpu-name>.json and .md.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, HERE)

from lowering_bench import (GPU_NAME_HELP, Budget, TunerChoice, env_header, geomean, gpu_tag, measure_ceilings, prebuild_all,  # noqa: E402
                            torch_graph_or_reason, torch_us, write_atomic, write_json)

# lowering_bench.provider_of's names: cuDNN's GemmAct plans come from graphopt.providers.cudnn_matmul
PROVIDERS = ("own", "cublaslt", "cudnn_matmul")
# (name, K, N, activation): GPT-2 124M and BERT-base projections and MLP
LAYERS = [
    ("gpt2.c_attn", 768, 2304, "none"),
    ("gpt2.attn.c_proj", 768, 768, "none"),
    ("gpt2.mlp.c_fc", 768, 3072, "GeluTanh"),
    ("gpt2.mlp.c_proj", 3072, 768, "none"),
    ("bert.qkv", 768, 768, "none"),
    ("bert.intermediate", 768, 3072, "Gelu"),
    ("bert.output", 3072, 768, "none"),
    ("gpt2.lm_head", 768, 50257, "none"),  # tied to wte, no bias: B's rows (N = 50257) are odd-length
]
NO_BIAS = {"gpt2.lm_head"}
TOKENS = [(1, 128), (32, 128)]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.path.join(HERE, "results"))
    ap.add_argument("--reps", type=int, default=20, help="torch timings")
    ap.add_argument("--dtypes", default="float16")
    ap.add_argument("--budget", type=float, default=300.0, help="seconds; shapes past it are skipped and listed")
    ap.add_argument("--gpu-name", default=None, help=GPU_NAME_HELP)
    ap.add_argument("--rerender", default=None, metavar="JSON",
                    help="no GPU: rewrite a run's per-provider columns, summary and markdown from its rows into --out")
    ap.add_argument("--only", default=None, help="comma-separated layer names (default: every layer)")
    ap.add_argument("--tokens", default=None, help="batch sizes to run, comma-separated (default: 1,32)")
    ap.add_argument("--providers", default=None, help=f"comma-separated subset of {','.join(PROVIDERS)} (default: all)")
    args = ap.parse_args(argv)
    if args.rerender:
        return rerender(args.rerender, args.out, args.gpu_name)
    args.gpu_name = args.gpu_name or gpu_tag()
    # fp16 / fp32 too: device_calls.sh shares one DTYPES between the e2e steps (fp16) and this one
    dtypes = [{"fp16": "float16", "fp32": "float32"}.get(d, d) for d in args.dtypes.split(",")]
    bad = [d for d in dtypes if d not in ("float16", "float32")]
    if bad:
        ap.error(f"unknown dtype: {', '.join(bad)} (float16 or fp16, float32 or fp32)")
    budget = Budget(args.budget)

    import cupy
    import torch
    import torch.nn.functional as F

    from graphopt.kernels.registry import signature_of

    command = "python3 bench/gemm_act.py " + " ".join(argv if argv is not None else sys.argv[1:])
    header = env_header(command)
    header.update(prebuild_all())
    header["ceilings"] = measure_ceilings()
    torch.backends.cuda.matmul.allow_tf32 = False
    rows, skipped = [], []
    acts = {"Gelu": lambda y: F.gelu(y), "GeluTanh": lambda y: F.gelu(y, approximate="tanh"), "none": lambda y: y}

    def save():
        header["summary"] = summarize(rows)
        header["skipped_for_time"] = skipped
        write_json(os.path.join(args.out, f"gemm_act_{args.gpu_name}.json"), {"header": header, "rows": rows})
        write_atomic(os.path.join(args.out, f"gemm_act_{args.gpu_name}.md"), markdown(header, rows))

    layers = [lay for lay in LAYERS if not args.only or lay[0] in args.only.split(",")]
    tokens = [t for t in TOKENS if not args.tokens or str(t[0]) in args.tokens.split(",")]
    if not layers or not tokens:
        ap.error(f"--only / --tokens select nothing (layers: {', '.join(n for n, *_ in LAYERS)}; batches 1, 32)")
    header["selection"] = {"layers": [n for n, *_ in layers], "tokens": tokens, "providers": args.providers or "all"}
    with TunerChoice(providers=tuple(args.providers.split(",")) if args.providers else None) as tuner:
        for dtype in dtypes:
            tdt = {"float16": torch.float16, "float32": torch.float32}[dtype]
            peak = header["ceilings"]["fp16_TFLOPs" if dtype == "float16" else "tf32_TFLOPs"] * 1e12
            bw = header["ceilings"]["copy_TBps"] * 1e12
            for bsz, seq in tokens:
                for name, K, N, act in layers:
                    if budget.left() < 10:
                        skipped.append(f"{name} {bsz}x{seq} {dtype}")
                        continue
                    M = bsz * seq
                    row = {"layer": name, "tokens": [bsz, seq], "M": M, "N": N, "K": K, "dtype": dtype, "activation": act}
                    try:
                        bias = name not in NO_BIAS
                        sig = signature_of("GemmAct", [(bsz, seq, K), (K, N), (N,) if bias else None],
                                           [dtype, dtype, dtype if bias else ""], {"mode": "matmul", "activation": act})
                        choice = tuner.profile(sig)
                        ta = torch.randn(bsz, seq, K, device="cuda", dtype=tdt)
                        tw = torch.randn(K, N, device="cuda", dtype=tdt) / math.sqrt(K)
                        tb = torch.randn(N, device="cuda", dtype=tdt)
                        def torch_fn(a, w, b):
                            return acts[act](torch.matmul(a, w) + b if bias else torch.matmul(a, w))
                        t_us = torch_us(torch_fn, [ta, tw, tb], torch.empty(bsz, seq, N, device="cuda", dtype=tdt), args.reps)
                        # torch's same ops in a CUDA graph, timed as graphopt's choice is (the peer is eager)
                        row["torch_graph_us"], why = torch_graph_or_reason(torch_fn, [ta, tw, tb], args.reps)
                        if why:
                            row["torch_graph_error"] = why
                        if not bias:  # what the torch model runs: F.linear on the [N, K] weight (rows K apart)
                            twt = tw.t().contiguous()
                            row["torch_linear_us"] = torch_us(lambda a, w: F.linear(a, w), [ta, twt],
                                                              torch.empty(bsz, seq, N, device="cuda", dtype=tdt), args.reps)
                        esz = 2 if dtype == "float16" else 4
                        gus = choice["graphopt_us"]
                        best = choice["best_by_provider"]
                        row.update({
                            "graphopt_us": gus, "chosen": choice["chosen"], "chosen_provider": choice["chosen_provider"],
                            **provider_columns(best),
                            "best_by_provider": best, "torch_eager_us": t_us,
                            "vs_torch": round(t_us / gus, 3) if gus else None,
                            "vs_torch_graph": round(row["torch_graph_us"] / gus, 3) if gus and row["torch_graph_us"] else None,
                            "floor_us": round(max(2 * M * N * K / peak, esz * (M * K + K * N + N * bias + M * N) / bw) * 1e6, 2),
                            "graphopt_TFLOPs": round(2 * M * N * K / (gus * 1e-6) / 1e12, 1) if gus else None,
                            "candidates": choice["candidates"], "failures": choice["failures"], "pruned": choice["pruned"],
                        })
                    except Exception as exc:  # noqa: BLE001 - one broken shape must not end the run
                        row["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"
                    rows.append(row)
                    print(f"{name:18s} {bsz}x{seq} {dtype}: graphopt {row.get('graphopt_us')} us ({row.get('chosen')}) "
                          f"torch {row.get('torch_eager_us')} us x{row.get('vs_torch')} {row.get('error', '')}", flush=True)
                    cupy.get_default_memory_pool().free_all_blocks()
                    save()
    save()
    print(json.dumps(header["summary"], indent=1))
    return 0


def provider_columns(best: dict) -> dict:
    """``<provider>_best_us`` for every provider, from a row's ``best_by_provider``."""
    return {f"{pv}_best_us": (best.get(pv) or {}).get("us") for pv in PROVIDERS}


def rerender(path: str, out_dir: str, gpu_name: str | None = None) -> int:
    """A run's file again with this script's provider columns and summary (from its own rows), named by
    ``gpu_name`` or else by the GPU the run's header names (no GPU here: this machine's is no answer)."""
    with open(path) as f:
        doc = json.load(f)
    header, rows = doc["header"], doc["rows"]
    gpu_name = gpu_name or gpu_tag(header.get("gpu", ""))
    for r in rows:
        if "best_by_provider" in r:
            r.pop("cudnn_best_us", None)  # the label before cuDNN's GemmAct plans were named by their module
            r.update(provider_columns(r["best_by_provider"]))
    header["summary"] = summarize(rows)
    write_json(os.path.join(out_dir, f"gemm_act_{gpu_name}.json"), {"header": header, "rows": rows})
    write_atomic(os.path.join(out_dir, f"gemm_act_{gpu_name}.md"), markdown(header, rows))
    return 0


def summarize(rows) -> dict:
    out = {}
    for dtype in sorted({r["dtype"] for r in rows}):
        sel = [r for r in rows if r["dtype"] == dtype and r.get("vs_torch")]
        if sel:
            graph = [r["vs_torch_graph"] for r in sel if r.get("vs_torch_graph")]
            out[dtype] = {"rows": len(sel), "at_least_as_fast_as_torch": sum(r["vs_torch"] >= 1.0 for r in sel),
                          "geomean_vs_torch": geomean(r["vs_torch"] for r in sel),
                          # torch's same ops captured in a CUDA graph, timed as graphopt's choice is (no eager gaps)
                          "at_least_as_fast_as_torch_graph": f"{sum(v >= 1.0 for v in graph)} of {len(graph)}",
                          "chosen_provider": {pv: sum(r.get("chosen_provider") == pv for r in sel) for pv in PROVIDERS}}
    return out


def markdown(header, rows) -> str:
    lines = [f"# GemmAct (GPT-2 / BERT-base projections) on {header['gpu']} ({header['date']})", "",
             f"Command: `{header['command']}`; CuPy {header['cupy']}, torch {header['torch']}; providers "
             f"{header.get('providers')}. Ceilings: copy {header['ceilings']['copy_TBps']:.2f} TB/s, fp16 "
             f"{header['ceilings']['fp16_TFLOPs']:.0f} TFLOP/s. Timing: {header['timing']}.", "",
             "Summary: " + json.dumps(header.get("summary", {})), "",
             "`torch graph us`: torch's same ops captured in a CUDA graph, timed as graphopt's choice is (no eager launch gaps).", "",
             "| layer | tokens | dtype | graphopt us | chosen | own us | cuBLASLt us | cuDNN us | torch eager us | x torch | torch graph us | x torch graph | floor us |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        tok = f"{r['tokens'][0]}x{r['tokens'][1]}"
        if "error" in r:
            lines.append(f"| {r['layer']} | {tok} | {r['dtype']} | error: {r['error']} | | | | | | | | | |")
            continue
        layer = r["layer"] + (f" (torch F.linear on [N, K]: {r['torch_linear_us']} us)" if r.get("torch_linear_us") else "")
        lines.append(f"| {layer} | {tok} | {r['dtype']} | {r['graphopt_us']} | `{r['chosen']}` | {r['own_best_us']} | "
                     f"{r['cublaslt_best_us']} | {r['cudnn_matmul_best_us']} | {r['torch_eager_us']} | {r['vs_torch']} | "
                     f"{r.get('torch_graph_us', '-')} | {r.get('vs_torch_graph', '-')} | {r['floor_us']} |")
    if header.get("skipped_for_time"):
        lines += ["", "Skipped for the time budget: " + ", ".join(header["skipped_for_time"])]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
