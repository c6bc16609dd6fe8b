"""docs/adding_a_fused_op.md runs: its rule, op and kernel candidate, used end to end (CPU; one GPU test).

The guide's code blocks are extracted by their markers and run in order, in a temporary folder: the
rule goes to ``my_rules/bias_relu.toml``, the op and candidate blocks to ``bias_relu.py`` (imported
as the user would), then the model and use blocks run, and what they print must equal the output
the guide shows in its comments. Then the registered family goes through the real profiler and
selection with a fake timer and the NumPy-level check, and must be enumerated, checked and picked.
"""

from __future__ import annotations

import contextlib
import io
import math
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from tests.conftest import run_ort

ROOT = Path(__file__).resolve().parents[1]
GUIDE = (ROOT / "docs" / "adding_a_fused_op.md").read_text()


def block(marker: str, lang: str) -> str:
    m = re.search(rf"<!-- guide:{re.escape(marker)} -->\s*```{lang}\n(.*?)```", GUIDE, re.S)
    assert m, f"docs/adding_a_fused_op.md lost its guide:{marker} block"
    return m.group(1)


def shown_output(code: str) -> list[str]:
    """The guide's expected output: the comment line right after each ``print(...)`` line."""
    lines = code.splitlines()
    out = []
    for i, line in enumerate(lines):
        if line.startswith("print("):
            j = i + 1
            while j < len(lines) and not lines[j].lstrip().startswith("#"):
                j += 1
            out.append(lines[j].lstrip()[1:].strip())
    return out


def run_block(code: str, namespace: dict) -> list[str]:
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        exec(compile(code, "docs/adding_a_fused_op.md", "exec"), namespace)
    return buf.getvalue().splitlines()


@pytest.fixture(scope="module")
def guide(tmp_path_factory):
    """The guide's files in a fresh folder, that folder as the cwd and on sys.path; undone after."""
    from graphopt.kernels import registry
    from graphopt.ops import unregister_schema
    from graphopt.kernels import heuristic

    d = tmp_path_factory.mktemp("guide")
    (d / "my_rules").mkdir()
    (d / "my_rules" / "bias_relu.toml").write_text(block("rule", "toml"))
    (d / "bias_relu.py").write_text(block("op", "python") + "\n\n" + block("candidate", "python"))
    old_cwd = os.getcwd()
    os.chdir(d)
    sys.path.insert(0, str(d))
    try:
        yield d
    finally:
        os.chdir(old_cwd)
        sys.path.remove(str(d))
        mod = sys.modules.pop("bias_relu", None)
        if mod is not None:
            registry.unregister_family("BiasRelu", mod.bias_relu_candidates)
        unregister_schema("BiasRelu")
        heuristic._HEURISTICS.pop("BiasRelu", None)


@pytest.fixture(scope="module")
def used(guide):
    """Runs the model and use blocks; returns (namespace, printed lines)."""
    ns: dict = {}
    run_block(block("model", "python"), ns)
    printed = run_block(block("use", "python"), ns)
    return ns, printed


def test_the_rule_file_checks_clean(guide):
    import bias_relu  # noqa: F401  - the rule names the op, so it is registered first
    from graphopt.rewrite import check_rule_file

    assert check_rule_file(guide / "my_rules" / "bias_relu.toml") == []


def test_optimize_fuses_and_prints_what_the_guide_shows(used, guide):
    ns, printed = used
    assert printed == shown_output(block("use", "python"))
    out = onnx.load(guide / "mlp_tail.opt.onnx")
    assert [(n.domain, n.op_type) for n in out.graph.node] == [("", "Tanh"), ("graphopt", "BiasRelu")]
    assert any(f.domain == "graphopt" and f.name == "BiasRelu" for f in out.functions)
    onnx.checker.check_model(out, full_check=True)


def test_onnxruntime_runs_the_function_body_and_matches_the_original(used, guide, rng):
    orig = onnx.load(guide / "mlp_tail.onnx")
    out = onnx.load(guide / "mlp_tail.opt.onnx")
    for batch in (1, 5):
        x = rng.standard_normal((batch, 64)).astype(np.float32)
        got, want = run_ort(out, {"x": x})[0], run_ort(orig, {"x": x})[0]
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
        assert (want > 0).any() and (want == 0).any()  # both sides of the Relu are exercised


def test_the_reference_is_the_float64_truth(guide, rng):
    import bias_relu

    x = rng.standard_normal((3, 7)).astype(np.float16)
    b = rng.standard_normal(7).astype(np.float16)
    (y,) = bias_relu.SCHEMA.reference([x, b], {})
    assert y.dtype == np.float16
    np.testing.assert_array_equal(y, np.maximum(x.astype(np.float64) + b.astype(np.float64), 0).astype(np.float16))


def _model(bias_input: bool = False, two_uses: bool = False, bias_shape=(64,)) -> onnx.ModelProto:
    nodes = [helper.make_node("Tanh", ["x"], ["h"]), helper.make_node("Add", ["h", "b"], ["s"]),
             helper.make_node("Relu", ["s"], ["y"])]
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 64])]
    if two_uses:
        nodes.append(helper.make_node("Neg", ["s"], ["z"]))
        outputs.append(helper.make_tensor_value_info("z", TensorProto.FLOAT, ["batch", 64]))
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 64])]
    inits = []
    if bias_input:
        inputs.append(helper.make_tensor_value_info("b", TensorProto.FLOAT, list(bias_shape)))
    else:
        inits.append(numpy_helper.from_array(np.ones(bias_shape, np.float32), "b"))
    g = helper.make_graph(nodes, "g", inputs, outputs, initializer=inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("kind, reason", [
    ("bias_input", "'b' is not a constant"),
    ("two_uses", "'s'"),
    ("bias_2d", "'b' has rank 2, expected 1"),
])
def test_the_rule_does_not_fire_on_near_misses(guide, kind, reason):
    import graphopt
    import bias_relu  # noqa: F401

    model = _model(bias_input=kind == "bias_input", two_uses=kind == "two_uses",
                   bias_shape=(1, 64) if kind == "bias_2d" else (64,))
    opt, report = graphopt.optimize(model, rules=["my_rules/"], gpu="none", explain=True)
    assert report.rewrites == {} and not any(n.domain == "graphopt" for n in opt.graph.node)
    misses = [m for m in report.near_misses if m.get("rule") == "bias_relu"]
    assert misses and any(reason in m["reason"] for m in misses), misses


# ---------------------------------------------------------------------- the profiler picks it up
# Simulated run times for the fake timer: block=512 is the "fastest" real config here, and a planted
# wrong kernel would be faster still, so only the check keeps it from winning.
SIMULATED_MS = {128: 0.030, 256: 0.020, 512: 0.012}


@dataclass(frozen=True)
class OnCpu:
    """A CPU stand-in for one registered candidate: same key, applies and source hash; its launch
    runs the kernel's NumPy emulation into the profiler's buffers and returns a simulated time."""

    cand: object
    wrong: bool = False

    def key(self):
        return self.cand.key() + (",planted=wrong" if self.wrong else "")

    @property
    def name(self):
        return self.cand.name

    def params_str(self):
        return self.cand.params_str() + (",planted=wrong" if self.wrong else "")

    def applies(self, sig, cc):
        return self.cand.applies(sig, cc)

    def source_hash(self):
        return self.cand.source_hash()

    def build(self, sig, arch):
        return _EmulatedLaunch(self.cand.emulate(sig), 0.001 if self.wrong else SIMULATED_MS[self.cand.param("block")],
                               self.wrong)


class _EmulatedLaunch:
    def __init__(self, emulate, ms, wrong):
        self.emulate, self.ms, self.wrong = emulate, ms, wrong

    def __call__(self, inputs, outputs):
        if inputs:  # the checker's call: real NumPy arrays
            self.emulate(inputs, outputs)
            if self.wrong:
                outputs[0].reshape(-1)[::7] += 1.0  # a kernel that gets every 7th element wrong
        return self.ms


def cpu_candidates(sig):
    from graphopt.kernels import candidates_for

    real = candidates_for(sig)
    return [OnCpu(c) for c in real] + [OnCpu(real[0], wrong=True)]


def _profile(isolate: bool):
    from graphopt.ir import load_model
    from graphopt.kernels.check import numpy_checker
    from graphopt.tune.candidate_run import FakeTimer
    from graphopt.tune.gpus import DeviceInfo
    from graphopt.tune.profiler import Profiler
    from graphopt.tune.select import select_lowerings

    h200 = DeviceInfo(0, "NVIDIA H200", "h200", (9, 0), "13.0", "13.0", "14.2.0")
    graph = load_model("mlp_tail.opt.onnx")
    with Profiler(cpu_candidates, timer=FakeTimer(3), checker=numpy_checker, device=h200, isolate=isolate,
                  timeout_s=60) as prof:
        rep = select_lowerings(graph, "h200", profile=prof, devices=[h200], progress=False,
                               shapes={"x": [32, 64]})
    return graph, rep


@pytest.mark.parametrize("isolate", [False, True], ids=["inline", "worker-process"])
def test_the_profiler_enumerates_checks_and_picks_the_new_candidate(used, isolate):
    graph, rep = _profile(isolate)
    (row,) = rep.rows
    assert row.op == "BiasRelu" and row.mode == "profiled" and rep.mode == "profiled"
    by = {t["candidate"]: t for t in row.timings}
    assert set(by) == {"bias_relu:block=128", "bias_relu:block=256", "bias_relu:block=512",
                       "bias_relu:block=128,planted=wrong"}
    for block_ in (128, 256, 512):
        t = by[f"bias_relu:block={block_}"]
        assert t["status"] == "ok" and math.isclose(t["ms"], SIMULATED_MS[block_])
    wrong = by["bias_relu:block=128,planted=wrong"]
    assert wrong["status"] == "wrong_answer" and "normwise relative error" in wrong["reason"]
    node = next(n for _, n in graph.walk() if n.domain == "graphopt")
    assert (node.attr("lowering"), node.attr("lowering_params")) == ("bias_relu", "block=512")


def test_cpu_checks_block_compiles_and_checks_every_config(guide):
    from graphopt.kernels.source import NvrtcUnavailable, nvrtc_compile

    try:
        nvrtc_compile("elementwise.cu", ["spin"], "compute_80")
    except NvrtcUnavailable as exc:
        pytest.skip(f"NVRTC not importable: {exc}")
    import bias_relu  # noqa: F401

    code = block("cpu-check", "python")
    assert run_block(code, {}) == shown_output(code)


def test_a_wrong_emulation_is_caught_by_the_numpy_check(guide):
    import bias_relu
    from graphopt.lowering.contract import Signature
    from graphopt.kernels.check import numpy_checker

    sig = Signature.make("BiasRelu", [(4, 6), (6,)], ["float32", "float32"], {})
    good = bias_relu.bias_relu_candidates()[0].emulate(sig)
    assert numpy_checker(sig, good) is None

    def off_by_one(inputs, outputs):  # reads the bias at (i + 1) % c
        x, b = inputs
        outputs[0][...] = np.maximum(x + np.roll(b, -1), 0)

    assert "normwise relative error" in numpy_checker(sig, off_by_one)
    assert "not written" in numpy_checker(sig, lambda i, o: None)


@pytest.mark.gpu
def test_on_the_gpu_the_real_profiler_picks_a_bias_relu_config(used, guide, monkeypatch):
    import graphopt

    monkeypatch.setenv("GRAPHOPT_CACHE_DIR", str(guide / "cache"))
    opt, report = graphopt.optimize("mlp_tail.onnx", rules=["my_rules/"], gpu="auto", shapes={"x": [4096, 64]},
                                    verify=True)
    assert report.mode == "profiled", report.selection_summary
    (row,) = report.lowerings
    assert row["lowering"] == "bias_relu" and all(t["status"] == "ok" for t in row["timings"]), row["timings"]
    assert len(row["timings"]) == 3


# ---------------------------------------------------------------------- the extension points themselves
def test_register_schema_refuses_clashes_and_builtins(guide):
    import bias_relu
    from graphopt.errors import RuleError
    from graphopt.ops import get_schema, register_schema, unregister_schema
    from graphopt.ops.schema import OpSchema

    assert get_schema("BiasRelu") is bias_relu.SCHEMA
    assert register_schema(bias_relu.SCHEMA) is bias_relu.SCHEMA  # idempotent (a re-import)
    clash = OpSchema(**{**{f: getattr(bias_relu.SCHEMA, f) for f in bias_relu.SCHEMA.__dataclass_fields__},
                        "_reference": lambda inputs, attrs: inputs})  # defined here, not in bias_relu
    with pytest.raises(RuleError, match="'BiasRelu' is already defined .by bias_relu.; give the new op another name"):
        register_schema(clash)
    cbr_clash = OpSchema(**{**{f: getattr(bias_relu.SCHEMA, f) for f in bias_relu.SCHEMA.__dataclass_fields__},
                            "name": "CBR"})
    with pytest.raises(RuleError, match="'CBR' is already defined"):
        register_schema(cbr_clash)
    with pytest.raises(RuleError, match="built in"):
        unregister_schema("CBR")


def test_register_family_and_source_checks(guide):
    import bias_relu
    from graphopt.errors import TuningError
    from graphopt.kernels import candidates_for
    from graphopt.lowering.contract import Signature
    from graphopt.kernels.registry import candidate_from_key, ops, register_family, unregister_family
    from graphopt.kernels.source import read_source, register_source, source_hash

    sig = Signature.make("BiasRelu", [(2, 3), (3,)], ["float16", "float16"], {})
    assert "BiasRelu" in ops() and len(candidates_for(sig)) == 3
    register_family("BiasRelu", bias_relu.bias_relu_candidates)  # again: still one family
    assert len(candidates_for(sig)) == 3
    assert candidate_from_key("BiasRelu", "bias_relu:block=512") == bias_relu.BiasReluKernel("bias_relu", (("block", 512),))
    with pytest.raises(ValueError, match="pass output_shape="):
        register_family("NoSuchOp", bias_relu.bias_relu_candidates)
    assert "#line 1 \"bias_relu.cu\"" in read_source("bias_relu.cu") and "struct Num" in read_source("bias_relu.cu")
    assert len(source_hash("bias_relu.cu")) == 16
    with pytest.raises(TuningError, match="shipped with graphopt"):
        register_source("elementwise.cu", "// mine")
    with pytest.raises(TuningError, match="already registered with other text"):
        register_source("bias_relu.cu", "// other")
    register_source("bias_relu.cu", bias_relu.register_source.__globals__["_REGISTERED"]["bias_relu.cu"])  # same text: fine
    # unregistering restores the registry (the fixture registers nothing else)
    unregister_family("BiasRelu", bias_relu.bias_relu_candidates)
    try:
        assert candidates_for(sig) == [] and "BiasRelu" not in ops()
    finally:
        register_family("BiasRelu", bias_relu.bias_relu_candidates, output_shape=bias_relu.output_shape)
