"""A cuDNN candidate without a ``plan`` runs the first plan cuDNN lists (``plan_at``), so it names that
plan's candidate through ``same_as`` and the profiler builds, checks and times the pair once (CPU: the
listing is faked; each provider lists through its own graph builder)."""

from __future__ import annotations

import pytest

from graphopt.lowering.contract import Signature
from graphopt.providers import cudnn, cudnn_cpad, cudnn_matmul, cudnn_nchw, cudnn_norm, cudnn_sdpa, cudnn_split

CLASSES = [(cudnn, cudnn.CudnnConv), (cudnn_nchw, cudnn_nchw.CudnnNchwConv), (cudnn_cpad, cudnn_cpad.CudnnPaddedConv),
           (cudnn_split, cudnn_split.CudnnSplitConv),
           (cudnn_matmul, cudnn_matmul.CudnnMatmul), (cudnn_norm, cudnn_norm.CudnnNorm), (cudnn_sdpa, cudnn_sdpa.CudnnSdpa)]
LISTED: dict = {}  # graph builder -> the plan names its fake listing gives (default: two plans)
SIG = Signature.make("CBR", [(1, 8, 9, 9), (8, 8, 3, 3), (8,), None], ["float16"] * 3 + [""], {"pads": [1, 1, 1, 1]})


@pytest.fixture
def listings(monkeypatch):
    asked = []

    def plan_keys(sig, built):
        asked.append(built)
        return list(LISTED.get(built, ["eng4_k24=2", "eng9"]))

    monkeypatch.setattr(cudnn, "plan_keys", plan_keys)
    return asked


@pytest.mark.parametrize("mod,cls", CLASSES, ids=[m.__name__.rsplit(".", 1)[1] for m, _ in CLASSES])
def test_the_heuristic_candidate_names_the_first_listed_plan(mod, cls, listings):
    bare = cls(mod.NAME)
    assert bare.same_as(SIG) == f"{mod.NAME}:plan=eng4_k24=2"
    assert listings == [bare.graphs()]  # listed through the provider's own graph builder
    assert cls(mod.NAME, (("plan", "eng9"),)).same_as(SIG) is None  # a listed plan is itself


def test_no_listing_no_twin(listings, monkeypatch):
    bare = cudnn.CudnnConv(cudnn.NAME)
    monkeypatch.setitem(LISTED, bare.graphs(), [])
    assert bare.same_as(SIG) is None


def test_matmul_plans_come_from_the_remembered_listing_like_every_cudnn_provider(listings):
    """cudnn_matmul listed its plans by building the graph in every run (0.65 s of a warm GPT-2 on
    the H100); it now asks ``plan_keys`` (remembered on disk) as the other providers do."""
    sig = Signature.make("GemmAct", [(64, 32), (32, 48), (48,)], ["float16"] * 3, {"mode": "matmul"})
    assert cudnn_matmul.matmul_reason(sig) is None
    keys = [c.key() for c in cudnn_matmul.candidates("GemmAct", sig)]
    assert keys == ["cudnn", "cudnn:plan=eng4_k24=2", "cudnn:plan=eng9"]
    assert listings == [cudnn_matmul._graph_for]
    assert cudnn_matmul.from_key("GemmAct", "cudnn:plan=eng9").key() == "cudnn:plan=eng9"
    assert cudnn_matmul.from_key("CBR", "cudnn") is None
