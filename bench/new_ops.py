"""RoPE, GroupNorm and GatedMLP: graphopt's lowerings against torch eager (the same math in torch), one run.

Run on the GPU (repository root):  python3 bench/new_ops.py --out "$OUT"   (--quick: one row per op)

Shapes are LLaMA / diffusion-like: GatedMLP (SwiGLU) at 128 and 4096 tokens, hidden 4096, intermediate
11008; RoPE on [B, H, S, D] = [1, 32, 4096, 128] (and S = 128) with [1, 1, S, D] tables, both forms;
GroupNorm on [8, 512, 64, 64] with 32 groups (and SD's [2, 320, 64, 64]), with and without SiLU.
fp16 by default (``--dtypes float16,float32`` adds fp32).

Per row: every applicable candidate of graphopt's own lowerings (``graphopt.kernels.registry``), the
heuristic's choice, and torch: eager (CUDA events around each call: what an eager user sees, host
gaps between its kernels included) and the same torch code replayed from a CUDA graph (device time).
graphopt's lowerings are timed as the profiler times them (``graphopt.kernels.timing.cuda_event_timer``:
inside a CUDA graph for capturable lowerings); inputs rotate over >= 128 MiB on both sides. Every
timed output is first checked against torch's result computed in fp32 (max |err| / max |ref|).
Medians over --reps. ``$OUT/new_ops_h200.json`` and ``.md`` are rewritten after every row; each row
and the whole run have their own time limits (--row-limit-s, --budget-s): rows past the budget are
recorded as skipped.
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
from lowering_bench import torch_graph_ms, write_atomic  # noqa: E402

ROTATE_BYTES = 128 << 20
TOL = {"float16": 2e-2, "float32": 1e-4}

# (name, op, dims, attrs)
ROWS = [
    ("SwiGLU tokens=128 4096->11008", "GatedMLP", dict(tokens=128, k=4096, n=11008), {"activation": "SiLU"}),
    ("SwiGLU tokens=4096 4096->11008", "GatedMLP", dict(tokens=4096, k=4096, n=11008), {"activation": "SiLU"}),
    ("RoPE half [1,32,4096,128]", "RoPE", dict(b=1, h=32, s=4096, d=128), {"interleaved": 0}),
    ("RoPE interleaved [1,32,4096,128]", "RoPE", dict(b=1, h=32, s=4096, d=128), {"interleaved": 1}),
    ("RoPE half [1,32,128,128]", "RoPE", dict(b=1, h=32, s=128, d=128), {"interleaved": 0}),
    ("GroupNorm [8,512,64,64] g32", "GroupNorm", dict(n=8, c=512, hw=(64, 64), g=32), {}),
    ("GroupNorm+SiLU [8,512,64,64] g32", "GroupNorm", dict(n=8, c=512, hw=(64, 64), g=32), {"activation": "SiLU"}),
    ("GroupNorm+SiLU [2,320,64,64] g32", "GroupNorm", dict(n=2, c=320, hw=(64, 64), g=32), {"activation": "SiLU"}),
]


def _inputs(op, dims, dtype, torch):
    """(torch tensors in graphopt's input order, output shape)."""
    dev, dt = "cuda", getattr(torch, dtype)
    g = torch.Generator(device=dev).manual_seed(0)
    rn = lambda *s: torch.randn(*s, generator=g, device=dev, dtype=torch.float32)  # noqa: E731
    if op == "GatedMLP":
        k, n = dims["k"], dims["n"]
        ins = [rn(1, dims["tokens"], k), rn(k, n) / math.sqrt(k), rn(k, n) / math.sqrt(k)]
        return [a.to(dt) for a in ins], (1, dims["tokens"], n)
    if op == "RoPE":
        b, h, s, d = dims["b"], dims["h"], dims["s"], dims["d"]
        pos = torch.arange(s, device=dev, dtype=torch.float32)[:, None]
        freq = 10000.0 ** (-torch.arange(0, d, 2, device=dev, dtype=torch.float32) / d)
        ang = torch.cat([pos * freq, pos * freq], -1)[None, None]
        return [rn(b, h, s, d).to(dt), ang.cos().to(dt), ang.sin().to(dt)], (b, h, s, d)
    c = dims["c"]
    x = (2 * rn(dims["n"], c, *dims["hw"]) + 0.5).to(dt)
    return [x, rn(c, 1, 1).to(dt), rn(c, 1, 1).to(dt)], tuple(x.shape)


def _torch_fn(op, attrs, dims, F, torch):
    """fn(inputs) -> output, the same math in torch (as the exporters' source models write it)."""
    if op == "GatedMLP":
        return lambda ins: F.silu(ins[0] @ ins[1]) * (ins[0] @ ins[2])
    if op == "RoPE":
        if attrs.get("interleaved"):
            def rot(x):
                return torch.stack((-x[..., 1::2], x[..., 0::2]), -1).flatten(-2)
        else:
            def rot(x):
                h = x.shape[-1] // 2
                return torch.cat((-x[..., h:], x[..., :h]), -1)
        return lambda ins: ins[0] * ins[1] + rot(ins[0]) * ins[2]
    g = dims["g"]
    act = F.silu if attrs.get("activation") == "SiLU" else (lambda y: y)
    return lambda ins: act(F.group_norm(ins[0], g, ins[1].reshape(-1), ins[2].reshape(-1), 1e-5))


def _sets(ins, torch):
    per = max(1, sum(a.numel() * a.element_size() for a in ins))
    n = max(1, min(16, -(-ROTATE_BYTES // per)))
    return [ins] + [[a.clone() for a in ins] for _ in range(n - 1)]


def _torch_times(fn, sets, reps, torch):
    """(eager ms per call, CUDA-graph replay ms per call), medians."""
    from graphopt.kernels.timing import median

    for i in range(3):
        fn(sets[i % len(sets)])
    torch.cuda.synchronize()
    ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
    for i, (s, e) in enumerate(ev):
        s.record()
        fn(sets[i % len(sets)])
        e.record()
    torch.cuda.synchronize()
    eager = median([s.elapsed_time(e) for s, e in ev])
    graph_ms = None
    try:
        graph_ms = torch_graph_ms(lambda i: fn(sets[i % len(sets)]), reps=min(reps, 20))
    except Exception as exc:  # noqa: BLE001 - reported, the eager number stands
        graph_ms = f"{type(exc).__name__}: {str(exc).splitlines()[0][:120]}"
    return eager, graph_ms


def _finite(v):
    """The document with infinities as None (strict JSON)."""
    if isinstance(v, dict):
        return {k: _finite(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_finite(x) for x in v]
    return None if isinstance(v, float) and not math.isfinite(v) else v


def _write(out_dir, doc):
    for name, text in (("new_ops_h200.json", json.dumps(_finite(doc), indent=1, default=str)), ("new_ops_h200.md", _markdown(doc))):
        write_atomic(os.path.join(out_dir, name), text)


def _us(v):
    return f"{v:.1f}" if isinstance(v, (int, float)) and math.isfinite(v) else "-"


def _markdown(doc) -> str:
    h = doc["header"]
    lines = [f"# New ops vs torch eager ({h.get('gpu', '?')}, {h.get('date', '?')})", "",
             f"Command: `{h.get('command', '')}`. Times are medians in microseconds; speedup = torch eager / graphopt best.", "",
             "| row | dtype | graphopt heuristic | us | best candidate | us | torch eager us | torch graph us | speedup vs eager | vs torch graph | max rel err |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in doc["rows"]:
        if r.get("skipped"):
            lines.append(f"| {r['name']} | {r['dtype']} | skipped: {r['skipped']} |  |  |  |  |  |  |  |  |")
            continue
        best, heur = r.get("best_us"), r.get("heuristic_us")
        te, tg = r.get("torch_eager_us"), r.get("torch_graph_us")
        sp = f"{te / best:.2f}x" if isinstance(te, float) and isinstance(best, float) and best > 0 and math.isfinite(best) else "-"
        sg = f"{tg / best:.2f}x" if isinstance(tg, float) and isinstance(best, float) and best > 0 and math.isfinite(best) else "-"
        lines.append(f"| {r['name']} | {r['dtype']} | {r.get('heuristic', '-')} | {_us(heur)} | {r.get('best', '-')} | {_us(best)} | "
                     f"{_us(te)} | {_us(tg) if isinstance(tg, float) else '-'} | {sp} | {sg} | {r.get('max_rel_err', '-')} |")
    lines += ["", "Failures and notes per row are in new_ops_h200.json (candidates: {key: [us, error]})."]
    return "\n".join(lines) + "\n"


def _row(name, op, dims, attrs, dtype, reps, arch, torch, F, cupy, np):
    from graphopt.kernels.heuristic import heuristic_lowering
    from graphopt.kernels.registry import applicable, signature_of
    from graphopt.kernels.source import prebuild
    from graphopt.kernels.timing import cuda_event_timer, median
    from graphopt.lowering import build_lowering

    tins, out_shape = _inputs(op, dims, dtype, torch)
    fn = _torch_fn(op, attrs, dims, F, torch)
    ref = fn([a.float() for a in tins]).to(torch.float32)
    ref_cp = cupy.asarray(ref)
    scale = float(ref.abs().max())
    sig_attrs = dict(attrs, **({"num_groups": dims["g"], "epsilon": 1e-5} if op == "GroupNorm" else {}))
    sig = signature_of(op, [tuple(a.shape) for a in tins], [dtype] * len(tins), sig_attrs)
    ccs = cupy.cuda.Device().compute_capability  # "90"
    cc = (int(ccs[:-1]), int(ccs[-1]))
    ok, _ = applicable(sig, cc)
    hname, hparams, _ = heuristic_lowering(op, sig, cc)
    heur_key = f"{hname}:{hparams}" if hparams else hname
    row = {"name": name, "op": op, "dtype": dtype, "signature": sig.key(), "heuristic": heur_key, "candidates": {}}
    ins_cp = [cupy.asarray(a) for a in tins]  # shares torch's memory: both sides read the same data
    errs = []
    for cand in ok:
        key = cand.key()
        try:
            prebuild(cand.kernels(sig))
            low = build_lowering(cand, sig, arch)
            out = cupy.full(out_shape, cupy.nan, dtype=dtype)
            low(ins_cp, [out])
            cupy.cuda.get_current_stream().synchronize()
            err = float(cupy.abs(out.astype(cupy.float32) - ref_cp).max()) / max(scale, 1e-30)
            errs.append(err)
            if not err <= TOL[dtype]:
                row["candidates"][key] = [math.inf, f"wrong result: max rel err {err:.2e}"]
                continue
            ts = cuda_event_timer(low, ins_cp, [out], warmup=3, reps=reps)
            row["candidates"][key] = [median(ts) * 1e3, None]
        except Exception as exc:  # noqa: BLE001 - a failing candidate is reported, the row goes on
            row["candidates"][key] = [math.inf, f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"]
    timed = {k: v[0] for k, v in row["candidates"].items() if math.isfinite(v[0])}
    if timed:
        row["best"] = min(timed, key=timed.get)
        row["best_us"] = timed[row["best"]]
    row["heuristic_us"] = row["candidates"].get(heur_key, [None])[0]
    row["max_rel_err"] = f"{max(errs):.1e}" if errs else "-"
    eager, graph = _torch_times(fn, _sets(tins, torch), reps, torch)
    row["torch_eager_us"] = eager * 1e3
    row["torch_graph_us"] = graph * 1e3 if isinstance(graph, float) else graph
    return row


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--dtypes", default="float16")
    ap.add_argument("--quick", action="store_true", help="the first row of each op only")
    ap.add_argument("--budget-s", type=float, default=420.0, help="whole run; later rows are recorded as skipped")
    ap.add_argument("--row-limit-s", type=float, default=30.0, help="a row may start only with this much budget left")
    args = ap.parse_args(argv)

    import cupy
    import numpy as np
    import torch
    import torch.nn.functional as F

    from cbr_layers import env_header
    from graphopt.kernels.source import device_arch

    t0 = time.perf_counter()
    header = env_header("python3 bench/new_ops.py " + " ".join(argv if argv is not None else sys.argv[1:]))
    header["note"] = ("torch eager: events around each call (host gaps between its kernels count); torch graph: the same "
                      "calls replayed from a CUDA graph; graphopt: graphopt.kernels.timing.cuda_event_timer")
    doc = {"header": header, "rows": []}
    arch = device_arch()
    from graphopt.kernels.gated_mlp import gated_mlp_kernel_instances
    from graphopt.kernels.group_norm import group_norm_kernel_instances
    from graphopt.kernels.rope import rope_kernel_instances
    from graphopt.kernels.source import prebuild

    t1 = time.perf_counter()
    errors = prebuild(rope_kernel_instances() + group_norm_kernel_instances() + gated_mlp_kernel_instances(), arch)
    header["prebuild_s"] = round(time.perf_counter() - t1, 1)
    header["prebuild_errors"] = {f"{k[0]}:{k[1]}": v for k, v in errors.items()}
    _write(args.out, doc)
    rows, seen = [], set()
    for r in ROWS:
        if args.quick and r[1] in seen:
            continue
        seen.add(r[1])
        rows.append(r)
    for dtype in args.dtypes.split(","):
        for name, op, dims, attrs in rows:
            left = args.budget_s - (time.perf_counter() - t0)
            if left < min(args.row_limit_s, args.budget_s):
                doc["rows"].append({"name": name, "op": op, "dtype": dtype, "skipped": f"time budget ({left:.0f} s left)"})
                _write(args.out, doc)
                continue
            t1 = time.perf_counter()
            try:
                row = _row(name, op, dims, attrs, dtype, args.reps, arch, torch, F, cupy, np)
            except Exception as exc:  # noqa: BLE001 - one row's failure is recorded, the run goes on
                row = {"name": name, "op": op, "dtype": dtype, "skipped": f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"}
            row["seconds"] = round(time.perf_counter() - t1, 1)
            doc["rows"].append(row)
            _write(args.out, doc)
            print(f"{name} {dtype}: best {row.get('best')} {_us(row.get('best_us'))} us, torch eager "
                  f"{_us(row.get('torch_eager_us'))} us, graph {_us(row.get('torch_graph_us'))} us "
                  f"{row.get('skipped', '')}", flush=True)
            torch.cuda.empty_cache()
            cupy.get_default_memory_pool().free_all_blocks()
    header["total_s"] = round(time.perf_counter() - t0, 1)
    _write(args.out, doc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
