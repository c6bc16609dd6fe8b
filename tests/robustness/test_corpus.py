"""Replays every model a fuzzer or a review once broke graphopt with (tests/robustness/corpus/).

Each file is the smallest model that showed the failure (rebuilt by hand from the fuzzer's case
where the mutated sample model was large); EXPECTED says what graphopt must do with it now, through
the real CLI, both without and with ``--verify``:

- ``fuzz_graph_*.onnx``: random graphs from test_fuzz_graphs.py; replayed through its ``check``.
- ``mutated_*.onnx``: byte-fuzzer finds (test_fuzz_bytes.py); the CLI contract of that fuzzer plus
  the exit code listed here.
- ``valid_*.onnx``: valid models graphopt once refused or blamed itself for.
"""

from __future__ import annotations

from pathlib import Path

import onnx
import pytest

from tests.robustness._cli import run_many
from tests.robustness.test_fuzz_bytes import check_cli_contract

from .test_fuzz_graphs import check

CORPUS = Path(__file__).parent / "corpus"

# file -> (exit code without --verify, exit code with --verify), and what it was
EXPECTED: dict[str, tuple[int, int, str]] = {
    "mutated_unknown_attribute.onnx": (4, 4, "Conv attribute renamed karnel_shape: --verify said 'internal error: the "
                                              "optimized model fails onnx.checker'; now the input is refused (it fails the same check)"),
    "mutated_kernel_shape_size.onnx": (0, 4, "kernel_shape of the wrong length: passes onnx's basic check (written as is "
                                              "without --verify); with --verify it was an internal error, now the input is refused "
                                              "because onnxruntime cannot run it either"),
    "mutated_non_utf8_string.onnx": (0, 4, "auto_pad holding non-UTF-8 bytes: onnxruntime printed its own log lines to "
                                            "stderr besides graphopt's one-line error"),
    "mutated_non_utf8_node_name.onnx": (4, 4, "a node name that is not UTF-8 (python-protobuf returns bytes): TypeError "
                                              "in the rewrite engine, exit 1"),
    "mutated_conv_mul_fold_overflow.onnx": (0, 0, "Conv * 1e38 whose folded weight overflows float32 (a byte-fuzzer "
                                                  "weight): the fold turned finite results into inf (--verify: exit 9); now not folded"),
    "valid_sparse_initializer_add.onnx": (0, 0, "a sparse initializer feeding Add (onnxruntime runs it, onnx's full check "
                                                "rejects it): --verify said 'internal error'"),
}


def test_every_corpus_file_has_an_expectation():
    files = {p.name for p in CORPUS.glob("*.onnx")}
    assert files == set(EXPECTED) | {p.name for p in CORPUS.glob("fuzz_graph_*.onnx")}


@pytest.fixture(scope="module")
def cli_runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("corpus")
    jobs, cases = [], []
    for name in EXPECTED:
        data = (CORPUS / name).read_bytes()
        for verify in (False, True):
            d = root / f"{name}-{verify}"
            d.mkdir()
            (d / "m.onnx").write_bytes(data)
            argv = ["optimize", str(d / "m.onnx"), "--gpu", "none", "-q", "-o", str(d / "out.onnx")] + (["--verify"] if verify else [])
            jobs.append((argv, d))
            cases.append((name, verify, d, data))
    return dict(((c[0], c[1]), (c, r)) for c, r in zip(cases, run_many(jobs, tmp_path_factory.mktemp("jobs"))))


@pytest.mark.parametrize("verify", [False, True], ids=["plain", "verify"])
@pytest.mark.parametrize("name", list(EXPECTED))
def test_corpus_file_through_the_cli(cli_runs, name, verify):
    (_, _, d, data), r = cli_runs[(name, verify)]
    check_cli_contract(r, d / "m.onnx", d / "out.onnx", data, name)
    assert r.returncode == EXPECTED[name][int(verify)], (name, r.returncode, r.stderr)


FUZZ = sorted(CORPUS.glob("fuzz_graph_*.onnx"))


@pytest.mark.parametrize("path", FUZZ, ids=[p.name for p in FUZZ])
def test_fuzz_graph_corpus(path):
    check(onnx.load(str(path)))
