"""Where a tuned model's outputs go wrong: whole-model errors under each runtime mode, then every
custom node's own error against its float64 reference on the inputs the runtime actually gave it.

    python3 bench/diagnose_outputs.py --model models/torch/resnet50_torchscript_op17.onnx \
        --shape input=32x3x224x224 --precision fp16 --out OUT/diagnose_resnet50.json [--gpu auto]

Why (issue 15): a fully tuned ResNet-50 at bs32 fp16 ended 0.05-0.19 (max relative) away from torch
on the H200 while the heuristic's lowerings ended 5.6e-4 away, although every chosen candidate passed
the tuner's numerical gate. This script tells a wrong lowering (one node's own error is large) from a
wrong plan (every node is right on its own inputs, yet the whole model is not: buffers that overlap,
a CUDA graph that replays stale pointers).

Steps, each written to ``--out`` as soon as it is done (a cut call keeps what was measured):
1. ``graphopt.optimize`` (tuning from ``GRAPHOPT_CACHE_DIR``: carry an earlier call's cache to get
   the same choices fast);
2. the reference: onnxruntime CPU on the original model (float32) for one seeded input;
3. the optimized model on the graphopt runtime with CUDA graphs, with step replay only, and plain
   eager; max relative error of each against the reference;
4. a probe copy whose every custom-node output is a graph output, run plain eager; for every custom
   node: its lowering, layout, and normwise / max relative error of its output against the op's
   float64 reference on the node's own inputs (batch items ``--items`` only, to bound the reference's
   cost), in topological order.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
from lowering_bench import write_atomic  # noqa: E402


def log(msg: str) -> None:
    print(f"[diagnose {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def max_rel(out, ref) -> float:
    out, ref = np.asarray(out, np.float64), np.asarray(ref, np.float64)
    return float(np.abs(out - ref).max() / (np.abs(ref).max() + 1e-12))


def norm_rel(out, ref) -> float:
    out, ref = np.asarray(out, np.float64), np.asarray(ref, np.float64)
    return float(np.linalg.norm(out - ref) / max(np.linalg.norm(ref), 1e-30))


def model_file(spec: str) -> tuple[Path, str | None]:
    """(the ONNX file ``spec`` names, how it was exported or None): ``torch:NAME`` is the
    bench/torch_models.py model exported as bench/e2e.py exports it (same signatures, so the same
    tuning-cache entries), once per machine into $TMPDIR; anything else is a path."""
    if not str(spec).startswith("torch:"):
        return Path(spec), None
    sys.path.insert(0, str(ROOT / "bench"))
    import torch_models

    which = str(spec)[len("torch:"):]
    path = Path(os.environ.get("TMPDIR", "/tmp")) / f"diagnose_{which}.onnx"
    if path.exists():
        return path, "exported earlier"
    t0 = time.perf_counter()
    tmp = path.with_suffix(".partial.onnx")
    how = torch_models.export(which, torch_models.build_module(which), tmp)
    os.replace(tmp, path)
    log(f"exported {which} ({how}) in {time.perf_counter() - t0:.1f} s")
    return path, how


def parse_shape(text: str) -> tuple[str, list[int]]:
    name, dims = text.split("=", 1)
    return name, [int(d) for d in dims.split("x")]


def probe_model(model, custom_domain: str = "graphopt"):
    """A copy of ``model`` whose every custom node's outputs and activation inputs are also graph outputs (typed as the
    model's first input: the fp16 models of --io-fp16 are fp16 throughout)."""
    import onnx

    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    g = probe.graph
    have = {o.name for o in g.output}
    elem = g.input[0].type.tensor_type.elem_type
    produced = {o for node in g.node for o in node.output if o}
    for node in g.node:
        if node.domain != custom_domain:
            continue
        for name in list(node.output) + [i for i in node.input if i in produced]:  # its activations
            if name and name not in have:
                g.output.append(onnx.helper.make_tensor_value_info(name, elem, None))
                have.add(name)
    return probe


def node_table(model, items: list[int], results: dict, feeds: dict, deadline: float) -> list[dict]:
    """Every custom node's own error: its output in ``results`` against its schema's float64
    reference on its inputs (from ``results``, ``feeds`` or the initializers), batch ``items`` only."""
    from onnx import numpy_helper

    from graphopt.ops import get_schema

    inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    for node in model.graph.node:  # Constant nodes' values
        if node.op_type == "Constant" and node.domain in ("", "ai.onnx"):
            for a in node.attribute:
                if a.name == "value":
                    inits[node.output[0]] = numpy_helper.to_array(a.t)
    rows = []
    for node in model.graph.node:
        if node.domain != "graphopt":
            continue
        if time.time() > deadline:
            rows.append({"node": node.name, "skipped": "time limit"})
            break
        attrs = {}
        for a in node.attribute:
            import onnx

            attrs[a.name] = onnx.helper.get_attribute_value(a)
            if isinstance(attrs[a.name], bytes):
                attrs[a.name] = attrs[a.name].decode()
        row = {"node": node.name, "op": node.op_type, "lowering": attrs.get("lowering"),
               "layout": attrs.get("lowering_layout")}
        try:
            ins = []
            for name in node.input:
                if not name:
                    ins.append(None)
                    continue
                v = results.get(name, feeds.get(name, inits.get(name)))
                if v is None:
                    raise KeyError(f"input {name} not available")
                ins.append(np.asarray(v))
            got = np.asarray(results[node.output[0]])
            batched = ins[0] is not None and ins[0].ndim >= 3 and got.ndim >= 3 and got.shape[0] == ins[0].shape[0]
            sel = [i for i in items if i < got.shape[0]] if batched else None
            cut = []
            for k, a in enumerate(ins):
                if a is None or not batched or a.ndim != got.ndim or a.shape[0] != got.shape[0]:
                    cut.append(None if a is None else a.astype(np.float64))
                else:
                    cut.append(a[sel].astype(np.float64))
            schema = get_schema(node.op_type)
            t0 = time.perf_counter()
            ref = np.asarray(schema.reference(cut, attrs)[0], np.float64)
            mine = got[sel] if batched else got
            row.update(shape=list(got.shape), nonfinite=int(np.count_nonzero(~np.isfinite(mine.astype(np.float64)))),
                       norm_rel=norm_rel(mine, ref), max_rel=max_rel(mine, ref),
                       reference_s=round(time.perf_counter() - t0, 2))
            if mine.ndim == 4 and batched:  # where the error sits: per item and per channel
                diff = np.abs(mine.astype(np.float64) - ref)
                row["worst_item_err"] = [float(d) for d in diff.reshape(diff.shape[0], -1).max(axis=1)]
                ch = diff.max(axis=(0, 2, 3))
                row["bad_channels"] = int(np.count_nonzero(ch > 1e-2 * (np.abs(ref).max() + 1e-12)))
                sp = diff.max(axis=(0, 1))
                row["bad_positions"] = int(np.count_nonzero(sp > 1e-2 * (np.abs(ref).max() + 1e-12)))
        except Exception as e:  # noqa: BLE001 - one node's failure is a row, not the end
            row["error"] = f"{type(e).__name__}: {e}"[:300]
        rows.append(row)
        flag = "  <-- WRONG" if row.get("norm_rel", 0) > 1e-2 else ""
        log(f"{node.name} {node.op_type} {row.get('lowering')} {row.get('layout')}: "
            f"norm {row.get('norm_rel', float('nan')):.2e} max {row.get('max_rel', float('nan')):.2e}"
            f"{' ' + row['error'] if 'error' in row else ''}{flag}")
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, help="an ONNX file, or torch:NAME (a bench/torch_models.py model, exported here)")
    ap.add_argument("--shape", required=True, help="NAME=D1xD2.. of the model's input")
    ap.add_argument("--precision", default="fp16", choices=["fp16", "fp32"])
    ap.add_argument("--gpu", default="auto", help="graphopt optimize --gpu (auto: tune on this GPU)")
    ap.add_argument("--device", default="cuda", choices=["cuda", "numpy"], help="runtime device (numpy: a CPU dry run)")
    ap.add_argument("--items", default="0,13,31", help="batch items whose per-node references are computed")
    ap.add_argument("--time-limit", type=float, default=400.0, help="seconds for the whole script")
    ap.add_argument("--out", required=True, type=Path)
    args = ap.parse_args(argv)
    deadline = time.time() + args.time_limit

    import onnx
    import onnxruntime as ort

    import graphopt
    from graphopt.runtime import Session, to_numpy

    doc: dict = {"date": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "command": " ".join([sys.executable] + sys.argv),
                 "git": os.environ.get("HEAD_COMMIT"), "model": str(args.model), "shape": args.shape,
                 "precision": args.precision, "gpu": args.gpu}
    args.out.parent.mkdir(parents=True, exist_ok=True)

    def save():
        write_atomic(args.out, json.dumps(doc, indent=1, default=str))

    args.model, doc["export"] = model_file(args.model)
    name, dims = parse_shape(args.shape)
    fp16 = args.precision == "fp16"
    t0 = time.perf_counter()
    model, report = graphopt.optimize(str(args.model), gpu=args.gpu, shapes={name: dims},
                                      precision=args.precision, io_fp16=fp16)
    rep = json.loads(report.to_json())
    doc["optimize_s"] = round(time.perf_counter() - t0, 1)
    doc["lowerings"] = {n.name: {a.name: onnx.helper.get_attribute_value(a).decode() for a in n.attribute
                                 if a.name in ("lowering", "lowering_layout") and a.type == onnx.AttributeProto.STRING}
                        for n in model.graph.node if n.domain == "graphopt"}
    doc["selection"] = rep.get("selection_summary")
    log(f"optimized in {doc['optimize_s']} s: {len(doc['lowerings'])} custom nodes")
    save()

    rng = np.random.default_rng(0)
    x32 = rng.standard_normal(dims).astype(np.float32)
    x = x32.astype(np.float16) if fp16 else x32
    src = onnx.load(str(args.model))
    ref = ort.InferenceSession(src.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {name: x.astype(np.float32)})[0]
    out_name = model.graph.output[0].name
    doc["modes"] = {}
    modes = [("cuda_graphs", dict()), ("step_replay", dict(cuda_graphs=False)),
             ("eager", dict(cuda_graphs=False, step_graphs=False))] if args.device == "cuda" else [("numpy", {})]
    for mode, kw in modes:
        try:
            sess = Session(model, device=args.device, **kw)
            outs = [to_numpy(sess.run({name: x})[out_name]).copy() for _ in range(3)]
            doc["modes"][mode] = {"max_rel_vs_ort_cpu": max_rel(outs[-1], ref),
                                  "norm_rel_vs_ort_cpu": norm_rel(outs[-1], ref),
                                  "runs_agree": bool(all(np.array_equal(outs[0], o) for o in outs[1:])),
                                  "graph_status": getattr(sess, "graph_status", None)}
            del sess
        except Exception as e:  # noqa: BLE001
            doc["modes"][mode] = {"error": f"{type(e).__name__}: {e}"[:300]}
        log(f"{mode}: {doc['modes'][mode]}")
        save()

    probe = probe_model(model)
    try:
        sess = Session(probe, device=args.device, **(modes[-1][1]))
        res = {k: to_numpy(v) for k, v in sess.run({name: x}).items()}
        doc["probe_max_rel_vs_ort_cpu"] = max_rel(res[out_name], ref)
        del sess
        if args.device == "cuda":  # the same probe replayed from a CUDA graph: where does it differ from eager?
            sess = Session(probe, device=args.device)
            sess.run({name: x})
            graphed = {k: to_numpy(v) for k, v in sess.run({name: x}).items()}
            doc["probe_graph_vs_eager"] = {k: max_rel(graphed[k], res[k]) for k in res
                                           if max_rel(graphed[k], res[k]) > 1e-3}
            del sess
        log(f"probe model (every custom output a graph output), eager: {doc['probe_max_rel_vs_ort_cpu']:.3e}")
        save()
        items = [int(i) for i in args.items.split(",")]
        doc["nodes"] = node_table(model, items, res, {name: x}, deadline)
        doc["wrong_nodes"] = [r["node"] for r in doc["nodes"] if r.get("norm_rel", 0) > 1e-2]
    except Exception as e:  # noqa: BLE001
        doc["probe_error"] = f"{type(e).__name__}: {e}"[:300]
        log(doc["probe_error"])
    save()
    log(f"done: wrong nodes {doc.get('wrong_nodes')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
