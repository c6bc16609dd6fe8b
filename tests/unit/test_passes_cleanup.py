"""run_cleanup: the passes together reach a fixpoint, keep outputs equal, and are deterministic."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper as h

sys.path.insert(0, str(Path(__file__).parent))
from test_passes_common import load, model, ops, run, to_model  # noqa: E402

from graphopt.passes import CLEANUP_ORDER, run_cleanup  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


def _messy_model(seed=0):
    """Pad -> Conv -> BN -> Mul -> Add -> Identity -> Dropout -> Relu, a constant shape chain, a
    dead branch, and an If whose branch has a foldable constant and an Identity."""
    rng = np.random.default_rng(seed)
    cin, cout = 3, 5
    inits = {
        "pads": np.array([0, 0, 1, 2, 0, 0, 2, 1], np.int64),
        "W": (rng.standard_normal((cout, cin, 3, 3)) * 0.3).astype(np.float32),
        "B": rng.standard_normal(cout).astype(np.float32),
        "scale": rng.uniform(0.5, 2, cout).astype(np.float32),
        "shift": rng.standard_normal(cout).astype(np.float32),
        "mean": rng.standard_normal(cout).astype(np.float32),
        "var": rng.uniform(0.2, 2, cout).astype(np.float32),
        "mul": rng.uniform(0.5, 2, (cout, 1, 1)).astype(np.float32),
        "add": rng.standard_normal((1, cout, 1, 1)).astype(np.float32),
        "unused": np.zeros(7, np.float32),
    }
    then = h.make_graph(
        [h.make_node("Neg", ["mul"], ["nm"]), h.make_node("Identity", ["nm"], ["nm2"]), h.make_node("ReduceSum", ["nm2"], ["s0"], keepdims=0),
         h.make_node("Mul", ["flat", "s0"], ["t0"]), h.make_node("Identity", ["t0"], ["t"])],
        "then", [], [h.make_tensor_value_info("t", TensorProto.FLOAT, None)],
    )
    els = h.make_graph([h.make_node("Relu", ["flat"], ["e"])], "else", [], [h.make_tensor_value_info("e", TensorProto.FLOAT, None)])
    nodes = [
        h.make_node("Pad", ["x", "pads"], ["p"], mode="constant"),
        h.make_node("Conv", ["p", "W", "B"], ["c"], pads=[1, 1, 1, 1]),
        h.make_node("BatchNormalization", ["c", "scale", "shift", "mean", "var"], ["bn"]),
        h.make_node("Mul", ["bn", "mul"], ["m"]),
        h.make_node("Add", ["add", "m"], ["a"]),
        h.make_node("Identity", ["a"], ["i"]),
        h.make_node("Dropout", ["i"], ["d"]),
        h.make_node("Relu", ["d"], ["r"]),
        h.make_node("Constant", [], ["c1"], value_ints=[2, -1]),
        h.make_node("Constant", [], ["c2"], value_ints=[1]),
        h.make_node("Mul", ["c1", "c2"], ["shape"]),
        h.make_node("Reshape", ["r", "shape"], ["flat"]),
        h.make_node("Sigmoid", ["flat"], ["dead"]),
        h.make_node("If", ["cond"], ["y"], then_branch=then, else_branch=els),
        h.make_node("Identity", ["y"], ["out"]),
    ]
    return model(nodes, [("x", [2, cin, 6, 5]), ("cond", [], TensorProto.BOOL)], [("out", [2, None])], inits)


def test_cleanup_reaches_fixpoint_and_keeps_outputs(rng):
    m = _messy_model()
    onnx.checker.check_model(m, full_check=True)
    g = load(m)
    totals = run_cleanup(g)
    assert list(totals) == list(CLEANUP_ORDER)
    g.lint()
    out = to_model(g)
    onnx.checker.check_model(out, full_check=True)
    assert ops(out) == ["Conv", "Relu", "Reshape", "If"]
    assert [o.name for o in out.graph.output] == ["out"]
    for key in ("eliminate_identity", "eliminate_dropout", "fold_pad_into_conv", "fold_conv_bn", "fold_conv_mul_add", "fold_constants", "dead_code"):
        assert totals[key] >= 1, (key, totals)
    x = rng.standard_normal((2, 3, 6, 5)).astype(np.float32)
    for cond in (True, False):
        feeds = {"x": x, "cond": np.array(cond)}
        ref = run(m, feeds)[0]
        # The folds re-associate fp32 sums whose terms are as large as the largest output, so an output
        # near zero is off by ulps of that scale, not of its own: over 6,000 random inputs the worst
        # error was 4.0e-7 of max|ref| (a fixed atol=1e-5 failed 0.3% of them); 2e-6 of it is 5x that.
        np.testing.assert_allclose(run(out, feeds)[0], ref, rtol=1e-5, atol=2e-6 * max(1.0, float(np.abs(ref).max())))
    # idempotent: a second cleanup finds nothing
    assert not any(run_cleanup(load(out)).values())


def test_cleanup_is_deterministic_within_a_process():
    outs = []
    for _ in range(2):
        g = load(_messy_model())
        run_cleanup(g)
        outs.append(to_model(g).SerializeToString())
    assert outs[0] == outs[1]


def test_cleanup_is_deterministic_across_hash_seeds():
    script = (
        "import hashlib, sys; sys.path.insert(0, 'tests/unit');"
        "from test_passes_cleanup import _messy_model; from graphopt.ir import from_model, to_model;"
        "from graphopt.passes import run_cleanup; g = from_model(_messy_model()); run_cleanup(g);"
        "print(hashlib.sha256(to_model(g).SerializeToString()).hexdigest())"
    )
    digests = set()
    for seed in ("1", "12345"):
        env = {"PYTHONHASHSEED": seed, "PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}
        proc = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr
        digests.add(proc.stdout.strip())
    assert len(digests) == 1


def test_disable_and_unknown_pass():
    g = load(_messy_model())
    totals = run_cleanup(g, disable=["fold_conv_bn", "fold_conv_mul_add"])
    assert totals["fold_conv_bn"] == 0 and "BatchNormalization" in [n.op_type for n in g.nodes()]
    with pytest.raises(ValueError, match="unknown cleanup pass"):
        run_cleanup(g, disable=["fold_everything"])


def _feeds(m, rng):
    inits = {t.name for t in m.graph.initializer}
    feeds = {}
    for vi in m.graph.input:
        if vi.name in inits:
            continue
        tt = vi.type.tensor_type
        shape = [d.dim_value or 3 for d in tt.shape.dim]
        dtype = h.tensor_dtype_to_np_dtype(tt.elem_type)
        if dtype.kind in "iu":
            feeds[vi.name] = rng.integers(0, 2, shape).astype(dtype)
        elif dtype.kind == "b":
            feeds[vi.name] = rng.integers(0, 2, shape).astype(bool)
        else:
            feeds[vi.name] = rng.standard_normal(shape).astype(dtype)
    return feeds


SAMPLES = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "models").rglob("*.onnx") if p.stat().st_size < 2_000_000)


@pytest.mark.parametrize("path", SAMPLES)
def test_cleanup_on_sample_models(path, rng):
    original = onnx.load(str(ROOT / path))
    g = load(original)
    run_cleanup(g)
    g.lint()
    out = to_model(g)
    onnx.checker.check_model(out, full_check=True)
    assert [o.name for o in out.graph.output] == [o.name for o in original.graph.output]
    feeds = _feeds(original, rng)
    for a, b in zip(run(original, feeds), run(out, feeds)):
        np.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-4)
    assert not any(run_cleanup(load(out)).values())
