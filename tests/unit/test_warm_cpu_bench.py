"""bench/warm_cpu.py on a committed model: a cold and a warm run of this tree in fresh processes,
the warm one served from the cache and byte-identical to the cold one, and the files it writes."""

from __future__ import annotations

import json

from _scripts import ROOT, load_script


def test_cold_then_warm_in_fresh_processes_writes_both_files(tmp_path):
    bench = load_script("bench/warm_cpu.py")
    out = tmp_path / "w"
    assert bench.main(["--model", str(ROOT / "models" / "resnet_style.onnx"), "--shape", "input=2x3x32x32",
                       "--warm-runs", "1", "--out", str(out)]) == 0
    res = json.loads((tmp_path / "w.json").read_text())
    (row,) = res["rows"]
    assert row["cold_mode"] == "profiled" and row["warm_mode"] == "cached"  # the GPU faked, then the cache
    assert row["outputs_byte_identical"] is True
    assert row["warm_optimize_s_median"] > 0 and res["shapes"] == {"input": [2, 3, 32, 32]}
    assert "| byte-identical |" in (tmp_path / "w.md").read_text()
