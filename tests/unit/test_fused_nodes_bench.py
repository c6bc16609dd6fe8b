"""bench/fused_nodes.py on a made-up report: the chosen candidates' times summed (by lowering), the
untimed nodes counted, the JSON it writes, and a one-line error and exit 2 for an unreadable report."""

from __future__ import annotations

import json
import sys

import pytest
from _scripts import ROOT, load_script


def _load():
    sys.path.insert(0, str(ROOT / "bench"))  # as when run as a script: its siblings importable
    return load_script("bench/fused_nodes.py")


def test_sums_by_lowering_and_writes_the_rows(tmp_path):
    fn = _load()
    rep = {"mode": "cached", "lowerings": [
        {"lowering": "cudnn", "params": "plan=eng4", "timings": [{"candidate": "cudnn:plan=eng4", "ms": 0.25}]},
        {"lowering": "cudnn", "params": "", "timings": [{"candidate": "cudnn", "ms": 0.125}]},
        {"lowering": "direct", "params": "opt=1", "timings": []}]}
    path = tmp_path / "r.json"
    path.write_text(json.dumps(rep))
    out = tmp_path / "o.json"
    assert fn.main([f"m={path}", "--out", str(out)]) == 0
    (row,) = json.loads(out.read_text())["rows"]
    assert row["fused_nodes"] == 3 and row["untimed_nodes"] == 1
    assert row["fused_nodes_ms"] == pytest.approx(0.375) and row["ms_by_lowering"] == {"cudnn": 0.375}


def test_an_unreadable_report_is_one_line_and_exit_2(tmp_path, capsys):
    fn = _load()
    assert fn.main([f"m={tmp_path / 'missing.json'}"]) == 2
    err = capsys.readouterr().err.strip()
    assert "missing.json" in err and "\n" not in err
