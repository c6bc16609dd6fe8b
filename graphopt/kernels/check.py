"""The profiler's checker and timing buffers for the GPU lowerings (``graphopt.tune`` calls these).

- ``checker(sig, launch) -> str | None``: runs ``launch`` on fresh random inputs (seeded from the
  signature, so every candidate of one signature sees the same inputs) into NaN-poisoned outputs and
  compares with the op's float64 NumPy reference (``graphopt.ops``). Every output must be written
  and finite; the normwise relative error must be within the dtype's tolerance. For convolutions
  too large to evaluate in full on the CPU, the reference is computed exactly (float64) for a random
  sample of output elements (every element is still checked for being written).
- ``buffers(sig) -> (inputs, outputs)``: random device inputs and an output buffer for the timer.
- ``numpy_checker(sig, launch)``: the same check where there is no GPU, for a launch that takes
  NumPy arrays (a kernel's NumPy emulation, as docs/adding_a_fused_op.md shows).

Output shapes come from the op's schema (``OpSchema.output_shapes``).

Both are module-level functions (the profiler pickles them into its worker process).
"""

from __future__ import annotations

import zlib
from typing import Any, Callable, Sequence

import numpy as np

from graphopt.kernels import geometry as geo
from graphopt.lowering.contract import Lowering, Signature
from graphopt.ops import get_schema

# Normwise relative error allowed per dtype. fp32 lowerings on the tensor cores round operands to
# tf32 (~3e-4 normwise on random data), hence 2e-3 rather than an fp32 bound.
TOLERANCE = {"float16": 1e-2, "float32": 2e-3}
# GEMM-like ops (fp32 accumulation): in fp16 the output's rounding is the only expected error (about
# 3e-4 normwise), so a candidate that reduces in lower precision is refused, not just a broken one: 53
# convolutions each 5e-3 off left a tuned ResNet-50 4.6e-2 away from torch.
TOLERANCE_BY_OP = {("CBR", "float16"): 2e-3, ("GemmAct", "float16"): 2e-3}
FULL_REFERENCE_MAX_FLOPS = 5e8   # above this, a CBR or GemmAct reference is sampled
SAMPLES = 2048

_CACHE: dict[str, tuple] = {}   # the last signature's (inputs, reference, sample index): one entry


def output_shape(sig: Signature) -> tuple[int, ...]:
    """The first output's shape: the op's schema says it (``OpSchema.output_shapes``); an op
    registered without one falls back to its family's ``register_family(output_shape=)``."""
    shapes = get_schema(sig.op).output_shapes(list(sig.input_shapes), dict(sig.attrs))
    if shapes is None:
        from graphopt.kernels.registry import output_shape_of

        return output_shape_of(sig)
    return shapes[0]


def data_dtype(sig: Signature) -> str:
    """The dtype of the data and the output: the schema names the input that carries it (Attention's
    Q: a bool mask is not data), else every present input has it."""
    idx = get_schema(sig.op).data_dtype_input
    if idx is not None:
        return sig.dtypes[idx]
    return geo.dtype_of(sig)


def _rng(sig: Signature) -> np.random.Generator:
    return np.random.default_rng(zlib.crc32(sig.key().encode()))


def random_inputs(sig: Signature, rng: np.random.Generator) -> list[np.ndarray | None]:
    """Host inputs of the signature's data dtype, as the op's schema draws them
    (``OpSchema.check_inputs``: N(0, 1), weights scaled by 1/sqrt(fan-in), masks on their own terms)."""
    return get_schema(sig.op).check_inputs(sig.input_shapes, data_dtype(sig), dict(sig.attrs), rng)


def _sampled_cbr_reference(sig: Signature, inputs, rng: np.random.Generator):
    """(flat output indices, float64 reference values) for SAMPLES random output elements."""
    from graphopt.ops.activations import ACTIVATIONS

    g = geo.conv_geom(sig)
    X, W, B, R = (list(inputs) + [None, None])[:4]
    X4 = X.reshape(g.N, g.C, g.H, g.W)
    W4 = W.reshape(g.M, g.C // g.G, g.KH, g.KW)
    total = g.N * g.M * g.OH * g.OW
    idx = np.sort(rng.choice(total, size=min(SAMPLES, total), replace=False))
    n, rest = np.divmod(idx, g.M * g.OH * g.OW)
    m, rest = np.divmod(rest, g.OH * g.OW)
    oh, ow = np.divmod(rest, g.OW)
    Cg, Mg = g.C // g.G, g.M // g.G
    ih = oh[:, None] * g.sh - g.ph + np.arange(g.KH)[None, :] * g.dh          # (S, KH)
    iw = ow[:, None] * g.sw - g.pw + np.arange(g.KW)[None, :] * g.dw          # (S, KW)
    vh = (ih >= 0) & (ih < g.H)
    vw = (iw >= 0) & (iw < g.W)
    c = (m // Mg)[:, None] * Cg + np.arange(Cg)[None, :]                      # (S, Cg)
    patch = X4[n[:, None, None, None], c[:, :, None, None], np.clip(ih, 0, g.H - 1)[:, None, :, None],
               np.clip(iw, 0, g.W - 1)[:, None, None, :]].astype(np.float64)
    patch *= (vh[:, None, :, None] & vw[:, None, None, :])
    y = np.einsum("scrk,scrk->s", patch, W4[m].astype(np.float64))
    if B is not None:
        y = y + B.astype(np.float64)[m]
    if R is not None:
        Rf = np.broadcast_to(R.astype(np.float64).reshape(geo.residual_shape_4d(R.shape, g)), (g.N, g.M, g.OH, g.OW))
        y = y + Rf[n, m, oh, ow]
    attrs = get_schema("CBR").normalize(dict(sig.attrs))
    y = ACTIVATIONS[attrs.get("activation", "none")].numpy(y, attrs)
    return idx, np.asarray(y, np.float64)


SAMPLED_COLUMNS = 16  # output columns a large GEMM's sampled reference computes


def _gemm_flops(sig: Signature) -> float:
    out = output_shape(sig)
    a = sig.input_shapes[0]
    k = a[0] if sig.attr("mode", "matmul") == "gemm" and sig.attr("transA", 0) else a[-1]
    return 2.0 * float(np.prod(out)) * float(k)


def _sampled_gemm_reference(sig: Signature, inputs, rng: np.random.Generator):
    """(flat output indices, float64 reference values) for SAMPLED_COLUMNS random output columns.

    A GemmAct output column depends only on that column of B (a row of B with Gemm's transB), that
    entry of C, and every A: the op's own reference on B and C cut to those columns gives them
    exactly, at 16/N of the cost. GPT-2's lm_head at bs32 (4096 x 768 x 50257) costs 158 GFLOP of
    float64 in full, and its 206M-element output would cross to the host for every candidate."""
    out = output_shape(sig)
    n = int(out[-1])
    cols = np.sort(rng.choice(n, size=min(SAMPLED_COLUMNS, n), replace=False))
    a, b, c = (list(inputs) + [None, None])[:3]
    gemm_t = sig.attr("mode", "matmul") == "gemm" and sig.attr("transB", 0)
    b_cut = b[cols, :] if gemm_t else b[..., cols]
    c_cut = c[..., cols] if c is not None and c.ndim >= 1 and c.shape[-1] == n else c
    f64 = [None if t is None else t.astype(np.float64) for t in (a, b_cut, c_cut)]
    ref = np.asarray(get_schema(sig.op).reference(f64, dict(sig.attrs))[0], np.float64)
    grid = list(np.indices(ref.shape))
    grid[-1] = cols[grid[-1]]
    idx = np.ravel_multi_index(tuple(grid), out).reshape(-1)
    return idx, ref.reshape(-1)


def _samples_gemm(sig: Signature) -> bool:
    """A GemmAct whose full float64 reference would cost more than FULL_REFERENCE_MAX_FLOPS and whose
    B has a column axis to cut (not a 1-D B)."""
    if sig.op != "GemmAct" or len(sig.input_shapes) < 2 or sig.input_shapes[1] is None:
        return False
    return len(sig.input_shapes[1]) >= 2 and _gemm_flops(sig) > FULL_REFERENCE_MAX_FLOPS


def _prepare(sig: Signature):
    key = sig.key()
    hit = _CACHE.get(key)
    if hit is not None:
        return hit
    rng = _rng(sig)
    inputs = random_inputs(sig, rng)
    if sig.op == "CBR" and geo.conv_geom(sig).flops > FULL_REFERENCE_MAX_FLOPS:
        idx, ref = _sampled_cbr_reference(sig, inputs, rng)
    elif _samples_gemm(sig):
        idx, ref = _sampled_gemm_reference(sig, inputs, rng)
    else:
        f64 = [None if a is None else a.astype(np.float64) for a in inputs]
        ref = np.asarray(get_schema(sig.op).reference(f64, dict(sig.attrs))[0], np.float64).reshape(-1)
        idx = None
    _CACHE.clear()
    _CACHE[key] = (inputs, ref, idx)
    return _CACHE[key]


def compare(got: np.ndarray, ref: np.ndarray, sampled: bool, dtype: str, nonfinite: int = 0,
            op: str = "") -> str | None:
    """The reason ``got`` (flat float64: every output, or the sampled ones) does not match ``ref``, or
    None. ``nonfinite`` counts outputs not written or not finite (counted where the output lives);
    the tolerance is ``TOLERANCE_BY_OP`` for ``op`` where it has one, else ``TOLERANCE``."""
    nonfinite = nonfinite or int(np.count_nonzero(~np.isfinite(got)))
    if nonfinite:
        return f"{nonfinite} outputs not written or not finite"
    err = float(np.linalg.norm(got - ref) / max(np.linalg.norm(ref), 1e-30))
    tol = TOLERANCE_BY_OP.get((op, dtype), TOLERANCE.get(dtype, 1e-2))
    if not err <= tol:
        return f"wrong result: normwise relative error {err:.2e} > {tol:g}" + (" (sampled outputs)" if sampled else "")
    return None


def checker(sig: Signature, launch: Callable[[Sequence[Any], Sequence[Any]], None]) -> str | None:
    """Run ``launch`` once on the signature's check inputs and compare with the reference. The
    non-finite count and the sampled outputs are taken on the GPU: only the compared values travel
    to the host (a whole bs32 conv output in float64 cost ~30 ms per candidate)."""
    import cupy

    inputs, ref, idx = _prepare(sig)
    dt = data_dtype(sig)
    # device copies of the signature's uploaded inputs (a wrong kernel that writes its inputs spoils
    # only its own check)
    dev = [None if a is None else a.copy() for a in _device_inputs(sig, inputs, cupy)]
    if isinstance(launch, Lowering):  # inputs and the poisoned output in the layouts it declares
        dev = launch.conform(dev, cupy)
        out = launch.empty_outputs(len(dev), [output_shape(sig)], dt, cupy)[0]
        out[...] = cupy.nan
    else:
        out = cupy.full(output_shape(sig), cupy.nan, dtype=dt)
    launch(dev, [out])
    flat = out.ravel()  # the logical (NCHW) order, whatever layout the lowering wrote
    nonfinite = int(cupy.count_nonzero(~cupy.isfinite(flat)))
    got = flat if idx is None else flat[cupy.asarray(idx)]
    return compare(cupy.asnumpy(got).astype(np.float64), ref, idx is not None, dt, nonfinite, sig.op)


_DEVICE: dict[str, list] = {}  # signature key -> its check inputs on the GPU (one signature at a time)


def _device_inputs(sig: Signature, inputs, cupy) -> list:
    """The check inputs uploaded once per signature (every candidate of a signature is checked on the
    same inputs: an upload per candidate cost milliseconds of pageable copies at bs32)."""
    key = sig.key()
    if key not in _DEVICE:
        _DEVICE.clear()
        _DEVICE[key] = [None if a is None else cupy.asarray(a) for a in inputs]
    return _DEVICE[key]


def numpy_checker(sig: Signature, launch: Callable[[Sequence[Any], Sequence[Any]], Any]) -> str | None:
    """``checker`` without a GPU: ``launch`` gets the check inputs and a NaN-poisoned output as NumPy
    arrays (what it returns is ignored), then the same comparison with the reference."""
    inputs, ref, idx = _prepare(sig)
    dt = geo.dtype_of(sig)
    out = np.full(output_shape(sig), np.nan, dtype=dt)
    launch([None if a is None else a.copy() for a in inputs], [out])
    flat = out.astype(np.float64).reshape(-1)
    return compare(flat if idx is None else flat[idx], ref, idx is not None, dt, int(np.count_nonzero(~np.isfinite(flat))),
                   sig.op)


def buffers(sig: Signature) -> tuple[list, list]:
    """Random device inputs (generated on the GPU) and an output buffer, for the timer."""
    import cupy

    dt = data_dtype(sig)
    rs = cupy.random.RandomState(zlib.crc32(sig.key().encode()))
    ins = [None if s is None else rs.standard_normal(s, dtype=cupy.float32).astype(dt) for s in sig.input_shapes]
    schema = get_schema(sig.op)
    for i in schema.host_check_inputs:  # inputs whose values change the work (a mask), as the checker makes them
        if i < len(ins) and ins[i] is not None:
            ins[i] = cupy.asarray(schema.check_input(i, sig.input_shapes[i], dt, dict(sig.attrs), np.random.default_rng(0)))
    return ins, [cupy.empty(output_shape(sig), dtype=dt)]
