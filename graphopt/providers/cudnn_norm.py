"""cuDNN frontend candidates for graphopt.LayerNorm (SkipLayerNorm included) and graphopt.RMSNorm:
cuDNN's normalization forward in its INFERENCE phase, every engine plan a candidate (keys, plan
listing, workspace per plan and the library state are ``graphopt.providers.cudnn``'s).

X ``[..., D]`` is the graph's ``[rows, D, 1, 1]`` (cuDNN normalises each "batch" row over the other
dims), scale / bias ``[1, D, 1, 1]``, all row-major. epsilon is a pass-by-value fp32 scalar, bound
from host memory at every run (captured by value in a CUDA graph).

SkipLayerNorm and SkipRMSNorm (``skip`` / ``skip_bias`` inputs): ``S = X + skip [+ skip_bias]`` are pointwise adds
in the same graph before the layernorm; with ``sum_output=1`` S is marked as a graph output too, so
one plan fills both of the node's outputs (cuDNN 9.14+ runs a norm with such an intermediate
output). When a caller hands only Y (the checker, the timer), S goes to a scratch buffer. Where cuDNN
offers no plan for the INFERENCE graph (its samples fuse the add in the TRAINING phase), the
TRAINING graph is used, its per-row statistics written to the workspace.

Not lowered (``applies`` says why): dtypes other than float16 / bfloat16 / float32, a skip that
broadcasts over X's leading dims (position embeddings ``[1, S, D]``: the rows of the graph are
X's flattened leading dims, so a repeating skip has no stride form; the own ``rows`` kernel takes
it), scale / bias / skip_bias that are not D values, tensors over 2**31 elements. A LayerNorm
without bias gets a zero bias allocated once at build (cuDNN's layernorm takes one).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from graphopt.errors import TuningError
from graphopt.lowering.contract import Candidate, Lowering, Signature, workspace_offset
from graphopt.ops import get_schema
from graphopt.providers import cudnn as base

OPS = ("LayerNorm", "RMSNorm")
NAME = base.NAME
DTYPES = {"float16": "HALF", "bfloat16": "BFLOAT16", "float32": "FLOAT"}
ITEMSIZE = {"float16": 2, "bfloat16": 2, "float32": 4}
DEFAULT_EPS = {"LayerNorm": 1e-5, "RMSNorm": 1e-6}


@dataclass(frozen=True)
class NormGeom:
    op: str
    rows: int
    D: int
    dtype: str
    param_dtypes: tuple[str, ...]  # scale, bias, skip_bias (""/None when absent)
    has_bias: bool
    has_skip: bool
    has_skip_bias: bool
    sum_output: bool
    eps: float


def _vector(shape, d: int) -> bool:
    return shape is not None and math.prod(shape) == d and all(s == 1 for s in shape[:-1])


def norm_geom(sig: Signature) -> NormGeom:
    """The graph's dims, or ``TuningError`` saying why cuDNN's norm does not take this signature."""
    if sig.op not in OPS:
        raise TuningError(f"op {sig.op} is not one of {', '.join(OPS)}")
    schema = get_schema(sig.op)
    shapes, dtypes = schema.named(sig.input_shapes), schema.named(sig.dtypes)
    x = shapes["X"]
    if x is None or len(x) < 1 or min(x) < 1:
        raise TuningError(f"cuDNN {sig.op} needs a known, non-empty X shape, got {x}")
    dt = dtypes["X"]
    if dt not in DTYPES:
        raise TuningError(f"cuDNN normalization takes {', '.join(DTYPES)}, got {dt or 'unknown'}")
    d, rows = int(x[-1]), math.prod(int(v) for v in x[:-1])
    if rows * d > 2**31 - 1:
        raise TuningError(f"cuDNN {sig.op} here: tensors over 2**31 elements")
    for name in (n for n, _ in schema.inputs[1:]):
        if shapes[name] is None:
            if name == "scale":
                raise TuningError(f"cuDNN {sig.op} needs scale")
            continue
        if dtypes[name] not in DTYPES:
            raise TuningError(f"cuDNN {sig.op}: {name} of dtype {dtypes[name]}")
        if name == "skip":
            if tuple(shapes[name]) != tuple(x) or dtypes[name] != dt:
                raise TuningError(f"cuDNN {sig.op}: skip {shapes[name]} ({dtypes[name]}) must have X's shape {tuple(x)} "
                                  f"and dtype {dt} (a skip broadcast over the leading dims is left to the own kernels)")
        elif not _vector(shapes[name], d):
            raise TuningError(f"cuDNN {sig.op}: {name} must hold the {d} values of the last axis, got {shapes[name]}")
    has_skip = shapes["skip"] is not None
    sum_output = bool(sig.attr("sum_output", 0)) and has_skip
    eps = float(np.float32(sig.attr("epsilon", DEFAULT_EPS[sig.op])))
    return NormGeom(sig.op, rows, d, dt, (dtypes["scale"], dtypes.get("bias"), dtypes.get("skip_bias")),
                    shapes.get("bias") is not None, has_skip, shapes.get("skip_bias") is not None, sum_output, eps)


def norm_reason(sig: Signature) -> str | None:
    try:
        norm_geom(sig)
    except TuningError as e:
        return str(e)
    return None


def norm_graph(mod, handle, sig: Signature, training: bool = False):
    """The cuDNN frontend graph: (graph, tensors {"X", "scale", "bias", "skip"?, "skip_bias"?, "eps",
    "Y", "S"?, "mean"?, "inv_var"?}, geometry). ``training``: the TRAINING phase, whose statistics
    (fp32, one per row) are graph outputs too (bound to the workspace): the form cuDNN's samples fuse
    a pointwise add with, taken where the INFERENCE graph is not supported."""
    g = norm_geom(sig)
    dt = getattr(mod.data_type, DTYPES[g.dtype])
    f32 = mod.data_type.FLOAT
    graph = mod.pygraph(io_data_type=dt, intermediate_data_type=f32, compute_data_type=f32, handle=handle)
    xd, xs = [g.rows, g.D, 1, 1], [g.D, 1, 1, 1]
    pd, ps = [1, g.D, 1, 1], [g.D, 1, 1, 1]

    def param(name, dtype):
        return graph.tensor(name=name, dim=pd, stride=ps, data_type=getattr(mod.data_type, DTYPES[dtype or g.dtype]))

    t = {"X": graph.tensor(name="X", dim=xd, stride=xs, data_type=dt), "scale": param("scale", g.param_dtypes[0])}
    s = t["X"]
    if g.has_skip:
        t["skip"] = graph.tensor(name="skip", dim=xd, stride=xs, data_type=dt)
        s = graph.add(a=s, b=t["skip"], compute_data_type=f32, name="skip_add")
        if g.has_skip_bias:
            t["skip_bias"] = param("skip_bias", g.param_dtypes[2])
            s = graph.add(a=s, b=t["skip_bias"], compute_data_type=f32, name="skip_bias_add")
        if g.sum_output:
            s.set_output(True).set_data_type(dt)
            t["S"] = s
    t["eps"] = graph.tensor(name="eps", dim=[1, 1, 1, 1], stride=[1, 1, 1, 1], data_type=f32, is_pass_by_value=True)
    phase = mod.norm_forward_phase.TRAINING if training else mod.norm_forward_phase.INFERENCE
    if g.op == "LayerNorm":
        t["bias"] = param("bias", g.param_dtypes[1] if g.has_bias else g.param_dtypes[0])
        y, *stats = graph.layernorm(name="norm", norm_forward_phase=phase, input=s, scale=t["scale"], bias=t["bias"],
                                    epsilon=t["eps"])
        names = ("mean", "inv_var")
    else:
        y, *stats = graph.rmsnorm(name="norm", norm_forward_phase=phase, input=s, scale=t["scale"], epsilon=t["eps"])
        names = ("inv_var",)
    y.set_output(True).set_data_type(dt)
    t["Y"] = y
    if training:
        for name, st in zip(names, stats):
            st.set_output(True).set_data_type(f32).set_dim([g.rows, 1, 1, 1]).set_stride([1, 1, 1, 1])
            t[name] = st
    return graph, t, g


def _training_graph(mod, handle, sig: Signature):
    return norm_graph(mod, handle, sig, training=True)


def norm_built(sig: Signature, tag: str = ""):
    """The INFERENCE graph with its plans; where cuDNN offers none for it (a fused add it does not
    run in that phase), the TRAINING graph. ``tag``: a private copy (``cudnn.lowering_plan``)."""
    try:
        b = base.listed(sig, norm_graph, tag)
        if b.names:
            return b
    except Exception:  # noqa: BLE001 - refused in this phase: the training form below says why if it fails too
        pass
    return base.listed(sig, _training_graph, tag="|training" + tag)


def _layouts(op: str) -> tuple[str, ...]:
    """Every input and output of the op row-major (LayerNorm: X, scale, bias, skip, skip_bias, Y, S)."""
    schema = get_schema(op)
    return ("rowmajor",) * (len(schema.inputs) + len(schema.outputs))


def _zeros(nbytes: int):
    import cupy

    return cupy.zeros(max(1, nbytes), dtype=cupy.uint8)


@dataclass(frozen=True)
class CudnnNorm(base.CudnnCandidate):
    """params: ``plan=<cuDNN plan name>``, or none for the heuristic's first plan at load time."""

    def layouts(self, sig: Signature) -> tuple[str, ...]:
        return _layouts(sig.op)  # what build() declares

    def applies(self, sig: Signature, compute_capability: tuple[int, int] = (9, 0)) -> str | None:
        if sig.op not in OPS:
            return f"cuDNN norm candidates are for {', '.join(OPS)}"
        return base.unavailable_reason(compute_capability, (7, 0), "cuDNN normalization graphs") or norm_reason(sig)

    def graphs(self):
        return norm_built

    def build(self, sig: Signature, arch: str) -> Lowering:
        b, index, plan_bytes = self._plan(sig)
        g: NormGeom = b.extra
        t = b.tensors
        # the TRAINING form's statistics (fp32 per row) after the plan's own workspace
        stats = [n for n in ("mean", "inv_var") if n in t]
        stat_bytes = workspace_offset(g.rows * 4)
        first = workspace_offset(plan_bytes) if stats else plan_bytes
        ws_bytes = first + stat_bytes * len(stats)
        eps = np.full((1, 1, 1, 1), g.eps, dtype=np.float32)  # pass-by-value: read from host at each run
        zero_bias = _zeros(g.D * ITEMSIZE[g.param_dtypes[0] or g.dtype]) if g.op == "LayerNorm" and not g.has_bias else None
        scratch: list = []  # S when the caller gives no buffer for it (checker, timer)
        schema = get_schema(sig.op)

        def launch(inputs, outputs, workspace):
            pack = {t[name]: base.bind(a) for name, a in schema.named(inputs).items() if a is not None and name in t}
            if zero_bias is not None:
                pack[t["bias"]] = base.bind(zero_bias)
            pack[t["eps"]] = base.bind(eps)
            pack[t["Y"]] = base.bind(outputs[0])
            if "S" in t:
                s = outputs[1] if len(outputs) > 1 and outputs[1] is not None else None
                if s is None:
                    if not scratch:
                        scratch.append(_zeros(g.rows * g.D * ITEMSIZE[g.dtype]))
                    s = scratch[0]
                pack[t["S"]] = base.bind(s)
            for i, name in enumerate(stats):
                pack[t[name]] = base.bind(workspace[first + i * stat_bytes:first + (i + 1) * stat_bytes])
            base.execute(b, pack, workspace, index)

        return Lowering(launch=launch, outputs=2 if g.sum_output else 1, workspace_bytes=ws_bytes, capturable=True,
                        barrier=True,
                        layouts=_layouts(sig.op), versions=base.versions())


def candidates(op: str, sig: Signature | None = None) -> list[Candidate]:
    if op not in OPS:
        return []
    return base.plan_candidates(CudnnNorm, NAME, op, sig, norm_reason, norm_built)


def from_key(op: str, key: str) -> Candidate | None:
    return base.plan_from_key(CudnnNorm, NAME, key) if op in OPS else None
