"""The sqlite tuning cache: keys, round trips, distrust of bad files, export/import, concurrency (CPU)."""

from __future__ import annotations

import json
import math
import multiprocessing
import os
import sqlite3
import warnings
from pathlib import Path

import pytest

from graphopt.errors import TuningError
from graphopt.tune.cache import TuningCache, TuningCacheWarning
from graphopt.tune.cache_file import CACHE_FILE, SCHEMA_VERSION, default_cache_dir
from graphopt.tune.cache_record import TimingRecord
from graphopt.tune.gpus import DeviceFingerprint

FP = DeviceFingerprint("h200", "9.0", "13.0", "13.0", "14.2.0")
SIG = "CBR|1x64x56x56;64x64x3x3;64;-|float16,float16,float16,|activation=Relu,group=1|NCHW"


def rec(candidate="implicit_gemm:bm=128,bn=64", ms=0.25, fp=FP, sig=SIG, source_hash="abc", **kw):
    name, _, params = candidate.partition(":")
    return TimingRecord(gpu=fp.gpu, compute_capability=fp.compute_capability, driver=fp.driver, cuda=fp.cuda,
                        cupy=fp.cupy, source_hash=source_hash, candidate=candidate, signature=sig,
                        op=sig.split("|")[0], lowering=name, params=params, ms=ms, **kw)


@pytest.fixture
def path(tmp_path):
    return tmp_path / "cache" / CACHE_FILE


def quiet(path) -> TuningCache:
    """Open expecting no warning at all."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        return TuningCache(path)


def test_default_dir_precedence(monkeypatch, tmp_path):
    monkeypatch.delenv("GRAPHOPT_CACHE_DIR", raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert default_cache_dir() == tmp_path / "home" / ".cache" / "graphopt"
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/ignored")
    assert default_cache_dir() == tmp_path / "home" / ".cache" / "graphopt"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_cache_dir() == tmp_path / "xdg" / "graphopt"
    monkeypatch.setenv("GRAPHOPT_CACHE_DIR", str(tmp_path / "mine"))
    assert default_cache_dir() == tmp_path / "mine"
    c = quiet(None)
    assert c.path == tmp_path / "mine" / CACHE_FILE and c.path.exists()
    c.close()


def test_round_trip_keeps_every_timing_and_failures(path):
    records = [
        rec(ms=0.25, samples=(0.26, 0.25, 0.24)),
        rec("direct", ms=1.5, samples=(1.5,)),
        rec("gemm_cublas", ms=math.inf, status="build_failed", reason="nvrtc: error: bad"),
        rec("tiled:bm=64", ms=math.inf, status="crashed", reason="worker process died (SIGSEGV)"),
    ]
    with quiet(path) as c:
        assert c.put_many(records) == 4
        assert len(c) == 4
    assert oct(path.stat().st_mode & 0o777) == "0o600"
    with quiet(path) as c:
        got = {r.candidate: r for r in c.entries()}
    assert set(got) == {r.candidate for r in records}
    assert got["implicit_gemm:bm=128,bn=64"].samples == (0.26, 0.25, 0.24)
    assert got["implicit_gemm:bm=128,bn=64"].ms == 0.25 and got["implicit_gemm:bm=128,bn=64"].status == "ok"
    bad = got["gemm_cublas"]
    assert math.isinf(bad.ms) and not bad.ok and bad.status == "build_failed" and bad.reason == "nvrtc: error: bad"
    assert got["tiled:bm=64"].status == "crashed"


def test_key_distinguishes_every_field(path):
    variants = [
        rec(), rec(fp=DeviceFingerprint("a100", "9.0", "13.0", "13.0", "14.2.0")),
        rec(fp=DeviceFingerprint("h200", "9.1", "13.0", "13.0", "14.2.0")),
        rec(fp=DeviceFingerprint("h200", "9.0", "12.8", "13.0", "14.2.0")),
        rec(fp=DeviceFingerprint("h200", "9.0", "13.0", "12.8", "14.2.0")),
        rec(fp=DeviceFingerprint("h200", "9.0", "13.0", "13.0", "13.6.0")),
        rec(source_hash="other"), rec(candidate="implicit_gemm:bm=64,bn=64"), rec(sig=SIG.replace("1x64", "2x64")),
    ]
    with quiet(path) as c:
        c.put_many(variants)
        assert len(c) == len(variants)
        c.put(rec(ms=0.5))  # same key as variants[0]: replaced, not added
        assert len(c) == len(variants)
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # the other-version entries sit beside a valid one: no warning
            assert c.lookup(FP, SIG, {"implicit_gemm:bm=128,bn=64": "abc"})["implicit_gemm:bm=128,bn=64"].ms == 0.5


def test_lookup_ignores_other_versions_and_changed_sources_with_a_warning(path):
    old = DeviceFingerprint("h200", "9.0", "12.4", "12.4", "13.0.0")
    with quiet(path) as c:
        c.put_many([rec("direct", ms=0.1, fp=old, source_hash="s1"), rec("implicit_gemm:bm=128,bn=64", source_hash="s0")])
        with pytest.warns(TuningCacheWarning, match="driver 12.4"):
            assert c.lookup(FP, SIG, {"direct": "s1"}) == {}
        with pytest.warns(TuningCacheWarning, match="another kernel source"):
            assert c.lookup(FP, SIG, {"implicit_gemm:bm=128,bn=64": "s1"}) == {}
        assert list(c.lookup(FP, SIG, {"implicit_gemm:bm=128,bn=64": "s0"})) == ["implicit_gemm:bm=128,bn=64"]
        # another GPU model's entries are simply not this GPU's: no result
        a100 = DeviceFingerprint("a100", "8.0", "13.0", "13.0", "14.2.0")
        assert c.lookup(a100, SIG, {"direct": "s1", "implicit_gemm:bm=128,bn=64": "s0"}) == {}


def test_best_for_gpu(path):
    with quiet(path) as c:
        c.put_many([rec("a", ms=0.3), rec("b", ms=0.2), rec("c", ms=math.inf, status="timeout"),
                    rec("d", ms=0.1, fp=DeviceFingerprint("a100", "8.0", "1", "1", "1"))])
        best, records = c.best_for_gpu("h200", SIG)
        assert best.candidate == "b" and len(records) == 3
        with pytest.warns(TuningCacheWarning, match="another kernel source"):
            best, _ = c.best_for_gpu("h200", SIG, source_hashes={"b": "changed"})
        assert best.candidate == "a"
        assert c.best_for_gpu("h200", "nope") == (None, [])


def _moved_aside(path: Path) -> list[Path]:
    return sorted(p for p in path.parent.iterdir() if p.name.startswith(CACHE_FILE + ".bad-"))


def _assert_rebuilt(path, match):
    with pytest.warns(TuningCacheWarning, match=match):
        c = TuningCache(path)
    assert len(c) == 0
    c.put(rec())
    assert len(c) == 1
    assert any("none of its timings are used" in m for m in c.messages)
    c.close()
    assert _moved_aside(path), "the untrusted file was not kept aside for inspection"


def test_garbage_file_is_moved_aside_and_rebuilt(path):
    path.parent.mkdir(parents=True)
    path.write_bytes(os.urandom(5000))
    os.chmod(path, 0o600)
    _assert_rebuilt(path, "corrupt or truncated")


def test_truncated_file_is_moved_aside_and_rebuilt(path):
    with quiet(path) as c:
        c.put_many([rec(f"cand{i}", ms=float(i + 1), reason="x" * 200) for i in range(400)])
    size = path.stat().st_size
    assert size > 8192 and not Path(str(path) + "-wal").exists()
    with open(path, "r+b") as f:
        f.truncate(size // 2)
    _assert_rebuilt(path, "corrupt or truncated|integrity")


def test_flipped_page_bytes_are_caught(path):
    with quiet(path) as c:
        c.put_many([rec(f"cand{i}", ms=float(i + 1), reason="y" * 300) for i in range(300)])
    data = bytearray(path.read_bytes())
    page = 4096
    for off in range(2 * page, len(data), page):  # scribble over every b-tree page header past the root
        data[off:off + 12] = b"\xff" * 12
    path.write_bytes(bytes(data))
    _assert_rebuilt(path, "corrupt|integrity")


def test_damage_seen_only_when_reading_is_distrusted_too(path):
    with quiet(path) as c:
        c.put(rec())
        c._conn.execute("UPDATE timings SET samples = 'not json'")  # a row no graphopt writes
        with pytest.warns(TuningCacheWarning, match="is corrupt"):
            assert c.entries() == []
        c.put(rec())
        assert len(c) == 1


def test_old_schema_is_moved_aside(path):
    path.parent.mkdir(parents=True)
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE schema_version (version INTEGER)")
    conn.execute("INSERT INTO schema_version VALUES (0)")
    conn.execute("CREATE TABLE timings (gpu TEXT)")
    conn.commit()
    conn.close()
    _assert_rebuilt(path, f"schema version \\[0\\], this graphopt uses {SCHEMA_VERSION}")


def test_foreign_sqlite_file_is_moved_aside(path):
    path.parent.mkdir(parents=True)
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE photos (id INTEGER)")
    conn.commit()
    conn.close()
    _assert_rebuilt(path, "no schema_version table")


def test_world_writable_file_is_refused(path):
    with quiet(path) as c:
        c.put(rec(ms=0.000001))  # a planted "fastest" timing
    os.chmod(path, 0o666)
    _assert_rebuilt(path, "world-writable")
    with quiet(path) as c:
        assert [r.ms for r in c.entries()] == [0.25]  # only the entry written after the rebuild
    assert oct(path.stat().st_mode & 0o777) == "0o600"


def test_symlinked_file_is_refused(path, tmp_path):
    target = tmp_path / "elsewhere.sqlite3"
    with quiet(target) as c:
        c.put(rec())
    path.parent.mkdir(parents=True)
    os.symlink(target, path)
    _assert_rebuilt(path, "symbolic link")
    assert target.exists()


def test_export_import_round_trip(path, tmp_path):
    a100 = DeviceFingerprint("a100", "8.0", "12.4", "12.4", "13.3.0")
    records = [rec(ms=0.25, samples=(0.2, 0.3)), rec("direct", ms=math.inf, status="wrong_answer", reason="max err 3"),
               rec("direct", ms=0.7, fp=a100)]
    out = tmp_path / "export.json"
    with quiet(path) as c:
        c.put_many(records)
        assert c.export(out) == 3
        assert c.export(tmp_path / "a100.json", gpu="a100") == 1
    doc = json.loads(out.read_text())
    assert doc["format"] == "graphopt-tuning-cache" and doc["schema_version"] == SCHEMA_VERSION
    assert [e["ms"] for e in doc["entries"] if e["candidate"] == "direct" and e["gpu"] == "h200"] == [None]
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
    with quiet(tmp_path / "b" / CACHE_FILE) as other:
        assert other.import_(out) == 3
        got = sorted((r.gpu, r.candidate, r.ms, r.status, r.reason, r.samples, r.origin) for r in other.entries())
    want = sorted((r.gpu, r.candidate, r.ms, r.status, r.reason, r.samples, "imported") for r in records)
    assert got == want
    # export is deterministic apart from nothing: same entries -> same bytes
    with quiet(tmp_path / "b" / CACHE_FILE) as other:
        other.export(tmp_path / "again.json")
    again = json.loads((tmp_path / "again.json").read_text())
    assert [{k: v for k, v in e.items() if k != "origin"} for e in again["entries"]] == \
        [{k: v for k, v in e.items() if k != "origin"} for e in doc["entries"]]


def test_import_never_overwrites_local_measurements(path, tmp_path):
    with quiet(tmp_path / "remote" / CACHE_FILE) as remote:
        remote.put(rec(ms=9.0))
        remote.export(tmp_path / "remote.json")
    with quiet(path) as c:
        c.put(rec(ms=0.25))
        c.import_(tmp_path / "remote.json")
        assert [(r.ms, r.origin) for r in c.entries()] == [(0.25, "local")]


@pytest.mark.parametrize("text, match", [
    ("not json", "not JSON"),
    ("[]", "not a graphopt cache export"),
    ('{"format": "graphopt-tuning-cache", "schema_version": 99, "entries": []}', "schema version 99"),
    ('{"format": "graphopt-tuning-cache", "schema_version": 1, "entries": {}}', "must be a list"),
    ('{"format": "graphopt-tuning-cache", "schema_version": 1, "entries": [1]}', "entry 0 is not an object"),
])
def test_import_rejects_bad_documents(path, tmp_path, text, match):
    f = tmp_path / "bad.json"
    f.write_text(text)
    with quiet(path) as c:
        with pytest.raises(TuningError, match=match):
            c.import_(f)
        assert len(c) == 0


@pytest.mark.parametrize("field, value", [("gpu", 3), ("ms", -1), ("ms", "fast"), ("samples", ["x"]), ("signature", None)])
def test_import_validates_every_entry_before_storing_any(path, tmp_path, field, value):
    good = rec().to_json()
    bad = dict(good, candidate="other")
    bad[field] = value
    f = tmp_path / "bad.json"
    f.write_text(json.dumps({"format": "graphopt-tuning-cache", "schema_version": 1, "entries": [good, bad]}))
    with quiet(path) as c:
        with pytest.raises(TuningError, match=f"entry 1: field '{field}'"):
            c.import_(f)
        assert len(c) == 0


def test_import_missing_file(path, tmp_path):
    with quiet(path) as c, pytest.raises(TuningError, match="not found"):
        c.import_(tmp_path / "missing.json")


def test_clear_and_stats(path):
    a100 = DeviceFingerprint("a100", "8.0", "12.4", "12.4", "13.3.0")
    with quiet(path) as c:
        c.put_many([rec("a"), rec("b", ms=math.inf, status="timeout"), rec("c", fp=a100)])
        stats = c.stats()
        assert [(s["gpu"], s["entries"], s["signatures"], s["failures"]) for s in stats] == [("a100", 1, 1, 0), ("h200", 2, 1, 1)]
        assert c.clear("h200") == 2 and len(c) == 1
        assert c.clear() == 1 and len(c) == 0


def _writer(path: str, worker: int, n: int, batch: int) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a worker that distrusts the file fails the test
        c = TuningCache(path)
        for start in range(0, n, batch):
            c.put_many([rec(f"w{worker}:i={i}", ms=float(worker * 1000 + i + 1)) for i in range(start, start + batch)])
            c.lookup(FP, SIG, {f"w{worker}:i={start}": "abc"})
        c.close()


def test_16_concurrent_writers_leave_a_complete_valid_cache(path):
    ctx = multiprocessing.get_context("fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn")
    workers, n, batch = 16, 40, 5
    procs = [ctx.Process(target=_writer, args=(str(path), w, n, batch)) for w in range(workers)]
    for p in procs:  # all start before the file exists: they race to create the schema too
        p.start()
    for p in procs:
        p.join(120)
    assert [p.exitcode for p in procs] == [0] * workers
    assert not _moved_aside(path)
    with quiet(path) as c:
        entries = c.entries()
        assert len(entries) == workers * n
        assert {r.candidate for r in entries} == {f"w{w}:i={i}" for w in range(workers) for i in range(n)}
        assert all(r.ms == float(int(r.candidate[1:].split(":")[0]) * 1000 + int(r.candidate.split("=")[1]) + 1)
                   for r in entries)
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
    conn.close()


def _open_corrupt(path: str, barrier) -> None:
    barrier.wait()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        c = TuningCache(path)
        c.put(rec(f"from-{os.getpid()}"))
        c.close()


def test_many_processes_finding_one_corrupt_file_rebuild_it_once(path):
    path.parent.mkdir(parents=True)
    path.write_bytes(os.urandom(8192))
    os.chmod(path, 0o600)
    ctx = multiprocessing.get_context("fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn")
    barrier = ctx.Barrier(8)
    procs = [ctx.Process(target=_open_corrupt, args=(str(path), barrier)) for _ in range(8)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    assert [p.exitcode for p in procs] == [0] * 8
    with quiet(path) as c:
        # nobody's rebuilt cache was moved aside by a slower process: all 8 entries are there
        assert len(c) == 8
