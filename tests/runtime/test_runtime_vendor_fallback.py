"""A node whose recorded lowering is a cuDNN candidate (SDPA, SkipLayerNorm with its sum output,
RMSNorm) still runs where the cuDNN frontend is missing: the runtime takes the own-kernel heuristic's
choice, and where that cannot build either (the fake CuPy has no NVRTC), the op's device fallback;
the note says why, and both outputs of a SkipLayerNorm are right."""

from __future__ import annotations

import numpy as np
import pytest

from _runtime_helpers import rel_err
from graphopt.ops import get_schema
from graphopt.ops.testing import one_node_model


def _run(model, feeds):
    from graphopt.runtime import Session, to_numpy

    sess = Session(model, device="cuda", cuda_graphs=False)
    got = sess.run(feeds)
    return {k: to_numpy(v) for k, v in got.items()}, " ".join(sess.plan_summary()["notes"])


@pytest.mark.parametrize("lowering", ["cudnn", "cudnn:plan=eng3_k5=1"])
def test_recorded_cudnn_sdpa_runs_without_cudnn(fake_cuda, lowering):
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((1, 2, 128, 64)).astype(np.float16) for _ in range(3))
    mask = rng.standard_normal((1, 1, 128, 128)).astype(np.float16)
    name, _, params = lowering.partition(":")
    attrs = {"causal": 1, "mask_kind": "additive", "lowering": name, **({"lowering_params": params} if params else {})}
    model = one_node_model("Attention", [("Q", q), ("K", k), ("V", v), ("mask", mask)], attrs, 18, (1, 2, 128, 64))
    got, notes = _run(model, {"Q": q, "K": k, "V": v, "mask": mask})
    want = get_schema("Attention").reference([a.astype(np.float64) for a in (q, k, v, mask)], attrs)[0]
    assert rel_err(got["Y"].astype(np.float64), want) <= 1e-2
    assert "cudnn" in notes and ("own-kernel" in notes or "fallback" in notes), notes


def test_recorded_cudnn_skip_layernorm_fills_both_outputs_without_cudnn(fake_cuda):
    rng = np.random.default_rng(1)
    x, skip = (rng.standard_normal((2, 5, 64)).astype(np.float16) for _ in range(2))
    scale, bias = (rng.standard_normal(64).astype(np.float16) for _ in range(2))
    attrs = {"epsilon": 1e-5, "sum_output": 1, "lowering": "cudnn", "lowering_params": "plan=eng0"}
    model = one_node_model("LayerNorm", [("X", x), ("scale", scale), ("bias", bias), ("skip", skip)], attrs, 18,
                           (2, 5, 64), extra_outputs=[("S", (2, 5, 64))])
    got, notes = _run(model, {"X": x, "scale": scale, "bias": bias, "skip": skip})
    want = get_schema("LayerNorm").reference([a.astype(np.float64) for a in (x, scale, bias, skip)] + [None], attrs)
    assert rel_err(got["Y"].astype(np.float64), want[0]) <= 1e-2
    assert rel_err(got["S"].astype(np.float64), want[1]) <= 1e-3
    assert "cudnn" in notes, notes


@pytest.mark.parametrize("file_dtype", [np.float16, np.float32])
def test_a_float16_run_keeps_a_float16_files_tuned_choice(fake_cuda, file_dtype):
    """Session(dtype="float16") converts a float32 model, whose recorded lowerings were chosen for
    float32 signatures: those give way to the heuristic's float16 choice. A model already in float16
    keeps its tuned choice (bench/plan_breakdown.py opened fp16 models that way and timed the
    heuristic's lowerings until 2026-12-05)."""
    from graphopt.runtime import Session

    rng = np.random.default_rng(2)
    a, b = rng.standard_normal((8, 64)).astype(file_dtype), rng.standard_normal((64, 32)).astype(file_dtype)
    attrs = {"mode": "matmul", "activation": "none", "lowering": "cublaslt", "lowering_params": "algo=6,tile=18"}
    model = one_node_model("GemmAct", [("A", a), ("B", b)], attrs, 18, (8, 32))
    sess = Session(model, device="cuda", cuda_graphs=False, dtype="float16")
    sess.run({"A": a, "B": b})
    notes = " ".join(sess.plan_summary()["notes"])
    # the fake CuPy builds neither: the note names the lowering that was attempted
    assert ("lowering cublaslt:algo=6,tile=18" in notes) == (file_dtype == np.float16), notes
