"""The transformer rules (rules/norm.toml, gelu.toml, attention.toml): every pattern variant fires on a
graph built the way exporters write it, near-misses are refused with the reason ``--explain``
shows (an intermediate with another consumer or that is a graph output, a scale or bias that is
not per-feature, a non-constant or non-scalar operand, a reduction or softmax over another axis,
a broadcasting residual or mask), and the rewritten graph computes what the original did under
onnxruntime (CPU) on fresh random inputs."""

from __future__ import annotations

import math

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from graphopt.ir import to_model
from graphopt.ops import attach_functions
from graphopt.rewrite import RuleSet, load_rules
from graphopt.rewrite.testing import Builder, act_nodes, random_feeds, rewrite_inferred, run_ort

SHIPPED = load_rules()
FILES = ("norm.toml", "gelu.toml", "attention.toml")
TRANSFORMER_RULES = sorted(r.name for r in SHIPPED if r.file.endswith(FILES))


KEYS_RULE = "attention_k_untransposed"


def _only(*names: str) -> RuleSet:
    return RuleSet([SHIPPED.get(n) for n in names])


_rewrite = rewrite_inferred  # the model with its inferred shapes, as the optimize pipeline sees it



def _same_outputs(model, rewritten_graph, seed=1):
    out = attach_functions(to_model(rewritten_graph))
    onnx.checker.check_model(out, full_check=True)
    feeds = random_feeds(model, seed)
    fp16 = any(f.dtype == np.float16 for f in feeds.values())
    for e, a in zip(run_ort(model, feeds), run_ort(out, feeds)):
        assert e.shape == a.shape and e.dtype == a.dtype
        np.testing.assert_allclose(a.astype(np.float64), e.astype(np.float64), rtol=3e-2 if fp16 else 1e-4,
                                   atol=3e-2 if fp16 else 1e-5)


def _root(model) -> str:
    return next(n.name for n in model.graph.node if model.graph.output[0].name in n.output)


def _const(b: Builder, value, as_node: bool, hint="c", dtype=np.float32) -> str:
    """A constant as an initializer or as a Constant node's output (both are constants to the rules)."""
    if not as_node:
        return b.const(value, hint, dtype)
    out = b._name(hint)
    b.nodes.append(helper.make_node("Constant", [], [out], name=b._name("Constant"),
                                    value=numpy_helper.from_array(np.asarray(value, dtype=dtype))))
    return out


# -- model builders -------------------------------------------------------------------------------

SHAPE = (2, 5, 7)


def _reduce_mean(b: Builder, t: str, axes, as_node: bool) -> str:
    if b.opset >= 18:
        return b.op("ReduceMean", [t, _const(b, axes, as_node, "axes", np.int64)])
    return b.op("ReduceMean", [t], axes=axes)


def layernorm_model(sq="pow", dv="div", bias=True, opset=13, variant="fires", constant_nodes=False):
    """TorchScript's decomposed LayerNorm, operands of Add/Mul commuted where exporters differ."""
    b = Builder(opset, seed=3)
    x = b.input("x", SHAPE)
    d_ = SHAPE[-1]
    axes = [1] if variant == "axis_not_last" else [-1]
    c = lambda v, hint="c": _const(b, v, constant_nodes, hint)  # noqa: E731
    d = b.op("Sub", [x, _reduce_mean(b, x, axes, constant_nodes)])
    square = b.op("Pow", [d, c(2.0, "two")]) if sq == "pow" else b.op("Mul", [d, d])
    eps = b.input("eps", [1]) if variant == "eps_not_constant" else c(1e-5, "eps")
    std = b.op("Sqrt", [b.op("Add", [eps, _reduce_mean(b, square, axes, constant_nodes)])])
    n = b.op("Div", [d, std]) if dv == "div" else b.op("Mul", [b.op("Reciprocal", [std]), d])
    if variant == "scale_not_per_feature":
        scale = b.rand([SHAPE[1], d_], "scale")
    elif variant == "scale_not_constant":
        scale = b.input("scale", [d_])
    else:
        scale = b.rand([d_], "scale")
    y = b.op("Mul", [scale, n])
    if bias:
        y = b.op("Add", [y, b.rand([d_], "bias")])
    b.output(y)
    if variant == "second_consumer":
        b.output(b.op("Neg", [d]))
    elif variant == "graph_output":
        b.output(std)
    return b.model()


def native_layernorm_model(variant="fires"):
    b = Builder(17, seed=4)
    x = b.input("x", SHAPE)
    scale = b.input("scale", [SHAPE[-1]]) if variant == "scale_not_constant" else b.rand([SHAPE[-1]], "scale")
    attrs = {"epsilon": 1e-3, "axis": 1 if variant == "axis_not_last" else -1}
    out = b._name("ln_out")
    outs = [out, b._name("mean")] if variant == "mean_used" else [out]
    b.nodes.append(helper.make_node("LayerNormalization", [x, scale, b.rand([SHAPE[-1]], "bias")], outs,
                                    name="ln", **attrs))
    b.output(out)
    if variant == "mean_used":
        b.output(b.op("Neg", [outs[1]]))
    return b.model()


def skip_model(variant="single", graphopt_ln=True, rms=False):
    """Add(a, r) -> LayerNorm (graphopt's, or ONNX's when ``graphopt_ln`` is False), or graphopt's
    RMSNorm (``rms``)."""
    b = Builder(17, seed=5)
    a = b.input("a", SHAPE)
    if variant == "broadcast":  # over the leading dims: a position table (fuses; the kernels read it cyclically)
        r = b.input("r", [1] + list(SHAPE[1:]))
    elif variant == "middle":  # over a middle dim: the norm would see another skip row per element
        r = b.input("r", [SHAPE[0], 1, SHAPE[-1]])
    elif variant == "constant":  # a constant position table
        r = b.rand([1] + list(SHAPE[1:]), "r")
    elif variant == "bias":  # a constant per-feature vector: the GEMM's bias, not a residual
        r = b.rand([SHAPE[-1]], "r")
    elif variant == "higher_rank":  # [1, B, S, D]: it is the full-shape operand (the norm's X), a the skip
        r = b.input("r", [1] + list(SHAPE))
    else:
        r = b.input("r", SHAPE)
    s = b.op("Add", [r, a])
    scale, bias = b.rand([SHAPE[-1]], "scale"), b.rand([SHAPE[-1]], "bias")
    if rms:
        y = b.op("RMSNorm", [s, scale], domain="graphopt", epsilon=1e-5)
    elif graphopt_ln:
        y = b.op("LayerNorm", [s, scale, bias], domain="graphopt", epsilon=1e-5)
    else:
        y = b.op("LayerNormalization", [s, scale, bias], epsilon=1e-5, axis=-1)
    b.output(y)
    if variant == "reused":
        b.output(b.op("Add", [s, b.input("z", SHAPE)]))
    elif variant == "sum_output":
        b.output(s)
    return b.model()


def rmsnorm_model(sq="pow", dv="div", variant="fires", fp16=False):
    """``fp16``: an fp16 model whose norm runs in fp32 between two precision Casts (LlamaRMSNorm)."""
    b = Builder(17, seed=6)
    x = b.input("x", SHAPE, TensorProto.FLOAT16 if fp16 else TensorProto.FLOAT)
    if fp16:
        x = b.op("Cast", [x], to=TensorProto.FLOAT)
    axes = [0] if variant == "axis_not_last" else [-1]
    square = b.op("Pow", [x, b.const(2.0, "two")]) if sq == "pow" else b.op("Mul", [x, x])
    rms = b.op("Sqrt", [b.op("Add", [b.op("ReduceMean", [square], axes=axes), b.const(1e-6, "eps")])])
    if dv == "div":
        n = b.op("Div", [x, rms])
    elif dv == "recip":
        n = b.op("Mul", [b.op("Reciprocal", [rms]), x])
    else:
        n = b.op("Mul", [x, b.op("Div", [b.const(1.0, "one"), rms])])
    w = b.rand([SHAPE[1], SHAPE[-1]], "w") if variant == "w_not_per_feature" else b.rand([SHAPE[-1]], "w")
    if fp16:
        n = b.op("Cast", [n], to=TensorProto.FLOAT16)
        w = b.const(b.rng.standard_normal(SHAPE[-1]) * 0.5, "w", np.float16)
    b.output(b.op("Mul", [n, w]))
    if variant == "second_consumer":
        b.output(b.op("Neg", [rms]))
    return b.model()


def groupnorm_model(silu=False, variant="fires"):
    """nn.GroupNorm as torch exports it: Reshape -> InstanceNormalization -> Reshape -> Mul -> Add [-> SiLU]."""
    b = Builder(17, seed=11)
    x = b.input("x", [2, 6, 5, 3])
    r1 = b.op("Reshape", [x, b.const([0, 3, -1], "s1", np.int64)])
    scale = b.const(np.full(3, 2.0 if variant == "in_scale" else 1.0), "ones")
    n = b.op("InstanceNormalization", [r1, scale, b.const(np.zeros(3), "zeros")], epsilon=1e-5)
    r2 = b.op("Reshape", [n, b.const([2, 6, 5, 3], "s2", np.int64)])
    w = b.rand([6, 1, 1] if variant != "w_not_per_channel" else [1, 1, 3], "w")
    y = b.op("Add", [b.op("Mul", [r2, w]), b.rand([6, 1, 1], "b")])
    if silu:
        y = b.op("Mul", [y, b.op("Sigmoid", [y])])
    b.output(y)
    if variant == "second_consumer":
        b.output(b.op("Neg", [r2]))
    return b.model()


def groupnorm_op_model():
    b = Builder(17, seed=12)
    x = b.input("x", [2, 6, 5, 3])
    y = b.op("GroupNorm", [x, b.rand([6, 1, 1], "w"), b.rand([6, 1, 1], "b")], domain="graphopt", num_groups=3,
             epsilon=1e-5, activation="none")
    b.output(b.op("Mul", [y, b.op("Sigmoid", [y])]))
    return b.model()


GELU_FORMS = ["erf_a_div", "erf_a_mul", "erf_b_div", "erf_b_mul", "erf_c_div", "erf_c_mul", "tanh_pow", "tanh_cube"]


def gelu_model(form: str, variant="fires"):
    """GELU on a tensor that no MatMul produces (so the GemmAct epilogue rules do not apply)."""
    opset = 20 if form in ("gelu", "gelu_tanh") else 17
    b = Builder(opset, seed=7)
    x = b.op("Relu", [b.input("x", SHAPE)]) if variant == "fires" else b.input("x", SHAPE)
    x = b.op("Neg", [x])
    y = act_nodes(b, form if form.startswith(("gelu", "quick")) else f"gelu_{form}", x)
    b.output(y)
    model = b.model()
    if variant == "wrong_constant":
        init = next(i for i in model.graph.initializer if i.name.startswith("half"))
        init.CopyFrom(numpy_helper.from_array(np.asarray(0.6, dtype=np.float32), init.name))
    elif variant == "second_consumer":
        inner = next(n for n in model.graph.node if n.op_type in ("Erf", "Tanh"))
        model.graph.output.append(helper.make_tensor_value_info(inner.output[0], TensorProto.FLOAT, list(SHAPE)))
    return model


def conv_gelu_model(family="conv", approximate="none", variant="fires"):
    """Conv [-> Add(per-channel c)] or graphopt.CBR(activation none) -> graphopt.Gelu (Whisper's conv front end)."""
    b = Builder(17, seed=10)
    x = b.input("x", [2, 3, 11])  # 1-D: Conv1d
    w, bias = b.rand([4, 3, 3]), b.rand([4], "b")
    if family == "cbr":
        y = b.op("CBR", [x, w, bias], domain="graphopt", pads=[1, 1], activation="none")
    else:
        y = b.op("Conv", [x, w, bias], pads=[1, 1])
    if family == "conv_add":
        c = b.rand([1, 1, 11], "c") if variant == "not_per_channel" else b.rand([1, 4, 1], "c")
        y = b.op("Add", [y, c])
    b.output(b.op("Gelu", [y], domain="graphopt", approximate=approximate))
    if variant == "second_consumer":
        b.output(b.op("Neg", [y]))
    return b.model()


def gemmact_gelu_model(reshape: bool, approximate="tanh", activation="none"):
    b = Builder(17, seed=8)
    a = b.input("a", [6, 4])
    y = b.op("GemmAct", [a, b.rand([4, 9]), b.rand([9], "c")], domain="graphopt", mode="gemm", activation=activation)
    if reshape:
        y = b.op("Reshape", [y, b.const([2, 3, 9], "shape", np.int64)])
    b.output(b.op("Gelu", [y], domain="graphopt", approximate=approximate))
    return b.model()


B, H, SQ, SKV, D, DV = 2, 3, 5, 6, 4, 7
SCALES = ["noscale", "mul", "div", "qk", "q"]
MASKS = ["nomask", "mask", "mask2", "window", "where"]
PROBS = ["softmax", "nan", "cast", "cast2"]


def attention_model(scale="mul", mask="mask", probs="nan", variant="fires", opset=17):
    """softmax(q k^T * scale + mask) v as the exports write it: K^T by a Transpose, mask as a runtime tensor.

    ``probs='upcast'``: an fp16 model whose softmax runs in fp32 between two precision Casts;
    ``mask='upmask'``: fp16 scores cast to fp32 before an fp32 mask is added (then Softmax, Cast back).
    """
    fp16 = probs == "upcast" or mask == "upmask"
    elem, np_t = (TensorProto.FLOAT16, np.float16) if fp16 else (TensorProto.FLOAT, np.float32)
    b = Builder(opset, seed=9)
    if fp16:  # constants in fp16 too
        b.const = lambda value, hint="c", dtype=np_t, _c=b.const: _c(value, hint, np_t if dtype == np.float32 else dtype)
    q = b.input("q", [B, H, SQ, D], elem)
    kt = b.op("Transpose", [b.input("k", [B, H, SKV, D], elem)], perm=[0, 1, 3, 2])
    v = b.rand([B, H, SKV, DV], "v") if variant == "v_constant" else b.input("v", [B, H, SKV, DV], elem)
    s1 = b.rand([1, H, 1, 1], "s") if variant == "scale_not_scalar" else None
    if scale == "noscale":
        s = b.op("MatMul", [q, kt])
    elif scale == "mul":
        s = b.op("Mul", [s1 or b.const(0.5, "s"), b.op("MatMul", [q, kt])])
    elif scale == "div":
        s = b.op("Div", [b.op("MatMul", [q, kt]), s1 or b.const(2.0, "s")])
    elif scale == "qk":
        r = math.sqrt(0.5)
        s = b.op("MatMul", [b.op("Mul", [q, s1 or b.const(r, "s")]), b.op("Mul", [b.const(r, "s"), kt])])
    else:
        s = b.op("MatMul", [b.op("Mul", [q, s1 or b.const(0.5, "s")]), kt])
    scores = s
    if mask == "where":  # GPT-2's eager causal mask: a constant lower-triangular bool tensor
        tril = np.tril(np.ones((SQ, SKV), dtype=bool))[None, None]
        fill = {"fill_small": -1e4, "fill_min": float(np.finfo(np.float32).min)}.get(variant, -math.inf)
        s = b.op("Where", [b.const(tril, "tril", np.bool_), s, b.const(fill, "fill")])
    if mask == "mask":
        shape = [1, B, H, SQ, SKV] if variant == "mask_enlarges" else [B, 1, 1, SKV]
        s = b.op("Add", [b.input("m", shape, elem), s])
    if mask == "mask2":  # T5 (dynamo): scores + position bias, then + mask
        s = b.op("Add", [b.op("Add", [s, b.input("pb", [1, H, SQ, SKV], elem)]), b.input("m", [B, 1, 1, SKV], elem)])
    if mask == "window":  # Swin: + relative bias, view as [B/nW, nW, H, Sq, Skv], + shift mask, view back
        s = b.op("Add", [s, b.input("rb", [1, H, SQ, SKV], elem)])
        s = b.op("Reshape", [s, b.const([1, B, H, SQ, SKV], "win", np.int64)])
        if variant == "window_view_read":
            b.output(b.op("Neg", [s]))
        s = b.op("Add", [s, b.input("m", [1, B, 1, SQ, SKV], elem)])
        s = b.op("Reshape", [s, b.const([B, H, SQ, SKV],
                                        "back", np.int64)])
    if mask == "upmask":
        s = b.op("Add", [b.input("m", [B, 1, 1, SKV]), b.op("Cast", [s], to=TensorProto.FLOAT)])
    elif probs == "upcast":
        s = b.op("Cast", [s], to=TensorProto.FLOAT)
    sm = b.op("Softmax", [s], axis=2 if variant == "softmax_axis" else -1)
    if probs == "nan":
        p = b.op("Where", [b.op("IsNaN", [sm]), b.const(0.0, "zero"), sm])
    elif probs == "cast":
        p = b.op("Cast", [sm], to=TensorProto.FLOAT)
    elif probs == "cast2":
        first = TensorProto.FLOAT16 if variant == "cast_converts" else TensorProto.FLOAT
        p = b.op("Cast", [b.op("Cast", [sm], to=first)], to=TensorProto.FLOAT)
    elif probs == "upcast":
        p = b.op("Cast", [sm], to=TensorProto.FLOAT16)
    else:
        p = sm
    b.output(b.op("MatMul", [p, v]))
    if variant == "second_consumer":
        b.output(b.op("Neg", [scores]))
    elif variant == "graph_output":
        b.output(sm)
    return b.model()


def head_split_model(variant="fires"):
    """graphopt.Attention (k_transposed=1) over the head split's Transposes of [B, S, H, D] q, k, v, as the
    attention rules leave GPT-2 / BERT exports (``variant``: a near-miss)."""
    b = Builder(17, seed=13)
    e = TensorProto.FLOAT if variant == "fp32" else TensorProto.FLOAT16
    q = b.op("Transpose", [b.input("q", [B, SQ, H, D], e)], perm=[0, 2, 1, 3])
    if variant == "k_perm":  # K^T by a last-two-axes swap of an already [B, H, S, D] K
        kt = b.op("Transpose", [b.input("k", [B, H, SKV, D], e)], perm=[0, 1, 3, 2])
    else:
        kt = b.op("Transpose", [b.input("k", [B, SKV, H, D], e)], perm=[0, 2, 3, 1])
    v = b.op("Transpose", [b.input("v", [B, SKV, H, DV], e)], perm=[0, 2, 1, 3])
    y = b.op("Attention", [q, kt, v, b.input("m", [B, 1, 1, SKV], e)], domain="graphopt", k_transposed=1,
             mask_kind="additive", scale=0.5, nan_to_zero=1)
    b.output(b.op("Neg", [y]))
    if variant == "second_consumer":
        b.output(b.op("Neg", [q]))
    return b.model()


def keys_transpose_model(variant="fires"):
    """graphopt.Attention (k_transposed=1) whose K^T is a Transpose(perm 0,1,3,2) of [B, H, S, D] keys that are
    not a head split (LLaMA's after RoPE and repeat_kv), as the attention rules leave it (``variant``: a near-miss)."""
    b = Builder(17, seed=16)
    e = TensorProto.FLOAT16
    if variant == "perm":  # the head split's K^T (attention_qkv_bshd's form), not a swap of the last two axes
        kt = b.op("Transpose", [b.input("k", [B, SKV, H, D], e)], perm=[0, 2, 3, 1])
    else:
        kt = b.op("Transpose", [b.input("k", [B, H, SKV, D], e)], perm=[0, 1, 3, 2])
    y = b.op("Attention", [b.input("q", [B, H, SQ, D], e), kt, b.input("v", [B, H, SKV, DV], e),
                           b.input("m", [B, 1, 1, SKV], e)], domain="graphopt", k_transposed=1, mask_kind="additive",
             scale=0.5, causal=1)
    b.output(b.op("Neg", [y]))
    if variant == "second_consumer":
        b.output(b.op("Neg", [kt]))
    return b.model()


def grouped_kv_model(variant="fires"):
    """graphopt.Attention over repeat_kv's Reshape(Expand(Unsqueeze(t, 2))) of K and V with 2 heads for Q's 6
    (LLaMA's grouped-query attention after the attention rules; ``variant``: a near-miss)."""
    b = Builder(17, seed=17)
    e = TensorProto.FLOAT16
    hq, hkv = 6, 2

    def repeat(t, heads, axis=2):
        lead = [1 if variant == "batch_broadcast" and t == "k" else B]
        src = b.input(t, lead + [heads, SKV, D if t == "k" else DV], e)
        u = b.op("Unsqueeze", [src, b.const([axis], f"ax{t}", np.int64)])
        rep = hq // heads
        target = [B, rep, heads] if axis == 1 else [B, heads, rep]
        if variant == "runtime_shape":  # TorchScript's form: the target computed from t's shape at run time
            shape = b.op("Concat", [b.op("Shape", [src], start=0, end=2), b.const([rep], f"rep{t}", np.int64),
                                    b.op("Shape", [src], start=2)], axis=0)
        else:
            shape = b.const(target + [SKV, D if t == "k" else DV], f"ex{t}", np.int64)
        x = b.op("Expand", [u, shape])
        return x, b.op("Reshape", [x, b.const([B, hq, SKV, D if t == "k" else DV], f"rs{t}", np.int64)])

    xk, rk = repeat("k", hkv, 1 if variant == "axis" else 2)
    _, rv = repeat("v", 1 if variant == "groups_differ" else hkv)
    y = b.op("Attention", [b.input("q", [B, hq, SQ, D], e), rk, rv, b.input("m", [B, 1, 1, SKV], e)], domain="graphopt",
             mask_kind="additive", scale=0.5, causal=1)
    b.output(b.op("Neg", [y]))
    if variant == "second_consumer":
        b.output(b.op("Neg", [xk]))
    if variant == "graph_output":
        b.output(rk)
    return b.model()


def heads_merge_model(variant="fires"):
    """graphopt.Attention followed by the heads merge's Transpose and Reshape (``variant``: a near-miss)."""
    b = Builder(17, seed=15)
    e = TensorProto.FLOAT if variant == "fp32" else TensorProto.FLOAT16
    y = b.op("Attention", [b.input("q", [B, H, SQ, D], e), b.input("k", [B, H, SKV, D], e), b.input("v", [B, H, SKV, DV], e)],
             domain="graphopt", scale=0.5)
    t = b.op("Transpose", [y], perm=[0, 2, 3, 1] if variant == "perm" else [0, 2, 1, 3])
    b.output(b.op("Reshape", [t, b.const([B, -1], "merged", np.int64)]))
    return b.model()


def shape_of_transpose_model(variant="fires"):
    """Shape of a transposed tensor that something else reads too (a dynamic export's head split)."""
    b = Builder(17, seed=14)
    t = b.op("Transpose", [b.input("x", [2, 3, 4, 5])], **({} if variant == "no_perm" else {"perm": [0, 2, 1, 3]}))
    b.output(b.op("Neg", [t]))
    b.output(b.op("Shape", [t], **({"start": 1} if variant == "slice" else {})))
    return b.model()


# -- which test model each rule fires on ------------------------------------------------------------

CASES: dict = {}
for _sq in ("pow", "mul"):
    for _dv in ("div", "recip"):
        CASES[f"layernorm_{_sq}_{_dv}"] = lambda sq=_sq, dv=_dv: layernorm_model(sq, dv, True)
        CASES[f"layernorm_nobias_{_sq}_{_dv}"] = lambda sq=_sq, dv=_dv: layernorm_model(sq, dv, False)
    for _dv in ("div", "recip", "divone"):
        CASES[f"rmsnorm_{_sq}_{_dv}"] = lambda sq=_sq, dv=_dv: rmsnorm_model(sq, dv)
        CASES[f"rmsnorm_cast_{_sq}_{_dv}"] = lambda sq=_sq, dv=_dv: rmsnorm_model(sq, dv, fp16=True)
CASES["layernorm_native"] = native_layernorm_model
CASES["groupnorm"] = groupnorm_model
CASES["groupnorm_silu"] = groupnorm_op_model
CASES["skip_layernorm"] = lambda: skip_model("single")
CASES["skip_layernorm_sum"] = lambda: skip_model("reused")
CASES["skip_rmsnorm"] = lambda: skip_model("single", rms=True)
CASES["skip_rmsnorm_sum"] = lambda: skip_model("reused", rms=True)
for _f in GELU_FORMS:
    CASES[f"gelu_{_f}"] = lambda f=_f: gelu_model(f)
CASES["gelu_native"] = lambda: gelu_model("gelu_tanh")
CASES["gemmact_gelu_op"] = lambda: gemmact_gelu_model(False)
CASES["gelu_quick"] = lambda: gelu_model("quickgelu")
CASES["conv_gelu_op"] = lambda: conv_gelu_model("conv")
CASES["conv_add_gelu_op"] = lambda: conv_gelu_model("conv_add", "tanh")
CASES["cbr_gelu_op"] = lambda: conv_gelu_model("cbr", "quick")
CASES["gemmact_reshape_gelu_op"] = lambda: gemmact_gelu_model(True)
for _sc in SCALES:
    for _mk in MASKS:
        for _pr in PROBS:
            CASES[f"attention_{_sc}_{_mk}_{_pr}"] = lambda sc=_sc, mk=_mk, pr=_pr: attention_model(sc, mk, pr)
        CASES[f"attention_{_sc}_{_mk}_upcast"] = lambda sc=_sc, mk=_mk: attention_model(sc, mk, "upcast")
    CASES[f"attention_{_sc}_upmask"] = lambda sc=_sc: attention_model(sc, "upmask", "upcast")
CASES["attention_qkv_bshd"] = head_split_model
CASES["shape_of_transpose"] = shape_of_transpose_model
CASES["attention_y_bshd"] = heads_merge_model
CASES["attention_k_untransposed"] = keys_transpose_model
CASES["attention_grouped_kv"] = grouped_kv_model


def test_every_transformer_rule_has_a_test_case():
    packed = {"attention_qkv_packed_gemms", "attention_qkv_packed_split", "shape_of_head_split",
              "shape_of_projection", "shape_of_split",  # their cases: test_rules_packed_qkv.py
              "attention_causal_mask"}  # test_rules_causal_mask.py
    assert sorted(CASES) == sorted(set(TRANSFORMER_RULES) - packed)


@pytest.mark.parametrize("name", sorted(CASES))
def test_rule_fires_alone_and_with_every_rule(name):
    model = CASES[name]()
    g, report = _rewrite(model, _only(name))
    assert report.counts == {name: 1}
    (match,) = report.matches
    new = g.node(match.node)
    assert new.doc_string.startswith(f"graphopt rule={name} from=")
    assert g.outputs == [o.name for o in model.graph.output]
    _same_outputs(model, g)
    g_all, report_all = _rewrite(model, SHIPPED)
    assert report_all.counts.get(name) == 1, report_all.counts
    # the test models write K^T as a Transpose of [B, H, S, D] keys, as exports do: with every rule, the
    # attention rules' op then also takes that Transpose in (attention_k_untransposed)
    follow = [KEYS_RULE] if name.startswith("attention_") and name != KEYS_RULE and report_all.counts.get(KEYS_RULE) == 1 else []
    expected = _rewrite(model, _only(name, *follow))[0] if follow else g
    assert [n.op_type for n in g_all.nodes()] == [n.op_type for n in expected.nodes()]
    _same_outputs(model, g_all, seed=2)


# -- what each fused node says -------------------------------------------------------------------

@pytest.mark.parametrize("opset", [13, 17, 18])
@pytest.mark.parametrize("constant_nodes", [False, True])
def test_layernorm_decomposed_at_every_opset_and_constant_form(opset, constant_nodes):
    model = layernorm_model("pow", "div", True, opset, constant_nodes=constant_nodes)
    g, report = _rewrite(model, SHIPPED)
    assert report.counts == {"layernorm_pow_div": 1}
    (node,) = [n for n in g.nodes() if n.op_type != "Constant"]  # Constant nodes go in the cleanup passes
    assert (node.domain, node.op_type) == ("graphopt", "LayerNorm")
    assert node.attr("epsilon") == pytest.approx(1e-5)
    _same_outputs(model, g)


@pytest.mark.parametrize("norm", ["layernorm", "rmsnorm"])
@pytest.mark.parametrize("variant", ["broadcast", "constant"])
def test_position_table_skip_fuses(norm, variant):
    """A skip that broadcasts over the leading dims ([1, S, D] added to [B, S, D]: CLIP's and Whisper's position
    tables, a constant once folded) goes into the norm, which takes the full-shape operand as X."""
    model = skip_model(variant, rms=norm == "rmsnorm")
    g, report = _rewrite(model, SHIPPED)
    assert report.counts == {f"skip_{norm}": 1}, report.counts
    node = next(n for n in g.nodes() if n.op_type in ("LayerNorm", "RMSNorm"))
    assert node.inputs[0] == "a" and g.shape(node.outputs[0]) == tuple(SHAPE)
    _same_outputs(model, g)


def test_position_table_on_an_unproven_dim_stays_an_add():
    """The norm input's middle dim is a fresh ``unk__`` name (onnx's inference could not size a Concat): it might
    be a 1 that the Add broadcasts to the table's 5, so the rule cannot take the Add."""
    b = Builder(17, seed=5)
    a = b.input("a", [SHAPE[0], "unk__3", SHAPE[-1]])
    s = b.op("Add", [b.input("r", [1] + list(SHAPE[1:])), a])
    b.output(b.op("LayerNorm", [s, b.rand([SHAPE[-1]], "scale")], domain="graphopt", epsilon=1e-5))
    g, report = _rewrite(b.model(), _only("skip_layernorm"), explain=True)
    assert report.counts == {}
    assert [nm.rule for nm in report.near_misses] == ["skip_layernorm"]  # (the reason is the last operand order's)
    from graphopt.rewrite.transformer import residual_like

    assert "'a' of shape [2,unk__3,7] is not proven to have 'r''s dims [5,7]" in residual_like(g, "r", "a")


def test_a_higher_rank_operand_is_the_norms_input_not_its_skip():
    """Add(a [B, S, D], r [1, B, S, D]) has r's shape: r is the norm's X and a the skip, never the other way."""
    from graphopt.rewrite.transformer import residual_like

    model = skip_model("higher_rank")
    g, report = _rewrite(model, SHIPPED)
    assert report.counts == {"skip_layernorm": 1}
    node = next(n for n in g.nodes() if n.op_type == "LayerNorm")
    assert node.inputs[0] == "r" and node.inputs[3] == "a"
    assert "'r' has rank 4 > the rank 3 of 'a'" in residual_like(g, "r", "a")
    _same_outputs(model, g)


@pytest.mark.parametrize("norm", ["layernorm", "rmsnorm"])
def test_skip_norm_keeps_the_sum_when_it_is_read_again(norm):
    for variant, rule in (("reused", f"skip_{norm}_sum"), ("sum_output", f"skip_{norm}_sum"),
                          ("single", f"skip_{norm}")):
        model = skip_model(variant, rms=norm == "rmsnorm")
        g, report = _rewrite(model, SHIPPED, explain=True)
        assert report.counts == {rule: 1}, (variant, report.counts)
        ln = next(n for n in g.nodes() if n.op_type in ("LayerNorm", "RMSNorm"))
        s = model.graph.node[0].output[0]  # the Add's output keeps its name, now produced by the norm
        assert (ln.outputs == [model.graph.output[0].name, s]) == rule.endswith("_sum")
        assert ln.attr("sum_output", 0) == (1 if rule.endswith("_sum") else 0)
        assert ln.attr("epsilon") == pytest.approx(1e-5)  # the norm's own attributes are kept
        assert [n.op_type for n in g.nodes() if n.op_type == "Add"] == (["Add"] if variant == "reused" else [])
        _same_outputs(model, g)


def test_native_layernorm_then_skip():
    model = skip_model("reused", graphopt_ln=False)
    g, report = _rewrite(model, SHIPPED)
    assert report.counts == {"layernorm_native": 1, "skip_layernorm_sum": 1}
    _same_outputs(model, g)


def test_attention_attributes():
    g, _ = _rewrite(attention_model("qk", "mask", "nan"), SHIPPED)
    node = next(n for n in g.nodes() if n.op_type == "Attention")
    assert node.attr("scale") == pytest.approx(0.5)
    # k_transposed=0: the K^T Transpose went into the op too (attention_k_untransposed)
    assert (node.attr("mask_kind"), node.attr("nan_to_zero"), node.attr("k_transposed"), node.attr("num_heads")) == (
        "additive", 1, 0, H)
    g, _ = _rewrite(attention_model("div", "nomask", "softmax"), SHIPPED)
    node = next(n for n in g.nodes() if n.op_type == "Attention")
    assert node.attr("scale") == pytest.approx(0.5) and node.attr("mask_kind") == "none" and len(node.inputs) == 3


@pytest.mark.parametrize("variant,mask_value", [("fires", None), ("fill_min", float(np.finfo(np.float32).min))])
def test_attention_where_mask_is_a_bool_mask(variant, mask_value):
    """GPT-2's eager Where on a lower-triangular constant: a bool mask, which (being constant and causal) then
    becomes causal=1 with no mask (attention_causal_mask)."""
    model = attention_model("q", "where", "softmax", variant)
    without_causal = RuleSet([r for r in SHIPPED if r.name != "attention_causal_mask"])
    g, report = _rewrite(model, without_causal)
    assert report.counts == {"attention_q_where_softmax": 1, KEYS_RULE: 1}
    node = next(n for n in g.nodes() if n.op_type == "Attention")
    assert node.attr("mask_kind") == "bool" and node.attr("mask_value") == mask_value
    _same_outputs(model, g)
    g, report = _rewrite(model, SHIPPED)
    assert report.counts == {"attention_q_where_softmax": 1, KEYS_RULE: 1, "attention_causal_mask": 1}
    node = next(n for n in g.nodes() if n.op_type == "Attention")
    assert (node.attr("mask_kind"), node.attr("causal"), node.attr("mask_value"), len(node.inputs)) == ("none", 1, None, 3)
    _same_outputs(model, g)


def test_gelu_after_matmul_bias_goes_into_gemmact():
    b = Builder(17, seed=10)
    mm = b.op("MatMul", [b.input("a", [2, 3, 6]), b.rand([6, 5])])
    b.output(act_nodes(b, "gelu_erf_b_mul", b.op("Add", [b.rand([5], "c"), mm])))
    model = b.model()
    g, report = _rewrite(model, SHIPPED)
    (node,) = g.nodes()
    assert (node.op_type, node.attr("activation")) == ("GemmAct", "Gelu")
    _same_outputs(model, g)


# -- near-misses --------------------------------------------------------------------------------

NEAR_MISSES = [
    # (rule, model, reason fragment)
    ("layernorm_pow_div", lambda: layernorm_model(variant="second_consumer"), "has 3 consumers"),
    ("layernorm_pow_div", lambda: layernorm_model(variant="graph_output"), "is a graph output"),
    ("layernorm_pow_div", lambda: layernorm_model(variant="scale_not_per_feature"), "not one value per element of the last axis"),
    ("layernorm_pow_div", lambda: layernorm_model(variant="scale_not_constant"), "is not a constant"),
    ("layernorm_pow_div", lambda: layernorm_model(variant="axis_not_last"), "reduces axes [1], not only the last axis"),
    ("layernorm_pow_div", lambda: layernorm_model(opset=18, variant="axis_not_last"), "reduces axes [1], not only the last axis"),
    ("layernorm_pow_div", lambda: layernorm_model(variant="eps_not_constant"), "epsilon 'eps' is not a constant"),
    ("layernorm_native", lambda: native_layernorm_model("axis_not_last"), "normalises from axis 1"),
    ("layernorm_native", lambda: native_layernorm_model("mean_used"), "(mean / inv std dev)"),
    ("layernorm_native", lambda: native_layernorm_model("scale_not_constant"), "is not a constant"),
    ("skip_layernorm", lambda: skip_model("reused"), "has 2 consumers"),
    # (either operand order is tried, so the reason is the last order's)
    ("skip_layernorm", lambda: skip_model("middle"), "over its leading dims only; the Add broadcasts otherwise"),
    ("skip_layernorm_sum", lambda: skip_model("middle"), "over its leading dims only"),
    ("skip_layernorm_sum", lambda: skip_model("bias"), "is a constant"),
    ("skip_rmsnorm", lambda: skip_model("reused", rms=True), "has 2 consumers"),
    ("skip_rmsnorm", lambda: skip_model("middle", rms=True), "over its leading dims only"),
    ("skip_rmsnorm_sum", lambda: skip_model("bias", rms=True), "is a constant"),
    ("rmsnorm_pow_div", lambda: rmsnorm_model(variant="w_not_per_feature"), "not one value per element of the last axis"),
    ("rmsnorm_pow_div", lambda: rmsnorm_model(variant="axis_not_last"), "reduces axes [0]"),
    ("rmsnorm_pow_div", lambda: rmsnorm_model(variant="second_consumer"), "has 2 consumers"),
    ("gelu_erf_a_div", lambda: gelu_model("erf_a_div", "wrong_constant"), "is 0.6, expected 0.5"),
    ("gelu_tanh_pow", lambda: gelu_model("tanh_pow", "wrong_constant"), "is 0.6, expected 0.5"),
    ("gelu_erf_c_mul", lambda: gelu_model("erf_c_mul", "second_consumer"), "is a graph output"),
    ("gemmact_gelu_op", lambda: gemmact_gelu_model(False, activation="Relu"), "has activation='Relu', expected 'none'"),
    ("attention_mul_mask_nan", lambda: attention_model(variant="scale_not_scalar"), "has shape [1,3,1,1], not a scalar"),
    ("attention_mul_mask_nan", lambda: attention_model(variant="mask_enlarges"), "has rank 5 > the rank 4 of the scores"),
    ("attention_mul_mask_nan", lambda: attention_model(variant="softmax_axis"), "has axis=2, not the last axis"),
    ("attention_mul_mask_nan", lambda: attention_model(variant="v_constant"), "is a constant (a weight)"),
    ("attention_mul_mask_nan", lambda: attention_model(variant="second_consumer"), "has 2 consumers"),
    ("attention_mul_mask_nan", lambda: attention_model(variant="graph_output"), "is a graph output"),
    ("attention_mul_mask_nan", lambda: attention_model(opset=12), "opset 12 < 13"),
    ("attention_mul_where_nan", lambda: attention_model(mask="where", variant="fill_small"), "is -10000; only -inf"),
    ("attention_mul_mask_cast2", lambda: attention_model(probs="cast2", variant="cast_converts"), "converts element type 1 to 10"),
    ("attention_mul_window_nan", lambda: attention_model(mask="window", variant="window_view_read"), "has 2 consumers"),
    ("attention_mul_mask_upcast", lambda: attention_model(probs="upcast", variant="second_consumer"), "has 2 consumers"),
    ("rmsnorm_cast_pow_div", lambda: rmsnorm_model(fp16=True, variant="second_consumer"), "has 2 consumers"),
    ("attention_qkv_bshd", lambda: head_split_model("k_perm"), "has perm [0, 1, 3, 2], expected [0, 2, 3, 1]"),
    ("attention_qkv_bshd", lambda: head_split_model("second_consumer"), "has 2 consumers"),
    ("shape_of_transpose", lambda: shape_of_transpose_model("slice"), "takes a slice of the shape (start=1)"),
    ("attention_y_bshd", lambda: heads_merge_model("perm"), "has perm [0, 2, 3, 1], expected [0, 2, 1, 3]"),
    ("attention_k_untransposed", lambda: keys_transpose_model("perm"), "has perm [0, 2, 3, 1], expected [0, 1, 3, 2]"),
    ("attention_k_untransposed", lambda: keys_transpose_model("second_consumer"), "has 2 consumers"),
    ("groupnorm", lambda: groupnorm_model(variant="in_scale"), "is not 3 1s"),
    # the heads tiled (head h reads h % Hkv), not repeated: Unsqueeze at axis 1
    ("attention_grouped_kv", lambda: grouped_kv_model("axis"), "inserts axes [1], expected [2]"),
    ("attention_grouped_kv", lambda: grouped_kv_model("batch_broadcast"), "is not 'k' [1,2,6,4] with a new axis 2 repeated"),
    ("attention_grouped_kv", lambda: grouped_kv_model("groups_differ"), "K's heads 2 repeated 3 times and V's 1 6 times differ"),
    ("attention_grouped_kv", lambda: grouped_kv_model("second_consumer"), "has 2 consumers"),
    ("attention_grouped_kv", lambda: grouped_kv_model("graph_output"), "is a graph output"),
    ("attention_grouped_kv", lambda: _torchscript_repeat_kv_model("tiled"), "inserts axes [1], expected [2]"),
]


@pytest.mark.parametrize("rule,build,reason", NEAR_MISSES, ids=[f"{r}-{i}" for i, (r, _, _) in enumerate(NEAR_MISSES)])
def test_near_miss_is_refused_with_its_reason(rule, build, reason):
    model = build()
    g, report = _rewrite(model, _only(rule), explain=True)
    assert report.counts == {}
    assert len(g) == len(model.graph.node)
    reasons = [nm.reason for nm in report.near_misses if nm.rule == rule]
    assert any(reason in r for r in reasons), reasons
    # Whatever the full rule set does instead, the outputs stay the same.
    g_all, report_all = _rewrite(model, SHIPPED)
    assert rule not in report_all.counts
    _same_outputs(model, g_all)


def test_optimize_explain_reports_the_near_miss():
    import graphopt

    model = attention_model(variant="softmax_axis")
    optimized, report = graphopt.optimize(model, gpu="none", explain=True, verify=True)
    assert "Attention" not in report.custom_ops
    reasons = [nm["reason"] for nm in report.near_misses if nm["rule"].startswith("attention_mul_mask_nan")]
    assert any("softmax_last_axis(sm): Softmax" in r and "has axis=2, not the last axis" in r for r in reasons), reasons


def test_the_keys_transpose_goes_into_the_attention():
    """attention_k_untransposed: the Transpose goes, the op reads K [B, H, S, D] (k_transposed=0) and keeps its
    other attributes."""
    g, report = _rewrite(keys_transpose_model(), _only("attention_k_untransposed"))
    (att,) = [n for n in g.nodes() if n.op_type == "Attention"]
    assert [n.op_type for n in g.nodes()] == ["Attention", "Neg"] and att.inputs[1] == "k"
    assert att.attr("k_transposed") == 0 and att.attr("causal") == 1 and att.attr("scale") == 0.5
    assert att.attr("mask_kind") == "additive"


def test_repeat_kv_goes_into_the_attention():
    """attention_grouped_kv: the Unsqueeze/Expand/Reshape of K and V go, the op reads their 2 heads for Q's 6
    (kv_groups=3) and keeps its other attributes."""
    g, report = _rewrite(grouped_kv_model(), _only("attention_grouped_kv"))
    (att,) = [n for n in g.nodes() if n.op_type == "Attention"]
    assert [n.op_type for n in g.nodes()] == ["Attention", "Neg"] and att.inputs[1:3] == ["k", "v"]
    assert att.attr("kv_groups") == 3 and att.attr("causal") == 1 and att.attr("scale") == 0.5


def test_repeat_kv_with_its_target_computed_at_run_time_goes_too():
    """TorchScript computes repeat_kv's Expand target from K's shape: the inferred shapes still keep K's
    dims around the new axis, and the Reshape's heads give its size."""
    model = grouped_kv_model("runtime_shape")
    g, report = _rewrite(model, _only("attention_grouped_kv"))
    assert report.counts == {"attention_grouped_kv": 1}
    (att,) = [n for n in g.nodes() if n.op_type == "Attention"]
    assert att.attr("kv_groups") == 3 and att.inputs[1:3] == ["k", "v"]
    _same_outputs(model, g)


def test_head_split_transposes_go_into_the_attention():
    """attention_qkv_bshd: the three Transposes go, the op reads [B, S, H, D] (qkv_bshd=1, K untransposed),
    keeps its other attributes; Y is still [B, H, Sq, Dv] (attention_y_bshd is the output's rule)."""
    g, report = _rewrite(head_split_model(), _only("attention_qkv_bshd"))
    (match,) = report.matches
    node = g.node(match.node)
    assert (node.attr("qkv_bshd"), node.attr("k_transposed"), node.attr("scale"), node.attr("nan_to_zero")) == (1, 0, 0.5, 1)
    assert node.inputs[:3] == ["q", "k", "v"]
    assert [n.op_type for n in g.nodes()] == ["Attention", "Neg"]


def test_the_layout_rules_take_fp32_too():
    """Every Attention family reads [B, S, H, D] in fp32 as well (cublas_softmax through pointer-array
    batched GEMMs), so fp32 models lose their head Transposes like half-precision ones."""
    for model, rule, attr in ((head_split_model("fp32"), "attention_qkv_bshd", "qkv_bshd"),
                              (heads_merge_model("fp32"), "attention_y_bshd", "y_bshd")):
        g, report = _rewrite(model, _only(rule))
        assert report.counts == {rule: 1}
        (match,) = report.matches
        assert g.node(match.node).attr(attr) == 1
        assert "Transpose" not in [n.op_type for n in g.nodes()]
        _same_outputs(model, g)


def test_shape_of_a_transpose_is_the_permuted_shape_and_the_transpose_stays():
    for variant, perm in (("fires", [0, 2, 1, 3]), ("no_perm", [3, 2, 1, 0])):
        model = shape_of_transpose_model(variant)
        g, report = _rewrite(model, _only("shape_of_transpose"))
        assert report.counts == {"shape_of_transpose": 1}
        ops = sorted(n.op_type for n in g.nodes())
        assert ops == ["Gather", "Neg", "Shape", "Transpose"]
        gather = next(n for n in g.nodes() if n.op_type == "Gather")
        assert g.constant_value(gather.inputs[1]).tolist() == perm
        _same_outputs(model, g)


def test_the_heads_merge_transpose_goes_into_the_attention():
    g, report = _rewrite(heads_merge_model(), _only("attention_y_bshd"))
    (match,) = report.matches
    node = g.node(match.node)
    assert (node.attr("y_bshd"), node.attr("scale")) == (1, 0.5)
    assert [n.op_type for n in g.nodes()] == ["Attention", "Reshape"]


def _torchscript_repeat_kv_model(variant="fires"):
    """repeat_kv as TorchScript writes it with dynamic dims: the Expand's target is Where(Equal(T, -1), 1, T)
    of T = Concat(dims of k, [3], ...), the Reshape's Concat(dims of k, dim 1 of k * 3, ...) (``variant``
    "tiled": the 3 copies before K's heads, each head h reading h % 2: a near-miss)."""
    b = Builder(17, seed=18)
    e = TensorProto.FLOAT16
    i64 = np.int64
    outs = []
    for t, d in (("k", D), ("v", DV)):
        src = b.input(t, ["b", 2, "s", d], e)
        shape = b.op("Shape", [src])
        dims = [b.op("Unsqueeze", [b.op("Gather", [shape, b.const(i, f"i{t}{i}", i64)], axis=0), b.const([0], f"a{t}{i}", i64)])
                for i in range(4)]
        lead = [b.const([3], f"g{t}", i64), dims[1]] if variant == "tiled" else [dims[1], b.const([3], f"g{t}", i64)]
        target = b.op("Concat", [dims[0], *lead, dims[2], dims[3]], axis=0)
        where = b.op("Where", [b.op("Equal", [target, b.const([-1] * 5, f"m{t}", i64)]), b.const([1] * 5, f"o{t}", i64), target])
        x = b.op("Expand", [b.op("Unsqueeze", [src, b.const([1 if variant == "tiled" else 2], f"u{t}", i64)]), where])
        heads = b.op("Unsqueeze", [b.op("Mul", [b.op("Gather", [shape, b.const(1, f"h{t}", i64)], axis=0), b.const(3, f"x{t}", i64)]),
                                   b.const([0], f"z{t}", i64)])
        outs.append(b.op("Reshape", [x, b.op("Concat", [dims[0], heads, dims[2], dims[3]], axis=0)]))
    y = b.op("Attention", [b.input("q", ["b", 6, "sq", D], e), outs[0], outs[1]], domain="graphopt", scale=0.5)
    b.output(b.op("Neg", [y]))
    return b.model()


def test_repeat_kv_with_targets_computed_from_dynamic_shapes_goes():
    """The TorchScript form with symbolic batch and lengths: the targets' entries prove the repeat (kv_groups=3),
    and onnxruntime gives the same outputs at real sizes."""
    model = _torchscript_repeat_kv_model()
    g, report = _rewrite(model, _only("attention_grouped_kv"))
    assert report.counts == {"attention_grouped_kv": 1}
    (att,) = [n for n in g.nodes() if n.op_type == "Attention"]
    assert att.attr("kv_groups") == 3 and att.inputs[1:3] == ["k", "v"]
    rng = np.random.default_rng(7)
    feeds = {"q": rng.standard_normal((2, 6, 5, D)).astype(np.float16),
             "k": rng.standard_normal((2, 2, 9, D)).astype(np.float16),
             "v": rng.standard_normal((2, 2, 9, DV)).astype(np.float16)}
    out = attach_functions(to_model(g))
    for e_, a_ in zip(run_ort(model, feeds), run_ort(out, feeds)):
        np.testing.assert_allclose(a_.astype(np.float64), e_.astype(np.float64), rtol=3e-2, atol=3e-2)
