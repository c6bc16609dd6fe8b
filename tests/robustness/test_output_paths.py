"""Issue 21 items 1, 4, 5, 8 and issue 16's output items, through the real ``graphopt`` command:

- every path the command writes (model, external data, report, cache export) is checked against every
  path it reads and every other path it writes, by device and inode, before any work: an output that is
  an input is refused with exit 8, two outputs that are one file with exit 2; nothing is written;
- a report in a missing folder, a folder given as -o or --report, and an existing read-only output
  (without --force) are refused before any work, one line each: all outputs are written or none;
- outputs are created 0644 under umask 022 (model, external data, report, cache export);
- user text (a model path or node name such as ``x[/]``) is never read as rich markup, so nothing can
  fail after the output is committed.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import onnx
import pytest

from tests.robustness._cli import assert_refused, run_many, snapshot
from tests.robustness._models import conv_relu, externalize


def _model(folder: Path, name: str = "m.onnx", external: str | None = None) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    m = conv_relu()
    if external:
        m = externalize(m, folder, external)
    p = folder / name
    p.write_bytes(m.SerializeToString())
    return p


def _collision_cases(root: Path):
    """(label, folder, argv, exit code)"""
    cases = []

    def case(label, code, argv_fn, **kw):
        d = root / f"c{len(cases)}"
        m = _model(d, **kw)
        cases.append((label, d, [str(a) for a in argv_fn(d, m)], code))

    case("--report = the input model", 8, lambda d, m: [m, "-o", d / "o.onnx", "--report", m])
    case("--report = the input through another spelling", 8,
         lambda d, m: [m, "-o", d / "o.onnx", "--report", f"{d}/./{m.name}"])
    case("--report = a hard link to the input", 8,
         lambda d, m: (os.link(m, d / "h.json"), [m, "-o", d / "o.onnx", "--report", d / "h.json"])[1])
    case("--report = the input's external data file", 8,
         lambda d, m: [m, "-o", d / "o.onnx", "--report", d / "w.bin"], external="w.bin")
    case("--report = a --rules file", 8,
         lambda d, m: ((d / "r.toml").write_text("# no rules\n"),
                       [m, "-o", d / "o.onnx", "--rules", d / "r.toml", "--report", d / "r.toml"])[1])
    case("--report = a file inside a --rules folder", 8,
         lambda d, m: ((d / "rules").mkdir(), (d / "rules" / "r.toml").write_text("# no rules\n"),
                       [m, "-o", d / "o.onnx", "--rules", d / "rules", "--report", d / "rules" / "r.toml"])[2])
    case("-o = a --rules file", 8,
         lambda d, m: ((d / "r.toml").write_text("# no rules\n"), [m, "-o", d / "r.toml", "--rules", d / "r.toml"])[1])
    case("--report = -o (new file)", 2, lambda d, m: [m, "-o", d / "o.onnx", "--report", d / "o.onnx"])
    case("--report = -o (existing file, other spelling)", 2,
         lambda d, m: ((d / "o.onnx").write_bytes(b"old"), [m, "-o", d / "o.onnx", "--report", f"{d}/./o.onnx"])[1])
    case("--report = the default output MODEL.opt.onnx", 2, lambda d, m: [m, "--report", d / "m.opt.onnx"])
    case("--report = the output's external data file", 2,
         lambda d, m: [m, "-o", d / "o.onnx", "--report", d / "o.onnx.data"])
    case("--report = a symlink to -o", 2,
         lambda d, m: ((d / "o.onnx").write_bytes(b"old"), os.symlink("o.onnx", d / "l.json"),
                       [m, "-o", d / "o.onnx", "--report", d / "l.json"])[2])
    case("the output's data file = the input model", 8, lambda d, m: [m, "-o", d / "m"], name="m.data")
    case("--report in a folder that does not exist", 11,
         lambda d, m: [m, "-o", d / "o.onnx", "--report", d / "missing" / "r.json"])
    case("--report is a folder", 2, lambda d, m: ((d / "dir").mkdir(), [m, "-o", d / "o.onnx", "--report", d / "dir"])[1])
    case("-o is a folder", 2, lambda d, m: ((d / "dir").mkdir(), [m, "-o", d / "dir"])[1])
    case("-o is an existing read-only file", 8,
         lambda d, m: ((d / "o.onnx").write_bytes(b"old"), (d / "o.onnx").chmod(0o444), [m, "-o", d / "o.onnx"])[2])
    case("--report is an existing read-only file", 8,
         lambda d, m: ((d / "r.json").write_bytes(b"old"), (d / "r.json").chmod(0o444),
                       [m, "-o", d / "o.onnx", "--report", d / "r.json"])[2])
    return cases


def test_every_output_path_is_checked_before_any_work(tmp_path):
    cases = _collision_cases(tmp_path / "cases")
    before = snapshot(tmp_path / "cases")
    runs = run_many([(["optimize", *argv, "--gpu", "none"], d) for _, d, argv, _ in cases], tmp_path)
    for (label, d, argv, code), r in zip(cases, runs):
        assert_refused(r, code, label)
    assert snapshot(tmp_path / "cases") == before  # nothing written, nothing changed, no temp files


def test_report_messages_name_the_option(tmp_path):
    m = _model(tmp_path)
    (r,) = run_many([(["optimize", m, "--gpu", "none", "--report", m], tmp_path)], tmp_path)
    assert "--report" in r.stderr and "refusing to overwrite the input" in r.stderr
    (r,) = run_many([(["optimize", m, "--gpu", "none", "--report", tmp_path / "nope" / "r.json"], tmp_path)], tmp_path)
    assert "does not exist" in r.stderr and "nothing was written" in r.stderr
    assert not (tmp_path / "m.opt.onnx").exists()


def test_force_replaces_a_read_only_output(tmp_path):
    m = _model(tmp_path)
    out, rep = tmp_path / "o.onnx", tmp_path / "r.json"
    for p in (out, rep):
        p.write_bytes(b"old")
        p.chmod(0o444)
    (r,) = run_many([(["optimize", m, "--gpu", "none", "-q", "-o", out, "--report", rep, "--force"], tmp_path)], tmp_path)
    assert r.returncode == 0, r.stderr
    onnx.checker.check_model(onnx.load(str(out)))
    assert json.loads(rep.read_text())["output"] == str(out)


@pytest.fixture
def umask022():
    old = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(old)


def test_outputs_get_normal_permissions(tmp_path, umask022):
    """0644 under umask 022: the model, its external data, the report and a cache export."""
    m = _model(tmp_path)
    out, rep = tmp_path / "o.onnx", tmp_path / "r.json"
    cache_dir, export = tmp_path / "cache", tmp_path / "export.json"
    jobs = [
        (["optimize", m, "--gpu", "none", "-q", "-o", out, "--report", rep], tmp_path),
        (["cache", "--cache-dir", cache_dir, "export", export], tmp_path),
    ]
    runs = run_many(jobs, tmp_path)
    assert [r.returncode for r in runs] == [0, 0], [r.stderr for r in runs]
    for p in (out, rep, export):
        assert stat.S_IMODE(p.stat().st_mode) == 0o644, (p, oct(p.stat().st_mode))


def test_external_data_output_gets_normal_permissions(tmp_path, umask022):
    from graphopt.ir.io import save_model

    out = tmp_path / "o.onnx"
    save_model(conv_relu(), out, size_threshold=10, min_external_tensor_bytes=16)
    for p in (out, tmp_path / "o.onnx.data"):
        assert stat.S_IMODE(p.stat().st_mode) == 0o644, p


def test_cache_export_onto_the_cache_itself_is_refused(tmp_path):
    cache_dir = tmp_path / "cache"
    (r0,) = run_many([(["cache", "--cache-dir", cache_dir, "show"], tmp_path)], tmp_path)
    assert r0.returncode == 0, r0.stderr
    before = snapshot(cache_dir)
    names = sorted(before)
    assert "tuning.sqlite3" in names
    runs = run_many([(["cache", "--cache-dir", cache_dir, "export", cache_dir / n], tmp_path) for n in names], tmp_path)
    for n, r in zip(names, runs):
        assert_refused(r, 8, f"cache export onto {n}")
    assert snapshot(cache_dir) == before


def test_markup_in_paths_and_names_is_printed_verbatim(tmp_path):
    """A folder, model file and node named with rich markup (``[/]``, ``[bold]``): the summary and
    --explain print them as they are; exit 0, the output on disk, nothing after it fails."""
    d = tmp_path / "a[" / "]b[bold]"  # the path reads .../a[/]b[bold]/...
    d.mkdir(parents=True)
    m = conv_relu()
    m.graph.node[0].name = "conv[/]x"
    m.graph.node[1].name = "[red]relu[/red]"
    src = d / "m[i].onnx"
    src.write_bytes(m.SerializeToString())
    (r,) = run_many([(["optimize", src, "--gpu", "none", "--explain", "--report", d / "r[i].json"], d)], tmp_path)
    assert r.returncode == 0, r.stderr
    assert "a[/]b[bold]/m[i].onnx" in r.stdout and "conv[/]x" in r.stdout and "[red]relu[/red]" in r.stdout + json.dumps(json.loads((d / "r[i].json").read_text()))
    assert (d / "m[i].opt.onnx").exists()
    (r,) = run_many([(["inspect", src], d)], tmp_path)
    assert r.returncode == 0 and "a[/]b[bold]/m[i].onnx" in r.stdout, r.stderr
