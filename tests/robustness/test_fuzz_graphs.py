"""Issue 6 part 5: random valid graphs (tests/robustness/gen.py) through ``graphopt.optimize`` (the
library API, with ``verify=True``): never a crash, and the optimized model's outputs equal the
original's under onnxruntime CPU on random inputs -- checked here again, independently of verify.

The example count is GRAPHOPT_FUZZ_EXAMPLES (300 by default; about 30 s on 2 cores). The run is
derandomized (the same examples every run, no example database) and has no per-example deadline.
A failing example's model is written to $TMPDIR/graphopt-fuzz-failure.onnx (the shrunk one last):
commit it under tests/robustness/corpus/ as fuzz_graph_<what>.onnx with its fix; test_corpus.py
replays every file there through the same ``check``.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import numpy as np
import onnx
from hypothesis import HealthCheck, given, note, settings, strategies as st

import graphopt
from tests.conftest import run_ort

from .gen import models

EXAMPLES = int(os.environ.get("GRAPHOPT_FUZZ_EXAMPLES", "300"))
FAILURE = Path(tempfile.gettempdir()) / "graphopt-fuzz-failure.onnx"
RTOL, ATOL = 1e-4, 1e-5


def random_feeds(model: onnx.ModelProto, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    inits = {t.name for t in model.graph.initializer}
    feeds = {}
    for vi in model.graph.input:
        if vi.name in inits:
            continue
        dims = [d.dim_value for d in vi.type.tensor_type.shape.dim]
        feeds[vi.name] = rng.standard_normal(dims).astype(np.float32)
    return feeds


def check(model: onnx.ModelProto, seed: int = 0) -> onnx.ModelProto:
    """The property: optimize (with verify) succeeds, the result passes onnx.checker, keeps the graph's
    interface, and computes what the original computes (onnxruntime, fresh inputs, fp32 tolerance)."""
    before = model.SerializeToString()
    out, report = graphopt.optimize(model, gpu="none", verify=True)
    assert model.SerializeToString() == before, "optimize modified its input"
    onnx.checker.check_model(out, full_check=True)
    assert [o.name for o in out.graph.output] == [o.name for o in model.graph.output]
    assert [i.name for i in out.graph.input] == [i.name for i in model.graph.input]
    assert report.verify is not None and report.verify.get("ok") is True, report.verify
    for trial in range(2):
        feeds = random_feeds(model, seed * 2 + trial)
        want = run_ort(model, feeds)
        got = run_ort(out, feeds)
        for o, a, b in zip(model.graph.output, want, got):
            assert a.shape == b.shape, (o.name, a.shape, b.shape)
            np.testing.assert_allclose(b, a, rtol=RTOL, atol=ATOL * max(1.0, float(np.abs(a).max(initial=0))),
                                       err_msg=f"output {o.name!r}")
    return out


@settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(models(), st.integers(0, 2**16))
def test_random_graph_optimizes_and_matches_onnxruntime(model, seed):
    try:
        check(model, seed)
    except BaseException:
        FAILURE.write_bytes(model.SerializeToString())
        note(f"model written to {FAILURE}: commit it under tests/robustness/corpus/ with the fix")
        raise


def test_the_generator_reaches_the_fusion_rules():
    """The fuzzer is only useful if the rules fire (and are refused) on its graphs: over a fixed set
    of examples, several distinct rules fire and some fusible chains are kept for a second consumer."""
    fired: set[str] = set()
    reasons: list[str] = []

    @settings(max_examples=60, deadline=None, derandomize=True, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(models())
    def collect(model):
        _, report = graphopt.optimize(model, gpu="none", explain=True)
        fired.update(report.rewrites)
        reasons.extend(str(m.get("reason", "")) for m in report.near_misses)

    collect()
    assert len(fired) >= 5, fired
    assert {r for r in fired if r.startswith("conv")} and {r for r in fired if r.startswith("matmul")}, fired
    assert any("consumers" in r for r in reasons) and any("graph output" in r for r in reasons), reasons
