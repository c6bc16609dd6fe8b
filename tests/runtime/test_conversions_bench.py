"""bench/conversions_cpu.py on a squeeze-excite block whose CBR nodes record NHWC: the runtime
converts only the graph input (what the layout choice counts), and, with elementwise steps as before
layout_order, the Mul's output too. Run in a subprocess: the script installs its fakes process-wide."""

from __future__ import annotations

import json
import subprocess
import sys

import onnx
from onnx import helper

from _scripts import ROOT
from test_layout_order import _se_block_model


def _run(tmp_path, path, *extra):
    out = tmp_path / ("before" if extra else "now")
    res = subprocess.run([sys.executable, str(ROOT / "bench" / "conversions_cpu.py"), "--model", f"se={path}",
                          "--shape", "x=2x4x6x6", "--out", str(out), *extra],
                         capture_output=True, text=True, env={"PYTHONPATH": str(ROOT), "PATH": ""}, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    return json.loads(out.with_suffix(".json").read_text())["row"]


def test_runtime_conversions_match_the_recorded_layouts(tmp_path):
    import graphopt

    opt, _ = graphopt.optimize(_se_block_model(), gpu="none")
    for n in opt.graph.node:
        if n.op_type == "CBR":
            kept = [a for a in n.attribute if a.name != "lowering_layout"]
            del n.attribute[:]
            n.attribute.extend(kept + [helper.make_attribute("lowering_layout", "NHWC")])
    path = tmp_path / "se.onnx"
    onnx.save(opt, path)
    now = _run(tmp_path, path)
    assert now["runtime_conversions"] == [1, 1] and now["conversions"][0]["shape"] == [2, 4, 6, 6]
    before = _run(tmp_path, path, "--as-before-layout-order")
    assert before["runtime_conversions"] == [2, 2]
