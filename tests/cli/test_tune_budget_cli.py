"""``graphopt optimize --tune-budget`` through the real command line (CPU)."""

from __future__ import annotations

import pytest

from tests.conftest import run_graphopt
from tests.cli.test_shape_profile_cli import _model


@pytest.mark.parametrize("value", ["0", "-3", "nan", "inf"])
def test_a_budget_that_is_not_a_positive_number_is_a_usage_error(tmp_path, value):
    src = _model(tmp_path / "m.onnx")
    out = tmp_path / "o.onnx"
    r = run_graphopt("optimize", src, "--gpu", "none", "--tune-budget", value, "-o", out)
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip().splitlines() == [f"graphopt: error: --tune-budget {float(value):g}: expected a positive "
                                            "number of seconds"]
    assert "Traceback" not in r.stderr and not out.exists()


def test_a_budget_without_a_gpu_changes_nothing(tmp_path):
    src = _model(tmp_path / "m.onnx")
    a, b = tmp_path / "a.onnx", tmp_path / "b.onnx"
    assert run_graphopt("optimize", src, "--gpu", "h100", "-o", a, "--quiet").returncode == 0
    assert run_graphopt("optimize", src, "--gpu", "h100", "--tune-budget", "0.5", "-o", b, "--quiet").returncode == 0
    assert a.read_bytes() == b.read_bytes()
