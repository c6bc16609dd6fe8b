"""graphopt.LayerNorm / RMSNorm / Gelu / Attention: function body (onnxruntime CPU and onnx's reference
evaluator) == float64 NumPy reference on fresh random inputs, for every attribute combination that
changes the body, odd sizes, and the opsets where the body differs (LayerNormalization from 17,
ReduceMean axes as an input from 18, CastLike from 15, Gelu from 20)."""

from __future__ import annotations

import itertools
import math
import zlib

import numpy as np
import onnx
import onnx.inliner
import pytest
from onnx.reference import ReferenceEvaluator

from graphopt.errors import RuleError
from graphopt.ops import get_schema
from graphopt.ops.testing import assert_close, one_node_model, run

LN = get_schema("LayerNorm")
RMS = get_schema("RMSNorm")
GELU = get_schema("Gelu")
ATTN = get_schema("Attention")
OPSETS = [13, 15, 17, 18, 20]


def _rng(*key) -> np.random.Generator:
    return np.random.default_rng(zlib.crc32("/".join(map(str, key)).encode()))


def _check(schema, model, feeds, ordered, attrs, rtol, what, evaluator=True):
    onnx.checker.check_model(model, full_check=True)
    expected = schema.reference([a for _, a in ordered], attrs)
    got = run(model, feeds)
    assert len(got) == len(expected), what
    for g, e in zip(got, expected):
        assert_close(g, e, rtol, f"{what}: onnxruntime vs NumPy reference")
    if evaluator:
        # The evaluator wants every declared function attribute set on the node; inlining the body
        # (attribute references resolved or dropped, as the ONNX spec says) runs the same nodes.
        ref = ReferenceEvaluator(onnx.inliner.inline_local_functions(model)).run(None, feeds)
        for g, e in zip(ref, expected):
            assert_close(np.asarray(g, dtype=e.dtype), e, rtol, f"{what}: onnx reference evaluator vs NumPy reference")


# -- LayerNorm ------------------------------------------------------------------------------------

LN_FLAGS = [(b, skip, sb, s) for b, skip, sb, s in itertools.product([0, 1], repeat=4) if skip or not (sb or s)]
LN_SHAPES = [(2, 5, 7), (3, 1, 33), (1, 2, 3, 9)]


@pytest.mark.parametrize("opset", OPSETS)
@pytest.mark.parametrize("bias,skip,skip_bias,sum_output", LN_FLAGS)
def test_layernorm_body_matches_reference(bias, skip, skip_bias, sum_output, opset):
    shape = LN_SHAPES[(bias + 2 * skip + skip_bias + sum_output + opset) % len(LN_SHAPES)]
    rng = _rng("ln", bias, skip, skip_bias, sum_output, opset)
    d = shape[-1]
    feeds = {"X": (3 * rng.standard_normal(shape) + 1.5).astype(np.float32),
             "scale": rng.standard_normal(d).astype(np.float32)}
    arrays = dict(feeds)
    if bias:
        arrays["bias"] = rng.standard_normal(d).astype(np.float32)
    if skip:
        arrays["skip"] = rng.standard_normal(shape).astype(np.float32)
    if skip_bias:
        arrays["skip_bias"] = rng.standard_normal(d).astype(np.float32)
    feeds = arrays
    ordered = [(n, arrays.get(n)) for n, _ in LN.inputs]
    attrs = {"epsilon": 1e-2 if opset % 2 else 1e-5, "sum_output": sum_output}
    extra = [("S", shape)] if sum_output else []
    model = one_node_model("LayerNorm", ordered, attrs, opset, shape, extra_outputs=extra)
    ops = {n.op_type for n in model.functions[0].node}
    assert ("LayerNormalization" in ops) == (opset >= 17)
    _check(LN, model, feeds, ordered, attrs, 1e-5, f"LayerNorm b={bias} skip={skip} sb={skip_bias} sum={sum_output} opset {opset}")


@pytest.mark.parametrize("opset,dtype", [(13, np.float64), (13, np.float16), (17, np.float16), (18, np.float64)])
def test_layernorm_other_dtypes(opset, dtype):
    rng = _rng("ln_dtype", opset, np.dtype(dtype).name)
    x = rng.standard_normal((2, 3, 16)).astype(dtype)
    scale = rng.standard_normal(16).astype(dtype)
    ordered = [("X", x), ("scale", scale)]
    model = one_node_model("LayerNorm", ordered, {"epsilon": 1e-3}, opset, x.shape)
    rtol = 1e-2 if dtype == np.float16 else 1e-12
    expected = LN.reference([x, scale], {"epsilon": 1e-3})[0]
    assert_close(run(model, {"X": x, "scale": scale})[0], expected, rtol, f"LayerNorm {np.dtype(dtype).name} opset {opset}")


def test_layernorm_reference_against_a_loop():
    rng = _rng("ln_loop")
    x, skip = rng.standard_normal((3, 5)), rng.standard_normal((3, 5))
    scale, bias, sb = rng.standard_normal(5), rng.standard_normal(5), rng.standard_normal(5)
    y, s = LN.reference([x, scale, bias, skip, sb], {"epsilon": 0.1, "sum_output": 1})
    for i in range(3):
        row = [x[i, j] + skip[i, j] + sb[j] for j in range(5)]
        mean = sum(row) / 5
        var = sum((v - mean) ** 2 for v in row) / 5
        for j in range(5):
            assert s[i, j] == pytest.approx(row[j], rel=1e-12)
            assert y[i, j] == pytest.approx((row[j] - mean) / math.sqrt(var + np.float32(0.1)) * scale[j] + bias[j], rel=1e-9)


@pytest.mark.parametrize("attrs,present,reason", [
    ({"axis": 1}, [True, True], "only the last axis"),
    ({"sum_output": 1}, [True, True], "sum_output=1 needs skip"),
    ({}, [True, True, False, False, True], "skip_bias needs skip"),
    ({"epsilon": -1.0}, [True, True], "epsilon=-1.0 must be finite and >= 0"),
    ({"sum_output": 2}, [True, True, False, True], "sum_output=2 must be 0 or 1"),
    ({}, [True], "needs input 1 (scale)"),
])
def test_layernorm_validate_reasons(attrs, present, reason):
    assert reason in LN.validate(attrs, present)


@pytest.mark.parametrize("key", ["sum", "sb_skip", "b_b", "bogus", "skip_f16_f64"])
def test_layernorm_malformed_keys(key):
    with pytest.raises(RuleError, match="LayerNorm"):
        LN.function(key, 17)


def test_layernorm_tampered_body_is_caught():
    rng = _rng("ln_tamper")
    x, scale = rng.standard_normal((2, 9)).astype(np.float32), rng.standard_normal(9).astype(np.float32)
    model = one_node_model("LayerNorm", [("X", x), ("scale", scale)], {}, 13, x.shape)
    sub = next(n for n in model.functions[0].node if n.op_type == "Sub")
    sub.op_type = "Add"
    with pytest.raises(AssertionError):
        assert_close(run(model, {"X": x, "scale": scale})[0], LN.reference([x, scale], {})[0])


# -- RMSNorm --------------------------------------------------------------------------------------

@pytest.mark.parametrize("opset", OPSETS)
@pytest.mark.parametrize("shape", [(2, 5, 7), (1, 31)])
def test_rmsnorm_body_matches_reference(shape, opset):
    rng = _rng("rms", shape, opset)
    feeds = {"X": rng.standard_normal(shape).astype(np.float32), "scale": rng.standard_normal(shape[-1]).astype(np.float32)}
    ordered = [("X", feeds["X"]), ("scale", feeds["scale"])]
    attrs = {"epsilon": 1e-3}
    model = one_node_model("RMSNorm", ordered, attrs, opset, shape)
    _check(RMS, model, feeds, ordered, attrs, 1e-5, f"RMSNorm {shape} opset {opset}")


@pytest.mark.parametrize("opset", OPSETS)
@pytest.mark.parametrize("skip_shape,sum_output", [((2, 5, 7), 0), ((2, 5, 7), 1), ((1, 5, 7), 1)])
def test_skip_rmsnorm_body_matches_reference(skip_shape, sum_output, opset):
    """SkipRMSNorm: S = X + skip (a skip may broadcast over the leading dims) normalised; S output with sum_output=1."""
    rng = _rng("rms_skip", skip_shape, sum_output, opset)
    shape = (2, 5, 7)
    ordered = [("X", rng.standard_normal(shape).astype(np.float32)), ("scale", rng.standard_normal(7).astype(np.float32)),
               ("skip", rng.standard_normal(skip_shape).astype(np.float32))]
    attrs = {"epsilon": 1e-3, "sum_output": sum_output}
    model = one_node_model("RMSNorm", ordered, attrs, opset, shape, extra_outputs=[("S", shape)] if sum_output else ())
    _check(RMS, model, dict(ordered), ordered, attrs, 1e-5, f"SkipRMSNorm {skip_shape} sum {sum_output} opset {opset}")
    x, w, k = (a.astype(np.float64) for _, a in ordered)
    y = RMS.reference([x, w, k], attrs)
    s = x + k
    assert np.allclose(y[0], s / np.sqrt((s * s).mean(-1, keepdims=True) + np.float32(1e-3)) * w, rtol=1e-12)
    assert len(y) == 1 + sum_output and (not sum_output or np.array_equal(y[1], s))


@pytest.mark.parametrize("attrs,present,reason", [
    ({"sum_output": 1}, [True, True], "sum_output=1 needs skip (input 2)"),
    ({"sum_output": 2}, [True, True, True], "sum_output=2 must be 0 or 1"),
    ({"axis": 0}, [True, True, True], "only the last axis"),
])
def test_rmsnorm_validate_reasons(attrs, present, reason):
    assert reason in RMS.validate(attrs, present)


def test_rmsnorm_overload_keys():
    """Plain RMSNorm keeps its key (models written before SkipRMSNorm still carry it); malformed ones are named."""
    assert RMS.overload({}, [True, True], onnx.TensorProto.FLOAT) == "base"
    assert RMS.overload({}, [True, True], onnx.TensorProto.FLOAT16) == "f16"
    assert RMS.overload({"sum_output": 1}, [True, True, True], onnx.TensorProto.FLOAT16) == "skip_sum_f16"
    for key in ("sum", "sum_skip", "b"):
        with pytest.raises(RuleError, match="RMSNorm"):
            RMS.function(key, 17)


def test_rmsnorm_reference_against_a_loop():
    rng = _rng("rms_loop")
    x, w = rng.standard_normal((2, 4)), rng.standard_normal(4)
    y = RMS.reference([x, w], {"epsilon": 0.5})[0]
    for i in range(2):
        rms = math.sqrt(sum(v * v for v in x[i]) / 4 + 0.5)
        assert list(y[i]) == pytest.approx([x[i, j] / rms * w[j] for j in range(4)], rel=1e-12)
    assert "only the last axis" in RMS.validate({"axis": 0}, [True, True])


# -- Gelu -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("opset", [13, 15, 17, 20])
@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu_body_matches_reference(approximate, opset):
    rng = _rng("gelu", approximate, opset)
    x = (3 * rng.standard_normal((3, 7, 5))).astype(np.float32)
    attrs = {"approximate": approximate}
    model = one_node_model("Gelu", [("X", x)], attrs, opset, x.shape)
    assert ("Gelu" in {n.op_type for n in model.functions[0].node}) == (opset >= 20)
    _check(GELU, model, {"X": x}, [("X", x)], attrs, 1e-5, f"Gelu {approximate} opset {opset}")


def test_gelu_reference_values_and_reasons():
    x = np.array([-2.0, -0.5, 0.0, 1.0, 3.0])
    exact = GELU.reference([x], {})[0]
    assert list(exact) == pytest.approx([v * 0.5 * (1 + math.erf(v / math.sqrt(2))) for v in x], rel=1e-12, abs=1e-15)
    tanh = GELU.reference([x], {"approximate": "tanh"})[0]
    assert list(tanh) == pytest.approx(
        [0.5 * v * (1 + math.tanh(math.sqrt(2 / math.pi) * (v + 0.044715 * v ** 3))) for v in x], rel=1e-12, abs=1e-15)
    assert "approximate='fast' must be one of none, tanh" in GELU.validate({"approximate": "fast"}, [True])
    with pytest.raises(RuleError, match="malformed overload key"):
        GELU.function("erf", 17)


# -- Attention ------------------------------------------------------------------------------------

# (mask_kind, mask_value or None, causal, nan_to_zero, k_transposed, scale or None)
ATTN_CASES = [c for c in itertools.product(["none", "additive", "bool"], [None, -8.0], [0, 1], [0, 1], [0, 1], [None, 0.3])
              if c[1] is None or c[0] == "bool"]


def _attn_inputs(rng, kind, kt, b=2, h=3, sq=5, skv=7, d=4, dv=6):
    q = rng.standard_normal((b, h, sq, d)).astype(np.float32)
    k = rng.standard_normal((b, h, d, skv) if kt else (b, h, skv, d)).astype(np.float32)
    v = rng.standard_normal((b, h, skv, dv)).astype(np.float32)
    mask = None
    if kind == "additive":
        mask = rng.standard_normal((b, 1, sq, skv)).astype(np.float32)
    elif kind == "bool":
        mask = rng.random((b, 1, 1, skv)) < 0.7
        mask[0, 0, 0, :] = False  # batch 0 fully masked: NaN rows (or zeros with nan_to_zero)
        mask[1, 0, 0, 0] = True
    return q, k, v, mask


@pytest.mark.parametrize("opset", [13, 15, 18])
@pytest.mark.parametrize("kind,mask_value,causal,nz,kt,scale", ATTN_CASES)
def test_attention_body_matches_reference(kind, mask_value, causal, nz, kt, scale, opset):
    rng = _rng("attn", kind, mask_value, causal, nz, kt, scale, opset)
    q, k, v, mask = _attn_inputs(rng, kind, kt)
    ordered = [("Q", q), ("K", k), ("V", v), ("mask", mask)]
    feeds = {n: a for n, a in ordered if a is not None}
    attrs = {"mask_kind": kind, "mask_value": mask_value, "causal": causal, "nan_to_zero": nz, "k_transposed": kt,
             "scale": scale}
    model = one_node_model("Attention", ordered, {k_: v_ for k_, v_ in attrs.items() if v_ is not None}, opset,
                           (2, 3, 5, 6))
    expected = ATTN.reference([q, k, v, mask], attrs)[0]
    if kind == "bool" and mask_value is None:
        assert np.isnan(expected).any() != bool(nz)  # the fully masked rows
    _check(ATTN, model, feeds, ordered, attrs, 1e-5, f"Attention {attrs} opset {opset}",
           evaluator=opset == 18 and not causal)


def test_attention_reference_against_a_loop():
    rng = _rng("attn_loop")
    q, k, v = rng.standard_normal((1, 1, 3, 2)), rng.standard_normal((1, 1, 4, 2)), rng.standard_normal((1, 1, 4, 3))
    m = rng.standard_normal((1, 1, 3, 4))
    y = ATTN.reference([q, k, v, m], {"mask_kind": "additive", "causal": 1, "scale": 0.5})[0]
    for i in range(3):
        s = [0.5 * sum(q[0, 0, i, t] * k[0, 0, j, t] for t in range(2)) + m[0, 0, i, j] if j <= i else -math.inf
             for j in range(4)]
        e = [math.exp(x - max(s)) for x in s]
        p = [x / sum(e) for x in e]
        assert list(y[0, 0, i]) == pytest.approx([sum(p[j] * v[0, 0, j, c] for j in range(4)) for c in range(3)], rel=1e-12)


def test_attention_default_scale_is_inverse_sqrt_head_dim():
    rng = _rng("attn_scale")
    q, k, v, _ = _attn_inputs(rng, "none", 0, d=9)
    # the attribute is float32: 1/3 rounds, so the two agree to float32 precision only
    assert_close(ATTN.reference([q, k, v], {})[0], ATTN.reference([q, k, v], {"scale": 1 / 3})[0], 1e-6)
    model = one_node_model("Attention", [("Q", q), ("K", k), ("V", v)], {}, 17, (2, 3, 5, 6))
    assert_close(run(model, {"Q": q, "K": k, "V": v})[0], ATTN.reference([q, k, v], {"scale": 1 / 3})[0], 1e-5)


@pytest.mark.parametrize("attrs,present,reason", [
    ({"mask_kind": "additive"}, [True, True, True], "mask input is absent"),
    ({}, [True, True, True, True], "mask input is present"),
    ({"mask_kind": "additive", "mask_value": -1.0}, [True, True, True, True], "mask_value only applies to mask_kind='bool'"),
    ({"mask_kind": "float"}, [True, True, True, True], "mask_kind='float' must be one of"),
    ({"causal": 2}, [True, True, True], "causal=2 must be 0 or 1"),
    ({"scale": math.inf}, [True, True, True], "scale=inf must be finite"),
])
def test_attention_validate_reasons(attrs, present, reason):
    assert reason in ATTN.validate(attrs, present)


def test_attention_needs_opset_13_and_canonical_keys():
    with pytest.raises(RuleError, match="opset >= 13"):
        ATTN.function("base", 12)
    for key in ("add_bool", "mv", "causal_kt", "kt_kt"):
        with pytest.raises(RuleError, match="malformed overload key"):
            ATTN.function(key, 17)
    assert ATTN.overload({"mask_kind": "bool", "mask_value": -1.0, "causal": 1, "k_transposed": 1, "nan_to_zero": 1,
                          "scale": 0.5}, [True] * 4) == "kt_bool_mv_causal_nz_scale"


@pytest.mark.parametrize("opset", [13, 18])
@pytest.mark.parametrize("kind,causal", [("none", 0), ("additive", 1), ("bool", 0)])
def test_attention_qkv_bshd_body_and_reference_equal_the_transposed_op(kind, causal, opset):
    """qkv_bshd=1: Q, K, V as [B, S, H, D] give what the op gives on their [B, H, S, D] transposes;
    Y stays [B, H, Sq, Dv]; the function body agrees with the reference."""
    rng = _rng("attn_bshd", kind, causal, opset)
    q, k, v, mask = _attn_inputs(rng, kind, 0)
    qb, kb, vb = (np.ascontiguousarray(np.swapaxes(t, 1, 2)) for t in (q, k, v))
    attrs = {"mask_kind": kind, "causal": causal, "nan_to_zero": 1, "qkv_bshd": 1}
    plain = {**attrs, "qkv_bshd": 0}
    assert ATTN.overload(attrs, [True, True, True, mask is not None]).endswith("bshd")
    expected = ATTN.reference([q, k, v, mask], plain)[0]
    got = ATTN.reference([qb, kb, vb, mask], attrs)[0]
    assert got.shape == (2, 3, 5, 6) and np.array_equal(got, expected)
    assert ATTN.output_shapes([qb.shape, kb.shape, vb.shape, None if mask is None else mask.shape], attrs) == [(2, 3, 5, 6)]
    ordered = [("Q", qb), ("K", kb), ("V", vb), ("mask", mask)]
    feeds = {n: a for n, a in ordered if a is not None}
    model = one_node_model("Attention", ordered, attrs, opset, (2, 3, 5, 6))
    _check(ATTN, model, feeds, ordered, attrs, 1e-5, f"Attention {attrs} opset {opset}", evaluator=opset == 18 and not causal)


def test_attention_qkv_bshd_reasons():
    assert "k_transposed must be 0" in ATTN.validate({"qkv_bshd": 1, "k_transposed": 1}, [True] * 3)
    assert "qkv_bshd=2 must be 0 or 1" in ATTN.validate({"qkv_bshd": 2}, [True] * 3)
    with pytest.raises(RuleError, match="malformed overload key"):
        ATTN.function("kt_bshd", 17)


@pytest.mark.parametrize("opset", [13, 18])
@pytest.mark.parametrize("kind,causal,ybshd", [("none", 1, 0), ("additive", 0, 1), ("bool", 0, 0)])
def test_attention_qkv_packed_reads_the_thirds_of_one_tensor(kind, causal, ybshd, opset):
    """qkv_packed=1: Q, K, V the thirds of one [B, S, 3, H, D] input (K, V absent) give what the op gives
    on them as separate [B, S, H, D] inputs; body and reference agree."""
    rng = _rng("attn_packed", kind, causal, ybshd, opset)
    q, k, v, mask = _attn_inputs(rng, kind, 0, skv=5, dv=4)
    qb, kb, vb = (np.swapaxes(t, 1, 2) for t in (q, k, v))
    packed = np.ascontiguousarray(np.stack([qb, kb, vb], axis=2))  # [B, S, 3, H, D]
    attrs = {"mask_kind": kind, "causal": causal, "nan_to_zero": 1, "qkv_bshd": 1, "qkv_packed": 1, "y_bshd": ybshd}
    assert ATTN.overload(attrs, [True, False, False, mask is not None]).endswith("pk")
    expected = ATTN.reference([np.ascontiguousarray(t) for t in (qb, kb, vb)] + [mask], {**attrs, "qkv_packed": 0})[0]
    got = ATTN.reference([packed, None, None, mask], attrs)[0]
    out = (2, 5, 3, 4) if ybshd else (2, 3, 5, 4)
    assert got.shape == out and np.array_equal(got, expected)
    assert ATTN.output_shapes([packed.shape, None, None, None if mask is None else mask.shape], attrs) == [out]
    ordered = [("Q", packed), ("K", None), ("V", None), ("mask", mask)]
    feeds = {n: a for n, a in ordered if a is not None}
    model = one_node_model("Attention", ordered, attrs, opset, out)
    _check(ATTN, model, feeds, ordered, attrs, 1e-5, f"Attention {attrs} opset {opset}", evaluator=opset == 18 and not causal)


def test_attention_qkv_packed_reasons():
    assert "qkv_bshd must be 1" in ATTN.validate({"qkv_packed": 1}, [True, False, False])
    assert "leave K and V absent" in ATTN.validate({"qkv_packed": 1, "qkv_bshd": 1}, [True] * 3)
    assert "K and V are required" in ATTN.validate({}, [True, False, False])
    with pytest.raises(RuleError, match="pk comes with bshd"):
        ATTN.function("pk", 17)


@pytest.mark.parametrize("opset", [13, 18])
@pytest.mark.parametrize("qkv", [0, 1])
def test_attention_y_bshd_writes_the_heads_merge_layout(qkv, opset):
    """y_bshd=1: Y is [B, Sq, H, Dv], the op's output with axes 1 and 2 swapped (with or without
    qkv_bshd); body and reference agree."""
    rng = _rng("attn_ybshd", qkv, opset)
    q, k, v, mask = _attn_inputs(rng, "additive", 0)
    ins = [np.ascontiguousarray(np.swapaxes(t, 1, 2)) for t in (q, k, v)] if qkv else [q, k, v]
    attrs = {"mask_kind": "additive", "nan_to_zero": 1, "qkv_bshd": qkv, "y_bshd": 1}
    expected = np.swapaxes(ATTN.reference([q, k, v, mask], {"mask_kind": "additive", "nan_to_zero": 1})[0], 1, 2)
    got = ATTN.reference(ins + [mask], attrs)[0]
    assert got.shape == (2, 5, 3, 6) and np.array_equal(got, expected)
    assert ATTN.output_shapes([t.shape for t in ins] + [mask.shape], attrs) == [(2, 5, 3, 6)]
    ordered = [("Q", ins[0]), ("K", ins[1]), ("V", ins[2]), ("mask", mask)]
    model = one_node_model("Attention", ordered, attrs, opset, (2, 5, 3, 6))
    _check(ATTN, model, dict(ordered), ordered, attrs, 1e-5, f"Attention {attrs} opset {opset}", evaluator=opset == 18)


@pytest.mark.parametrize("opset", [13, 18])
@pytest.mark.parametrize("kind,causal,kt,ybshd,groups", [("none", 1, 0, 0, 3), ("additive", 0, 0, 1, 2),
                                                          ("bool", 0, 1, 0, 6), ("additive", 1, 1, 1, 2)])
def test_attention_kv_groups_read_each_kv_head_for_its_group_of_q_heads(kind, causal, kt, ybshd, groups, opset):
    """kv_groups=g: K and V [B, H / g, ., .] give what the op gives on them with each head repeated g times
    (repeat_kv's Unsqueeze/Expand/Reshape); body and reference agree, Y has Q's heads."""
    rng = _rng("attn_gq", kind, causal, kt, ybshd, groups, opset)
    h = 6
    q, k, v, mask = _attn_inputs(rng, kind, kt, h=h)
    k, v = k[:, :h // groups].copy(), v[:, :h // groups].copy()
    attrs = {"mask_kind": kind, "causal": causal, "nan_to_zero": 1, "k_transposed": kt, "y_bshd": ybshd,
             "kv_groups": groups}
    assert ATTN.validate(attrs, [True, True, True, mask is not None]) is None
    assert ATTN.overload(attrs, [True, True, True, mask is not None]).endswith("gq")
    repeated = [np.repeat(t, groups, axis=1) for t in (k, v)]
    expected = ATTN.reference([q] + repeated + [mask], {**attrs, "kv_groups": 1})[0]
    got = ATTN.reference([q, k, v, mask], attrs)[0]
    out = (2, 5, h, 6) if ybshd else (2, h, 5, 6)
    assert got.shape == out and np.array_equal(got, expected)
    assert ATTN.output_shapes([q.shape, k.shape, v.shape, None if mask is None else mask.shape], attrs) == [out]
    ordered = [("Q", q), ("K", k), ("V", v), ("mask", mask)]
    feeds = {n: a for n, a in ordered if a is not None}
    model = one_node_model("Attention", ordered, attrs, opset, out)
    _check(ATTN, model, feeds, ordered, attrs, 1e-5, f"Attention {attrs} opset {opset}", evaluator=opset == 18 and not causal)


def test_attention_kv_groups_reasons():
    assert "kv_groups=0 must be an integer >= 1" in ATTN.validate({"kv_groups": 0}, [True] * 3)
    assert "qkv_bshd must be 0" in ATTN.validate({"kv_groups": 2, "qkv_bshd": 1}, [True] * 3)
    assert ATTN.overload({"kv_groups": 1}, [True] * 3) == ATTN.overload({}, [True] * 3)  # 1 is the plain op
    with pytest.raises(RuleError, match="malformed overload key"):
        ATTN.function("bshd_gq", 17)
    q, k = np.zeros((1, 4, 2, 8)), np.zeros((1, 3, 2, 8))
    with pytest.raises(RuleError, match="kv_groups=2 needs"):
        ATTN.reference([q, k, k, None], {"kv_groups": 2})


def test_attention_ungrouped_signature_and_operands():
    """ungrouped(): the plain signature a lowering runs after repeating K/V's heads; operands() refuses a
    grouped signature to a lowering that does not read it, and checks the heads where it does."""
    from graphopt.errors import TuningError
    from graphopt.lowering.contract import Signature
    from graphopt.ops.attention import kv_groups, operands, ungrouped

    sig = Signature.make("Attention", [(2, 8, 5, 64), (2, 2, 7, 64), (2, 2, 7, 64)], ["float16"] * 3,
                         {"kv_groups": 4, "causal": 1})
    plain = ungrouped(sig)
    assert kv_groups(sig) == 4 and kv_groups(plain) == 1 and ungrouped(plain) is plain
    assert plain.input_shapes == ((2, 8, 5, 64), (2, 8, 7, 64), (2, 8, 7, 64)) and dict(plain.attrs) == {"causal": 1}
    with pytest.raises(TuningError, match="kv_groups=4 .* is not read by this lowering"):
        operands(sig, "x")
    assert operands(sig, "x", groups_ok=True)[1] == (2, 2, 7, 64)
    bad = Signature.make("Attention", [(2, 8, 5, 64), (2, 4, 7, 64), (2, 4, 7, 64)], ["float16"] * 3, {"kv_groups": 4})
    with pytest.raises(TuningError, match="needs rank-4 Q"):
        operands(bad, "x", groups_ok=True)
