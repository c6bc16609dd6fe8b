"""Run the robustness suite (tests/robustness) and write bench/results/robustness.md.

Usage: PYTHONPATH=. python bench/robustness_table.py [--slow] [--print]

- Runs ``pytest tests/robustness`` (``-m "not slow"`` unless ``--slow``) with a JUnit XML report and
  counts, per category (one test file per issue-6 category), the cases tried and handled (passed).
  A test that runs many cases inside itself (the two fuzzers, the CLI mutation loop) counts as its
  number of cases; a parametrized test counts each parameter.
- "found" and "fixed" come from FINDINGS below: every failure a test found, the fix and its commit.
  Keep it in step with the tests (a finding without a regression test does not belong here).
- Timings of the scale tests (their ``scale:`` lines) are copied into the file.
- The GPU fault-isolation test (tests/gpu/test_fault_isolation_gpu.py) is not run here; its row says
  whether it has been run on the device (GPU_RESULT).

The file is written atomically (temp file + rename).
"""

from __future__ import annotations

import argparse
import ast
import os
import re
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "bench" / "results" / "robustness.md"
sys.path.insert(0, str(ROOT / "bench"))
from lowering_bench import write_atomic  # noqa: E402

# test file -> category label (issue 6 part numbers; 7-9 from issue 21)
CATEGORIES = {
    "test_model_files": "1. hostile model files (not-a-model, tensor data, structure, opsets/domains, external data, sparse)",
    "test_hostile_bytes": "1./6. mutated bytes through parser+optimizer, nested If, long chain",
    "test_tricky_models": "2. tricky-but-legal models (second consumers, graph outputs, broadcasts, residual orders, If/Loop/Scan, names, idempotence, 2^40 producers)",
    "test_output_safety": "3. output safety (output = input, data file, kill -9/SIGINT, full disk, permissions, determinism, >2 GB)",
    "test_rules_and_cache": "4. rule files and tuning cache (malformed, object tags, unknown ops, A->B->A, CUDA-source injection, damaged caches, 16 processes)",
    "test_fault_isolation": "4. fault isolation (segfault / os._exit / abort / hang / illegal-address candidates, CPU fakes)",
    "test_fuzz_graphs": "5. graph fuzzer (hypothesis, optimize + verify vs onnxruntime)",
    "test_fuzz_bytes": "5. byte-mutation fuzzer through the CLI",
    "test_corpus": "5. corpus replay (every committed failure)",
    "test_scale": "6. scale (100k/1M nodes, If nested 40/10,000 deep in files and in memory)",
    "test_output_paths": "7. output paths (issue 21: --report/-o/data file/rules/cache export onto an input or each other, by inode; missing folder, folder, read-only without --force; 0644; markup in names)",
    "test_hostile_bounds": "8. bounds (issue 21: device/FIFO model and rule files, exponential let, 5 MiB rule file, 10,000-argument pattern, 100,000 inputs, error-line length)",
    "test_clear_refusals": "9. clear refusals (issue 21: --verify allocation size, --rtol nan, user rule building an invalid node, checker-refused input, GELU look-alike)",
    "test_large_models": "10. models over the protobuf limit (issue 21: a real sparse 2.42 GB model, weights streamed, peak RSS bounded; --verify past the limit simulated at 200 KB; the simulation and its control)",
}

# (category file, what was found, how it was fixed, commit)
FINDINGS = [
    ("test_model_files", "a valid model with a sparse initializer was refused (`InvalidGraph`: sparse names not defined in the IR)",
     "`Graph.sparse_initializer_names` counted as definitions", "bb37988"),
    ("test_model_files", "malformed sparse tensors (negative/overflowing dims, bad indices) reached onnx.checker after optimizing: exit 1 'internal error'",
     "`io.check_sparse` at load: `InvalidModel` (exit 4)", "bb37988"),
    ("test_fuzz_bytes", "a model that fails onnx.checker/onnxruntime (renamed or wrong-length Conv attribute) gave 'internal error' with --verify",
     "the input is checked the same way first and refused as invalid (exit 4)", "0d976fc"),
    ("test_fuzz_bytes", "a non-UTF-8 node name (python-protobuf hands back bytes): TypeError in the rewrite engine, exit 1",
     "refused at load with a one-line `InvalidModel`", "0d976fc"),
    ("test_fuzz_bytes", "onnxruntime printed its own log lines to stderr besides graphopt's one-line error",
     "ORT session log severity raised", "0d976fc"),
    ("test_tricky_models", "--verify on a valid model with a sparse initializer feeding Add: 'internal error: the optimized model fails onnx.checker' (the input fails the same check)",
     "verify checks the input the same way first; graphopt is not blamed", "0d976fc"),
    ("test_fuzz_bytes", "Conv * 1e38 folded into the weights overflowed float32: finite outputs became inf (--verify exit 9)",
     "Conv+BN / Conv+Mul folds refused when the folded weights overflow the dtype", "73fb9f6"),
    ("test_output_safety", "an unwritable or unenterable output folder raised a raw PermissionError (exit 1 'internal error')",
     "`WriteFailed` with the path and the fix", "235cec6"),
    ("test_rules_and_cache", "rule text or TOML nested ~3000 deep: RecursionError",
     "nesting limits in the rule syntax and the TOML/YAML loader: `RuleError`", "ab7bd74"),
    ("test_rules_and_cache", "a `for` expansion of 10^8 rules hung",
     "expansion capped at 1000 rules, error names the rule", "ab7bd74"),
    ("test_rules_and_cache", "tuning-cache warnings (damaged / foreign / world-writable file ignored) never reached the CLI user",
     "collected and printed by the CLI", "ab7bd74"),
    ("test_scale", "an If nested past protobuf's 100-message limit (>= ~33 levels) was reported as 'not an ONNX model or truncated'",
     "'nested too deep for protobuf to parse' (`UnsupportedModel`, exit 5)", "1f1c285"),
    ("test_scale", "an in-memory ModelProto nested 33..64 deep passed graphopt's own limit (64) and died in save with a raw protobuf DecodeError",
     "MAX_NESTING lowered to 30 (below upb's limit); the error names the source and says 'nested too deep'", "1f1c285"),
    ("test_output_paths", "`--report` = the input model overwrote the input with JSON (exit 0); `--report` = `-o` replaced the model with JSON",
     "every output checked against every input and other output by device+inode before any work (`graphopt.files.check_outputs`): exit 8 / exit 2", "9023481"),
    ("test_output_paths", "a report in a missing folder failed after the model was written ('nothing was written' was false)",
     "checked before any work; model, data file and report staged and renamed together", "9023481"),
    ("test_output_paths", "outputs (model, report, cache export) were created 0600; a read-only `-o` file was replaced silently",
     "0666 & ~umask (0644 under 022), an existing file keeps its mode; read-only refused unless `--force`", "9023481"),
    ("test_output_paths", "a model path or node name with rich markup (`[/]`) crashed the summary after the model was written (exit 1)",
     "every console prints with markup off; styles through `rich.text.Text`", "9023481"),
    ("test_output_paths", "a folder given as `--report` got click's three-line usage text", "one line, exit 2", "9023481"),
    ("test_output_safety", "SIGTERM during the write left the temp file (212 MiB) beside the destination",
     "SIGTERM raises inside the CLI, the staged files are removed, exit 143", "b0e3652"),
    ("test_hostile_bounds", "a device file as the model read until memory ran out; a FIFO in a `--rules` folder hung",
     "only regular files are read (`graphopt.files.read_regular`)", "3c1c2a6"),
    ("test_hostile_bounds", "`let` fragments expanding exponentially (3.6 GB after 60 s)",
     "substitution capped at 20,000 characters per field, checked as it grows", "3c1c2a6"),
    ("test_hostile_bounds", "a graph with 100,000 inputs took 254 s (`Graph.lint`, `in` on the input list)",
     "input/output names indexed, lint builds each node's input set once: about 5 s", "3c1c2a6"),
    ("test_hostile_bounds", "a pattern with 10,000 arguments: RecursionError; an error line quoted a 10 MB pattern whole",
     "calls capped at 256 arguments, matcher walks arguments iteratively; quoted text cut around the column", "3c1c2a6"),
    ("test_large_models", "a model with 2.15 GB of external weights: 'internal error: EncodeError' (protobuf's ByteSize) after 38 s at 12.2 GB",
     "shape inference and onnx.checker on a weightless copy (`graphopt.ir.large`); save streams the weights; peak 4.0x the weights", "bc75347, e30b453"),
    ("test_large_models", "optimize peaked at 4.0x the weights of a 2.15 GB model; `--verify` on a model over 2 GB failed (onnxruntime was handed bytes)",
     "weights stay in their files (lazy references, streamed on save): optimize 0.12x, --verify 1.09x (bench/results/large_model.md); onnxruntime gets a temporary model path", "03cdf3a"),
    ("test_clear_refusals", "`--verify` on an input declared [2^31, 2^31] or a 224 GiB `--shape`: MemoryError / ValueError (exit 1)",
     "sizes computed before allocating: exit 2 naming the input", "c2d04e6"),
    ("test_clear_refusals", "`--rtol nan` reported as 'outputs differ'", "non-finite or negative tolerances: exit 2", "c2d04e6"),
    ("test_clear_refusals", "a user rule whose replacement builds an invalid node: 'internal error'",
     "the rule and its file are named, exit 10", "c2d04e6"),
    ("test_clear_refusals", "a bfloat16 Conv at opset 17 (onnx's checker and onnxruntime refuse it) was accepted and written",
     "full checker on every run; a type-constraint failure of the input refuses it (exit 4)", "c2d04e6"),
    ("test_clear_refusals", "a GELU look-alike with 1.0008 fused as exact GELU (outputs moved by 5.7e-4)",
     "`const_near` matches only to the constant's dtype precision (2 ulps); `--explain` says why", "b8baaac"),
]

def _internal_cases() -> dict[str, int]:
    """Cases that one test runs inside itself: test name -> count."""
    sys.path.insert(0, str(ROOT))
    from tests.robustness import test_fuzz_bytes, test_fuzz_graphs

    return {
        "test_random_graph_optimizes_and_matches_onnxruntime": test_fuzz_graphs.EXAMPLES,
        "test_the_generator_reaches_the_fusion_rules": 60,
        "test_byte_mutated_models_through_the_cli": test_fuzz_bytes.CASES,
        "test_mutated_models_through_the_cli_give_one_line_errors": 8,
    }


GPU_RESULT = "tests/gpu/test_fault_isolation_gpu.py (real faulting kernels: illegal-address store, PTX trap, bounded spin; profile_node and graphopt.optimize): on the H200 2026-12-03 (bench/results/gpu_tests_h200.txt) the faulting kernels scored inf with the real candidates after them passing, and the hanging kernel was killed by the timeout; the end-to-end optimize test failed only because its test model was IR 14, which the device's onnxruntime cannot read (fixed to IR 10, not re-run)"

# One-off longer fuzzing runs (not in CI; re-run with the env vars to extend): (command, result).
EXTENDED = [
    ("GRAPHOPT_FUZZ_EXAMPLES=2000 pytest tests/robustness/test_fuzz_graphs.py::test_random_graph_optimizes_and_matches_onnxruntime",
     "2000 random graphs, 0 failures, 84 s (2026-12-03)"),
    ("GRAPHOPT_BYTE_FUZZ_CASES=5000 pytest tests/robustness/test_fuzz_bytes.py",
     "5000 byte-mutated models through the CLI, 0 failures, 123 s (2026-12-03)"),
]

NOT_DONE = [
    "The end-to-end GPU fault test through graphopt.optimize has not passed on the device yet (its model's IR version, fixed since); the two kernel-level fault tests passed there.",
    "The 1,000,000-node run is marked `slow` (not in CI); CI runs 100,000 nodes (timings above; peak memory grows about 6.8 KB per node). Regenerate this file with `--slow` on an otherwise idle machine: on 2026-12-04 13:14-13:39 UTC, with six other test suites sharing the 2 cores, the `--slow` run did not finish in 25 minutes.",
    "A full disk is simulated with RLIMIT_FSIZE in a subprocess (EFBIG, as ENOSPC would be), not with a small tmpfs (mounting needs root).",
]


def run_suite(slow: bool) -> tuple[dict[str, Counter], dict[str, float], list[str], int]:
    internal = _internal_cases()
    with tempfile.TemporaryDirectory() as tmp:
        xml = Path(tmp) / "r.xml"
        cmd = [sys.executable, "-m", "pytest", "-q", "tests/robustness", f"--junitxml={xml}", "-o", "junit_logging=system-out", "-s"]
        if not slow:
            cmd += ["-m", "not slow"]
        proc = subprocess.run(cmd, cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)), capture_output=True, text=True)
        rows: dict[str, Counter] = {}
        seconds: dict[str, float] = {}
        for tc in ET.parse(xml).getroot().iter("testcase"):
            cat = tc.get("classname", "").split(".")[-1]
            name = tc.get("name", "").split("[")[0]
            n = internal.get(name, 1)
            c = rows.setdefault(cat, Counter())
            if tc.find("skipped") is not None:
                c["skipped"] += n
                continue
            c["tried"] += n
            if tc.find("failure") is None and tc.find("error") is None:
                c["handled"] += n
            seconds[cat] = seconds.get(cat, 0.0) + float(tc.get("time", 0))
    scale = re.findall(r"scale: (\{[^}]*\})", proc.stdout)  # -s: the lines sit among pytest's dots
    return rows, seconds, scale, proc.returncode


def _fmt_scale(line: str) -> str:
    try:
        d = ast.literal_eval(line)
        return f"| {d['n']:,} | {d['seconds']:.1f} s | {d['peak_mib']:.0f} MiB |"
    except Exception:  # noqa: BLE001 - show it as is
        return f"| {line} | | |"


def render(rows, seconds, scale, rc: int, slow: bool) -> str:
    stamp = time.strftime("%H:%M UTC, %Y-%m-%d", time.gmtime())
    found = Counter(f[0] for f in FINDINGS)
    out = [f"# graphopt robustness (issue 6), state at {stamp}", "",
           "Produced by `PYTHONPATH=. python bench/robustness_table.py" + (" --slow" if slow else "") +
           "` from `tests/robustness/` (" + ("all tests" if slow else "the CI set, `-m \"not slow\"`") +
           f"; pytest exit code {rc}).", "",
           "Every case asserts a contract, not just \"no crash\": refusals are one `graphopt: error:` line with the "
           "documented exit code, no traceback, no output or temp file, input bytes unchanged; successes are "
           "compared with onnxruntime on fresh random inputs. Each protection has a control test or a case "
           "that fails when the protection is removed.", "",
           "| category | cases tried | handled | found | fixed | seconds |", "|---|---|---|---|---|---|"]
    total = Counter()
    for cat, label in CATEGORIES.items():
        c = rows.get(cat, Counter())
        total.update(c)
        commits = sorted({f[3] for f in FINDINGS if f[0] == cat})
        fixed = f"{found[cat]} ({', '.join(commits)})" if commits else "0"
        out.append(f"| {label} | {c['tried']} | {c['handled']} | {found.get(cat, 0)} | {fixed} | {seconds.get(cat, 0.0):.0f} |")
    out.append(f"| **total** | **{total['tried']}** | **{total['handled']}** | **{len(FINDINGS)}** | **{len(FINDINGS)}** | "
               f"{sum(seconds.values()):.0f} |")
    out.append(f"| 4. GPU fault isolation | – | – | – | – | {GPU_RESULT} |")
    out += ["", "## Found and fixed", "", "| category | found | fix | commit |", "|---|---|---|---|"]
    for cat, what, fix, commit in FINDINGS:
        out.append(f"| {cat} | {what} | {fix} | {commit} |")
    out += ["", "Every finding has a regression test (the corpus files in `tests/robustness/corpus/` for the fuzzer finds).",
            "", "## Scale timings (2 shared CPU cores)", "", "| nodes (Relu/Neg/Sigmoid/Abs chain) | optimize | peak RSS |",
            "|---|---|---|"]
    out += [_fmt_scale(s) for s in scale] or ["| (run with --slow for the 1M row) | | |"]
    out += ["", "## Longer fuzzing runs (one-off, not in CI)", "", "| command | result |", "|---|---|"]
    out += [f"| `{cmd}` | {res} |" for cmd, res in EXTENDED]
    out += ["", "## Not done / limits", ""] + [f"- {x}" for x in NOT_DONE] + [""]
    return "\n".join(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--slow", action="store_true", help="include the slow tests (the 1M-node graph)")
    ap.add_argument("--print", action="store_true", help="print the table instead of writing the file")
    args = ap.parse_args()
    rows, seconds, scale, rc = run_suite(args.slow)
    text = render(rows, seconds, scale, rc, args.slow)
    if args.print:
        print(text)
        return rc
    write_atomic(OUT, text)
    print(f"wrote {OUT.relative_to(ROOT)} (pytest exit code {rc})")
    return rc


if __name__ == "__main__":
    sys.exit(main())
