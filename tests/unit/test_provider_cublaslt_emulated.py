"""The cuBLASLt provider's row-major mapping end to end without a GPU: every GemmAct / 1x1 CBR
variant (transposes, alpha, bias shapes, strided batch, B or A shared, vectors, NHWC, 3-input CBR)
run through the provider against EmulatedLt, which computes from the descriptors as cuBLASLt would,
compared with the op's float64 reference."""

from __future__ import annotations

import numpy as np
import pytest

from _fake_cublaslt import conv, gemm
from graphopt.kernels import gemm_act
from graphopt.lowering import Signature
from graphopt.providers import cublaslt as prov


EMULATED = [
    gemm((8, 64), (64, 32), activation="GeluTanh", dtype="float32"),
    gemm((8, 64), (64, 32), None, activation="Relu"),
    gemm((64, 8), (32, 64), (32,), mode="gemm", transA=1, transB=1, activation="Relu", dtype="float32"),
    gemm((64, 8), (64, 32), None, mode="gemm", transA=1, alpha=0.5, dtype="float32"),
    gemm((8, 64), (32, 64), (1, 32), mode="gemm", transB=1, dtype="float32"),
    gemm((3, 5, 7, 16), (3, 5, 16, 9), dtype="float32"),
    gemm((3, 7, 16), (16, 9), activation="Relu", dtype="float32"),
    gemm((7, 16), (4, 16, 9), None, dtype="float32"),
    gemm((16,), (3, 16, 9), (9,), dtype="float32"),
    gemm((5, 7, 16), (16,), None, dtype="float32"),
    conv((2, 24, 5, 7), (40, 24, 1, 1), activation="Relu", dtype="float32"),
    conv((2, 24, 9), (8, 24, 1), bias=False, dtype="float32"),
    Signature.make("CBR", [(2, 16, 3, 5), (8, 16, 1, 1), (8,)], ["float32"] * 3, {"activation": "Relu"}),  # 3 inputs
]


def _host_and_reference(sig, seed):
    """Random host inputs of ``sig`` and the op's float64 reference output."""
    from graphopt.ops import get_schema

    rng = np.random.default_rng(seed)
    dt = np.dtype(sig.dtypes[0])
    host = [None if s is None else rng.standard_normal(s).astype(dt) for s in sig.input_shapes]
    f64 = [None if h is None else h.astype(np.float64) for h in host]
    f64 += [None] * ((4 if sig.op == "CBR" else 3) - len(f64))
    return host, np.asarray(get_schema(sig.op).reference(f64, dict(sig.attrs))[0], np.float64)


@pytest.mark.parametrize("sig", EMULATED, ids=lambda s: s.key()[:60])
def test_row_major_mapping_computes_the_reference_on_an_emulated_library(emulated, sig):
    host, ref = _host_and_reference(sig, 1)
    dt = np.dtype(sig.dtypes[0])
    low = prov.candidates(sig.op, sig)[1].build(sig, "sm_90")
    ins = low.conform([None if h is None else _aligned(h) for h in host], np)
    _launch_matches_reference(low, ins, ref, dt, None, sig.key())


def _aligned(a: np.ndarray) -> np.ndarray:
    """A copy of ``a`` at a 64-byte aligned address (NumPy guarantees 16 only on some platforms)."""
    raw = np.empty(a.nbytes + 64, np.uint8)
    off = (-raw.ctypes.data) % 64
    out = raw[off:off + a.nbytes].view(a.dtype).reshape(a.shape)
    out[...] = a
    return out


B_TRANSPOSED = [
    gemm((8, 64), (64, 33), activation="Relu"),                       # fp16, N odd (GPT-2's LM head: 50257)
    gemm((3, 7, 64), (64, 9), None, dtype="float32"),                 # batch folded into M, no bias
    gemm((64, 8), (64, 5), (5,), mode="gemm", transA=1, dtype="float32"),
    gemm((2, 4, 5, 32), (32, 15), (1, 15), activation="GeluTanh"),    # B shared by a 2-D batch
]


@pytest.mark.parametrize("sig", B_TRANSPOSED, ids=lambda s: s.key()[:60])
def test_b_transposed_variant_declares_b_colmajor_and_computes_the_reference(emulated, sig):
    """cublaslt_bt: B conformed to colmajor (rows K apart), passed as op(A)=T; same result as the op."""
    assert prov.b_transposed_reason(sig) is None
    cands = [c for c in prov.candidates(sig.op, sig) if c.name == prov.NAME_BT]
    assert cands and cands[0].key() == "cublaslt_bt" and all(prov.from_key("GemmAct", c.key()) == c for c in cands)
    host, ref = _host_and_reference(sig, 3)
    dt = np.dtype(sig.dtypes[0])
    for cand in (cands[0], cands[-1]):
        low = cand.build(sig, "sm_90")
        assert low.layouts == ("", "colmajor") and cand.layouts(sig) == low.layouts
        ins = low.conform([None if h is None else _aligned(h) for h in host], np)
        assert ins[1].swapaxes(-1, -2).flags.c_contiguous and not ins[1].flags.c_contiguous
        assert np.array_equal(ins[1], host[1])  # the same logical matrix, stored transposed
        _launch_matches_reference(low, ins, ref, dt, None, cand.key())


def _launch_matches_reference(low, ins, ref, dt, ws, label):
    """One launch into a NaN-poisoned output, compared normwise with the float64 reference."""
    out = low.empty_outputs(len(ins), [ref.shape], dt, np)[0]
    out[...] = np.nan
    low.launch(ins, [out], ws)
    tol = 1e-5 if dt == np.float32 else 1e-2
    assert np.linalg.norm(out.astype(np.float64) - ref) <= tol * np.linalg.norm(ref), label
    return out


def _refused_with(sig, why, reason, name):
    """A near miss of variant ``name``: its reason and ``applies`` say ``why``, no candidate is offered,
    and the key does not parse for a CBR."""
    assert why in (reason(sig) or "")
    assert why in (prov.CublasLtGemm(name).applies(sig) or "")
    assert not [c for c in prov.candidates(sig.op, sig) if c.name == name]
    assert prov.from_key("CBR", name) is None


@pytest.mark.parametrize("sig, why", [
    (gemm((8, 64), (64, 32)), "already 16-byte multiples"),            # N aligned: nothing to gain
    (gemm((8, 64), (33, 64), (33,), mode="gemm", transB=1), "already stored transposed"),
    (gemm((3, 8, 64), (3, 64, 33), None), "not one matrix shared"),     # B per batch
    (gemm((8, 7), (7, 33), None), "K=7"),                               # K rows would be unaligned too
    (conv((2, 24, 5, 7), (40, 24, 1, 1)), "for GemmAct"),
])
def test_b_transposed_variant_near_misses_say_why(emulated, sig, why):
    _refused_with(sig, why, prov.b_transposed_reason, prov.NAME_BT)


PADDED = [
    gemm((8, 64), (64, 33), activation="Relu"),                       # fp16, N odd (GPT-2's LM head: 50257)
    gemm((3, 7, 64), (64, 9), None, dtype="float32"),                 # batch folded into M, no bias
    gemm((8, 64), (33, 64), (33,), mode="gemm", transB=1),             # B already stored transposed
    gemm((2, 4, 5, 32), (32, 15), (1, 15), activation="GeluTanh"),    # B shared by a 2-D batch
    gemm((3, 5, 32), (32, 15), None, dtype="float32"),                # fp32, N odd
]


@pytest.mark.parametrize("sig", PADDED, ids=lambda s: s.key()[:60])
def test_padded_output_variant_writes_padded_rows_then_packs_them(emulated, sig):
    """cublaslt_pad: D's rows padded to 16 bytes in the workspace (ld = N rounded up), computed by two
    calls (the aligned part of N, then the 1-7 rest beside it), then packed into Y; the workspace
    holds D and cuBLASLt's own workspace after it; same result as the op."""
    assert prov.padded_output_reason(sig) is None
    cands = [c for c in prov.candidates(sig.op, sig) if c.name == prov.NAME_PAD]
    assert cands and cands[0].key() == "cublaslt_pad" and all(prov.from_key("GemmAct", c.key()) == c for c in cands)
    host, ref = _host_and_reference(sig, 5)
    dt = np.dtype(sig.dtypes[0])
    n = ref.shape[-1]
    ld = prov.padded_ld(n, sig.dtypes[0])
    assert ld > n and (ld * dt.itemsize) % 16 == 0
    main = n // (16 // dt.itemsize) * (16 // dt.itemsize)
    for cand in (cands[0], cands[-1]):
        low = cand.build(sig, "sm_90")
        d_bytes = int(np.prod(ref.shape)) // n * ld * dt.itemsize
        assert low.workspace_bytes >= d_bytes
        ins = low.conform([None if h is None else _aligned(h) for h in host], np)
        ws = _aligned(np.full(low.workspace_bytes, 0xFF, np.uint8))  # poisoned: NaN rows if the packing misses
        before = len(emulated.log)
        out = _launch_matches_reference(low, ins, ref, dt, ws, cand.key())
        d_ptrs = [e[1] - ws.ctypes.data for e in emulated.log[before:] if e[0] == "matmul_d"]
        assert d_ptrs == [0, main * dt.itemsize]  # the rest's D starts after the aligned rows
        with pytest.raises(Exception, match="workspace"):
            low.launch(ins, [out], None)
    d_layouts = {(e[3], e[5]) for e in emulated.log if e[0] == "layout" and e[5] == ld}
    assert d_layouts == {(main, ld), (n - main, ld)}  # D: the aligned rows (ours: columns), then the rest


@pytest.mark.parametrize("sig, why", [
    (gemm((8, 64), (64, 32)), "already 16-byte multiples"),            # Y's rows aligned: nothing to gain
    (gemm((3, 8, 64), (3, 64, 33), None), "not one matrix shared"),     # B per batch, not transposed
    (gemm((8, 7), (7, 33), None), "K=7"),                               # K rows would be unaligned too
    (gemm((8, 64), (64, 5), None), "under one 16-byte row"),            # no aligned part to split off
    (conv((2, 24, 5, 7), (40, 24, 1, 1)), "for GemmAct"),
])
def test_padded_output_variant_near_misses_say_why(emulated, sig, why):
    _refused_with(sig, why, prov.padded_output_reason, prov.NAME_PAD)


@pytest.mark.parametrize("sig", PADDED, ids=lambda s: s.key()[:60])
def test_rowpad_variant_writes_y_in_place_in_its_declared_row_padded_layout(emulated, sig):
    """cublaslt_rowpad: the pad variant's two calls straight into Y, which it declares ``rowpad`` (rows
    16-byte aligned: a ``[..., :N]`` view of a padded buffer): no workspace D and no packing copy.
    The output the contract allocates has that layout; a C-contiguous one is refused, saying why."""
    from graphopt.lowering import layout

    cands = [c for c in prov.candidates(sig.op, sig) if c.name == prov.NAME_ROWPAD]
    assert cands and cands[0].key() == "cublaslt_rowpad" and all(prov.from_key("GemmAct", c.key()) == c for c in cands)
    host, ref = _host_and_reference(sig, 7)
    dt = np.dtype(sig.dtypes[0])
    n = ref.shape[-1]
    main = n // (16 // dt.itemsize) * (16 // dt.itemsize)
    for cand in (cands[0], cands[-1]):
        low = cand.build(sig, "sm_90")
        assert low.output_layout(len(host), 0) == "rowpad" and cand.layouts(sig) == low.layouts
        assert low.workspace_bytes <= 1 << 20  # the library's own workspace only (FakeLt's largest)
        ins = low.conform([None if h is None else _aligned(h) for h in host], np)
        before = len(emulated.log)
        out = _launch_matches_reference(low, ins, ref, dt, _aligned(np.zeros(max(1, low.workspace_bytes), np.uint8)),
                                        cand.key())
        assert layout.is_layout(out, "rowpad") and not out.flags.c_contiguous
        assert out.strides[-2] == prov.padded_ld(n, sig.dtypes[0]) * dt.itemsize
        d_ptrs = [e[1] - out.ctypes.data for e in emulated.log[before:] if e[0] == "matmul_d"]
        assert d_ptrs == [0, main * dt.itemsize]  # both calls write Y itself, the rest beside the aligned rows
        with pytest.raises(Exception, match="rowpad"):
            low.launch(ins, [np.empty(ref.shape, dt)], None)


@pytest.mark.parametrize("sig, why", [
    (gemm((8, 64), (64, 32)), "already 16-byte multiples"),
    (gemm((8, 64), (64, 5), None), "under one 16-byte row"),
    (conv((2, 24, 5, 7), (40, 24, 1, 1)), "for GemmAct"),
])
def test_rowpad_variant_near_misses_say_why(emulated, sig, why):
    _refused_with(sig, why, prov.padded_output_reason, prov.NAME_ROWPAD)


def _fake_activation_kernel(calls):
    """Stands in for ``epilogue_gemm_vec`` (no bias, alpha 1): applies the activation code to Y in place."""
    from math import erf

    def kernel(grid, block, args):
        y, bias, total, n, alpha, beta, code, a_alpha, a_beta, lo, hi = args
        calls.append((int(code), int(total), int(n)))
        assert int(total) == y.size and float(alpha) == 1.0 and float(beta) == 0.0
        x = y.astype(np.float64)
        f = {8: np.vectorize(lambda v: 0.5 * v * (1 + erf(v / np.sqrt(2)))), 5: lambda v: v / (1 + np.exp(-v)),
             2: lambda v: np.clip(v, float(lo), float(hi))}[int(code)]
        y[...] = f(x).astype(y.dtype)

    return kernel


POST_ACT = [
    gemm((8, 64), (64, 32), activation="Gelu"),                              # BERT's erf-GELU MLP
    gemm((3, 7, 64), (64, 16), None, activation="SiLU", dtype="float32"),   # no bias: DEFAULT epilogue
    conv((2, 24, 5, 7), (40, 24, 1, 1), activation="Clip", clip_min=0.0, clip_max=6.0, dtype="float32"),  # ReLU6
]


@pytest.mark.parametrize("sig", POST_ACT, ids=lambda s: s.key()[:60])
def test_act_variant_runs_the_activation_after_a_bias_epilogue(emulated, monkeypatch, sig):
    """cublaslt_act: cuBLASLt with BIAS / DEFAULT, then the activation kernel in place: the op's result."""
    calls = []
    monkeypatch.setattr(gemm_act, "get_kernel", lambda src, expr: _fake_activation_kernel(calls))
    assert prov.post_activation_reason(sig) is None
    assert "has no cuBLASLt epilogue" in prov.CublasLtGemm("cublaslt").applies(sig)  # the plain family cannot
    pr = prov.problem(sig, "act")
    has_bias = len(sig.input_shapes) > 2 and sig.input_shapes[2] is not None
    assert pr.epilogue == ("CUBLASLT_EPILOGUE_BIAS" if has_bias else "CUBLASLT_EPILOGUE_DEFAULT")
    cands = [c for c in prov.candidates(sig.op, sig) if c.name == prov.NAME_ACT]
    assert cands and all(prov.from_key(sig.op, c.key()) == c for c in cands)
    dt = np.dtype(sig.dtypes[0])
    assert cands[0].kernels(sig) == [("elementwise.cu", f"epilogue_gemm_vec<{'half_t' if dt == np.float16 else 'float'},"
                                                        f"{16 // dt.itemsize},1>")]
    assert cands[0].source_hash() != prov.CublasLtGemm("cublaslt").source_hash()
    host, ref = _host_and_reference(sig, 5)
    low = cands[-1].build(sig, "sm_90")
    ins = low.conform([None if h is None else _aligned(h) for h in host], np)
    out = low.empty_outputs(len(ins), [ref.shape], dt, np)[0]
    out[...] = np.nan
    low.launch(ins, [out], None)
    assert len(calls) == 1
    tol = 1e-5 if dt == np.float32 else 1e-2
    assert np.linalg.norm(out.astype(np.float64) - ref) <= tol * np.linalg.norm(ref)


@pytest.mark.parametrize("sig, why", [
    (gemm((8, 64), (64, 32), activation="GeluTanh"), "is a cuBLASLt epilogue"),
    (gemm((8, 64), (64, 32)), "is a cuBLASLt epilogue"),
    (gemm((8, 64), (64, 33), activation="Gelu"), "not whole 16-byte vectors"),
])
def test_act_variant_near_misses_say_why(emulated, sig, why):
    assert why in (prov.CublasLtGemm(prov.NAME_ACT).applies(sig) or "")
    assert not [c for c in prov.candidates(sig.op, sig) if c.name == prov.NAME_ACT]
