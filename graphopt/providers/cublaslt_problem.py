"""cuBLASLt's view of a GemmAct or 1x1 CBR signature: the column-major call (``Problem``) that
computes it, and why a variant does not apply (``*_reason``). No library call here: the provider
(``graphopt.providers.cublaslt``) describes, lists and launches these problems; its module docstring
says what each variant is for and what was measured.

Row-major operands map onto cuBLASLt's column-major convention as ``Y^T = op(B)^T op(A)^T``: our B
is cuBLASLt's A and our A its B, so the bias (one value per row of cuBLASLt's D) is one value per
column of our Y. Variants: ``bt`` (B stored transposed), ``pad`` and ``pad_tail`` (D with padded
rows, computed by two calls: the aligned part of N, then the rest), ``act`` (the activation left to
a kernel after the call).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from graphopt.errors import TuningError
from graphopt.kernels import geometry as geo
from graphopt.kernels.gemm_act import gemm_plan
from graphopt.kernels.source import ACT_CODES, VEC16
from graphopt.lowering import layout
from graphopt.lowering.contract import Signature

OPS = ("GemmAct", "CBR")
DTYPES = {"float16": "CUDA_R_16F", "bfloat16": "CUDA_R_16BF", "float32": "CUDA_R_32F"}
ITEMSIZE = {"float16": 2, "bfloat16": 2, "float32": 4}
# variants that make another variant's calls: rowpad is pad with Y written in place (its "rowpad" layout)
SAME_CALLS = {"rowpad": "pad"}
# (activation, has bias) -> cublasLtEpilogue_t
EPILOGUES = {("none", False): "CUBLASLT_EPILOGUE_DEFAULT", ("none", True): "CUBLASLT_EPILOGUE_BIAS",
             ("Relu", False): "CUBLASLT_EPILOGUE_RELU", ("Relu", True): "CUBLASLT_EPILOGUE_RELU_BIAS",
             ("GeluTanh", False): "CUBLASLT_EPILOGUE_GELU", ("GeluTanh", True): "CUBLASLT_EPILOGUE_GELU_BIAS"}
ACTIVATIONS = ("none", "Relu", "GeluTanh")
IM2COL_MAX_CHANNELS = 4  # cublaslt_im2col: image stems (RGB, RGBA), as the stem kernel's MAX_CHANNELS
IM2COL_MAX_BYTES = 1 << 30  # its buffer, part of the lowering's workspace (counted in peak memory)
ALIGNMENT = 16  # bytes; the heuristic keeps algorithms that work at this operand alignment, launch checks it
# X, W, B, R in, Y out. B (1-D) and R (never given here) say NHWC too, so that Y's layout is NHWC also
# where a node has 2 or 3 inputs (Lowering.output_layout indexes after the inputs actually passed).
LAYOUTS = {"GemmAct": (), "CBR": ("NHWC", "", "NHWC", "NHWC", "NHWC")}
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
    """``n`` rounded up to whole 16-byte rows of ``dtype`` (the ``rowpad`` layout's pitch)."""
    return layout.padded_row(n, ITEMSIZE[dtype])


def b_stored_transposed(sig: Signature, variant: str) -> bool:
    """Whether the variant stores B transposed (declared colmajor): bt always; pad unless B already is."""
    variant = SAME_CALLS.get(variant, variant)
    return variant == "bt" or (variant in ("pad", "pad_tail") and not gemm_plan(sig).trans_b)


def row_length(sig: Signature) -> int:
    """The output's row length (GemmAct's N, a 1x1 CBR's output channels)."""
    return gemm_plan(sig).N if sig.op == "GemmAct" else geo.conv_geom(sig).M


def out_elements(sig: Signature) -> int:
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
        n = row_length(sig)
    except (TuningError, TypeError, IndexError) as e:
        return str(e) or "unknown output row length"
    vec = VEC16.get(dt, 0)
    if not vec or n % vec:
        return f"the output's rows ({n} x {dt}) are not whole 16-byte vectors (the in-place activation kernel's loads)"
    return None


def im2col_reason(sig: Signature) -> str | None:
    """Why ``cublaslt_im2col`` does not apply to ``sig`` (None: it does): a CBR of at most
    ``IM2COL_MAX_CHANNELS`` input channels (an image stem, whose rows of C*KH*KW are short: im2col's
    buffer stays within a few times Y's size), group 1, no residual, not already a plain GEMM."""
    if sig.op != "CBR":
        return "cublaslt_im2col is for CBR"
    try:
        g = geo.conv_geom(sig)
        dt = geo.dtype_of(sig)
    except (TuningError, TypeError, IndexError, ValueError) as e:
        return str(e) or "no convolution geometry"
    if dt not in VEC16:
        return f"dtype {dt} (the im2col kernel: {', '.join(VEC16)})"
    if g.G != 1:
        return f"a grouped convolution (groups {g.G})"
    if g.C > IM2COL_MAX_CHANNELS:
        return f"{g.C} input channels (im2col is for image stems, at most {IM2COL_MAX_CHANNELS})"
    if (g.KH, g.KW, g.sh, g.sw, g.ph, g.pw) == (1, 1, 1, 1, 0, 0) and (g.OH, g.OW) == (g.H, g.W):
        return "a 1x1 convolution with stride 1 and no padding is a GEMM already (the plain cublaslt candidates)"
    if len(sig.input_shapes) > 3 and sig.input_shapes[3] is not None:
        return "a residual input (cuBLASLt's beta * C before the epilogue is not relied on)"
    act = _act_name(sig)
    if act not in ACTIVATIONS:
        if act not in ACT_CODES:
            return f"activation {act!r} has no kernel"
        vec = VEC16.get(dt, 0)
        if not vec or g.M % vec:
            return f"{g.M} output channels of {dt} are not whole 16-byte vectors (the in-place activation kernel's loads)"
    kp = im2col_depth(g.C * g.KH * g.KW, dt)
    rows = g.N * g.OH * g.OW
    if rows < 1 or g.M < 1:
        return "an empty convolution"
    if (rows + g.M) * kp >= 2**31 or rows * g.M >= 2**31:
        return "im2col's buffer or Y has 2**31 elements or more (the kernels' int indices)"
    if rows * kp * ITEMSIZE[dt] > IM2COL_MAX_BYTES:
        return f"im2col's buffer over {IM2COL_MAX_BYTES >> 20} MiB"
    if (g.C * g.H + g.ph + g.KH * g.dh) * (g.W + g.pw + g.KW * g.dw) >= 2**31:
        return "padding or dilation puts a window offset past 2**31 elements (the packing's int offsets)"
    if im2col_smem_bytes(kp, dt) > IM2COL_MAX_SMEM:
        return f"rows of {kp} elements: the packing's taps and tile of 32 rows are over {IM2COL_MAX_SMEM >> 10} KiB of shared memory"
    return None


def activation_after_call(sig: Signature, variant: str) -> bool:
    """Whether the variant leaves the activation to graphopt's in-place kernel after the matmul: ``act``
    always, ``im2col`` where the activation has no cuBLASLt epilogue (MobileNet's ReLU6)."""
    return variant == "act" or (variant == "im2col" and _act_name(sig) not in ACTIVATIONS)


def im2col_depth(k: int, dtype: str) -> int:
    """The GEMM depth of ``cublaslt_im2col``: C*KH*KW rounded up to whole 16-byte rows (zeros after K)."""
    return padded_ld(k, dtype)


IM2COL_TILE_ROWS = 32          # im2col_rows.cu: a block packs 32 rows at a time
IM2COL_MAX_SMEM = 48 << 10     # dynamic shared memory a launch gets without opting in


def im2col_smem_bytes(kp: int, dtype: str) -> int:
    """The shared memory of one ``im2col_rows`` block: Kp taps of 16 bytes (``I2cTap``), then a tile of 32
    rows of Kp elements, each row's 16-byte vectors at an odd stride (``im2col_tile_stride``)."""
    chunks = kp * ITEMSIZE[dtype] // 16
    return kp * 16 + IM2COL_TILE_ROWS * (chunks | 1) * 16


def variant_reason(sig: Signature, variant: str) -> str | None:
    """Why a variant's own condition fails (``b_transposed_reason`` / ``post_activation_reason`` /
    ``padded_output_reason`` / ``im2col_reason``; ``pad_tail``, the pad variant's second call, as ``pad``)."""
    check = {"bt": b_transposed_reason, "act": post_activation_reason, "pad": padded_output_reason,
             "pad_tail": padded_output_reason, "im2col": im2col_reason}.get(SAME_CALLS.get(variant, variant))
    return check(sig) if check else None


def problem(sig: Signature, variant: str = "") -> Problem:
    """The cuBLASLt call for a GemmAct or CBR signature (``variant``: ``bt``, B stored transposed as
    ``cublaslt_bt`` declares it; ``act``, the activation left to a kernel after the call); TuningError
    says why there is none."""
    if sig.op not in OPS:
        raise TuningError(f"cuBLASLt candidates here are for {', '.join(OPS)}")
    variant = SAME_CALLS.get(variant, variant)
    reason = variant_reason(sig, variant)
    if reason:
        raise TuningError(reason)
    dt = geo.dtype_of(sig)
    if dt not in DTYPES:
        raise TuningError(f"dtype {dt} (cuBLASLt here: {', '.join(DTYPES)})")
    act = "none" if activation_after_call(sig, variant) else _activation(sig)
    if variant == "im2col":
        return _im2col_problem(sig, dt, act)
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
    pr = _row_major(dt, M, p.N, p.K, p.trans_a, p.trans_b or b_stored_transposed(sig, variant), Z, sa,
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


def _im2col_problem(sig: Signature, dt: str, act: str) -> Problem:
    """``Y[N*OH*OW, M] = cols[N*OH*OW, Kp] Wp[M, Kp]^T`` + bias: Y in NHWC. cols and Wp lie in the
    workspace (the provider's launch passes their addresses for inputs 0 and 1)."""
    g = geo.conv_geom(sig)
    bias = len(sig.input_shapes) > 2 and sig.input_shapes[2] is not None
    kp = im2col_depth(g.C * g.KH * g.KW, dt)
    return _row_major(dt, g.N * g.OH * g.OW, g.M, kp, False, True, 1, 0, 0, act, bias, 1.0, 0, 1, 2 if bias else None)


def shape_reason(sig: Signature, variant: str = "") -> str | None:
    """Why cuBLASLt cannot run this signature (before any library call), or None."""
    try:
        problem(sig, variant)
    except TuningError as e:
        return str(e)
    return None
