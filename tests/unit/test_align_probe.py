"""bench/align_probe.py on the CPU: its layers' signatures, the 32-byte-declared twin of ``cudnn``'s fused CBR
candidate (against the fake cuDNN frontend: the same graph, the alignment declared before the backend build,
its own cache entry), the pairing of the two plan lists and the report, so the device call does not find
out by a traceback."""

from __future__ import annotations

import json
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "bench"))

import align_probe as ap  # noqa: E402
from graphopt.providers import cudnn  # noqa: E402
import test_provider_cudnn as cudnn_tests  # noqa: E402

fake = cudnn_tests.fake  # the fixture: the fake cuDNN frontend


def test_every_default_layer_is_a_known_layer_with_its_residual_or_bias():
    from graphopt.providers import cudnn_matmul

    convs = {layer[0]: layer for layer in ap.RESNET50 + ap.MOBILENETV2}
    gemms = {layer[0]: layer for layer in ap.GEMM_LAYERS}
    for name in ap.DEFAULT_LAYERS.split(","):
        if name in convs:
            sig = ap.layer_sig(convs[name], 32, "float16")
            assert sig.op == "CBR" and sig.input_shapes[0][0] == 32
            assert (len(sig.input_shapes) > 3 and sig.input_shapes[3] is not None) == convs[name][-1], name
            assert cudnn.conv_reason(sig) is None, name
        else:
            sig = ap.gemm_sig(gemms[name], 32, "float16")
            assert sig.op == "GemmAct" and sig.input_shapes[0] == (32, ap.SEQ, gemms[name][1])
            assert sig.input_shapes[2] == (gemms[name][2],), name  # a bias (the default layers all have one)
            assert cudnn_matmul.matmul_reason(sig) is None, name


def test_the_twin_declares_32_on_its_own_graph(fake):
    mod, log = fake
    sig = ap.layer_sig(next(layer for layer in ap.RESNET50 if layer[0] == "r50.l1.c2"), 2, "float16")
    plain = cudnn.plan_candidates(cudnn.CudnnConv, cudnn.NAME, "CBR", sig, cudnn.conv_reason, cudnn._graph_for)[1:]
    cls, reason, graph_for, twin_cls = ap.family("CBR")
    assert (cls, reason, graph_for) == (cudnn.CudnnConv, cudnn.conv_reason, cudnn._graph_for)
    twin = cudnn.plan_candidates(twin_cls, ap.NAME_A32, "CBR", sig, reason, ap._a32_graph_for)[1:]
    assert [c.key().split(":plan=")[1] for c in plain] == [c.key().split(":plan=")[1] for c in twin]
    assert all(c.key().startswith("cudnn_a32probe:plan=") for c in twin)
    declared = sorted(e[1:] for e in log if e[0] == "set_alignment")
    assert declared == [("B", 32), ("W", 32), ("X", 32), ("relu", 32)]  # X, W, B and the output; the plain graph none
    assert twin[0].graphs() is ap._a32_graph_for


def test_pairs_and_report(tmp_path):
    times = {"cudnn:plan=eng1": 50.0, "cudnn_a32probe:plan=eng1": 40.0, "cudnn:plan=eng2": None}
    rows = ap.paired(times, ["cudnn:plan=eng1", "cudnn:plan=eng2"], ["cudnn_a32probe:plan=eng1", "cudnn_a32probe:plan=eng2"])
    assert rows == [{"plan": "eng1", "us_16": 50.0, "us_32": 40.0, "ratio_32_over_16": 0.8},
                    {"plan": "eng2", "us_16": None, "us_32": None, "ratio_32_over_16": None}]
    header = {"gpu": "NVIDIA H200", "date": "2026-12-07", "command": "python3 bench/align_probe.py --out x"}
    ap.write(str(tmp_path), "h200", header, [{"layer": "r50.l1.c2", "plans": rows}, {"layer": "x", "error": "unknown"}])
    md = (tmp_path / "align_probe_h200.md").read_text()
    assert "| r50.l1.c2 | `eng1` | 50.0 | 40.0 | 0.8 |" in md and "| r50.l1.c2 | `eng2` | - | - | - |" in md
    assert "| x | unknown |" in md
    assert json.loads((tmp_path / "align_probe_h200.json").read_text())["rows"][0]["layer"] == "r50.l1.c2"


def test_the_matmul_twin_declares_32_on_the_matmul_graph(fake):
    from graphopt.providers import cudnn_matmul

    mod, log = fake
    sig = ap.gemm_sig(next(layer for layer in ap.GEMM_LAYERS if layer[0] == "gpt2.mlp.c_fc"), 2, "float16")
    cls, reason, graph_for, twin_cls = ap.family("GemmAct")
    assert (cls, reason, graph_for) == (cudnn_matmul.CudnnMatmul, cudnn_matmul.matmul_reason, cudnn_matmul._graph_for)
    twin = cudnn.plan_candidates(twin_cls, ap.NAME_A32, "GemmAct", sig, reason, ap._a32_graph_for)[1:]
    assert twin and all(isinstance(c, cudnn_matmul.CudnnMatmul) for c in twin)
    assert any(e[0] == "matmul" for e in log)  # the matmul graph, not a convolution
    declared = [e for e in log if e[0] == "set_alignment"]
    assert declared and {e[2] for e in declared} == {32}
