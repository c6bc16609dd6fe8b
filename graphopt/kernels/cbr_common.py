"""What every CBR family shares: the signature checks, the residual's plan, the output check."""

from __future__ import annotations

from graphopt.errors import TuningError
from graphopt.kernels import geometry as geo
from graphopt.lowering.contract import Candidate, Signature
from graphopt.lowering.layout import is_layout

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


def check_operands(who: str, g: geo.ConvGeom, dt: str, X, Wt, B, y, x_layout: str, y_layout: str) -> None:
    """A launch's operands as a lowering that declares layouts takes them: X and Y of the geometry's
    shapes in ``x_layout`` / ``y_layout``, W ``[M, C / G, KH, KW]`` and B ``[M]`` C-contiguous, all ``dt``;
    ``TuningError`` naming ``who`` and the operand otherwise."""
    x_shape = (g.N, g.C) + ((g.W,) if g.one_d else (g.H, g.W))
    for name, a, shape, lay in (("X", X, x_shape, x_layout), ("Y", y, g.out_shape, y_layout)):
        if tuple(a.shape) != shape or str(a.dtype) != dt or not is_layout(a, lay):
            raise TuningError(f"{who}: {name} must be an {lay} {dt} array of shape {shape}, "
                              f"got {a.dtype} {tuple(a.shape)} strides {a.strides}")
    w_shape = (g.M, g.C // g.G) + ((g.KW,) if g.one_d else (g.KH, g.KW))
    if tuple(Wt.shape) != w_shape or str(Wt.dtype) != dt or not Wt.flags.c_contiguous:
        raise TuningError(f"{who}: W must be a C-contiguous {dt} array of shape {w_shape}, got {Wt.dtype} {tuple(Wt.shape)}")
    if B is not None and (tuple(B.shape) != (g.M,) or str(B.dtype) != dt or not B.flags.c_contiguous):
        raise TuningError(f"{who}: B must be a contiguous {dt} array of shape ({g.M},), got {B.dtype} {tuple(B.shape)}")


def check_out(outputs, g: geo.ConvGeom, dt: str):
    y = outputs[0]
    if tuple(y.shape) != g.out_shape or str(y.dtype) != dt or not y.flags.c_contiguous:
        raise TuningError(f"CBR output must be a C-contiguous {dt} array of shape {g.out_shape}, got {y.dtype} {y.shape}")
    return y


def is_pointwise(g: geo.ConvGeom) -> bool:
    return g.KH == 1 and g.KW == 1 and g.sh == 1 and g.sw == 1 and g.ph == 0 and g.pw == 0 and g.G == 1


__all__ = ["SUPPORTED_DTYPES", "applied", "check_common", "check_out", "is_pointwise", "prepare_residual", "res_plan"]
