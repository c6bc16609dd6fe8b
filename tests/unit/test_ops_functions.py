"""Schemas, validate() reasons, overload keys, attach_functions, and that the checks can fail."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from graphopt.errors import RuleError, UnsupportedModel
from graphopt.ops import ACTIVATIONS, attach_functions, get_schema, schemas
from graphopt.ops.testing import assert_close, one_node_model, run

CBR = get_schema("CBR")
GEMM = get_schema("GemmAct")
ALL4 = [True, True, True, True]


# -- schemas and validate -------------------------------------------------------------------------

def test_schemas_and_unknown_op():
    assert [s.name for s in schemas()] == ["Attention", "CBR", "GatedMLP", "Gelu", "GemmAct", "GroupNorm", "LayerNorm", "RMSNorm", "RoPE"]
    for s in schemas():
        assert (s.domain, s.version) == ("graphopt", 1)
        assert s.inputs[0][1] is False
        assert "lowering" in s.attributes and "lowering_params" in s.attributes
    for s in (CBR, GEMM):
        assert s.inputs[-1][1] is True
        for name in ("activation", "act_alpha", "act_beta", "clip_min", "clip_max"):
            assert name in s.attributes
    assert [n for n, _ in CBR.inputs] == ["X", "W", "B", "R"]
    assert [n for n, _ in GEMM.inputs] == ["A", "B", "C"]
    with pytest.raises(RuleError, match="unknown graphopt op 'Frobnicate'.*Attention, CBR, GatedMLP, Gelu, GemmAct, GroupNorm, LayerNorm, RMSNorm, RoPE"):
        get_schema("Frobnicate")


@pytest.mark.parametrize("schema,attrs,present,reason", [
    (CBR, {"activation": "Swish"}, ALL4, "unknown activation 'Swish'; expected one of: none, Relu"),
    (GEMM, {"activation": "relu"}, [True, True], "unknown activation 'relu'"),
    (CBR, {"bogus": 1}, ALL4, "unknown attribute 'bogus' for CBR"),
    (CBR, {"group": "2"}, ALL4, "group='2' must be an int"),
    (CBR, {"strides": [2, 2.5]}, ALL4, "must be a list of ints"),
    (CBR, {"activation": "Clip", "clip_min": 6.0, "clip_max": 0.0}, ALL4, "clip_min=6.0 is greater than clip_max=0.0"),
    (CBR, {"activation": "Relu", "clip_max": 6.0}, ALL4, "clip_max is only used by activation Clip, not Relu"),
    (CBR, {"activation": "Sigmoid", "act_alpha": 0.1}, ALL4, "act_alpha is only used by activation LeakyRelu or HardSigmoidMul"),
    (CBR, {"auto_pad": "SAME_UPPER", "pads": [1, 1, 1, 1]}, ALL4, "pads cannot be given together with auto_pad=SAME_UPPER"),
    (CBR, {"auto_pad": "SAME"}, ALL4, "auto_pad='SAME' must be one of"),
    (CBR, {"strides": [1, 1], "dilations": [1]}, ALL4, "disagree on the number of spatial dims"),
    (CBR, {"pads": [1, 1, 1]}, ALL4, "even length"),
    (CBR, {"group": 0}, ALL4, "group=0 must be >= 1"),
    (CBR, {}, [True, False], "needs input 1 (W)"),
    (CBR, {}, [True] * 5, "at most 4 inputs"),
    (GEMM, {"mode": "conv"}, [True, True], "mode='conv' must be one of matmul, gemm"),
    (GEMM, {"alpha": 2.0}, [True, True], "alpha only apply to mode 'gemm'"),
    (GEMM, {"mode": "gemm", "transA": 2}, [True, True], "transA=2 must be 0 or 1"),
])
def test_validate_rejects_with_reason(schema, attrs, present, reason):
    got = schema.validate(attrs, present)
    assert got is not None and reason in got, got
    with pytest.raises(RuleError, match="invalid graphopt"):
        schema.overload(attrs, present)


@pytest.mark.parametrize("act", list(ACTIVATIONS))
def test_validate_accepts_every_activation(act):
    assert CBR.validate({"activation": act, "pads": [0, 1, 1, 0], "lowering": "direct"}, [True, True, False, True]) is None
    assert GEMM.validate({"activation": act, "mode": "gemm", "transB": 1}, [True, True]) is None


# -- overload keys --------------------------------------------------------------------------------

def test_overload_keys_encode_only_what_changes_the_body():
    assert CBR.overload({"activation": "Relu"}, ALL4) == "relu_b_r"
    assert CBR.overload({}, [True, True]) == "none"
    assert CBR.overload({"activation": "Clip", "clip_min": 0.0, "clip_max": 6.0}, [True, True, True]) == "clip_lo_hi_b"
    assert CBR.overload({"activation": "Clip", "clip_max": 6.0}, [True, True, False, True]) == "clip_hi_r"
    assert GEMM.overload({"activation": "GeluTanh"}, [True, True, True]) == "matmul_gelutanh_c"
    assert GEMM.overload({"mode": "gemm", "activation": "SiLU", "alpha": 2.0}, [True, True]) == "gemm_silu"
    # Conv attributes, activation parameters and lowering choices are passed by reference: same key.
    a = {"activation": "LeakyRelu", "act_alpha": 0.1, "strides": [2, 2], "lowering": "implicit_gemm"}
    b = {"activation": "LeakyRelu", "group": 4, "lowering_params": "bm=128"}
    assert CBR.overload(a, ALL4) == CBR.overload(b, ALL4) == "leakyrelu_b_r"
    # float16 matters only for bodies with constants, and float32 never shows.
    assert CBR.overload({"activation": "Relu"}, ALL4, dtype=TensorProto.FLOAT16) == "relu_b_r"
    assert CBR.overload({"activation": "Gelu"}, ALL4, dtype=TensorProto.FLOAT16) == "gelu_b_r_f16"
    assert CBR.overload({"activation": "Gelu"}, ALL4, dtype=TensorProto.FLOAT) == "gelu_b_r"
    with pytest.raises(RuleError, match="not INT64"):
        CBR.overload({"activation": "Gelu"}, ALL4, dtype=TensorProto.INT64)


@pytest.mark.parametrize("schema,key", [(CBR, "swish_b"), (CBR, "relu_r_b"), (CBR, "relu_lo"), (CBR, "relu_b_b"),
                                        (CBR, ""), (GEMM, "relu_c"), (GEMM, "conv_relu"), (GEMM, "matmul_relu_b"),
                                        (CBR, "gelu_f16_f64")])
def test_malformed_keys_are_refused(schema, key):
    with pytest.raises(RuleError, match="malformed overload key|mode must be"):
        schema.function(key, 13)


def test_function_protos_declare_every_attribute():
    for schema, key in ((CBR, "clip_lo_hi_b_r"), (GEMM, "gemm_hardsigmoidmul_c")):
        for opset in (9, 11, 13, 17, 20):
            fn = schema.function(key, opset)
            assert (fn.domain, fn.name, fn.overload) == ("graphopt", schema.name, key)
            assert list(fn.attribute) == sorted(schema.attributes)
            assert [(o.domain, o.version) for o in fn.opset_import] == [("", opset)]
            assert fn.SerializeToString() == schema.function(key, opset).SerializeToString()
    with pytest.raises(RuleError, match="opset >= 9"):
        CBR.function("relu", 8)


@pytest.mark.parametrize("opset,ops", [(9, {"Clip"}), (11, {"Selu", "Clip"}), (13, {"Constant", "Clip"}),
                                       (17, {"CastLike", "Clip"})])
def test_clip_body_follows_the_opset(opset, ops):
    body = {n.op_type for n in CBR.function("clip_lo_hi", opset).node}
    assert ops <= body
    assert ("Selu" in body) == (opset == 11)


@pytest.mark.parametrize("opset,native", [(13, False), (14, True)])
def test_hardswish_decomposed_before_14(opset, native):
    ops = [n.op_type for n in CBR.function("hardswish", opset).node]
    assert ("HardSwish" in ops) == native and ("HardSigmoid" in ops) == (not native)


@pytest.mark.parametrize("opset,native", [(17, False), (20, True)])
def test_gelu_native_from_20(opset, native):
    ops = [n.op_type for n in GEMM.function("matmul_gelu", opset).node]
    assert ("Gelu" in ops) == native and ("Erf" in ops) == (not native)


# -- the comparisons can fail ---------------------------------------------------------------------

def _relu_cbr(opset: int = 13):
    rng = np.random.default_rng(2024)
    feeds = {"X": rng.standard_normal((1, 3, 6, 5)).astype(np.float32),
             "W": rng.standard_normal((4, 3, 3, 3)).astype(np.float32)}
    attrs = {"activation": "Relu", "pads": [1, 1, 1, 1]}
    model = one_node_model("CBR", [("X", feeds["X"]), ("W", feeds["W"])], attrs, opset, (1, 4, 6, 5))
    return model, feeds, attrs


def test_reference_catches_a_wrong_activation():
    model, feeds, attrs = _relu_cbr()
    out = run(model, feeds)[0]
    assert_close(out, CBR.reference([feeds["X"], feeds["W"]], attrs)[0])
    wrong = CBR.reference([feeds["X"], feeds["W"]], dict(attrs, activation="LeakyRelu", act_alpha=0.01))[0]
    with pytest.raises(AssertionError):
        assert_close(out, wrong)


def test_reference_catches_a_tampered_body():
    model, feeds, attrs = _relu_cbr()
    (fn,) = model.functions
    relu = next(n for n in fn.node if n.op_type == "Relu")
    relu.op_type = "Sigmoid"
    with pytest.raises(AssertionError):
        assert_close(run(model, feeds)[0], CBR.reference([feeds["X"], feeds["W"]], attrs)[0])


def test_checker_sees_a_wrong_output_shape():
    rng = np.random.default_rng(3)
    x, w = rng.standard_normal((1, 2, 7, 7)).astype(np.float32), rng.standard_normal((3, 2, 3, 3)).astype(np.float32)
    model = one_node_model("CBR", [("X", x), ("W", w)], {"strides": [2, 2]}, 13, (1, 3, 5, 5))
    with pytest.raises(Exception, match="differ"):
        onnx.checker.check_model(model, full_check=True)


# -- attach_functions -----------------------------------------------------------------------------

def _chain_model(opset: int, ir_version: int = 8) -> onnx.ModelProto:
    """Input -> CBR(Clip) -> CBR(SiLU, residual) -> Flatten -> GemmAct(Gelu), nodes out of key order."""
    rng = np.random.default_rng(11)
    inits = [onnx.numpy_helper.from_array(rng.standard_normal(s).astype(np.float32), n) for n, s in
             (("w1", (4, 3, 3, 3)), ("b1", (4,)), ("w2", (4, 1, 3, 3)), ("wg", (4 * 5 * 5, 6)), ("cg", (6,)))]
    nodes = [
        helper.make_node("CBR", ["x", "w1", "b1"], ["c1"], domain="graphopt", name="cbr1", activation="Clip",
                         clip_min=0.0, clip_max=6.0, pads=[1, 1, 1, 1], strides=[2, 2]),
        helper.make_node("CBR", ["c1", "w2", "", "c1"], ["c2"], domain="graphopt", name="cbr2", activation="SiLU",
                         group=4, pads=[1, 1, 1, 1], overload="stale_key"),
        helper.make_node("Flatten", ["c2"], ["f"]),
        helper.make_node("GemmAct", ["f", "wg", "cg"], ["y"], domain="graphopt", name="gemm", mode="gemm",
                         activation="Gelu", alpha=0.5),
    ]
    graph = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 9, 9])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 6])], initializer=inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=ir_version)


def _chain_reference(model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    w = {i.name: onnx.numpy_helper.to_array(i) for i in model.graph.initializer}
    c1 = CBR.reference([x, w["w1"], w["b1"]], dict(activation="Clip", clip_min=0.0, clip_max=6.0,
                                                   pads=[1, 1, 1, 1], strides=[2, 2]))[0]
    c2 = CBR.reference([c1, w["w2"], None, c1], dict(activation="SiLU", group=4, pads=[1, 1, 1, 1]))[0]
    return GEMM.reference([c2.reshape(2, -1), w["wg"], w["cg"]], dict(mode="gemm", activation="Gelu", alpha=0.5))[0]


@pytest.mark.parametrize("opset", [11, 13, 17])
def test_attach_functions_on_a_chain(opset):
    model = attach_functions(_chain_model(opset))
    onnx.checker.check_model(model, full_check=True)
    assert model.ir_version == 10
    assert [(o.domain, o.version) for o in model.opset_import] == [("", opset), ("graphopt", 1)]
    keys = [(f.name, f.overload) for f in model.functions]
    assert keys == sorted(keys) == [("CBR", "clip_lo_hi_b"), ("CBR", "silu_r"), ("GemmAct", "gemm_gelu_c")]
    assert [n.overload for n in model.graph.node] == ["clip_lo_hi_b", "silu_r", "", "gemm_gelu_c"]
    x = np.random.default_rng(opset).standard_normal((2, 3, 9, 9)).astype(np.float32)
    assert_close(run(model, {"x": x})[0], _chain_reference(model, x), 1e-5, f"chain opset {opset}")


def test_attach_functions_is_idempotent_and_deterministic():
    once = attach_functions(_chain_model(13)).SerializeToString()
    model = onnx.ModelProto.FromString(once)
    assert attach_functions(model).SerializeToString() == once
    assert attach_functions(_chain_model(13)).SerializeToString() == once


def test_attach_functions_replaces_stale_and_keeps_foreign_functions():
    model = _chain_model(13)
    stale = CBR.function("relu", 13)
    stale.overload = "silu_r"  # a wrong body under a needed key
    unused = GEMM.function("matmul_relu", 13)
    foreign = helper.make_function("my.domain", "Twice", ["a"], ["b"], [helper.make_node("Add", ["a", "a"], ["b"])],
                                   [helper.make_opsetid("", 13)])
    model.functions.extend([stale, foreign, unused])
    model = attach_functions(model)
    assert [(f.domain, f.name, f.overload) for f in model.functions] == [
        ("my.domain", "Twice", ""), ("graphopt", "CBR", "clip_lo_hi_b"), ("graphopt", "CBR", "silu_r"),
        ("graphopt", "GemmAct", "gemm_gelu_c")]
    assert model.functions[2].SerializeToString() == CBR.function("silu_r", 13).SerializeToString()


def test_attach_functions_finds_nodes_in_subgraphs():
    rng = np.random.default_rng(5)
    w = onnx.numpy_helper.from_array(rng.standard_normal((2, 2, 1)).astype(np.float32), "w")

    def branch(name, act):
        node = helper.make_node("CBR", ["x", "w"], [f"{name}_y"], domain="graphopt", name=f"{name}_cbr", activation=act)
        return helper.make_graph([node], name, [], [helper.make_tensor_value_info(f"{name}_y", TensorProto.FLOAT, [1, 2, 5])])

    iff = helper.make_node("If", ["cond"], ["y"], then_branch=branch("then", "HardSwish"), else_branch=branch("else", "Relu"))
    graph = helper.make_graph([iff], "g", [helper.make_tensor_value_info("cond", TensorProto.BOOL, []),
                                           helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 5])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2, 5])], initializer=[w])
    model = attach_functions(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]))
    onnx.checker.check_model(model, full_check=True)
    assert [f.overload for f in model.functions] == ["hardswish", "relu"]
    x = rng.standard_normal((1, 2, 5)).astype(np.float32)
    wa = onnx.numpy_helper.to_array(w)
    for cond, act in ((True, "HardSwish"), (False, "Relu")):
        got = run(model, {"cond": np.array(cond), "x": x})[0]
        assert_close(got, CBR.reference([x, wa], {"activation": act})[0], 1e-5, act)


def test_attach_functions_types_constants_below_opset_15():
    rng = np.random.default_rng(8)
    b = onnx.numpy_helper.from_array(rng.standard_normal((4, 3)), "b")  # float64 initializer
    node = helper.make_node("GemmAct", ["a", "b"], ["y"], domain="graphopt", name="g", activation="GeluTanh")
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("a", TensorProto.DOUBLE, [2, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.DOUBLE, [2, 3])], initializer=[b])
    model = attach_functions(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]))
    onnx.checker.check_model(model, full_check=True)
    assert model.graph.node[0].overload == "matmul_gelutanh_f64"
    a = rng.standard_normal((2, 4))
    ref = GEMM.reference([a, onnx.numpy_helper.to_array(b)], {"activation": "GeluTanh"})[0]
    assert_close(run(model, {"a": a})[0], ref, 1e-12)


def test_attach_functions_errors_name_the_node():
    model = _chain_model(13)
    model.graph.node[1].attribute.append(helper.make_attribute("activation_typo", "Relu"))
    with pytest.raises(RuleError, match=r"node 'cbr2' \(graphopt.CBR\).*unknown attribute 'activation_typo'"):
        attach_functions(model)
    model = _chain_model(13)
    model.graph.node[0].op_type = "CBRX"
    with pytest.raises(RuleError, match=r"node 'cbr1' \(graphopt.CBRX\).*unknown graphopt op"):
        attach_functions(model)
    model = _chain_model(13)
    del model.opset_import[:]
    with pytest.raises(UnsupportedModel, match="default-domain"):
        attach_functions(model)


def test_attach_functions_without_graphopt_nodes_only_drops_stale_bodies():
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)
    model.functions.append(CBR.function("relu", 13))
    model = attach_functions(model)
    assert len(model.functions) == 0 and model.ir_version == 8
    assert [o.domain for o in model.opset_import] == [""]


def test_int_values_for_float_attributes_are_coerced():
    attrs = {"activation": "Clip", "clip_min": 0, "clip_max": 6, "group": 1, "lowering": None}
    assert CBR.validate(attrs, [True, True]) is None
    assert CBR.normalize(attrs) == {"activation": "Clip", "clip_min": 0.0, "clip_max": 6.0, "group": 1}
    assert isinstance(CBR.normalize(attrs)["clip_min"], float)
    rng = np.random.default_rng(21)
    x = (3 * rng.standard_normal((1, 2, 5, 5))).astype(np.float32)
    w = rng.standard_normal((3, 2, 1, 1)).astype(np.float32)
    for opset in (9, 11, 13, 17):
        model = one_node_model("CBR", [("X", x), ("W", w)], attrs, opset, (1, 3, 5, 5))  # INT attributes on the node
        assert {a.name: a.type for a in model.graph.node[0].attribute}["clip_min"] == onnx.AttributeProto.FLOAT
        onnx.checker.check_model(model, full_check=True)
        assert_close(run(model, {"X": x, "W": w})[0], CBR.reference([x, w], attrs)[0], 1e-5, f"opset {opset}")


def test_attach_functions_refuses_opsets_below_9():
    model = _chain_model(13)
    model.opset_import[0].version = 8
    with pytest.raises(UnsupportedModel, match="opset 8 is below 9"):
        attach_functions(model)
