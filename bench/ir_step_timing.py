"""In-process seconds of the optimizer's Python steps around the IR, minimum of several repeats.

    PYTHONPATH=. python bench/ir_step_timing.py [--model M] [--repeat 7]

Each repeat loads the model afresh (``graphopt.ir.io.load_model``, the input's inferred value_info
merged as the pipeline does) and times ``check_header``, ``from_model``, ``lint``, ``_census``, every
cleanup pass of every round of ``run_cleanup(refine=True)`` (``name#round``) and its ``refine``, the
sweep after the rules (``fold_constants#2``, ``dead_code#2``), ``toposort``, ``to_model`` and
``finalize_model``, with the collector tuned as ``graphopt.cli.entry`` tunes it. No child process
runs beside (the pipeline forks two): these are the steps' own costs. Run it with ``PYTHONPATH`` set
to another checkout to compare (the script uses only what both have). Prints ``step seconds`` lines.
"""

from __future__ import annotations

import argparse
import collections
import gc
import time
from pathlib import Path

import graphopt.passes as passes
from graphopt.ir.convert import from_model, to_model
from graphopt.ir.io import check_header, load_model
from graphopt.ir.shapes import infer
from graphopt.pipeline import _census, finalize_model

MODEL = Path(__file__).resolve().parents[1] / "models" / "torch" / "gpt2_20k_torchscript_op14.onnx"


def _timed(times: dict, key: str, fn, *args, **kwargs):
    start = time.perf_counter()
    result = fn(*args, **kwargs)
    times[key].append(time.perf_counter() - start)
    return result


def _record_rounds(times: dict, rounds: collections.Counter) -> None:
    """Wrap each cleanup pass (and ``refine_shapes``) as ``run_cleanup`` looks them up, so that every
    call is timed under ``name#n``, n counting that pass's calls in the current repeat."""
    for name in (*passes.CLEANUP_ORDER, "refine_shapes"):
        def timed(*args, _fn=getattr(passes, name), _name=name, **kwargs):
            key = f"{_name}#{rounds[_name]}"
            rounds[_name] += 1
            return _timed(times, key, _fn, *args, **kwargs)
        setattr(passes, name, timed)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=str(MODEL))
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    gc.freeze()
    gc.set_threshold(50_000, 20, 20)
    source = load_model(args.model).source_model
    inferred = infer(source).graph.value_info
    times: dict[str, list[float]] = collections.defaultdict(list)
    rounds: collections.Counter = collections.Counter()
    _record_rounds(times, rounds)
    for _ in range(args.repeat):
        rounds.clear()
        _timed(times, "check_header", check_header, source, args.model)
        _timed(times, "from_model", from_model, source)
        graph = load_model(args.model)
        graph.merge_value_info(inferred)
        _timed(times, "lint", graph.lint)
        _timed(times, "census", _census, graph)
        _timed(times, "run_cleanup", passes.run_cleanup, graph, refine=True)
        passes.fold_constants(graph)  # the sweep after the rules (timed as #2)
        passes.dead_code(graph)
        _timed(times, "toposort", graph.toposort)
        _timed(times, "to_model", to_model, graph)
        _timed(times, "finalize_model", finalize_model, graph)
    for key, values in times.items():
        if max(values) >= 0.0005:  # passes with nothing to do on this model are left out
            print(f"{key:30s} {min(values):.4f}")


if __name__ == "__main__":
    main()
