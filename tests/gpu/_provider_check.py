"""Checking vendor-provider candidates on the GPU against the op's float64 reference.

Inputs are N(0, 1) (B / W scaled by 1/sqrt(fan-in)) rounded to the dtype first, so the reference
sees exactly what the device sees. bfloat16 travels as its raw 16-bit patterns in uint16 CuPy arrays
(CuPy has no bfloat16 dtype; cuBLASLt reads only pointers). Outputs are poisoned with NaN first.
"""

from __future__ import annotations

import numpy as np

from graphopt.lowering import Signature, as_lowering
from graphopt.ops import get_schema

TOL = {"float16": 1e-2, "bfloat16": 2e-2, "float32": 2e-3}  # normwise relative error
NAN_BF16 = 0x7FC0


def to_bf16_bits(x: np.ndarray) -> np.ndarray:
    bits = np.ascontiguousarray(x, np.float32).view(np.uint32).astype(np.uint64)
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)


def from_bf16_bits(u: np.ndarray) -> np.ndarray:
    return (u.astype(np.uint32) << 16).view(np.float32)


def host_inputs(sig: Signature, seed: int = 0):
    """(values as float64 for the reference, arrays to upload: dtype or bf16 bits)."""
    rng = np.random.default_rng(seed)
    dt = next(d for d, s in zip(sig.dtypes, sig.input_shapes) if s is not None)
    f64, up = [], []
    for i, shape in enumerate(sig.input_shapes):
        if shape is None:
            f64.append(None)
            up.append(None)
            continue
        a = rng.standard_normal(shape).astype(np.float32)
        if i == 1:
            fan = int(np.prod(shape[1:])) if sig.op == "CBR" else int(shape[-1] if sig.attr("transB", 0) else
                                                                      (shape[0] if len(shape) == 1 else shape[-2]))
            a = (a / np.sqrt(max(fan, 1))).astype(np.float32)
        if dt == "bfloat16":
            bits = to_bf16_bits(a)
            f64.append(from_bf16_bits(bits).astype(np.float64))
            up.append(bits)
        else:
            q = a.astype(dt)
            f64.append(q.astype(np.float64))
            up.append(q)
    return f64, up


def reference(sig: Signature, f64) -> np.ndarray:
    f64 = list(f64) + [None] * ((4 if sig.op == "CBR" else 3) - len(f64))
    return np.asarray(get_schema(sig.op).reference(f64, dict(sig.attrs))[0], np.float64)


def run_lowering(low, sig: Signature, up, ref: np.ndarray) -> str | None:
    """Run a built candidate into a NaN-poisoned output; the reason it is wrong, or None."""
    import cupy

    dt = next(d for d, s in zip(sig.dtypes, sig.input_shapes) if s is not None)
    dev_dt = "uint16" if dt == "bfloat16" else dt
    dev = low.conform([None if a is None else cupy.asarray(a) for a in up], cupy)
    out = low.empty_outputs(len(dev), [ref.shape], dev_dt, cupy)[0]
    if dt == "bfloat16":
        out[...] = NAN_BF16
    else:
        out[...] = cupy.nan
    ws = cupy.empty(max(1, low.workspace_bytes), dtype=cupy.uint8) if low.workspace_bytes else None
    low.launch(dev, [out], ws)
    cupy.cuda.get_current_stream().synchronize()
    host = cupy.asnumpy(out)
    got = (from_bf16_bits(host) if dt == "bfloat16" else host).astype(np.float64)
    if not np.isfinite(got).all():
        return f"{int((~np.isfinite(got)).sum())} of {got.size} outputs not written or not finite"
    err = float(np.linalg.norm(got - ref) / max(np.linalg.norm(ref), 1e-30))
    return None if err <= TOL[dt] else f"normwise relative error {err:.2e} > {TOL[dt]:g}"


def check_all(cands, sig: Signature, seed: int = 0):
    """(correct count, [(key, why wrong)], [(key, why it did not build)]) over ``cands``."""
    f64, up = host_inputs(sig, seed)
    ref = reference(sig, f64)
    ok, wrong, unbuilt = 0, [], []
    for cand in cands:
        try:
            low = as_lowering(cand.build(sig, "sm_90"))
        except Exception as e:  # noqa: BLE001 - a candidate that does not build scores inf in the tuner
            unbuilt.append((cand.key(), f"{type(e).__name__}: {str(e)[:120]}"))
            continue
        try:
            reason = run_lowering(low, sig, up, ref)
        except Exception as e:  # noqa: BLE001 - a built candidate that fails to run is wrong
            reason = f"launch failed: {type(e).__name__}: {str(e)[:160]}"
        if reason:
            wrong.append((cand.key(), reason))
        else:
            ok += 1
    return ok, wrong, unbuilt


def captured_pair_errors(cands, sig: Signature, limit: int = 6) -> list[tuple[str, str]]:
    """Two nodes of one signature (two builds of each candidate, different inputs and biases) captured
    into ONE CUDA graph and replayed, as a compiled plan runs them: [(key, why wrong)] for the first
    ``limit`` candidates that build. The eager check above never sees state that two builds of one
    signature share (a descriptor, a plan), which a capture freezes."""
    import cupy

    dt = next(d for d, s in zip(sig.dtypes, sig.input_shapes) if s is not None)
    dev_dt = "uint16" if dt == "bfloat16" else dt
    wrong = []
    sets = [host_inputs(sig, seed) for seed in (11, 12)]
    refs = [reference(sig, f64) for f64, _ in sets]
    built = 0
    for cand in cands:
        if built >= limit:
            break
        try:
            lows = [as_lowering(cand.build(sig, "sm_90")) for _ in range(2)]
        except Exception:  # noqa: BLE001 - the eager check reports what does not build
            continue
        built += 1
        devs = [low.conform([None if a is None else cupy.asarray(a) for a in up], cupy) for low, (_, up) in zip(lows, sets)]
        outs = [low.empty_outputs(len(d), [r.shape], dev_dt, cupy)[0] for low, d, r in zip(lows, devs, refs)]
        wss = [cupy.empty(max(1, low.workspace_bytes), dtype=cupy.uint8) if low.workspace_bytes else None for low in lows]
        stream = cupy.cuda.Stream(non_blocking=True)
        with stream:
            for low, d, o, w in zip(lows, devs, outs, wss):  # eager first: handles and plans exist
                low.launch(d, [o], w)
            stream.synchronize()
            stream.begin_capture()
            try:
                for low, d, o, w in zip(lows, devs, outs, wss):
                    low.launch(d, [o], w)
            finally:
                graph = stream.end_capture()
            for o in outs:
                o[...] = NAN_BF16 if dt == "bfloat16" else cupy.nan
            graph.launch(stream)
            stream.synchronize()
        for k, (o, r) in enumerate(zip(outs, refs)):
            host = cupy.asnumpy(o)
            got = (from_bf16_bits(host) if dt == "bfloat16" else host).astype(np.float64)
            err = float(np.linalg.norm(np.nan_to_num(got, nan=1e30) - r) / max(np.linalg.norm(r), 1e-30))
            if not err <= TOL[dt]:
                wrong.append((cand.key(), f"node {k} of 2 after a captured replay: normwise relative error {err:.2e}"))
    return wrong


def replay_equals_eager(low, up, shape, poison_workspace=False):
    """``low`` run eagerly, then captured on a non-blocking stream (output NaN-poisoned, not run by
    the capture) and replayed: the replay equals the eager run. Returns the replayed output. The
    workspace is always allocated (at least one byte): a launch must not allocate under capture."""
    import cupy

    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        ins = low.conform([None if a is None else cupy.asarray(a) for a in up], cupy)  # None: no bias
        ws = cupy.empty(max(1, low.workspace_bytes), dtype=cupy.uint8)
        eager = low.empty_outputs(len(ins), [shape], "float16", cupy)[0]  # in the layout it declares
        low.launch(ins, [eager], ws)
        out = low.empty_outputs(len(ins), [shape], "float16", cupy)[0]
        out[...] = cupy.nan
        if poison_workspace:
            ws.fill(255)
        stream.begin_capture()
        try:
            low.launch(ins, [out], ws)
        finally:
            graph = stream.end_capture()
        assert bool(cupy.isnan(out).all())  # captured, not run
        graph.launch(stream)
        stream.synchronize()
    assert cupy.array_equal(out, eager)
    return out


def xfail_if_refused(sig: Signature, built) -> None:
    """For a cuDNN graph of which no plan ran: xfail when cuDNN refuses it as unsupported
    (``GraphRefused``: a fact about cuDNN on this GPU), fail otherwise, so that a mistake in building
    the graph (a wrong keyword, rank or name) cannot pass for a refusal."""
    import pytest

    from graphopt.providers.cudnn import GraphRefused

    try:
        b = built(sig)
    except GraphRefused as e:
        pytest.xfail(str(e))
    if not b.names:
        pytest.xfail("cuDNN builds the graph but offers no plan for it here")
    pytest.fail(f"cuDNN built the graph and offers {len(b.names)} plans, but none ran")


# (x, w, attrs): ResNet-50's and MobileNetV2's stems at odd sizes, a 1- and a 4-channel input; the stem
# candidates' shapes (cudnn_cpad, cudnn_split)
STEM_GEOMS = [
    ((2, 3, 37, 33), (16, 3, 7, 7), {"pads": [3, 3, 3, 3], "strides": [2, 2]}),
    ((3, 3, 31, 29), (32, 3, 3, 3), {"pads": [1, 1, 1, 1], "strides": [2, 2]}),
    ((2, 1, 19, 23), (8, 1, 5, 5), {"pads": [2, 1, 2, 1]}),
    ((1, 4, 16, 15), (24, 4, 3, 3), {"pads": [0, 1, 1, 0], "strides": [2, 1]}),
]


def check_plans(cands, sig: Signature, limit: int = 8):
    """``check_all`` over the first ``limit`` of a provider's candidates for ``sig`` (the first must
    apply); asserts none is wrong; returns (correct count, [(key, why it did not build)])."""
    cands = cands[:limit]
    assert cands and cands[0].applies(sig, (9, 0)) is None, cands and cands[0].applies(sig, (9, 0))
    ok, wrong, unbuilt = check_all(cands, sig)
    print(f"{sig.key()}: {ok} plans correct, {len(unbuilt)} did not build")
    assert not wrong, wrong
    return ok, unbuilt


def eager_and_replayed(low, sig: Signature, seed: int = 1, poison_workspace: bool = True):
    """(eager output, the same launch captured in a CUDA graph and replayed) of a built lowering on
    fp16 N(0, 1) inputs, on a side stream: the replay's output NaN-poisoned first, the workspace filled
    with 0xFF (NaN-like fp16) before each launch where ``poison_workspace`` (what a lowering writes into
    its workspace, it must write every time)."""
    import cupy

    from graphopt.kernels.check import output_shape

    rng = np.random.default_rng(seed)
    host = [None if s is None else rng.standard_normal(s).astype("float16") for s in sig.input_shapes]
    out_shape = output_shape(sig)
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        ins = low.conform([None if h is None else cupy.asarray(h) for h in host], cupy)
        ws = cupy.full(max(1, low.workspace_bytes), 0xFF if poison_workspace else 0, dtype=cupy.uint8)
        eager = low.empty_outputs(len(ins), [out_shape], "float16", cupy)[0]
        low.launch(ins, [eager], ws)
        if poison_workspace:
            ws[...] = 0xFF
        out = low.empty_outputs(len(ins), [out_shape], "float16", cupy)[0]
        out[...] = cupy.nan
        stream.begin_capture()
        try:
            low.launch(ins, [out], ws)
        finally:
            graph = stream.end_capture()
        graph.launch(stream)
        stream.synchronize()
    return eager, out
