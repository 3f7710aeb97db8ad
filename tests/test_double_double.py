"""The kernels' double-double arithmetic (poolfold.kernels.double_double) against Decimal at
60 digits: exp, log, (v / m)^p and m s^(1/p) over float64's whole range."""

from __future__ import annotations

from decimal import Decimal, localcontext

import numpy as np
import pytest
from numba import njit

from poolfold.kernels import double_double

# About 2^-100, where float64 alone is off by 2^-53.
CLOSE = Decimal("1e-29")
TINY = Decimal(2.0 ** -1022)


@njit
def _exp(a):
    return double_double.exp(a, 0.0)


@njit
def _log(a):
    return double_double.log(a, 0.0)


@njit
def _ratio_power(v, m, p):
    m_hi, m_lo = double_double.log(m, 0.0)
    return double_double.ratio_power(v, m_hi, m_lo, p)


@njit
def _root_times(m, s_hi, s_lo, p):
    return double_double.root_times(m, s_hi, s_lo, p)


@njit
def _sums(a, b):
    return double_double.two_sum(a, b), double_double.two_product(a, b)


def _value(pair) -> Decimal:
    return Decimal(pair[0]) + Decimal(pair[1])


@pytest.fixture(autouse=True)
def _digits():
    with localcontext() as context:
        context.prec = 60
        yield


def test_sums_and_products_are_exact():
    rng = np.random.default_rng(1)
    for a, b in rng.standard_normal((200, 2)) * 10.0 ** rng.integers(-100, 100, (200, 2)):
        (s, e), (p, f) = _sums(a, b)
        assert Decimal(s) + Decimal(e) == Decimal(a) + Decimal(b)
        assert Decimal(p) + Decimal(f) == Decimal(a) * Decimal(b)


def test_exp_is_right_to_about_2_to_the_minus_100():
    rng = np.random.default_rng(2)
    for a in [0.0, 1e-300, -1e-12, 0.5, -0.5, 300.0, -300.0, *rng.uniform(-600, 600, 200)]:
        want = Decimal(a).exp()
        assert abs(_value(_exp(a)) - want) <= CLOSE * want, a
    assert _exp(-800.0) == (0.0, 0.0) and _exp(800.0)[0] == np.inf


def test_log_is_right_to_about_2_to_the_minus_100_over_the_whole_range():
    rng = np.random.default_rng(3)
    values = [5e-324, 2.2e-308, 1.0, 1.0 + 2.0 ** -52, 0.5, 1.7e308,
              *10.0 ** rng.uniform(-320, 308, 300)]
    for a in values:
        want = Decimal(a).ln()
        assert abs(_value(_log(a)) - want) <= CLOSE * max(abs(want), Decimal(1)), a


def test_ratio_power_keeps_terms_whose_ratio_underflows():
    """(v / m)^p from logarithms: v / m of 1e-620 is 0 in float64, its 0.01-th power 6e-7."""
    rng = np.random.default_rng(4)
    cases = [(1e-320, 1e300, 0.01), (5e-324, 1e300, 0.5), (3.0, 3.0, 0.37)]
    cases += [(v, m, p) for v, m, p in zip(10.0 ** rng.uniform(-320, 0, 200),
                                           10.0 ** rng.uniform(0, 300, 200),
                                           10.0 ** rng.uniform(-8, 0, 200))]
    for v, m, p in cases:
        want = ((Decimal(v).ln() - Decimal(m).ln()) * Decimal(p)).exp()
        # a term below float64's normal range may be 0 (beside a sum of at least 1)
        assert abs(_value(_ratio_power(v, m, p)) - want) <= CLOSE * want + TINY, (v, m, p)


def test_root_times_rounds_to_float64_and_overflows_only_past_it():
    rng = np.random.default_rng(5)
    largest = Decimal("1.7976931348623157e308")
    for m, s, p in zip(10.0 ** rng.uniform(-320, 300, 300), rng.uniform(1.0, 1000.0, 300),
                       10.0 ** rng.uniform(-3, 0, 300)):
        want = Decimal(m) * (Decimal(s).ln() / Decimal(p)).exp()
        got = _root_times(m, s, 0.0, p)
        if want > largest:
            assert got == np.inf, (m, s, p)
            continue
        # rounded once: within an ulp (half an ulp and the double-doubles' 2^-100)
        assert abs(Decimal(got) - want) <= Decimal(np.spacing(got)), (m, s, p)


def test_root_times_of_a_tiny_p_is_inf_not_nan():
    """Found by the campaign (seed 1207): at p = 1e-300 ln s / p passes two_product's range,
    which gave NaN; s^(1/p) of s > 1 is then past float64 whatever m, and s = 1 leaves m."""
    assert _root_times(5e-324, 6.0, 0.0, 1e-300) == np.inf
    assert _root_times(25.5, 1.0 + 2.0 ** -52, 0.0, 1e-300) == np.inf
    assert _root_times(25.5, 1.0, 0.0, 1e-300) == 25.5
