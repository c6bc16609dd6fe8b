"""`graphopt run`, `graphopt verify --device`, `graphopt bench` on the CPU (devices numpy / cpu):
outputs against onnxruntime, atomic .npy writes, one-line errors, NaN handling, exit codes."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from _runtime_helpers import ort_run
from tests.conftest import run_graphopt as graphopt

ROOT = Path(__file__).resolve().parents[2]


def _save(tmp_path: Path, name: str, nodes, inits=(), in_shape=("N", 3, 8, 8), out_shape=None) -> Path:
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(in_shape))],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, out_shape)], list(inits))
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    path = tmp_path / name
    onnx.save(m, path)
    return path


def _conv_relu(tmp_path: Path, name="m.onnx", bias=None) -> Path:
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "w")
    b = numpy_helper.from_array(rng.standard_normal(4).astype(np.float32) if bias is None else bias, "b")
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["c"], ["y"])]
    return _save(tmp_path, name, nodes, [w, b], out_shape=["N", 4, 8, 8])


def _sha(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def test_run_writes_the_outputs_onnxruntime_computes_and_leaves_the_input_alone(tmp_path):
    model = _conv_relu(tmp_path)
    x = np.random.default_rng(5).standard_normal((2, 3, 8, 8)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    before = _sha(model), _sha(tmp_path / "x.npy")
    r = graphopt("run", model, "--input", f"x={tmp_path / 'x.npy'}", "--output-dir", tmp_path / "out", "--device", "numpy")
    assert r.returncode == 0, r.stderr
    got = np.load(tmp_path / "out" / "y.npy")
    want = ort_run(onnx.load(model), {"x": x})["y"]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    assert f"{want.min():.6g}" in r.stdout and f"{want.max():.6g}" in r.stdout and "[2, 4, 8, 8]" in r.stdout
    assert "random inputs" not in r.stdout
    assert (_sha(model), _sha(tmp_path / "x.npy")) == before
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["y.npy"]  # no temp file left


def test_run_on_cpu_with_random_inputs_is_deterministic(tmp_path):
    model = _conv_relu(tmp_path)
    outs = []
    for k in range(2):
        r = graphopt("run", model, "--shape", "x=1x3x8x8", "--output-dir", tmp_path / f"o{k}", "--device", "cpu")
        assert r.returncode == 0, r.stderr
        assert "random inputs (seed 0): x [1, 3, 8, 8]" in r.stdout
        outs.append((tmp_path / f"o{k}" / "y.npy").read_bytes())
    assert outs[0] == outs[1]


@pytest.mark.parametrize("args, code, fragment", [
    (["--input", "x=/nonexistent/x.npy"], 3, "does not exist"),
    (["--input", "x"], 2, "expected NAME=FILE.npy"),
    (["--input", "zz={npy}"], 2, "no input of that name"),
    (["--input", "x={bad}"], 2, "not a readable .npy file"),
    (["--input", "x={wrong_shape}"], 2, "has shape [2, 5]"),
])
def test_run_bad_inputs_give_one_line_errors(tmp_path, args, code, fragment):
    model = _conv_relu(tmp_path)
    np.save(tmp_path / "x.npy", np.zeros((1, 3, 8, 8), np.float32))
    np.save(tmp_path / "w.npy", np.zeros((2, 5), np.float32))
    (tmp_path / "bad.npy").write_bytes(b"not numpy")
    args = [a.format(npy=tmp_path / "x.npy", bad=tmp_path / "bad.npy", wrong_shape=tmp_path / "w.npy") for a in args]
    r = graphopt("run", model, *args, "--device", "numpy")
    assert r.returncode == code, (r.returncode, r.stderr)
    assert fragment in r.stderr and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_run_refuses_an_unwritable_output_dir_without_leaving_files(tmp_path):
    model = _conv_relu(tmp_path)
    blocker = tmp_path / "out"
    blocker.write_text("a file where the folder should be")
    r = graphopt("run", model, "--output-dir", blocker / "sub", "--device", "numpy")
    assert r.returncode != 0 and "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert blocker.read_text() == "a file where the folder should be"


def test_write_npys_writes_all_or_nothing(tmp_path, monkeypatch):
    from graphopt import cli_runtime, files
    from graphopt.errors import WriteFailed

    calls = []
    real = files.os.replace

    def flaky(src, dst):
        calls.append(dst)
        if len(calls) == 1:
            raise OSError(28, "No space left on device")
        return real(src, dst)

    monkeypatch.setattr(files.os, "replace", flaky)  # write_npys stages through graphopt.files
    with pytest.raises(WriteFailed, match="nothing was written"):
        cli_runtime.write_npys(tmp_path, {"a": np.zeros(3), "b/c": np.ones(2)})
    assert list(tmp_path.iterdir()) == []


def test_run_reports_an_unsupported_op_before_running(tmp_path):
    nodes = [helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Unique", ["a"], ["y"], name="uniq")]
    model = _save(tmp_path, "u.onnx", nodes, in_shape=[4])
    r = graphopt("run", model, "--device", "numpy")
    assert r.returncode == 5 and "Unique" in r.stderr and "'uniq'" in r.stderr and "device='cpu'" in r.stderr


def test_verify_on_the_runtime_passes_equal_models_and_fails_different_ones(tmp_path):
    src = _conv_relu(tmp_path)
    out = tmp_path / "o.onnx"
    assert graphopt("optimize", src, "-o", out, "-q").returncode == 0
    assert any(n.domain == "graphopt" for n in onnx.load(out).graph.node)
    r = graphopt("verify", out, src, "--device", "numpy", "--shape", "x=2x3x8x8")
    assert r.returncode == 0, r.stderr
    other = _conv_relu(tmp_path, "other.onnx", bias=np.full(4, 5.0, np.float32))
    r = graphopt("verify", other, src, "--device", "numpy")
    assert r.returncode == 9 and "differ at output 'y'" in r.stderr


def test_verify_nan_at_the_same_places_passes_elsewhere_fails(tmp_path):
    log = _save(tmp_path, "log.onnx", [helper.make_node("Log", ["x"], ["y"])], in_shape=[64])
    log_abs = _save(tmp_path, "logabs.onnx", [helper.make_node("Abs", ["x"], ["a"]), helper.make_node("Log", ["a"], ["y"])],
                    in_shape=[64])
    assert graphopt("verify", log, log, "--device", "numpy").returncode == 0  # NaN where x < 0 in both
    r = graphopt("verify", log, log_abs, "--device", "numpy")
    assert r.returncode == 9 and "NaN/inf at different positions" in r.stdout


def test_bench_prints_every_configuration_and_the_op_breakdown(tmp_path):
    src = _conv_relu(tmp_path)
    opt = tmp_path / "m.opt.onnx"
    r = graphopt("bench", src, "--optimized", opt, "--device", "numpy", "--batch", "1", "--batch", "2",
                 "--repeats", "2", "--warmup", "1")
    assert r.returncode == 0, r.stderr
    assert opt.exists() and any(n.domain == "graphopt" for n in onnx.load(opt).graph.node)
    for label in ("│ ORT CPU ", "ORT CPU, optimized", "runtime numpy (a testing aid), unoptimized",
                  "runtime numpy (a testing aid), optimized, eager", "CUDA graphs need device"):
        assert r.stdout.count(label) == 2, label
    assert "per-op time" in r.stdout and "CBR" in r.stdout


def test_bench_batch_on_a_fixed_batch_model_is_a_one_line_error(tmp_path):
    nodes = [helper.make_node("Relu", ["x"], ["y"])]
    model = _save(tmp_path, "fixed.onnx", nodes, in_shape=[1, 4])
    r = graphopt("bench", model, "--device", "numpy", "--batch", "8")
    assert r.returncode == 2 and "fixed batch dimension 1" in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_bench_plot_without_matplotlib_names_the_extra(tmp_path):
    pytest.importorskip("numpy")
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        r = graphopt("bench", _conv_relu(tmp_path), "--device", "numpy", "--plot", tmp_path / "p.png")
        assert r.returncode == 2 and "the 'plot' extra" in r.stderr and "graphopt[plot]" in r.stderr and not (tmp_path / "p.png").exists()
    else:
        r = graphopt("bench", _conv_relu(tmp_path), "--device", "numpy", "--repeats", "1", "--plot", tmp_path / "p.png")
        assert r.returncode == 0 and (tmp_path / "p.png").read_bytes()[:4] == b"\x89PNG"
