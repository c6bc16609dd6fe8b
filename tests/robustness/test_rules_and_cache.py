"""Issue 6 part 4 (CPU parts): hostile rule files, CUDA-source hygiene, hostile tuning caches, and 16
processes optimizing at once against one shared cache.

Rule files and caches go through the real CLI (forked children, see _forkrun.py); the GPU is faked
(tests/robustness/_fake_gpu.py) so that runs really profile and write the cache on a CPU machine."""

from __future__ import annotations

import os
import pickle
import re
import sqlite3
import textwrap
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper as h

from graphopt.errors import TuningError
from graphopt.kernels.source import instance
from graphopt.tune.cache import TuningCache
from graphopt.tune.cache_file import CACHE_FILE
from tests.robustness._cli import assert_refused, run_many
from tests.robustness._models import conv_relu

ROOT = Path(__file__).resolve().parents[2]
RESNET = ROOT / "models" / "resnet_style.onnx"

_MARKER = "/tmp/graphopt-robustness-PWNED"
_DEEP = 3000


def _rule(pattern="Relu(Neg(x))", replace="Relu(x)", extra=""):
    return f'[[rule]]\nname = "r"\ndoc = "d"\npattern = "{pattern}"\nreplace = "{replace}"\n{extra}'


RULE_FILES: dict[str, tuple[str, bytes, str]] = {
    # label: (file name, content, text the one-line error must contain)
    "TOML syntax error": ("bad.toml", b'[[rule]\nname = "x"\n', "TOML syntax error"),
    "binary garbage": ("bin.toml", bytes(range(256)) * 4, "cannot read the rule file"),
    "empty pattern": ("e.toml", _rule(pattern="").encode(), "pattern"),
    "YAML with !!python/object/apply": ("evil.yaml", f'rule:\n  - name: !!python/object/apply:os.system ["touch {_MARKER}"]\n'.encode(), "TOML syntax error"),
    "YAML tag inside a .toml": ("evil.toml", f'name = !!python/object/apply:os.system ["touch {_MARKER}"]\n'.encode(), "TOML syntax error"),
    "TOML string that looks like code": ("code.toml", _rule(replace='__import__(\\"os\\").system(\\"touch ' + _MARKER + '\\")').encode(), "r"),
    "unknown pattern op": ("op.toml", _rule(pattern="Frobnicate(Neg(x))").encode(), "Frobnicate"),
    "unknown replacement op": ("rop.toml", _rule(replace="Frobnicate(x)").encode(), "Frobnicate"),
    "unknown constraint": ("c.toml", _rule(extra='where = ["is_evil(x)"]\n').encode(), "unknown constraint is_evil()"),
    "constraint arity": ("a.toml", _rule(extra='where = ["constant(x, x, x)"]\n').encode(), "constant()"),
    "missing key": ("m.toml", b'[[rule]]\nname = "r"\ndoc = "d"\npattern = "Relu(x)"\n', "replace"),
    "wrong type": ("t.toml", b'[[rule]]\nname = 7\ndoc = "d"\npattern = "Relu(x)"\nreplace = "Relu(x)"\n', "must be a string"),
    "pattern nested 3000 deep": ("deep.toml", _rule(pattern="Relu(" * _DEEP + "x" + ")" * _DEEP).encode(), "nested more than"),
    "replacement nested 3000 deep": ("deepr.toml", _rule(replace="Relu(" * _DEEP + "x" + ")" * _DEEP).encode(), "nested more than"),
    "constraint nested 3000 deep": ("deepc.toml", _rule(extra='where = ["' + "constant(" * _DEEP + "x" + ")" * _DEEP + '"]\n').encode(), "nested more than"),
    "TOML arrays nested 3000 deep": ("deept.toml", b"x = " + b"[" * _DEEP + b"]" * _DEEP + b"\n", "nested too deep"),
    "for-expansion of 10^8 rules": ("blow.toml", ('[[rule]]\nname = "r_{a}_{b}_{c}_{d}_{e}_{f}_{g}_{h}"\ndoc = "d"\n'
                                                 + "".join(f"for.{k} = [{','.join(['1'] * 10)}]\n" for k in "abcdefgh")
                                                 + 'pattern = "Relu(Neg(x))"\nreplace = "Relu(x)"\n').encode(), "expands to 100000000 rules"),
}


def _relu_model(folder: Path) -> Path:
    g = h.make_graph([h.make_node("Relu", ["x"], ["y"], name="relu")], "g",
                     [h.make_tensor_value_info("x", TensorProto.FLOAT, [4])], [h.make_tensor_value_info("y", TensorProto.FLOAT, [4])])
    p = folder / "relu.onnx"
    p.write_bytes(h.make_model(g, opset_imports=[h.make_opsetid("", 17)]).SerializeToString())
    return p


@pytest.fixture(scope="module")
def rule_runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("rules")
    model = _relu_model(root)
    jobs, labels = [], []
    for label, (name, content, _) in RULE_FILES.items():
        d = root / re.sub(r"\W+", "_", label)
        d.mkdir()
        (d / name).write_bytes(content)
        jobs.append((["optimize", model, "--gpu", "none", "-q", "--rules", d / name, "-o", d / "out.onnx"], d))
        jobs.append((["rules", "check", d / name], d))
        labels += [(label, "optimize", d / name), (label, "check", d / name)]
    d = root / "ping_pong"
    d.mkdir()
    (d / "pp.toml").write_text(textwrap.dedent("""
        [[rule]]
        name = "ping"
        doc = "Relu -> Sigmoid"
        pattern = "Relu(x)"
        replace = "Sigmoid(x)"

        [[rule]]
        name = "pong"
        doc = "Sigmoid -> Relu"
        pattern = "Sigmoid(x)"
        replace = "Relu(x)"
    """))
    jobs.append((["optimize", model, "--gpu", "none", "-q", "--rules", d / "pp.toml", "-o", d / "out.onnx"], d))
    labels.append(("A->B->A", "optimize", d / "pp.toml"))
    if os.path.exists(_MARKER):
        os.unlink(_MARKER)
    runs = run_many(jobs, tmp_path_factory.mktemp("jobs"), timeout=60)
    return {(label, cmd): (path, r) for (label, cmd, path), r in zip(labels, runs)}


@pytest.mark.parametrize("label", list(RULE_FILES))
def test_bad_rule_file_fails_cleanly(rule_runs, label):
    path, r = rule_runs[(label, "optimize")]
    assert r.returncode != -9, f"{label}: still running after 60 s"
    assert_refused(r, 10, label)
    assert str(path) in r.stderr and RULE_FILES[label][2] in r.stderr, r.stderr
    assert not (path.parent / "out.onnx").exists()
    path, r = rule_runs[(label, "check")]
    assert r.returncode == 10 and "Traceback" not in r.stderr and str(path) in r.stderr, (label, r.stderr)
    assert not os.path.exists(_MARKER), "a rule file ran code"


def test_rules_that_rewrite_back_and_forth_hit_the_iteration_cap(rule_runs):
    path, r = rule_runs[("A->B->A", "optimize")]
    assert_refused(r, 10, "A->B->A")
    assert "did not converge" in r.stderr and "ping" in r.stderr and "pong" in r.stderr, r.stderr


# ------------------------------------------------------------------ nothing from a model reaches CUDA text
_SAFE_INSTANCE = re.compile(r"^[a-z_0-9]+<(float|half_t)(,-?\d+)*>$")
HOSTILE = 'x"); asm("trap;"); /*'


@pytest.mark.parametrize("bad", ["3", "1); system(\"rm -rf /\"", True, 2.0, None, np.str_("4"), b"4"])
def test_template_instances_take_validated_ints_only(bad):
    with pytest.raises(TuningError):
        instance("mma_gemm", "float16", 2, bad, 64)
    with pytest.raises(TuningError):
        instance(HOSTILE, "float16", 2)
    with pytest.raises(TuningError):
        instance("mma_gemm", HOSTILE, 2)


def test_hostile_node_names_and_strings_never_reach_kernel_source():
    """A model whose names, doc strings and string attributes are C code: every candidate's kernel
    instances (the only text built per model) are a fixed template name, a C type and integers."""
    from graphopt import optimize
    from graphopt.ir import from_model
    from graphopt.kernels.registry import candidates_for
    from graphopt.kernels.source import SOURCES, read_source
    from graphopt.tune.select import node_signature

    m = conv_relu()
    for n in m.graph.node:
        n.name = HOSTILE + n.name
        n.doc_string = HOSTILE
    m.graph.name = HOSTILE
    m.doc_string = HOSTILE
    m.metadata_props.add(key=HOSTILE, value=HOSTILE)
    m.graph.node[0].attribute.append(h.make_attribute("auto_pad", "NOTSET"))
    out, report = optimize(m, gpu="none")
    assert report.custom_ops, "the fusion happened, so there is a custom op to lower"
    g = from_model(out)
    checked = 0
    for sub, node in g.walk():
        if node.domain != "graphopt":
            continue
        node.set_attr("lowering_params", HOSTILE)  # a hostile recorded lowering is not text for the compiler
        node.set_attr("note", HOSTILE)  # nor is an extra string attribute (it is part of the signature)
        sig, _ = node_signature(sub, node)
        for cand in candidates_for(sig):
            if cand.applies(sig, (9, 0)):
                continue
            for source, expr in cand.kernels(sig):
                assert source in SOURCES and _SAFE_INSTANCE.match(expr), (cand, expr)
                checked += 1
    assert checked > 0
    assert all(HOSTILE not in read_source(s) for s in SOURCES)


# ------------------------------------------------------------------ hostile tuning caches
def _profile_into(cache_dir: Path) -> None:
    """Fill cache_dir with fake-profiled a100 entries for resnet_style (in a forked child)."""
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.environ["GRAPHOPT_CACHE_DIR"] = str(cache_dir)
            from tests.robustness._fake_gpu import pretend_gpu

            pretend_gpu("a100")
            import graphopt

            _, rep = graphopt.optimize(str(RESNET), gpu="a100")
            code = 0 if rep.mode == "profiled" else 2
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


def _pickle_bomb() -> bytes:
    class Bomb:
        def __reduce__(self):
            return (os.system, (f"touch {_MARKER}",))

    return pickle.dumps(Bomb())


def _old_schema(p: Path) -> None:
    conn = sqlite3.connect(p)
    conn.execute("CREATE TABLE schema_version (version INTEGER)")
    conn.execute("INSERT INTO schema_version VALUES (0)")
    conn.execute("CREATE TABLE timings (gpu TEXT)")
    conn.commit()
    conn.close()


CACHE_DAMAGE = {
    "truncated": lambda p: p.write_bytes(p.read_bytes()[: p.stat().st_size // 3]),
    "garbage": lambda p: p.write_bytes(b"not a database at all" * 100),
    "a pickle": lambda p: p.write_bytes(_pickle_bomb()),
    "old schema": lambda p: (p.unlink(), _old_schema(p)),
    "world-writable": lambda p: p.chmod(0o666),
    "a symlink to a valid cache": lambda p: (p.rename(p.with_name("real.sqlite3")), p.symlink_to("real.sqlite3")),
}


@pytest.fixture(scope="module")
def profiled_cache(tmp_path_factory):
    d = tmp_path_factory.mktemp("profiled")
    _profile_into(d)
    return d / CACHE_FILE


def test_control_a_good_cache_is_used(profiled_cache, tmp_path, monkeypatch):
    d = tmp_path / "c"
    d.mkdir()
    (d / CACHE_FILE).write_bytes(profiled_cache.read_bytes())
    os.chmod(d / CACHE_FILE, 0o600)
    monkeypatch.setenv("GRAPHOPT_CACHE_DIR", str(d))
    r = _cli_with_cache(d, tmp_path)
    assert r.returncode == 0 and "graphopt: warning" not in r.stderr, r.stderr
    assert "lowerings from tuning-cache entries for a100" in r.stdout


def _cli_with_cache(cache_dir: Path, work: Path):
    (r,) = run_many([(["optimize", RESNET, "--gpu", "a100", "-o", work / "out.onnx"], work)], work)
    return r


@pytest.mark.parametrize("damage", list(CACHE_DAMAGE))
def test_damaged_cache_is_warned_about_and_ignored(profiled_cache, tmp_path, monkeypatch, damage):
    d = tmp_path / "c"
    d.mkdir()
    p = d / CACHE_FILE
    p.write_bytes(profiled_cache.read_bytes())
    os.chmod(p, 0o600)
    CACHE_DAMAGE[damage](p)
    monkeypatch.setenv("GRAPHOPT_CACHE_DIR", str(d))
    if os.path.exists(_MARKER):
        os.unlink(_MARKER)
    r = _cli_with_cache(d, tmp_path)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    warnings_ = [line for line in r.stderr.splitlines() if line.startswith("graphopt: warning: tuning cache")]
    assert len(warnings_) == 1 and "none of its timings are used" in warnings_[0], r.stderr
    assert "lowerings chosen by heuristic" in r.stdout, r.stdout  # nothing from the damaged file
    assert not os.path.exists(_MARKER), "the cache file was unpickled"
    with TuningCache(p) as c:  # rebuilt: a valid, empty cache
        assert c.entries() == []


def test_cache_import_of_a_pickle_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("GRAPHOPT_CACHE_DIR", str(tmp_path / "cache"))
    bomb = tmp_path / "export.json"
    bomb.write_bytes(_pickle_bomb())
    if os.path.exists(_MARKER):
        os.unlink(_MARKER)
    (r,) = run_many([(["cache", "import", bomb], tmp_path)], tmp_path)
    assert_refused(r, 12, "pickle import")
    assert not os.path.exists(_MARKER)


# ------------------------------------------------------------------ 16 processes, one cache
def _conv_model(cout: int) -> onnx.ModelProto:
    rng = np.random.default_rng(cout)
    w = onnx.numpy_helper.from_array(rng.standard_normal((cout, 3, 3, 3)).astype(np.float32), "w")
    g = h.make_graph([h.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]), h.make_node("Relu", ["c"], ["y"])], "g",
                     [h.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                     [h.make_tensor_value_info("y", TensorProto.FLOAT, [1, cout, 8, 8])], [w])
    return h.make_model(g, opset_imports=[h.make_opsetid("", 17)])


def test_16_processes_optimizing_at_once_leave_one_valid_complete_cache(tmp_path, monkeypatch):
    """16 forked processes each optimize (and profile, on a fake h200) two models: one of their own and
    one all of them share, against one cache that none of them has created yet. Afterwards the file is a
    valid sqlite database holding every signature, and a run on a CPU machine serves all from it."""
    cache_dir = tmp_path / "cache"
    workers = 16
    pids = []
    for w in range(workers):
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                os.environ["GRAPHOPT_CACHE_DIR"] = str(cache_dir)
                from tests.robustness._fake_gpu import pretend_gpu

                pretend_gpu("h200")
                import graphopt

                modes = [graphopt.optimize(_conv_model(c), gpu="h200")[1].mode for c in (w + 1, 99)]
                code = 0 if modes[0] == "profiled" and modes[1] in ("profiled", "cached") else 2
            except BaseException:
                import traceback

                traceback.print_exc()
            finally:
                os._exit(code)
        pids.append(pid)
    codes = [os.waitstatus_to_exitcode(os.waitpid(p, 0)[1]) for p in pids]
    assert codes == [0] * workers
    path = cache_dir / CACHE_FILE
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
    conn.close()
    assert not [p.name for p in cache_dir.iterdir() if ".bad-" in p.name], "a writer distrusted the file"
    with TuningCache(path) as c:
        entries = c.entries()
    sigs = {e.signature for e in entries}
    assert len(sigs) == workers + 1, sorted(sigs)
    assert all(e.gpu == "h200" for e in entries)
    # every signature has all of its candidates' timings (no lost writes)
    per_sig = {s: {e.candidate for e in entries if e.signature == s} for s in sigs}
    assert len({frozenset(v) for v in per_sig.values()}) == 1 and len(next(iter(per_sig.values()))) == 2, per_sig
    # a machine without that GPU is served from the shared cache for every model
    import graphopt

    monkeypatch.setenv("GRAPHOPT_CACHE_DIR", str(cache_dir))
    for c in list(range(1, workers + 1)) + [99]:
        _, rep = graphopt.optimize(_conv_model(c), gpu="h200")
        assert rep.mode == "cached", (c, rep.selection_summary)
