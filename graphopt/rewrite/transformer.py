"""Constraints and builders of the transformer rule files (``norm.toml``, ``gelu.toml``, ``attention.toml``).

Constraints (``None`` when they hold, else the reason ``--explain`` prints):

* ``reduces_last_axis(reduce, x)``: a ReduceMean over exactly the last axis of ``x``, keepdims=1,
  with the axes as an attribute (opset < 18) or a constant input (opset >= 18);
* ``last_dim_vector(c, x)``: a constant with one value per element of ``x``'s last dim, shaped
  ``[D]`` or ``[1, .., D]`` (a LayerNorm/RMSNorm scale or bias);
* ``residual_like(r, x)``: ``r`` broadcasts to the runtime tensor ``x`` over its leading dims only (the skip
  input of SkipLayerNorm / SkipRMSNorm: a residual, or a position table ``[1, S, D]``; not a constant bias);
* ``softmax_last_axis(sm)``: a Softmax over the last axis at opset >= 13;
* ``noop_cast(cast)``: a Cast to the element type its input already has;
* ``attention_operands(q, kt, v)``: runtime tensors of one rank (>= 3) with consistent head dims;
* ``bool_tensor(t)``: t has element type bool;
* ``mask_broadcast(m, mm)``: an additive mask that broadcasts onto the scores without enlarging them;
* ``head_split_transposes(tq, tk, tv)``, ``keys_transpose(tk)``, ``heads_merge_transpose(ty)``: the
  Transposes around an attention that its layout attributes absorb;
* ``repeated_kv(k, uk, xk, rk, v, uv, xv, rv, q)``: K and V each with every head repeated for a group of
  Q's heads by repeat_kv's ``Reshape(Expand(Unsqueeze(t, 2)))`` (grouped-query attention).

Where a shape is unknown the shape checks pass: every fused op's function body broadcasts exactly
like the nodes it replaces, so the result is the same; a lowering checks the concrete shapes.

Builders (attribute dicts): ``epsilon_attr(eps)``, ``layernorm_attrs(ln)`` (a native
LayerNormalization's epsilon, with its axis checked), ``attention_scale(s1, s2?)`` (the product of
scalar constants), ``attention_scale_div(s)`` (1 / s), ``mask_fill(fill)`` (the
``mask_value`` of a Where(mask, scores, fill)), ``heads_of(q)`` (``num_heads`` from
``[B, H, S, D]``), ``kv_groups_of(k, uk, xk, rk)`` (``kv_groups``: how many times repeat_kv repeats K's heads),
``gelu_activation(gelu)`` (GemmAct's activation for a ``graphopt.Gelu`` or ONNX
``Gelu`` node), ``gelu_attrs(gelu)`` (``approximate`` of an ONNX Gelu node).
"""

from __future__ import annotations

import numpy as np

from graphopt.rewrite.constraints import _fmt_shape, known_rank, reduce_axes
from graphopt.rewrite.dim_sources import dim_source, entry_size, same_dim, same_size
from graphopt.rewrite.registry import BuildFailed, NewConstant, register_builder, register_constraint


def _scalar(g, t, what: str) -> float:
    """The value of a one-element constant; BuildFailed naming it otherwise."""
    v = g.constant_value(t) if t else None
    if v is None:
        raise BuildFailed(f"{what} {t!r} is not a constant")
    if np.size(v) != 1:
        raise BuildFailed(f"{what} {t!r} has {np.size(v)} elements, expected one")
    return float(np.asarray(v, dtype=np.float64).reshape(-1)[0])


@register_constraint("reduces_last_axis", "nt")
def reduces_last_axis(g, node, x):
    """node is a ReduceMean over only the last axis of x, with keepdims=1."""
    if int(node.attr("keepdims", 1)) != 1:
        return f"{node.name!r} has keepdims=0; the normalisation needs the reduced axis kept"
    if int(node.attr("noop_with_empty_axes", 0)) != 0:
        return f"{node.name!r} has noop_with_empty_axes=1"
    axes = reduce_axes(g, node)
    if isinstance(axes, str):
        return axes
    if axes == [-1]:
        return None
    r = known_rank(g, x)
    if r is not None and axes == [r - 1]:
        return None
    if len(axes) == 1 and r is None:
        return f"{node.name!r} reduces axis {axes[0]}, and the rank of {x!r} is unknown, so it may not be the last"
    return f"{node.name!r} reduces axes {axes}, not only the last axis of {x!r}"


@register_constraint("last_dim_vector", "tt")
def last_dim_vector(g, c, x):
    """c is a constant with one value per element of x's last dim: shape [D] or [1, .., D]."""
    if c is None:
        return "the optional input is absent"
    v = g.constant_value(c)
    if v is None:
        return f"{c!r} is not a constant"
    shape = tuple(np.shape(v))
    if not shape or any(d != 1 for d in shape[:-1]):
        return f"{c!r} has shape {_fmt_shape(shape)}, not one value per element of the last axis ([D] or [1,..,D])"
    xs = g.shape(x)
    if xs is not None:
        if len(shape) > len(xs):
            return f"{c!r} has rank {len(shape)} > the rank {len(xs)} of {x!r}; it would broadcast the input"
        last = xs[-1] if xs else None
        if isinstance(last, int) and last != shape[-1]:
            return f"{c!r} has {shape[-1]} values but the last axis of {x!r} has {last}"
    return None


@register_constraint("residual_like", "tt")
def residual_like(g, r, x):
    """x is a runtime tensor and r broadcasts to it over x's leading dims only: r's shape without its leading 1s
    is a suffix of x's, so the Add's output has x's shape (a residual of x's shape, or a position table [1, S, D]
    added to [B, S, D], which the norm kernels read cyclically). r may be a constant table, but not a per-feature
    vector: that is a bias, which the GEMM before it takes."""
    if r is None or x is None:
        return "the optional input is absent"
    if g.constant_value(x) is not None:
        return f"{x!r} is a constant, not a runtime tensor"
    rs, xs = g.shape(r), g.shape(x)
    if rs is None or xs is None:
        return None  # unknown: the fused op's body adds exactly like the Add it replaces
    if len(rs) > len(xs):
        return f"{r!r} has rank {len(rs)} > the rank {len(xs)} of {x!r}; the Add's output would have {r!r}'s rank"
    lead = next((i for i, d in enumerate(rs) if d != 1), len(rs) - 1) if rs else 0
    core = tuple(rs[lead:])
    for a, b in zip(core, xs[len(xs) - len(core):]):
        if isinstance(a, int) and isinstance(b, int) and a != b:
            return (f"{r!r} of shape {_fmt_shape(rs)} does not broadcast to {x!r} of shape {_fmt_shape(xs)} over its "
                    "leading dims only; the Add broadcasts otherwise")
        if isinstance(a, int) and a > 1 and not same_size(a, b):  # x's dim might be a 1 that r broadcasts
            return (f"{x!r} of shape {_fmt_shape(xs)} is not proven to have {r!r}'s dims {_fmt_shape(core)}: "
                    "the Add might broadcast it")
    if len(core) < 2 and g.constant_value(r) is not None:
        return f"{r!r} is a constant vector of {core[-1] if core else 1} values: a bias, not a residual"
    return None


@register_constraint("softmax_last_axis", "n")
def softmax_last_axis(g, node):
    """node is a Softmax over the last axis at opset >= 13 (older Softmax flattens to 2-D)."""
    opset = g.root.opset.get("", 0)
    if opset < 13:
        return f"opset {opset} < 13: Softmax {node.name!r} normalises over a flattened 2-D view"
    axis = int(node.attr("axis", -1))
    if axis == -1:
        return None
    r = known_rank(g, node.inputs[0])
    if r is not None and axis == r - 1:
        return None
    return f"Softmax {node.name!r} has axis={axis}, not the last axis"


@register_constraint("noop_cast", "n")
def noop_cast(g, node):
    """node is a Cast to the element type its input already has."""
    src = g.dtype(node.inputs[0]) if node.inputs else None
    to = int(node.attr("to", 0))
    if src is None:
        return f"the element type of {node.inputs[0]!r} is unknown, so Cast {node.name!r} may convert"
    if src != to:
        return f"Cast {node.name!r} converts element type {src} to {to}"
    return None


@register_constraint("attention_operands", "ttt")
def attention_operands(g, q, kt, v):
    """q, kt (K already transposed) and v are runtime tensors of one rank >= 3 with matching head dims."""
    for t in (q, kt, v):
        if t is None:
            return "an input is absent"
        if g.constant_value(t) is not None:
            return f"{t!r} is a constant (a weight), not a query/key/value tensor"
    shapes = [g.shape(t) for t in (q, kt, v)]
    if any(s is None for s in shapes):
        return None  # unknown: the body's MatMuls read the operands exactly as the replaced ones did
    qs, ks, vs = shapes
    if not (len(qs) == len(ks) == len(vs)) or len(qs) < 3:
        return (f"q, k^T and v have ranks {len(qs)}, {len(ks)}, {len(vs)}; attention needs one rank >= 3 "
                "([batch, (heads,) seq, dim])")
    for (a, an), (b, bn) in (((qs[-1], "q's head dim"), (ks[-2], "k^T's head dim")),
                             ((ks[-1], "k^T's key length"), (vs[-2], "v's key length"))):
        if isinstance(a, int) and isinstance(b, int) and a != b:
            return f"{an} {a} != {bn} {b}"
    return None


def _perm(node) -> list[int] | None:
    perm = node.attr("perm", None)
    return None if perm is None else [int(p) for p in perm]


@register_constraint("head_split_transposes", "nnn")
def head_split_transposes(g, tq, tk, tv):
    """tq and tv are Transpose(perm 0,2,1,3) and tk Transpose(perm 0,2,3,1): [B, S, H, D] -> [B, H, S, D]
    and -> K^T [B, H, D, S], the head split an export writes before its attention."""
    for node, want in ((tq, [0, 2, 1, 3]), (tk, [0, 2, 3, 1]), (tv, [0, 2, 1, 3])):
        if _perm(node) != want:
            return f"{node.name!r} has perm {_perm(node)}, expected {want} (the head split of a [B, S, H, D] tensor)"
    return None


@register_constraint("keys_transpose", "n")
def keys_transpose(g, tk):
    """tk is Transpose(perm 0,1,3,2): K [B, H, S, D] -> K^T [B, H, D, S], where the keys are not the head split's
    (LLaMA's repeat_kv output, for one): the op reads K untransposed instead of this copy."""
    if _perm(tk) != [0, 1, 3, 2]:
        return f"{tk.name!r} has perm {_perm(tk)}, expected [0, 1, 3, 2] (K^T of a [B, H, S, D] tensor)"
    return None


def _is_dim_of(g, entry, t: str, i: int, st) -> bool:
    """A shape entry (``dim_source``) is dim i of t: read from it or from a dim of the same size (by value or
    by name), or a constant equal to its known size."""
    if isinstance(entry, tuple) and entry[1] == i and same_dim(g, entry[0], t, i):
        return True
    return same_size(entry_size(g, entry), st[i])


def _expand_groups(g, t: str, x, st) -> int | str:
    """G when x = Expand([B, Hkv, 1, S, D] view of t) is [B, Hkv, G, S, D]: from x's inferred shape, or from
    its target's entries (TorchScript computes it from t's shape at run time, through Where(Equal(., -1)))."""
    sx = g.shape(x.outputs[0])
    if sx is not None and len(sx) == 5 and all(same_size(a, b) for a, b in zip(sx[:2] + sx[3:], st)):
        return sx[2] if isinstance(sx[2], int) else "unknown"  # unknown: the Reshape's heads say (see below)
    entries = [dim_source(g, x.inputs[1], k) for k in range(5)] if len(x.inputs) > 1 else [None] * 5
    if all(_is_dim_of(g, e, t, i, st) for e, i in zip(entries[:2] + entries[3:], range(4))) and \
            isinstance(entries[2], int) and entries[2] >= 1:
        return entries[2]
    return (f"{x.name!r} (shape {_fmt_shape(sx) if sx is not None else 'unknown'}) is not {t!r} "
            f"{_fmt_shape(st)} with a new axis 2 repeated: its dims around it are not t's")


def _heads_repeated(g, t, u, x, r) -> int | str:
    """G when r = Reshape(x = Expand(u = Unsqueeze(t, axis 2))) repeats each of t's Hkv heads G times
    (t [B, Hkv, S, D] -> [B, Hkv, G, S, D] -> [B, Hkv * G, S, D]), else the reason. Proven from the shapes
    (symbolic dims compare by name) or from the targets' entries: x keeps t's dims around the new axis, and
    r keeps t's B, S and D, so the row-major Reshape merges axes 1 and 2 (its element count fixes the
    heads; a target's entry 1 need not be read) and puts K/V head h // G at head h."""
    st = g.shape(t)
    if st is None or len(st) != 4:
        return f"{t!r} is not of rank 4 with a known shape ({st})"
    axes = reduce_axes(g, u)
    if isinstance(axes, str) or axes not in ([2], [-3]):
        return axes if isinstance(axes, str) else f"{u.name!r} inserts axes {axes}, expected [2]"
    groups = _expand_groups(g, t, x, st)
    if isinstance(groups, str) and groups != "unknown":
        return groups
    sr = g.shape(r.outputs[0])
    target = r.inputs[1] if len(r.inputs) > 1 else None
    for i in (0, 2, 3):
        if not (sr is not None and len(sr) == 4 and same_dim(g, r.outputs[0], t, i)
                or target is not None and _is_dim_of(g, dim_source(g, target, i), t, i, st)):
            return (f"{r.name!r} (shape {_fmt_shape(sr) if sr is not None else 'unknown'}) does not keep dim {i} "
                    f"of {t!r} {_fmt_shape(st)}")
    if groups == "unknown":  # x's new axis unknown: the Reshape's known heads over t's give it
        h, hkv = (sr[1] if sr is not None and len(sr) == 4 else None), st[1]
        if not isinstance(h, int) or not isinstance(hkv, int) or hkv < 1 or h % hkv:
            return f"{r.name!r} has {h} heads, not a known multiple of {t!r}'s {hkv}"
        groups = h // hkv
    return groups


@register_constraint("repeated_kv", "tnnntnnnt")
def repeated_kv(g, k, uk, xk, rk, v, uv, xv, rv, q):
    """K and V [B, Hkv, S, D] each repeated by repeat_kv (Reshape(Expand(Unsqueeze(t, 2)))) to Q's H heads,
    H a multiple of Hkv: the grouped-query attention the op reads with kv_groups = H / Hkv."""
    got = [_heads_repeated(g, t, u, x, r) for t, u, x, r in ((k, uk, xk, rk), (v, uv, xv, rv))]
    for why in got:
        if isinstance(why, str):
            return why
    sk, sv, sq = g.shape(k), g.shape(v), g.shape(q)
    if got[0] != got[1] or not same_dim(g, k, v, 1):
        return f"K's heads {sk[1]} repeated {got[0]} times and V's {sv[1]} {got[1]} times differ"
    if sq is not None and len(sq) == 4 and isinstance(sq[1], int) and isinstance(sk[1], int) and sq[1] != sk[1] * got[0]:
        return f"Q {q!r} has {sq[1]} heads, the repeated K and V {sk[1] * got[0]}"
    return None


@register_builder("kv_groups_of", "tnnn", "attrs")
def kv_groups_of(g, t, u, x, r):
    """{"kv_groups": G} of repeat_kv's Reshape(x = Expand(u = Unsqueeze(t, 2))) repeating t's heads G times
    ({} when G = 1)."""
    groups = _heads_repeated(g, t, u, x, r)
    if isinstance(groups, str):
        raise BuildFailed(groups)
    return {"kv_groups": groups} if groups > 1 else {}


def _swaps_heads(t, what: str) -> str | None:
    if _perm(t) != [0, 2, 1, 3]:
        return f"{t.name!r} has perm {_perm(t)}, expected [0, 2, 1, 3] ({what})"
    return None


@register_constraint("heads_merge_transpose", "n")
def heads_merge_transpose(g, ty):
    """ty is Transpose(perm 0,2,1,3): the attention output [B, H, S, D] -> [B, S, H, D] before the heads merge."""
    return _swaps_heads(ty, "the heads merge of a [B, H, S, D] tensor")


@register_constraint("head_split_transpose", "n")
def head_split_transpose(g, t):
    """t is Transpose(perm 0,2,1,3): a head split [B, S, H, D] -> [B, H, S, D] (before LLaMA's rotary embedding)."""
    return _swaps_heads(t, "the head split of a [B, S, H, D] tensor")


@register_constraint("whole_shape", "n")
def whole_shape(g, node):
    """A Shape node without start / end (opset 15+): the whole shape."""
    for name in ("start", "end"):
        if node.has_attr(name):
            return f"{node.name!r} takes a slice of the shape ({name}={node.attr(name)})"
    return None


@register_builder("perm_indices", "n", "tensor")
def perm_indices(g, node):
    """An int64 initializer holding a Transpose node's perm (its default, reversed axes, from a known rank)."""
    perm = _perm(node)
    if perm is None:
        r = known_rank(g, node.inputs[0])
        if r is None:
            raise BuildFailed(f"{node.name!r} has no perm and the rank of its input is unknown")
        perm = list(range(r))[::-1]
    return NewConstant(np.asarray(perm, dtype=np.int64), f"{node.name}_perm")


@register_constraint("mask_broadcast", "tn")
def mask_broadcast(g, m, mm):
    """m broadcasts onto the scores mm computes ([.., Sq, Skv]) without enlarging them, where shapes are known."""
    if m is None:
        return "the optional input is absent"
    ms, ss = g.shape(m), g.shape(mm.outputs[0])
    if ms is None or ss is None:
        return None  # unknown: the body adds the mask exactly like the Add it replaces
    if len(ms) > len(ss):
        return f"the mask {m!r} has rank {len(ms)} > the rank {len(ss)} of the scores {mm.outputs[0]!r}"
    for a, b in zip(reversed(ms), reversed(ss)):
        if isinstance(a, int) and isinstance(b, int) and a not in (1, b):
            return (f"the mask {m!r} of shape {_fmt_shape(ms)} does not broadcast to the scores "
                    f"{mm.outputs[0]!r} of shape {_fmt_shape(ss)}")
    return None


@register_constraint("bool_tensor", "t")
def bool_tensor(g, t):
    """t has element type bool."""
    from onnx import TensorProto

    if t is None:
        return "the optional input is absent"
    value = g.constant_value(t)
    dtype = (TensorProto.BOOL if value.dtype == np.bool_ else None) if value is not None else g.dtype(t)
    if dtype is None and value is None:
        return f"the element type of {t!r} is unknown"
    if dtype != TensorProto.BOOL:
        return f"{t!r} is not a bool tensor"
    return None


@register_builder("mask_fill", "t", "attrs")
def mask_fill(g, fill):
    """The Attention mask_value for Where(mask, scores, fill): absent for -inf, else fill when <= -1e30.

    Where replaces masked scores by fill; the op adds fill to them. The two agree exactly for -inf
    and, in float32, for fills at or below -1e30 (a score is far below their rounding step).
    """
    value = _scalar(g, fill, "the mask fill")
    if value == -np.inf:
        return {}
    if not (np.isfinite(value) and value <= -1e30):
        raise BuildFailed(f"the mask fill {fill!r} is {value:g}; only -inf or a value <= -1e30 (float32 min) "
                          "masks a score exactly like Where does")
    return {"mask_value": value}


@register_builder("epsilon_attr", "t", "attrs")
def epsilon_attr(g, eps):
    """{"epsilon": value} of a non-negative one-element constant."""
    value = _scalar(g, eps, "epsilon")
    if not (np.isfinite(value) and value >= 0):
        raise BuildFailed(f"epsilon {eps!r} is {value:g}, not a finite value >= 0")
    return {"epsilon": value}


@register_builder("layernorm_attrs", "n", "attrs")
def layernorm_attrs(g, ln):
    """{"epsilon": ...} of a native LayerNormalization over the last axis with only its Y output used."""
    extra = [t for t in ln.outputs[1:] if t]
    if extra:
        raise BuildFailed(f"{ln.name!r} also outputs {', '.join(map(repr, extra))} (mean / inv std dev)")
    axis = int(ln.attr("axis", -1))
    r = known_rank(g, ln.inputs[0])
    if axis != -1 and (r is None or axis != r - 1):
        raise BuildFailed(f"{ln.name!r} normalises from axis {axis}, not only the last axis")
    return {"epsilon": float(ln.attr("epsilon", 1e-5))}


@register_builder("attention_scale", "tt?", "attrs")
def attention_scale(g, s1, s2=None):
    """{"scale": s1 * s2} of one-element constants (s2 absent: s1)."""
    value = _scalar(g, s1, "the scale")
    if s2 is not None:
        value *= _scalar(g, s2, "the scale")
    if not np.isfinite(value):
        raise BuildFailed(f"the attention scale {value:g} is not finite")
    return {"scale": value}


@register_builder("attention_scale_div", "t", "attrs")
def attention_scale_div(g, s):
    """{"scale": 1 / s} of a one-element, non-zero constant divisor."""
    value = _scalar(g, s, "the divisor")
    if value == 0 or not np.isfinite(value):
        raise BuildFailed(f"the score divisor {s!r} is {value:g}")
    return {"scale": 1.0 / value}


@register_builder("heads_of", "t", "attrs")
def heads_of(g, q):
    """{"num_heads": H} when q is [B, H, S, D] with a known H, else {} (unknown)."""
    shape = g.shape(q)
    if shape is not None and len(shape) == 4 and isinstance(shape[1], int) and shape[1] > 0:
        return {"num_heads": int(shape[1])}
    return {}


def _approximate(node) -> str:
    approx = node.attr("approximate", "none")
    return approx.decode() if isinstance(approx, bytes) else str(approx)


@register_builder("gelu_attrs", "n", "attrs")
def gelu_attrs(g, gelu):
    """{"approximate": ...} of an ONNX (opset 20) or graphopt Gelu node."""
    approx = _approximate(gelu)
    if approx not in ("none", "tanh"):
        raise BuildFailed(f"Gelu {gelu.name!r} has approximate={approx!r}")
    return {"approximate": approx}


_GELU_ACTIVATIONS = {"none": "Gelu", "tanh": "GeluTanh", "quick": "QuickGelu"}


@register_builder("gelu_activation", "n", "attrs")
def gelu_activation(g, gelu):
    """GemmAct's / CBR's activation attributes for a Gelu node: Gelu (erf), GeluTanh or QuickGelu
    (a graphopt.Gelu with approximate='quick')."""
    approx = _approximate(gelu)
    if approx == "quick" and gelu.domain != "graphopt" or approx not in _GELU_ACTIVATIONS:
        raise BuildFailed(f"Gelu {gelu.name!r} has approximate={approx!r}")
    return {"activation": _GELU_ACTIVATIONS[approx]}
