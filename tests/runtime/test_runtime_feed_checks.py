"""A session checks each new set of feed names, dtypes and shapes once: a repeated run skips the
check (its host time counts on the graph-replay path), a feed that differs is checked again and
refused with the usual one-line error."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from graphopt.errors import UsageError
from graphopt.runtime import Session


def _relu_model():
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 4])
    g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g", [x], [y])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def test_a_repeated_feed_is_checked_once_and_a_different_one_again(monkeypatch):
    sess = Session(_relu_model(), device="numpy")
    full = []
    real = sess._check_feeds_fully
    monkeypatch.setattr(sess, "_check_feeds_fully", lambda feeds: (full.append(1), real(feeds)))
    x = np.ones((2, 4), np.float32)
    for _ in range(3):
        np.testing.assert_array_equal(sess.run({"x": x})["y"], x)
    assert full == [1]
    sess.run({"x": np.ones((3, 4), np.float32)})
    assert full == [1, 1]
    with pytest.raises(UsageError, match="input 'x' has dtype float64"):
        sess.run({"x": np.ones((2, 4))})
    with pytest.raises(UsageError, match="input 'x' has shape"):
        sess.run({"x": np.ones((2, 5), np.float32)})
    with pytest.raises(UsageError, match="unknown input"):
        sess.run({"x": x, "z": x})
    onnx.checker.check_model(_relu_model())


def test_fp16_execution_saturates_a_finite_weight_beyond_fp16_range_without_a_warning():
    """The dynamo GPT-2 export's mask constant is finfo(float32).min: cast to fp16 it was -inf, with a NumPy
    overflow warning in the user's console (H200, 805f74b). It saturates to -65504 now; inf and NaN stay."""
    import warnings

    from graphopt.runtime.backend import NumpyBackend

    host = np.array([np.finfo(np.float32).min, 7e4, 1.5, np.inf, -np.inf, np.nan], np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = NumpyBackend("float16").cast_in(host)
    assert out.dtype == np.float16
    np.testing.assert_array_equal(out[:5], np.array([-65504, 65504, 1.5, np.inf, -np.inf], np.float16))
    assert np.isnan(out[5])
    assert NumpyBackend(None).cast_in(host) is host
