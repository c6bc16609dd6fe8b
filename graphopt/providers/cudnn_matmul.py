"""cuDNN frontend candidates for GemmAct: ``matmul(A, B) -> add(C) -> activation`` as one cuDNN
operation graph, every engine plan a candidate (the same scheme as the CBR graphs of
``graphopt.providers.cudnn``, whose library loading, handle, versions and variant-pack entries this
module uses).

A and B are 3-D tensors ``[batch, M, K]`` / ``[batch, K, N]``; Gemm's transA / transB are strides,
not copies. A ``B`` shared by every batch folds the batch into M. ``C`` broadcasts through
dimensions of size 1 (a bias ``(N,)``, a row vector, a full matrix). fp32 compute and
intermediates; activations are those of cuDNN's pointwise ops (``cudnn_pointwise.ACTIVATIONS``; cuDNN's
``gelu`` is the exact erf form, ``gelu_approx_tanh`` the tanh one).

Measured on the H200 on 2026-12-04 (``bench/probe_vendor_api.py``: this graph in fp16 with a bias
and Gelu, best of 11 plans): 23.6 us against 45.3 for torch eager matmul + bias + gelu at
128x768x3072, 67.1 against 96.6 at 4096x768x3072, 53.7 against 58.7 at 4096x3072x768, 22.6 against
42.3 for a 12-batch 128x64x128.
"""

from __future__ import annotations

from dataclasses import dataclass

from graphopt.errors import TuningError
from graphopt.kernels import geometry as geo
from graphopt.kernels.gemm_act import gemm_plan
from graphopt.lowering.contract import Candidate, Lowering, Signature
from graphopt.providers import cudnn as _cudnn
from graphopt.providers.cudnn_pointwise import activation, activation_reason

OPS = ("GemmAct",)
NAME = "cudnn"



def _strides(dims: list[int], transposed: bool) -> list[int]:
    """Strides of a C-contiguous ``[b, r, c]`` matrix, or of its stored transpose ``[b, c, r]``."""
    b, r, c = dims
    return [r * c, 1, r] if transposed else [r * c, c, 1]


def _bias_strides(sig: Signature, p) -> tuple[int, int, int] | None:
    """C's element strides over the (batch, M, N) view of Y (0 where it broadcasts), or None when its
    batch dimensions do not collapse into one stride (then it has no single cuDNN tensor here)."""
    csh = sig.input_shapes[2] if len(sig.input_shapes) > 2 else None
    if csh is None:
        return None
    out_b = tuple(p.out_shape[:-2]) if len(p.out_shape) >= 2 else ()
    st = geo.broadcast_strides(csh, out_b + (p.M, p.N))
    if st is None:
        return None
    bst = st[:-2]
    if all(s == 0 for s in bst):
        return 0, st[-2], st[-1]
    if all(bst[i] == bst[i + 1] * out_b[i + 1] for i in range(len(bst) - 1)):
        return bst[-1], st[-2], st[-1]
    return None


def matmul_reason(sig: Signature) -> str | None:
    """Why this GemmAct signature has no cuDNN matmul graph (before any library call), or None."""
    try:
        p = gemm_plan(sig)
        dt = geo.dtype_of(sig)
    except TuningError as e:
        return str(e)
    if dt not in _cudnn.DTYPES:
        return f"dtype {dt} (cuDNN graphs here: {', '.join(_cudnn.DTYPES)})"
    why = activation_reason(sig)
    if why:
        return why
    if min(p.M, p.N, p.K) < 1:
        return "empty GEMM"
    if p.alpha != 1.0 or (p.bias is not None and p.beta != 1.0):
        return "alpha or beta other than 1"
    if p.broadcast_a or p.broadcast_b:
        return "a partial batch broadcast of A or B"
    if p.bias is not None and _bias_strides(sig, p) is None:
        return f"C of shape {sig.input_shapes[2]} broadcasts over only some batch dimensions"
    if p.Z > 1 and not p.fold and (p.a_batch == 0 or p.b_batch == 0):
        return "an operand shared by every batch while the other is batched (and C varies by row)"
    return None


def matmul_graph(mod, handle, sig: Signature):
    """The cuDNN frontend graph for a GemmAct signature and its tensors ``{"A", "B", "C"?, "Y"}``."""
    p = gemm_plan(sig)
    dt = getattr(mod.data_type, _cudnn.DTYPES[geo.dtype_of(sig)])
    f32 = mod.data_type.FLOAT
    graph = mod.pygraph(io_data_type=dt, intermediate_data_type=f32, compute_data_type=f32, handle=handle)
    Z, M = (1, p.Z * p.M) if p.fold else (p.Z, p.M)
    ad, bd, yd = [Z, M, p.K], [Z, p.K, p.N], [Z, M, p.N]
    t = {"A": graph.tensor(name="A", dim=ad, stride=_strides(ad, p.trans_a), data_type=dt),
         "B": graph.tensor(name="B", dim=bd, stride=_strides(bd, p.trans_b), data_type=dt)}
    y = graph.matmul(A=t["A"], B=t["B"], name="matmul")  # as probed on the H200 (compute type: the graph's)
    if p.bias is not None:
        sb, sr, sc = (0, 0, 1) if p.fold else _bias_strides(sig, p)
        cd = [Z if sb else 1, M if sr else 1, p.N if sc else 1]
        cs = [sb or cd[1] * cd[2], sr or cd[2], sc or 1]
        t["C"] = graph.tensor(name="C", dim=cd, stride=cs, data_type=dt)
        y = graph.add(a=y, b=t["C"], compute_data_type=f32, name="bias")
    y = activation(graph, y, sig, f32, t, rank=3)
    y.set_output(True).set_data_type(dt).set_dim(yd).set_stride(_strides(yd, False))
    t["Y"] = y
    return graph, t


def _graph_for(sig: Signature, tag: str = ""):
    """The validated graph and its listed plans, cached per signature and process (cudnn.listed)."""
    return _cudnn.listed(sig, matmul_graph, tag)


@dataclass(frozen=True)
class CudnnMatmul(_cudnn.CudnnCandidate):
    """params: ``plan=<cuDNN plan name>``, or none for the heuristic's first plan at load time."""

    def applies(self, sig: Signature, compute_capability: tuple[int, int] = (9, 0)) -> str | None:
        if sig.op not in OPS:
            return f"cuDNN matmul candidates here are for {', '.join(OPS)}"
        return _cudnn.unavailable_reason(compute_capability) or matmul_reason(sig)

    def graphs(self):
        return _graph_for

    def build(self, sig: Signature, arch: str) -> Lowering:
        b, index, ws_bytes = self._plan(sig)
        t = b.tensors

        def launch(inputs, outputs, workspace):
            pack = {t[name]: _cudnn._Dl(a) for name, a in zip("ABC", inputs) if a is not None and name in t}
            pack[t["Y"]] = _cudnn._Dl(outputs[0])
            _cudnn.execute(b, _cudnn.bind_constants(t, pack), workspace, index)

        return Lowering(launch=launch, outputs=1, workspace_bytes=ws_bytes, capturable=True, barrier=True,
                        layouts=(), versions=_cudnn.versions())


def candidates(op: str, sig: Signature | None = None) -> list[Candidate]:
    """The heuristic candidate, plus one per plan when ``sig`` is given and cuDNN can list them here
    (the listing remembered on disk, as for every cuDNN provider: a warm run builds no graph)."""
    if op not in OPS:
        return []
    return _cudnn.plan_candidates(CudnnMatmul, NAME, op, sig, matmul_reason, _graph_for)


def from_key(op: str, key: str) -> Candidate | None:
    return _cudnn.plan_from_key(CudnnMatmul, NAME, key) if op in OPS else None
