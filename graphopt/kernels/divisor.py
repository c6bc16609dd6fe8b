"""Division by a launch-time constant as a multiply-high, an add and a shift: the host computes a
divisor's (multiplier, shift) once, and a kernel's ``fast_div(n, mul, shr)`` (``common.cuh``) gives
``n // d`` for every ``n < 2**31``.

Why by hand: a 32-bit division by a value the compiler does not know is ~20 instructions on the GPU
(a reciprocal, a multiply-high and two corrections), which ``depthwise_nhwc`` paid twice for every output
pixel (bench/NOTES_kernels.md, sixteenth session); CUDA has no library call for it. This is the
round-up method of Granlund and Montgomery, "Division by invariant integers using multiplication" (1994),
in the form cuDNN's ``reduced_divisor`` and CUTLASS's ``FastDivmod`` also use: with ``s = ceil(log2 d)``
and ``m = floor(2**32 * (2**s - d) / d) + 1``, ``n // d == (mulhi(n, m) + n) >> s``; ``n < 2**31`` keeps
the add inside 32 bits.
"""

from __future__ import annotations

LIMIT = 2**31  # numerators and divisors below this


def fast_divisor(d: int) -> tuple[int, int]:
    """(multiplier, shift) of ``d`` (1 <= d < 2**31) for ``fast_div``: ``(mulhi(n, m) + n) >> s == n // d``."""
    if not 1 <= d < LIMIT:
        raise ValueError(f"fast_divisor: {d} is not in 1 .. 2**31 - 1")
    shift = (d - 1).bit_length()  # ceil(log2(d)); 0 for d = 1
    mul = ((1 << 32) * ((1 << shift) - d)) // d + 1
    return mul, shift


def fast_div(n: int, mul: int, shift: int) -> int:
    """The device's ``fast_div`` in Python (for the CPU simulations): ``n // d`` for ``0 <= n < 2**31``."""
    return (((n * mul) >> 32) + n) >> shift
