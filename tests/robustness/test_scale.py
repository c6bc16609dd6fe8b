"""Issue 6 part 6: scale. A long graph finishes within bounded time and memory, and an If nested
10,000 deep is refused with a clear "nested too deep" error, never a RecursionError or a hang.

100,000 nodes run in CI; 1,000,000 nodes are marked slow (timings in bench/results/robustness.md).
Each run is a fresh interpreter so that its peak memory (ru_maxrss) is its own."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.robustness._cli import assert_refused, run_many
from tests.robustness.test_hostile_bytes import _nested_if_bytes

ROOT = Path(__file__).resolve().parents[2]

_CHAIN = textwrap.dedent("""
    import json, resource, sys, time
    import onnx
    from onnx import TensorProto, helper as h
    import graphopt
    n = int(sys.argv[1])
    ops = ["Relu", "Neg", "Sigmoid", "Abs"]
    nodes = [h.make_node(ops[i % 4], [f"t{i}"], [f"t{i + 1}"], name=f"n{i}") for i in range(n)]
    g = h.make_graph(nodes, "chain", [h.make_tensor_value_info("t0", TensorProto.FLOAT, [4])],
                     [h.make_tensor_value_info(f"t{n}", TensorProto.FLOAT, [4])])
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 17)])
    t = time.perf_counter()
    out, report = graphopt.optimize(m, gpu="none")
    dt = time.perf_counter() - t
    print(json.dumps({"n": n, "nodes_after": report.nodes_after, "seconds": dt,
                      "peak_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
""")


def _chain(n: int, tmp_path: Path, timeout: float) -> dict:
    script = tmp_path / "chain.py"
    script.write_text(_CHAIN)
    r = subprocess.run([sys.executable, str(script), str(n)], capture_output=True, text=True, timeout=timeout, cwd=ROOT,
                       env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "GRAPHOPT_CACHE_DIR": str(tmp_path)})
    assert r.returncode == 0 and "RecursionError" not in r.stderr, r.stderr[-3000:]
    result = json.loads(r.stdout.strip().splitlines()[-1])
    print("scale:", result)  # shown with -s; bench/robustness_table.py records these
    return result


def test_a_100k_node_graph_finishes_in_bounded_time_and_memory(tmp_path):
    result = _chain(100_000, tmp_path, timeout=300)
    assert result["nodes_after"] == 100_000
    assert result["seconds"] < 120 and result["peak_mib"] < 4096, result


@pytest.mark.slow
def test_a_1m_node_graph_finishes_in_bounded_time_and_memory(tmp_path):
    result = _chain(1_000_000, tmp_path, timeout=1800)
    assert result["nodes_after"] == 1_000_000
    assert result["seconds"] < 1200 and result["peak_mib"] < 16384, result


@pytest.mark.parametrize("depth", [40, 10_000])
def test_if_nested_deep_is_refused_as_nested_too_deep_through_the_cli(tmp_path, depth):
    p = tmp_path / "deep.onnx"
    p.write_bytes(_nested_if_bytes(depth))
    (r,) = run_many([(["optimize", p, "--gpu", "none", "-o", tmp_path / "o.onnx"], tmp_path)], tmp_path, timeout=60)
    assert r.returncode != -9, "still running after 60 s"
    assert_refused(r, 5, f"If nested {depth} deep")
    assert "nested too deep" in r.stderr and str(p) in r.stderr, r.stderr
    assert "RecursionError" not in r.stderr and not (tmp_path / "o.onnx").exists()


def test_if_nested_within_the_limits_loads(tmp_path):
    """The control: shallow nesting is fine (so the refusal above is about depth, not about If)."""
    from graphopt.ir.io import load_model, parse_model

    graph = load_model(parse_model(_nested_if_bytes(8), "<ok>"))
    assert len(graph.graphs()) == 17


def test_if_nested_at_the_limit_optimizes_and_runs_unchanged():
    """The deepest nesting graphopt accepts (MAX_NESTING) goes through the whole pipeline, including the
    protobuf copies in save and onnxruntime, and both branches still compute what the input does."""
    import numpy as np
    import onnxruntime as ort

    import graphopt
    from graphopt.ir.io import MAX_NESTING
    from tests.robustness._bad_models import nested_if

    out, report = graphopt.optimize(nested_if(MAX_NESTING), gpu="none")
    assert report.nodes_after == 2 * MAX_NESTING + 1
    session = ort.InferenceSession(out.SerializeToString(), providers=["CPUExecutionProvider"])
    x = np.random.default_rng(0).standard_normal(2).astype(np.float32)
    np.testing.assert_array_equal(session.run(None, {"x": x, "cond": np.array(True)})[0], x)
    np.testing.assert_array_equal(session.run(None, {"x": x, "cond": np.array(False)})[0], -x)


@pytest.mark.parametrize("extra", [1, 3, 10_000 - 30])
def test_if_nested_too_deep_in_memory_is_refused_through_the_api(extra):
    """A ModelProto built in memory is not limited by the parser; past MAX_NESTING the API refuses it
    with the same clear error (it used to escape as a raw protobuf DecodeError from a copy in save)."""
    import graphopt
    from graphopt.errors import UnsupportedModel
    from graphopt.ir.io import MAX_NESTING
    from tests.robustness._bad_models import nested_if

    with pytest.raises(UnsupportedModel, match="nested too deep"):
        graphopt.optimize(nested_if(MAX_NESTING + extra), gpu="none")
