"""Every CBR lowering that declares layouts gives a node the same output layout whether it has a bias
and a residual or not: outputs are read after the inputs a node actually has (``Lowering.layouts``),
so the optional slots repeat the output's layout. A slot left "" there made a CBR without bias
allocate its NHWC output in NCHW (the checker then failed the candidate; ``depthwise_nhwc`` was never
chosen for a 3-input node)."""

from __future__ import annotations

import pytest

from graphopt.kernels.cbr import cbr_candidates
from graphopt.lowering.contract import Lowering, Signature
from graphopt.providers import cublaslt_problem, cudnn, cudnn_cpad

DW = Signature.make("CBR", [(2, 24, 13, 11), (24, 1, 3, 3), (24,)], ["float16"] * 3,
                    {"group": 24, "kernel_shape": [3, 3], "activation": "Relu"})
DENSE = Signature.make("CBR", [(2, 24, 13, 11), (32, 24, 1, 1), (32,)], ["float16"] * 3,
                       {"kernel_shape": [1, 1], "activation": "Relu"})


def _declared():
    out = {}
    for sig in (DW, DENSE):
        for cand in cbr_candidates():
            if cand.applies(sig, (9, 0)) is None and cand.layouts(sig):
                out[cand.key()] = cand.layouts(sig)
    out["cudnn"] = cudnn.CudnnConv(cudnn.NAME).layouts(DENSE)
    out["cudnn_cpad"] = cudnn_cpad.CudnnPaddedConv(cudnn_cpad.NAME).layouts(DENSE)
    out["cublaslt (CBR)"] = cublaslt_problem.LAYOUTS["CBR"]
    return out


DECLARED = _declared()


def test_the_new_nhwc_families_are_covered():
    assert {"depthwise_nhwc", "cudnn", "cudnn_cpad", "cublaslt (CBR)"} <= set(DECLARED)


@pytest.mark.parametrize("key", sorted(DECLARED))
def test_a_node_without_bias_or_residual_reads_the_same_output_layout(key):
    layouts = DECLARED[key]
    low = Lowering(launch=lambda i, o, w: None, layouts=layouts)
    full = low.output_layout(4, 0)
    assert full and all(low.output_layout(n, 0) == full for n in (2, 3)), (key, layouts)
