"""bench/cache_timings.py on a made-up cache export: the best candidate per source and signature,
filters, the .json and .md it writes, and a one-line error for an unreadable export."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from _scripts import ROOT, load_script



def _load():
    sys.path.insert(0, str(ROOT / "bench"))  # as when run as a script: its siblings importable
    return load_script("bench/cache_timings.py")


def _e(sig, cand, lowering, ms, gpu="h100", status="ok"):
    return {"signature": f"CBR|{sig}|float16|group={sig[0]},k|NCHW", "candidate": cand, "lowering": lowering, "ms": ms,
            "gpu": gpu, "op": "CBR", "status": status, "samples": [ms] * 3}


def test_best_per_source_and_the_files(tmp_path, capsys):
    ct = _load()
    entries = [_e("8x", "direct:opt=1", "direct", 0.02), _e("8x", "direct:opt=2", "direct", 0.01),
               _e("8x", "cudnn:plan=eng0", "cudnn", 0.03), _e("8x", "cudnn:plan=eng1", "cudnn", 0.5, status="failed"),
               _e("8x", "direct:opt=4", "direct", 0.001, gpu="h200"), _e("1x", "cublaslt", "cublaslt", 0.2)]
    export = tmp_path / "cache.json"
    export.write_text(json.dumps({"entries": entries}))
    out = tmp_path / "t"
    assert ct.main([str(export), "--gpu", "h100", "--exclude", "group=1,", "--out", str(out), "--source", "test"]) == 0
    data = json.loads(Path(str(out) + ".json").read_text())
    (row,) = data["rows"]
    assert row["best"]["own"]["candidate"] == "direct:opt=2" and row["best"]["own"]["ms"] == 0.01
    assert row["best"]["cudnn"]["ms"] == 0.03  # the failed plan is not a timing
    md = Path(str(out) + ".md").read_text()
    assert "| own |" in md and "10.0" in md and "30.0" in md


def test_an_unreadable_export_is_one_line_and_exit_2(tmp_path, capsys):
    ct = _load()
    assert ct.main([str(tmp_path / "missing.json"), "--gpu", "h100", "--out", str(tmp_path / "t")]) == 2
    err = capsys.readouterr().err.strip()
    assert "missing.json" in err and "\n" not in err


def test_since_keeps_only_the_newer_timings_and_a_bad_date_is_exit_2(tmp_path, capsys):
    """A cache also holds an older kernel version's timings: ``--since`` leaves them out (the older,
    faster ``direct`` entry here), and says so in the table; a malformed date is one line, exit 2."""
    from datetime import datetime, timezone

    ct = _load()
    day = datetime(2026, 12, 6, tzinfo=timezone.utc).timestamp()
    old, new = _e("8x", "direct:opt=1", "direct", 0.001), _e("8x", "direct:opt=2", "direct", 0.01)
    old["created"], new["created"] = day - 60, day + 60
    export = tmp_path / "cache.json"
    export.write_text(json.dumps({"entries": [old, new]}))
    out = tmp_path / "t"
    assert ct.main([str(export), "--gpu", "h100", "--since", "2026-12-06", "--out", str(out)]) == 0
    (row,) = json.loads(Path(str(out) + ".json").read_text())["rows"]
    assert row["best"]["own"]["candidate"] == "direct:opt=2"
    assert "since 2026-12-06 UTC" in Path(str(out) + ".md").read_text()
    assert ct.main([str(export), "--gpu", "h100", "--since", "yesterday", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert "--since" in err and "\n" not in err


def test_by_lowering_splits_own_kernels(tmp_path):
    ct = _load()
    entries = [_e("8x", "direct:opt=1", "direct", 0.02), _e("8x", "direct_k3:opt=4", "direct_k3", 0.01),
               _e("8x", "cudnn:plan=eng0", "cudnn", 0.03)]
    export = tmp_path / "cache.json"
    export.write_text(json.dumps({"entries": entries}))
    out = tmp_path / "t"
    assert ct.main([str(export), "--gpu", "h100", "--by", "lowering", "--out", str(out)]) == 0
    (row,) = json.loads(Path(str(out) + ".json").read_text())["rows"]
    assert {k: v["ms"] for k, v in row["best"].items()} == {"direct": 0.02, "direct_k3": 0.01, "cudnn": 0.03}
    assert "per lowering" in Path(str(out) + ".md").read_text()
