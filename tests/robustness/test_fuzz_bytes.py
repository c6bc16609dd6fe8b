"""Issue 6 part 5, second fuzzer: byte-mutated copies of the valid sample models (models/*.onnx) run
through the real CLI (``graphopt optimize``, half of them with ``--verify``).

For every case: the process ends before its timeout (a hang is killed and fails the test), it never
prints a traceback or an internal error (exit 1), its exit code is one of the documented ones
(``graphopt.errors.EXIT_CODES``, the README's table), a refusal is exactly one ``graphopt: error:``
line naming the file and leaves no output or temp file, a success writes a model onnx.checker
accepts, and the input bytes are never changed.

GRAPHOPT_BYTE_FUZZ_CASES sets the count (96 by default, about 40 s on 2 cores); cases are seeded by
their index, so a run is reproducible. A case that fails goes to tests/robustness/corpus/ as
mutated_<what>.onnx (test_corpus.py replays those through the CLI with the same checks)."""

from __future__ import annotations

import os
import random
from collections import Counter
from pathlib import Path

import onnx
import pytest

from graphopt.errors import EXIT_CODES
from tests.robustness._cli import CliResult, run_many
from tests.robustness._mutations import mutate

ROOT = Path(__file__).resolve().parents[2]
CASES = int(os.environ.get("GRAPHOPT_BYTE_FUZZ_CASES", "96"))
TIMEOUT = 60.0
SOURCES = sorted((ROOT / "models").glob("*.onnx"))


def check_cli_contract(r: CliResult, model: Path, out: Path, data: bytes, label: str) -> None:
    assert r.returncode != -9, f"{label}: still running after {TIMEOUT} s (killed)"
    assert "Traceback" not in r.stderr and "internal error" not in r.stderr, (label, r.stderr[-2000:])
    assert r.returncode in EXIT_CODES and r.returncode not in (1, 2), (label, r.returncode, r.stderr[-2000:])
    assert model.read_bytes() == data, f"{label}: the input was modified"
    leftovers = sorted(p.name for p in out.parent.iterdir() if p not in (model, out))
    assert leftovers == [], (label, leftovers)
    if r.returncode == 0:
        onnx.checker.check_model(onnx.load(str(out)))
    else:
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("graphopt: error: "), (label, r.stderr[-2000:])
        assert str(model) in lines[0] or r.returncode == 9, (label, lines[0])
        assert not out.exists(), label


@pytest.fixture(scope="module")
def fuzzed(tmp_path_factory):
    root = tmp_path_factory.mktemp("byte-fuzz")
    cases, jobs = [], []
    for i in range(CASES):
        rng = random.Random(1000 + i)
        src = SOURCES[i % len(SOURCES)]
        data = mutate(src.read_bytes(), rng)
        d = root / f"case{i}"
        d.mkdir()
        model, out = d / "m.onnx", d / "out.onnx"
        model.write_bytes(data)
        argv = ["optimize", str(model), "--gpu", "none", "-q", "-o", str(out)] + (["--verify"] if i % 2 else [])
        cases.append((f"case{i} ({src.name})", model, out, data))
        jobs.append((argv, d))
    return cases, run_many(jobs, tmp_path_factory.mktemp("jobs"), timeout=TIMEOUT)


def test_byte_mutated_models_through_the_cli(fuzzed):
    cases, results = fuzzed
    for (label, model, out, data), r in zip(cases, results):
        check_cli_contract(r, model, out, data, label)


def test_the_mutations_reach_past_the_parser(fuzzed):
    """Not every mutation is a parse error: some get past loading (success or a later refusal), so
    the checks after the parser are exercised too."""
    _, results = fuzzed
    codes = Counter(r.returncode for r in results)
    assert codes[4] < len(results), codes
    assert sum(n for c, n in codes.items() if c != 4) >= len(results) // 10, codes
