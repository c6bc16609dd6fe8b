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


def _two_instances(monkeypatch):
    from graphopt.kernels import registry, source

    if source.nvrtc_version() == "?":
        pytest.skip("NVRTC not importable")
    jobs = [("elementwise.cu", "spin"), ("elementwise.cu", source.instance("epilogue_gemm_vec", "float16", 8, 1))]
    monkeypatch.setattr(registry, "all_kernel_instances", lambda: jobs + jobs[:1])  # a repeat compiles once
    return jobs


def test_kernels_compiles_every_instance_once_into_the_kernel_cache(tmp_path, monkeypatch):
    """`graphopt cache kernels --arch sm_90` leaves each instance's cubin where get_kernel looks (no GPU
    needed), and a second run finds them all there."""
    from graphopt.kernels.source import cached_in

    jobs = _two_instances(monkeypatch)
    monkeypatch.setenv("GRAPHOPT_KERNEL_CACHE", str(tmp_path / "kc"))
    r = run("kernels", "--arch", "sm_90", "--workers", "1")
    assert r.exit_code == 0, r.output
    assert "2 kernel instances for sm_90" in r.output and "0 already there" in r.output and "compiled 2 in" in r.output
    assert cached_in(jobs, "sm_90") == [True, True] and cached_in(jobs, "sm_80") == [False, False]
    r = run("kernels", "--arch", "sm_90")
    assert r.exit_code == 0 and "2 already there" in r.output and "compiled 0 in" in r.output
    r = run("kernels", "--arch", "sm_80", "--workers", "2")  # the worker pool's path
    assert r.exit_code == 0 and "compiled 2 in" in r.output, r.output
    assert cached_in(jobs, "sm_80") == [True, True]


def test_kernels_says_which_instance_failed(tmp_path, monkeypatch):
    from graphopt.kernels import registry, source

    _two_instances(monkeypatch)
    monkeypatch.setattr(registry, "all_kernel_instances", lambda: [("elementwise.cu", "no_such_kernel<float>")])
    monkeypatch.setenv("GRAPHOPT_KERNEL_CACHE", str(tmp_path / "kc"))
    r = run("kernels", "--arch", "sm_90", "--workers", "1")
    assert r.exit_code == TuningError.exit_code, r.output
    assert "1 kernel instance(s) failed to compile for sm_90, the first: elementwise.cu no_such_kernel<float>" in r.output
    assert r.output.count("graphopt: error:") == 1 and "Traceback" not in r.output
    assert source.cached_in([("elementwise.cu", "no_such_kernel<float>")], "sm_90") == [False]


@pytest.mark.parametrize("arch", ["foo", "90", "sm90", "compute_90"])
def test_kernels_refuses_what_is_not_an_architecture(arch, monkeypatch):
    monkeypatch.setattr("graphopt.kernels.registry.all_kernel_instances", lambda: pytest.fail("nothing compiles"))
    r = run("kernels", "--arch", arch)
    assert r.exit_code == 2 and "--arch" in r.output and "sm_90" in r.output


def test_kernels_without_a_gpu_asks_for_the_architecture(monkeypatch):
    import graphopt.kernels.source as source

    monkeypatch.setattr(source, "device_arch", lambda: (_ for _ in ()).throw(RuntimeError("no CUDA device")))
    r = run("kernels")
    assert r.exit_code == 2 and "give --arch" in r.output


def test_kernels_says_when_the_cache_cannot_be_written(tmp_path, monkeypatch):
    _two_instances(monkeypatch)
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("GRAPHOPT_KERNEL_CACHE", str(blocker / "kc"))  # under a file: never writable, even as root
    r = run("kernels", "--arch", "sm_90", "--workers", "1")
    assert r.exit_code == TuningError.exit_code, r.output
    assert "could not be written to" in r.output and "GRAPHOPT_KERNEL_CACHE" in r.output


def test_a_name_without_its_cubin_is_not_cached(tmp_path, monkeypatch):
    """A write cut between an instance's two files leaves ``<key>.name`` alone: that is no cached kernel,
    and `cache kernels` compiles it again."""
    from graphopt.kernels.source import cached_in, cubin_cache_key, nvrtc_version

    jobs = _two_instances(monkeypatch)
    kc = tmp_path / "kc"
    kc.mkdir()
    monkeypatch.setenv("GRAPHOPT_KERNEL_CACHE", str(kc))
    (kc / (cubin_cache_key(*jobs[0], "sm_90", nvrtc_version()) + ".name")).write_text("orphan")
    assert cached_in(jobs, "sm_90") == [False, False]
    r = run("kernels", "--arch", "sm_90", "--workers", "1")
    assert r.exit_code == 0 and "0 already there" in r.output and "compiled 2 in" in r.output, r.output
