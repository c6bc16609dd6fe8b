"""More plans than cuDNN's heuristics list: every kernel configuration of the engines they chose.

cuDNN's heuristics (modes A and fallback) name a few plans per graph, each an engine with its knob
choices; an engine's ``KERNEL_CFG`` knob picks one of its precompiled kernel configurations (tile
shapes, pipelining). For fused attention the heuristics list one configuration of the fast engine
(``eng9_k24=7`` for every shape measured on the H100, 2026-12-06) and its other configurations are
never timed, while the winner lost to torch's SDPA by 1-4 % on 14 of 16 shapes
(``bench/results/transformer_kernels_h100_sdpa_graph_6965c4d.md``). Timing all of them is what the
tuner is for; cuDNN's own autotuning only times what the heuristics list, so no library does this.

:func:`sweep_kernel_cfgs` appends, through the frontend's ``create_execution_plan(engine, knobs)``,
one plan per other ``KERNEL_CFG`` value of the first ``MAX_ENGINES`` engines the heuristics list
(their first: in every H100 attention listing it was the fastest engine, the others 1.5-2x slower;
a configuration of an engine cuDNN compiles at run time costs seconds to build), the engine's other
knobs as the heuristics set them. Plans are named by cuDNN (engine and knobs), so their candidate keys are as
stable as the listed plans'. A value cuDNN refuses is skipped, and so is an engine whose knobs it
cannot list (the frontend's own python engines); a frontend without the structured plan query does
nothing.
"""

from __future__ import annotations

MAX_SWEPT = 24  # added plans per graph: each is built and timed when its signature is tuned
MAX_ENGINES = 1  # engines swept, in the heuristics' order


def sweep_kernel_cfgs(mod, graph, limit: int = MAX_SWEPT, engines: int = MAX_ENGINES) -> int:
    """Append a plan for each ``KERNEL_CFG`` value of the first ``engines`` engines among ``graph``'s
    listed plans that the list does not hold yet (at most ``limit``); returns how many were added."""
    kernel_cfg = getattr(getattr(mod, "knob_type", None), "KERNEL_CFG", None)
    if kernel_cfg is None or not all(hasattr(graph, f) for f in (
            "get_engine_and_knobs_at_index", "get_knobs_for_engine", "create_execution_plan")):
        return 0
    listed, order = set(), []
    try:
        for i in range(graph.get_execution_plan_count()):
            engine, knobs = graph.get_engine_and_knobs_at_index(i)
            listed.add((int(engine), _frozen(knobs)))
            if not any(e == int(engine) for e, _ in order):
                order.append((int(engine), dict(knobs)))
    except Exception:  # noqa: BLE001 - a plan without an (engine, knobs) pair: the heuristics' list stays as is
        return 0
    added = 0
    for engine, knobs in order[:engines]:
        try:  # the frontend's python engines (CuTe DSL kernels) are not the backend's: it cannot answer
            ranges = [k for k in graph.get_knobs_for_engine(engine) if getattr(k, "type", None) == kernel_cfg]
            values = range(int(ranges[0].min_value), int(ranges[0].max_value) + 1,
                           max(1, int(getattr(ranges[0], "stride", 1) or 1))) if len(ranges) == 1 else ()
        except Exception:  # noqa: BLE001 - no kernel configurations to offer for this engine
            continue
        for value in values:
            if added >= limit:
                return added
            choice = {**knobs, kernel_cfg: value}
            if (engine, _frozen(choice)) in listed:
                continue
            try:
                graph.create_execution_plan(engine, choice)
            except Exception:  # noqa: BLE001 - cuDNN refuses this configuration for this graph
                continue
            listed.add((engine, _frozen(choice)))
            added += 1
    return added


def _frozen(knobs) -> frozenset:
    return frozenset((int(getattr(k, "value", k)), int(v)) for k, v in dict(knobs).items())
