"""graphopt custom ops in the runtime: lowering choice, output shapes, xp fallbacks.

On CUDA a node runs its recorded lowering (``lowering`` / ``lowering_params``, or the matching
entry of ``lowering_buckets``) through ``graphopt.kernels``. When no lowering applies (none
recorded, a dtype the kernels lack, a candidate that does not apply to the actual shapes) the node
runs ``cbr_xp`` / ``gemm_act_xp``: the NumPy reference's semantics written against ``xp`` (CuPy on
the GPU), with the same convolution and GEMM as the standard ops. Those fallbacks are tested on
the CPU with ``xp = numpy`` against the references. The other registered ops (LayerNorm, RMSNorm,
Gelu, Attention, and any op added with ``graphopt.ops.register_schema``) run their lowering the
same way; their fallback is the schema's NumPy reference (on the host, so a plan with one is not
captured in a CUDA graph and says why).
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

import numpy as np

from graphopt.runtime import ops_std

CUSTOM_OPS = ("CBR", "GemmAct")  # the ops with an xp (on-device) fallback; every registered op runs


def runnable_ops() -> set[str]:
    """Every graphopt op the runtime can run: each registered schema (its reference is the fallback)."""
    from graphopt.ops import schemas

    return {s.name for s in schemas()}


# ---------------------------------------------------------------- lowering selection
def select_bucket(buckets: "str | Sequence[Mapping[str, Any]]", dims: Mapping[str, int]) -> Mapping[str, Any]:
    """The bucket that ``graphopt.tune.buckets.choose`` dispatches to (one rule for the optimizer and the
    runtime): the first (ascending) whose every dim is >= the actual size, else the last.

    ``dims`` maps symbolic dim names to the actual sizes; a bucket dim the run does not bind counts
    as satisfied (it cannot be compared). ``ValueError`` for an empty or malformed list.
    """
    from graphopt.errors import TuningError
    from graphopt.tune.buckets import choose, decode

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
def _sigmoid(xp, x):
    return 0.5 * (xp.tanh(0.5 * x) + 1)  # no overflow for large |x|


def apply_activation(ctx, y, attrs: Mapping[str, Any]):
    """The activation table of ``graphopt.ops.activations`` against ``ctx.xp`` (computes in y's dtype)."""
    xp = ctx.xp
    name = attrs.get("activation", "none")
    f = lambda k, d: d if attrs.get(k) is None else float(np.float32(attrs[k]))  # noqa: E731
    if name == "none":
        return y
    if name == "Relu":
        return xp.maximum(y, 0)
    if name == "Clip":
        lo, hi = f("clip_min", None), f("clip_max", None)
        if lo is not None:
            y = xp.maximum(y, y.dtype.type(lo))
        if hi is not None:
            y = xp.minimum(y, y.dtype.type(hi))
        return y
    if name == "LeakyRelu":
        return xp.where(y >= 0, y, y * f("act_alpha", 0.01))
    if name == "Sigmoid":
        return _sigmoid(xp, y)
    if name == "SiLU":
        return y * _sigmoid(xp, y)
    if name == "HardSwish":
        return y * xp.clip(y / 6 + 0.5, 0, 1)
    if name == "HardSigmoidMul":
        return y * xp.clip(y * f("act_alpha", 0.2) + f("act_beta", 0.5), 0, 1)
    if name == "Gelu":
        return 0.5 * y * (1 + ops_std._erf(ctx, [y / math.sqrt(2.0)])[0])
    if name == "GeluTanh":
        return 0.5 * y * (1 + xp.tanh(math.sqrt(2 / math.pi) * (y + 0.044715 * y ** 3)))
    from graphopt.ops.activations import ACTIVATIONS  # the shared table's xp form for the rest

    if name in ACTIVATIONS:
        return ACTIVATIONS[name].xp(xp, y, attrs)
    raise NotImplementedError(f"activation {name!r}")


def _f32(ctx, x):
    return x.astype(np.float32) if x.dtype == np.float16 else x


def cbr_xp(ctx, ins: Sequence[Any], attrs: Mapping[str, Any]) -> list:
    """graphopt.CBR = act(Conv(X, W, B) + R) against ``ctx.xp`` (ctx.node carries Conv's attributes)."""
    x, w = ins[0], ins[1]
    b = ins[2] if len(ins) > 2 else None
    r = ins[3] if len(ins) > 3 else None
    y = ops_std._conv(ctx, [x, w])[0]
    y = _f32(ctx, y)
    if b is not None:
        y = y + _f32(ctx, b).reshape((1, -1) + (1,) * (y.ndim - 2))
    if r is not None:
        y = y + _f32(ctx, r)
    return [apply_activation(ctx, y, attrs).astype(x.dtype)]


def gemm_act_xp(ctx, ins: Sequence[Any], attrs: Mapping[str, Any]) -> list:
    """graphopt.GemmAct = act(A.B + C) (matmul mode) or act(alpha A'B' + beta C) (gemm mode)."""
    a, b = ins[0], ins[1]
    c = ins[2] if len(ins) > 2 else None
    if attrs.get("mode", "matmul") == "gemm":
        aa = a.T if attrs.get("transA", 0) else a
        bb = b.T if attrs.get("transB", 0) else b
        y = _f32(ctx, ctx.matmul(ctx.xp.ascontiguousarray(aa), ctx.xp.ascontiguousarray(bb)))
        alpha = float(np.float32(attrs.get("alpha", 1.0)))
        if alpha != 1.0:
            y = y * alpha
        if c is not None:
            y = y + float(np.float32(attrs.get("beta", 1.0))) * _f32(ctx, c)
    else:
        y = _f32(ctx, ctx.matmul(a, b))
        if c is not None:
            y = y + _f32(ctx, c)
    return [apply_activation(ctx, y, attrs).astype(a.dtype)]


XP_IMPLS = {"CBR": cbr_xp, "GemmAct": gemm_act_xp}


def output_shape(op: str, shapes: Sequence[tuple[int, ...] | None], attrs: Mapping[str, Any], node, sig=None) -> tuple[int, ...]:
    """The (first) output shape of a custom-op node for these input shapes (the kernels' out buffer)."""
    if op not in XP_IMPLS:
        from graphopt.kernels.check import output_shape as kernel_output_shape

        return tuple(kernel_output_shape(sig))
    if op == "CBR":
        x, w = shapes[0], shapes[1]
        ctx = ops_std.OpContext(np, node, 0, {})
        actx = ops_std._Attrs2D(ctx) if len(x) == 3 else ctx
        spatial = list(x[2:]) if len(x) == 4 else [1] + list(x[2:])
        kernel = list(w[2:]) if len(w) == 4 else [1] + list(w[2:])
        _, _, _, outs = ops_std._conv_geometry(actx, spatial, kernel)
        return (x[0], w[0]) + tuple(outs if len(x) == 4 else outs[1:])
    a, b = shapes[0], shapes[1]
    if attrs.get("mode", "matmul") == "gemm":
        m = a[1] if attrs.get("transA", 0) else a[0]
        n = b[0] if attrs.get("transB", 0) else b[1]
        return (m, n)
    from graphopt.kernels.blas import gemm_args

    return gemm_args(tuple(a), tuple(b)).out_shape
