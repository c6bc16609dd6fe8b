"""cuBLASLt candidates: GemmAct and 1x1 CBR as one cuBLASLt matmul with a fused epilogue.

The epilogues are BIAS, RELU_BIAS and GELU_BIAS (DEFAULT, RELU, GELU without a bias): the bias is a
vector over the output's last dimension (GemmAct's ``C`` of shape ``(N,)``, ``(1, N)``, ...; CBR's
per-channel bias), added before the activation. cuBLASLt's GELU is the tanh approximation (cuBLAS
documentation, footnote to cublasLtEpilogue_t), so it serves ``GeluTanh`` only, never the exact
erf ``Gelu``. Inputs fp16 / bf16 / fp32, fp32 compute and fp32 alpha. Batched GemmAct (numpy
matmul batch dims) is a strided batch; a ``B`` shared by every batch folds the batch into the rows.

Row-major operands map onto cuBLASLt's column-major convention as ``Y^T = op(B)^T op(A)^T``: our B
is cuBLASLt's A and our A its B, so the bias (one value per row of cuBLASLt's D) is one value per
column of our Y.

1x1 CBR with stride 1, no padding and group 1 in NHWC is ``Y[N*H*W, M] = X[N*H*W, C] W[M, C]^T``
+ bias, then the activation. A residual input is left to other candidates (cuBLASLt's order of
``beta * C`` and the epilogue is not documented precisely enough to rely on).

``cublaslt_bt`` is the same call on a GemmAct whose B (K x N, one matrix shared by every batch) has rows
that are not 16-byte multiples (N x itemsize; GPT-2's tied LM head has N = 50257): B is declared
``colmajor`` (stored transposed, rows K apart) and passed as ``op(A) = T``. The runtime converts a
constant B once, when the plan is built; the tuner never lets an activation take it (a transpose on
every run). On the H200 every GemmAct candidate for GPT-2's LM head at bs32 took 2.5-8 ms with B's
rows odd-length (``bench/NOTES_e2e.md``, 2026-12-05).

``cublaslt_pad`` is for the same odd row length in the *output*: measured on the H200 (2026-12-05),
``cublaslt_bt`` did not help GPT-2's LM head (3.04 ms against cuBLAS's 2.49 at bs32; 0.129 against
0.088 ms at bs1): with every operand but Y aligned, the epilogue still writes 412 MB of rows 100,514
bytes apart. This variant computes Y into a workspace whose rows are padded to the next 16-byte
multiple (cuBLASLt's D with ``ld`` = N rounded up), then one ``cudaMemcpy2DAsync`` packs the rows
into the output (one pass over Y, capturable). B as in ``cublaslt_bt`` (or as given when it is
already stored transposed). torch.compile's inductor pads such matmuls the same way (``pad_mm``).
Measured on the H100 (2026-12-05) the heuristic still offered only its pre-Hopper algorithm 24 for
the LM head with every operand aligned: it withholds the TMA kernels for an odd row count itself.
So the variant makes two calls: the largest 16-byte multiple of the rows (50256), then the 1-7 rest
beside it in D (offset columns of B, D and the bias; the heuristic's first algorithm), one workspace.

``cublaslt_act`` runs an activation cuBLASLt has no epilogue for (the erf ``Gelu`` of BERT's MLP,
``SiLU``, ``Clip`` = ReLU6, ``Sigmoid``, ...): the matmul with the BIAS (or DEFAULT) epilogue, then
graphopt's 16-byte vector activation kernel in place (``epilogue_gemm_vec`` without a bias), where
the output's rows are whole vectors. It competes with cuDNN's fused graphs and ``cublas_ws`` plus
the epilogue (which adds the bias in that pass too).

Each algorithm ``cublasLtMatmulAlgoGetHeuristic`` returns (up to :data:`REQUEST`) is a candidate
keyed by its configuration (algorithm id, tile, stages, split-K, reduction, swizzle, custom option,
inner and cluster shape), not by its list position; the plain ``cublaslt`` candidate takes the
heuristic's first algorithm when the node is loaded. Each has its own workspace size. Descriptors
are made at build time, so ``launch`` is one ``cublasLtMatmul`` on the current stream: capturable.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from graphopt.errors import TuningError
from graphopt.kernels import geometry as geo
from graphopt.kernels.gemm_act import gemm_plan, vector_epilogue_launcher
from graphopt.kernels.source import ACT_CODES, VEC16, instance, source_hash
from graphopt.lowering.contract import Candidate, Lowering, Signature
from graphopt.providers import cublaslt_lib as lt

OPS = ("GemmAct", "CBR")
NAME = "cublaslt"
NAME_BT = "cublaslt_bt"  # GemmAct with B declared colmajor (module docstring)
NAME_ACT = "cublaslt_act"  # an activation cuBLASLt lacks, as a kernel after the matmul (module docstring)
NAME_PAD = "cublaslt_pad"  # Y computed with padded rows in the workspace, then packed (module docstring)
VARIANTS = {NAME: "", NAME_BT: "bt", NAME_ACT: "act", NAME_PAD: "pad"}  # family name -> variant
GEMM_ONLY = (NAME_BT, NAME_PAD)  # variants for GemmAct only
DTYPES = {"float16": "CUDA_R_16F", "bfloat16": "CUDA_R_16BF", "float32": "CUDA_R_32F"}
ITEMSIZE = {"float16": 2, "bfloat16": 2, "float32": 4}
# (activation, has bias) -> cublasLtEpilogue_t
EPILOGUES = {("none", False): "CUBLASLT_EPILOGUE_DEFAULT", ("none", True): "CUBLASLT_EPILOGUE_BIAS",
             ("Relu", False): "CUBLASLT_EPILOGUE_RELU", ("Relu", True): "CUBLASLT_EPILOGUE_RELU_BIAS",
             ("GeluTanh", False): "CUBLASLT_EPILOGUE_GELU", ("GeluTanh", True): "CUBLASLT_EPILOGUE_GELU_BIAS"}
ACTIVATIONS = ("none", "Relu", "GeluTanh")
REQUEST = 16  # algorithms asked of the heuristic per signature
MAX_WORKSPACE = 32 << 20
ALIGNMENT = 16  # bytes; the heuristic keeps algorithms that work at this operand alignment, launch checks it
# X, W, B, R in, Y out. R (never given here) is NHWC too, so that Y's layout is NHWC also where a
# node has 3 inputs (Lowering.output_layout indexes after the inputs actually passed).
LAYOUTS = {"GemmAct": (), "CBR": ("NHWC", "", "", "NHWC", "NHWC")}
LAYOUTS_BT = ("", "colmajor")  # A as given (C-contiguous), B stored transposed; bias and Y C-contiguous


@dataclass(frozen=True)
class Problem:
    """One cuBLASLt call in column-major terms: D (m x n) = op(A) (m x k) . op(B) (k x n)."""

    dtype: str              # DTYPES value
    m: int
    n: int
    k: int
    transa: int             # CUBLAS_OP_N / _T of cuBLASLt's A (our B)
    transb: int
    a: tuple[int, int, int]  # stored rows, cols, ld of cuBLASLt's A
    b: tuple[int, int, int]
    batch: int
    stride_a: int           # elements between batches (0: shared)
    stride_b: int
    epilogue: str
    alpha: float
    a_input: int            # which node input is cuBLASLt's A
    b_input: int
    bias_input: int | None
    ld_d: int = 0           # D's leading dimension when padded (0: m, D packed)
    tail: int = 0           # cuBLASLt rows (our Y's columns) after m, left to a second call (pad)

    @property
    def d_ld(self) -> int:
        return self.ld_d or self.m


def _row_major(dtype: str, M: int, N: int, K: int, trans_a: bool, trans_b: bool, Z: int, sa: int, sb: int,
               act: str, bias: bool, alpha: float, a_input: int, b_input: int, bias_input: int | None) -> Problem:
    """``Y[z] (M x N) = op(A[z]) (M x K) . op(B[z]) (K x N)``, row-major, as cuBLASLt's column-major call."""
    la = (K, N, K) if trans_b else (N, K, N)
    lb = (M, K, M) if trans_a else (K, M, K)
    return Problem(DTYPES[dtype], N, M, K, int(trans_b), int(trans_a), la, lb, Z, sb, sa,
                   EPILOGUES[(act, bias)], alpha, b_input, a_input, bias_input)


def _act_name(sig: Signature) -> str:
    act = sig.attr("activation", "none")
    return act.decode() if isinstance(act, bytes) else str(act)


def _activation(sig: Signature) -> str:
    act = _act_name(sig)
    if act not in ACTIVATIONS:
        raise TuningError(f"activation {act} has no cuBLASLt epilogue (supported: none, Relu, GeluTanh; "
                          "cuBLASLt's GELU is the tanh approximation)")
    return act


def _gemm_operands(sig: Signature, variant: str):
    """(gemm plan, itemsize) of a GemmAct signature for a GemmAct-only variant, or the reason there is none."""
    if sig.op != "GemmAct":
        return f"cublaslt_{variant} is for GemmAct"
    try:
        p = gemm_plan(sig)
        dt = geo.dtype_of(sig)
    except TuningError as e:
        return str(e)
    size = ITEMSIZE.get(dt)
    if size is None:
        return f"dtype {dt} (cuBLASLt here: {', '.join(DTYPES)})"
    return p, size


def b_transposed_reason(sig: Signature) -> str | None:
    """Why ``cublaslt_bt`` does not apply to ``sig`` (None: it does)."""
    got = _gemm_operands(sig, "bt")
    if isinstance(got, str):
        return got
    p, size = got
    if p.trans_b:
        return "B is already stored transposed (transB=1)"
    if len(p.b_shape) != 2:
        return "B is not one matrix shared by every batch"
    if (p.N * size) % ALIGNMENT == 0:
        return f"B's rows are already {ALIGNMENT}-byte multiples (N={p.N})"
    if (p.K * size) % ALIGNMENT:
        return f"K={p.K}: B's transposed rows would not be {ALIGNMENT}-byte multiples either"
    return None


def padded_output_reason(sig: Signature) -> str | None:
    """Why ``cublaslt_pad`` does not apply to ``sig`` (None: it does)."""
    got = _gemm_operands(sig, "pad")
    if isinstance(got, str):
        return got
    p, size = got
    if (p.N * size) % ALIGNMENT == 0:
        return f"the output's rows are already {ALIGNMENT}-byte multiples (N={p.N})"
    if (p.K * size) % ALIGNMENT:
        return f"K={p.K}: the operands' rows of K elements would not be {ALIGNMENT}-byte multiples"
    if not p.trans_b and len(p.b_shape) != 2:
        return "B is not one matrix shared by every batch (it would be stored transposed)"
    if p.N < ALIGNMENT // size:
        return f"N={p.N} is under one 16-byte row: no aligned part to split off"
    return None


def padded_ld(n: int, dtype: str) -> int:
    """``n`` rounded up to whole 16-byte rows of ``dtype``."""
    per = ALIGNMENT // ITEMSIZE[dtype]
    return -(-n // per) * per


def _b_transposed(sig: Signature, variant: str) -> bool:
    """Whether the variant stores B transposed (declared colmajor): bt always; pad unless B already is."""
    return variant == "bt" or (variant in ("pad", "pad_tail") and not gemm_plan(sig).trans_b)


def _rows(sig: Signature) -> int:
    """The output's row length (GemmAct's N, a 1x1 CBR's output channels)."""
    return gemm_plan(sig).N if sig.op == "GemmAct" else geo.conv_geom(sig).M


def _out_elements(sig: Signature) -> int:
    """The output's element count (GemmAct's Z x M x N, a 1x1 CBR's N x M x H x W)."""
    if sig.op == "GemmAct":
        p = gemm_plan(sig)
        return p.Z * p.M * p.N
    g = geo.conv_geom(sig)
    return g.N * g.M * g.OH * g.OW


def post_activation_reason(sig: Signature) -> str | None:
    """Why ``cublaslt_act`` does not apply to ``sig`` (None: it does)."""
    act = _act_name(sig)
    if act in ACTIVATIONS:
        return f"activation {act} is a cuBLASLt epilogue (the plain cublaslt candidates fuse it)"
    if act not in ACT_CODES:
        return f"activation {act!r} has no kernel"
    try:
        dt = geo.dtype_of(sig)
        n = _rows(sig)
    except (TuningError, TypeError, IndexError) as e:
        return str(e) or "unknown output row length"
    vec = VEC16.get(dt, 0)
    if not vec or n % vec:
        return f"the output's rows ({n} x {dt}) are not whole 16-byte vectors (the in-place activation kernel's loads)"
    return None


def variant_reason(sig: Signature, variant: str) -> str | None:
    """Why a variant's own condition fails (``b_transposed_reason`` / ``post_activation_reason`` /
    ``padded_output_reason``; ``pad_tail``, the pad variant's second call, as ``pad``)."""
    check = {"bt": b_transposed_reason, "act": post_activation_reason, "pad": padded_output_reason,
             "pad_tail": padded_output_reason}.get(variant)
    return check(sig) if check else None


def problem(sig: Signature, variant: str = "") -> Problem:
    """The cuBLASLt call for a GemmAct or CBR signature (``variant``: ``bt``, B stored transposed as
    ``cublaslt_bt`` declares it; ``act``, the activation left to a kernel after the call); TuningError
    says why there is none."""
    if sig.op not in OPS:
        raise TuningError(f"cuBLASLt candidates here are for {', '.join(OPS)}")
    reason = variant_reason(sig, variant)
    if reason:
        raise TuningError(reason)
    dt = geo.dtype_of(sig)
    if dt not in DTYPES:
        raise TuningError(f"dtype {dt} (cuBLASLt here: {', '.join(DTYPES)})")
    act = "none" if variant == "act" else _activation(sig)
    if sig.op == "CBR":
        return _conv_problem(sig, dt, act)
    p = gemm_plan(sig)
    if min(p.M, p.N, p.K) < 1:
        raise TuningError("empty GEMM")
    if p.broadcast_a or p.broadcast_b:
        raise TuningError("a partial batch broadcast of A or B (cuBLASLt takes one batch stride per operand)")
    bias = p.bias is not None
    if bias and not (p.bias[0] == 0 and p.bias[1] == 0 and (p.bias[2] == 1 or p.N == 1)) or p.bias_full:
        raise TuningError(f"C of shape {sig.input_shapes[2]} is not a bias over the last dimension "
                          "(cuBLASLt's bias epilogue adds one vector to every row)")
    if bias and (p.beta != 1.0 or p.alpha != 1.0):
        raise TuningError("alpha or beta other than 1 with a bias (the epilogue's bias is not scaled)")
    M, Z, sa = (p.M * p.Z, 1, 0) if p.fold else (p.M, p.Z, p.a_batch)
    pr = _row_major(dt, M, p.N, p.K, p.trans_a, p.trans_b or _b_transposed(sig, variant), Z, sa,
                    p.b_batch if Z > 1 else 0, act, bias, p.alpha, 0, 1, 2 if bias else None)
    if variant in ("pad", "pad_tail"):
        pr = _split_rows(pr, p.N, dt, tail=variant == "pad_tail")
    return pr


def _split_rows(pr: Problem, n: int, dtype: str, tail: bool) -> Problem:
    """The pad variant's two calls: cuBLASLt's rows (our Y's ``n`` columns) split into the largest
    16-byte multiple (``main``: every operand's rows and offsets aligned, so the heuristic offers the
    TMA kernels, which it withholds for an odd row count) and the rest (``tail``, 1-7 rows of fp16);
    both write D with the padded leading dimension. cuBLASLt's A is our B stored transposed (K x n,
    column-major), so a row split is a column offset of A, D and the bias."""
    per = ALIGNMENT // ITEMSIZE[dtype]
    main = n // per * per
    rows = n - main if tail else main
    return replace(pr, m=rows, a=(pr.a[0], rows, pr.a[2]), ld_d=padded_ld(n, dtype), tail=0 if tail else n - main)


def _conv_problem(sig: Signature, dt: str, act: str) -> Problem:
    g = geo.conv_geom(sig)
    if (g.KH, g.KW, g.sh, g.sw, g.ph, g.pw, g.G) != (1, 1, 1, 1, 0, 0, 1) or (g.OH, g.OW) != (g.H, g.W):
        raise TuningError("cuBLASLt runs only 1x1 convolutions with stride 1, no padding and group 1 (a plain GEMM)")
    shapes = sig.input_shapes
    if len(shapes) > 3 and shapes[3] is not None:
        raise TuningError("a residual input (cuBLASLt's beta * C before the epilogue is not relied on)")
    bias = len(shapes) > 2 and shapes[2] is not None
    return _row_major(dt, g.N * g.H * g.W, g.M, g.C, False, True, 1, 0, 0, act, bias, 1.0, 0, 1, 2 if bias else None)


def shape_reason(sig: Signature, variant: str = "") -> str | None:
    """Why cuBLASLt cannot run this signature (before any library call), or None."""
    try:
        problem(sig, variant)
    except TuningError as e:
        return str(e)
    return None


def unavailable() -> str | None:
    return lt.unavailable()


def versions() -> tuple[tuple[str, str], ...]:
    a = lt.api()
    return () if a is None else (("cublaslt", str(a.version())),)


def _device() -> int:
    try:
        import cupy

        return int(cupy.cuda.Device().id)
    except Exception:  # noqa: BLE001 - no CuPy (tests with a fake library)
        return 0


@dataclass
class _Setup:
    """Descriptors of one problem and the algorithms the heuristic offered, in its order."""

    handle: Any
    desc: Any
    layouts: tuple  # A, B, D (D doubles as C)
    algos: list     # [(config, Algo, workspace bytes)]


_SETUPS: dict[tuple[str, int, str], _Setup] = {}  # (signature key, device, variant) -> setup, per process


def _describe(a: lt.Api, pr: Problem, handle) -> _Setup:
    desc = a.matmul_desc(pr.transa, pr.transb, pr.epilogue)
    if pr.bias_input is not None:  # the heuristic reads only the pointer's alignment: exactly ALIGNMENT
        a.set_bias(desc, (1 << 20) | ALIGNMENT)
    la = a.layout(pr.dtype, *pr.a, batch=pr.batch, stride=pr.stride_a)
    lb = a.layout(pr.dtype, *pr.b, batch=pr.batch, stride=pr.stride_b)
    ld = a.layout(pr.dtype, pr.m, pr.n, pr.d_ld, batch=pr.batch, stride=pr.d_ld * pr.n)
    pref = a.preference(MAX_WORKSPACE, ALIGNMENT)
    found, seen = [], set()
    for r in a.heuristic(handle, desc, la, lb, ld, ld, pref, REQUEST):
        cfg = a.config(r.algo)
        if cfg and cfg not in seen:
            seen.add(cfg)
            found.append((cfg, r.algo, int(r.workspaceSize)))
    return _Setup(handle, desc, (la, lb, ld), found)


def _setup_for(sig: Signature, variant: str = "") -> _Setup:
    key = (sig.key(), _device(), variant)
    if key not in _SETUPS:
        a = lt.api()
        if a is None:
            raise TuningError(lt.unavailable())
        _SETUPS[key] = _describe(a, problem(sig, variant), a.handle(key[1]))
    return _SETUPS[key]


def _ptr(x) -> int:
    data = getattr(x, "data", None)
    return int(data.ptr) if hasattr(data, "ptr") else int(x.ctypes.data)


@dataclass(frozen=True)
class CublasLtGemm(Candidate):
    """params: the algorithm's configuration (``algo=..,tile=..,stages=..,...``), or none for the
    heuristic's first algorithm at load time. ``name`` is one of ``VARIANTS``."""

    @property
    def variant(self) -> str:
        return VARIANTS[self.name]

    def layouts(self, sig: Signature) -> tuple[str, ...]:
        if self.variant in ("bt", "pad") and sig.op == "GemmAct" and _b_transposed(sig, self.variant):
            return LAYOUTS_BT  # what build() declares
        return LAYOUTS.get(sig.op, ())

    def kernels(self, sig: Signature) -> list[tuple[str, str]]:
        """The own kernel the ``act`` variant launches after the matmul (for prebuilding)."""
        if self.variant != "act" or post_activation_reason(sig):
            return []
        dt = geo.dtype_of(sig)
        return [("elementwise.cu", instance("epilogue_gemm_vec", dt, VEC16[dt]))]

    def applies(self, sig: Signature, compute_capability: tuple[int, int] = (9, 0)) -> str | None:
        if sig.op not in OPS:
            return f"cuBLASLt candidates here are for {', '.join(OPS)}"
        reason = lt.unavailable()
        if reason:
            return reason
        return shape_reason(sig, self.variant)

    def source_hash(self) -> str:
        libs = "cublaslt:" + ",".join(f"{k}={v}" for k, v in versions())
        # pad: "+split" since the aligned rows and the tail became two calls (older timings are not served)
        return libs + {"act": "+" + source_hash("elementwise.cu"), "pad": "+split"}.get(self.variant, "")

    def versions(self) -> tuple[tuple[str, str], ...]:
        return versions()

    def build(self, sig: Signature, arch: str) -> Lowering:
        reason = self.applies(sig)
        if reason:
            raise TuningError(f"candidate {self.key()} does not apply: {reason}")
        a = lt.api()
        pr = problem(sig, self.variant)
        s = _setup_for(sig, self.variant)
        if not self.params:
            if not s.algos:
                raise TuningError(f"cuBLASLt's heuristic offers no algorithm for {sig.key()}")
            _, algo, ws_bytes = s.algos[0]
        else:
            want = tuple((k, int(v)) for k, v in self.params)
            match = [(al, w) for cfg, al, w in s.algos if cfg == want]
            if match:
                algo, ws_bytes = match[0]
            else:  # recorded elsewhere (another process's heuristic list): rebuild it from its configuration
                algo, ws_bytes = a.algo_from_config(s.handle, s.desc, *s.layouts, s.layouts[2], pr.dtype, dict(want))
        alpha, beta = ctypes.c_float(pr.alpha), ctypes.c_float(0.0)
        la, lb, ld = s.layouts
        # A bias pointer is a descriptor attribute: each lowering (each node) gets its own descriptor,
        # so nodes of one signature never see each other's bias, whatever cuBLASLt keeps of a
        # descriptor in a captured CUDA graph. Without a bias the signature's descriptor is shared.
        desc = a.matmul_desc(pr.transa, pr.transb, pr.epilogue) if pr.bias_input is not None else s.desc
        post = _post_activation(sig) if self.variant == "act" else None
        # pad: D (rows d_ld apart) at the workspace's start, cuBLASLt's own workspace after it; the
        # rows past the aligned part (pr.tail) by a second call with the heuristic's first algorithm
        esize = ITEMSIZE[geo.dtype_of(sig)]
        d_bytes = -(-(pr.d_ld * pr.n * pr.batch * esize) // 256) * 256 if pr.ld_d else 0
        rows, row_bytes = pr.n * pr.batch, (pr.m + pr.tail) * esize
        tail = _tail_call(a, sig, pr) if pr.tail else None
        ws_bytes = max(ws_bytes, tail.ws_bytes if tail else 0)  # the calls run in stream order: one workspace

        def launch(inputs, outputs, workspace):
            ins = list(inputs) + [None] * 3
            base = 0 if workspace is None else _ptr(workspace)
            if d_bytes and not base:
                raise TuningError(f"{self.key()} needs its workspace ({d_bytes + ws_bytes} bytes)")
            ptrs = [_ptr(ins[pr.a_input]), _ptr(ins[pr.b_input]), base if d_bytes else _ptr(outputs[0])]
            if pr.bias_input is not None:
                ptrs.append(_ptr(ins[pr.bias_input]))
                a.set_bias(desc, ptrs[-1])
            if any(p % ALIGNMENT for p in ptrs):
                raise TuningError(f"cuBLASLt operands must be {ALIGNMENT}-byte aligned")
            ws = base + d_bytes if base and ws_bytes else 0
            status = a.matmul(s.handle, desc, alpha, ptrs[0], la, ptrs[1], lb, beta, ptrs[2], ld, algo,
                              ws, ws_bytes if ws else 0, _stream())
            if status == lt.CUBLAS_STATUS_SUCCESS and tail is not None:
                status = tail.launch(ptrs, alpha, beta, ws, ws_bytes if ws else 0)
            if status != lt.CUBLAS_STATUS_SUCCESS:
                raise TuningError(f"cublasLtMatmul failed with status {status} ({self.key()}, {sig.key()})")
            if d_bytes:
                _pack_rows(outputs[0], base, pr.d_ld * esize, rows, row_bytes)
            if post is not None:
                post(outputs[0])

        return Lowering(launch=launch, outputs=1, workspace_bytes=d_bytes + ws_bytes, capturable=True, barrier=True,
                        layouts=self.layouts(sig), versions=versions())


@dataclass
class _TailCall:
    """The pad variant's second cuBLASLt call: the rows after the aligned part, into D beside it."""

    api: Any
    setup: _Setup
    desc: Any      # its own descriptor where there is a bias (the bias pointer is offset)
    algo: Any
    ws_bytes: int
    offsets: tuple[int, int, int]  # bytes added to A (our B, transposed), D and the bias pointers

    def launch(self, ptrs: list[int], alpha, beta, ws: int, ws_size: int) -> int:
        a, s = self.api, self.setup
        pa, pd = ptrs[0] + self.offsets[0], ptrs[2] + self.offsets[1]
        if len(ptrs) > 3:
            a.set_bias(self.desc, ptrs[3] + self.offsets[2])
        la, lb, ld = s.layouts
        return a.matmul(s.handle, self.desc, alpha, pa, la, ptrs[1], lb, beta, pd, ld, self.algo, ws, ws_size,
                        _stream())


def _tail_call(a: lt.Api, sig: Signature, main: Problem) -> _TailCall:
    t = _setup_for(sig, "pad_tail")
    if not t.algos:
        raise TuningError(f"cuBLASLt's heuristic offers no algorithm for the last {main.tail} rows of {sig.key()}")
    _, algo, ws_bytes = t.algos[0]
    pr = problem(sig, "pad_tail")
    esize = ITEMSIZE[geo.dtype_of(sig)]
    desc = a.matmul_desc(pr.transa, pr.transb, pr.epilogue) if pr.bias_input is not None else t.desc
    return _TailCall(a, t, desc, algo, ws_bytes, (main.m * main.a[2] * esize, main.m * esize, main.m * esize))


def _pack_rows(out, src: int, pitch: int, rows: int, row_bytes: int) -> None:
    """``rows`` rows of ``row_bytes`` bytes, ``pitch`` bytes apart from address ``src``, into the
    C-contiguous ``out``: one ``cudaMemcpy2DAsync`` on the current stream (a NumPy ``out``: host
    memory, the emulated library's tests)."""
    if isinstance(out, np.ndarray):
        raw = np.frombuffer((ctypes.c_char * (pitch * (rows - 1) + row_bytes)).from_address(src), np.uint8)
        rows_in = np.lib.stride_tricks.as_strided(raw, (rows, row_bytes), (pitch, 1))
        out.reshape(-1).view(np.uint8).reshape(rows, row_bytes)[...] = rows_in
        return
    import cupy

    cupy.cuda.runtime.memcpy2DAsync(_ptr(out), row_bytes, src, pitch, row_bytes, rows,
                                    cupy.cuda.runtime.memcpyDeviceToDevice, _stream())


def _post_activation(sig: Signature):
    """``run(y)``: the signature's activation on ``y`` in place, 16 bytes per load (the act variant)."""
    run = vector_epilogue_launcher(geo.dtype_of(sig), _out_elements(sig), _rows(sig), geo.act_args(sig))
    return lambda y: run(y, None, 1.0, 0.0)


def _stream() -> int:
    try:
        import cupy

        return int(cupy.cuda.get_current_stream().ptr)
    except ImportError:
        return 0


def candidates(op: str, sig: Signature | None = None) -> list[Candidate]:
    """The heuristic candidate, plus one per algorithm when ``sig`` is given and cuBLASLt lists them here;
    the same for ``cublaslt_bt`` where B's rows are not aligned (``b_transposed_reason``) and for
    ``cublaslt_act`` where the activation is not cuBLASLt's (``post_activation_reason``)."""
    if op not in OPS:
        return []
    out: list[Candidate] = [CublasLtGemm(NAME)]
    if sig is None or lt.unavailable():
        return out
    for name, variant in VARIANTS.items():
        if shape_reason(sig, variant) is not None:
            continue
        if variant:
            out.append(CublasLtGemm(name))
        try:
            algos = _setup_for(sig, variant).algos
        except Exception:  # noqa: BLE001 - no GPU, or the library refuses: the heuristic candidate says why
            continue
        out += [CublasLtGemm(name, cfg) for cfg, _, _ in algos]
    return out


def from_key(op: str, key: str) -> Candidate | None:
    if op not in OPS:
        return None
    name = key.split(":", 1)[0]
    if name not in VARIANTS or (name in GEMM_ONLY and op != "GemmAct"):
        return None
    if key == name:
        return CublasLtGemm(name)
    names = [k for k, _, _ in lt.CONFIG]
    try:
        params = tuple((k, int(v)) for k, v in (kv.split("=", 1) for kv in key[len(name) + 1:].split(",")))
    except ValueError:
        return None
    if not params or params[0][0] != "algo" or any(k not in names for k, _ in params):
        return None
    return CublasLtGemm(name, params)
