"""The library facade: what export scripts call.

    import torch, graphopt
    torch.onnx.export(model, args, "model.onnx")
    optimized, report = graphopt.optimize("model.onnx", gpu="a100")
    onnx.save(optimized, "model.opt.onnx")   # or pass output="model.opt.onnx"
    print(report.rewrites, report.custom_ops)
"""

from __future__ import annotations

import os
from typing import Mapping, Sequence

import onnx

from graphopt.ir import Graph, load_model, save_model
from graphopt.pipeline import OptimizeReport, optimize_file, optimize_model
from graphopt.compare import VerifyResult, check_same_inputs, check_shape_overrides, verify_models

__all__ = ["optimize", "load", "save", "verify", "OptimizeReport"]


def optimize(
    model_or_path: "onnx.ModelProto | str | os.PathLike",
    *,
    gpu: str = "auto",
    rules: Sequence["str | os.PathLike"] = (),
    disable: Sequence[str] = (),
    explain: bool = False,
    verify: bool = False,
    shapes: Mapping[str, Sequence[int]] | None = None,
    shape_profile: "Mapping[str, Mapping[str, Sequence[int]]] | Sequence[str] | None" = None,
    output: "str | os.PathLike | None" = None,
    rtol: float | None = None,
    atol: float | None = None,
    precision: str = "fp32",
    io_fp16: bool = False,
    keep_fp32: Sequence[str] = (),
) -> tuple[onnx.ModelProto, OptimizeReport]:
    """Optimize a model (a ``ModelProto`` or a path) and return ``(optimized ModelProto, report)``.

    ``gpu`` is ``"auto"``, ``"none"`` or a GPU name such as ``"a100"`` (see ``graphopt optimize --help``).
    ``rules`` adds rule files or folders to the shipped ones; ``disable`` turns shipped rules off by
    name. ``precision="fp16"`` converts the model to fp16 first (``io_fp16``: fp16 inputs and outputs
    too; ``keep_fp32``: op types left at fp32). With ``verify=True`` both models run under onnxruntime
    on random inputs and a mismatch raises ``graphopt.errors.VerificationFailed``. The result is
    written only when ``output`` is given. A path to a model with over 64 MiB of external data returns
    its large weights as references into the input's data file (not read into memory): ``save`` writes
    them, ``graphopt.ir.large.materialize`` reads them in.

    ``shape_profile`` tunes each value of symbolic input dims separately, like ``--shape-profile``:
    ``{"x": {"batch": [1, 8, 32]}}`` or ``["x=batch:1,8,32"]``. Each custom-op node then records
    ``lowering_buckets`` (see ``graphopt.tune.buckets``) and ``report.lowerings`` has one row per
    node and bucket; without it, tuning uses ``shapes`` or the defaults (``report.tuning_dims``)."""
    options = dict(gpu=gpu, rules=list(rules), disable=list(disable), explain=explain, shape_profile=shape_profile,
                   precision=precision, io_fp16=io_fp16, keep_fp32=list(keep_fp32))
    shape_map = {k: list(v) for k, v in (shapes or {}).items()}
    if isinstance(model_or_path, onnx.ModelProto):
        model, report = optimize_model(model_or_path, verify=verify, rtol=rtol, atol=atol, shapes=shape_map, **options)
        if output is not None:
            save_model(model, output)
            report.output = str(output)
        return model, report
    return optimize_file(
        model_or_path, output, write=output is not None, verify=verify, rtol=rtol, atol=atol, shapes=shape_map, **options
    )


def load(model_or_path: "onnx.ModelProto | str | os.PathLike") -> Graph:
    """Load and validate a model into graphopt's IR."""
    return load_model(model_or_path)


def save(graph_or_model: "Graph | onnx.ModelProto", path: "str | os.PathLike") -> None:
    """Write atomically (external data beside it when over 2 GB)."""
    save_model(graph_or_model, path)


def verify(
    candidate: "onnx.ModelProto | str | os.PathLike",
    reference: "onnx.ModelProto | str | os.PathLike",
    *,
    shapes: Mapping[str, Sequence[int]] | None = None,
    rtol: float | None = None,
    atol: float | None = None,
    device: str = "cpu",
) -> VerifyResult:
    """Run both models on random inputs; per-output max abs/rel error. The reference always runs
    under onnxruntime (CPU); the candidate too with ``device="cpu"``, else on the graphopt runtime
    (``"cuda"``, or ``"numpy"``, its CPU testing backend)."""
    from graphopt.ir import to_model

    cand = candidate if isinstance(candidate, onnx.ModelProto) else to_model(load_model(candidate))
    ref = reference if isinstance(reference, onnx.ModelProto) else to_model(load_model(reference))
    names = [str(m) if not isinstance(m, onnx.ModelProto) else n for m, n in ((candidate, "A"), (reference, "B"))]
    check_same_inputs(cand, ref, *names)
    check_shape_overrides(ref, shapes)
    runner = None
    if device != "cpu":
        from graphopt.runtime import Session, to_numpy

        sess = Session(cand, device=device)

        def runner(feeds):
            return {k: to_numpy(v) for k, v in sess.run(feeds).items()}

    return verify_models(cand, ref, shapes=shapes, rtol=rtol, atol=atol, run_candidate=runner)
