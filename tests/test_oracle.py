"""Tests of the test oracle (tests/oracle.py) itself, so that it can be trusted.

Three kinds of checks:
  * every spec-page example with a written-out answer (MaxPool, MaxUnpool, Col2Im);
  * hand-computed cases for the subtle rules of docs/semantics.md;
  * differential checks against onnxruntime, only where docs/semantics.md says ORT is right.
Nothing here imports poolfold.
"""

from __future__ import annotations

import math
import sys
import zlib
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import oracle  # noqa: E402

F32 = np.float32
BF16 = ml_dtypes.bfloat16

X5 = np.array(
    [[[[1, 2, 3, 4, 5],
       [6, 7, 8, 9, 10],
       [11, 12, 13, 14, 15],
       [16, 17, 18, 19, 20],
       [21, 22, 23, 24, 25]]]]
)
X4 = np.array(
    [[[[1, 2, 3, 4],
       [5, 6, 7, 8],
       [9, 10, 11, 12],
       [13, 14, 15, 16]]]]
)


def assert_same(actual, expected):
    """Same dtype, same shape, same bits (so -0.0 != 0.0 and NaN payloads count)."""
    actual = np.asarray(actual)
    expected = np.asarray(expected)
    assert actual.dtype == expected.dtype, (actual.dtype, expected.dtype)
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    if actual.dtype.kind in "OUS":
        assert actual.tolist() == expected.tolist()
        return
    # complex: compare the bits of the real and imaginary parts
    size = actual.dtype.itemsize // (2 if actual.dtype.kind == "c" else 1)
    width = f"u{size}"
    np.testing.assert_array_equal(np.ascontiguousarray(actual).view(width),
                                  np.ascontiguousarray(expected).view(width))


def f32_bits(bits):
    return np.array([bits], dtype=np.uint32).view(F32)[0]


# ==========================================================================
# Spec examples: MaxPool (MaxPool.txt)
# ==========================================================================


def test_spec_maxpool_2d_uint8():
    x = X5.astype(np.uint8)
    y_expected = np.array(
        [[[[13, 14, 15, 15, 15],
           [18, 19, 20, 20, 20],
           [23, 24, 25, 25, 25],
           [23, 24, 25, 25, 25],
           [23, 24, 25, 25, 25]]]]
    ).astype(np.uint8)
    y, _ = oracle.max_pool(x, [5, 5], pads=[2, 2, 2, 2])
    assert_same(y, y_expected)


def test_spec_maxpool_2d_precomputed_pads():
    x = X5.astype(F32)
    y_expected = np.array(
        [[[[13, 14, 15, 15, 15],
           [18, 19, 20, 20, 20],
           [23, 24, 25, 25, 25],
           [23, 24, 25, 25, 25],
           [23, 24, 25, 25, 25]]]]
    ).astype(F32)
    y, _ = oracle.max_pool(x, [5, 5], pads=[2, 2, 2, 2])
    assert_same(y, y_expected)


def test_spec_maxpool_with_argmax_2d_precomputed_pads():
    x = X5.astype(F32)
    y_expected = np.array(
        [[[[13, 14, 15, 15, 15],
           [18, 19, 20, 20, 20],
           [23, 24, 25, 25, 25],
           [23, 24, 25, 25, 25],
           [23, 24, 25, 25, 25]]]]
    ).astype(F32)
    z_expected = np.array(
        [[[[12, 13, 14, 14, 14],
           [17, 18, 19, 19, 19],
           [22, 23, 24, 24, 24],
           [22, 23, 24, 24, 24],
           [22, 23, 24, 24, 24]]]]
    ).astype(np.int64)
    y, z = oracle.max_pool(x, [5, 5], pads=[2, 2, 2, 2])
    assert_same(y, y_expected)
    assert_same(z, z_expected)


def test_spec_maxpool_2d_precomputed_strides():
    y, _ = oracle.max_pool(X5.astype(F32), [2, 2], strides=[2, 2])
    assert_same(y, np.array([[[[7, 9], [17, 19]]]]).astype(F32))


def test_spec_maxpool_with_argmax_2d_precomputed_strides():
    # storage_order=1: index = h + w*H
    y, z = oracle.max_pool(X5.astype(F32), [2, 2], strides=[2, 2], storage_order=1)
    assert_same(y, np.array([[[[7, 9], [17, 19]]]]).astype(F32))
    assert_same(z, np.array([[[[6, 16], [8, 18]]]]).astype(np.int64))


def test_spec_maxpool_2d_precomputed_same_upper():
    y, _ = oracle.max_pool(X5.astype(F32), [3, 3], strides=[2, 2], auto_pad="SAME_UPPER")
    assert_same(y, np.array([[[[7, 9, 10], [17, 19, 20], [22, 24, 25]]]]).astype(F32))


def test_spec_maxpool_2d_ceil():
    y, _ = oracle.max_pool(X4.astype(F32), [3, 3], strides=[2, 2], ceil_mode=True)
    assert_same(y, np.array([[[[11, 12], [15, 16]]]]).astype(F32))


def test_spec_maxpool_2d_dilations():
    y, _ = oracle.max_pool(X4.astype(F32), [2, 2], strides=[1, 1], dilations=[2, 2])
    assert_same(y, np.array([[[[11, 12], [15, 16]]]]).astype(F32))


# The random examples of the page compute their answer with a helper `pool`:
# pad X with NaN (pads from the example), then take the NaN-ignoring max of each
# kernel-sized window of the padded tensor starting at o*s.  `spec_pool_max`
# is that helper, written with numpy sliding windows (independent of the oracle).


def spec_pool_max(padded, kernel, strides, out_shape):
    r = len(kernel)
    axes = tuple(range(2, 2 + r))
    windows = np.lib.stride_tricks.sliding_window_view(padded, kernel, axis=axes)
    index = (slice(None), slice(None)) + tuple(
        slice(0, (o - 1) * s + 1, s) for o, s in zip(out_shape, strides))
    windows = windows[index]
    return np.nanmax(windows, axis=tuple(range(2 + r, 2 + 2 * r))).astype(padded.dtype)


def spec_valid_out(spatial, kernel, strides):
    # VALID: ceil((n - k + 1) / s), as the page writes it
    return [math.ceil((n - k + 1) / s) for n, k, s in zip(spatial, kernel, strides)]


def spec_same_out(spatial, strides):
    return [math.ceil(n / s) for n, s in zip(spatial, strides)]


@pytest.mark.parametrize(
    "shape, kernel, strides",
    [
        ((1, 3, 32), [2], [1]),  # _maxpool_1d_default
        ((1, 3, 32, 32), [2, 2], [1, 1]),  # _maxpool_2d_default
        ((1, 3, 32, 32, 32), [2, 2, 2], [1, 1, 1]),  # _maxpool_3d_default
        ((1, 3, 32, 32), [5, 5], [3, 3]),  # _maxpool_2d_strides
    ],
    ids=["1d_default", "2d_default", "3d_default", "2d_strides"],
)
def test_spec_maxpool_random_valid(shape, kernel, strides):
    rng = np.random.default_rng(1)
    x = rng.standard_normal(shape).astype(F32)
    out_shape = spec_valid_out(shape[2:], kernel, strides)
    y_expected = spec_pool_max(x, kernel, strides, out_shape)
    explicit_strides = None if strides == [1] * len(kernel) else strides
    y, _ = oracle.max_pool(x, kernel, strides=explicit_strides)
    assert_same(y, y_expected)


def test_spec_maxpool_2d_pads():
    rng = np.random.default_rng(2)
    x = rng.standard_normal((1, 3, 28, 28)).astype(F32)
    padded = np.pad(x, ((0, 0), (0, 0), (2, 2), (2, 2)), constant_values=np.nan)
    out_shape = spec_valid_out(padded.shape[2:], [3, 3], [1, 1])
    assert out_shape == [30, 30]
    y_expected = spec_pool_max(padded, [3, 3], [1, 1], out_shape)
    y, _ = oracle.max_pool(x, [3, 3], pads=[2, 2, 2, 2])
    assert_same(y, y_expected)


@pytest.mark.parametrize("auto_pad", ["SAME_UPPER", "SAME_LOWER"])
def test_spec_maxpool_2d_same(auto_pad):
    rng = np.random.default_rng(3)
    x = rng.standard_normal((1, 3, 32, 32)).astype(F32)
    kernel, strides = [2, 2], [1, 1]
    out_shape = spec_same_out(x.shape[2:], strides)
    pad_shape = [(o - 1) * s + k - n for o, s, k, n in zip(out_shape, strides, kernel, x.shape[2:])]
    if auto_pad == "SAME_UPPER":  # as in the page: extra pad at the end
        widths = [(p // 2, p - p // 2) for p in pad_shape]
    else:  # SAME_LOWER: extra pad at the beginning
        widths = [(p - p // 2, p // 2) for p in pad_shape]
    assert widths == ([(0, 1), (0, 1)] if auto_pad == "SAME_UPPER" else [(1, 0), (1, 0)])
    padded = np.pad(x, ((0, 0), (0, 0), *widths), constant_values=np.nan)
    y_expected = spec_pool_max(padded, kernel, strides, out_shape)
    y, _ = oracle.max_pool(x, kernel, auto_pad=auto_pad)
    assert_same(y, y_expected)


# ==========================================================================
# Spec examples: MaxUnpool (MaxUnpool.txt)
# ==========================================================================


def test_spec_maxunpool_without_output_shape():
    xT = np.array([[[[1, 2], [3, 4]]]], dtype=F32)
    xI = np.array([[[[5, 7], [13, 15]]]], dtype=np.int64)
    y_expected = np.array(
        [[[[0, 0, 0, 0], [0, 1, 0, 2], [0, 0, 0, 0], [0, 3, 0, 4]]]], dtype=F32)
    assert_same(oracle.max_unpool(xT, xI, [2, 2], strides=[2, 2]), y_expected)


def test_spec_maxunpool_with_output_shape_follows_semantics():
    # Documented divergence (docs/semantics.md, MaxUnpool): the page's example reads I
    # relative to the 4x4 shape inferred from kernel/strides and pastes that block at
    # the origin of the 5x5 output, giving 5,6,7,8 at (1,1),(1,3),(3,1),(3,3).
    # poolfold's contract (and ORT/PyTorch) reads I as flat positions in the 5x5
    # output itself: 5 -> (1,0), 7 -> (1,2), 13 -> (2,3), 15 -> (3,0).
    xT = np.array([[[[5, 6], [7, 8]]]], dtype=F32)
    xI = np.array([[[[5, 7], [13, 15]]]], dtype=np.int64)
    y = oracle.max_unpool(xT, xI, [2, 2], strides=[2, 2], output_shape=(1, 1, 5, 5))
    y_expected = np.array(
        [[[[0, 0, 0, 0, 0],
           [5, 0, 6, 0, 0],
           [0, 0, 0, 7, 0],
           [8, 0, 0, 0, 0],
           [0, 0, 0, 0, 0]]]], dtype=F32)
    assert_same(y, y_expected)
    # and it is *not* the page's answer
    page_answer = np.array(
        [[[[0, 0, 0, 0, 0],
           [0, 5, 0, 6, 0],
           [0, 0, 0, 0, 0],
           [0, 7, 0, 8, 0],
           [0, 0, 0, 0, 0]]]], dtype=F32)
    assert not np.array_equal(y, page_answer)


# ==========================================================================
# Spec examples: Col2Im (Col2Im.txt)
# ==========================================================================


def test_spec_col2im_default():
    x = np.array(
        [[[1.0, 6.0, 11.0, 16.0, 21.0],
          [2.0, 7.0, 12.0, 17.0, 22.0],
          [3.0, 8.0, 13.0, 18.0, 23.0],
          [4.0, 9.0, 14.0, 19.0, 24.0],
          [5.0, 0.0, 15.0, 20.0, 25.0]]]
    ).astype(F32)
    expected = np.array(
        [[[[1.0, 2.0, 3.0, 4.0, 5.0],
           [6.0, 7.0, 8.0, 9.0, 0.0],
           [11.0, 12.0, 13.0, 14.0, 15.0],
           [16.0, 17.0, 18.0, 19.0, 20.0],
           [21.0, 22.0, 23.0, 24.0, 25.0]]]]
    ).astype(F32)
    assert_same(oracle.col2im(x, [5, 5], [1, 5]), expected)


def test_spec_col2im_strides():
    x = np.array(
        [[[0.0, 0.0, 0.0, 0.0],
          [1.0, 1.0, 1.0, 1.0],
          [1.0, 1.0, 1.0, 1.0],
          [1.0, 1.0, 1.0, 1.0],
          [0.0, 0.0, 0.0, 0.0],
          [0.0, 0.0, 0.0, 0.0],
          [0.0, 0.0, 0.0, 0.0],
          [1.0, 1.0, 1.0, 1.0],
          [0.0, 0.0, 0.0, 0.0]]]
    ).astype(F32)
    expected = np.array(
        [[[[0.0, 1.0, 1.0, 1.0, 1.0],
           [1.0, 0.0, 1.0, 0.0, 0.0],
           [0.0, 2.0, 1.0, 2.0, 1.0],
           [1.0, 0.0, 1.0, 0.0, 0.0],
           [0.0, 1.0, 0.0, 1.0, 0.0]]]]
    ).astype(F32)
    assert_same(oracle.col2im(x, [5, 5], [3, 3], strides=[2, 2]), expected)


def test_spec_col2im_pads():
    # rows k = 0..4 hold 1+k, 6+k, 11+k, ... (15 blocks): the page's table
    x = np.array([[[float(1 + k + 5 * l) for l in range(15)] for k in range(5)]]).astype(F32)
    assert x[0, 0, :6].tolist() == [1.0, 6.0, 11.0, 16.0, 21.0, 26.0]
    assert x[0, 4, -1] == 75.0
    page_output = np.array(
        [[[[8.0, 21.0, 24.0, 27.0, 14.0],
           [38.0, 66.0, 69.0, 72.0, 54.0],
           [68.0, 111.0, 114.0, 117.0, 84.0],
           [98.0, 156.0, 159.0, 162.0, 114.0],
           [128.0, 201.0, 204.0, 207.0, 144.0]]]]
    ).astype(F32)
    # The page's output disagrees with its own input at (0, 4); docs/semantics.md wins.
    # nblk = [5, 3], pads begin (0, 1): out[h, w] += in[k, 3*h + lw] with w = lw - 1 + k.
    # (0, 4) receives (lw=1, k=4) -> in[4, 1] = 10 and (lw=2, k=3) -> in[3, 2] = 14,
    # so 24 (upstream onnx's page says 24 too); the same pattern in row 1 gives
    # in[4, 4] + in[3, 5] = 25 + 29 = 54, which the page does have.
    expected = page_output.copy()
    expected[0, 0, 0, 4] = 10.0 + 14.0
    assert_same(oracle.col2im(x, [5, 5], [1, 5], pads=[0, 1, 0, 1]), expected)


def test_spec_col2im_dilations():
    x = np.array(
        [[[1.0, 5.0, 9.0, 13.0, 17],
          [2.0, 6.0, 10.0, 14.0, 18],
          [3.0, 7.0, 11.0, 15.0, 19],
          [4.0, 8.0, 12.0, 16.0, 20]]]
    ).astype(F32)
    expected = np.array(
        [[[[1.0, 0.0, 0.0, 0.0, 0.0, 2.0],
           [8.0, 0.0, 0.0, 0.0, 0.0, 10.0],
           [16.0, 0.0, 0.0, 0.0, 0.0, 18.0],
           [24.0, 0.0, 0.0, 0.0, 0.0, 26.0],
           [32.0, 0.0, 0.0, 0.0, 0.0, 34.0],
           [19.0, 0.0, 0.0, 0.0, 0.0, 20.0]]]]
    ).astype(F32)
    assert_same(oracle.col2im(x, [6, 6], [2, 2], dilations=[1, 5]), expected)


def test_spec_col2im_5d():
    x = np.array(
        [[[1, 6, 11, 16, 21, 26, 31, 36, 41, 46, 51, 56],
          [2, 7, 12, 17, 22, 27, 32, 37, 42, 47, 52, 57],
          [3, 8, 13, 18, 23, 28, 33, 38, 43, 48, 53, 58],
          [4, 9, 14, 19, 24, 29, 34, 39, 44, 49, 54, 59],
          [5, 10, 15, 20, 25, 30, 35, 40, 45, 50, 55, 60],
          [61, 66, 71, 76, 81, 86, 91, 96, 101, 106, 111, 116],
          [62, 67, 72, 77, 82, 87, 92, 97, 102, 107, 112, 117],
          [63, 68, 73, 78, 83, 88, 93, 98, 103, 108, 113, 118],
          [64, 69, 74, 79, 84, 89, 94, 99, 104, 109, 114, 119],
          [65, 70, 75, 80, 85, 90, 95, 100, 105, 110, 115, 120]]]
    ).astype(F32)
    # the page's output is 1..120 laid out as (1, 2, 3, 4, 5)
    expected = np.arange(1, 121).reshape(1, 2, 3, 4, 5).astype(F32)
    assert_same(oracle.col2im(x, [3, 4, 5], [1, 1, 5]), expected)


# ==========================================================================
# Hand-computed cases: MaxPool
# ==========================================================================


def pool1d(values, kernel, dtype=F32, **kw):
    x = np.array(values, dtype=dtype).reshape(1, 1, -1)
    y, i = oracle.max_pool(x, kernel, **kw)
    return y.reshape(-1), i.reshape(-1)


def test_ceil_mode_adds_a_partial_window():
    # n=4, k=3, s=2: floor -> 1 window; ceil -> 2, the second starts at 2 (inside)
    y, i = pool1d([1, 2, 3, 4], [3], strides=[2])
    assert y.tolist() == [3] and i.tolist() == [2]
    y, i = pool1d([1, 2, 3, 4], [3], strides=[2], ceil_mode=True)
    assert y.tolist() == [3, 4] and i.tolist() == [2, 3]


def test_ceil_mode_drops_window_starting_in_right_padding():
    # n=4, k=3, s=2, pads [0, 2]: ceil(3/2)+1 = 3, but window 2 starts at 4 >= n+pb = 4
    y, i = pool1d([1, 2, 3, 4], [3], strides=[2], pads=[0, 2], ceil_mode=True)
    assert y.tolist() == [3, 4] and i.tolist() == [2, 3]
    # the rule looks at the begin pad: with pads [1, 1] window 2 starts at 4-1 = 3 < 5
    y, i = pool1d([1, 2, 3, 4], [3], strides=[2], pads=[1, 1], ceil_mode=True)
    assert y.tolist() == [2, 4, 4] and i.tolist() == [1, 3, 3]


def test_ceil_mode_window_longer_than_padded_input():
    # n=2, k=3, s=2: (n - K) = -1. Read literally, ceil(-1/2) + 1 = 1 window (taps 0, 1
    # and 2, the last in the right padding; ORT and the onnx reference agree), while
    # floor(-1/2) + 1 = 0 is "no window fits".
    y, i = pool1d([1, 2], [3], strides=[2], ceil_mode=True)
    assert y.tolist() == [2] and i.tolist() == [1]
    with pytest.raises(AssertionError):
        pool1d([1, 2], [3], strides=[2])


def test_ceil_mode_ignored_with_auto_pad():
    a = pool1d([1, 2, 3, 4, 5], [2], strides=[2], auto_pad="VALID")
    b = pool1d([1, 2, 3, 4, 5], [2], strides=[2], auto_pad="VALID", ceil_mode=True)
    assert a[0].tolist() == b[0].tolist() == [2, 4]
    a = pool1d([1, 2, 3, 4, 5], [3], strides=[2], auto_pad="SAME_UPPER")
    b = pool1d([1, 2, 3, 4, 5], [3], strides=[2], auto_pad="SAME_UPPER", ceil_mode=True)
    assert a[0].tolist() == b[0].tolist() == [2, 4, 5]


def test_same_lower_and_upper_with_odd_total():
    # n=6, k=3, s=2: out 3, total (3-1)*2+3-6 = 1
    x = [1, 6, 2, 5, 3, 4]
    y, i = pool1d(x, [3], strides=[2], auto_pad="SAME_LOWER")  # begin pad 1
    assert y.tolist() == [6, 6, 5] and i.tolist() == [1, 1, 3]
    y, i = pool1d(x, [3], strides=[2], auto_pad="SAME_UPPER")  # begin pad 0
    assert y.tolist() == [6, 5, 4] and i.tolist() == [1, 3, 5]


def test_same_with_dilation():
    # n=5, k=2, d=2 -> K=3, out 5, total 2, begin 1: taps at o-1 and o+1
    x = [1, 5, 2, 4, 3]
    for auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        y, i = pool1d(x, [2], dilations=[2], auto_pad=auto_pad)
        assert y.tolist() == [5, 2, 5, 3, 4] and i.tolist() == [1, 2, 1, 4, 3]
    # n=4, k=2, d=2, s=2 -> K=3, out 2, total 1 (odd)
    y, i = pool1d([1, 4, 2, 3], [2], strides=[2], dilations=[2], auto_pad="SAME_UPPER")
    assert y.tolist() == [2, 2] and i.tolist() == [2, 2]  # taps {0,2}, {2,4}
    y, i = pool1d([1, 4, 2, 3], [2], strides=[2], dilations=[2], auto_pad="SAME_LOWER")
    assert y.tolist() == [4, 4] and i.tolist() == [1, 1]  # taps {-1,1}, {1,3}


@pytest.mark.parametrize("dtype", [np.float16, F32, np.float64, BF16])
def test_empty_window_float(dtype):
    # k=1 with pads [1, 1]: the first and last windows hold only padding
    y, i = pool1d([1, 2], [1], dtype=dtype, pads=[1, 1])
    assert y.dtype == np.dtype(dtype)
    assert [float(v) for v in y] == [-math.inf, 1.0, 2.0, -math.inf]
    assert i.tolist() == [-1, 0, 1, -1]


@pytest.mark.parametrize("dtype, low", [(np.int8, -128), (np.uint8, 0)])
def test_empty_window_integer(dtype, low):
    y, i = pool1d([5, 7], [1], dtype=dtype, pads=[2, 1])
    assert y.dtype == np.dtype(dtype)
    assert y.tolist() == [low, low, 5, 7, low] and i.tolist() == [-1, -1, 0, 1, -1]


def test_empty_window_from_dilation_and_plane_offset():
    # n=2, k=2, d=4, pads [3, 3]: taps o-3 and o+1; windows 1 and 2 see only padding
    x = np.array([[[1.0, 2.0], [3.0, 4.0]]], dtype=F32)  # N=1, C=2
    y, i = oracle.max_pool(x, [2], dilations=[4], pads=[3, 3])
    assert y[0, 0].tolist() == [2.0, -math.inf, -math.inf, 1.0]
    assert i[0, 0].tolist() == [1, -1, -1, 0]
    assert y[0, 1].tolist() == [4.0, -math.inf, -math.inf, 3.0]
    assert i[0, 1].tolist() == [3, -1, -1, 2]  # plane offset 2, but -1 stays -1


def test_ties_first_in_window_order_wins():
    y, i = pool1d([3, 3, 1], [2])
    assert y.tolist() == [3, 3] and i.tolist() == [0, 1]
    # 2-D: window order is row-major over kernel offsets, whatever storage_order:
    # the 7 at (0,1) comes before the 7 at (1,0)
    x = np.array([[[[1, 7], [7, 1]]]], dtype=F32)
    _, i0 = oracle.max_pool(x, [2, 2])
    _, i1 = oracle.max_pool(x, [2, 2], storage_order=1)
    assert i0.reshape(-1).tolist() == [1]  # (0,1) row-major
    assert i1.reshape(-1).tolist() == [2]  # (0,1) column-major: 0 + 1*2
    y, i = pool1d([2, 2, 2], [3], dtype=np.int8)
    assert y.tolist() == [2] and i.tolist() == [0]


@pytest.mark.parametrize(
    "dtype, nan1, nan2",
    [
        (F32, 0x7FC00001, 0xFFC00002),
        (np.float64, 0x7FF8000000000001, 0xFFF8000000000002),
        (np.float16, 0x7E01, 0xFE02),
        (BF16, 0x7FC1, 0xFFC2),
    ],
)
def test_nan_first_nan_wins_with_payload(dtype, nan1, nan2):
    width = np.dtype(f"u{np.dtype(dtype).itemsize}")
    bits = np.array([0, nan1, 0, nan2], dtype=width)
    bits[0] = np.array([1.0], dtype=dtype).view(width)[0]
    bits[2] = np.array([5.0], dtype=dtype).view(width)[0]
    x = bits.view(dtype).reshape(1, 1, 4)  # [1, nan1, 5, nan2]
    y, i = oracle.max_pool(x, [2])
    assert y.view(width).reshape(-1).tolist() == [nan1, nan1, nan2]
    assert i.reshape(-1).tolist() == [1, 1, 3]
    y, i = oracle.max_pool(x, [4])
    assert y.view(width).reshape(-1).tolist() == [nan1] and i.reshape(-1).tolist() == [1]
    # a NaN after the maximum still wins
    y, i = oracle.max_pool(x[..., 2:], [2])
    assert y.view(width).reshape(-1).tolist() == [nan2] and i.reshape(-1).tolist() == [1]


def test_negative_zero_vs_zero_first_wins():
    y, i = pool1d([-0.0, 0.0], [2])
    assert math.copysign(1.0, float(y[0])) == -1.0 and i.tolist() == [0]
    y, i = pool1d([0.0, -0.0], [2])
    assert math.copysign(1.0, float(y[0])) == 1.0 and i.tolist() == [0]
    y, i = pool1d([-1.0, -0.0, 0.0], [3], dtype=BF16)
    assert math.copysign(1.0, float(y[0])) == -1.0 and i.tolist() == [1]


def test_storage_order_1_in_2d():
    x = np.array(
        [[[[1, 9, 2], [3, 4, 8]],
          [[0, 1, 2], [6, 5, 4]]]], dtype=F32)  # N=1, C=2, H=2, W=3
    y, i0 = oracle.max_pool(x, [2, 2])
    _, i1 = oracle.max_pool(x, [2, 2], storage_order=1)
    assert y.tolist() == [[[[9, 9]], [[6, 5]]]]
    # channel 0: 9 at (0,1), 9 at (0,1); channel 1: 6 at (1,0), 5 at (1,1); plane = 6
    assert i0.tolist() == [[[[1, 1]], [[6 + 3, 6 + 4]]]]  # h*W + w
    assert i1.tolist() == [[[[2, 2]], [[6 + 1, 6 + 3]]]]  # h + w*H


def test_storage_order_1_in_3d():
    x = np.zeros((1, 2, 2, 3, 4), dtype=F32)
    x[0, 0, 1, 2, 1] = 5.0
    x[0, 1, 0, 1, 3] = 7.0
    y, i0 = oracle.max_pool(x, [2, 3, 4])
    _, i1 = oracle.max_pool(x, [2, 3, 4], storage_order=1)
    assert y.reshape(-1).tolist() == [5.0, 7.0]
    # row-major: a*12 + b*4 + c; first-axis-fastest: a + b*2 + c*6; plane = 24
    assert i0.reshape(-1).tolist() == [1 * 12 + 2 * 4 + 1, 24 + 0 * 12 + 1 * 4 + 3]
    assert i1.reshape(-1).tolist() == [1 + 2 * 2 + 1 * 6, 24 + 0 + 1 * 2 + 3 * 6]


def test_4d_spatial_pool():
    x = np.arange(24, dtype=F32).reshape(1, 1, 2, 2, 2, 3)
    y, i0 = oracle.max_pool(x, [2, 2, 2, 2])
    _, i1 = oracle.max_pool(x, [2, 2, 2, 2], storage_order=1)
    assert y.shape == (1, 1, 1, 1, 1, 2)
    assert y.reshape(-1).tolist() == [22.0, 23.0]
    assert i0.reshape(-1).tolist() == [22, 23]  # (1,1,1,1), (1,1,1,2) row-major
    assert i1.reshape(-1).tolist() == [1 + 2 + 4 + 8, 1 + 2 + 4 + 16]
    # stride and pads in 4-D, brute force for Y
    x = -np.arange(3 * 2 * 3 * 2, dtype=F32).reshape(1, 1, 3, 2, 3, 2)
    y, i = oracle.max_pool(x, [2, 1, 2, 2], strides=[2, 1, 1, 1], pads=[1, 0, 0, 1, 0, 0, 1, 0])
    assert y.shape == (1, 1, 2, 2, 3, 2)
    # x decreases along every axis, so the winner is the smallest valid tap of each window
    assert y[0, 0, 0, 0, 0, 0] == x[0, 0, 0, 0, 0, 0] and i[0, 0, 0, 0, 0, 0] == 0
    # window (1,1,2,1): valid taps (1|2, 1, 2, 0|1); the first is (1,1,2,0)
    assert y[0, 0, 1, 1, 2, 1] == x[0, 0, 1, 1, 2, 0]
    assert i[0, 0, 1, 1, 2, 1] == 1 * 12 + 1 * 6 + 2 * 2 + 0
    assert np.array_equal(y.reshape(-1), x.reshape(-1)[i.reshape(-1)])


@pytest.mark.parametrize("shape", [(0, 3, 4, 4), (2, 0, 4, 4)])
def test_empty_batch_or_channels(shape):
    x = np.zeros(shape, dtype=F32)
    y, i = oracle.max_pool(x, [2, 2])
    assert y.shape == i.shape == (*shape[:2], 3, 3)
    assert y.dtype == F32 and i.dtype == np.int64
    u = oracle.max_unpool(y, i, [2, 2])
    assert u.shape == (*shape[:2], 4, 4)
    c = oracle.col2im(np.zeros((shape[0], shape[1] * 4, 9), F32), [4, 4], [2, 2])
    assert c.shape == (*shape[:2], 4, 4)


def test_maxpool_copies_bits_for_every_dtype():
    rng = np.random.default_rng(5)
    for dtype in (np.float16, F32, np.float64, BF16, np.int8, np.uint8):
        if np.dtype(dtype).kind in "iu":
            x = rng.integers(np.iinfo(dtype).min, np.iinfo(dtype).max, (2, 2, 5, 4)).astype(dtype)
        else:
            x = rng.standard_normal((2, 2, 5, 4)).astype(dtype)
        y, i = oracle.max_pool(x, [2, 3], strides=[2, 1], pads=[1, 1, 0, 1], ceil_mode=True)
        assert y.dtype == np.dtype(dtype)
        assert (i >= 0).all()
        assert_same(y.reshape(-1), x.reshape(-1)[i.reshape(-1)])


# ==========================================================================
# Hand-computed cases: MaxUnpool and Col2Im
# ==========================================================================


def test_maxunpool_duplicates_last_in_row_major_wins_and_bits_kept():
    x = np.array([[[[1.0, -0.0], [3.0, 4.0]]]], dtype=F32)
    ind = np.array([[[[2, 2], [0, 2]]]], dtype=np.int64)
    y = oracle.max_unpool(x, ind, [2, 2], strides=[1, 1])  # out 3x3
    assert y.shape == (1, 1, 3, 3)
    assert y.reshape(-1).tolist() == [3.0, 0.0, 4.0, 0, 0, 0, 0, 0, 0]
    ind = np.array([[[[0, 1], [5, 1]]]], dtype=np.int64)
    y = oracle.max_unpool(x, ind, [2, 2])
    assert math.copysign(1.0, float(y[0, 0, 0, 1])) == 1.0  # 4.0 overwrote -0.0
    assert y[0, 0, 0, 1] == 4.0
    ind = np.array([[[[0, 3], [5, 6]]]], dtype=np.int64)
    y = oracle.max_unpool(x, ind, [2, 2])
    assert math.copysign(1.0, float(y.reshape(-1)[3])) == -1.0


def test_maxunpool_indices_span_the_whole_tensor_and_range_is_asserted():
    x = np.array([[[1.0]], [[2.0]]], dtype=np.float64)  # N=2, C=1, 1-D of length 1
    ind = np.array([[[1]], [[2]]], dtype=np.int64)  # out (2,1,3): positions 0..5
    y = oracle.max_unpool(x, ind, [3])
    assert y.reshape(-1).tolist() == [0, 1, 2, 0, 0, 0]
    with pytest.raises(AssertionError):
        oracle.max_unpool(x, np.array([[[1]], [[6]]], dtype=np.int64), [3])
    with pytest.raises(AssertionError):
        oracle.max_unpool(x, np.array([[[-1]], [[2]]], dtype=np.int64), [3])


def test_maxpool_then_maxunpool_restores_maxima():
    rng = np.random.default_rng(6)
    x = rng.standard_normal((2, 3, 7, 5)).astype(F32)
    y, i = oracle.max_pool(x, [3, 2], strides=[2, 2], pads=[1, 0, 1, 1])
    u = oracle.max_unpool(y, i, [3, 2], strides=[2, 2], pads=[1, 0, 1, 1], output_shape=x.shape)
    assert u.shape == x.shape
    mask = np.zeros(x.size, dtype=bool)
    mask[i.reshape(-1)] = True
    assert np.array_equal(u.reshape(-1)[mask], x.reshape(-1)[mask])
    assert (u.reshape(-1)[~mask] == 0).all()


def col2im_three_taps(values, dtype):
    """1-D fold where image element 0 receives values[0], values[1], values[2] in
    increasing block order (l = 0, 1, 2) and nothing else is non-zero."""
    # image [3], block [3], pads [2, 2]: nblk 5, tap at l - 2 + k
    if np.dtype(dtype).kind in "OU":
        x = np.full((1, 3, 5), "", dtype=object)
    else:
        x = np.zeros((1, 3, 5), dtype=dtype)
    x[0, 2, 0], x[0, 1, 1], x[0, 0, 2] = values
    x = x.astype(dtype)
    return oracle.col2im(x, [3], [3], pads=[2, 2])


def test_col2im_float32_accumulates_block_offset_outer_in_float32():
    # Element 0 gets values[2] (k=0), then values[1] (k=1), then values[0] (k=2): numbers
    # are summed block offset outer, as onnxruntime and PyTorch do.
    out = col2im_three_taps([1e8, 1.0, -1e8], F32)  # -1e8 + 1 = -1e8 in float32, + 1e8 = 0
    assert out.dtype == F32 and out.reshape(-1).tolist() == [0.0, 0.0, 0.0]
    out = col2im_three_taps([1e8, 1.0, -1e8], np.float64)
    assert out.reshape(-1).tolist() == [1.0, 0.0, 0.0]
    out = col2im_three_taps([1.0, 1e8, -1e8], F32)  # -1e8 + 1e8 = 0, + 1 = 1
    assert out.reshape(-1).tolist() == [1.0, 0.0, 0.0]


@pytest.mark.parametrize("dtype", [np.float16, BF16])
def test_col2im_half_types_round_once(dtype):
    big = 2048.0 if dtype == np.float16 else 256.0  # spacing 2 above these
    out = col2im_three_taps([big, 1.0, 1.0], dtype)
    assert out.dtype == np.dtype(dtype)
    assert [float(v) for v in out.reshape(-1)] == [big + 2, 0.0, 0.0]


def test_col2im_complex():
    out = col2im_three_taps([1 + 2j, 3 - 1j, 0.5j], np.complex64)
    assert out.dtype == np.complex64 and out.reshape(-1).tolist() == [4 + 1.5j, 0, 0]


@pytest.mark.parametrize(
    "dtype, values, expected",
    [
        (np.int8, [100, 100, -50], -106),
        (np.uint8, [200, 100, 1], 45),
        (np.int64, [2**62, 2**62, 2**62], -(2**62)),
        (np.uint64, [2**63, 2**63, 5], 5),
        (np.int16, [-32768, -1, 0], 32767),
    ],
)
def test_col2im_integers_wrap(dtype, values, expected):
    out = col2im_three_taps(values, dtype)
    assert out.dtype == np.dtype(dtype)
    assert out.reshape(-1).tolist() == [expected, 0, 0]


def test_col2im_bool_is_or():
    assert col2im_three_taps([True, True, False], np.bool_).reshape(-1).tolist() == [True, False, False]
    assert col2im_three_taps([False, False, False], np.bool_).reshape(-1).tolist() == [False] * 3


@pytest.mark.parametrize("dtype", [object, str])
def test_col2im_strings_concatenate_in_block_order(dtype):
    out = col2im_three_taps(["a", "bc", "d"], dtype)
    assert out.dtype.kind == np.dtype(dtype).kind
    assert out.reshape(-1).tolist() == ["abcd", "", ""]


def test_col2im_strings_2d_and_untouched():
    # 2x2 image, 1x1 block, stride 2: nblk = [1, 1]; only (0,0) is touched
    x = np.array([[["x"], ["y"]]], dtype=object)  # N=1, C=2, L=1
    out = oracle.col2im(x, [2, 2], [1, 1], strides=[2, 2])
    assert out.tolist() == [[[["x", ""], ["", ""]], [["y", ""], ["", ""]]]]


def test_col2im_channel_outer_block_offset_inner():
    # C=2, block [1,2] (K=2), image [1,2]: one block; rows are c*K + k
    x = np.array([[[1], [2], [3], [4]]], dtype=np.int32)
    out = oracle.col2im(x, [1, 2], [1, 2])
    assert out.tolist() == [[[[1, 2]], [[3, 4]]]]


def test_col2im_negative_zero_sum_starts_from_zero():
    # accumulation starts from the zero of the output: 0.0 + -0.0 = +0.0
    out = col2im_three_taps([-0.0, 0.0, 0.0], F32)
    assert math.copysign(1.0, float(out.reshape(-1)[0])) == 1.0


# ==========================================================================
# Differential checks against onnxruntime (only where docs/semantics.md says ORT is right)
# ==========================================================================

def make_node(*args, **kwargs):
    helper = pytest.importorskip("onnx.helper")
    return helper.make_node(*args, **kwargs)


def run_ort(node, inputs, output_types, opset):
    """Run a one-node model on onnxruntime's CPU provider."""
    ort = pytest.importorskip("onnxruntime")
    from onnx import TensorProto, helper

    elem = {np.dtype(F32): TensorProto.FLOAT, np.dtype(np.int64): TensorProto.INT64}
    graph = helper.make_graph(
        [node], "g",
        [helper.make_tensor_value_info(name, elem[value.dtype], value.shape)
         for name, value in inputs.items()],
        [helper.make_tensor_value_info(name, elem[np.dtype(t)], None)
         for name, t in zip(node.output, output_types)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, inputs)


MAXPOOL_ORT_CASES = [
    # (shape, attributes) -- float32, pads < kernel, no SAME with dilation, no NaN
    ((2, 3, 11), dict(kernel_shape=[3], strides=[2], pads=[1, 1])),
    ((1, 2, 10), dict(kernel_shape=[2], dilations=[3], pads=[1, 0], ceil_mode=1)),
    ((1, 2, 9), dict(kernel_shape=[3], strides=[2], auto_pad="SAME_LOWER")),
    ((1, 2, 2), dict(kernel_shape=[3], strides=[2], ceil_mode=1)),  # K > n, ceil
    ((2, 3, 9, 8), dict(kernel_shape=[3, 2], strides=[2, 1], pads=[1, 0, 2, 1],
                        dilations=[1, 2], ceil_mode=1)),
    ((2, 3, 9, 8), dict(kernel_shape=[3, 2], strides=[2, 3], pads=[2, 1, 1, 1],
                        ceil_mode=1, storage_order=1)),
    ((1, 2, 7, 6), dict(kernel_shape=[3, 3], strides=[2, 2], auto_pad="SAME_UPPER")),
    ((1, 2, 8, 7), dict(kernel_shape=[2, 3], strides=[3, 2], auto_pad="SAME_LOWER",
                        storage_order=1)),
    ((1, 2, 7, 6), dict(kernel_shape=[3, 2], dilations=[2, 2], auto_pad="VALID")),
    ((1, 2, 5, 6, 7), dict(kernel_shape=[2, 3, 2], strides=[2, 2, 1],
                           pads=[1, 1, 0, 0, 1, 1], dilations=[1, 1, 2])),
    ((2, 1, 5, 4, 6), dict(kernel_shape=[3, 2, 2], strides=[1, 2, 2], ceil_mode=1,
                           pads=[1, 0, 1, 1, 1, 0], storage_order=1)),
    ((1, 2, 6, 5, 4), dict(kernel_shape=[2, 2, 3], strides=[2, 1, 2], auto_pad="SAME_UPPER")),
]


@pytest.mark.parametrize("shape, attrs", MAXPOOL_ORT_CASES)
def test_maxpool_matches_onnxruntime(shape, attrs):
    rng = np.random.default_rng(zlib.crc32(repr((shape, attrs)).encode()))
    x = rng.standard_normal(shape).astype(F32)
    node = make_node("MaxPool", ["x"], ["y", "i"], **attrs)
    y_ort, i_ort = run_ort(node, {"x": x}, [F32, np.int64], opset=12)
    y, i = oracle.max_pool(
        x, attrs["kernel_shape"], strides=attrs.get("strides"), pads=attrs.get("pads"),
        dilations=attrs.get("dilations"), auto_pad=attrs.get("auto_pad", "NOTSET"),
        ceil_mode=bool(attrs.get("ceil_mode", 0)), storage_order=attrs.get("storage_order", 0))
    assert_same(y, y_ort)
    assert_same(i, i_ort)


COL2IM_ORT_CASES = [
    ((2, 2 * 6, None), dict(image=[6, 7], block=[2, 3], pads=[1, 0, 0, 1],
                            strides=[2, 1], dilations=[1, 2])),
    ((1, 3 * 4, None), dict(image=[5, 5], block=[2, 2], strides=[1, 2], dilations=[2, 1])),
    ((1, 1 * 9, None), dict(image=[4, 6], block=[3, 3], pads=[2, 1, 1, 2], strides=[2, 2])),
]


@pytest.mark.parametrize("shape, attrs", COL2IM_ORT_CASES)
@pytest.mark.parametrize("integer_valued", [True, False])
def test_col2im_2d_matches_onnxruntime(shape, attrs, integer_valued):
    image, block = attrs["image"], attrs["block"]
    pads = attrs.get("pads", [0, 0, 0, 0])
    strides = attrs.get("strides", [1, 1])
    dilations = attrs.get("dilations", [1, 1])
    nblk = [(image[i] + pads[i] + pads[i + 2] - ((block[i] - 1) * dilations[i] + 1)) // strides[i] + 1
            for i in range(2)]
    rng = np.random.default_rng(7)
    full_shape = (shape[0], shape[1], nblk[0] * nblk[1])
    if integer_valued:  # exact sums: any addition order gives the same float32
        x = rng.integers(-8, 9, full_shape).astype(F32)
    else:
        x = rng.standard_normal(full_shape).astype(F32)
    node_attrs = {k: attrs[k] for k in ("pads", "strides", "dilations") if k in attrs}
    node = make_node("Col2Im", ["x", "image", "block"], ["y"], **node_attrs)
    (y_ort,) = run_ort(node, {"x": x, "image": np.array(image, np.int64),
                              "block": np.array(block, np.int64)}, [F32], opset=18)
    y = oracle.col2im(x, image, block, dilations=attrs.get("dilations"),
                      pads=attrs.get("pads"), strides=attrs.get("strides"))
    if integer_valued:
        assert_same(y, y_ort)
    else:
        assert y.dtype == y_ort.dtype and y.shape == y_ort.shape
        np.testing.assert_allclose(y, y_ort, rtol=1e-6, atol=1e-6)
