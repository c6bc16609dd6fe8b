"""cuDNN-frontend CBR candidates against PyTorch eager on every distinct conv of ResNet-50 and
MobileNetV2 (torchvision shapes, 224x224), fp16, batch 1 and 32.

Run on the GPU:  python3 bench/cudnn_layers.py --out bench/results [--batches 1,32] [--budget 300]

For each layer: every plan graphopt's cuDNN provider offers (graphopt.providers.cudnn) is built,
checked against a float32 cuDNN result of the same inputs (TF32 off) and timed with
graphopt.kernels.timing.cuda_event_timer (device time, inputs rotated beyond L2, NHWC as the
lowering declares); PyTorch eager conv+bias(+residual)+activation with cudnn.benchmark=True, in
NCHW and in channels_last, is timed with the same timer in the same run. graphopt's own kernels are
not timed here (their last full run is bench/results/cbr_layers_h200.json, 2026-12-02): ``own_best_us``
is copied from that file where the layer is there, and labelled so. Rows are written after every layer.
Writes OUT/cudnn_layers_h200.json and .md.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from cbr_layers import MOBILENETV2, RESNET50, _act_torch, _attrs, env_header, layer_data  # noqa: E402


def _own_best(path: str) -> dict:
    try:
        rows = json.load(open(path))["rows"]
    except Exception:  # noqa: BLE001 - the older results file is optional
        return {}
    return {(r["layer"], r["bs"], r["dtype"]): r.get("graphopt_us") for r in rows}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results"))
    ap.add_argument("--batches", default="1,32")
    ap.add_argument("--dtype", default="float16")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--budget", type=float, default=400.0, help="seconds; layers past it are skipped (and listed)")
    ap.add_argument("--own", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "cbr_layers_h200.json"))
    args = ap.parse_args(argv)
    start = time.perf_counter()

    import cupy
    import numpy as np
    import torch
    import torch.nn.functional as F

    from graphopt.kernels.check import compare
    from graphopt.kernels.geometry import conv_geom
    from graphopt.kernels.timing import cuda_event_timer, median
    from graphopt.lowering import Signature, as_lowering
    from graphopt.providers import cudnn as prov

    torch.backends.cudnn.benchmark = True
    header = env_header("python3 bench/cudnn_layers.py " + " ".join(argv if argv is not None else sys.argv[1:]))
    header["cudnn_provider"] = dict(prov.versions()) or prov.unavailable()
    header["own_best_source"] = "bench/results/cbr_layers_h200.json (2026-12-02 run, own kernels only; not re-timed here)"
    own = _own_best(args.own)
    dtype = args.dtype
    tdt = {"float16": torch.float16, "float32": torch.float32}[dtype]
    stream = cupy.cuda.Stream(non_blocking=False)
    tstream = torch.cuda.ExternalStream(stream.ptr)
    rng = np.random.default_rng(0)
    rows, skipped = [], []
    layers = [("resnet50",) + l for l in RESNET50] + [("mobilenetv2",) + l for l in MOBILENETV2]

    def save():
        res = {"header": header, "rows": rows, "skipped_for_time": skipped, "summary": summarize(rows)}
        with open(os.path.join(args.out, "cudnn_layers_h200.json"), "w") as f:
            json.dump(res, f, indent=1)
        with open(os.path.join(args.out, "cudnn_layers_h200.md"), "w") as f:
            f.write(markdown(res))

    for bs in [int(b) for b in args.batches.split(",")]:
        for (model, name, cin, cout, k, s, p, h, g, act, res) in layers:
            if time.perf_counter() - start > args.budget:
                skipped.append(f"{name} bs{bs}")
                continue
            attrs = _attrs(k, s, p, g, act)
            xs, ws = (bs, cin, h, h), (cout, cin // g, k, k)
            oshape = conv_geom(Signature.make("CBR", [xs, ws, (cout,), None], [dtype] * 3, attrs)).out_shape
            shapes = [xs, ws, (cout,), oshape if res else None]
            sig = Signature.make("CBR", shapes, [dtype, dtype, dtype, dtype if res else ""], attrs)
            row = {"model": model, "layer": name, "bs": bs, "dtype": dtype, "groups": g, "activation": act, "residual": res}
            try:
                with stream:
                    (x, w, b, r), (tx, tw, tb, tr), ref_t = layer_data(rng, xs, ws, oshape, s, p, g, act, res, dtype, tstream)
                    stream.synchronize()
                    ref = cupy.asnumpy(cupy.asarray(ref_t)).astype(np.float64).reshape(-1)
                    plans = {}
                    for cand in prov.candidates("CBR", sig)[1:]:
                        key = cand.key()
                        try:
                            low = as_lowering(cand.build(sig, "sm_90"))
                            ins = low.conform([x, w, b, r], cupy)
                            out = low.empty_outputs(4, [oshape], dtype, cupy)[0]
                            out[...] = cupy.nan
                            low(ins, [out])
                            stream.synchronize()
                            wrong = compare(cupy.asnumpy(out).astype(np.float64).reshape(-1), ref, None, dtype)
                            if wrong:
                                plans[key] = (math.inf, wrong)
                                continue
                            plans[key] = (median(cuda_event_timer(low, ins, [out], warmup=3, reps=args.reps)) * 1e3, None)
                        except Exception as exc:  # noqa: BLE001 - a failing plan scores infinity and is reported
                            plans[key] = (math.inf, f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}")

                    def torch_launch(cl):
                        def launch(ins, outs):
                            with torch.cuda.stream(tstream):
                                y = F.conv2d(ins[0], ins[1], ins[2], s, p, 1, g)
                                if res:
                                    y = y + ins[3]
                                _act_torch(y, act)
                        return launch

                    t_nchw = median(cuda_event_timer(torch_launch(False), [tx, tw, tb, tr],
                                                     [torch.empty(oshape, dtype=tdt, device="cuda")], warmup=5, reps=args.reps)) * 1e3
                    cl = [v.to(memory_format=torch.channels_last) if v is not None and v.dim() == 4 else v for v in (tx, tw, tb, tr)]
                    t_cl = median(cuda_event_timer(torch_launch(True), cl, [torch.empty(oshape, dtype=tdt, device="cuda")],
                                                   warmup=5, reps=args.reps)) * 1e3
                best = min(plans, key=lambda kk: plans[kk][0]) if plans else None
                best_us = plans[best][0] if best else math.inf
                row.update(cudnn_best_us=round(best_us, 2) if math.isfinite(best_us) else None, cudnn_plan=best,
                           plans=len(plans), plans_correct=sum(1 for v in plans.values() if v[1] is None),
                           plan_failures={kk: v[1] for kk, v in plans.items() if v[1]},
                           torch_eager_us=round(t_nchw, 2), torch_channels_last_us=round(t_cl, 2),
                           own_best_us_2026_12_02=own.get((name, bs, dtype)))
                peer = min(t_nchw, t_cl)
                row["cudnn_vs_best_torch"] = round(peer / best_us, 3) if math.isfinite(best_us) else None
                row["cudnn_vs_torch_nchw"] = round(t_nchw / best_us, 3) if math.isfinite(best_us) else None
            except Exception as exc:  # noqa: BLE001 - one broken layer must not end the run
                row["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
            rows.append(row)
            print(json.dumps({k: v for k, v in row.items() if k != "plan_failures"}), flush=True)
            cupy.get_default_memory_pool().free_all_blocks()
            save()
    save()
    print(json.dumps(summarize(rows), indent=1))
    return 0


def summarize(rows) -> dict:
    out = {}
    for bs in sorted({r["bs"] for r in rows}):
        rs = [r for r in rows if r["bs"] == bs and r.get("cudnn_vs_best_torch")]
        if not rs:
            continue
        geo = lambda key: round(math.exp(sum(math.log(r[key]) for r in rs) / len(rs)), 3)  # noqa: E731
        out[f"bs{bs}"] = {"layers": len(rs), "geomean_vs_torch_nchw": geo("cudnn_vs_torch_nchw"),
                          "geomean_vs_best_torch": geo("cudnn_vs_best_torch"),
                          "at_least_as_fast_as_best_torch": sum(1 for r in rs if r["cudnn_vs_best_torch"] >= 1.0)}
    return out


def markdown(res) -> str:
    h = res["header"]
    lines = [f"# cuDNN-frontend CBR plans vs PyTorch eager ({h['gpu']}, {h['date']})", "",
             f"`{h['command']}`; torch {h['torch']}, cuDNN {h['cudnn']}, provider {h['cudnn_provider']}, CuPy {h['cupy']}.",
             f"Device time per launch ({h['timing']}). own_best: {h['own_best_source']}.", "",
             "| layer | bs | cuDNN best us | torch NCHW us | torch CL us | x vs best torch | plans ok/all | own best us (12-02) |",
             "|---|---|---|---|---|---|---|---|"]
    for r in res["rows"]:
        if "error" in r:
            lines.append(f"| {r['layer']} | {r['bs']} | error: {r['error']} | | | | | |")
            continue
        lines.append(f"| {r['layer']} | {r['bs']} | {r['cudnn_best_us']} | {r['torch_eager_us']} | {r['torch_channels_last_us']} "
                     f"| {r['cudnn_vs_best_torch']} | {r['plans_correct']}/{r['plans']} | {r['own_best_us_2026_12_02']} |")
    lines += ["", "Summary: " + json.dumps(res["summary"])]
    if res["skipped_for_time"]:
        lines.append("Skipped for the time budget: " + ", ".join(res["skipped_for_time"]))
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
