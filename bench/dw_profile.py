"""Where MobileNetV2's bs32 depthwise layers spend their time: each form of ``depthwise_nhwc`` on one layer,
timed with CUDA events and launched a few times more for Nsight Compute to read the hardware counters.

Why: on the H100 (code b16e402, bench/NOTES_kernels.md, fifteenth session) ``mv2.s1.1.dw`` (32x144x56x56,
3x3) takes 67.7 us per-pixel and 75-78 us tiled against a 19.4 us floor; the tiled form removed the
re-reads and the per-output index arithmetic and the layer did not move, so neither was the limit. The
counters say which is (memory or L1/shared throughput, issue, occupancy, stalls). The per-pixel forms are
also timed with their grid capped lower (``--caps``): at 4,096 blocks of 252 threads a thread of that layer
makes under two trips over the pixels, so each block's fixed cost (its weight tile loaded, converted and
synchronised before any output) is paid 4,096 times. Run on the device:

    python3 bench/dw_profile.py --out DIR                                  # the timings alone
    ncu --clock-control none --kernel-name regex:depthwise --launch-count 24 \\
        --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy \\
        --section SchedulerStats --section WarpStateStats --section LaunchStats --csv \\
        python3 bench/dw_profile.py --out DIR --ncu --layers mv2.s1.1.dw    # the counters: 6 launches a form

Timings use the tuner's timer (graphopt.kernels.timing.cuda_event_timer, in a CUDA graph for a capturable
lowering), median of ``--reps``; every form is checked against the float64 reference first (a wrong form
is listed as such and not timed).
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

# layer name -> (C, H, stride) of a MobileNetV2 3x3 depthwise layer (bench/cbr_layers.py's names)
LAYERS = {"mv2.b0.dw": (32, 112, 1), "mv2.s1.0.dw": (96, 112, 2), "mv2.s1.1.dw": (144, 56, 1),
          "mv2.s2.1.dw": (192, 28, 1), "mv2.s4.1.dw": (576, 14, 1)}
FORMS = ("depthwise_nhwc", "depthwise_nhwc:rows=4", "depthwise_nhwc:tile=8x8", "depthwise_nhwc:tile=16x16")


def layer_sig(name: str, bs: int, dtype: str):
    from graphopt.kernels.registry import signature_of

    c, h, s = LAYERS[name]
    attrs = {"strides": [s, s], "pads": [1, 1, 1, 1], "kernel_shape": [3, 3], "group": c, "activation": "Clip",
             "clip_min": 0.0, "clip_max": 6.0}
    return signature_of("CBR", [(bs, c, h, h), (c, 1, 3, 3), (c,)], [dtype] * 3, attrs)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--layers", default="mv2.s1.1.dw,mv2.b0.dw,mv2.s1.0.dw")
    ap.add_argument("--bs", type=int, default=32)
    ap.add_argument("--dtype", default="float16")
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--ncu", action="store_true", help="under Nsight Compute: 6 plain launches a form, no check or timing")
    ap.add_argument("--caps", default="4096,2048,1056,528",
                    help="the per-pixel forms again with their grid capped at these many blocks (cbr_depthwise.MAX_BLOCKS, "
                         "4096 as the tuner launches them): does a block's fixed cost (its weights staged, a barrier) "
                         "for one or two trips over the pixels set the time?")
    args = ap.parse_args(argv)
    unknown = [n for n in args.layers.split(",") if n not in LAYERS]
    if unknown:
        ap.error(f"--layers: unknown {', '.join(unknown)} (known: {', '.join(LAYERS)})")

    import cupy
    import numpy as np

    from graphopt.kernels import cbr_depthwise
    from graphopt.kernels import geometry as geo
    from graphopt.kernels.check import checker
    from graphopt.kernels.registry import candidate_from_key
    from graphopt.kernels.timing import cuda_event_timer, median
    from graphopt.lowering.contract import build_lowering

    os.makedirs(args.out, exist_ok=True)
    arch = "sm_" + cupy.cuda.Device().compute_capability
    rows = []
    for name in args.layers.split(","):
        sig = layer_sig(name, args.bs, args.dtype)
        g = geo.conv_geom(sig)
        rng = np.random.default_rng(0)
        x = rng.standard_normal((g.N, g.C, g.H, g.W)).astype(args.dtype)
        w = (rng.standard_normal((g.M, 1, g.KH, g.KW)) * 0.3).astype(args.dtype)
        b = rng.standard_normal(g.M).astype(args.dtype)
        moved = (x.size + g.N * g.M * g.OH * g.OW) * x.itemsize
        for key in FORMS:
            row = {"layer": name, "bs": args.bs, "dtype": args.dtype, "form": key}
            cand = candidate_from_key("CBR", key)
            reason = cand.applies(sig)
            if reason:
                rows.append(dict(row, skipped=reason))
                continue
            low = build_lowering(cand, sig, arch)
            if not args.ncu:
                wrong = checker(sig, low)
                if wrong:
                    rows.append(dict(row, wrong=str(wrong)[:300]))
                    continue
            ins = low.conform([cupy.asarray(x), cupy.asarray(w), cupy.asarray(b)], cupy)
            outs = low.empty_outputs(3, [g.out_shape], ins[0].dtype, cupy)
            if args.ncu:
                for _ in range(6):
                    low(ins, outs)
                cupy.cuda.get_current_stream().synchronize()
                rows.append(dict(row, launched=6))
                continue
            us = median(cuda_event_timer(low, ins, outs, warmup=5, reps=args.reps)) * 1e3
            rows.append(dict(row, us=round(us, 2), TBps=round(moved / (us * 1e-6) / 1e12, 3)))
            print(json.dumps(rows[-1]), flush=True)
            if "tile" in key:
                continue
            held = cbr_depthwise.MAX_BLOCKS
            try:  # the launch reads the module's cap at every call
                for cap in [int(c) for c in args.caps.split(",") if c]:
                    cbr_depthwise.MAX_BLOCKS = cap
                    us = median(cuda_event_timer(low, ins, outs, warmup=5, reps=args.reps)) * 1e3
                    rows.append(dict(row, max_blocks=cap, us=round(us, 2), TBps=round(moved / (us * 1e-6) / 1e12, 3)))
                    print(json.dumps(rows[-1]), flush=True)
            finally:
                cbr_depthwise.MAX_BLOCKS = held
    doc = {"date": time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime()), "gpu": cupy.cuda.runtime.getDeviceProperties(0)["name"].decode(),
           "command": "python3 bench/dw_profile.py " + " ".join(argv if argv is not None else sys.argv[1:]), "rows": rows}
    with open(os.path.join(args.out, "dw_profile.json" if not args.ncu else "dw_profile_ncu_launches.json"), "w") as f:
        json.dump(doc, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
