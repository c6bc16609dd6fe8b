"""GatherND as one take of X's rows by linear index (the runtime's form since the H100's host-time diagnosis):
onnx's reference evaluator agrees on negative indices, batch_dims 0-2, several index columns, empty indices."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

from graphopt.runtime.onnx_ops.registry import OPS


class _Ctx:
    xp = np

    def __init__(self, batch_dims):
        self.batch_dims = batch_dims

    def attr(self, name, default=None):
        return self.batch_dims if name == "batch_dims" else default


@pytest.mark.parametrize("x_shape,ind_shape,batch_dims", [
    ((2, 3, 4), (5, 2), 0), ((2, 3, 4), (2, 5, 1), 1), ((2, 3, 4, 5), (2, 3, 2), 1), ((2, 3, 4), (2, 2, 2, 3), 0),
    ((2, 3, 4, 5), (2, 3, 6, 1), 2), ((2, 3, 4, 5), (2, 3, 2), 2), ((2, 3), (0, 1), 0)])
def test_gathernd_matches_the_reference_evaluator(x_shape, ind_shape, batch_dims):
    rng = np.random.default_rng(sum(x_shape) + batch_dims)
    x = rng.standard_normal(x_shape).astype(np.float32)
    dims = x_shape[batch_dims:batch_dims + ind_shape[-1]]
    ind = np.stack([rng.integers(-d, d, size=ind_shape[:-1]) for d in dims], -1).astype(np.int64)
    (got,) = OPS["GatherND"](_Ctx(batch_dims), [x, ind])
    node = helper.make_node("GatherND", ["x", "i"], ["y"], batch_dims=batch_dims)
    graph = helper.make_graph([node], "t", [helper.make_tensor_value_info("x", TensorProto.FLOAT, None),
                                            helper.make_tensor_value_info("i", TensorProto.INT64, None)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    wrapped = np.where(ind < 0, ind + np.asarray(dims), ind)  # the evaluator takes no negative indices
    (want,) = ReferenceEvaluator(model).run(None, {"x": x, "i": wrapped})
    assert got.shape == want.shape and np.array_equal(got, want)
