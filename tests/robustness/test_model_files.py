"""Issue 6 part 1: every hostile model file is refused through the real CLI with a one-line error,
its documented exit code, no traceback, no output file, and every input byte unchanged."""

from __future__ import annotations

import pytest

from tests.conftest import run_graphopt
from tests.robustness._bad_models import CASES
from tests.robustness._cli import assert_refused, run_many, snapshot


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    root = tmp_path_factory.mktemp("bad-models")
    built = {}
    jobs = []
    for i, (name, build) in enumerate(CASES.items()):
        d = root / f"case{i}"
        d.mkdir()
        path, error = build(d)
        built[name] = (d, path, error)
        jobs.append((["optimize", str(path), "--gpu", "none", "-o", str(d / "out.onnx")], d))
    before = snapshot(root)
    runs = run_many(jobs, tmp_path_factory.mktemp("jobs"))
    after = snapshot(root)
    return {name: (built[name], r) for name, r in zip(CASES, runs)}, before, after, root


@pytest.mark.parametrize("name", list(CASES))
def test_refused_cleanly(results, name):
    by_name, before, after, root = results
    (d, path, error), r = by_name[name]
    assert_refused(r, error.exit_code, name)
    assert str(path) in r.stderr, "the message names the file"
    rel = str(d.relative_to(root))
    # no output, no temp file, every input (model, data files, links, outside targets) unchanged
    assert {k: v for k, v in after.items() if k.startswith(rel + "/") or k == rel} == {
        k: v for k, v in before.items() if k.startswith(rel + "/") or k == rel
    }
    assert not (d / "out.onnx").exists()


def test_forkrun_matches_a_fresh_interpreter(results, tmp_path):
    by_name, *_ = results
    for name in ("truncated at 1/2", "external: nested a/../../x", "cycle"):
        (d, path, error), r = by_name[name]
        fresh = run_graphopt("optimize", path, "--gpu", "none", "-o", tmp_path / "o.onnx")
        assert (fresh.returncode, fresh.stderr.strip()) == (r.returncode, r.stderr.strip())
