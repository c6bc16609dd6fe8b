"""graphopt.providers.library_files: which files a provider's first use reads ahead, once per process."""

from pathlib import Path

import pytest

from graphopt.providers import library_files as lf

MAPS = """\
7f00-7f01 r--p 00000000 08:01 11 /opt/nv/cudnn/lib/libcudnn.so.9
7f01-7f02 r-xp 00001000 08:01 11 /opt/nv/cudnn/lib/libcudnn.so.9
7f02-7f03 r--p 00000000 08:01 12 /usr/lib/libc.so.6
7f03-7f04 rw-p 00000000 00:00 0
7f04-7f05 r--p 00000000 00:00 0 [heap]
7f05-7f06 r--p 00000000 08:01 13 /tmp/data.bin
"""


def test_mapped_libraries_are_the_shared_objects_once_in_order():
    assert lf.mapped_libraries(MAPS) == [Path("/opt/nv/cudnn/lib/libcudnn.so.9"), Path("/usr/lib/libc.so.6")]


def test_library_files_adds_unmapped_siblings_of_the_prefix_only(tmp_path):
    for name in ("libcudnn.so.9", "libcudnn_engines_precompiled.so.9", "libcudnn_graph.so.9", "libcublasLt.so.13",
                 "libcudnn_readme.txt"):
        (tmp_path / name).write_bytes(b"x")
    (tmp_path / "libcudnn_dir.so").mkdir()
    mapped = [tmp_path / "libcudnn.so.9", Path("/usr/lib/libc.so.6")]
    got = lf.library_files(["libcudnn"], mapped)
    assert got == [tmp_path / "libcudnn.so.9", tmp_path / "libcudnn_engines_precompiled.so.9",
                   tmp_path / "libcudnn_graph.so.9"]


def test_library_files_without_a_mapped_library_is_empty(tmp_path):
    (tmp_path / "libcudnn.so.9").write_bytes(b"x")
    assert lf.library_files(["libcudnn"], [Path("/usr/lib/libc.so.6")]) == []


def test_read_ahead_tolerates_a_missing_file(tmp_path):
    lf.read_ahead(tmp_path / "gone.so")  # no error
    f = tmp_path / "lib.so"
    f.write_bytes(b"\0" * 4096)
    lf.read_ahead(f)
    assert f.read_bytes() == b"\0" * 4096  # read only, never written


def test_prefetch_runs_once_per_prefix_and_can_be_turned_off(monkeypatch):
    monkeypatch.setattr(lf, "_started", set())
    calls = []
    monkeypatch.setattr(lf, "read_ahead", calls.append)
    monkeypatch.setenv(lf.ENV, "0")
    assert lf.prefetch("libc") is None and calls == []
    monkeypatch.delenv(lf.ENV)
    t = lf.prefetch("libc")  # the test process maps libc
    assert t is not None
    t.join(10)
    assert any(p.name.startswith("libc") for p in calls)
    assert lf.prefetch("libc") is None  # once per process


def test_prefetch_of_a_library_not_loaded_starts_nothing(monkeypatch):
    monkeypatch.setattr(lf, "_started", set())
    assert lf.prefetch("libgraphopt_not_a_library") is None


@pytest.mark.parametrize("value,on", [("1", True), ("", True), ("0", False), ("off", False), ("false", False)])
def test_enabled_reads_the_environment(monkeypatch, value, on):
    monkeypatch.setenv(lf.ENV, value)
    assert lf.enabled() is on
