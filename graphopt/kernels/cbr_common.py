"""What every CBR family shares: the signature checks, the residual's plan, the output check."""

from __future__ import annotations

from graphopt.errors import TuningError
from graphopt.kernels import geometry as geo
from graphopt.lowering.contract import Candidate, Signature

SUPPORTED_DTYPES = ("float16", "float32")


def check_common(sig: Signature) -> str | None:
    if sig.op != "CBR":
        return f"op {sig.op} is not CBR"
    if sig.layout != "NCHW":
        return f"layout {sig.layout} (the kernels take NCHW)"
    reason = geo.plan_or_reason(sig, geo.conv_geom, SUPPORTED_DTYPES)[1]
    if reason:
        return reason
    if len(sig.input_shapes) > 2 and sig.input_shapes[2] is not None:
        g = geo.conv_geom(sig)
        if tuple(sig.input_shapes[2]) != (g.M,):
            return f"bias shape {sig.input_shapes[2]} is not [{g.M}]"
    return None


def res_plan(sig: Signature, g: geo.ConvGeom):
    """(strides or None, needs_materialise) for the residual input."""
    rshape = sig.input_shapes[3] if len(sig.input_shapes) > 3 else None
    if rshape is None:
        return None, False
    st = geo.residual_strides(rshape, g)
    return st, st is None


def prepare_residual(R, g: geo.ConvGeom, materialise: bool):
    if R is None:
        return None
    import cupy

    if materialise:
        R4 = R.reshape(geo.residual_shape_4d(R.shape, g))
        full = cupy.broadcast_to(R4, (g.N, g.M, g.OH, g.OW))
        return cupy.ascontiguousarray(full).reshape(g.out_shape)
    return cupy.ascontiguousarray(R)


def applied(cand: Candidate, sig: Signature) -> tuple[geo.ConvGeom, str]:
    """(geometry, dtype) for ``cand.build(sig)``; ``TuningError`` when the candidate does not apply."""
    reason = cand.applies(sig)
    if reason:
        raise TuningError(f"candidate {cand.key()} does not apply: {reason}")
    return geo.conv_geom(sig), geo.dtype_of(sig)


def check_out(outputs, g: geo.ConvGeom, dt: str):
    y = outputs[0]
    if tuple(y.shape) != g.out_shape or str(y.dtype) != dt or not y.flags.c_contiguous:
        raise TuningError(f"CBR output must be a C-contiguous {dt} array of shape {g.out_shape}, got {y.dtype} {y.shape}")
    return y


def is_pointwise(g: geo.ConvGeom) -> bool:
    return g.KH == 1 and g.KW == 1 and g.sh == 1 and g.sw == 1 and g.ph == 0 and g.pw == 0 and g.G == 1


__all__ = ["SUPPORTED_DTYPES", "applied", "check_common", "check_out", "is_pointwise", "prepare_residual", "res_plan"]
