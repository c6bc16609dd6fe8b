"""graphopt.GroupNorm: nn.GroupNorm as both exporters write it (Reshape -> InstanceNormalization ->
Reshape -> channel affine), with the SiLU after it folded in; near-misses refused with the reason;
the reference, the function body (onnxruntime) and the xp form agree."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, str(Path(__file__).parent))
from _coverage_util import misses, optimize, ops, run, same_outputs  # noqa: E402
from test_rules_transformer import groupnorm_model  # noqa: E402

from graphopt.ops import attach_functions, get_schema  # noqa: E402

F = TensorProto.FLOAT


@pytest.mark.parametrize("silu", [False, True])
def test_groupnorm_fuses(silu):
    m = groupnorm_model(silu)
    ir, report = optimize(m)
    assert ops(ir) == ["graphopt.GroupNorm"], report.counts
    node = ir.nodes()[0]
    assert node.attr("num_groups") == 3 and node.attr("epsilon") == pytest.approx(1e-5)
    assert node.attr("activation", "none") == ("SiLU" if silu else "none")
    same_outputs(m, ir)


@pytest.mark.parametrize("variant,reason", [("in_scale", "is not 3 1s"), ("w_not_per_channel", "not per channel"),
                                            ("second_consumer", "consumers")])
def test_near_misses_are_refused_with_the_reason(variant, reason):
    m = groupnorm_model(variant=variant)
    ir, report = optimize(m, explain=True)
    assert "graphopt.GroupNorm" not in ops(ir)
    assert any(reason in r for r in misses(report, "groupnorm")), [str(x) for x in report.near_misses]
    same_outputs(m, ir)


def _operands(rng, dtype, shape=(3, 12, 5, 7)):
    x = (rng.standard_normal(shape) * 3 + 1).astype(dtype)
    c, rank = shape[1], len(shape)
    w = (rng.standard_normal((c,) + (1,) * (rank - 2))).astype(dtype)
    b = (rng.standard_normal((c,) + (1,) * (rank - 2))).astype(dtype)
    return [x, w, b]


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("shape", [(3, 12, 5, 7), (2, 6, 9)])
@pytest.mark.parametrize("act", ["none", "SiLU"])
def test_xp_impl_matches_the_float64_reference(shape, act, dtype):
    schema = get_schema("GroupNorm")
    ins = _operands(np.random.default_rng(9), dtype, shape)
    attrs = {"num_groups": 3, "epsilon": 1e-5, "activation": act}
    (ref,) = schema.reference(ins, attrs)
    (got,) = schema.xp_impl(np, ins, attrs, np.matmul)
    assert got.dtype == dtype and got.shape == shape
    tol = 2e-2 if dtype == np.float16 else 1e-4
    np.testing.assert_allclose(got.astype(np.float64), ref.astype(np.float64), rtol=tol, atol=tol)


def test_reference_refuses_groups_that_do_not_divide_the_channels():
    with pytest.raises(Exception, match="do not split"):
        get_schema("GroupNorm").reference(_operands(np.random.default_rng(0), np.float32), {"num_groups": 5})


@pytest.mark.parametrize("opset", [13, 17, 18])
@pytest.mark.parametrize("act", ["none", "SiLU"])
def test_function_body_matches_the_reference_under_onnxruntime(act, opset):
    x, w, b = _operands(np.random.default_rng(10), np.float32)
    node = helper.make_node("GroupNorm", ["x", "w", "b"], ["y"], domain="graphopt", num_groups=4, epsilon=1e-5,
                            activation=act)
    graph = helper.make_graph([node], "t", [helper.make_tensor_value_info("x", F, list(x.shape))],
                              [helper.make_tensor_value_info("y", F, list(x.shape))],
                              [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")])
    m = attach_functions(helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset),
                                                                 helper.make_opsetid("graphopt", 1)], ir_version=10))
    onnx.checker.check_model(m)
    (y,) = run(m, {"x": x})
    (ref,) = get_schema("GroupNorm").reference([x, w, b], {"num_groups": 4, "epsilon": 1e-5, "activation": act})
    np.testing.assert_allclose(y, ref, rtol=1e-4, atol=1e-4)
