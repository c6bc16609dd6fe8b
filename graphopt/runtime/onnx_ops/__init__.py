"""The runtime's standard ONNX ops, written once against an array module ``xp`` (NumPy for the host
backend, CuPy on CUDA), one module per family.

``registry`` holds what they share: ``OPS`` (op type -> implementation), ``HOST_INPUTS`` (the inputs
known at plan time), ``OpContext`` and the ``@op`` decorator. Each family module registers its ops
when it is imported; this package imports them all, so importing anything from it (``registry``
included) makes ``OPS`` complete.
"""

from graphopt.runtime.onnx_ops import (  # imported to register their ops
    activations,
    constants,
    conv,
    elementwise,
    indexing,
    matmul,
    normalization,
    pooling,
    reductions,
    resize,
    shape,
)

__all__ = ["activations", "constants", "conv", "elementwise", "indexing", "matmul", "normalization", "pooling",
           "reductions", "resize", "shape"]
