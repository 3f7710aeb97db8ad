"""The explicit vector folds (poolfold.kernels.simd) against a first maximum found element by
element in Python: every type the kernels pool, every vector width's ragged ends (folds
shorter than a vector, a vector and a bit, whole vectors), strides 1 to 4 and dilations,
with NaNs, -0.0 and +0.0 among the values so that the tap each fold keeps shows in the bits."""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from numba import literal_unroll, njit

from kernel_types import kernel_types
from poolfold import dtypes
from poolfold.kernels.simd import (HOLDS_NAN, HOLDS_ZERO, KEEP, PROGRAM_FIELDS, RESET,
                                  SUFFIX, TERM, TO, UNROLL, fold_pair, fold_row_groups,
                                  fold_strided, fold_taps, fold_vectors, run_block_program,
                                  store_averages, sum_strided, sum_vectors,
                                  sum_vectors_screened, transpose_tile, vector_width,
                                  zeros_and_nans)

TYPES = ("float32", "float64", "float16", "bfloat16", "int8", "uint8")


@njit
def _fold_vectors(dst, to, src, starts, taps, count):
    fold_vectors(dst, to, src, starts, taps, count)


@njit
def _fold_strided(dst, to, src, at, count, stride, taps, dilation):
    for literal in literal_unroll((1, 2, 3, 4)):  # the stride as the literal it must be
        if stride == literal:
            fold_strided(dst, to, src, at, count, literal, taps, dilation)


@njit
def _fold_taps(dst, to, src, starts, first, taps, count, no_nan):
    if no_nan:
        fold_taps(dst, to, src, starts, first, taps, count, True)
    else:
        fold_taps(dst, to, src, starts, first, taps, count, False)


@njit
def _fold_pair(dst, to, first, first_at, second, second_at, count, no_nan=False):
    if no_nan:
        fold_pair(dst, to, first, first_at, second, second_at, count, True)
    else:
        fold_pair(dst, to, first, first_at, second, second_at, count, False)


@njit
def _fold_row_groups(dst, to, src, at, rows, width, src_step, tap_step, taps):
    fold_row_groups(dst, to, src, at, rows, width, src_step, tap_step, taps)


@njit
def _transpose_tile(dst, dst_at, dst_pitch, stores, src, src_at, src_pitch, loads):
    return transpose_tile(dst, dst_at, dst_pitch, stores, src, src_at, src_pitch, loads)


@njit
def _vector_width(x):
    return vector_width(x)


def values(dtype: str, size: int, seed: int) -> np.ndarray:
    """Values with many ties, zeros of both signs and (for floats) NaNs of two payloads."""
    rng = np.random.default_rng(seed)
    if dtype in ("int8", "uint8"):
        info = np.iinfo(dtype)
        return rng.integers(info.min, info.max + 1, size).astype(dtype)
    pool = np.array([0.0, -0.0, 1.5, -1.5, 2.0, np.inf, -np.inf, np.nan], np.float64)
    x = np.where(rng.random(size) < 0.5, rng.choice(pool, size), rng.standard_normal(size))
    x = x.astype(ml_dtypes.bfloat16 if dtype == "bfloat16" else dtype)
    bits = x.view(np.dtype(f"u{x.itemsize}"))
    other_nan = rng.random(size) < 0.5
    # a NaN with another payload: which NaN a fold keeps shows in the bits
    bits[np.isnan(x.astype(np.float64)) & other_nan] |= 1
    return x


def first_maximum(taps: list):
    """The first maximum of ``taps`` (Python floats or ints) in order, or the first NaN:
    the index of the tap kept."""
    kept = 0
    for t in range(1, len(taps)):
        v, held = taps[t], taps[kept]
        if isinstance(held, float) and math.isnan(held):
            break
        if (isinstance(v, float) and math.isnan(v)) or v > held:
            kept = t
    return kept


def expected(x: np.ndarray, dst_size: int, to: int, starts, count: int, stride: int) -> bytes:
    """``dst[to + i]`` = the tap of x kept over ``starts[t] + i*stride``, the rest zero."""
    as_python = x.astype(np.float64).tolist() if x.dtype.kind == "f" or x.dtype.name == \
        "bfloat16" else x.tolist()
    out = np.zeros(dst_size, x.dtype)
    for i in range(count):
        at = [s + i * stride for s in starts]
        out[to + i] = x[at[first_maximum([as_python[a] for a in at])]]
    return out.view(np.uint8).tobytes()


def run_fold_vectors(x, dst_size, to, starts, count) -> bytes:
    xv = dtypes.value_view(x)
    dst = np.zeros(dst_size, xv.dtype)
    _fold_vectors(dst, to, xv, np.asarray(starts, np.int64), len(starts), count)
    return dst.view(np.uint8).tobytes()


def run_fold_strided(x, dst_size, to, at, count, stride, taps, dilation) -> bytes:
    xv = dtypes.value_view(x)
    dst = np.zeros(dst_size, xv.dtype)
    _fold_strided(dst, to, xv, at, count, stride, taps, dilation)
    return dst.view(np.uint8).tobytes()


# every ragged end of every width a host may give a type (4 to 64 lanes): folds shorter
# than a vector, around a whole vector, each count of vectors left after the unrolled blocks
# (1 to UNROLL, the last one ragged), and around a whole block
COUNTS = tuple(sorted({0, 1, 2, 3, 5, 7} | {
    count for lanes in (4, 8, 16, 32, 64) for count in (
        lanes - 1, lanes, lanes + 1, 2 * lanes + 1, 3 * lanes + lanes // 2,
        UNROLL * lanes - 1, UNROLL * lanes, UNROLL * lanes + 1,
        UNROLL * lanes + 3 * lanes + 3)}))
MOST = COUNTS[-1]


@pytest.mark.parametrize("dtype", TYPES)
@pytest.mark.parametrize("taps", [1, 2, 3, 5])
def test_fold_vectors_keeps_the_first_maximum(dtype, taps):
    x = values(dtype, 300 + MOST, seed=taps)
    rng = np.random.default_rng(taps)
    for count in COUNTS:
        starts = sorted(rng.choice(300, taps, replace=False).tolist())
        to = int(rng.integers(0, 5))
        got = run_fold_vectors(x, MOST + 5, to, starts, count)
        assert got == expected(x, MOST + 5, to, starts, count, 1), (dtype, taps, count,
                                                                    starts)


@pytest.mark.parametrize("dtype", TYPES)
def test_fold_pair_keeps_the_first_of_two_arrays(dtype):
    """``fold_pair`` folds an element of one array then one of another, at every ragged
    count, and in place (the destination the first source, the elements apart), as running
    maxima do; with ``no_nan`` (plain comparisons) on taps that hold no NaN, -0.0 before
    +0.0 still keeps the first."""
    for no_nan in (False, True):
        x, y = values(dtype, 2 * MOST + 40, seed=7), values(dtype, 2 * MOST + 40, seed=8)
        if no_nan and dtype not in ("int8", "uint8"):
            x[np.isnan(x.astype(np.float64))] = -0.0
            y[np.isnan(y.astype(np.float64))] = 0.0
        xv, yv = dtypes.value_view(x), dtypes.value_view(y)
        both = np.concatenate([x, y])
        for count in COUNTS:
            dst = np.zeros(MOST + 5, xv.dtype)
            _fold_pair(dst, 3, xv, 5, yv, 11, count, no_nan)
            want = expected(both, MOST + 5, 3, [5, x.size + 11], count, 1)
            assert dst.view(np.uint8).tobytes() == want, (dtype, no_nan, count)
            run = xv.copy()  # run[m] = fold(run[m - c], y[m]): the prefix step, in place
            _fold_pair(run, count + 2, run, 2, yv, 11, count, no_nan)
            want = expected(both, count, 0, [2, x.size + 11], count, 1)
            assert run[count + 2:2 * count + 2].view(np.uint8).tobytes() == want, (
                dtype, no_nan, count)


@pytest.mark.parametrize("dtype", TYPES)
def test_fold_row_groups_keeps_the_first_of_each_group(dtype):
    """Each output row from its group of source rows, a vector a row: rows narrower than a
    vector, of every width, whose stores run into the next rows' places, which the next
    rows then overwrite; one to three taps, the groups' rows apart or interleaved."""
    lanes = int(_vector_width(dtypes.value_view(np.zeros(1, dtype))))
    rng = np.random.default_rng(3)
    for width in sorted({1, 2, 3, lanes // 2 - 1, lanes // 2, lanes - 1, lanes} - {0}):
        for taps, step in ((1, 1), (2, 2), (3, 3), (2, 3)):
            rows = 9
            x = values(dtype, (rows * step + taps) * width + lanes + 7, seed=width + taps)
            xv = dtypes.value_view(x)
            at = int(rng.integers(0, 5))
            dst = np.zeros(rows * width + lanes + 4, xv.dtype)
            _fold_row_groups(dst, 2, xv, at, rows, width, step * width, width, taps)
            for j in range(rows):
                starts = [at + (j * step + t) * width for t in range(taps)]
                want = expected(x, width, 0, starts, width, 1)
                got = dst[2 + j * width:2 + (j + 1) * width].view(np.uint8).tobytes()
                assert got == want, (dtype, width, taps, step, j)


@pytest.mark.parametrize("dtype", TYPES)
@pytest.mark.parametrize("stride", [1, 2, 3, 4])
def test_fold_strided_keeps_the_first_maximum(dtype, stride):
    x = values(dtype, 4 * MOST + 40, seed=stride)
    rng = np.random.default_rng(stride)
    for count in COUNTS:
        for taps, dilation in ((1, 1), (2, 1), (3, 1), (3, 2), (5, 3)):
            at = int(rng.integers(0, 20))
            to = int(rng.integers(0, 5))
            starts = [at + t * dilation for t in range(taps)]
            got = run_fold_strided(x, MOST + 5, to, at, count, stride, taps, dilation)
            assert got == expected(x, MOST + 5, to, starts, count, stride), (
                dtype, stride, count, taps, dilation)


@pytest.mark.parametrize("dtype", TYPES)
def test_fold_taps_keeps_the_first_maximum(dtype):
    """Each output's taps from a shared table; with ``no_nan`` (plain comparisons) on taps
    that hold no NaN, the first of equal values (-0.0 before +0.0) is still kept."""
    rng = np.random.default_rng(7)
    for no_nan in (False, True):
        x = values(dtype, 300 + MOST, seed=11)
        if no_nan and dtype not in ("int8", "uint8"):
            x[np.isnan(x.astype(np.float64))] = -0.0
        table = rng.integers(0, 300, 40).tolist()
        for count in (1, 15, 16, 17, UNROLL * 16, UNROLL * 64):
            for first, taps in ((0, 1), (3, 4), (10, 9), (1, 39)):
                starts = table[first:first + taps]
                got = dtypes.value_view(np.zeros(count + 5, x.dtype))
                _fold_taps(got, 2, dtypes.value_view(x), np.asarray(table, np.int64), first,
                           taps, count, no_nan)
                assert got.view(np.uint8).tobytes() == expected(
                    x, count + 5, 2, starts, count, 1), (dtype, no_nan, count, first, taps)


@pytest.mark.parametrize("dtype", TYPES)
def test_transpose_tile_moves_rows_to_columns(dtype):
    """A tile of W x W: rows from ``loads`` on repeat the row below them, columns from
    ``stores`` on are not written, and whether a row loaded holds a NaN is returned."""
    x = values(dtype, 6000, seed=3)
    xv = dtypes.value_view(x)
    width = _vector_width(xv)
    for loads, stores in ((width, width), (3, width), (width, 5), (1, 1)):
        src_at, src_pitch, dst_at, dst_pitch = 7, width + 9, 3, width + 2
        dst = np.zeros(3 + width * dst_pitch + width, xv.dtype)
        nan = _transpose_tile(dst, dst_at, dst_pitch, stores, xv, src_at, src_pitch, loads)
        want = np.zeros_like(dst)
        rows = []
        for r in range(width):
            at = src_at + min(r, loads - 1) * src_pitch
            rows.append(xv[at:at + width])
        for j in range(stores):
            want[dst_at + j * dst_pitch:][:width] = [row[j] for row in rows]
        assert dst.tobytes() == want.tobytes(), (dtype, loads, stores)
        loaded = np.concatenate(rows).view(x.dtype).astype(np.float64) \
            if x.dtype.kind == "f" or dtype == "bfloat16" else np.zeros(1)
        assert nan == bool(np.isnan(loaded).any())


def test_strided_fold_reads_nothing_past_its_last_tap():
    """The wide loads are masked to the elements they keep: a fold whose last tap is the
    array's last element reads no further (an unmasked load would read stride - 1 more,
    which the bounds-checked run reports, and which past a page's end faults)."""
    for stride in (2, 3, 4):
        for count in (1, 7, 8, 9, 40):
            x = values("float32", (count - 1) * stride + 3, seed=count)
            got = run_fold_strided(x, count, 0, 0, count, stride, 3, 1)
            assert got == expected(x, count, 0, [0, 1, 2], count, stride)


@settings(max_examples=60, deadline=None)
@given(dtype=st.sampled_from(kernel_types(TYPES)), count=st.integers(0, 600), taps=st.integers(1, 7),
       stride=st.integers(1, 4), dilation=st.integers(1, 3), seed=st.integers(0, 2**16))
def test_folds_match_element_by_element(dtype, count, taps, stride, dilation, seed):
    size = max(count - 1, 0) * stride + (taps - 1) * dilation + 1 + 8
    x = values(dtype, size, seed)
    starts = [t * dilation for t in range(taps)]
    want = expected(x, count + 3, 3, starts, count, stride)
    assert run_fold_strided(x, count + 3, 3, 0, count, stride, taps, dilation) == want
    if stride == 1:
        assert run_fold_vectors(x, count + 3, 3, starts, count) == want


@njit
def _sum_strided(dst, to, src, at, count, stride, taps, dilation):
    for literal in literal_unroll((1, 2, 3, 4)):
        if stride == literal:
            sum_strided(dst, to, src, at, count, literal, taps, dilation)


def expected_sums(x: np.ndarray, dst_size: int, to: int, at: int, count: int, stride: int,
                  taps: int, dilation: int) -> bytes:
    """Each output's taps added left to right in x's own type, one addition at a time."""
    out = np.zeros(dst_size, x.dtype)
    for i in range(count):
        total = x[at + i * stride]
        for t in range(1, taps):
            total = x.dtype.type(total + x[at + i * stride + t * dilation])
        out[to + i] = total
    return out.tobytes()


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("stride", [1, 2, 3, 4])
def test_sum_strided_adds_left_to_right(dtype, stride):
    """The sums keep the order of a loop per tap, bit for bit: values of very different
    sizes make any other order round differently."""
    rng = np.random.default_rng(stride)
    size = 4 * MOST + 40
    x = (rng.standard_normal(size) * 10.0 ** rng.integers(-8, 9, size)).astype(dtype)
    x[rng.random(size) < 0.02] = np.inf
    for count in COUNTS:
        for taps, dilation in ((1, 1), (2, 1), (3, 1), (3, 2), (5, 3), (7, 1)):
            at, to = int(rng.integers(0, 20)), int(rng.integers(0, 5))
            dst = np.zeros(MOST + 5, dtype)
            _sum_strided(dst, to, x, at, count, stride, taps, dilation)
            assert dst.tobytes() == expected_sums(x, MOST + 5, to, at, count, stride, taps,
                                                  dilation), (dtype, stride, count, taps)


@njit
def _sum_vectors(dst, to, src, starts, taps, count):
    sum_vectors(dst, to, src, starts, taps, count)


@pytest.mark.parametrize("dtype", ["float32", "float64", "float16", "bfloat16"])
def test_sum_vectors_adds_rows_left_to_right(dtype):
    """Rows that start anywhere summed element by element in row order, bit for bit as a
    loop per row: in X's own type, or for float16 and bfloat16 in float32, each value
    widened exactly (the row kernel's accumulator)."""
    rng = np.random.default_rng(len(dtype))
    size = 4 * MOST + 40
    values = rng.standard_normal(size) * 10.0 ** rng.integers(-6, 7, size)
    values[rng.random(size) < 0.02] = np.inf
    values[rng.random(size) < 0.02] = -np.inf
    values[rng.random(size) < 0.02] = np.nan
    with np.errstate(over="ignore"):  # float16's range is 65504
        x = values.astype(getattr(ml_dtypes, dtype, None) or dtype)
    half = x.dtype.itemsize == 2
    sum_type = np.float32 if half else x.dtype.type
    widened = x.astype(np.float32) if half else x
    bits = x.view(dtypes.value_type(x.dtype)) if half else x
    for count in COUNTS:
        for taps in (1, 2, 3, 7):
            starts = np.sort(rng.integers(0, size - count, taps)).astype(np.int64)
            to = int(rng.integers(0, 5))
            dst = np.zeros(MOST + 5, sum_type)
            _sum_vectors(dst, to, bits, starts, taps, count)
            want = np.zeros(MOST + 5, sum_type)
            with np.errstate(invalid="ignore"):  # inf + -inf
                for i in range(count):
                    total = widened[starts[0] + i]
                    for t in range(1, taps):
                        total = sum_type(total + widened[starts[t] + i])
                    want[to + i] = total
            # bit for bit, but a NaN's sign: inf + -inf makes the CPU's default NaN, and
            # which of two NaNs a sum keeps depends on its operands' order in registers
            nan = np.isnan(want)
            assert np.array_equal(np.isnan(dst), nan), (dtype, count, taps)
            assert dst[~nan].tobytes() == want[~nan].tobytes(), (dtype, count, taps)


@njit
def _sum_vectors_screened(dst, to, src, starts, taps, count):
    return sum_vectors_screened(dst, to, src, starts, taps, count)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_sum_vectors_screened_flags_exactly_the_sums_that_are_not_finite(dtype):
    """The sums of :func:`sum_vectors`, bit for bit, and 1 exactly where one it stored is an
    inf or a NaN: from an inf or a NaN term, or from finite terms whose sum overflows, in a
    whole vector or in the overlapping and ragged tails; none from outside the outputs."""
    rng = np.random.default_rng(11)
    big = np.finfo(dtype).max
    size = 4 * MOST + 40
    for count in COUNTS:
        for special in (None, np.inf, -np.inf, np.nan, "overflow"):
            x = rng.standard_normal(size).astype(dtype)
            x[:4] = np.nan  # before every window: never read
            taps = 3
            starts = np.array([4, 9, 30], np.int64)
            if special is not None and count:
                i = int(rng.integers(0, count))
                if special == "overflow":
                    x[starts[0] + i] = x[starts[1] + i] = big
                else:
                    x[starts[int(rng.integers(0, taps))] + i] = special
            dst = np.zeros(MOST + 5, dtype)
            flagged = _sum_vectors_screened(dst, 2, x, starts, taps, count)
            want = np.zeros(MOST + 5, dtype)
            _sum_vectors(want, 2, x, starts, taps, count)
            assert np.array_equal(dst, want, equal_nan=True), (count, special)
            assert flagged == int(not np.isfinite(want[2:2 + count]).all()), (count, special)
            assert flagged == int(special is not None and count > 0), (count, special)


@njit
def _store_averages(y, y_at, sums, starts, shift, taps, count, scale, factors, factors_at):
    return store_averages(y, y_at, sums, starts, shift, taps, count, scale, factors,
                          factors_at)


def _stored_as(y_type, value: float):
    """``value`` (float64) as Y holds it, by numpy and ml_dtypes: through float32 (the
    rounding twice the contract allows for half types), a NaN as the one quiet NaN."""
    if math.isnan(value):
        value = math.nan
    with np.errstate(over="ignore"):
        single = np.float32(value)
        return np.array([single]).astype(y_type)[0] if y_type != np.float64 else value


@pytest.mark.parametrize("sum_type", ["float32", "float64"])
@pytest.mark.parametrize("y_type", ["float32", "float64", "float16", "bfloat16"])
def test_store_averages_scales_and_rounds_each_window_sum(sum_type, y_type):
    """Each output: its taps summed left to right in the sums' type (as
    :func:`sum_vectors` sums them), that sum as float64 times the row's scale, times its own
    factor, rounded to Y's type, a NaN as one quiet NaN: bit for bit against numpy and
    ml_dtypes, in whole vectors and the ragged tails; and 1 exactly where a sum is an inf or
    a NaN.  Y's elements outside the outputs keep their bits."""
    rng = np.random.default_rng(len(sum_type) * 7 + len(y_type))
    y_dtype = np.dtype(getattr(ml_dtypes, y_type, None) or y_type)
    size = 4 * MOST + 40
    for count in COUNTS:
        for special in (None, np.inf, -np.inf, np.nan, "overflow", "tiny", "payload"):
            sums = (rng.standard_normal(size) * 10.0 ** rng.integers(-3, 4, size)).astype(
                sum_type)
            taps = int(rng.integers(1, 7))
            starts = np.sort(rng.integers(0, size - count - 8, taps)).astype(np.int64)
            shift = int(rng.integers(0, 8))
            if special is not None and count:
                i = int(rng.integers(0, count)) + shift
                if special == "overflow" and taps > 1:
                    sums[starts[0] + i] = sums[starts[1] + i] = np.finfo(sum_type).max
                elif special == "tiny":  # a sum whose average is below the half types' range
                    sums[starts + i] = 1e-9
                elif special == "payload":  # a negative NaN with a payload: stored as NaN
                    word = 0xFFC00123 if sum_type == "float32" else 0xFFF8000000000123
                    sums.view(f"u{sums.itemsize}")[starts[-1] + i] = word
                elif special != "overflow":
                    sums[starts[int(rng.integers(0, taps))] + i] = special
            scale = float(rng.uniform(0.01, 2.0))
            factors = rng.uniform(0.001, 1.0, count + 12)
            factors_at = int(rng.integers(0, 12))
            y_at = int(rng.integers(0, 5))
            y = np.full(MOST + 5, 7.0).astype(y_dtype)
            bits = y.view(dtypes.value_type(y_dtype))
            flagged = _store_averages(bits, y_at, sums, starts + 0, shift, taps, count, scale,
                                      factors, factors_at)
            want = np.full(MOST + 5, 7.0).astype(y_dtype)
            not_finite = False
            with np.errstate(invalid="ignore", over="ignore"):  # inf + -inf; overflow
                for i in range(count):
                    total = sums[starts[0] + shift + i]
                    for t in range(1, taps):
                        total = total + sums[starts[t] + shift + i]
                    not_finite |= not np.isfinite(total)
                    want[y_at + i] = _stored_as(y_dtype.type, float(total) * scale
                                                * factors[factors_at + i])
            case = (count, special, taps)
            assert y.tobytes() == want.tobytes(), case
            assert flagged == int(not_finite), case


@njit
def _zeros_and_nans(x, lo, hi):
    return zeros_and_nans(x, lo, hi)


@pytest.mark.parametrize("dtype", TYPES)
def test_zeros_and_nans_finds_each_in_any_place(dtype):
    """A zero of either sign or a NaN anywhere in the range, in a whole vector or the
    scalar tail, and nothing outside it; never for integer types."""
    rng = np.random.default_rng(7)
    for count in (0, 1, 7, 8, 9, 15, 16, 17, 31, 32, 33, 63, 64, 65, 100):
        for special in (None, 0.0, -0.0, np.nan):
            x = (rng.standard_normal(count + 10) + 8).astype(
                ml_dtypes.bfloat16 if dtype == "bfloat16" else dtype)
            if dtype not in ("int8", "uint8"):
                x[2] = x[count + 7] = 0.0  # outside the range [5, count + 5)
                if special is not None and count:
                    x[5 + int(rng.integers(0, count))] = special
            wide = x[5:count + 5].astype(np.float64)
            want = 0 if dtype in ("int8", "uint8") else (
                (HOLDS_ZERO if (wide == 0).any() else 0) | (HOLDS_NAN if np.isnan(wide).any()
                                                            else 0))
            assert _zeros_and_nans(dtypes.value_view(x), 5, count + 5) == want, (count, special)


def test_a_fold_past_the_array_raises_under_bounds_checking():
    """Raw vector loads escape numba's bounds checks, so the intrinsics check themselves in
    a bounds-checked build (the suite's NUMBA_BOUNDSCHECK=1 run): a source stream, a
    destination and a strided stream one element past their arrays each raise IndexError."""
    import numba
    if not numba.config.BOUNDSCHECK:
        pytest.skip("runs in the bounds-checked child (tests/test_fuzz_boundscheck.py)")
    x = np.arange(40, dtype=np.float32)
    with pytest.raises(IndexError):
        _fold_vectors(np.zeros(40, np.float32), 0, x, np.array([0, 1], np.int64), 2, 40)
    with pytest.raises(IndexError):
        _fold_vectors(np.zeros(39, np.float32), 0, x, np.array([0], np.int64), 1, 40)
    with pytest.raises(IndexError):  # the last output's last tap is x[2*19 + 2] = x[40]
        _fold_strided(np.zeros(20, np.float32), 0, x, 0, 20, 2, 3, 1)
    _fold_strided(np.zeros(20, np.float32), 0, x, 0, 20, 2, 2, 1)  # x[39] at most: fine
    width = _vector_width(x)
    with pytest.raises(IndexError):  # fold_taps: a tap's last lane is x[40]
        _fold_taps(np.zeros(width, np.float32), 0, x, np.array([0, 40 - width + 1], np.int64),
                   0, 2, width, True)
    with pytest.raises(IndexError):  # transpose_tile: the last row loaded ends at x[40]
        _transpose_tile(np.zeros(width * width, np.float32), 0, width, width, x,
                        40 - width + 1 - 1 * 0, 0, 1)
    with pytest.raises(IndexError):  # fold_pair: the second source's last element is x[40]
        _fold_pair(np.zeros(40, np.float32), 0, x, 0, x, 1, 40)
    with pytest.raises(IndexError):  # ...and its destination one short
        _fold_pair(np.zeros(39, np.float32), 0, x, 0, x, 0, 40)
    with pytest.raises(IndexError):  # ...and a column stored one past the destination
        _transpose_tile(np.zeros(width * width - 1, np.float32), 0, width, width, x, 0, 1, 1)
    term_only = np.array([1, 0, -1, -1, -1], np.int64)  # RESET, TERM 0, no store
    value = np.empty(0, np.int8)
    with pytest.raises(IndexError):  # run_block_program: the term's last column is x[40]
        _run_block_program(np.zeros(1, np.float32), 0, np.zeros(1, np.float32), x, 1,
                           term_only, 0, 1, 40, value)
    stored = np.array([1, 0, -1, 1, -1], np.int64)  # ...and stored one column past dst
    with pytest.raises(IndexError):
        _run_block_program(np.zeros(40, np.float32), 0, np.zeros(1, np.float32), x, 0,
                           stored, 0, 1, 40, value)
    starts = np.array([0], np.int64)
    with pytest.raises(IndexError):  # store_averages: a factor one past its array
        _store_averages(np.zeros(40, np.float32), 0, x, starts, 0, 1, 40, 1.0,
                        np.ones(40), 1)
    with pytest.raises(IndexError):  # ...and an average stored one past Y
        _store_averages(np.zeros(40, np.float32), 1, x, starts, 0, 1, 40, 1.0,
                        np.ones(41), 0)
    with pytest.raises(IndexError):  # ...and a sum's term one past the sums
        _store_averages(np.zeros(40, np.float32), 0, x, starts, 1, 1, 40, 1.0,
                        np.ones(40), 0)



@njit
def _run_block_program(dst, dst_at, partial, src, src_at, program, first, entries, cols,
                       mark):
    run_block_program(dst, dst_at, partial, src, src_at, program, first, entries, cols, mark)


# (source type, sums' type) the block programs take, and the term markers
BLOCK_TERMS = [("float32", "float32"), ("float64", "float64"), ("float32", "float64"),
               ("float16", "float32"), ("bfloat16", "float32"), ("float16", "float64")]
MARKS = {"value": np.int8, "abs": np.int16, "square": np.int32}


@pytest.mark.parametrize("src_type,sum_type", BLOCK_TERMS)
@pytest.mark.parametrize("mark", sorted(MARKS))
def test_block_programs_follow_their_entries(src_type, sum_type, mark):
    """Random programs over column counts from 1 to past two whole runs of vectors, against
    an interpreter of the entries written from their definition: column by column a
    running sum, -0.0 or +0.0 on RESET 1 or 2, each TERM's value (widened, |x| or x^2 in
    the sums' type) added, TO storing it plus a SUFFIX of ``partial`` where one is given,
    KEEP storing it into ``partial``; bit for bit, the sign of a zero too."""
    rng = np.random.default_rng(len(src_type) * 7 + len(sum_type) + len(mark))
    sums = np.dtype(sum_type).type
    src_dtype = np.dtype(getattr(ml_dtypes, src_type, None) or src_type)
    term_mark = np.empty(0, MARKS[mark])
    for cols in (1, 3, 7, 8, 15, 16, 17, 33, 64, 100, 129, 200, 257):
        rows, entries = 12, int(rng.integers(1, 40))
        values = rng.standard_normal((rows, cols + 3)) * 10.0 ** rng.integers(-3, 4)
        values[rng.random(values.shape) < 0.1] = 0.0
        values[rng.random(values.shape) < 0.1] = -0.0
        x = values.astype(src_dtype)
        partial = (rng.standard_normal((rows, cols + 2)) * 8).astype(sums)
        partial[rng.random(partial.shape) < 0.1] = -0.0
        dst = np.full((rows, cols + 5), np.nan, sums)
        program = np.full(entries * PROGRAM_FIELDS + 3, -7, np.int64)  # 3 before the first
        for e in range(entries):
            at = 3 + e * PROGRAM_FIELDS
            program[at + RESET] = rng.choice([0, 0, 1, 2]) if e else rng.choice([1, 2])
            pick = rng.random(4) < (0.7, 0.4, 0.5, 0.3)
            program[at + TERM] = int(rng.integers(rows)) * (cols + 3) if pick[0] else -1
            program[at + SUFFIX] = int(rng.integers(rows)) * (cols + 2) if pick[1] else -1
            program[at + TO] = int(rng.integers(rows)) * (cols + 5) if pick[2] else -1
            program[at + KEEP] = int(rng.integers(rows)) * (cols + 2) if pick[3] else -1
        want_dst, want_partial = dst.reshape(-1).copy(), partial.reshape(-1).copy()
        widened = x.astype(np.float64).reshape(-1).astype(sums)
        if mark == "abs":
            widened = np.abs(widened)
        elif mark == "square":
            widened = (widened * widened).astype(sums)
        src_at, dst_at = 1, 2
        with np.errstate(over="ignore"):
            for c in range(cols):
                acc = sums(0.0)
                for e in range(entries):
                    at = 3 + e * PROGRAM_FIELDS
                    reset, term, suffix, to, keep = program[at:at + PROGRAM_FIELDS]
                    if reset:
                        acc = sums(-0.0) if reset == 1 else sums(0.0)
                    if term >= 0:
                        acc = sums(acc + widened[src_at + term + c])
                    if to >= 0:
                        value = acc + want_partial[suffix + c] if suffix >= 0 else acc
                        want_dst[dst_at + to + c] = value
                    if keep >= 0:
                        want_partial[keep + c] = acc
        bits = x.view(dtypes.value_type(x.dtype)) if x.dtype.itemsize == 2 else x
        got_dst, got_partial = dst.reshape(-1), partial.reshape(-1)
        _run_block_program(got_dst, dst_at, got_partial, bits.reshape(-1), src_at, program,
                           3, entries, cols, term_mark)
        assert got_dst.tobytes() == want_dst.tobytes(), (src_type, sum_type, mark, cols)
        assert got_partial.tobytes() == want_partial.tobytes(), (src_type, sum_type, cols)


def test_vectors_hold_a_register_of_the_host_and_halves_sixteen(monkeypatch):
    """A fold's vector is one register of the widest the host has (64 bytes with AVX-512, 32
    otherwise, or where numba compiles for a named CPU); float16 and bfloat16, whose keys
    widen to float32, keep 16 lanes whatever the host."""
    from numba import types
    from numba.core import config

    from poolfold.kernels import simd
    monkeypatch.setattr(config, "CPU_NAME", "generic")
    assert simd._host_register_bytes() == 32
    register = simd.REGISTER_BYTES
    assert register in (32, 64)
    assert simd._lanes(types.float32) == register // 4
    assert simd._lanes(types.float64) == register // 8
    assert simd._lanes(types.int8) == register
    assert simd._lanes(types.uint16) == simd._lanes(types.int16) == 16  # the half types' bits
