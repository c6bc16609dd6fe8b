"""What the vendor libraries on the device offer the providers: the cuDNN frontend's graph methods (with
their docstrings) for matmul, SDPA, layernorm and rmsnorm, one small run of each against torch, and where
cuBLASLt's shared library is and its version. A fact-finding probe for the provider code (CPU-side
tests drive it with fakes); each part is in its own try/except and the JSON is rewritten after each.

    python3 bench/probe_vendor_api.py OUT.json
"""

from __future__ import annotations

import ctypes
import glob
import json
import os
import sys
import traceback

res: dict = {}
out = sys.argv[1]


def save():
    with open(out, "w") as f:
        json.dump(res, f, indent=1, default=str)


def part(name):
    def deco(fn):
        try:
            res[name] = fn()
        except Exception:  # noqa: BLE001
            res[name] = {"error": traceback.format_exc()[-1500:]}
        save()
        print(name, json.dumps(res[name], default=str)[:600], flush=True)
        return fn
    return deco


import torch  # noqa: E402

import cudnn  # noqa: E402

handle = cudnn.create_handle()
cudnn.set_stream(handle, torch.cuda.current_stream().cuda_stream)


@part("api")
def _api():
    g = cudnn.pygraph
    names = [n for n in dir(g) if not n.startswith("_")]
    docs = {n: (getattr(g, n).__doc__ or "")[:2500] for n in names
            if n in ("matmul", "sdpa", "layernorm", "rmsnorm", "bias", "gelu", "gelu_approx_tanh", "add",
                     "execute", "execute_plan_at_index", "tensor", "tensor_like", "create_execution_plans",
                     "build_plans", "get_execution_plan_count", "get_workspace_size_plan_at_index",
                     "populate_cuda_graph", "update_cuda_graph", "scale", "mul", "reduction", "instancenorm",
                     "batchnorm_inference", "swish", "relu", "sigmoid", "tanh", "sub", "div", "rsqrt",
                     "get_plan_name_at_index", "select_behavior_notes", "deselect_engines", "key")}
    return {"version": getattr(cudnn, "__version__", "?"), "backend": cudnn.backend_version(), "methods": names,
            "docs": docs, "module": [n for n in dir(cudnn) if not n.startswith("_")]}


def build(g):
    g.validate()
    g.build_operation_graph()
    g.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
    g.check_support()
    g.build_plans(cudnn.build_plan_policy.ALL)
    n = g.get_execution_plan_count()
    return n


def bench(fn, reps=50):
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        a = torch.cuda.Event(enable_timing=True)
        b = torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b) * 1000)
    ts.sort()
    return ts[len(ts) // 2]


def mk(*shape, dtype=torch.half):
    return torch.randn(*shape, device="cuda", dtype=dtype)


@part("matmul_bias_gelu")
def _mm():
    rows = []
    for (b, m, k, n) in [(1, 128, 768, 3072), (1, 4096, 768, 3072), (1, 4096, 3072, 768), (12, 128, 64, 128)]:
        a, w, bias = mk(b, m, k), mk(b, k, n), mk(1, 1, n)
        g = cudnn.pygraph(io_data_type=cudnn.data_type.HALF, intermediate_data_type=cudnn.data_type.FLOAT,
                          compute_data_type=cudnn.data_type.FLOAT, handle=handle)
        A, W, B = g.tensor_like(a), g.tensor_like(w), g.tensor_like(bias)
        C = g.matmul(name="mm", A=A, B=W)
        D = g.add(name="bias", a=C, b=B)
        E = g.gelu(name="gelu", input=D)
        E.set_output(True).set_data_type(cudnn.data_type.HALF)
        row = {"shape": [b, m, k, n]}
        try:
            n_plans = build(g)
            o = torch.empty(b, m, n, device="cuda", dtype=torch.half)
            best = None
            for i in range(n_plans):
                ws = torch.empty(max(g.get_workspace_size_plan_at_index(i), 1), device="cuda", dtype=torch.uint8)
                t = bench(lambda: g.execute_plan_at_index({A: a, W: w, B: bias, E: o}, ws, i, handle=handle))
                best = t if best is None else min(best, t)
            ref = torch.nn.functional.gelu(a.float() @ w.float() + bias.float())
            row.update(plans=n_plans, best_us=round(best, 1), err=(o.float() - ref).abs().max().item(),
                       torch_us=round(bench(lambda: torch.nn.functional.gelu(torch.matmul(a, w) + bias)), 1),
                       plan0=g.get_plan_name_at_index(0) if hasattr(g, "get_plan_name_at_index") else None)
        except Exception as e:  # noqa: BLE001
            row["error"] = repr(e)[:500]
        rows.append(row)
    return rows


@part("layernorm")
def _ln():
    rows = []
    for (n, c) in [(128, 768), (4096, 768), (32 * 128, 1024)]:
        x, gam, bet = mk(n, c, 1, 1), mk(1, c, 1, 1), mk(1, c, 1, 1)
        row = {"shape": [n, c]}
        try:
            g = cudnn.pygraph(io_data_type=cudnn.data_type.HALF, intermediate_data_type=cudnn.data_type.FLOAT,
                              compute_data_type=cudnn.data_type.FLOAT, handle=handle)
            X, G, B = g.tensor_like(x), g.tensor_like(gam), g.tensor_like(bet)
            eps = g.tensor(name="eps", dim=[1, 1, 1, 1], stride=[1, 1, 1, 1], data_type=cudnn.data_type.FLOAT,
                           is_pass_by_value=True)
            Y, mean, inv = g.layernorm(name="ln", norm_forward_phase=cudnn.norm_forward_phase.INFERENCE,
                                       input=X, scale=G, bias=B, epsilon=eps)
            Y.set_output(True).set_data_type(cudnn.data_type.HALF)
            n_plans = build(g)
            y = torch.empty_like(x)
            ws = torch.empty(max(g.get_workspace_size(), 1), device="cuda", dtype=torch.uint8)
            epsv = torch.full((1, 1, 1, 1), 1e-5, dtype=torch.float32, device="cpu")
            t = bench(lambda: g.execute({X: x, G: gam, B: bet, eps: epsv, Y: y}, ws, handle=handle))
            ref = torch.nn.functional.layer_norm(x.float().view(n, c), (c,), gam.float().view(c),
                                                 bet.float().view(c), 1e-5)
            row.update(plans=n_plans, us=round(t, 1), err=(y.float().view(n, c) - ref).abs().max().item(),
                       torch_us=round(bench(lambda: torch.nn.functional.layer_norm(
                           x.view(n, c), (c,), gam.view(c), bet.view(c))), 1))
        except Exception as e:  # noqa: BLE001
            row["error"] = repr(e)[:800]
        rows.append(row)
    return rows


@part("rmsnorm")
def _rms():
    n, c = 4096, 4096
    x, gam = mk(n, c, 1, 1), mk(1, c, 1, 1)
    g = cudnn.pygraph(io_data_type=cudnn.data_type.HALF, intermediate_data_type=cudnn.data_type.FLOAT,
                      compute_data_type=cudnn.data_type.FLOAT, handle=handle)
    X, G = g.tensor_like(x), g.tensor_like(gam)
    eps = g.tensor(name="eps", dim=[1, 1, 1, 1], stride=[1, 1, 1, 1], data_type=cudnn.data_type.FLOAT,
                   is_pass_by_value=True)
    Y, inv = g.rmsnorm(name="rms", norm_forward_phase=cudnn.norm_forward_phase.INFERENCE, input=X, scale=G,
                       epsilon=eps)
    Y.set_output(True).set_data_type(cudnn.data_type.HALF)
    n_plans = build(g)
    y = torch.empty_like(x)
    ws = torch.empty(max(g.get_workspace_size(), 1), device="cuda", dtype=torch.uint8)
    epsv = torch.full((1, 1, 1, 1), 1e-5, dtype=torch.float32, device="cpu")
    t = bench(lambda: g.execute({X: x, G: gam, eps: epsv, Y: y}, ws, handle=handle))
    xf = x.float().view(n, c)
    ref = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-5) * gam.float().view(c)
    return {"plans": n_plans, "us": round(t, 1), "err": (y.float().view(n, c) - ref).abs().max().item()}


@part("sdpa_masks")
def _sdpa():
    rows = []
    B, H, S, D = 4, 12, 128, 64
    q, k, v = mk(B, H, S, D), mk(B, H, S, D), mk(B, H, S, D)
    for form in ("bias", "padding", "causal_bias"):
        row = {"form": form}
        try:
            g = cudnn.pygraph(io_data_type=cudnn.data_type.HALF, intermediate_data_type=cudnn.data_type.FLOAT,
                              compute_data_type=cudnn.data_type.FLOAT, handle=handle)
            Q, K, V = g.tensor_like(q), g.tensor_like(k), g.tensor_like(v)
            kw = {}
            feeds = {}
            bias = mk(B, 1, S, S) if form != "padding" else None
            if bias is not None:
                Bt = g.tensor_like(bias)
                kw["attn_mask" if False else "bias"] = Bt
                feeds[Bt] = bias
            if form == "padding":
                sq = torch.full((B, 1, 1, 1), S, dtype=torch.int32, device="cuda")
                skv = torch.tensor([S, 100, 64, 1], dtype=torch.int32, device="cuda").view(B, 1, 1, 1)
                SQ, SKV = g.tensor_like(sq), g.tensor_like(skv)
                kw.update(use_padding_mask=True, seq_len_q=SQ, seq_len_kv=SKV)
                feeds.update({SQ: sq, SKV: skv})
            O, _ = g.sdpa(name="sdpa", q=Q, k=K, v=V, generate_stats=False, attn_scale=D ** -0.5,
                          use_causal_mask=form == "causal_bias", **kw)
            o = torch.empty_like(q)
            O.set_output(True).set_dim(list(o.shape)).set_stride(list(o.stride()))
            n_plans = build(g)
            ws = torch.empty(max(g.get_workspace_size(), 1), device="cuda", dtype=torch.uint8)
            feeds.update({Q: q, K: k, V: v, O: o})
            g.execute(feeds, ws, handle=handle)
            torch.cuda.synchronize()
            if form == "padding":
                mask = torch.arange(S, device="cuda").view(1, 1, 1, S) < skv.view(B, 1, 1, 1)
                ref = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float(),
                                                                       attn_mask=mask)
            else:
                ref = torch.nn.functional.scaled_dot_product_attention(
                    q.float(), k.float(), v.float(), attn_mask=bias.float() + (
                        torch.triu(torch.full((S, S), float("-inf"), device="cuda"), 1)
                        if form == "causal_bias" else 0))
            row.update(plans=n_plans, err=(o.float() - ref).abs().max().item(),
                       us=round(bench(lambda: g.execute(feeds, ws, handle=handle)), 1))
        except Exception as e:  # noqa: BLE001
            row["error"] = repr(e)[:800]
        rows.append(row)
    return rows


@part("execute_host_cost")
def _host():
    """Host microseconds per execute: torch tensors, raw pointers (ints), and a prebuilt pack."""
    import time
    x = mk(1, 64, 56, 56).to(memory_format=torch.channels_last)
    w = mk(64, 64, 3, 3).to(memory_format=torch.channels_last)
    g = cudnn.pygraph(io_data_type=cudnn.data_type.HALF, intermediate_data_type=cudnn.data_type.FLOAT,
                      compute_data_type=cudnn.data_type.FLOAT, handle=handle)
    X, W = g.tensor_like(x), g.tensor_like(w)
    Y = g.conv_fprop(image=X, weight=W, padding=[1, 1], stride=[1, 1], dilation=[1, 1])
    Y = g.relu(input=Y)
    y = torch.empty_like(x)
    Y.set_output(True).set_dim(list(y.shape)).set_stride(list(y.stride())).set_data_type(cudnn.data_type.HALF)
    build(g)
    ws = torch.empty(max(g.get_workspace_size(), 1), device="cuda", dtype=torch.uint8)
    out = {}
    for label, pack, wsa in (("torch", {X: x, W: w, Y: y}, ws),
                             ("int_ptrs", {X: x.data_ptr(), W: w.data_ptr(), Y: y.data_ptr()}, ws.data_ptr()),
                             ("uid_ptrs", None, None)):
        try:
            if label == "uid_ptrs":
                pack = {X.get_uid(): x.data_ptr(), W.get_uid(): w.data_ptr(), Y.get_uid(): y.data_ptr()}
                wsa = ws.data_ptr()
            for _ in range(10):
                g.execute(pack, wsa, handle=handle)
            torch.cuda.synchronize()
            t = time.perf_counter()
            for _ in range(200):
                g.execute(pack, wsa, handle=handle)
            out[label] = round((time.perf_counter() - t) / 200 * 1e6, 1)
            torch.cuda.synchronize()
        except Exception as e:  # noqa: BLE001
            out[label] = repr(e)[:300]
    return out


@part("cublaslt")
def _lt():
    import site
    cands = []
    for d in site.getsitepackages() + [os.path.dirname(torch.__file__)]:
        cands += glob.glob(os.path.join(d, "nvidia", "**", "libcublasLt.so*"), recursive=True)
        cands += glob.glob(os.path.join(d, "torch", "lib", "libcublasLt.so*"))
    info = {"found": cands}
    for p in cands:
        try:
            lib = ctypes.CDLL(p)
            lib.cublasLtGetVersion.restype = ctypes.c_size_t
            info["loaded"] = p
            info["version"] = lib.cublasLtGetVersion()
            break
        except OSError as e:
            info.setdefault("errors", []).append(str(e))
    return info
