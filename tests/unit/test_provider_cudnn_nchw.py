"""``cudnn_nchw``: CBR as cuDNN's fused graph with every tensor NCHW. CPU side against the fake
``cudnn`` module of ``test_provider_cudnn``: the graph's strides, its own listing (not the NHWC
graph's), the plan limit, keys that parse back, and the NCHW layouts the built lowering declares."""

from __future__ import annotations

import sys
import types
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent))
from test_provider_cudnn import _fake_module, _sig  # noqa: E402

from graphopt.kernels import registry  # noqa: E402
from graphopt.lowering import Lowering  # noqa: E402
from graphopt.providers import cudnn as base  # noqa: E402
from graphopt.providers import cudnn_nchw as prov  # noqa: E402


@pytest.fixture()
def fake(monkeypatch):
    mod, log = _fake_module(plans=tuple(f"eng{i}" for i in range(9)))
    monkeypatch.setattr(base, "_STATE", {"module": mod, "reason": None})
    monkeypatch.setattr(base, "_GRAPHS", {})
    return mod, log


def test_the_graph_is_nchw_through_strides(fake):
    mod, log = fake
    sig = _sig(x=(2, 8, 9, 11), w=(16, 8, 3, 3), res=True, activation="Relu")
    prov._nchw_graph(mod, "h", sig)
    tensors = {e[1]: (e[2], e[3]) for e in log if e[0] == "tensor"}
    assert tensors["X"] == ([2, 8, 9, 11], [8 * 9 * 11, 9 * 11, 11, 1])
    assert tensors["W"] == ([16, 8, 3, 3], [72, 9, 3, 1])  # OIHW, as the model has it
    assert tensors["R"] == ([2, 16, 9, 11], [16 * 9 * 11, 9 * 11, 11, 1])
    assert ("set_stride", "relu", [16 * 9 * 11, 9 * 11, 11, 1]) in log


def test_own_listing_limited_plans_and_keys_that_parse_back(fake):
    mod, log = fake
    sig = _sig(activation="Relu")
    keys = [c.key() for c in prov.candidates("CBR", sig)]
    assert keys == ["cudnn_nchw"] + [f"cudnn_nchw:plan=eng{i}" for i in range(prov.MAX_PLANS)]
    nhwc = [c.key() for c in base.candidates("CBR", sig)]
    assert len(nhwc) == 10  # the NHWC graph keeps every plan
    assert sum(e[0] == "pygraph" for e in log) == 2  # two graphs, listed separately
    all_keys = [c.key() for c in registry.candidates_for(sig)]
    assert set(keys) <= set(all_keys) and set(nhwc) <= set(all_keys)
    for k in keys:
        assert registry.candidate_from_key("CBR", k).key() == k
    assert type(registry.candidate_from_key("CBR", "cudnn:plan=eng1")) is base.CudnnConv
    assert prov.candidates("GemmAct", sig) == []


def test_build_declares_nchw_layouts_and_launches_the_nchw_graph(fake, monkeypatch):
    mod, log = fake
    sig = _sig(activation="HardSwish", res=True)
    cand = prov.CudnnNchwConv("cudnn_nchw", (("plan", "eng2"),))
    assert cand.layouts(sig) == ("NCHW",) * 5 and cand.applies(sig, (9, 0)) is None
    low = cand.build(sig, "sm_90")
    assert isinstance(low, Lowering) and low.layouts == ("NCHW",) * 5 and low.capturable and low.barrier
    assert low.workspace_bytes == 3000
    cupy = types.SimpleNamespace(cuda=types.SimpleNamespace(get_current_stream=lambda: types.SimpleNamespace(ptr=7)),
                                 empty=lambda n, dtype=None: np.empty(n, np.uint8), uint8=np.uint8)
    monkeypatch.setitem(sys.modules, "cupy", cupy)
    x = np.zeros((2, 8, 9, 11), np.float16)
    low.launch([x, np.zeros((16, 8, 3, 3), np.float16), np.zeros(16, np.float16), np.zeros((2, 16, 9, 11), np.float16)],
               [np.zeros((2, 16, 9, 11), np.float16)], np.empty(3000, np.uint8))
    executed = [e for e in log if e[0] == "execute"]
    assert executed and {"X", "W", "B", "R", "act_alpha", "act_beta"} <= set(executed[-1][1])
    assert base._GRAPHS.keys() == {sig.key() + "|nchw"}  # the NCHW graph, not cudnn's


class _NotSupported(Exception):
    pass


@pytest.mark.parametrize("error, verdict", [(_NotSupported, True), (ValueError, False)])
def test_a_refused_graph_is_remembered_in_the_process_and_on_disk(monkeypatch, tmp_path, error, verdict):
    """cuDNN's ``cudnnGraphNotSupportedError`` is a verdict for this GPU and version: the graph is not
    built again in the process, nor in a fresh one (an empty listing on disk); any other failure is
    not remembered (it may be a bug or pass)."""
    from graphopt.providers import cudnn_listing

    mod, log = _fake_module()
    mod.cudnnGraphNotSupportedError = _NotSupported

    def refusing(**kw):
        log.append(("pygraph", kw))
        g = types.SimpleNamespace(tensor=lambda **k: types.SimpleNamespace(set_output=lambda v: None),
                                  conv_fprop=lambda **k: None)

        def validate():
            raise error("no engine for this graph")
        g.validate = validate
        return g

    mod.pygraph = refusing
    monkeypatch.setattr(base, "_STATE", {"module": mod, "reason": None})
    monkeypatch.setattr(base, "_GRAPHS", {})
    monkeypatch.setattr(base, "_REFUSED", {})
    monkeypatch.setattr(base, "_device_tag", lambda: "NVIDIA H200 sm_90")
    monkeypatch.setattr(base, "conv_graph", lambda m, h, sig, layout="NHWC": (m.pygraph(), {}))
    monkeypatch.setenv("GRAPHOPT_KERNEL_CACHE", str(tmp_path))
    monkeypatch.setattr(cudnn_listing, "_MEMO", {})
    sig = _sig(activation="Relu")
    builds = lambda: sum(e[0] == "pygraph" for e in log)  # noqa: E731
    assert [c.key() for c in prov.candidates("CBR", sig)] == ["cudnn_nchw"]  # the heuristic one says why
    assert builds() == 1
    prov.candidates("CBR", sig)
    assert builds() == (1 if verdict else 2)
    monkeypatch.setattr(base, "_REFUSED", {})  # a fresh process
    monkeypatch.setattr(cudnn_listing, "_MEMO", {})
    prov.candidates("CBR", sig)
    assert builds() == (1 if verdict else 3)
    with pytest.raises(base.GraphRefused if verdict else ValueError, match="no engine"):
        prov.CudnnNchwConv("cudnn_nchw").build(sig, "sm_90")


def test_one_spatial_position_is_left_to_the_nhwc_graph(fake):
    """A 1x1 input and output (a squeeze-excite 1x1 convolution): NCHW is NHWC's memory, and cuDNN's
    NCHW engines wrote wrong answers there on the H200 at bs32; the NHWC candidate keeps every plan.
    Near misses: one position in but not out (a padded 1x1 input), or out but not in (a 3x3 window)."""
    mod, log = fake
    se = _sig(x=(32, 240, 1, 1), w=(10, 240, 1, 1), activation="SiLU", pads=[0, 0, 0, 0])
    cand = prov.CudnnNchwConv("cudnn_nchw")
    assert "one spatial position" in cand.applies(se, (9, 0))
    assert [c.key() for c in prov.candidates("CBR", se)] == ["cudnn_nchw"]  # nothing listed, nothing built
    assert not any(e[0] == "pygraph" for e in log)
    assert base.CudnnConv("cudnn").applies(se, (9, 0)) is None and len(base.candidates("CBR", se)) == 10
    padded = _sig(x=(2, 8, 1, 1), w=(16, 8, 1, 1), activation="Relu", pads=[1, 1, 1, 1])
    window = _sig(x=(2, 8, 3, 3), w=(16, 8, 3, 3), activation="Relu", pads=[0, 0, 0, 0])
    for sig in (padded, window):
        assert cand.applies(sig, (9, 0)) is None and len(prov.candidates("CBR", sig)) == 1 + prov.MAX_PLANS
