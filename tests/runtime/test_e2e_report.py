"""bench/e2e.py's bookkeeping (bench/e2e_report.py) on fake rows and reports, without torch or a GPU:
which rows a run makes, when a tuning counts as complete, merging calls, acceptance, the markdown."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from _scripts import load_script

ROOT = Path(__file__).resolve().parents[2]


def _load(name):
    sys.path.insert(0, str(ROOT / "bench"))
    return load_script(f"bench/{name}.py", register=True)


R = _load("e2e_report")


def _row(model, bs, dtype, **kw):
    row = {k: None for k in R.FIELDS}
    row.update({"model": model, "bs": bs, "dtype": dtype, "errors": {}, **kw})
    return row


def test_row_plan_has_fp32_only_for_resnet50_and_bert():
    plan = R.row_plan(["resnet50", "gpt2"], [1, 32], ["fp16", "fp32"])
    assert plan == [("resnet50", 1, "fp16"), ("resnet50", 32, "fp16"), ("resnet50", 1, "fp32"), ("resnet50", 32, "fp32"),
                    ("gpt2", 1, "fp16"), ("gpt2", 32, "fp16")]


def test_tuning_complete_only_when_every_node_was_measured():
    prof = {"node": "a", "mode": "profiled", "timings": [{"status": "ok"}]}
    cached = {"node": "b", "mode": "cached", "timings": [{"status": "ok", "cached": True}]}
    all_failed = {"node": "c", "mode": "heuristic", "timings": [{"status": "pruned"}, {"status": "wrong_answer"}]}
    guessed = {"node": "d", "mode": "heuristic", "timings": []}
    timed_out = {"node": "e", "mode": "heuristic", "timings": [{"status": "timeout"}]}
    assert R.tuning_status({"mode": "profiled", "lowerings": [prof, cached, all_failed]})[0] is True
    assert R.tuning_status({"mode": "cached", "lowerings": [cached]})[0] is True
    done, summary = R.tuning_status({"mode": "profiled", "lowerings": [prof, guessed, timed_out]})
    assert done is False and summary["unmeasured_nodes"] == ["d", "e"]
    assert summary["node_modes"] == {"heuristic": 2, "profiled": 1}
    assert R.tuning_status({"mode": "none", "lowerings": [{"node": "x", "mode": "none"}]})[0] is False


def test_merge_replaces_by_key_and_adds_up_a_resumed_tuning():
    old = [_row("gpt2", 1, "fp16", graphopt_ms=9.0, tuning_complete=False, optimize_s=500.0),
           _row("resnet50", 32, "fp16", graphopt_ms=2.0, tuning_complete=True, optimize_s=50.0)]
    new = [_row("gpt2", 1, "fp16", graphopt_ms=1.0, tuning_complete=True, optimize_s=30.0),
           _row("resnet50", 1, "fp32", graphopt_ms=1.5)]
    rows = R.merge_rows(old, new)
    assert [(r["model"], r["bs"], r["dtype"]) for r in rows] == [("resnet50", 32, "fp16"), ("resnet50", 1, "fp32"),
                                                                  ("gpt2", 1, "fp16")]
    gpt2 = rows[-1]
    assert gpt2["graphopt_ms"] == 1.0 and gpt2["optimize_s_all_calls"] == 530.0
    assert "optimize_s_all_calls" not in rows[0]


def test_an_older_row_never_replaces_a_newer_one_and_merge_files_recomputes_the_checks(tmp_path):
    import json

    new = _row("resnet50", 32, "fp16", graphopt_ms=1.0, torch_compile_ms=1.5, tuning_complete=True,
               date="2026-12-05T07:49:24+00:00")
    stale = _row("resnet50", 32, "fp16", graphopt_ms=2.0, torch_compile_ms=1.5, tuning_complete=True,
                 date="2026-12-04T19:31:20+00:00")
    assert R.merge_rows([new], [stale])[0]["graphopt_ms"] == 1.0  # a later call's copy of the older row
    a, b, dest = tmp_path / "a.json", tmp_path / "b.json", tmp_path / "e2e.json"
    a.write_text(json.dumps({"rows": [new], "runs": [{"date": "2026-12-05T07:49:24+00:00"}]}))
    b.write_text(json.dumps({"rows": [stale], "runs": [{"date": "2026-12-04T19:31:20+00:00"}],
                             "acceptance": [{"check": "stale", "value": 9, "pass": False}]}))
    doc = R.merge_files(dest, [a, b])
    assert [r["graphopt_ms"] for r in doc["rows"]] == [1.0] and len(doc["runs"]) == 2
    check = {c["check"]: c for c in doc["acceptance"]}["resnet50 bs32 fp16: graphopt <= 0.8 x torch.compile (fully tuned)"]
    assert check["pass"] is True and json.loads(dest.read_text())["acceptance"] == doc["acceptance"]
    assert "| resnet50 | 32 | fp16 | 1.000 |" in dest.with_suffix(".md").read_text()


def test_acceptance_uses_compile_ratio_only_for_fully_tuned_rows():
    rows = [_row("resnet50", 32, "fp16", graphopt_ms=1.0, torch_compile_ms=1.5, tuning_complete=True,
                 graphopt_unoptimized_ms=1.2, host_us_per_node=9.0, max_rel_err_vs_torch=0.002),
            _row("gpt2", 1, "fp16", graphopt_ms=0.5, torch_compile_ms=0.9, tuning_complete=False, host_us_per_node=16.0),
            _row("bert", 1, "fp32", max_rel_err_vs_ort_cpu=2e-3)]
    checks = {c["check"]: c for c in R.acceptance(rows)}
    c = checks["resnet50 bs32 fp16: graphopt <= 0.8 x torch.compile (fully tuned)"]
    assert c["value"] == 0.667 and c["pass"] is True
    assert checks["gpt2 bs1 fp16: graphopt <= 0.8 x torch.compile (fully tuned)"]["pass"] is None  # not fully tuned
    assert checks["resnet50 bs32 fp16: optimized >= 1.3x unoptimized"]["pass"] is False  # 1.2
    assert checks["bert bs1 fp32: max rel err vs onnxruntime CPU <= 0.001"]["pass"] is False
    assert checks["host time per node without CUDA graphs <= 15 us (worst row)"]["value"] == 16.0


def test_markdown_and_saved_doc_round_trip(tmp_path):
    rows = [_row("gpt2", 32, "fp16", graphopt_ms=3.25, tuning_complete=False, optimize_s=12.0,
                 errors={"optimize": "tuning not finished within this call (400 s)"})]
    doc = {"gpu": "NVIDIA H200", "date": "2026-12-04T12:00:00+00:00", "command": "python3 bench/e2e.py",
           "runs": [{}], "rows": rows, "acceptance": R.acceptance(rows)}
    md = R.markdown(doc)
    assert "| gpt2 | 32 | fp16 | 3.250 |" in md and "| NO |" in md and "tuning not finished" in md
    path = tmp_path / "e2e_h200.json"
    R.write_atomic(path, json.dumps(doc))
    assert R.load_doc(path)["rows"] == rows and (path.stat().st_mode & 0o777) == 0o644
    assert R.load_doc(tmp_path / "missing.json") == {"rows": [], "runs": []}


def test_e2e_refuses_an_unknown_model_with_exit_2():
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "e2e.py"), "--models", "resnet51"],
                          capture_output=True, text=True)
    assert proc.returncode == 2 and "unknown model or dtype: resnet51" in proc.stderr


def test_rows_option_orders_the_run_and_rejects_a_malformed_row():
    e2e = _load("e2e")
    args = e2e.parse(["--rows", "efficientnet_b0:1,mobilenetv2:32,bert:1:fp32"])
    assert args.row_list == [("efficientnet_b0", 1, "fp16"), ("mobilenetv2", 32, "fp16"), ("bert", 1, "fp32")]
    assert args.models == ["efficientnet_b0", "mobilenetv2", "bert"] and args.dtypes == ["fp16", "fp32"]
    assert e2e.parse(["--models", "gpt2"]).row_list is None
    for bad in ("mobilenetv2", "mobilenetv2:x", "mobilenetv2:0", "nosuch:1", "gpt2:1:fp8"):
        try:
            e2e.parse(["--rows", bad])
        except SystemExit as e:
            assert e.code == 2
        else:
            raise AssertionError(f"--rows {bad} was accepted")


def test_dynamo_variants_are_rows_of_their_own_outside_the_acceptance():
    """``gpt2_dynamo`` builds GPT-2's module and exports it with dynamo: a row beside ``gpt2``'s, never one
    of issue 15's acceptance checks, and not in the default model list."""
    tm = _load("torch_models")
    e2e = _load("e2e")
    assert tm.base_model("gpt2_dynamo") == "gpt2" and tm.base_model("gpt2") == "gpt2"
    assert tm.input_shape("gpt2_dynamo", 4) == tm.input_shape("gpt2", 4) == "input=4x128"
    assert tm.input_shape("vit_b16_dynamo", 1) == "input=1x3x224x224"
    args = e2e.parse(["--rows", "gpt2_dynamo:1,gpt2:1"])
    assert args.row_list == [("gpt2_dynamo", 1, "fp16"), ("gpt2", 1, "fp16")]
    assert not any(m.endswith("_dynamo") for m in e2e.parse([]).models)
    checks = R.acceptance([_row("gpt2_dynamo", 1, "fp16", graphopt_ms=1.0, torch_compile_ms=1.0, tuning_complete=True,
                                graphopt_unoptimized_ms=3.0)])
    assert not any("gpt2_dynamo" in c["check"] and "torch.compile" in c["check"] for c in checks)
    assert any(c["check"] == "gpt2_dynamo bs1 fp16: optimized >= 1.3x unoptimized" and c["pass"] for c in checks)


def test_fused_nodes_ms_sums_the_chosen_candidates_and_counts_the_untimed():
    rep = {"lowerings": [
        {"lowering": "cudnn", "params": "plan=eng4", "timings": [{"candidate": "cudnn:plan=eng4", "ms": 0.25},
                                                                 {"candidate": "cudnn", "ms": 0.1}]},
        {"lowering": "rows", "params": "", "timings": [{"candidate": "rows", "ms": 0.5}]},
        {"lowering": "direct", "params": "opt=1", "timings": []},  # heuristic: nothing timed
    ]}
    total, missing = R.fused_nodes_ms(rep)
    assert total == pytest.approx(0.75) and missing == 1
    row = {"model": "m", "bs": 1, "dtype": "fp16", "fused_nodes_ms": 0.75}
    assert "fused nodes alone: 0.750 ms" in R.markdown({"rows": [row], "acceptance": []})


def test_a_row_with_every_barrier_kept_shows_what_the_rule_saves():
    """``e2e.py`` times the optimized model a second way, with the runtime's barrier rule switched off
    (``GRAPHOPT_KEEP_BARRIERS=1``), paired with the default: the table's notes say both."""
    row = {"model": "gpt2", "bs": 1, "dtype": "fp16", "graphopt_all_barriers_ms": 0.62,
           "paired_ratio_barrier_rule": 0.957, "barriers": {"kept": 12, "dropped": 36}}
    md = R.markdown({"rows": [row], "acceptance": []})
    assert "every barrier kept: 0.620 ms, paired 0.957 (36 of 48 dropped)" in md
    row.pop("paired_ratio_barrier_rule")
    row.pop("barriers")
    assert "every barrier kept: 0.620 ms |" in R.markdown({"rows": [row], "acceptance": []})


def test_models_outside_issue_15_are_rows_of_their_own():
    """``llama`` (and its dynamo export) is a benchmark model outside issue 15's set: no torch.compile acceptance
    check, not in e2e.py's default list, built from its own configuration."""
    tm = _load("torch_models")
    e2e = _load("e2e")
    assert "llama" in tm.ALL_MODELS and "llama_dynamo" in tm.ALL_MODELS and "llama" not in tm.MODELS
    assert tm.base_model("llama_dynamo") == "llama" and tm.input_shape("llama", 2) == "input=2x128"
    assert "llama" not in e2e.parse([]).models
    checks = R.acceptance([_row("llama_dynamo", 32, "fp16", graphopt_ms=1.0, torch_compile_ms=1.0, tuning_complete=True,
                                graphopt_unoptimized_ms=3.0)])
    assert not any("llama" in c["check"] and "torch.compile" in c["check"] for c in checks)
