"""graphopt: a kernel-tuning graph optimizer for ONNX.

``graphopt.optimize(model_or_path, gpu=...)`` returns the optimized ``onnx.ModelProto`` and a report;
see ``graphopt.api`` for the whole facade and ``graphopt --help`` for the command line.
"""

__version__ = "0.1.0"


def __getattr__(name):  # lazy: `import graphopt` stays cheap for the CLI's --help
    if name in ("optimize", "load", "save", "verify", "OptimizeReport"):
        from graphopt import api

        return getattr(api, name)
    raise AttributeError(f"module 'graphopt' has no attribute {name!r}")


__all__ = ["__version__", "optimize", "load", "save", "verify", "OptimizeReport"]
