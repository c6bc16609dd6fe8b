"""The lowering contract (``Signature``, ``Candidate``, ``Lowering``): what every provider's candidates
implement and what the tuner and the runtime rely on. See ``contract.py``."""

from graphopt.lowering.contract import Candidate, Lowering, Signature, as_lowering, build_lowering

__all__ = ["Candidate", "Lowering", "Signature", "as_lowering", "build_lowering"]
