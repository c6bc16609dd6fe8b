"""graphopt's runtime: ``Session(model, device="cuda"|"cpu"|"numpy", dtype=None)``.

See ``session.py`` for the contract, ``trace.py`` and ``plan.py`` for the execution plan (``liveness.py``: what each
step drops; ``compiled.py`` and ``arena.py``: the compiled form and its one allocation),
``backend.py`` for the devices, ``onnx_ops/`` (the standard ONNX ops, one module per family) and
``ops_custom.py`` for the ops, and ``graphs.py`` for CUDA graphs.
"""

from graphopt.runtime.onnx_ops.registry import supported_ops as _standard_ops
from graphopt.runtime.ops_custom import select_bucket
from graphopt.runtime.session import Session, to_numpy, unsupported_nodes


def supported_ops() -> list[str]:
    """Standard ONNX op types the runtime claims (plus ``graphopt.CBR`` / ``graphopt.GemmAct``)."""
    return _standard_ops()


__all__ = ["Session", "select_bucket", "supported_ops", "to_numpy", "unsupported_nodes"]
