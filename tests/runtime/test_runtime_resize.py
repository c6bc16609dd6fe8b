"""Resize (opsets 10-19) and Upsample on the runtime, against onnxruntime and ONNX's reference
evaluator on fresh random inputs: every mode, coordinate transformation and nearest rounding,
scales and sizes, enlarging and shrinking by non-integer factors, odd sizes, exclude_outside,
antialias, tf_crop_and_resize with its extrapolation, axes and keep_aspect_ratio_policy, integer
inputs. The numpy device runs the same code the GPU runs with CuPy."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from graphopt.errors import UsageError
from graphopt.runtime import Session

from tests.conftest import run_ort


def _model(x_shape, opset, attrs, roi=None, scales=None, sizes=None, dtype=TensorProto.FLOAT, op="Resize"):
    inits, inputs = [], ["x"]
    if op == "Upsample" or opset < 11:
        inits.append(numpy_helper.from_array(np.asarray(scales, np.float32), "scales"))
        inputs.append("scales")
    else:
        for name, value, dt in (("roi", roi, np.float32), ("scales", scales, np.float32), ("sizes", sizes, np.int64)):
            if value is None:
                inputs.append("")
            else:
                inits.append(numpy_helper.from_array(np.asarray(value, dt), name))
                inputs.append(name)
        while inputs[-1] == "":
            inputs.pop()
    node = helper.make_node(op, inputs, ["y"], **attrs)
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", dtype, list(x_shape))],
                          [helper.make_tensor_value_info("y", dtype, None)], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


def _ours(model, x):
    return Session(model, device="numpy").run({"x": x})["y"]


def _check(model, x, ort=True, reference=True, tol=1e-5):
    got = _ours(model, x)
    if reference:
        (want,) = ReferenceEvaluator(model).run(None, {"x": x})
        assert got.shape == want.shape and got.dtype == want.dtype
        np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=tol, atol=tol)
    if ort:
        (want,) = run_ort(model, {"x": x})
        assert got.shape == want.shape
        np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=tol, atol=tol * 10)


TRANSFORMS = ["half_pixel", "half_pixel_symmetric", "pytorch_half_pixel", "align_corners", "asymmetric"]
FACTORS = [(2.0, 1.5), (0.5, 0.6), (1.7, 0.45), (1.0, 3.0)]


@pytest.mark.parametrize("mode", ["nearest", "linear", "cubic"])
@pytest.mark.parametrize("transform", TRANSFORMS)
def test_scales_every_mode_and_transform(rng, mode, transform):
    x = rng.standard_normal((2, 3, 7, 9)).astype(np.float32)
    for fh, fw in FACTORS:
        model = _model(x.shape, 19, dict(mode=mode, coordinate_transformation_mode=transform),
                       scales=[1.0, 1.0, fh, fw])
        # onnxruntime's CPU lacks half_pixel_symmetric; for align_corners the reference divides by
        # scale * length - 1 where onnxruntime (and the runtime) take the integer output length
        _check(model, x, ort=transform != "half_pixel_symmetric", reference=transform != "align_corners")


@pytest.mark.parametrize("nearest", ["round_prefer_floor", "round_prefer_ceil", "floor", "ceil"])
def test_sizes_and_nearest_rounding(rng, nearest):
    x = rng.standard_normal((1, 2, 5, 8)).astype(np.float32)
    for size in ([1, 2, 11, 3], [1, 2, 2, 13], [1, 2, 5, 8], [1, 2, 1, 1]):
        for transform in ("half_pixel", "asymmetric", "align_corners"):
            model = _model(x.shape, 19, dict(mode="nearest", nearest_mode=nearest,
                                             coordinate_transformation_mode=transform), sizes=size)
            _check(model, x)


@pytest.mark.parametrize("mode, a, exclude", [("cubic", -0.5, 1), ("cubic", -0.75, 1), ("linear", None, 1),
                                              ("cubic", -0.5, 0)])
def test_cubic_coefficient_and_exclude_outside(rng, mode, a, exclude):
    x = rng.standard_normal((1, 1, 6, 5)).astype(np.float32)
    attrs = dict(mode=mode, exclude_outside=exclude)
    if a is not None:
        attrs["cubic_coeff_a"] = a
    for scales in ([1, 1, 2.5, 0.8], [1, 1, 0.5, 1.6]):
        # onnxruntime refuses exclude_outside for linear without antialias; the reference takes it
        _check(_model(x.shape, 19, attrs, scales=scales), x, ort=mode == "cubic")


@pytest.mark.parametrize("mode", ["linear", "cubic"])
def test_antialias_when_shrinking(rng, mode):
    x = rng.standard_normal((1, 2, 16, 13)).astype(np.float32)
    for scales in ([1, 1, 0.5, 0.3], [1, 1, 0.8, 1.5]):
        _check(_model(x.shape, 18, dict(mode=mode, antialias=1), scales=scales), x)


@pytest.mark.parametrize("mode", ["nearest", "linear"])
def test_tf_crop_and_resize_with_extrapolation(rng, mode):
    x = rng.standard_normal((1, 1, 6, 7)).astype(np.float32)
    roi = [0, 0, -0.2, 0.3, 1, 1, 0.9, 1.4]
    model = _model(x.shape, 19, dict(mode=mode, coordinate_transformation_mode="tf_crop_and_resize",
                                     extrapolation_value=7.5), roi=roi, sizes=[1, 1, 5, 9])
    # a source coordinate of exactly 4.5 here: the reference's rounding noise takes the other
    # neighbour in nearest mode, so nearest is held to onnxruntime only
    _check(model, x, reference=mode != "nearest")
    assert (_ours(model, x) == 7.5).any()


def test_axes_and_keep_aspect_ratio(rng):
    x = rng.standard_normal((2, 5, 9, 3)).astype(np.float32)  # an NHWC-style tensor resized on axes 1, 2
    for policy in ("stretch", "not_larger", "not_smaller"):
        model = _model(x.shape, 18, dict(mode="linear", axes=[1, 2], keep_aspect_ratio_policy=policy), sizes=[7, 4])
        _check(model, x, ort=False)
    _check(_model(x.shape, 18, dict(mode="nearest", axes=[2]), scales=[2.0]), x, ort=False)
    negative = _ours(_model(x.shape, 18, dict(mode="nearest", axes=[-2]), scales=[2.0]), x)  # the reference refuses -2
    np.testing.assert_array_equal(negative, _ours(_model(x.shape, 18, dict(mode="nearest", axes=[2]), scales=[2.0]), x))


def test_integer_inputs_round_and_saturate(rng):
    x = rng.integers(0, 256, (1, 3, 5, 6), dtype=np.uint8)
    model = _model(x.shape, 19, dict(mode="cubic"), scales=[1, 1, 1.9, 2.3], dtype=TensorProto.UINT8)
    _check(model, x, ort=False, tol=1.0)  # a rounding tie may land one step apart
    got = _ours(model, x)
    assert got.dtype == np.uint8


@pytest.mark.parametrize("opset, op", [(10, "Resize"), (9, "Upsample")])
def test_opset_10_resize_and_upsample_match_onnxruntime(rng, opset, op):
    x = rng.standard_normal((1, 2, 5, 7)).astype(np.float32)
    for mode, scales in itertools.product(("nearest", "linear"), ([1, 1, 2, 3], [1, 1, 1.5, 2.5], [1, 1, 0.5, 0.75])):
        if op == "Upsample" and min(scales) < 1:
            continue  # Upsample only enlarges
        model = _model(x.shape, opset, dict(mode=mode), scales=scales, op=op)
        _check(model, x, reference=False)


def test_fp16_accumulates_in_fp32(rng):
    x = rng.standard_normal((1, 2, 9, 9)).astype(np.float16)
    model = _model(x.shape, 19, dict(mode="cubic"), scales=[1, 1, 1.4, 0.7], dtype=TensorProto.FLOAT16)
    got = _ours(model, x)
    (want,) = ReferenceEvaluator(model).run(None, {"x": x})
    assert got.dtype == np.float16
    np.testing.assert_allclose(got.astype(np.float32), want.astype(np.float32), atol=4e-3, rtol=4e-3)


def test_bad_attributes_are_one_line_usage_errors(rng):
    x = rng.standard_normal((1, 1, 4, 4)).astype(np.float32)
    model = _model(x.shape, 19, dict(mode="linear"), scales=[1, 1, 2, 2], sizes=[1, 1, 8, 8])
    with pytest.raises(UsageError, match="exactly one of scales and sizes"):
        _ours(model, x)
    model = _model(x.shape, 19, dict(mode="nearest", coordinate_transformation_mode="sideways"), scales=[1, 1, 2, 2])
    with pytest.raises(UsageError, match="sideways"):
        _ours(model, x)


def test_an_nhwc_input_is_resized_in_nhwc(rng):
    """Inside an NHWC region the input is NHWC-strided: the output keeps that layout (no conversion
    before the next NHWC lowering) and the values of the C-ordered input."""
    from graphopt.lowering.layout import is_layout, to_layout
    from graphopt.runtime.onnx_ops.registry import OPS, OpContext

    x = rng.standard_normal((2, 5, 7, 6)).astype(np.float32)
    model = _model(x.shape, 19, dict(mode="linear"), scales=[1, 1, 1.5, 0.5])
    want = _ours(model, x)
    node = type("N", (), {"op_type": "Resize", "name": "r",
                          "attr": lambda self, k, d=None: {"mode": "linear"}.get(k, d)})()
    ctx = OpContext(np, node, 19, {2: np.asarray([1, 1, 1.5, 0.5], np.float32)})
    (got,) = OPS["Resize"](ctx, [to_layout(x, "NHWC", np), None, None])
    assert is_layout(got, "NHWC") and not got.flags.c_contiguous
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("name", ["unet_upsample_torchscript_op17.onnx", "unet_upsample_dynamo_op18.onnx"])
def test_torch_upsampling_exports_run_optimized_and_not(rng, name):
    """Real exports of F.interpolate (nearest by a scale; bilinear to a size read from a Shape chain),
    made by models/export_resize.py: the runtime runs the export and its optimized form (convolutions
    fused around the Resize nodes) like onnxruntime runs the export, at a batch other than traced."""
    from pathlib import Path

    import onnx

    import graphopt

    path = Path(__file__).resolve().parents[2] / "models" / "resize" / name
    x = rng.standard_normal((3, 3, 32, 32)).astype(np.float32)
    (want,) = run_ort(onnx.load(str(path)), {"x": x})
    optimized, _ = graphopt.optimize(str(path), gpu="none")
    assert sum(n.op_type == "Resize" for n in optimized.graph.node) == 2
    assert any(n.domain == "graphopt" for n in optimized.graph.node)
    for model in (str(path), optimized):
        got = Session(model, device="numpy").run({"x": x})["y"]
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_the_taps_are_planned_once_per_step(rng, monkeypatch):
    """A compiled step plans its taps (and puts them on the device) once: later runs, and a CUDA-graph
    capture, only gather and multiply."""
    from graphopt.runtime.onnx_ops import resize

    calls = []
    real = resize.plan
    monkeypatch.setattr(resize, "plan", lambda ctx, shape: (calls.append(shape), real(ctx, shape))[1])
    x = rng.standard_normal((1, 2, 5, 6)).astype(np.float32)
    sess = Session(_model(x.shape, 19, dict(mode="linear"), scales=[1, 1, 2.0, 1.5]), device="numpy")
    first = sess.run({"x": x})["y"]
    for _ in range(3):
        np.testing.assert_array_equal(sess.run({"x": x})["y"], first)
    assert len(calls) == 1


def test_an_identity_resize_returns_a_new_array(rng):
    """Scales of 1 resize nothing; the output is still its own buffer, never the input."""
    from graphopt.runtime.onnx_ops.registry import OPS, OpContext

    x = rng.standard_normal((1, 2, 3, 4)).astype(np.float32)
    for mode in ("nearest", "linear"):
        node = type("N", (), {"op_type": "Resize", "name": "r", "attr": lambda self, k, d=None, m=mode: {"mode": m}.get(k, d)})()
        (y,) = OPS["Resize"](OpContext(np, node, 19, {2: np.ones(4, np.float32)}), [x, None, None])
        assert y is not x and not np.shares_memory(y, x)
        np.testing.assert_array_equal(y, x)
