"""CBR's ``depthwise_nhwc`` on the CPU: where it applies, its key and declared layouts, and what its
launch refuses. Its values: tests/unit/test_cbr_depthwise_sim.py (the kernel simulated thread by
thread on the real launch arguments) and tests/gpu/test_cbr_gpu.py (the kernel itself)."""

from __future__ import annotations

import types

import numpy as np
import pytest

from graphopt.kernels import cbr_depthwise
from graphopt.kernels.cbr import cbr_candidates
from graphopt.kernels.registry import candidate_from_key
from graphopt.lowering.contract import Lowering, Signature
from graphopt.lowering.layout import to_layout


def _sig(xs, ws, attrs, dtype="float16", bias=True, res=None):
    return Signature.make("CBR", [xs, ws, (ws[0],) if bias else None, res], [dtype] * 4, attrs)


def test_it_applies_to_depthwise_layers_only_and_says_why_not():
    dw = _sig((2, 24, 13, 11), (24, 1, 3, 3), {"group": 24, "activation": "Relu"})
    assert cbr_depthwise.depthwise_reason(dw) is None
    assert "depthwise" in cbr_depthwise.depthwise_reason(_sig((2, 8, 9, 9), (16, 1, 3, 3), {"group": 8}))  # multiplier 2
    assert "depthwise" in cbr_depthwise.depthwise_reason(_sig((2, 8, 9, 9), (8, 8, 3, 3), {}))
    assert "residual" in cbr_depthwise.depthwise_reason(_sig((2, 8, 9, 9), (8, 1, 3, 3), {"group": 8}, res=(2, 8, 9, 9)))
    many = 32 * cbr_depthwise.MAX_GRID_Y + 1  # one channel a thread, 32 a tile: one tile past the grid's rows
    assert "channel tiles" in cbr_depthwise.depthwise_reason(_sig((1, many, 1, 1), (many, 1, 1, 1), {"group": many}))
    assert cbr_depthwise.depthwise_reason(_sig((1, many - 1, 1, 1), (many - 1, 1, 1, 1), {"group": many - 1})) is None
    cand = next(c for c in cbr_candidates() if c.name == "depthwise_nhwc")
    assert candidate_from_key("CBR", cand.key()) == cand
    assert cand.layouts(dw) == ("NHWC", "NCHW", "NHWC", "NHWC", "NHWC")
    low = Lowering(launch=lambda i, o, w: None, layouts=cand.layouts(dw))
    assert low.output_layout(3, 0) == "NHWC"  # a node with a bias and no residual: Y is NHWC


@pytest.fixture()
def recorder(monkeypatch):
    """Launches recorded, not run (tests/unit/test_cbr_depthwise_sim.py simulates the kernel itself)."""
    launches = []
    monkeypatch.setattr(cbr_depthwise, "get_kernel", lambda source, expr: lambda grid, block, args: launches.append(expr))
    return launches


class _Dev(np.ndarray):
    @property
    def data(self):
        return types.SimpleNamespace(ptr=self.__array_interface__["data"][0])


def _dev(a):
    out = np.empty_like(a).view(_Dev) if a.flags.c_contiguous else a.view(_Dev)
    out[...] = a
    return out


def test_inputs_outside_its_declared_layouts_are_refused(recorder):
    from graphopt.errors import TuningError

    sig = _sig((2, 24, 13, 11), (24, 1, 3, 3), {"group": 24})
    low = cbr_depthwise.DepthwiseNhwcConv("depthwise_nhwc", ()).build(sig, "sm_90")
    x = _dev(np.zeros((2, 24, 13, 11), np.float16))  # NCHW
    y = to_layout(np.zeros((2, 24, 11, 9), np.float16), "NHWC", np).view(_Dev)
    with pytest.raises(TuningError, match="NHWC"):
        low.launch([x, _dev(np.zeros((24, 1, 3, 3), np.float16)), None, None], [y], None)
    assert recorder == []


def test_wrong_weights_or_bias_are_refused_and_an_empty_batch_launches_nothing(recorder):
    from graphopt.errors import TuningError

    sig = _sig((2, 24, 13, 11), (24, 1, 3, 3), {"group": 24})
    low = cbr_depthwise.DepthwiseNhwcConv("depthwise_nhwc", ()).build(sig, "sm_90")
    x = to_layout(np.zeros((2, 24, 13, 11), np.float16), "NHWC", np).view(_Dev)
    y = to_layout(np.zeros((2, 24, 11, 9), np.float16), "NHWC", np).view(_Dev)
    w = _dev(np.zeros((24, 1, 3, 3), np.float16))
    with pytest.raises(TuningError, match="W must be"):
        low.launch([x, _dev(np.zeros((24, 1, 5, 5), np.float16)), None], [y], None)
    with pytest.raises(TuningError, match="B must be"):
        low.launch([x, w, _dev(np.zeros(23, np.float16))], [y], None)
    assert recorder == []
    empty = cbr_depthwise.DepthwiseNhwcConv("depthwise_nhwc", ()).build(
        _sig((0, 24, 13, 11), (24, 1, 3, 3), {"group": 24}), "sm_90")
    xe = to_layout(np.zeros((0, 24, 13, 11), np.float16), "NHWC", np).view(_Dev)
    ye = to_layout(np.zeros((0, 24, 11, 9), np.float16), "NHWC", np).view(_Dev)
    empty.launch([xe, w, None], [ye], None)
    assert recorder == []


def test_row_groups_apply_to_unrolled_windows_at_vertical_stride_one_only():
    rows = cbr_depthwise.DepthwiseNhwcConv("depthwise_nhwc", (("rows", 4),))
    assert rows.key() == "depthwise_nhwc:rows=4" and candidate_from_key("CBR", rows.key()) == rows
    assert rows in cbr_candidates()
    ok = _sig((2, 24, 13, 11), (24, 1, 3, 3), {"group": 24, "strides": [1, 2], "dilations": [1, 2], "pads": [1, 2, 1, 2]})
    assert rows.applies(ok) is None
    assert "vertical stride 2" in rows.applies(_sig((2, 24, 13, 11), (24, 1, 3, 3), {"group": 24, "strides": [2, 1]}))
    assert "dilation 2" in rows.applies(_sig((2, 24, 13, 11), (24, 1, 3, 3), {"group": 24, "dilations": [2, 1]}))
    assert "unrolled" in rows.applies(_sig((2, 24, 13, 11), (24, 1, 7, 7), {"group": 24}))
    assert "depthwise" in rows.applies(_sig((2, 8, 9, 9), (8, 8, 3, 3), {}))
    assert rows.kernels(ok) == [("depthwise_nhwc.cu", "depthwise_nhwc<half_t,8,3,3,4>"), ("depthwise_nhwc.cu", "depthwise_nhwc<half_t,1,3,3,4>")]
