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


def test_every_default_layer_is_a_known_cbr_layer_with_its_residual():
    known = {layer[0]: layer for layer in ap.RESNET50 + ap.MOBILENETV2}
    for name in ap.DEFAULT_LAYERS.split(","):
        sig = ap.layer_sig(known[name], 32, "float16")
        assert sig.op == "CBR" and sig.input_shapes[0][0] == 32
        assert (len(sig.input_shapes) > 3 and sig.input_shapes[3] is not None) == known[name][-1], name
        assert cudnn.conv_reason(sig) is None, name


def test_the_twin_declares_32_on_its_own_graph(fake):
    mod, log = fake
    sig = ap.layer_sig(next(layer for layer in ap.RESNET50 if layer[0] == "r50.l1.c2"), 2, "float16")
    plain = cudnn.plan_candidates(cudnn.CudnnConv, cudnn.NAME, "CBR", sig, cudnn.conv_reason, cudnn._graph_for)[1:]
    twin = cudnn.plan_candidates(ap.a32_class(), ap.NAME_A32, "CBR", sig, cudnn.conv_reason, ap._a32_graph_for)[1:]
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
