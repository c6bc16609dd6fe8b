"""Compatibility: the heuristic moved to :mod:`graphopt.kernels.heuristic` (the runtime uses it too,
to fall back to an own kernel where a recorded vendor lowering cannot run)."""

from graphopt.kernels.heuristic import *  # noqa: F401,F403
from graphopt.kernels.heuristic import (  # noqa: F401 - names tests and docs import from here
    ASSUMED_CC, DEFAULT_LOWERING, HeuristicFn, conv_geometry, heuristic_lowering, register_heuristic)
