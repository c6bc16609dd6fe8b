"""Compatibility: the contract moved to :mod:`graphopt.lowering.contract`."""

from graphopt.lowering.contract import Candidate, Lowering, Signature, as_lowering  # noqa: F401
