"""Does the runtime convert layouts where the tuner's layout choice said it would? A CPU check.

An optimized model records, on each CBR node, the layout its chosen lowering runs in
(``lowering_layout``), and ``graphopt optimize --report`` lists the conversions the layout choice
counted (``layout_conversions``). This script runs the optimized model on the runtime's
``device="cuda"`` path over the CPU tests' fake CuPy (``tests/runtime/_fake_cupy.py``, whose
elementwise ops write C order as CuPy's do), with every custom op a lowering that declares the
recorded layout (NHWC: input, bias/residual slots and output; NCHW: C order) and computes its NumPy
device fallback, and counts the activations the runtime actually converts (``to_layout`` on an input
not already in the declared layout, on the traced and on the compiled runs). Equal counts: the
tuner's model of the runtime holds for that graph; more: conversions the choice did not pay for.

    PYTHONPATH=. python bench/conversions_cpu.py --model NAME=OPT.onnx[:REPORT.json] --shape input=2x3x224x224 --out bench/results/conversions_cpu
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import platform
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(HERE / "tests" / "runtime"))  # _fake_cupy of this tree


def install_fake_cupy():
    import _fake_cupy

    cp, extra = _fake_cupy.make()
    sys.modules["cupy"] = cp
    sys.modules.update(extra)


def recorded_layouts(model) -> dict[str, str]:
    out = {}
    for n in model.graph.node:
        for a in n.attribute:
            if a.name == "lowering_layout":
                out[n.name] = a.s.decode()
    return out


def install_lowerings(layouts: dict[str, str], patch=setattr) -> None:
    """Every custom op: a lowering declaring its node's recorded layout, computing the device fallback.
    ``patch(obj, name, value)`` installs (a test passes ``monkeypatch.setattr``)."""
    from graphopt.lowering.contract import Lowering
    from graphopt.runtime import backend, ops_custom
    from graphopt.runtime.onnx_ops.registry import OpContext

    current: dict = {}
    real_custom = backend.CudaBackend.custom_step

    def build(self, op, key, sig):
        node, impl = current["node"], ops_custom.device_impl(op)
        ctx = OpContext(self.cupy, node, 0, {}, self.compute_dtype, self.matmul)
        attrs = ops_custom.op_attrs(node)

        def launch(inputs, outputs, workspace):
            for out, y in zip(outputs, impl(ctx, inputs, attrs)):
                out[...] = y

        nhwc = layouts.get(node.name) == "NHWC"
        return Lowering(launch=launch, layouts=("NHWC", "", "NHWC", "NHWC", "NHWC") if nhwc else ()), None

    def custom_step(self, graph, node, in_arrays):
        current["node"] = node
        return real_custom(self, graph, node, in_arrays)

    patch(backend.CudaBackend, "_build", build)
    patch(backend.CudaBackend, "custom_step", custom_step)
    patch(ops_custom, "lowering_key", lambda node, dims: "recorded")


def record_conversions(patch=setattr) -> list[dict]:
    """The list every activation conversion is appended to from now on ({shape, to}): the traced
    run's (``Lowering.conform`` -> ``layout.to_layout``) and the compiled steps' (``backend.to_layout``)."""
    from graphopt.lowering import layout
    from graphopt.runtime import backend

    seen: list[dict] = []
    real = layout.to_layout

    def counting(x, lay, xp):
        if x is not None and not layout.is_layout(x, lay):
            seen.append({"shape": [int(d) for d in x.shape], "to": lay})
        return real(x, lay, xp)

    patch(layout, "to_layout", counting)
    patch(backend, "to_layout", counting)
    return seen


def count_conversions(path: str, shapes: dict[str, list[int]], runs: int = 2) -> list[list[dict]]:
    """The conversions of each of ``runs`` runs (the first traces, the others run the compiled loop)."""
    import onnx

    from graphopt.runtime import Session

    model = onnx.load(path)
    install_lowerings(recorded_layouts(model))
    seen = record_conversions()
    sess = Session(model, device="cuda", cuda_graphs=False)
    rng = np.random.default_rng(0)
    feeds = {}
    for inp in model.graph.input:
        elem = onnx.helper.tensor_dtype_to_np_dtype(inp.type.tensor_type.elem_type)
        feeds[inp.name] = rng.standard_normal(shapes[inp.name]).astype(elem)
    per_run = []
    for _ in range(runs):
        seen.clear()
        sess.run(feeds)
        per_run.append(list(seen))
    return per_run


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="NAME=OPTIMIZED.onnx[:REPORT.json] (the report of its optimize)")
    ap.add_argument("--shape", action="append", default=[], help="INPUT=d0xd1x... (every input)")
    ap.add_argument("--out", type=Path, help="writes OUT.json")
    ap.add_argument("--as-before-layout-order", action="store_true",
                    help="elementwise steps as before runtime/onnx_ops/layout_order (CuPy's C-order outputs as they come)")
    args = ap.parse_args(argv)
    name, rest = args.model.split("=", 1)
    path, _, report = rest.partition(":")
    shapes = {k: [int(d) for d in v.split("x")] for k, v in (s.split("=", 1) for s in args.shape)}
    install_fake_cupy()
    if args.as_before_layout_order:
        from graphopt.runtime import backend

        backend.for_device = lambda op_type, fn: fn
    runs = count_conversions(path, shapes)
    expected = None
    if report:
        expected = len(json.loads(Path(report).read_text()).get("layout_conversions") or [])
    row = dict(model=name, shapes=shapes, as_before_layout_order=args.as_before_layout_order, runtime_conversions=[len(r) for r in runs],
               layout_choice_conversions=expected, conversions=runs[-1])
    print(f"{name}: runtime converts {[len(r) for r in runs]} per run; the layout choice counted {expected}")
    if args.out:
        doc = dict(date=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), machine=platform.node(),
                   command=" ".join(["bench/conversions_cpu.py"] + (argv if argv is not None else sys.argv[1:])),
                   row=row)
        args.out.with_suffix(".json").write_text(json.dumps(doc, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
