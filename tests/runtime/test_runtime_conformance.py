"""bench/conformance.py on device="numpy": every claimed op passes ONNX's own node test cases
(or the table names the unclaimed variant), and the table lists every claimed op."""

from __future__ import annotations

from _scripts import load_script



def _load():
    return load_script("bench/conformance.py", register=True)  # dataclasses look their module up there


def test_every_claimed_op_passes_its_onnx_node_tests(tmp_path):
    conf = _load()
    results = conf.run_conformance("numpy")
    fails = [f"{r.case}: {r.detail}" for r in results if r.status == "fail"]
    assert not fails, "conformance failures:\n" + "\n".join(fails)
    passed_ops = {r.op for r in results if r.status == "pass"}
    tested_ops = {r.op for r in results}
    assert tested_ops - passed_ops == set(), f"ops whose every case is excluded: {sorted(tested_ops - passed_ops)}"
    assert len(passed_ops) >= 100
    md = conf.table(results, "numpy")
    from graphopt.runtime import supported_ops

    for op in supported_ops():
        assert f"| {op} |" in md


def test_a_wrong_op_fails_conformance(monkeypatch):
    """The harness can fail: break Relu and its case must fail."""
    conf = _load()
    from graphopt.runtime.onnx_ops.registry import OPS

    monkeypatch.setitem(OPS, "Relu", lambda ctx, ins: [ins[0] * 2])
    results = conf.run_conformance("numpy", {"Relu"})
    assert results and all(r.status == "fail" for r in results)
