"""cuDNN frontend candidates: CBR as one fused cuDNN operation graph, every engine plan a candidate.

The graph is ``conv_fprop(X, W) -> add(B) -> add(R) -> activation`` with fp32 compute and
intermediates, X / W / R / Y in NHWC (channels-last strides: ``graphopt.lowering.layout``), which is
where cuDNN's fused engines are fast on tensor cores. Each plan that cuDNN's heuristics (mode A,
then the fallback list) offer and that ``check_support`` keeps is a candidate keyed by its plan name
(engine id and knobs, stable across runs, not a list position); the plain ``cudnn`` candidate asks
cuDNN's heuristic for its first plan when the node is loaded (the heuristic's choice when nothing
was profiled). Each plan gets its own workspace size: a plan executed with another plan's workspace
faulted and poisoned the CUDA context on the H200, so candidates are timed in the profiler's
isolated worker like the own kernels.

Activations cuDNN's pointwise ops express: none, Relu, Clip (as a clipped relu), LeakyRelu,
Sigmoid, SiLU (swish), Gelu, GeluTanh. HardSwish / HardSigmoidMul are left to the own kernels.

Graph construction (:func:`conv_graph`) takes the ``cudnn`` module as an argument, so the CPU tests
drive it with a fake module that records the calls.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from graphopt.errors import TuningError
from graphopt.kernels import geometry as geo
from graphopt.lowering.contract import Candidate, Lowering, Signature

OPS = ("CBR",)
NAME = "cudnn"
DTYPES = {"float16": "HALF", "float32": "FLOAT", "bfloat16": "BFLOAT16"}
ACTIVATIONS = ("none", "Relu", "Clip", "LeakyRelu", "Sigmoid", "SiLU", "Gelu", "GeluTanh")
# X, W, B, R in, Y out: what the runtime and the checker hand over / allocate
LAYOUTS = ("NHWC", "NHWC", "", "NHWC", "NHWC")

_STATE: dict[str, Any] = {}  # "module", "reason", "handle": per process
_GRAPHS: dict[str, Any] = {}  # signature key -> _Built (one graph per signature and process)


def _load():
    if "reason" not in _STATE:
        try:
            import cudnn  # nvidia-cudnn-frontend

            _STATE["module"], _STATE["reason"] = cudnn, None
        except Exception as e:  # noqa: BLE001 - not installed, or its libcudnn is missing
            _STATE["module"] = None
            _STATE["reason"] = (f"nvidia-cudnn-frontend is not importable ({type(e).__name__}: "
                                f"{str(e).splitlines()[0][:120] if str(e) else ''}); pip install 'graphopt[gpu]'")
    return _STATE["module"]


def unavailable() -> str | None:
    """None when the cuDNN frontend imports here, else why not."""
    _load()
    return _STATE["reason"]


def versions() -> tuple[tuple[str, str], ...]:
    mod = _load()
    if mod is None:
        return ()
    backend = mod.backend_version() if hasattr(mod, "backend_version") else "?"
    return (("cudnn", str(backend)), ("cudnn_frontend", str(getattr(mod, "__version__", "?"))))


def _handle(mod):
    if "handle" not in _STATE:
        _STATE["handle"] = mod.create_handle()
    return _STATE["handle"]


def _nhwc_strides(dims: list[int]) -> list[int]:
    n, c, h, w = dims
    return [c * h * w, 1, w * c, c]


def conv_reason(sig: Signature) -> str | None:
    """Why this CBR signature has no cuDNN graph (before any library call), or None."""
    try:
        g = geo.conv_geom(sig)
        dt = geo.dtype_of(sig)
    except TuningError as e:
        return str(e)
    if dt not in DTYPES:
        return f"dtype {dt} (cuDNN graphs here: {', '.join(DTYPES)})"
    act = sig.attr("activation", "none")
    if act not in ACTIVATIONS:
        return f"activation {act} has no cuDNN pointwise form here (supported: {', '.join(ACTIVATIONS)})"
    if g.N * g.C * g.H * g.W >= 2 ** 31 or g.N * g.M * g.OH * g.OW >= 2 ** 31:
        return "tensors over 2**31 elements"
    return None


def conv_graph(mod, handle, sig: Signature):
    """The cuDNN frontend graph for a CBR signature and its tensors ``{"X", "W", "B"?, "R"?, "Y"}``."""
    g = geo.conv_geom(sig)
    dt = getattr(mod.data_type, DTYPES[geo.dtype_of(sig)])
    f32 = mod.data_type.FLOAT
    graph = mod.pygraph(io_data_type=dt, intermediate_data_type=f32, compute_data_type=f32, handle=handle)
    xd = [g.N, g.C, g.H, g.W]
    wd = [g.M, g.C // g.G, g.KH, g.KW]
    yd = [g.N, g.M, g.OH, g.OW]
    t = {"X": graph.tensor(name="X", dim=xd, stride=_nhwc_strides(xd), data_type=dt),
         "W": graph.tensor(name="W", dim=wd, stride=_nhwc_strides(wd), data_type=dt)}
    post_h = (g.OH - 1) * g.sh + g.dh * (g.KH - 1) + 1 - g.H - g.ph
    post_w = (g.OW - 1) * g.sw + g.dw * (g.KW - 1) + 1 - g.W - g.pw
    y = graph.conv_fprop(image=t["X"], weight=t["W"], pre_padding=[g.ph, g.pw], post_padding=[max(post_h, 0), max(post_w, 0)],
                         stride=[g.sh, g.sw], dilation=[g.dh, g.dw], compute_data_type=f32, name="conv")
    shapes = sig.input_shapes
    if len(shapes) > 2 and shapes[2] is not None:
        t["B"] = graph.tensor(name="B", dim=[1, g.M, 1, 1], stride=[g.M, 1, g.M, g.M], data_type=dt)
        y = graph.add(a=y, b=t["B"], compute_data_type=f32, name="bias")
    if len(shapes) > 3 and shapes[3] is not None:
        t["R"] = graph.tensor(name="R", dim=yd, stride=_nhwc_strides(yd), data_type=dt)
        y = graph.add(a=y, b=t["R"], compute_data_type=f32, name="residual")
    y = _activation(graph, y, sig, f32)
    y.set_output(True).set_data_type(dt).set_dim(yd).set_stride(_nhwc_strides(yd))
    t["Y"] = y
    return graph, t


def _activation(graph, y, sig: Signature, f32):
    name = sig.attr("activation", "none")
    if name == "none":
        return y
    if name == "Relu":
        return graph.relu(input=y, compute_data_type=f32, name="act")
    if name == "Clip":
        lo, hi = sig.attr("clip_min"), sig.attr("clip_max")
        kw = {}
        if lo is not None:
            kw["lower_clip"] = float(lo)
        if hi is not None:
            kw["upper_clip"] = float(hi)
        if lo is None:  # a relu clips below at 0 unless told otherwise
            kw["lower_clip"] = -math.inf
        return graph.relu(input=y, compute_data_type=f32, name="act", **kw)
    if name == "LeakyRelu":
        return graph.leaky_relu(input=y, negative_slope=float(sig.attr("act_alpha", 0.01)), compute_data_type=f32, name="act")
    if name == "Sigmoid":
        return graph.sigmoid(input=y, compute_data_type=f32, name="act")
    if name == "SiLU":
        return graph.swish(input=y, compute_data_type=f32, name="act")
    if name == "Gelu":
        return graph.gelu(input=y, compute_data_type=f32, name="act")
    if name == "GeluTanh":
        return graph.gelu_approx_tanh(input=y, compute_data_type=f32, name="act")
    raise TuningError(f"activation {name} has no cuDNN form")


@dataclass
class _Built:
    graph: Any
    tensors: dict
    names: list  # plan name at each index
    built: set


def _graph_for(sig: Signature) -> _Built:
    """The graph of ``sig`` with its plans listed (cached per process: candidates share it)."""
    key = sig.key()
    if key not in _GRAPHS:
        mod = _load()
        if mod is None:
            raise TuningError(_STATE["reason"])
        graph, tensors = conv_graph(mod, _handle(mod), sig)
        graph.validate()
        graph.build_operation_graph()
        graph.create_execution_plans([mod.heur_mode.A, mod.heur_mode.FALLBACK])
        graph.check_support()
        n = graph.get_execution_plan_count()
        _GRAPHS[key] = _Built(graph, tensors, [str(graph.get_plan_name_at_index(i)) for i in range(n)], set())
    return _GRAPHS[key]


class _Dl:
    """A variant-pack entry: the frontend reads an array's pointer through ``__dlpack__``. CuPy's
    ``__dlpack__()`` without a stream would make the legacy stream wait on ours (illegal under
    CUDA-graph capture): ``stream=-1`` asks for no synchronisation (we run on the same stream)."""

    __slots__ = ("a",)

    def __init__(self, a):
        self.a = a

    def __dlpack__(self, stream=None, **kw):
        try:
            return self.a.__dlpack__(stream=-1)
        except (TypeError, ValueError, NotImplementedError):
            return self.a.toDlpack()


@dataclass(frozen=True)
class CudnnConv(Candidate):
    """params: ``plan=<cuDNN plan name>``, or none for the heuristic's first plan at load time."""

    def applies(self, sig: Signature, compute_capability: tuple[int, int] = (9, 0)) -> str | None:
        if sig.op not in OPS:
            return f"cuDNN candidates here are for {', '.join(OPS)}"
        if _load() is None:
            return _STATE["reason"]
        if tuple(compute_capability) < (7, 0):
            return f"cuDNN fused graphs need compute capability >= 7.0, got {compute_capability}"
        return conv_reason(sig)

    def source_hash(self) -> str:
        return "cudnn:" + ",".join(f"{k}={v}" for k, v in versions())

    def versions(self) -> tuple[tuple[str, str], ...]:
        return versions()

    def build(self, sig: Signature, arch: str) -> Lowering:
        reason = self.applies(sig)
        if reason:
            raise TuningError(f"candidate {self.key()} does not apply: {reason}")
        mod = _load()
        b = _graph_for(sig)
        if not b.names:
            raise TuningError(f"cuDNN offers no plan for {sig.key()}")
        want = self.param("plan")
        if want is None:
            index = 0
        elif want in b.names:
            index = b.names.index(want)
        else:
            raise TuningError(f"cuDNN plan {want!r} is not offered for this signature here (offered: {', '.join(b.names[:8])})")
        if index not in b.built:
            b.graph.build_plan_at_index(index)
            b.built.add(index)
        ws_bytes = int(b.graph.get_workspace_size_plan_at_index(index))
        handle = _handle(mod)
        t = b.tensors
        order = ["X", "W", "B", "R"]

        def launch(inputs, outputs, workspace):
            import cupy

            pack = {t[name]: _Dl(a) for name, a in zip(order, inputs) if a is not None and name in t}
            pack[t["Y"]] = _Dl(outputs[0])
            mod.set_stream(handle=handle, stream=cupy.cuda.get_current_stream().ptr)
            ws = workspace if workspace is not None else cupy.empty(1, dtype=cupy.uint8)
            b.graph.execute_plan_at_index(pack, _Dl(ws), index, handle=handle)

        return Lowering(launch=launch, outputs=1, workspace_bytes=ws_bytes, capturable=True,
                        layouts=LAYOUTS, versions=versions())


def candidates(op: str, sig: Signature | None = None) -> list[Candidate]:
    """The heuristic candidate, plus one per plan when ``sig`` is given and cuDNN can list them here."""
    if op not in OPS:
        return []
    out: list[Candidate] = [CudnnConv(NAME)]
    if sig is None or _load() is None or conv_reason(sig) is not None:
        return out
    try:
        names = _graph_for(sig).names
    except Exception:  # noqa: BLE001 - no GPU, or cuDNN rejects the graph: the heuristic candidate says why
        return out
    return out + [CudnnConv(NAME, (("plan", n),)) for n in names]


def from_key(op: str, key: str) -> Candidate | None:
    if op not in OPS:
        return None
    if key == NAME:
        return CudnnConv(NAME)
    if key.startswith(NAME + ":plan="):
        return CudnnConv(NAME, (("plan", key[len(NAME) + len(":plan="):]),))
    return None
