"""The convolution-then-epilogue cuDNN CBR (graphopt.providers.cudnn_split) on the CPU: which convolutions
it is for (and the near misses it leaves alone), the convolution-only graph it asks cuDNN for (against the
fake ``cudnn`` module of test_provider_cudnn), its keys, and its launch: the plan on X and W into Y, then
the bias + activation pass over Y (16-byte vectors where Y and the bias are aligned, else the scalar
pass; both emulated here from their CUDA source's arithmetic). The plans and the pass against the
float64 reference run in tests/gpu/test_cudnn_split_gpu.py."""

from __future__ import annotations

import math
import sys
import types

import numpy as np
import pytest

from graphopt.errors import TuningError

from graphopt.kernels import registry
from graphopt.lowering import Lowering
from graphopt.providers import cudnn, cudnn_split as prov
import test_provider_cudnn_cpad as cpad_tests
from test_provider_cudnn import _sig

STEM = cpad_tests.STEM
fake = cpad_tests.fake  # the fixture: the fake cuDNN frontend listing two plans for every graph


def test_for_stems_without_a_residual_only():
    assert prov.split_reason(_sig(**STEM)) is None
    assert prov.split_reason(_sig(**dict(STEM, bias=False))) is None
    assert prov.split_reason(_sig(**dict(STEM, activation="Clip", clip_min=0.0, clip_max=6.0))) is None
    assert "8 input channels" in prov.split_reason(_sig(x=(2, 8, 9, 9), w=(16, 8, 3, 3)))  # near miss: no stem
    assert "residual" in prov.split_reason(_sig(x=(2, 3, 9, 9), w=(16, 3, 3, 3), res=True))
    assert "multiple of 8" in prov.split_reason(_sig(x=(2, 3, 9, 9), w=(12, 3, 3, 3)))  # fp16: 8 a vector
    assert prov.split_reason(_sig(x=(2, 3, 9, 9), w=(12, 3, 3, 3), dtype="float32")) is None  # fp32: 4
    assert "grouped" in prov.split_reason(_sig(x=(2, 4, 9, 9), w=(4, 1, 3, 3), group=4))
    assert "1-D" in prov.split_reason(_sig(x=(2, 3, 17), w=(8, 3, 3), pads=[1, 1]))
    assert "QuickGelu" in prov.split_reason(_sig(**dict(STEM, activation="QuickGelu")))
    assert prov.candidates("CBR", _sig(x=(2, 16, 9, 9), w=(16, 16, 3, 3))) == []
    assert prov.candidates("GemmAct", None) == []


def test_absent_frontend_is_a_reason_not_an_error(monkeypatch):
    monkeypatch.setattr(cudnn, "_STATE", {"module": None, "reason": "nvidia-cudnn-frontend is not importable (x)"})
    sig = _sig(**STEM)
    cands = prov.candidates("CBR", sig)
    assert [c.key() for c in cands] == ["cudnn_split", "cudnn_split_cpad"]
    assert all("not importable" in c.applies(sig, (9, 0)) for c in cands)


def _graphs(log) -> list[list]:
    """The fake's log cut at each ``pygraph`` (one entry list per graph built)."""
    out: list[list] = []
    for e in log:
        if e[0] == "pygraph":
            out.append([])
        if out:
            out[-1].append(e)
    return out


def test_the_graph_is_the_convolution_alone(fake):
    mod, log = fake
    sig = _sig(**dict(STEM, activation="Gelu"))
    keys = [c.key() for c in prov.candidates("CBR", sig)]
    assert keys == ["cudnn_split", "cudnn_split:plan=eng4_k2=1", "cudnn_split:plan=eng9",
                    "cudnn_split_cpad", "cudnn_split_cpad:plan=eng4_k2=1", "cudnn_split_cpad:plan=eng9"]
    plain, padded = _graphs(log)
    for graph, channels in ((plain, 3), (padded, 8)):
        ops = [e[0] for e in graph]
        assert ops[:4] == ["pygraph", "tensor", "tensor", "conv_fprop"]
        assert not {"add", "gelu", "relu"} & set(ops)  # no bias, no activation in cuDNN's graph
        tensors = {e[1]: (e[2], e[3]) for e in graph if e[0] == "tensor"}
        assert set(tensors) == {"X", "W"}
        assert tensors["X"] == ([4, channels, 17, 19], [channels * 17 * 19, 1, 19 * channels, channels])  # NHWC
    assert not any(e[0] == "set_alignment" for e in plain + padded)  # cuDNN's own 16 bytes
    # its own graphs, not the fused one's: both providers list for the same node
    cudnn.candidates("CBR", sig)
    assert sum(e[0] == "pygraph" for e in log) == 3


def test_keys_parse_back_through_the_registry(fake):
    sig = _sig(**STEM)
    offered = {c.key() for c in registry.candidates_for(sig)}
    assert {"cudnn_split", "cudnn_split:plan=eng9", "cudnn:plan=eng9"} <= offered
    for key in ("cudnn_split", "cudnn_split:plan=eng9", "cudnn_split_cpad", "cudnn_split_cpad:plan=eng9"):
        cand = registry.candidate_from_key("CBR", key)
        assert isinstance(cand, prov.CudnnSplitConv) and cand.key() == key
        assert isinstance(cand, prov.CudnnSplitPaddedConv) == key.startswith("cudnn_split_cpad")
    assert not isinstance(registry.candidate_from_key("CBR", "cudnn:plan=eng9"), prov.CudnnSplitConv)
    with pytest.raises(TuningError, match="re-tune"):  # the removed 32-byte form: a recorded key says what to do
        registry.candidate_from_key("CBR", "cudnn_split_a32:plan=eng9")


def _act(v: np.ndarray, code: int, lo: float, hi: float) -> np.ndarray:
    if code == 0:
        return v
    if code == 1:
        return np.maximum(v, 0)
    if code == 2:
        return np.minimum(np.maximum(v, lo), hi)
    if code == 8:
        return 0.5 * v * (1 + np.vectorize(math.erf)(v / math.sqrt(2)))
    raise AssertionError(code)


class _Arr(np.ndarray):
    """A host array with the ``.data.ptr`` the lowering reads for alignment."""

    offset = 0

    def __array_finalize__(self, obj):  # a view (a transpose, a slice) keeps its base's offset
        self.offset = getattr(obj, "offset", 0)

    @property
    def data(self):  # noqa: D401 - mirrors cupy.ndarray.data
        return type("P", (), {"ptr": 4096 + self.offset})()


def _arr(a: np.ndarray, offset: int = 0) -> _Arr:
    out = np.ascontiguousarray(a).view(_Arr)
    out.offset = offset
    return out


class _Epilogue:
    """Stands in for ``epilogue_gemm_vec`` / ``epilogue_gemm``: records which ran and applies the pass
    as their CUDA source does (fp32 arithmetic, y = act(alpha * y + beta * bias[column]))."""

    def __init__(self, name, calls):
        self.name, self.calls = name, calls

    def __call__(self, grid, block, args):
        y, bias = args[0], args[1]
        if self.name == "epilogue_gemm_vec":  # the bias is one row of n values
            total, n, alpha, beta, code, _, _, lo, hi = args[2:]
            r_stride, c_stride = 0, 1
        else:  # bias[b * sb + r * sr + c * sc] over a [rows][n] output (one batch)
            total, rows_, n, _, r_stride, c_stride, alpha, beta, code, _, _, lo, hi = args[2:]
            assert int(rows_) * int(n) == int(total)
        self.calls.append(self.name)
        rows = y.reshape(-1, int(n)).astype(np.float32)
        v = float(alpha) * rows
        if bias is not None:
            r, c = np.indices(rows.shape)
            v = v + float(beta) * np.asarray(bias, np.float32)[r * int(r_stride) + c * int(c_stride)]
        y.reshape(-1, int(n))[...] = _act(v, int(code), float(lo), float(hi)).astype(y.dtype)


@pytest.mark.parametrize("act,extra,code", [("Relu", {}, 1), ("Clip", {"clip_min": 0.0, "clip_max": 6.0}, 2), ("Gelu", {}, 8)])
@pytest.mark.parametrize("aligned", [True, False])
def test_build_and_launch(fake, monkeypatch, act, extra, code, aligned):
    from graphopt.kernels import gemm_act

    mod, log = fake
    calls: list = []
    fake_kernel = lambda src, expr, arch=None: _Epilogue(expr.split("<")[0], calls)  # noqa: E731
    monkeypatch.setattr(gemm_act, "get_kernel", fake_kernel)
    cupy = types.SimpleNamespace(cuda=types.SimpleNamespace(get_current_stream=lambda: types.SimpleNamespace(ptr=7)))
    monkeypatch.setitem(sys.modules, "cupy", cupy)
    monkeypatch.setattr("graphopt.lowering.barrier.barrier", lambda: calls.append("barrier"))
    sig = _sig(**dict(STEM, activation=act, **extra))
    low = prov.CudnnSplitConv("cudnn_split", (("plan", "eng9"),)).build(sig, "sm_90")
    assert isinstance(low, Lowering)
    assert low.layouts == ("NHWC",) * 5 and low.capturable and low.barrier and low.outputs == 1
    assert low.workspace_bytes == 2000  # plan eng9's, nothing of its own
    assert dict(low.versions) == {"cudnn": "91900", "cudnn_frontend": "1.32.0"}
    rng = np.random.default_rng(0)
    conv = rng.standard_normal((4 * 9 * 10, 16)).astype(np.float16)  # what the plan "wrote", NHWC rows
    bias = rng.standard_normal(16).astype(np.float16)
    y = _arr(conv.copy())
    b = _arr(bias, 0 if aligned else 2)
    low.launch([np.zeros((4, 3, 17, 19), np.float16), np.zeros((16, 3, 7, 7), np.float16), b], [y], np.zeros(2000, np.uint8))
    assert ("execute", ["W", "X", "conv_fprop"], 1) in log  # the plan ran on X and W alone, into Y
    assert calls[-1] == ("epilogue_gemm_vec" if aligned else "epilogue_gemm")
    want = _act(conv.astype(np.float64) + bias.astype(np.float64), code, 0.0, 6.0)
    assert np.abs(np.asarray(y, np.float64) - want).max() <= 2e-3 * max(1.0, np.abs(want).max())


def test_a_bare_convolution_runs_no_pass(fake, monkeypatch):
    calls: list = []
    monkeypatch.setattr("graphopt.kernels.gemm_act.get_kernel", lambda src, expr, arch=None: _Epilogue(expr.split("<")[0], calls))
    cupy = types.SimpleNamespace(cuda=types.SimpleNamespace(get_current_stream=lambda: types.SimpleNamespace(ptr=7)))
    monkeypatch.setitem(sys.modules, "cupy", cupy)
    monkeypatch.setattr("graphopt.lowering.barrier.barrier", lambda: None)
    sig = _sig(**dict(STEM, activation="none", bias=False))
    low = prov.CudnnSplitConv("cudnn_split", (("plan", "eng9"),)).build(sig, "sm_90")
    y = _arr(np.ones((4 * 9 * 10, 16), np.float16))
    low.launch([np.zeros((4, 3, 17, 19), np.float16), np.zeros((16, 3, 7, 7), np.float16), None], [y], np.zeros(2000, np.uint8))
    assert calls == [] and np.all(np.asarray(y) == 1)


def test_the_padded_form_pads_then_convolves_then_runs_the_pass(fake, monkeypatch):
    from graphopt.kernels import gemm_act
    from graphopt.providers import cudnn_cpad
    from test_provider_cudnn_cpad import _Kernel

    mod, log = fake
    pads: list = []
    passes: list = []
    fake_epilogue = lambda src, expr, arch=None: _Epilogue(expr.split("<")[0], passes)  # noqa: E731
    monkeypatch.setattr(gemm_act, "get_kernel", fake_epilogue)
    monkeypatch.setattr(cudnn_cpad, "get_kernel", lambda src, expr, arch=None: _Kernel(pads))
    cupy = types.SimpleNamespace(cuda=types.SimpleNamespace(get_current_stream=lambda: types.SimpleNamespace(ptr=7)))
    monkeypatch.setitem(sys.modules, "cupy", cupy)
    monkeypatch.setattr("graphopt.lowering.barrier.barrier", lambda: None)
    sig = _sig(**STEM)
    low = prov.CudnnSplitPaddedConv(prov.NAME_PAD, (("plan", "eng9"),)).build(sig, "sm_90")
    assert low.layouts == cudnn_cpad.LAYOUTS  # X NCHW and W OIHW, read by the padding; Y NHWC
    assert low.workspace_bytes == cudnn_cpad.workspace_parts(sig, 2000)[2]  # the plan's and both padded operands
    assert ("elementwise.cu", "pad_channels_nhwc<half_t>") in prov.CudnnSplitPaddedConv(prov.NAME_PAD).kernels(sig)
    rng = np.random.default_rng(1)
    x = rng.standard_normal((4, 3, 17, 19)).astype(np.float16)
    w = rng.standard_normal((16, 3, 7, 7)).astype(np.float16)
    conv = rng.standard_normal((4 * 9 * 10, 16)).astype(np.float16)
    bias = rng.standard_normal(16).astype(np.float16)
    y = _arr(conv.copy())
    ws = np.full(low.workspace_bytes, 0xFF, np.uint8)
    low.launch([x, w, _arr(bias)], [y], ws)
    assert [c[2:] for c in pads] == [(4 * 17 * 19, 3, 8, 17 * 19), (16 * 49, 3, 8, 49)]
    assert ("execute", ["W", "X", "conv_fprop"], 1) in log
    bound = next(b.graph.bound for b in cudnn._GRAPHS.values() if hasattr(b.graph, "bound"))  # what the plan ran on
    xp = bound["X"].ravel()[: 4 * 17 * 19 * 8].reshape(4, 17, 19, 8)
    assert np.array_equal(xp[..., :3], x.transpose(0, 2, 3, 1)) and not xp[..., 3:].any()  # padded NHWC, zeros above C
    assert passes == ["epilogue_gemm_vec"]
    want = np.maximum(conv.astype(np.float64) + bias.astype(np.float64), 0)
    assert np.abs(np.asarray(y, np.float64) - want).max() <= 2e-3 * max(1.0, np.abs(want).max())


def test_a_frontend_without_lowered_tensors_refuses_a_declared_alignment(fake, monkeypatch):
    """``cudnn.listed(..., alignment=32)`` (the align probe's graphs) needs the frontend's lowered tensors to
    declare it on; a frontend without them refuses that graph, once, and still lists the plain one."""
    from _fake_cudnn import FakeGraph

    monkeypatch.setattr(FakeGraph, "validate", lambda self: self.log.append(("validate",)))  # no _cpp_tensors
    sig = prov.conv_only(_sig(**STEM))
    with pytest.raises(cudnn.GraphRefused, match="no lowered tensors"):
        cudnn.listed(sig, cudnn.conv_graph, "|a32test", alignment=32)
    with pytest.raises(cudnn.GraphRefused, match="no lowered tensors"):  # remembered, not rebuilt
        cudnn.listed(sig, cudnn.conv_graph, "|a32test", alignment=32)
    assert prov._graph_for(_sig(**STEM)).names  # the plain form still lists its plans
