"""graphopt custom ops in the runtime: lowering choice, output shapes, xp fallbacks.

On CUDA a node runs its recorded lowering (``lowering`` / ``lowering_params``, or the matching
entry of ``lowering_buckets``) through the lowering registry. When no lowering applies (none
recorded, a dtype the kernels lack, a candidate that does not apply to the actual shapes, a node
with more outputs than the lowering fills) the node runs its *device fallback*: the op's semantics
written against ``xp`` (CuPy on the GPU), computing in float32, with the runtime's capture-safe GEMM.
The built-in ops' fallbacks are here (``XP_IMPLS``: CBR and GemmAct share the standard ops'
convolution and GEMM); an op added with ``graphopt.ops.register_schema`` brings its own as
``OpSchema.xp_impl``. An op with neither cannot run on the device, and the session refuses it at
plan build rather than copying tensors to the host. Every fallback is tested on the CPU with
``xp = numpy`` against the op's float64 reference.
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

import numpy as np

from graphopt.errors import TuningError
from graphopt.lowering.buckets import choose, decode
from graphopt.ops.activations import ACTIVATIONS
from graphopt.runtime.onnx_ops.conv import conv
from graphopt.runtime.onnx_ops.registry import for_accumulation



def runnable_ops() -> set[str]:
    """Every graphopt op the runtime can run: each registered schema (its reference is the fallback)."""
    from graphopt.ops import schemas

    return {s.name for s in schemas()}


# ---------------------------------------------------------------- lowering selection
def select_bucket(buckets: "str | Sequence[Mapping[str, Any]]", dims: Mapping[str, int]) -> Mapping[str, Any]:
    """The bucket that ``graphopt.lowering.buckets.choose`` dispatches to (one rule for the optimizer and the
    runtime): the first (ascending) whose every dim is >= the actual size, else the last.

    ``dims`` maps symbolic dim names to the actual sizes; a bucket dim the run does not bind counts
    as satisfied (it cannot be compared). ``ValueError`` for an empty or malformed list.
    """

    try:
        rows = decode(buckets)
        actual = {k: int(dims.get(k, 1)) for k in rows[0]["dims"]}
        lowering, params = choose(rows, actual)
    except TuningError as e:
        raise ValueError(str(e)) from None
    return next(r for r in rows if (r["lowering"], r["params"]) == (lowering, params))


def lowering_key(node, dims: Mapping[str, int]) -> str | None:
    """The candidate key (``name`` or ``name:params``) this node should run with, or None."""
    buckets = node.attr("lowering_buckets", None)
    if buckets:
        try:
            b = select_bucket(buckets, dims)
        except ValueError as e:
            raise ValueError(f"node {node.name!r}: {e}") from None
        name, params = b["lowering"], b.get("params", "") or ""
    else:
        name, params = node.attr("lowering", None), node.attr("lowering_params", "") or ""
    if not name:
        return None
    return f"{name}:{params}" if params else name


def op_attrs(node) -> dict[str, Any]:
    """The node's attributes the schema declares (the lowering ones are the runtime's business)."""
    return {k: v for k, v in node.attrs_dict().items() if not k.startswith("lowering")}


# ---------------------------------------------------------------- xp activations
def apply_activation(ctx, y, attrs: Mapping[str, Any]):
    """The activation of ``attrs`` against ``ctx.xp``, from the shared table (``graphopt.ops.activations``)."""
    name = attrs.get("activation", "none")
    if name not in ACTIVATIONS:
        raise NotImplementedError(f"activation {name!r}")
    return ACTIVATIONS[name].xp(ctx.xp, y, attrs)


def cbr_xp(ctx, ins: Sequence[Any], attrs: Mapping[str, Any]) -> list:
    """graphopt.CBR = act(Conv(X, W, B) + R) against ``ctx.xp`` (ctx.node carries Conv's attributes)."""
    x, w = ins[0], ins[1]
    b = ins[2] if len(ins) > 2 else None
    r = ins[3] if len(ins) > 3 else None
    y = conv(ctx, [x, w])[0]
    y = for_accumulation(ctx, y)
    if b is not None:
        y = y + for_accumulation(ctx, b).reshape((1, -1) + (1,) * (y.ndim - 2))
    if r is not None:
        y = y + for_accumulation(ctx, r)
    return [apply_activation(ctx, y, attrs).astype(x.dtype)]


def gemm_act_xp(ctx, ins: Sequence[Any], attrs: Mapping[str, Any]) -> list:
    """graphopt.GemmAct = act(A.B + C) (matmul mode) or act(alpha A'B' + beta C) (gemm mode)."""
    a, b = ins[0], ins[1]
    c = ins[2] if len(ins) > 2 else None
    if attrs.get("mode", "matmul") == "gemm":
        aa = a.T if attrs.get("transA", 0) else a
        bb = b.T if attrs.get("transB", 0) else b
        y = for_accumulation(ctx, ctx.matmul(ctx.xp.ascontiguousarray(aa), ctx.xp.ascontiguousarray(bb)))
        alpha = float(np.float32(attrs.get("alpha", 1.0)))
        if alpha != 1.0:
            y = y * alpha
        if c is not None:
            y = y + float(np.float32(attrs.get("beta", 1.0))) * for_accumulation(ctx, c)
    else:
        y = for_accumulation(ctx, ctx.matmul(a, b))
        if c is not None:
            y = y + for_accumulation(ctx, c)
    return [apply_activation(ctx, y, attrs).astype(a.dtype)]


def _eps(attrs, default: float) -> float:
    return float(np.float32(attrs.get("epsilon", default)))


def layer_norm_xp(ctx, ins: Sequence[Any], attrs: Mapping[str, Any]) -> list:
    """graphopt.LayerNorm over the last axis of S = X [+ skip [+ skip_bias]]; outputs [Y] or [Y, S]."""
    x, scale, bias, skip, skip_bias = (list(ins) + [None] * 5)[:5]
    s = for_accumulation(ctx, x)
    if skip is not None:
        s = s + for_accumulation(ctx, skip)
        if skip_bias is not None:
            s = s + for_accumulation(ctx, skip_bias)
    xp = ctx.xp
    d = s - s.mean(axis=-1, keepdims=True)
    y = d / xp.sqrt((d * d).mean(axis=-1, keepdims=True) + np.float32(_eps(attrs, 1e-5))) * for_accumulation(ctx, scale)
    if bias is not None:
        y = y + for_accumulation(ctx, bias)
    out = [y.astype(x.dtype)]
    if attrs.get("sum_output", 0):
        out.append(s.astype(x.dtype))
    return out


def rms_norm_xp(ctx, ins: Sequence[Any], attrs: Mapping[str, Any]) -> list:
    """graphopt.RMSNorm: S / sqrt(mean(S^2) + epsilon) * scale over the last axis of S = X [+ skip];
    outputs [Y] or [Y, S]."""
    x, scale, skip = (list(ins) + [None] * 3)[:3]
    s = for_accumulation(ctx, x)
    if skip is not None:
        s = s + for_accumulation(ctx, skip)
    rms = ctx.xp.sqrt((s * s).mean(axis=-1, keepdims=True) + np.float32(_eps(attrs, 1e-6)))
    y = s / rms * for_accumulation(ctx, scale)
    return [y.astype(x.dtype)] + ([s.astype(x.dtype)] if attrs.get("sum_output", 0) else [])


def attention_xp(ctx, ins: Sequence[Any], attrs: Mapping[str, Any]) -> list:
    """graphopt.Attention: softmax(Q K^T * scale [+ mask] [causal]) V; scores and softmax in float32."""
    xp = ctx.xp
    q, k, v, mask = (list(ins) + [None] * 4)[:4]
    if attrs.get("qkv_packed", 0):  # one [B, S, 3, H, D] tensor: its thirds (views) are Q, K, V
        q, k, v = q[:, :, 0], q[:, :, 1], q[:, :, 2]
    if attrs.get("qkv_bshd", 0):  # [B, S, H, D] -> [B, H, S, D] (views; the matmuls below copy)
        q, k, v = (xp.swapaxes(t, 1, 2) for t in (q, k, v))
    groups = int(attrs.get("kv_groups", 1) or 1)
    if groups > 1:  # grouped-query: each K/V head serves `groups` consecutive Q heads
        k, v = xp.repeat(k, groups, axis=1), xp.repeat(v, groups, axis=1)
    kt = k if attrs.get("k_transposed", 0) else xp.swapaxes(k, -1, -2)
    scale = float(np.float32(attrs["scale"])) if attrs.get("scale") is not None else 1.0 / math.sqrt(q.shape[-1])
    # Q is scaled before the GEMM (as the kernels do): fp16 scores then stay in range
    qs = (for_accumulation(ctx, q) * np.float32(scale)).astype(q.dtype)
    s = for_accumulation(ctx, ctx.matmul(xp.ascontiguousarray(qs), xp.ascontiguousarray(kt)))
    kind = attrs.get("mask_kind", "none")
    if kind == "additive":
        s = s + for_accumulation(ctx, mask)
    elif kind == "bool":
        mv = float(np.float32(attrs["mask_value"])) if attrs.get("mask_value") is not None else -math.inf
        s = s + xp.where(mask.astype(bool), np.float32(0), np.float32(mv))
    if attrs.get("causal", 0):
        sq, skv = s.shape[-2:]
        s = xp.where(xp.arange(skv)[None, :] > xp.arange(sq)[:, None], np.float32(-math.inf), s)
    e = xp.exp(s - s.max(axis=-1, keepdims=True))
    p = e / e.sum(axis=-1, keepdims=True)  # fully masked rows: NaN, as the reference
    if attrs.get("nan_to_zero", 0):
        p = xp.where(xp.isnan(p), np.float32(0), p)
    y = ctx.matmul(xp.ascontiguousarray(p.astype(v.dtype)), xp.ascontiguousarray(v)).astype(q.dtype)
    return [xp.ascontiguousarray(xp.swapaxes(y, 1, 2)) if attrs.get("y_bshd", 0) else y]


# The built-in ops' device fallbacks; a registered op's is its OpSchema.xp_impl (see device_impl).
XP_IMPLS = {"CBR": cbr_xp, "GemmAct": gemm_act_xp, "LayerNorm": layer_norm_xp, "RMSNorm": rms_norm_xp,
            "Attention": attention_xp}


def device_impl(op: str):
    """``fn(ctx, inputs, attrs) -> outputs`` that runs ``op`` on ``ctx.xp``, or None when the op has none."""
    if op in XP_IMPLS:
        return XP_IMPLS[op]
    from graphopt.ops import get_schema

    impl = get_schema(op).xp_impl
    if impl is None:
        return None
    return lambda ctx, ins, attrs: list(impl(ctx.xp, list(ins), dict(attrs), ctx.matmul))


def output_shape(op: str, shapes: Sequence[tuple[int, ...] | None], attrs: Mapping[str, Any], sig=None) -> tuple[int, ...]:
    """The (first) output shape of a custom-op node for these input shapes (the lowering's out buffer):
    the op's schema says it."""
    from graphopt.kernels.check import output_shape as checked_shape
    from graphopt.kernels.registry import signature_of

    return tuple(checked_shape(sig if sig is not None else signature_of(op, shapes, [""] * len(shapes), attrs)))
