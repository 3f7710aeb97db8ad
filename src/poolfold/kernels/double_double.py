"""Double-double arithmetic for the kernels: a value as an unevaluated sum ``hi + lo`` of two
float64 (about 106 bits), for the one place float64 is not enough.

float64 LpPool-1 and GlobalLpPool-1 take p as a float, and at p < 1 the p-th root magnifies
its sum's rounding 1/p times: a sum of |x|^p right to a few ulp gives Y off by a few / p ulp
(p = 0.01: 8e-15 relative, where SEMANTICS.md allows about 1e-15). The sum, its terms and the
root taken in double-double are right to about 2^-100 before Y's one rounding, whatever p.
The algorithms are the QD library's (Hida, Li and Bailey, "Library for double-double and
quad-double arithmetic", 2007): error-free sums and products (Knuth's TwoSum, Dekker's
split), exp by argument reduction and a Taylor series, log by one Newton step on exp.

Every function takes and returns float64 scalars, pairs for double-double values; inputs are
finite unless a function says otherwise (the callers keep inf and NaN out).
"""

from __future__ import annotations

import math
from decimal import Decimal, localcontext
from fractions import Fraction

import numpy as np

from . import helper

# Dekker's splitter, 2^27 + 1: splits a float64 into two halves whose products are exact.
_SPLITTER = 134217729.0


def _pair(value: Fraction) -> tuple[float, float]:
    """An exact rational as the nearest double-double."""
    hi = float(value)
    return hi, float(value - Fraction(hi))


def _ln2() -> Fraction:
    with localcontext() as context:
        context.prec = 60
        return Fraction(Decimal(2).ln())


LN2_HI, LN2_LO = _pair(_ln2())
# 1 / n! for n = 3 ... 3 + len - 1, as double-double: exp's Taylor terms past r + r^2 / 2.
_INVERSE_FACTORIALS = np.array([_pair(Fraction(1, math.factorial(n))) for n in range(3, 12)])
_INVERSE_FACTORIALS.flags.writeable = False
# exp reduces its argument r by 2^-_HALVINGS, then squares the series' sum back that often.
_HALVINGS = 9
# Past these arguments exp is 0 or inf in float64 (and a subnormal result loses bits).
EXP_LOWEST, EXP_HIGHEST = -708.0, 709.782712893384


@helper
def two_sum(a, b):
    """``a + b`` as (its float64 sum, the sum's exact error)."""
    s = a + b
    v = s - a
    return s, (a - (s - v)) + (b - v)


@helper
def _quick_two_sum(a, b):
    """:func:`two_sum` where ``|a| >= |b|``."""
    s = a + b
    return s, b - (s - a)


@helper
def _split(a):
    t = _SPLITTER * a
    hi = t - (t - a)
    return hi, a - hi


@helper
def two_product(a, b):
    """``a * b`` as (its float64 product, the product's exact error), for |a|, |b| below
    2^996 (the split's scaling must not overflow)."""
    product = a * b
    a_hi, a_lo = _split(a)
    b_hi, b_lo = _split(b)
    return product, ((a_hi * b_hi - product) + a_hi * b_lo + a_lo * b_hi) + a_lo * b_lo


@helper
def add(a_hi, a_lo, b_hi, b_lo):
    """The double-double sum of two double-doubles."""
    s, e = two_sum(a_hi, b_hi)
    t, f = two_sum(a_lo, b_lo)
    s, e = _quick_two_sum(s, e + t)
    return _quick_two_sum(s, e + f)


@helper
def multiply(a_hi, a_lo, b_hi, b_lo):
    """The double-double product of two double-doubles."""
    product, e = two_product(a_hi, b_hi)
    return _quick_two_sum(product, e + (a_hi * b_lo + a_lo * b_hi))


@helper
def multiply_by(a_hi, a_lo, b):
    """The double-double product of a double-double and a float64."""
    product, e = two_product(a_hi, b)
    return _quick_two_sum(product, e + a_lo * b)


@helper
def divide_by(a_hi, a_lo, b):
    """The double-double quotient of a double-double by a float64."""
    q1 = a_hi / b
    product, e = two_product(q1, b)
    s, f = two_sum(a_hi, -product)
    q2 = (s + (f - e + a_lo)) / b
    return _quick_two_sum(q1, q2)


@helper
def exp(a_hi, a_lo):
    """e^a: a = m ln2 + r (|r| <= ln2 / 2), r halved _HALVINGS times, e^r - 1 by its Taylor
    series to 2^-106, squared back ((1 + s)^2 - 1 = 2s + s^2), times 2^m.  0 below
    EXP_LOWEST, inf above EXP_HIGHEST."""
    if a_hi < EXP_LOWEST:
        return 0.0, 0.0
    if a_hi > EXP_HIGHEST:
        return np.inf, 0.0
    m = np.floor(a_hi / LN2_HI + 0.5)
    t_hi, t_lo = multiply_by(LN2_HI, LN2_LO, m)
    r_hi, r_lo = add(a_hi, a_lo, -t_hi, -t_lo)
    scale = 1.0 / (1 << _HALVINGS)
    r_hi *= scale  # exact: a power of two
    r_lo *= scale
    power_hi, power_lo = multiply(r_hi, r_lo, r_hi, r_lo)
    s_hi, s_lo = add(r_hi, r_lo, power_hi * 0.5, power_lo * 0.5)
    for n in range(_INVERSE_FACTORIALS.shape[0]):
        power_hi, power_lo = multiply(power_hi, power_lo, r_hi, r_lo)
        term_hi, term_lo = multiply(power_hi, power_lo, _INVERSE_FACTORIALS[n, 0],
                                    _INVERSE_FACTORIALS[n, 1])
        s_hi, s_lo = add(s_hi, s_lo, term_hi, term_lo)
        if abs(term_hi) < 1e-33:  # past 2^-106 of the sum (about 1)
            break
    for _ in range(_HALVINGS):
        square_hi, square_lo = multiply(s_hi, s_lo, s_hi, s_lo)
        s_hi, s_lo = add(2.0 * s_hi, 2.0 * s_lo, square_hi, square_lo)
    s_hi, s_lo = add(s_hi, s_lo, 1.0, 0.0)
    exponent = int(m)
    return np.ldexp(s_hi, exponent), np.ldexp(s_lo, exponent)


@helper
def log(a_hi, a_lo):
    """ln a, for a > 0 (normal or subnormal): a = f 2^k with f in [0.5, 1), ln f by
    float64's log x and one Newton step x + f e^-x - 1, which doubles its bits, plus k ln2.
    (Taken on a itself, e^-x of a tiny a passes two_product's range.)"""
    f, k = math.frexp(a_hi)
    f_lo = math.ldexp(a_lo, -k)  # exact: a power of two
    x = np.log(f)
    e_hi, e_lo = exp(-x, 0.0)
    t_hi, t_lo = multiply(f, f_lo, e_hi, e_lo)
    t_hi, t_lo = add(t_hi, t_lo, -1.0, 0.0)
    l_hi, l_lo = add(x, 0.0, t_hi, t_lo)
    k_hi, k_lo = multiply_by(LN2_HI, LN2_LO, float(k))
    return add(l_hi, l_lo, k_hi, k_lo)


@helper
def ratio_power(v, m_log_hi, m_log_lo, p):
    """(v / m)^p for 0 < v <= m and p > 0, as a double-double, given ln m: e^(p (ln v -
    ln m)), 0 below float64's normal range (a term beside the window's largest, whose term
    is 1).  Not from v / m, which underflows to 0 where v is below m 2^-1074, though its
    p-th power need not (p = 0.01: 1e-333^p is 5e-4)."""
    l_hi, l_lo = log(v, 0.0)
    d_hi, d_lo = add(l_hi, l_lo, -m_log_hi, -m_log_lo)
    a_hi, a_lo = multiply_by(d_hi, d_lo, p)
    return exp(a_hi, a_lo)


@helper
def root_times(m, s_hi, s_lo, p):
    """``m * s^(1/p)`` rounded to float64, for m > 0 (finite) and s >= 1 (a double-double):
    from the logarithms where s^(1/p) passes _DIRECT_LARGEST, where it alone may overflow
    though the product does not."""
    l_hi, l_lo = log(s_hi, s_lo)
    if l_hi > _SURELY_PAST * p:  # (the quotient alone may pass two_product's range)
        return np.inf
    a_hi, a_lo = divide_by(l_hi, l_lo, p)
    if a_hi <= _DIRECT_LARGEST:
        e_hi, e_lo = exp(a_hi, a_lo)
        scale = 1.0
        if m > _SPLIT_LARGEST:  # two_product's operands stay below 2^996
            m *= 1.0 / _SCALE
            scale = _SCALE
        product, error = two_product(m, e_hi)
        if product == np.inf:  # m e rounds past float64's largest, and so does the exact
            return product  # value (e's low part is 2^-100 of it)
        return (product + (error + m * e_lo)) * scale  # exact scaling, or inf
    m_hi, m_lo = log(m, 0.0)
    a_hi, a_lo = add(a_hi, a_lo, m_hi, m_lo)
    e_hi, e_lo = exp(a_hi, a_lo)
    return e_hi + e_lo


# root_times: e^600 (about 2^866) and m up to 2^900 keep two_product within its range; a
# larger m is scaled by 2^-128 first.
_DIRECT_LARGEST = 600.0
# ln s / p past this, m s^(1/p) is past float64's largest for any m (at least 2^-1074): the
# log of the largest float64 over the smallest subnormal, and a margin.
_SURELY_PAST = 1455.0
_SPLIT_LARGEST = 2.0 ** 900
_SCALE = 2.0 ** 128
