"""graphopt: a kernel-tuning graph optimizer for ONNX."""

__version__ = "0.1.0"

__all__ = ["__version__"]
