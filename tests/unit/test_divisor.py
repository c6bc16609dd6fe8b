"""``graphopt.kernels.divisor``: the (multiplier, shift) of a divisor give ``n // d`` through a
multiply-high, an add and a shift for every ``n < 2**31``, without the add leaving 32 bits (the device's
``fast_div`` in ``common.cuh`` is the same expression on 32-bit unsigned integers)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from graphopt.kernels.divisor import LIMIT, fast_div, fast_divisor


def _device_fast_div(n: int, mul: int, shift: int) -> int:
    """``fast_div`` as 32-bit unsigned arithmetic does it: the add must not carry out of 32 bits."""
    high = (n * mul) >> 32
    assert high + n < 2**32, "the 32-bit add overflows"
    return (high + n) >> shift


@settings(max_examples=3000, deadline=None)
@given(d=st.integers(1, LIMIT - 1), n=st.integers(0, LIMIT - 1))
def test_any_numerator_and_divisor(d, n):
    mul, shift = fast_divisor(d)
    assert 0 < mul < 2**32 and 0 <= shift <= 31
    assert _device_fast_div(n, mul, shift) == fast_div(n, mul, shift) == n // d


@pytest.mark.parametrize("d", [1, 2, 3, 7, 56, 112, 127, 128, 129, 3136, 2**16 + 1, 2**30, 2**31 - 1])
def test_the_edges_of_each_quotient(d):
    mul, shift = fast_divisor(d)
    for q in (0, 1, 2, 1000, (LIMIT - 1) // d):
        for n in (q * d - 1, q * d, q * d + d - 1):
            if 0 <= n < LIMIT:
                assert _device_fast_div(n, mul, shift) == n // d


@pytest.mark.parametrize("d", [0, -3, LIMIT])
def test_a_divisor_out_of_range_is_refused(d):
    with pytest.raises(ValueError, match="fast_divisor"):
        fast_divisor(d)
