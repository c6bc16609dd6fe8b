"""The heuristic lives in :mod:`graphopt.kernels.heuristic` (the runtime uses it too, to fall back to
an own kernel where a recorded vendor lowering cannot run); these names stay importable from here."""

from graphopt.kernels.heuristic import (ASSUMED_CC, DEFAULT_LOWERING, HeuristicFn, conv_geometry,
                                        heuristic_lowering, register_heuristic)

__all__ = ["ASSUMED_CC", "DEFAULT_LOWERING", "HeuristicFn", "conv_geometry", "heuristic_lowering", "register_heuristic"]
