"""How far from onnxruntime CPU does an fp32 model land when its convolutions and matmuls round their
operands to TF32? A CPU estimate, for the fp32 rows of issue 15 (bar: 1e-3 relative to onnxruntime CPU,
as ``bench/e2e.py`` measures it: max |out - ref| / max |ref|).

On the GPU, fp32 lowerings that use the tensor cores (graphopt's ``mma_gemm`` family, cuDNN engines
that down-convert to TF32) round both operands of every product to TF32 (10 explicit mantissa bits)
and accumulate in fp32. This script emulates exactly that on onnxruntime CPU: before the first two
inputs of every Conv / MatMul / Gemm (``--ops``) it inserts a rounding to 11 significant bits written
in ONNX ops (Veltkamp's split: ``t = x * (2**13 + 1); hi = t - (t - x)``, exact in IEEE fp32 and
round-to-nearest, as ``cvt.rna.tf32`` up to ties), runs both models with graph optimizations off (so
nothing folds the split away) on the same random inputs, and reports the error.

    python bench/tf32_error_cpu.py --model r50.onnx --shape input=1,3,224,224 --out bench/results/tf32_error_cpu.json
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import platform
import sys
from pathlib import Path

import numpy as np
import onnx
from onnx import helper, numpy_helper

SPLIT = float(2 ** 13 + 1)  # fp32 has 24 significant bits; TF32 keeps 11: split off 24 - 11 = 13


def tf32_round(x: np.ndarray) -> np.ndarray:
    """The same rounding in NumPy (used for the self-check)."""
    x = np.asarray(x, dtype=np.float32)
    t = (x * np.float32(SPLIT)).astype(np.float32)
    return (t - (t - x)).astype(np.float32)


def emulate_tf32(model: onnx.ModelProto, ops: set[str]) -> tuple[onnx.ModelProto, int]:
    """A copy of ``model`` whose ``ops`` nodes read TF32-rounded copies of their first two inputs."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    g = m.graph
    g.initializer.append(numpy_helper.from_array(np.array(SPLIT, dtype=np.float32), "tf32_split_c"))
    rounded: dict[str, str] = {}
    new_nodes = []
    count = 0
    for node in g.node:
        if node.op_type in ops:
            for i in range(min(2, len(node.input))):
                name = node.input[i]
                if not name:
                    continue
                if name not in rounded:
                    t, d, hi = f"{name}__t", f"{name}__d", f"{name}__tf32"
                    new_nodes += [helper.make_node("Mul", [name, "tf32_split_c"], [t]),
                                  helper.make_node("Sub", [t, name], [d]),
                                  helper.make_node("Sub", [t, d], [hi])]
                    rounded[name] = hi
                node.input[i] = rounded[name]
            count += 1
        new_nodes.append(node)
    del g.node[:]
    g.node.extend(new_nodes)
    return m, count


def run(model: onnx.ModelProto, feeds: dict) -> list[np.ndarray]:
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def make_feeds(model: onnx.ModelProto, shapes: dict[str, list[int]], seed: int) -> dict:
    rng = np.random.default_rng(seed)
    feeds = {}
    inits = {i.name for i in model.graph.initializer}
    for inp in model.graph.input:
        if inp.name in inits:
            continue
        shape = shapes.get(inp.name) or [d.dim_value for d in inp.type.tensor_type.shape.dim]
        et = inp.type.tensor_type.elem_type
        if et == onnx.TensorProto.INT64:
            feeds[inp.name] = rng.integers(0, 1000, size=shape).astype(np.int64)
        else:
            feeds[inp.name] = rng.standard_normal(shape).astype(np.float32)
    return feeds


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", action="append", required=True, help="NAME=PATH.onnx (fp32)")
    ap.add_argument("--shape", action="append", default=[], help="NAME:input=d0,d1,... for that model")
    ap.add_argument("--ops", default="Conv,MatMul,Gemm", help="ops whose operands are rounded")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    # self-check of the rounding: 11 significant bits, nearest
    x = np.random.default_rng(0).standard_normal(100000).astype(np.float32)
    r = tf32_round(x)
    assert np.all(np.abs(r - x) <= np.abs(x) * 2.0 ** -11 * 1.0001), "rounding error above half an ulp of TF32"
    assert np.all((r.view(np.uint32) & 0x1FFF) == 0), "rounded values keep more than 10 mantissa bits"
    ops = set(args.ops.split(","))
    rows = []
    for spec in args.model:
        name, path = spec.split("=", 1)
        shapes = {}
        for s in args.shape:
            mname, rest = s.split(":", 1)
            if mname == name:
                iname, dims = rest.split("=", 1)
                shapes[iname] = [int(d) for d in dims.split(",")]
        model = onnx.load(path)
        emulated, count = emulate_tf32(model, ops)
        for seed in range(args.seeds):
            feeds = make_feeds(model, shapes, seed)
            ref = run(model, feeds)
            out = run(emulated, feeds)
            err = max(float(np.abs(o.astype(np.float64) - f.astype(np.float64)).max() / (np.abs(f).max() + 1e-12))
                      for o, f in zip(out, ref))
            row = dict(model=name, shapes=shapes, seed=seed, nodes_rounded=count, ops=sorted(ops),
                       max_rel_err=err, ref_max_abs=float(max(np.abs(f).max() for f in ref)))
            print(json.dumps(row), flush=True)
            rows.append(row)
    if args.out:
        import onnxruntime as ort

        doc = dict(date=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), machine=platform.node(),
                   what="TF32 operand rounding emulated on onnxruntime CPU (fp32 accumulation); error as bench/e2e.py "
                        "measures it against onnxruntime CPU (max |out - ref| / max |ref|); bar 1e-3",
                   versions=dict(onnx=onnx.__version__, onnxruntime=ort.__version__, numpy=np.__version__),
                   command=" ".join([Path(sys.argv[0]).as_posix()] + (argv or sys.argv[1:])), rows=rows)
        args.out.write_text(json.dumps(doc, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
