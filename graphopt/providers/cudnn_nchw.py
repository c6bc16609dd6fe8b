"""CBR as ``cudnn``'s fused graph with every tensor in NCHW (through strides; W as OIHW).

Why: the tuner chooses each node's lowering with the layout conversions counted
(``graphopt.tune.layout_choice``). Where a convolution's neighbours run NCHW (our depthwise and
direct kernels, which win MobileNetV2's ReLU6 depthwise layers), an NHWC cuDNN plan costs a
conversion on each side; this candidate lets cuDNN compete there without them. cuDNN runs an NCHW
graph with NCHW engines or transposes inside its plan; the timing, conversions included, says which
is faster, as for any candidate. The same graph as ``cudnn`` (:func:`graphopt.providers.cudnn.conv_graph`,
same activations and plan keys), listed and built separately (its own plans and workspaces).

Plans: the heuristic's plan at load time plus the first ``MAX_PLANS`` (3) cuDNN offers (heuristics A
first), so a cold tuning builds at most that many more plans per CBR signature than before.
"""

from __future__ import annotations

from dataclasses import dataclass

from graphopt.lowering.contract import Candidate, Signature
from graphopt.providers import cudnn as base

OPS = ("CBR",)
NAME = "cudnn_nchw"
LAYOUTS = ("NCHW", "NCHW", "NCHW", "NCHW", "NCHW")  # X, W (OIHW), B (1-D), R, Y: the model's own layouts
MAX_PLANS = 3  # each plan is built, checked and timed in a cold tuning: 4 candidates a CBR signature in all


def _nchw_graph(mod, handle, sig: Signature):
    return base.conv_graph(mod, handle, sig, layout="NCHW")


def _graph_for(sig: Signature, tag: str = "") -> base._Built:
    return base.listed(sig, _nchw_graph, "|nchw" + tag)


@dataclass(frozen=True)
class CudnnNchwConv(base.CudnnConv):
    """params: ``plan=<cuDNN plan name of the NCHW graph>``, or none for the heuristic's first plan."""

    def layouts(self, sig: Signature) -> tuple[str, ...]:
        return LAYOUTS

    def graphs(self):
        return _graph_for


def candidates(op: str, sig: Signature | None = None) -> list[Candidate]:
    """The heuristic candidate, plus one per plan (the first ``MAX_PLANS``) when ``sig`` is given and
    cuDNN can list them here."""
    if op not in OPS:
        return []
    return base.plan_candidates(CudnnNchwConv, NAME, op, sig, base.conv_reason, _graph_for, limit=MAX_PLANS)


def from_key(op: str, key: str) -> Candidate | None:
    return base.plan_from_key(CudnnNchwConv, NAME, key) if op in OPS else None
