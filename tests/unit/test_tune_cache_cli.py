"""`graphopt cache show|clear|export|import` through click's CliRunner (CPU)."""

from __future__ import annotations

import json
import math

import pytest
from click.testing import CliRunner

from graphopt.errors import TuningError
from graphopt.tune.cache import TuningCache
from graphopt.tune.cache_cli import cache as cache_group
from graphopt.tune.cache_file import CACHE_FILE
from graphopt.tune.cache_record import TimingRecord


def rec(gpu, candidate, ms, sig="CBR|1x8x8x8;8x8x3x3;-;-|float32,float32,,|group=1|NCHW", **kw):
    name, _, params = candidate.partition(":")
    return TimingRecord(gpu=gpu, compute_capability="9.0", driver="13.0", cuda="13.0", cupy="14.2.0", source_hash="s",
                        candidate=candidate, signature=sig, op="CBR", lowering=name, params=params, ms=ms, **kw)


@pytest.fixture
def env(tmp_path, monkeypatch):
    monkeypatch.setenv("GRAPHOPT_CACHE_DIR", str(tmp_path / "cache"))
    with TuningCache(tmp_path / "cache" / CACHE_FILE) as c:
        c.put_many([rec("h200", "direct", 0.5), rec("h200", "implicit_gemm:bm=64", 0.2),
                    rec("h200", "gemm_cublas", math.inf, status="build_failed", reason="nvrtc"),
                    rec("a100", "direct", 0.9)])
    return tmp_path


def run(*args, input=None):
    return CliRunner().invoke(cache_group, list(args), input=input, catch_exceptions=True)


def test_show_table_and_json(env):
    r = run("show")
    assert r.exit_code == 0, r.output
    assert str(env / "cache" / CACHE_FILE) in r.output and "(4 timings)" in r.output
    assert "h200" in r.output and "a100" in r.output
    r = run("show", "--json", "--gpu", "NVIDIA H200", "--entries")
    doc = json.loads(r.output)
    assert [d["gpu"] for d in doc["devices"]] == ["h200"] and doc["devices"][0]["failures"] == 1
    assert sorted(e["candidate"] for e in doc["entries"]) == ["direct", "gemm_cublas", "implicit_gemm:bm=64"]


def test_export_import_between_machines(env, tmp_path, monkeypatch):
    out = tmp_path / "h200.json"
    r = run("export", str(out), "--gpu", "h200")
    assert r.exit_code == 0 and "exported 3 timings" in r.output
    monkeypatch.setenv("GRAPHOPT_CACHE_DIR", str(tmp_path / "elsewhere"))
    r = run("import", str(out))
    assert r.exit_code == 0, r.output
    assert "imported 3 timings" in r.output and "h200" in r.output
    with TuningCache(tmp_path / "elsewhere" / CACHE_FILE) as c:
        best, _ = c.best_for_gpu("h200", "CBR|1x8x8x8;8x8x3x3;-;-|float32,float32,,|group=1|NCHW")
        assert best.candidate == "implicit_gemm:bm=64" and best.origin == "imported"


def test_clear(env):
    r = run("clear", "--gpu", "a100", "--yes")
    assert r.exit_code == 0 and "deleted 1 timing " in r.output
    r = run("clear", input="n\n")
    assert r.exit_code != 0  # aborted: nothing deleted
    assert "(3 timings)" in run("show").output
    r = run("clear", input="y\n")
    assert r.exit_code == 0 and "deleted 3 timings" in r.output


def test_cache_dir_option_and_warnings_on_a_bad_file(tmp_path):
    folder = tmp_path / "custom"
    folder.mkdir()
    (folder / CACHE_FILE).write_bytes(b"this is not sqlite" * 100)
    (folder / CACHE_FILE).chmod(0o600)
    r = CliRunner().invoke(cache_group, ["--cache-dir", str(folder), "show"])
    assert r.exit_code == 0
    assert "graphopt: warning: tuning cache" in r.output and "moved aside" in r.output
    assert "(0 timings)" in r.output


def test_bad_import_file_is_a_tuning_error(env, tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"format": "something else"}')
    r = run("import", str(bad))
    assert r.exit_code == TuningError.exit_code
    assert r.output.startswith("graphopt: error: cache import file") and "not a graphopt cache export" in r.output
    assert r.output.count("\n") == 1 and "Traceback" not in r.output
    r = run("show", "--gpu", "h300")
    assert r.exit_code == 2 and "unknown GPU name 'h300'" in r.output and "did you mean h200 or h100" in r.output
    r = run("show", "--gpu", "auto")
    assert r.exit_code == 2  # usage error
