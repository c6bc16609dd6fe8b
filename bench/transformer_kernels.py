"""Transformer kernels vs PyTorch on the GPU: memory-bound ops against the copy bandwidth, attention
against ``torch.nn.functional.scaled_dot_product_attention`` (SDPA), in one run.

Run on the GPU:  python3 bench/transformer_kernels.py --out bench/results   (add --quick for a smoke test)

- LayerNorm, SkipLayerNorm (residual + skip bias, the sum written too when the model keeps it is not
  timed here: Y only), RMSNorm: every applicable ``rows`` config, at GPT-2 / BERT sizes and large
  sizes (>= 8 MB per tensor), against ``torch.nn.functional.layer_norm`` / ``rms_norm``.
- bias+GELU: GemmAct's in-place epilogue kernel (the cuBLAS lowerings' second kernel:
  ``epilogue_gemm_vec`` where N is a whole number of 16-byte vectors, as at every size here, else
  ``epilogue_gemm``; the scalar one's time beside it) on an (M, N) activation with a bias of N, erf
  and tanh forms, against torch eager.
- softmax: ``attn_softmax`` / ``attn_softmax_rows`` (the cuBLAS attention lowering's middle kernel,
  every configuration its candidates offer, ``softmax_configs``; the fastest is the row's) in place over rows of Skv scores, against
  ``torch.softmax``.
- Attention at sequence lengths 128, 512, 2048, 4096, head dims 64 and 128, causal and not, fp16
  (and fp32 with --attn-dtypes): the tuner's choice, SDPA (``is_causal`` alike; ``sdpa_us`` timed inside a
  CUDA graph as the tuner's choice is, ``lowering_bench.torch_graph_us``, its eager time beside it as
  ``sdpa_eager_us``) and the unfused torch path (matmul, softmax, matmul, eager), in TFLOP/s
  (4 * B * H * Sq * Skv * D flops, halved when causal). ``--kv-groups G``: grouped-query rows (K and V with
  16 / G heads, the op's ``kv_groups``), SDPA with ``enable_gqa=True`` as the peer and the unfused path
  repeating K and V first (repeat_kv, as the exports do before ``attention_grouped_kv`` folds it).

LayerNorm, SkipLayerNorm, RMSNorm and Attention take every candidate of graphopt.kernels.registry
(own kernels and every provider's: cuDNN SDPA / norms when they land), profiled by the tuner's own
backend in its isolated worker (bench/lowering_bench.TunerChoice): ``graphopt_us`` is what
``graphopt optimize`` would choose. bias+GELU and softmax are kernels inside other lowerings (no
registry op of their own): timed directly, by the same timer inside a CUDA graph (``capturable``), as
the tuner times every capturable lowering and the runtime runs them (until 2026-12-06 they were timed
eagerly, each repetition carrying an event pair and a launch gap of about 2.6 us that the norms, timed
by the tuner, did not). torch's ops are timed eagerly (torch eager, as a user runs it), SDPA in a CUDA
graph (above; its eager time too). The JSON has issue 20's lists: ``memory_bound`` rows carry ``kernel``, ``bytes``,
``fraction_of_copy``; ``attention`` rows ``seq``, ``head_dim``, ``causal``,
``dtype``, ``graphopt_us``, ``sdpa_us``. Written after every table; --budget skips what no longer fits.

Bandwidth = bytes each kernel must move (inputs read once, outputs written once) / device time,
reported as a fraction of the copy bandwidth measured in the same run.
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

from placed_timing import placed_pair  # noqa: E402
from lowering_bench import GPU_NAME_HELP, Budget, TunerChoice, barrier_left_out, gpu_tag, env_header, measure_ceilings, torch_graph_or_reason, write_atomic, write_json  # noqa: E402

# (name, rows, D)
NORM_SIZES = [("gpt2 bs1x128", 128, 768), ("bert-base bs32x128", 32 * 128, 768), ("bert-large bs32x512", 32 * 512, 1024),
              ("large 8192x4096", 8192, 4096), ("large 16384x8192", 16384, 8192)]
GELU_SIZES = [("gpt2.fc bs1x128", 128, 3072), ("bert-base.fc bs32x128", 32 * 128, 3072), ("large bs32x512x4096", 32 * 512, 4096)]
SOFTMAX_SIZES = [("bert-base bs32 h12 s128", 32 * 12 * 128, 128), ("s512 bs8 h16", 8 * 16 * 512, 512),
                 ("s2048 bs2 h16", 2 * 16 * 2048, 2048), ("s4096 bs1 h16", 16 * 4096, 4096)]
ATTN_SEQS = (128, 512, 2048, 4096)
ATTN_HEADS = (64, 128)
ATTN_TOKENS = 8192  # B * S per row of the attention table (B = max(1, TOKENS / S)), H = 16 (the checker's float64
# reference of a (B, 16, 4096, 4096) score matrix must fit the host: 4.3 GB at B = 2)


def _bw(nbytes, us):
    return nbytes / (us * 1e-6) / 1e12 if us and math.isfinite(us) else 0.0


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(HERE, "results"))
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--dtypes", default="float16,float32", help="memory-bound kernels")
    ap.add_argument("--attn-dtypes", default="float16")
    ap.add_argument("--quick", action="store_true", help="one size per table (smoke test)")
    ap.add_argument("--kernels", default="norm,gelu,softmax", help="which memory-bound kernels (norm, gelu, softmax)")
    ap.add_argument("--tables", default="memory,attention",
                    help="which tables: memory (norms, bias+GELU, softmax), attention, or both")
    ap.add_argument("--budget", type=float, default=500.0, help="seconds; what is past it is skipped and listed")
    ap.add_argument("--seqs", default=None,
                    help=f"attention sequence lengths, comma-separated (default: {','.join(map(str, ATTN_SEQS))})")
    ap.add_argument("--kv-groups", type=int, default=1,
                    help="attention rows with K and V of 16 / G heads (grouped-query attention, kv_groups=G; 1, 2, 4, 8 or 16)")
    ap.add_argument("--gpu-name", default=None, help=GPU_NAME_HELP)
    ap.add_argument("--merge", nargs=2, metavar=("MEMORY_JSON", "ATTENTION_JSON"),
                    help="no GPU: write one results file from two runs' files (the memory table of the first, the "
                         "attention table of the second), each run's header kept under 'runs'")
    ap.add_argument("--previous", default=None, metavar="JSON",
                    help="with --merge: an earlier results file; its rows the two runs did not measure again are kept, "
                         "marked with their run (earlier_run)")
    args = ap.parse_args(argv)
    kinds = set(args.kernels.split(","))
    unknown = kinds - {"norm", "gelu", "softmax"}
    if unknown:
        ap.error(f"--kernels: unknown {', '.join(sorted(unknown))} (norm, gelu, softmax)")
    if args.seqs and not all(x.strip().isdigit() and int(x) > 0 for x in args.seqs.split(",")):
        ap.error(f"--seqs: {args.seqs!r} is not a comma-separated list of positive lengths (e.g. 4096 or 128,512)")
    if args.kv_groups not in (1, 2, 4, 8, 16):
        ap.error(f"--kv-groups: {args.kv_groups} does not divide the table's 16 heads (1, 2, 4, 8 or 16)")
    if args.merge:
        return merge(args.out, *args.merge, gpu_name=args.gpu_name, previous=args.previous)
    args.gpu_name = args.gpu_name or gpu_tag()
    budget = Budget(args.budget)

    import cupy
    import numpy as np
    import torch
    import torch.nn.functional as F

    from graphopt.kernels.attention import attention_kernel_instances
    from graphopt.kernels.attention_cublas import softmax_configs, softmax_grid, softmax_instance, softmax_reason
    from graphopt.kernels.registry import signature_of
    from graphopt.kernels.norm import norm_kernel_instances
    from graphopt.kernels.gemm_act import (VECTOR_EPILOGUE_LOADS, vector_epilogue_grid,
                                           vector_epilogue_kernel)
    from graphopt.kernels.source import VEC16, get_kernel, instance, prebuild
    from graphopt.kernels.timing import cuda_event_timer, median

    command = "python3 bench/transformer_kernels.py " + " ".join(argv if argv is not None else sys.argv[1:])
    header = env_header(command)
    t0 = time.perf_counter()
    jobs = norm_kernel_instances() + attention_kernel_instances() + [
        ("elementwise.cu", k) for dt in VEC16
        for k in (instance("epilogue_gemm", dt),)] + [vector_epilogue_kernel(dt, loads) for dt in VEC16 for loads in (1, 2)]
    header["prebuild_errors"] = {f"{k[0]}:{k[1]}": v for k, v in prebuild(jobs).items()}
    header["prebuild_s"] = round(time.perf_counter() - t0, 1)
    header["ceilings"] = measure_ceilings()
    copy = header["ceilings"]["copy_TBps"]
    skipped: list[str] = []
    tuner = TunerChoice()
    stream = cupy.cuda.Stream(non_blocking=False)
    tstream = torch.cuda.ExternalStream(stream.ptr)
    rng = cupy.random.RandomState(0)
    pick = (lambda xs: xs[-1:]) if args.quick else (lambda xs: xs)
    attn_seqs = tuple(int(x) for x in args.seqs.split(",")) if args.seqs else ATTN_SEQS
    mem_rows, attn_rows = [], []

    def torch_us(fn, ins, out):
        def launch(i, o):
            with torch.cuda.stream(tstream):
                fn(*i)
        return median(cuda_event_timer(launch, ins, [out], warmup=5, reps=args.reps)) * 1e3

    same_copy: dict[int, tuple[float, float]] = {}

    def same_size_copy_us(nbytes):
        """A device-to-device copy moving the same bytes (nbytes / 2 read, as many written): below ~100 MB
        a kernel's ramp and tail cost a fixed few us that the 1 GiB copy ceiling does not see, so this is
        the like-for-like reference for the smaller rows. Returns (in a CUDA graph, eagerly) in us.

        Timed like the kernels it is compared with: inside a CUDA graph (``capturable``; the copy is the
        ``cudaMemcpyAsync`` that torch's ``copy_`` issues for contiguous bytes, a memcpy node there) with
        its source and destination rotated like every kernel's operands. Until 2026-12-06 it wrote one
        fixed buffer (at these sizes it stays in the 50 MB L2, where repeated writes to the same lines
        need not reach DRAM), and it was timed eagerly, so each repetition carried an event pair and a
        launch gap the graph-timed kernels do not: a LayerNorm of 0.4 MB took 2.1 us against its
        "copy's" 3.9. The eager time stays in the row (``same_size_copy_eager_us``) for comparison."""
        if nbytes not in same_copy:
            src = cupy.empty(max(1, nbytes // 2), dtype=cupy.uint8)
            dst = cupy.empty_like(src)

            def graphed(i, o):
                o[0].data.copy_from_device_async(i[0].data, o[0].nbytes)
            graphed.capturable = True

            def eager(i, o):  # the same copy, not marked capturable: the timer launches it eagerly
                graphed(i, o)
            same_copy[nbytes] = tuple(median(cuda_event_timer(f, [src], [dst], warmup=5, reps=args.reps)) * 1e3
                                      for f in (graphed, eager))
        return same_copy[nbytes]

    def record(kind, name, dtype, shape, nbytes, cands, t_us, extra=None):
        best = min(cands, key=lambda k: cands[k][0]) if cands else None
        us = cands[best][0] if best else math.inf
        c_us, c_eager_us = same_size_copy_us(int(nbytes))
        row = {"kernel": kind, "bytes": int(nbytes), "fraction_of_copy": round(_bw(nbytes, us) / copy, 3),
               "size": name, "shape": list(shape), "dtype": dtype, "MB": round(nbytes / 1e6, 2),
               "graphopt_us": round(us, 2), "chosen": best, "TBps": round(_bw(nbytes, us), 3),
               "of_copy": round(_bw(nbytes, us) / copy, 3), "torch_us": round(t_us, 2),
               "torch_of_copy": round(_bw(nbytes, t_us) / copy, 3),
               "same_size_copy_us": round(c_us, 2), "of_same_size_copy": round(c_us / us, 3),
               "same_size_copy_eager_us": round(c_eager_us, 2),
               "candidates": {k: (None if not math.isfinite(v[0]) else round(v[0], 2)) for k, v in cands.items()},
               "failures": {k: v[1] for k, v in cands.items() if v[1]}, **(extra or {})}
        mem_rows.append(row)
        save()
        print(f"{kind:14s} {name:24s} {dtype:7s} {row['MB']:8.1f} MB  {us:8.1f} us  {row['of_copy']:.2f} of copy "
              f"({best})  torch {t_us:8.1f} us {row['torch_of_copy']:.2f}", flush=True)

    def save():
        _write(args.out, header, mem_rows, attn_rows, skipped, copy, args.gpu_name)

    def sdpa_backends_us(fn, ins):
        """SDPA with each of torch's fused backends forced, graph-timed like ``sdpa_us``: which one torch's
        default is, and how torch's own cuDNN path compares with graphopt's cuDNN plans (None: the
        backend refuses the shape or the capture)."""
        from torch.nn.attention import SDPBackend, sdpa_kernel

        out = {}
        for name in ("FLASH_ATTENTION", "CUDNN_ATTENTION", "EFFICIENT_ATTENTION"):
            def forced(a, b, c, backend=getattr(SDPBackend, name)):
                with sdpa_kernel(backend):
                    return fn(a, b, c)
            out[name.lower()], _ = torch_graph_or_reason(forced, ins, reps=args.reps)
        return out

    def barrier_cost_us(sig, key, tensors):
        """(with, without) the stream barrier: graphopt's chosen lowering timed by the same graph timer
        as it is and with ``graphopt.lowering.barrier`` made a no-op (None, None where the lowering
        has no barrier). The barrier is one empty kernel before every cuDNN / cuBLASLt launch
        (programmatic dependent launch broke stream order in a whole-model graph on the H200); this
        says what it costs a call where the kernels are otherwise alike (NOTES_kernels, eighth session)."""
        from graphopt.kernels.registry import candidate_from_key
        from graphopt.lowering import build_lowering
        from graphopt.kernels.source import device_arch

        low = build_lowering(candidate_from_key(sig.op, key), sig, device_arch())
        if not low.barrier:
            return None, None
        ins = [cupy.asarray(t) for t in tensors] + [None]
        out = [cupy.empty(ins[0].shape, dtype=ins[0].dtype)]
        def timed():
            return round(median(cuda_event_timer(low, ins, out, reps=args.reps)) * 1e3, 2)

        with_barrier = timed()
        with barrier_left_out():
            return with_barrier, timed()

    def placed_attention(sig, key, fn, tensors):
        """graphopt's choice and SDPA each after the same ordinary launch (``placed_timing``): how the
        runtime runs the node after an own kernel (its barrier dropped) against torch's call there."""
        from graphopt.kernels.registry import candidate_from_key
        from graphopt.lowering import build_lowering
        from graphopt.kernels.source import device_arch

        low = build_lowering(candidate_from_key(sig.op, key), sig, device_arch())
        return placed_pair(low, fn, tensors, reps=args.reps)

    def attention_row(s, d, causal, dtype):
        bsz, h, g = max(1, ATTN_TOKENS // s), 16, args.kv_groups
        shape, kv_shape = (bsz, h, s, d), (bsz, h // g, s, d)
        attrs = {**({"causal": causal} if causal else {}), **({"kv_groups": g} if g > 1 else {})}
        sig = signature_of("Attention", [shape, kv_shape, kv_shape], [dtype] * 3, attrs)
        choice = tuner.profile(sig)
        tq, tk, tv = (torch.randn(sh, device="cuda", dtype=getattr(torch, dtype)) for sh in (shape, kv_shape, kv_shape))
        out = torch.empty_like(tq)
        def sdpa_fn(a, b, c):
            return F.scaled_dot_product_attention(a, b, c, is_causal=bool(causal), **({"enable_gqa": True} if g > 1 else {}))
        sdpa_eager = torch_us(sdpa_fn, [tq, tk, tv], out)
        # The peer is SDPA timed as graphopt's choice is, inside a CUDA graph (eager carries ~2.5 us a call
        # that the graph-timed choice does not; NOTES_kernels, 2026-12-06); eager stays in the row.
        sdpa, why = torch_graph_or_reason(sdpa_fn, [tq, tk, tv], reps=args.reps)
        sdpa, sdpa_timing = (sdpa, "CUDA graph") if why is None else (sdpa_eager, f"eager ({why})")
        backends = sdpa_backends_us(sdpa_fn, [tq, tk, tv])
        torch.cuda.synchronize()
        try:
            with_barrier, without_barrier = barrier_cost_us(sig, choice["chosen"], [tq, tk, tv])
        except Exception as exc:  # noqa: BLE001 - a diagnostic column: the row stands without it
            print(f"  barrier timing failed: {type(exc).__name__}: {exc}", flush=True)
            with_barrier = without_barrier = None
        try:  # the verdict's figures: each after the same ordinary launch, as a model places them
            placed = placed_attention(sig, choice["chosen"], sdpa_fn, [tq, tk, tv])
        except Exception as exc:  # noqa: BLE001 - reported in the row; the verdict then falls back to vs_sdpa
            print(f"  placed timing failed: {type(exc).__name__}: {exc}", flush=True)
            placed = {"error": f"{type(exc).__name__}: {str(exc)[:200]}"}
        # SDPA's output block reused by every captured call (the method before the eighth session)
        sdpa_same_out, _ = torch_graph_or_reason(sdpa_fn, [tq, tk, tv], reps=args.reps, keep_outputs=False)

        def unfused(a, b, c, scale=1.0 / math.sqrt(d)):
            if g > 1:  # repeat_kv, as the exported model computes it
                b, c = b.repeat_interleave(g, dim=1), c.repeat_interleave(g, dim=1)
            sc = torch.matmul(a, b.transpose(-1, -2)) * scale
            if causal:
                sc = sc.masked_fill(torch.ones(s, s, dtype=torch.bool, device="cuda").triu(1), float("-inf"))
            return torch.matmul(torch.softmax(sc, -1), c)
        unf = torch_us(unfused, [tq, tk, tv], out)
        flops = 4 * bsz * h * s * s * d // (2 if causal else 1)
        us = choice["graphopt_us"]
        row = {"seq": s, "head_dim": d, "causal": bool(causal), "dtype": dtype, **({"kv_groups": g} if g > 1 else {}),
               "graphopt_us": us, "sdpa_us": round(sdpa, 2),
               "sdpa_timing": sdpa_timing, "sdpa_eager_us": round(sdpa_eager, 2),
               "sdpa_graph_same_output_us": sdpa_same_out,
               "chosen_with_barrier_us": with_barrier, "chosen_without_barrier_us": without_barrier,
               "placed": placed,
               "batch": bsz, "heads": h, "chosen": choice["chosen"], "chosen_provider": choice["chosen_provider"],
               "TFLOPs": round(flops / (us * 1e-6) / 1e12, 2) if us else 0,
               "best_by_provider": {p: v["us"] for p, v in choice["best_by_provider"].items()},
               "sdpa_TFLOPs": round(flops / (sdpa * 1e-6) / 1e12, 2),
               "torch_unfused_us": round(unf, 2), "vs_sdpa": round(sdpa / us, 3) if us else None,
               "sdpa_backends_us": backends, "candidates": choice["candidates"], "failures": choice["failures"]}
        attn_rows.append(row)
        save()
        print(f"attention s={s:5d} d={d:3d} causal={causal} {dtype}: graphopt {us} us {row['TFLOPs']} TF/s ({row['chosen']}) "
              f"SDPA {sdpa:9.1f} us {row['sdpa_TFLOPs']:6.1f} TF/s  unfused torch {unf:9.1f} us  backends {backends}  "
              f"barrier on/off {with_barrier}/{without_barrier}", flush=True)
        del tq, tk, tv, out
        cupy.get_default_memory_pool().free_all_blocks()
        torch.cuda.empty_cache()

    tables = set(args.tables.split(","))
    with stream:
        for dtype in (args.dtypes.split(",") if "memory" in tables else []):
            esz = np.dtype(dtype).itemsize
            tol = 1e-2 if dtype == "float16" else 1e-4
            for name, rows, d in pick(NORM_SIZES if "norm" in kinds else []):
                x = rng.standard_normal((rows, d), dtype=cupy.float32).astype(dtype)
                g, b = (rng.standard_normal(d, dtype=cupy.float32).astype(dtype) for _ in range(2))
                sk = rng.standard_normal((rows, d), dtype=cupy.float32).astype(dtype)
                sb = rng.standard_normal(d, dtype=cupy.float32).astype(dtype)
                tx, tg, tb, tsk, tsb = (torch.as_tensor(a, device="cuda") for a in (x, g, b, sk, sb))
                out = torch.empty_like(tx)
                for kind, op, ins, tfn, tins, n_io in (
                    ("LayerNorm", "LayerNorm", [x, g, b], lambda a, w, c: F.layer_norm(a, (d,), w, c, 1e-5), [tx, tg, tb], 2),
                    ("SkipLayerNorm", "LayerNorm", [x, g, b, sk, sb],
                     lambda a, w, c, s, sb_: F.layer_norm(a + s + sb_, (d,), w, c, 1e-5), [tx, tg, tb, tsk, tsb], 3),
                    ("RMSNorm", "RMSNorm", [x, g], lambda a, w: F.rms_norm(a, (d,), w, 1e-6), [tx, tg], 2),
                ):
                    sig = signature_of(op, [a.shape for a in ins], [dtype] * len(ins),
                                         {"epsilon": 1e-5 if op == "LayerNorm" else 1e-6})
                    if budget.left() < 10:
                        skipped.append(f"{kind} {name} {dtype}")
                        continue
                    cands = choice_cands(tuner.profile(sig))
                    record(kind, name, dtype, (rows, d), n_io * rows * d * esz, cands, torch_us(tfn, tins, out))
                cupy.get_default_memory_pool().free_all_blocks()
            for name, m, n in pick(GELU_SIZES if "gelu" in kinds else []):
                y0 = rng.standard_normal((m, n), dtype=cupy.float32).astype(dtype)
                bias = rng.standard_normal(n, dtype=cupy.float32).astype(dtype)
                ty, tbias = torch.as_tensor(y0, device="cuda"), torch.as_tensor(bias, device="cuda")
                epi = get_kernel("elementwise.cu", instance("epilogue_gemm", dtype))
                vec = VEC16[dtype]  # the vector epilogue GemmAct's cuBLAS lowerings launch here
                epi_vec = get_kernel(*vector_epilogue_kernel(dtype)) if n % vec == 0 else None
                # two vectors a thread loaded before either is computed: timed beside the launched form
                epi_vec2 = get_kernel(*vector_epilogue_kernel(dtype, 2)) if n % vec == 0 else None
                for act, code, approx in (("Gelu", 8, "none"), ("GeluTanh", 9, "tanh")):
                    total = m * n
                    grid = (min(-(-total // 256), 132 * 32),)

                    def launch(ins, outs, code=code, grid=grid, total=total):
                        epi(grid, (256,), (outs[0], ins[0], np.int64(total), np.int32(m), np.int32(n), np.int64(0),
                                           np.int32(0), np.int32(1), np.float32(1.0), np.float32(1.0), np.int32(code),
                                           np.float32(0.2), np.float32(0.5), np.float32(-np.inf), np.float32(np.inf)))
                    def launch_vec(ins, outs, code=code, total=total, kern=epi_vec, loads=VECTOR_EPILOGUE_LOADS):
                        kern(vector_epilogue_grid(dtype, total, loads), (256,),
                             (outs[0], ins[0], np.int32(total), np.int32(n), np.float32(1.0), np.float32(1.0),
                              np.int32(code), np.float32(0.2), np.float32(0.5), np.float32(-np.inf), np.float32(np.inf)))

                    def launch_vec2(ins, outs, code=code, total=total):
                        launch_vec(ins, outs, code, total, epi_vec2, 2)
                    with torch.cuda.stream(tstream):
                        ref = F.gelu(ty.float() + tbias.float(), approximate=approx)
                    cands = {}
                    launch.capturable = launch_vec.capturable = launch_vec2.capturable = True  # timed in a CUDA graph, like the tuner's lowerings
                    for kname, fn in (("epilogue_gemm", launch), ("epilogue_gemm_vec", launch_vec if epi_vec else None),
                                      ("epilogue_gemm_vec_loads2", launch_vec2 if epi_vec2 else None)):
                        if fn is None:
                            continue
                        work = y0.copy()
                        fn([bias], [work])
                        stream.synchronize()
                        err = float(cupy.linalg.norm(work.astype(cupy.float32) - cupy.asarray(ref)) / cupy.linalg.norm(cupy.asarray(ref)))
                        # In place: every repetition works on the same rotated buffers (the values drift, the traffic does not).
                        us = median(cuda_event_timer(fn, [bias], [y0.copy()], warmup=3, reps=args.reps)) * 1e3
                        cands[kname] = (us, None) if err <= tol else (math.inf, f"normwise error {err:.2e}")
                    t_us = torch_us(lambda a, c: F.gelu(a + c, approximate=approx), [ty, tbias], torch.empty_like(ty))
                    # the row is what GemmAct's cuBLAS lowerings launch: the vector kernel wherever it applies
                    # (never picked by time here), the scalar one beside it for comparison
                    scalar = cands.pop("epilogue_gemm") if epi_vec else None
                    loads2 = cands.pop("epilogue_gemm_vec_loads2", None)

                    def us_or_none(c):
                        return None if c is None or not math.isfinite(c[0]) else round(c[0], 2)
                    record(f"bias+{act}", name, dtype, (m, n), 2 * total * esz, cands, t_us,
                           {"scalar_epilogue_us": us_or_none(scalar), "vec_loads2_us": us_or_none(loads2),
                            **({"vec_loads2_failure": loads2[1]} if loads2 is not None and loads2[1] else {})})
                cupy.get_default_memory_pool().free_all_blocks()
            for name, rows, skv in pick(SOFTMAX_SIZES if "softmax" in kinds else []):
                s0 = rng.standard_normal((rows, skv), dtype=cupy.float32).astype(dtype)
                ts0 = torch.as_tensor(s0, device="cuda")
                with torch.cuda.stream(tstream):
                    ref = cupy.asarray(torch.softmax(ts0.float(), -1))
                stream.synchronize()
                cands = {}
                for config in softmax_configs(dtype):  # as cublas_softmax offers them
                    params = dict(config)
                    if softmax_reason(params, dtype, skv):
                        continue
                    kern = get_kernel("attention.cu", softmax_instance(dtype, 0, params))
                    grid, block = softmax_grid(rows, params)

                    def launch(ins, outs, kern=kern, grid=grid, block=block):
                        kern(grid, block, (outs[0], np.int64(rows), np.int32(rows), np.int32(skv),
                             np.int32(1), np.uint64(0), np.int64(0), np.int64(0), np.int64(0), np.int64(0),
                             np.float32(-np.inf), np.int32(0), np.int32(0)))
                    launch.capturable = True  # timed in a CUDA graph, like the tuner's lowerings
                    work = s0.copy()
                    launch([], [work])
                    err = float(cupy.linalg.norm(work.astype(cupy.float32) - ref) / cupy.linalg.norm(ref))
                    # In place: after the first repetition the rows are probabilities; the traffic is the same.
                    us = median(cuda_event_timer(launch, [], [s0.copy()], warmup=3, reps=args.reps)) * 1e3
                    name_ = "attn_softmax:" + ",".join(f"{k}={v}" for k, v in config)
                    cands[name_] = (us, None) if err <= tol else (math.inf, f"normwise error {err:.2e}")
                t_us = torch_us(lambda a: torch.softmax(a, -1), [ts0], torch.empty_like(ts0))
                record("softmax", name, dtype, (rows, skv), 2 * rows * skv * esz, cands, t_us)
                cupy.get_default_memory_pool().free_all_blocks()

        for dtype in (args.attn_dtypes.split(",") if "attention" in tables else []):
            for s in pick(attn_seqs):
                for d in pick(ATTN_HEADS):
                    for causal in (0, 1):
                        if budget.left() < 15:
                            skipped.append(f"attention s={s} d={d} causal={causal} {dtype}")
                            continue
                        attention_row(s, d, causal, dtype)
    tuner.close()
    save()
    print(json.dumps(header["summary"], indent=1))


def _write(out_dir, header, mem_rows, attn_rows, skipped, copy, gpu_name):
    big = [r for r in mem_rows if r["bytes"] >= 8e6]
    header["summary"] = {
        "memory_bound_at_least_80pct_of_copy_(>=8MB)": f"{sum(r['fraction_of_copy'] >= 0.8 for r in big)} of {len(big)}",
        "memory_bound_at_least_80pct_of_a_same_size_copy_(>=8MB)":
            f"{sum(r.get('of_same_size_copy', 0) >= 0.8 for r in big if 'of_same_size_copy' in r)} of "
            f"{sum('of_same_size_copy' in r for r in big)}",
        "attention_at_least_as_fast_as_sdpa": f"{sum((r['vs_sdpa'] or 0) >= 1.0 for r in attn_rows)} of {len(attn_rows)}",
        "attention_placed_at_least_as_fast_as_sdpa_(paired)":
            f"{sum(placed_ratio(r) is not None and placed_ratio(r) <= 1.0 for r in attn_rows)} of "
            f"{sum(placed_ratio(r) is not None for r in attn_rows)}",
    }
    header["skipped_for_time"] = skipped
    write_json(os.path.join(out_dir, f"transformer_kernels_{gpu_name}.json"),
               {"header": header, "memory_bound": mem_rows, "attention": attn_rows})
    lines = [f"# Transformer kernels on {header['gpu']} ({header['date']})", "",
             f"Command: `{header['command']}`; CuPy {header['cupy']}, torch {header['torch']}; providers "
             f"{header.get('providers')}. Copy bandwidth {copy:.2f} TB/s (this run). Timing: {header['timing']}.", "",
             "Summary: " + json.dumps(header["summary"]), "",
             *([f"Rows marked \"earlier run\" come from `{header['earlier_rows_from']}`.", ""]
               if header.get("earlier_rows_from") else []),
             "## Memory-bound kernels", "",
             "`graphopt us`: device time in a CUDA graph (as the tuner times it and the runtime runs it); `torch us`: torch eager. "
             "`of copy`: against the copy ceiling (1 GiB buffers); `of same-size copy`: against a copy moving the "
             "row's bytes, timed like the kernels (in a CUDA graph, its source and destination rotated like every "
             "kernel's operands; where the run measured it).", "",
             "| kernel | size | dtype | MB moved | graphopt us | of copy | of same-size copy | torch us | torch of copy | chosen |",
             "|---|---|---|---:|---:|---:|---:|---:|---:|---|"]
    for r in mem_rows:
        lines.append(f"| {r['kernel']} | {r['size']} | {r['dtype']} | {r['MB']} | {r['graphopt_us']} | {r['fraction_of_copy']} | "
                     f"{r.get('of_same_size_copy', '-')} | {r['torch_us']} | {r['torch_of_copy']} | {r['chosen']}"
                     + (f" (two loads a thread: {r['vec_loads2_us']} us)" if r.get("vec_loads2_us") else "")
                     + (f" (two loads a thread failed: {r['vec_loads2_failure']})" if r.get("vec_loads2_failure") else "")
                     + (f" (earlier run: {r['earlier_run']})" if r.get("earlier_run") else "") + " |")
    lines += ["", "## Attention (no mask; causal where it says so)", "",
              "`graphopt us` and `SDPA us`: device time inside a CUDA graph, calls back to back (graphopt's with its "
              "stream barrier before each: the call before is the same library launch; a row's `sdpa_timing` in the "
              "JSON says if SDPA's capture failed and it was timed eagerly; `sdpa_eager_us` is its eager time); "
              "unfused torch: eager. `placed`: each after the same ordinary launch (one empty own kernel), as a model "
              "places the node and as the runtime then runs it (without its barrier; `bench/placed_timing.py`): "
              "graphopt / SDPA us per call, lead kernel included, and the paired ratio graphopt / SDPA (at most 1: "
              "at least as fast).", "",
              "| seq | head dim | causal | BxH | dtype | graphopt us | TFLOP/s | SDPA us | SDPA TFLOP/s | x SDPA | placed graphopt / SDPA us | placed ratio (paired) | unfused torch us | SDPA forced flash / cudnn / efficient us | best per provider | chosen |",
              "|---:|---:|---|---|---|---:|---:|---:|---:|---:|---|---:|---:|---|---|---|"]
    for r in attn_rows:
        pl = r.get("placed") or {}
        placed_us = f"{pl['graphopt_placed_us']} / {pl['torch_placed_us']}" if "graphopt_placed_us" in pl else "-"
        heads = f"{r['heads']} (K/V {r['heads'] // r['kv_groups']})" if r.get("kv_groups") else r["heads"]
        lines.append(f"| {r['seq']} | {r['head_dim']} | {r['causal']} | {r['batch']}x{heads} | {r['dtype']} | {r['graphopt_us']} | "
                     f"{r['TFLOPs']} | {r['sdpa_us']} | {r['sdpa_TFLOPs']} | {r['vs_sdpa']} | {placed_us} | "
                     f"{placed_ratio(r) if placed_ratio(r) is not None else '-'} | {r['torch_unfused_us']} | "
                     f"{' / '.join(str(v) for v in (r.get('sdpa_backends_us') or {}).values()) or '-'} | "
                     f"{json.dumps(r['best_by_provider'])} | {r['chosen']}"
                     + (f" (earlier run: {r['earlier_run']})" if r.get("earlier_run") else "") + " |")
    if skipped:
        lines += ["", "Skipped for the time budget: " + ", ".join(skipped)]
    write_atomic(os.path.join(out_dir, f"transformer_kernels_{gpu_name}.md"), "\n".join(lines) + "\n")


def placed_ratio(row: dict) -> float | None:
    """A row's paired graphopt / SDPA ratio with both after an ordinary launch, or None (not measured)."""
    return (row.get("placed") or {}).get("placed_ratio_paired")


MEMORY_KEY = ("kernel", "size", "dtype")
ATTENTION_KEY = ("seq", "head_dim", "causal", "dtype", "kv_groups")


def keep_earlier(new: list[dict], earlier: list[dict], key: tuple[str, ...], run: str) -> list[dict]:
    """``new`` rows, then every ``earlier`` row whose key ``new`` does not measure again, marked with the run
    it came from (``earlier_run``): a partial rerun (the GELU rows only, the 4096-key attention rows only)
    merged into the full table replaces what it measured and drops nothing."""
    measured = {tuple(r.get(k) for k in key) for r in new}
    kept = [dict(r, earlier_run=r.get("earlier_run", run)) for r in earlier if tuple(r.get(k) for k in key) not in measured]
    return list(new) + kept


def merge(out_dir: str, memory_json: str, attention_json: str, gpu_name: str | None = None,
          previous: str | None = None) -> None:
    """One file from two device calls: a call's time limit fits one table, not both. Named by
    ``gpu_name`` or else by the GPU the attention run's header names (merging needs no GPU here).
    ``previous``: an earlier results file whose rows the two runs did not measure again are kept (marked)."""
    with open(memory_json) as f:
        mem = json.load(f)
    with open(attention_json) as f:
        attn = json.load(f)
    if previous:
        with open(previous) as f:
            old = json.load(f)
        h = old.get("header", {})
        run = f"{h.get('date', '?')}, code {str(h.get('git', '?'))[:7]}"
        mem = dict(mem, memory_bound=keep_earlier(mem["memory_bound"], old.get("memory_bound", []), MEMORY_KEY, run))
        attn = dict(attn, attention=keep_earlier(attn["attention"], old.get("attention", []), ATTENTION_KEY, run))
    gpu_name = gpu_name or gpu_tag(attn["header"].get("gpu", ""))
    header = dict(attn["header"])
    mem_run = mem["header"].get("runs", {}).get("memory_bound", mem["header"])  # a merged file: its memory run
    header["runs"] = {"memory_bound": mem_run, "attention": attn["header"]}
    header["command"] = f"{mem_run['command']} (memory table); {attn['header']['command']} (attention table)"
    skipped = mem["header"].get("skipped_for_time", []) + attn["header"].get("skipped_for_time", [])
    if previous:
        header["earlier_rows_from"] = f"{previous} ({run}): its rows these runs did not measure again"
        measured = {f"attention s={r['seq']} d={r['head_dim']} causal={int(r['causal'])} {r['dtype']}" for r in attn["attention"]}
        skipped = [x for x in skipped if x not in measured]  # a skipped row kept from the earlier file is not missing
    _write(out_dir, header, mem["memory_bound"], attn["attention"], skipped, mem["header"]["ceilings"]["copy_TBps"], gpu_name)


def choice_cands(choice: dict) -> dict:
    """TunerChoice.profile's result as {key: (us or inf, failure or None)} (what ``record`` takes)."""
    return {k: (v if v is not None else math.inf, choice["failures"].get(k)) for k, v in choice["candidates"].items()}

if __name__ == "__main__":
    main()
