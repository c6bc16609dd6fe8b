"""GPU kernels (CUDA sources compiled with NVRTC through CuPy) and their lowering candidates.

Importing this package needs neither CuPy nor a GPU; ``build`` and the timer do.
"""

from graphopt.lowering.contract import Candidate, Signature
from graphopt.kernels.registry import applicable, candidate_from_key, candidates_for, ops
from graphopt.kernels.timing import cuda_event_timer

__all__ = ["Candidate", "Signature", "applicable", "candidate_from_key", "candidates_for", "cuda_event_timer", "ops"]
