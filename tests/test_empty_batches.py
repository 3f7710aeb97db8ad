"""Empty tensors against hostile geometry: N = 0, C = 0 or a zero-size spatial axis, with huge
pads, dilations, strides and kernels, in every op and both domains.

An empty batch holds no data, so nothing about its size bounds what the geometry asks for:
``max_pool(np.zeros((0, 2, 3, 3)), [3, 3], pads=[0, 0, 2**40, 0])`` once tried to allocate a
16 TiB table for an output of no element.  Each call here must either return exactly the
output the contract gives (shape from the oracle's geometry, and its values where it has
any), or be refused with a PoolfoldError, quickly and without allocating; a refusal is only
allowed where the geometry itself is beyond memory, and a call with no fitting window must be
refused.  Never a MemoryError, never a hang.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

import oracle
import poolfold
import poolfold.nhwc
from refusal import assert_refused_quickly

HUGE = 2**40
# Far below any machine's memory: calls whose geometry stays under it must be computed.
SMALL = 2**24

EMPTY_SHAPES = [(0, 2, 3, 3), (2, 0, 3, 3), (1, 1, 0, 3), (0, 2, 2**20, 2**20)]

POOL_ATTRIBUTES = [
    dict(kernel_shape=[3, 3], pads=[0, 0, HUGE, 0]),
    dict(kernel_shape=[3, 3], pads=[0, 0, 8, 0]),
    dict(kernel_shape=[2, 2], dilations=[HUGE, 1], pads=[HUGE, HUGE, 0, 0]),
    dict(kernel_shape=[1, 1], strides=[HUGE, HUGE]),
    dict(kernel_shape=[2**19, 2**19], pads=[2**19] * 4),
    dict(kernel_shape=[2**19, 1], pads=[2**19, 0, 2**19, 0]),
    dict(kernel_shape=[HUGE, 3], auto_pad="SAME_UPPER"),
    dict(kernel_shape=[2, 2], strides=[2, 2], ceil_mode=1, pads=[0, 0, 1, 1]),
]


def _extent(shape):
    """Elements of ``shape`` with its zero dims left out: numpy cannot make even an empty
    array whose other dims multiply past its index range, so a refusal is right there."""
    return math.prod(n for n in shape if n)


def _table_elements(spatial, kernel, out_shape):
    """A generous bound on what any table of a call may need: a row per output along each
    axis, and a whole window's taps."""
    return 3 * len(spatial) * max(out_shape) + math.prod(kernel)


def _pool_case(shape, attributes):
    """(expected Y shape or None if no window fits, whether the call is small enough that
    it must be computed), from the oracle's geometry alone."""
    spatial = shape[2:]
    geometry = oracle.max_pool_geometry(
        spatial, attributes["kernel_shape"], attributes.get("strides"), attributes.get("pads"),
        attributes.get("dilations"), attributes.get("auto_pad", "NOTSET"),
        attributes.get("ceil_mode", 0))
    if geometry is None:
        return None, False
    out = geometry[0]
    y_shape = shape[:2] + out
    small = (_extent(y_shape) < SMALL
             and _table_elements(spatial, attributes["kernel_shape"], out) < SMALL)
    return y_shape, small


def _check(call, expected_shape, small, oracle_call=None):
    if expected_shape is None:
        assert_refused_quickly(call, "no window fits")
        return
    try:
        result = call()
    except MemoryError as error:  # the defect this file is about
        pytest.fail(f"MemoryError instead of a result or a refusal: {error}")
    except poolfold.PoolfoldError as error:
        assert not small, f"a small call was refused: {error}"
        assert_refused_quickly(call, "more than this machine's memory")
        return
    outputs = result if isinstance(result, tuple) else (result,)
    for output in outputs:
        assert output.shape == expected_shape, (output.shape, expected_shape)
    if oracle_call is not None and outputs[0].size:
        for got, want in zip(outputs, oracle_call()):
            np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("shape", EMPTY_SHAPES)
@pytest.mark.parametrize("attributes", POOL_ATTRIBUTES)
@pytest.mark.parametrize("return_indices", [False, True])
def test_max_pool(shape, attributes, return_indices):
    x = np.zeros(shape, np.float32)
    expected, small = _pool_case(shape, attributes)
    # The oracle visits every tap of every window in Python: only where that is quick.
    quick = expected is not None and \
        math.prod(expected) * math.prod(attributes["kernel_shape"]) < 10**5
    _check(lambda: poolfold.max_pool(x, **attributes, return_indices=return_indices),
           expected, small,
           (lambda: oracle.max_pool(x, **attributes)[:2 if return_indices else 1]) if quick
           else None)


@pytest.mark.parametrize("shape", EMPTY_SHAPES)
@pytest.mark.parametrize("attributes", POOL_ATTRIBUTES)
def test_nhwc_max_pool(shape, attributes):
    x = np.zeros(shape, np.float32)
    expected, small = _pool_case(shape, attributes)
    channels_last = np.moveaxis(x, 1, -1).copy()
    if expected is not None:
        expected = (expected[0],) + expected[2:] + (expected[1],)
    _check(lambda: poolfold.nhwc.max_pool(channels_last, **attributes), expected, small)


@pytest.mark.parametrize("shape", EMPTY_SHAPES)
def test_max_pool_shape_needs_no_tables(shape):
    """The shape query plans the windows without building a table: even the huge ones."""
    got = poolfold.max_pool_shape(shape, [3, 3], pads=[0, 0, HUGE, 0])
    assert got == _pool_case(shape, dict(kernel_shape=[3, 3], pads=[0, 0, HUGE, 0]))[0]


UNPOOL_ATTRIBUTES = [
    dict(kernel_shape=[3, 3], strides=[HUGE, 1]),
    dict(kernel_shape=[HUGE, 3]),
    dict(kernel_shape=[3, 3], pads=[0, 0, 1, 1]),
]


def _unpool_shape(shape, attributes, output_shape=None):
    if output_shape is not None:
        return tuple(output_shape)
    r = len(shape) - 2
    strides = attributes.get("strides") or [1] * r
    pads = attributes.get("pads") or [0] * (2 * r)
    spatial = tuple((n - 1) * s + k - pads[a] - pads[a + r] for a, (n, k, s) in
                    enumerate(zip(shape[2:], attributes["kernel_shape"], strides)))
    return None if min(spatial) < 1 else shape[:2] + spatial


@pytest.mark.parametrize("shape", [(0, 2, 3, 3), (2, 0, 3, 3), (0, 2, 2**20, 2**20)])
@pytest.mark.parametrize("attributes", UNPOOL_ATTRIBUTES)
@pytest.mark.parametrize("huge_output_shape", [False, True])
def test_max_unpool(shape, attributes, huge_output_shape):
    x = np.zeros(shape, np.float32)
    indices = np.zeros(shape, np.int64)
    output_shape = list(shape[:2]) + [HUGE, HUGE] if huge_output_shape else None
    expected = _unpool_shape(shape, attributes, output_shape)
    small = expected is not None and _extent(expected) < SMALL
    call = lambda: poolfold.max_unpool(x, indices, **attributes, output_shape=output_shape)  # noqa: E731
    if expected is None:
        assert_refused_quickly(call, "< 1")
        return
    try:
        y = call()
    except poolfold.PoolfoldError as error:
        assert not small, error
        return
    assert y.shape == expected


@pytest.mark.parametrize("shape", [(0, 2, 3, 3), (2, 0, 3, 3)])
@pytest.mark.parametrize("attributes", UNPOOL_ATTRIBUTES)
def test_nhwc_max_unpool(shape, attributes):
    x = np.zeros(shape, np.float32)
    indices = np.zeros(shape, np.int64)  # I stays channels-first
    channels_last = np.moveaxis(x, 1, -1).copy()
    expected = _unpool_shape(shape, attributes)
    try:
        y = poolfold.nhwc.max_unpool(channels_last, indices, **attributes)
    except MemoryError as error:
        pytest.fail(f"MemoryError: {error}")
    except poolfold.PoolfoldError:
        assert expected is None or _extent(expected) >= SMALL
        return
    assert y.shape == (expected[0],) + expected[2:] + (expected[1],)


COL2IM_CASES = [
    # (input shape, image_shape, block_shape, pads)
    ((0, 4, HUGE), [HUGE, 1], [2, 2], [0, 0, 1, 1]),
    ((0, 4, 2**20), [2**10 + 1, 2**10 + 1], [2, 2], None),
    ((0, 0, 4), [HUGE, 1], [HUGE, 1], [0, 0, 0, 0]),
    ((2, 0, 1), [1, HUGE], [1, HUGE], None),
    ((0, 4, 9), [4, 4], [2, 2], None),
]


def _col2im_expected(shape, image, block, pads):
    r = len(image)
    pads = pads or [0] * (2 * r)
    grid = [(n + pads[a] + pads[a + r] - k) + 1 for a, (n, k) in enumerate(zip(image, block))]
    if min(grid) < 1 or math.prod(grid) != shape[2] or shape[1] % math.prod(block):
        return None
    return (shape[0], shape[1] // math.prod(block)) + tuple(image)


@pytest.mark.parametrize("case", COL2IM_CASES)
@pytest.mark.parametrize("dtype", [np.float32, np.int32, np.str_])
def test_col2im(case, dtype):
    shape, image, block, pads = case
    x = np.zeros(shape, dtype)
    expected = _col2im_expected(shape, image, block, pads)
    call = lambda: poolfold.col2im(x, image, block, pads=pads)  # noqa: E731
    if expected is None:
        assert_refused_quickly(call, "Col2Im")
        return
    try:
        y = call()
    except MemoryError as error:
        pytest.fail(f"MemoryError: {error}")
    except poolfold.PoolfoldError:
        assert _extent(expected) >= SMALL or max(image + block) >= SMALL
        assert_refused_quickly(call, "Col2Im")
        return
    assert y.shape == expected and y.dtype == x.dtype


# ------------------------------------------------------------------ the averaging family

# (function, keywords, the bound's kind): AveragePool counting the padding and not, LpPool,
# ai.onnx and channels-last.
WINDOWED = {
    "average_pool": (poolfold.average_pool, {}, "average"),
    "average_pool-cip": (poolfold.average_pool, {"count_include_pad": 1}, "average"),
    "lp_pool": (poolfold.lp_pool, {"p": 3}, "lp"),
    "nhwc.average_pool-cip": (poolfold.nhwc.average_pool, {"count_include_pad": 1}, "average"),
    "nhwc.lp_pool": (poolfold.nhwc.lp_pool, {}, "lp"),
}
# The oracle visits every tap of every window in Python: only where that is quick.
AVERAGING_ORACLE_TAPS = 20_000
# What a refusal for size may say: beyond memory, or (an empty array whose other dims
# multiply past numpy's index range) numpy's own words.
SIZE_WORDS = ("more than this machine's memory", "array is too big")


def _channels_last(shape):
    return (shape[0],) + tuple(shape[2:]) + (shape[1],)


def _check_averaging(call, expected_shape, small, oracle_call, kind):
    """As _check, the values within the contract's bound of the oracle's exact ones."""
    if expected_shape is None:
        assert_refused_quickly(call, "no window fits")
        return
    try:
        y = call()
    except MemoryError as error:  # the defect this file is about
        pytest.fail(f"MemoryError instead of a result or a refusal: {error}")
    except poolfold.PoolfoldError as error:
        assert not small, f"a small call was refused: {error}"
        assert any(words in str(error) for words in SIZE_WORDS), str(error)
        assert_refused_quickly(call)
        return
    assert y.shape == expected_shape and y.dtype == np.float32, (y.shape, y.dtype)
    if oracle_call is not None and y.size:
        want, info = oracle_call()
        oracle.assert_within_bound(y, want, info, np.float32, kind)


@pytest.mark.parametrize("shape", EMPTY_SHAPES)
@pytest.mark.parametrize("attributes", POOL_ATTRIBUTES)
@pytest.mark.parametrize("op", list(WINDOWED))
def test_average_and_lp_pool(op, shape, attributes):
    """An empty batch, or every window made of padding alone: AveragePool gives NaN (0 with
    count_include_pad where the padding counts), LpPool 0."""
    function, keywords, kind = WINDOWED[op]
    channels_last = op.startswith("nhwc.")
    x = np.zeros(shape, np.float32)
    expected, small = _pool_case(shape, attributes)
    oracle_call = None
    if expected is not None and math.prod(expected[2:]) * math.prod(
            attributes["kernel_shape"]) * (1 + shape[0] * shape[1]) < AVERAGING_ORACLE_TAPS:
        oracle_function = oracle.average_pool if kind == "average" else oracle.lp_pool
        oracle_call = lambda: oracle_function(x, **attributes, **keywords)  # noqa: E731
        if channels_last:
            oracle_call = _nhwc_oracle(oracle_call)
    data = np.moveaxis(x, 1, -1).copy() if channels_last else x
    if channels_last and expected is not None:
        expected = _channels_last(expected)
    _check_averaging(lambda: function(data, **attributes, **keywords), expected, small,
                     oracle_call, kind)


def _nhwc_oracle(oracle_call):
    def moved():
        want, info = oracle_call()
        return (np.moveaxis(want, 1, -1),
                oracle.BoundInfo(np.moveaxis(info.count, 1, -1), np.moveaxis(info.maxabs, 1, -1)))
    return moved


GLOBAL_SHAPES = EMPTY_SHAPES + [(2, 3, 2**10, 0), (0, 0, 5)]
GLOBALS = [
    (poolfold.global_max_pool, poolfold.nhwc.global_max_pool, oracle.global_max_pool, "max"),
    (poolfold.global_average_pool, poolfold.nhwc.global_average_pool,
     oracle.global_average_pool, "average"),
    (poolfold.global_lp_pool, poolfold.nhwc.global_lp_pool, oracle.global_lp_pool, "lp"),
]


@pytest.mark.parametrize("shape", GLOBAL_SHAPES)
def test_global_pools(shape):
    """Y is (N, C, 1, ..., 1) whatever the plane: -inf, NaN and 0 over an empty one."""
    x = np.zeros(shape, np.float32)
    for function, nhwc_function, oracle_function, kind in GLOBALS:
        for channels_last in (False, True):
            data = np.moveaxis(x, 1, -1).copy() if channels_last else x
            try:
                y = (nhwc_function if channels_last else function)(data)
            except MemoryError as error:
                pytest.fail(f"MemoryError: {error}")
            want, info = oracle_function(x)
            if channels_last:
                want = np.moveaxis(want, 1, -1)
                info = oracle.BoundInfo(np.moveaxis(info.count, 1, -1),
                                        np.moveaxis(info.maxabs, 1, -1))
            oracle.assert_within_bound(y, want, info, np.float32, kind)
