"""graphopt.kernels.check: the sampled convolution reference equals the full one (NumPy only), and on
the GPU the checker accepts a correct lowering and rejects a wrong or incomplete one."""

from __future__ import annotations

import numpy as np
import pytest

from graphopt.kernels import check
from graphopt.lowering.contract import Signature

SIG = Signature.make("CBR", [(2, 12, 9, 11), (18, 4, 3, 3), (18,), (2, 18, 5, 8)], ["float32"] * 4,
                     {"group": 3, "strides": [2, 1], "pads": [1, 0, 2, 1], "dilations": [1, 2], "activation": "Clip",
                      "clip_min": -0.3, "clip_max": 0.8})


def test_sampled_reference_matches_full_reference():
    from graphopt.ops import get_schema

    rng = np.random.default_rng(3)
    inputs = check.random_inputs(SIG, rng)
    idx, sampled = check._sampled_cbr_reference(SIG, inputs, rng)
    full = np.asarray(get_schema("CBR").reference([a.astype(np.float64) for a in inputs], dict(SIG.attrs))[0]).reshape(-1)
    assert full.shape[0] == int(np.prod(check.output_shape(SIG)))
    np.testing.assert_allclose(sampled, full[idx], rtol=1e-12, atol=1e-12)


def test_compare_reports_unwritten_and_wrong():
    ref = np.linspace(-1, 1, 50)
    assert check.compare(ref.copy(), ref, None, "float32") is None
    out = ref.copy(); out[3] = np.nan
    assert "not written" in check.compare(out, ref, None, "float32")
    assert "wrong result" in check.compare(ref * 1.1, ref, None, "float32")


@pytest.mark.gpu
def test_checker_on_gpu():
    pytest.importorskip("cupy")
    from _harness import require_device

    require_device()
    from graphopt.kernels.registry import candidate_from_key
    from graphopt.kernels.source import device_arch

    cand = candidate_from_key("CBR", "direct:opt=1")
    launch = cand.build(SIG, device_arch())
    assert check.checker(SIG, launch) is None
    assert "not written" in check.checker(SIG, lambda ins, outs: None)

    def wrong(ins, outs):
        launch(ins, outs)
        outs[0] *= 1.5

    assert "wrong result" in check.checker(SIG, wrong)
    ins, outs = check.buffers(SIG)
    assert tuple(outs[0].shape) == check.output_shape(SIG) and len(ins) == 4


def test_compare_counts_what_the_caller_found_unwritten():
    """The GPU checker counts non-finite outputs on the device and sends only the sampled ones: a NaN
    outside the sample still fails the check."""
    ref = np.linspace(-1, 1, 50)
    assert "7 outputs not written" in check.compare(ref.copy(), ref, True, "float16", nonfinite=7)

