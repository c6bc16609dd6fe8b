"""The kernel-configuration sweep (``graphopt.providers.cudnn_knobs``) against the fake cuDNN module:
every other ``KERNEL_CFG`` value of each listed engine becomes a plan (the engine's other knobs as the
heuristics set them), nothing is listed twice, refusals are skipped, the bound holds, an old frontend
adds nothing; Attention's listing sweeps and becomes candidates, CBR's does not."""

from __future__ import annotations

import sys
import types

import pytest

from graphopt.kernels import registry
from graphopt.lowering import Signature
from graphopt.providers import cudnn as prov
from graphopt.providers import cudnn_knobs, cudnn_listing, cudnn_sdpa

from _fake_cudnn import FakeGraph, fake_module

KCFG = 24


def _graph(plans, ranges=None, refused=()):
    class Graph(FakeGraph):
        KNOB_RANGES = ranges or {}
        REFUSED_KNOBS = refused

    mod, log = fake_module(plans, graph=Graph)
    return mod, mod.pygraph(), log


def _created(log):
    return [(e[1], e[2]) for e in log if e[0] == "create_execution_plan"]


def test_every_other_kernel_cfg_of_the_listed_engines_in_the_heuristics_order():
    mod, g, log = _graph(["eng9_k24=7", "eng8_k24=6_k3=1", "eng9_k24=2", "eng8_k24=5_k3=1"],
                         {9: {KCFG: (0, 8, 2), 3: (0, 1, 1)}, 8: {KCFG: (4, 6, 1)}})
    assert cudnn_knobs.sweep_kernel_cfgs(mod, g) == 4  # the first engine only, by default
    assert cudnn_knobs.sweep_kernel_cfgs(mod, g, engines=2) == 1  # engine 9's now listed: engine 8's
    # engine 9: 0, 4, 6, 8 (2 listed; the stride skips odd values; knob 3 is not swept); engine 8: 4
    # with its knob 3 kept as the heuristics set it (5 and 6 listed)
    assert _created(log) == [(9, {KCFG: 0}), (9, {KCFG: 4}), (9, {KCFG: 6}), (9, {KCFG: 8}), (8, {KCFG: 4, 3: 1})]
    assert g.plans[4:] == ["eng9_k24=0", "eng9_k24=4", "eng9_k24=6", "eng9_k24=8", "eng8_k3=1_k24=4"]


def test_the_bound_refusals_and_engines_without_the_knob():
    mod, g, log = _graph(["eng9_k24=0", "eng2", "sdpa_fwd_prefill_sm90[TILE_M=128]"],
                         {9: {KCFG: (0, 5, 1)}, 2: {}}, refused=((9, {KCFG: 2}),))
    assert cudnn_knobs.sweep_kernel_cfgs(mod, g, limit=3, engines=3) == 3
    assert _created(log) == [(9, {KCFG: 1}), (9, {KCFG: 2}), (9, {KCFG: 3}), (9, {KCFG: 4})]
    assert g.plans[3:] == ["eng9_k24=1", "eng9_k24=3", "eng9_k24=4"]  # 2 refused, then the bound


def test_an_engine_whose_knobs_cannot_be_listed_is_skipped():
    mod, g, log = _graph(["sdpa_fwd_prefill_sm90[TILE_M=128]", "eng9_k24=0"], {9: {KCFG: (0, 1, 1)}})

    def refuse(engine):
        if engine >= 1000:  # the fake's name for a python engine
            raise RuntimeError("Failed to get knobs for engine")
        return FakeGraph.get_knobs_for_engine(g, engine)
    g.get_knobs_for_engine = refuse
    assert cudnn_knobs.sweep_kernel_cfgs(mod, g) == 0  # the first engine is a python one
    assert cudnn_knobs.sweep_kernel_cfgs(mod, g, engines=2) == 1
    assert g.plans[2:] == ["eng9_k24=1"]


def test_a_frontend_without_the_structured_plan_query_adds_nothing():
    mod, g, log = _graph(["eng9_k24=0"], {9: {KCFG: (0, 3, 1)}})
    assert cudnn_knobs.sweep_kernel_cfgs(types.SimpleNamespace(), g) == 0  # no knob_type
    old = types.SimpleNamespace(get_execution_plan_count=lambda: 1, get_plan_name_at_index=lambda i: "eng9_k24=0",
                                create_execution_plan=g.create_execution_plan)  # no structured query
    assert cudnn_knobs.sweep_kernel_cfgs(mod, old) == 0
    assert _created(log) == []


@pytest.fixture()
def fake(monkeypatch):
    class Graph(FakeGraph):
        KNOB_RANGES = {9: {KCFG: (6, 8, 1)}}

    mod, log = fake_module(["eng9_k24=7", "eng2"], graph=Graph)
    monkeypatch.setattr(prov, "_STATE", {"module": mod, "reason": None})
    monkeypatch.setattr(prov, "_GRAPHS", {})
    monkeypatch.setitem(sys.modules, "cupy", types.SimpleNamespace())  # no GPU: listings are not kept on disk
    return mod, log


def test_attention_plans_include_the_swept_configurations_and_cbr_does_not_sweep(fake):
    mod, log = fake
    sig = Signature.make("Attention", [(2, 4, 128, 64)] * 3 + [None], ["float16"] * 3 + [""], {})
    keys = [c.key() for c in cudnn_sdpa.candidates("Attention", sig)]
    assert keys == ["cudnn", "cudnn:plan=eng9_k24=7", "cudnn:plan=eng2", "cudnn:plan=eng9_k24=6", "cudnn:plan=eng9_k24=8"]
    for k in keys:
        assert registry.candidate_from_key("Attention", k).key() == k
    low = registry.candidate_from_key("Attention", keys[-1]).build(sig, "sm_90")
    assert ("build_plan_at_index", 3) in log and low.capturable
    # the sweep sits between the heuristics' listing and the support check
    order = [e[0] for e in log if e[0] in ("create_execution_plans", "create_execution_plan", "check_support")]
    assert order == ["create_execution_plans", "create_execution_plan", "create_execution_plan", "check_support"]

    log.clear()
    cbr = Signature.make("CBR", [(1, 8, 8, 8), (8, 8, 3, 3), (8,)], ["float16"] * 3,
                         {"pads": (1, 1, 1, 1), "strides": (1, 1), "dilations": (1, 1), "group": 1, "activation": "Relu"})
    prov._graph_for(cbr)
    assert _created(log) == [] and ("create_execution_plans", ["A", "FALLBACK"]) in log


def test_a_new_listing_scheme_starts_a_new_file():
    v = (("cudnn", "91900"),)
    old = cudnn_listing.SCHEME
    try:
        now = cudnn_listing._path("gpu", v)
        cudnn_listing.SCHEME = old - 1
        assert cudnn_listing._path("gpu", v) != now
    finally:
        cudnn_listing.SCHEME = old
