"""The channel-padded cuDNN CBR (graphopt.providers.cudnn_cpad) on the CPU: which convolutions it is for
(and the near misses it leaves alone), the padded graph it asks cuDNN for (against the fake ``cudnn``
module of test_provider_cudnn), its keys, its workspace and its launch: both operands padded into the
workspace, then the plan run on them. The padding itself is checked here on the kernel's NumPy
mirror; the kernel and the plan against the float64 reference run in tests/gpu."""

from __future__ import annotations

import types

import numpy as np
import pytest

from graphopt.kernels import registry
from graphopt.lowering import Lowering
from graphopt.providers import cudnn, cudnn_cpad as prov
from test_provider_cudnn import _fake_module, _sig

STEM = dict(x=(4, 3, 17, 19), w=(16, 3, 7, 7), strides=[2, 2], pads=[3, 3, 3, 3], activation="Relu")


@pytest.fixture()
def fake(monkeypatch):
    mod, log = _fake_module(plans=("eng4_k2=1", "eng9"))
    monkeypatch.setattr(cudnn, "_STATE", {"module": mod, "reason": None})
    monkeypatch.setattr(cudnn, "_GRAPHS", {})
    return mod, log


def test_for_stems_only():
    assert prov.pad_reason(_sig(**STEM)) is None
    assert prov.pad_reason(_sig(x=(2, 1, 9, 9), w=(4, 1, 3, 3))) is None                      # one channel
    assert "8 input channels" in prov.pad_reason(_sig(x=(2, 8, 9, 9), w=(4, 8, 3, 3)))       # near miss: already 8
    assert "grouped" in prov.pad_reason(_sig(x=(2, 4, 9, 9), w=(4, 1, 3, 3), group=4))
    assert "1-D" in prov.pad_reason(_sig(x=(2, 3, 17), w=(4, 3, 3), pads=[1, 1]))
    assert prov.pad_reason(_sig(**dict(STEM, activation="HardSwish"))) is None               # MobileNetV3's stem
    assert "QuickGelu" in prov.pad_reason(_sig(**dict(STEM, activation="QuickGelu")))
    assert prov.candidates("CBR", _sig(x=(2, 16, 9, 9), w=(4, 16, 3, 3))) == []
    assert prov.candidates("GemmAct", None) == []


def test_absent_frontend_is_a_reason_not_an_error(monkeypatch):
    monkeypatch.setattr(cudnn, "_STATE", {"module": None, "reason": "nvidia-cudnn-frontend is not importable (x)"})
    sig = _sig(**STEM)
    cands = prov.candidates("CBR", sig)
    assert [c.key() for c in cands] == ["cudnn_cpad"]
    assert "not importable" in cands[0].applies(sig, (9, 0))


def test_the_graph_is_the_padded_signatures(fake):
    mod, log = fake
    sig = _sig(**STEM, res=False)
    keys = [c.key() for c in prov.candidates("CBR", sig)]
    assert keys == ["cudnn_cpad", "cudnn_cpad:plan=eng4_k2=1", "cudnn_cpad:plan=eng9"]
    tensors = {e[1]: (e[2], e[3]) for e in log if e[0] == "tensor"}
    assert tensors["X"] == ([4, 8, 17, 19], [8 * 17 * 19, 1, 19 * 8, 8])  # NHWC, 8 channels
    assert tensors["W"] == ([16, 8, 7, 7], [8 * 49, 1, 7 * 8, 8])
    conv = next(e for e in log if e[0] == "conv_fprop")[1]
    assert conv["stride"] == [2, 2] and conv["pre_padding"] == [3, 3]
    # its own graph, not the unpadded one's: both providers list for the same node
    cudnn.candidates("CBR", sig)
    assert sum(e[0] == "pygraph" for e in log) == 2


def test_keys_parse_back_through_the_registry(fake):
    sig = _sig(**STEM)
    offered = {c.key() for c in registry.candidates_for(sig)}
    assert {"cudnn_cpad", "cudnn_cpad:plan=eng9"} <= offered and "cudnn:plan=eng9" in offered
    for key in ("cudnn_cpad", "cudnn_cpad:plan=eng9"):
        cand = registry.candidate_from_key("CBR", key)
        assert isinstance(cand, prov.CudnnPaddedConv) and cand.key() == key
    assert not isinstance(registry.candidate_from_key("CBR", "cudnn:plan=eng9"), prov.CudnnPaddedConv)


def test_workspace_holds_the_plans_and_both_padded_operands():
    sig = _sig(**STEM)
    from graphopt.lowering.contract import WORKSPACE_ALIGN

    x_off, w_off, total = prov.workspace_parts(sig, 1000)
    assert x_off == 1024 and x_off % WORKSPACE_ALIGN == 0 and w_off % WORKSPACE_ALIGN == 0
    assert w_off - x_off >= 4 * 17 * 19 * 8 * 2 and total - w_off >= 16 * 49 * 8 * 2
    assert prov.workspace_parts(sig, 0)[0] == 0


def _pad_mirror(x: np.ndarray, cp: int) -> np.ndarray:
    """What ``pad_channels_nhwc`` writes: [N][C][HW] -> [N][HW][Cp], zeros above C."""
    n, c = x.shape[:2]
    out = np.zeros((n, int(np.prod(x.shape[2:])), cp), x.dtype)
    out[:, :, :c] = x.reshape(n, c, -1).transpose(0, 2, 1)
    return out


class _Kernel:
    """Stands in for the NVRTC kernel: records the launch and pads like the CUDA source."""

    def __init__(self, calls):
        self.calls = calls

    def __call__(self, grid, block, args):
        src, dst, pixels, c, cp, hw = args
        self.calls.append((grid, block, int(pixels), int(c), int(cp), int(hw)))
        dst.view(src.dtype)[: int(pixels) * int(cp)] = _pad_mirror(src.reshape(-1, int(c), int(hw)), int(cp)).ravel()


def test_build_and_launch(fake, monkeypatch):
    mod, log = fake
    calls: list = []
    monkeypatch.setattr(prov, "get_kernel", lambda src, expr, arch=None: _Kernel(calls))
    cupy = types.SimpleNamespace(cuda=types.SimpleNamespace(get_current_stream=lambda: types.SimpleNamespace(ptr=7)),
                                 empty=lambda n, dtype=None: np.empty(n, np.uint8), uint8=np.uint8)
    monkeypatch.setitem(__import__("sys").modules, "cupy", cupy)
    monkeypatch.setattr("graphopt.lowering.barrier.barrier", lambda: calls.append("barrier"))
    sig = _sig(**STEM, res=True)
    low = prov.CudnnPaddedConv("cudnn_cpad", (("plan", "eng9"),)).build(sig, "sm_90")
    assert isinstance(low, Lowering)
    assert low.layouts == ("NCHW", "NCHW", "NHWC", "NHWC", "NHWC")
    assert low.capturable and low.barrier and low.outputs == 1
    assert low.workspace_bytes == prov.workspace_parts(sig, 2000)[2]  # plan eng9's 2000 bytes + the operands
    assert dict(low.versions) == {"cudnn": "91900", "cudnn_frontend": "1.32.0"}
    rng = np.random.default_rng(0)
    x = rng.standard_normal((4, 3, 17, 19)).astype(np.float16)
    w = rng.standard_normal((16, 3, 7, 7)).astype(np.float16)
    ws = np.full(low.workspace_bytes, 0xFF, np.uint8)  # poisoned: the zero channels must be written
    low.launch([x, w, np.zeros(16, np.float16), np.zeros((4, 16, 9, 10), np.float16)],
               [np.zeros((4, 16, 9, 10), np.float16)], ws)
    assert [c[2:] for c in calls if c != "barrier"] == [(4 * 17 * 19, 3, 8, 17 * 19), (16 * 49, 3, 8, 49)]
    x_off, w_off, total = prov.workspace_parts(sig, 2000)
    xp = ws[x_off:w_off].view(np.float16)[: 4 * 17 * 19 * 8].reshape(4, 17, 19, 8)
    assert np.array_equal(xp[..., :3], x.transpose(0, 2, 3, 1)) and not xp[..., 3:].any()
    wp = ws[w_off:total].view(np.float16)[: 16 * 49 * 8].reshape(16, 7, 7, 8)
    assert np.array_equal(wp[..., :3], w.transpose(0, 2, 3, 1)) and not wp[..., 3:].any()
    assert ("execute", ["B", "R", "W", "X", "relu"], 1) in log
