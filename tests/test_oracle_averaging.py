"""Hand-computed checks of the averaging-family oracles in tests/oracle.py.

The contract is docs/semantics.md, "The averaging family".  Every expected value below is
worked out by hand in the comment next to it; nothing here imports poolfold.  A few cases are
also checked against onnxruntime where the contract says ORT is right (float32 AveragePool
values).
"""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest

import oracle

F16 = np.dtype(np.float16)
F32 = np.dtype(np.float32)
F64 = np.dtype(np.float64)
BF16 = np.dtype(ml_dtypes.bfloat16)


def row(values, dtype=F64):
    """A 1-D signal as an (N=1, C=1, n) tensor."""
    return np.array(values, dtype=dtype).reshape(1, 1, -1)


def same(got, want):
    """float64 arrays equal, NaN where NaN."""
    got = np.asarray(got, dtype=np.float64)
    want = np.asarray(want, dtype=np.float64)
    assert got.shape == want.shape, (got.shape, want.shape)
    np.testing.assert_array_equal(got, want)  # treats NaN == NaN


# ---------------------------------------------------------------------------------- AveragePool


def test_average_1d_kernel_2():
    y, info = oracle.average_pool(row([1, 2, 3, 4]), [2])
    same(y[0, 0], [1.5, 2.5, 3.5])
    same(info.count[0, 0], [2, 2, 2])
    same(info.maxabs[0, 0], [2, 3, 4])


def test_average_pads_count_include_pad():
    # pads [1, 1], k=2: windows {-1,0} {0,1} {1,2} {2,3} {3,4}; taps -1 and 4 are padding.
    x = row([1, 2, 3, 4])
    y0, info = oracle.average_pool(x, [2], pads=[1, 1])
    same(y0[0, 0], [1 / 1, 1.5, 2.5, 3.5, 4 / 1])  # / |V|
    same(info.count[0, 0], [1, 2, 2, 2, 1])
    y1, _ = oracle.average_pool(x, [2], pads=[1, 1], count_include_pad=1)
    same(y1[0, 0], [1 / 2, 1.5, 2.5, 3.5, 4 / 2])  # / |P|, padded taps add 0


def test_average_ceil_mode_overhang_counts_nowhere():
    # 7x5 ramp x[h, w] = 5h + w, k=3x3, s=(3,1), ceil_mode: rows out = ceil((7-3)/3)+1 = 3
    # ((3-1)*3 = 6 < 7, kept), windows rows 0-2, 3-5, 6(-8); cols 0-2, 1-3, 2-4.
    # The last row window holds row 6 only: rows 7 and 8 are overhang (past n + pe = 7), so
    # they are in neither V nor P and both count_include_pad modes divide by 3.
    x = np.arange(35, dtype=np.float64).reshape(1, 1, 7, 5)
    # a full 3x3 window's mean is its centre: 5 * (3a + 1) + (b + 1)
    want = [[6, 7, 8], [21, 22, 23], [31, 32, 33]]  # row 2: mean(30,31,32) = 31, ...
    for cip in (0, 1):
        y, info = oracle.average_pool(x, [3, 3], strides=[3, 1], ceil_mode=1,
                                      count_include_pad=cip)
        same(y[0, 0], want)
        same(info.count[0, 0], [[9, 9, 9], [9, 9, 9], [3, 3, 3]])
    # position [2, 0] by hand: (30 + 31 + 32) / 3
    assert y[0, 0, 2, 0] == (30 + 31 + 32) / 3


def test_average_ceil_mode_with_end_pad():
    # n=4, k=3, s=2, pads [0, 1], ceil: out = ceil((4+1-3)/2)+1 = 2 ((2-1)*2 = 2 < 4, kept).
    # window 1: taps 2, 3 (in X), 4 (end pad, in P).  |V| = 2, |P| = 3.
    x = row([1, 2, 3, 4])
    y0, _ = oracle.average_pool(x, [3], strides=[2], pads=[0, 1], ceil_mode=1)
    same(y0[0, 0], [2.0, 3.5])
    y1, _ = oracle.average_pool(x, [3], strides=[2], pads=[0, 1], ceil_mode=1,
                                count_include_pad=1)
    same(y1[0, 0], [2.0, 7 / 3])
    # k=3, s=2, no pads, ceil: out = ceil(1/2)+1 = 2; window 1 is taps 2, 3 and overhang 4.
    y2, _ = oracle.average_pool(x, [3], strides=[2], ceil_mode=1, count_include_pad=1)
    same(y2[0, 0], [2.0, 3.5])  # the overhang is not in P


def test_average_ceil_mode_drop_rule():
    # n=5, k=2, s=2, pads [0, 1], ceil: ceil((5+1-2)/2)+1 = 3; (3-1)*2 = 4 < 5: kept.
    y, _ = oracle.average_pool(row([1, 2, 3, 4, 5]), [2], strides=[2], pads=[0, 1], ceil_mode=1)
    same(y[0, 0], [1.5, 3.5, 5.0])
    # n=4, k=1, s=2, pads [0, 2], ceil: ceil((4+2-1)/2)+1 = 4; (4-1)*2 = 6 >= 4: dropped -> 3
    y, _ = oracle.average_pool(row([1, 2, 3, 4]), [1], strides=[2], pads=[0, 2], ceil_mode=1)
    same(y[0, 0], [1.0, 3.0, math.nan])  # window 2 sits at 4: all padding


def test_average_empty_window_pads_beyond_kernel():
    # k=1, pads [2, 0]: out = 2+2-1+1 = 4, windows at -2, -1 (padding only), 0, 1.
    x = row([1, 2])
    y0, info = oracle.average_pool(x, [1], pads=[2, 0])
    same(y0[0, 0], [math.nan, math.nan, 1, 2])  # 0/0
    same(info.count[0, 0], [0, 0, 1, 1])
    y1, _ = oracle.average_pool(x, [1], pads=[2, 0], count_include_pad=1)
    same(y1[0, 0], [0, 0, 1, 2])


def test_average_empty_window_by_dilation():
    # n=3, k=2, d=3, pads [1, 1]: K = 4, out = 3+2-4+1 = 2; window 0 taps -1, 2; window 1 taps
    # 0, 3 -> |V| = 1 each; |P| = 2 each.
    x = row([10, 20, 30])
    y0, _ = oracle.average_pool(x, [2], dilations=[3], pads=[1, 1])
    same(y0[0, 0], [30, 10])
    y1, _ = oracle.average_pool(x, [2], dilations=[3], pads=[1, 1], count_include_pad=1)
    same(y1[0, 0], [15, 5])


def test_average_same_pads_count_as_pads():
    # n=5, k=2, s=1: out 5, total = 4+2-5 = 1.  SAME_UPPER: end pad 1, SAME_LOWER: begin pad 1.
    x = row([2, 4, 6, 8, 10])
    y, _ = oracle.average_pool(x, [2], auto_pad="SAME_UPPER", count_include_pad=1)
    same(y[0, 0], [3, 5, 7, 9, 10 / 2])
    y, _ = oracle.average_pool(x, [2], auto_pad="SAME_UPPER")
    same(y[0, 0], [3, 5, 7, 9, 10])
    y, _ = oracle.average_pool(x, [2], auto_pad="SAME_LOWER", count_include_pad=1)
    same(y[0, 0], [2 / 2, 3, 5, 7, 9])
    y, _ = oracle.average_pool(x, [2], auto_pad="VALID")
    same(y[0, 0], [3, 5, 7, 9])
    # SAME with a dilation: n=4, k=2, d=2 (K=3), s=1: out 4, total = 3+3-4 = 2; UPPER: 1 / 1.
    y, _ = oracle.average_pool(row([1, 2, 3, 4]), [2], dilations=[2], auto_pad="SAME_UPPER",
                               count_include_pad=1)
    same(y[0, 0], [2 / 2, 4 / 2, 6 / 2, 3 / 2])  # taps (-1,1) (0,2) (1,3) (2,4)


def test_average_2d_pads_and_counts():
    # 2x2 ones, k=2x2, pads 1 all round: 3x3 outputs; corners see 1 tap, edges 2, centre 4.
    x = np.ones((1, 1, 2, 2))
    y1, info = oracle.average_pool(x, [2, 2], pads=[1, 1, 1, 1], count_include_pad=1)
    same(info.count[0, 0], [[1, 2, 1], [2, 4, 2], [1, 2, 1]])
    same(y1[0, 0], [[0.25, 0.5, 0.25], [0.5, 1, 0.5], [0.25, 0.5, 0.25]])
    y0, _ = oracle.average_pool(x, [2, 2], pads=[1, 1, 1, 1])
    same(y0[0, 0], np.ones((3, 3)))


def test_average_nan_and_inf():
    x = row([1, math.nan, 3, math.inf, -math.inf, 5])
    y, info = oracle.average_pool(x, [2])
    # windows (1,nan) (nan,3) (3,inf) (inf,-inf) (-inf,5)
    same(y[0, 0], [math.nan, math.nan, math.inf, math.nan, -math.inf])
    same(info.maxabs[0, 0], [1, 3, 3, 0, 5])  # max over the finite taps


def test_average_is_exact_not_a_float_sum():
    # 1e16 + 1 - 1e16 is 0 in float64 left to right; exactly, the mean is 1/3.
    y, _ = oracle.average_pool(row([1e16, 1.0, -1e16]), [3])
    assert y[0, 0, 0] == 1 / 3
    # float64 near its largest: the sum leaves the range, the mean does not.
    big = np.finfo(F64).max
    y, _ = oracle.average_pool(row([big, big, big]), [3])
    assert y[0, 0, 0] == big


def test_average_batches_channels_and_empty():
    x = np.arange(2 * 3 * 4, dtype=np.float32).reshape(2, 3, 4)
    y, _ = oracle.average_pool(x, [2], strides=[2])
    same(y, (x[:, :, 0::2].astype(np.float64) + x[:, :, 1::2]) / 2)
    y, info = oracle.average_pool(np.zeros((0, 3, 4), np.float32), [2])
    assert y.shape == (0, 3, 3) and info.count.shape == (0, 3, 3)
    y, _ = oracle.average_pool(np.zeros((2, 0, 4, 4), np.float32), [2, 2])
    assert y.shape == (2, 0, 3, 3)


def test_average_3d():
    # 2x2x2 cube of 0..7, k=2x2x2: one window, mean 3.5; with pads on the first axis only
    # (pads [1,0,0,0,0,0]) two windows: {-1,0} -> mean(0..3) = 1.5 over |V| = 4, and 3.5.
    x = np.arange(8, dtype=np.float64).reshape(1, 1, 2, 2, 2)
    y, _ = oracle.average_pool(x, [2, 2, 2])
    same(y.reshape(-1), [3.5])
    y, info = oracle.average_pool(x, [2, 2, 2], pads=[1, 0, 0, 0, 0, 0], count_include_pad=1)
    same(y.reshape(-1), [6 / 8, 3.5])
    same(info.count.reshape(-1), [4, 8])


# ---------------------------------------------------------------------------------- LpPool


def test_lp_small_values():
    # |3|,|-4| -> p=2: 5; p=1: 7; p=3: cbrt(27 + 64) = cbrt(91)
    x = row([3, -4])
    same(oracle.lp_pool(x, [2], p=2)[0].reshape(-1), [5])
    same(oracle.lp_pool(x, [2], p=1)[0].reshape(-1), [7])
    got = oracle.lp_pool(x, [2], p=3)[0].reshape(-1)[0]
    assert abs(got - 91 ** (1 / 3)) <= 2 * math.ulp(got)
    # a float p (LpPool-1): p=0.5 -> (sqrt 3 + sqrt 4)^2 = 7 + 4 sqrt 3
    got = oracle.lp_pool(x, [2], p=0.5)[0].reshape(-1)[0]
    assert abs(got - (7 + 4 * math.sqrt(3))) <= 4 * math.ulp(got)


def test_lp_large_float32_does_not_overflow():
    # a 2x2 window of float32(1e20): sqrt(4 * v^2) = 2 v, although v^2 overflows float32.
    v = float(np.float32(1e20))
    x = np.full((1, 1, 2, 2), 1e20, dtype=np.float32)
    y, info = oracle.lp_pool(x, [2, 2], p=2)
    assert y.reshape(-1)[0] == 2 * v  # ~2e20
    assert info.count.reshape(-1)[0] == 4
    y, _ = oracle.lp_pool(x, [2, 2], p=1)
    assert y.reshape(-1)[0] == 4 * v


def test_lp_tiny_float32_does_not_underflow():
    v = float(np.float32(1e-30))
    x = np.full((1, 1, 2, 2), 1e-30, dtype=np.float32)
    y, _ = oracle.lp_pool(x, [2, 2], p=2)
    assert y.reshape(-1)[0] == 2 * v  # v^2 = 1e-60 is below float32's range
    y, _ = oracle.lp_pool(x, [2, 2], p=3)
    got = y.reshape(-1)[0]
    assert abs(got - v * 4 ** (1 / 3)) <= 2 * math.ulp(got)


def test_lp_float64_extremes():
    y, _ = oracle.lp_pool(row([1e200, -1e200, 1e200, 1e200]), [4], p=2)
    assert y[0, 0, 0] == 2e200
    # past float64's range: inf
    big = np.finfo(F64).max
    y, _ = oracle.lp_pool(row([big, big]), [2], p=2)
    assert y[0, 0, 0] == math.inf


def test_lp_empty_nan_inf_and_pads():
    # k=1, pads [1, 1]: windows at -1 (empty -> 0), 0, 1, 2 (empty -> 0)
    y, info = oracle.lp_pool(row([-3, 4]), [1], p=2, pads=[1, 1])
    same(y[0, 0], [0, 3, 4, 0])
    same(info.count[0, 0], [0, 1, 1, 0])
    # padded taps add nothing: k=2 pads [1,1] over [-3, 4] -> 3, 5, 4
    y, _ = oracle.lp_pool(row([-3, 4]), [2], p=2, pads=[1, 1])
    same(y[0, 0], [3, 5, 4])
    # NaN propagates, inf gives inf, -inf too, NaN beats inf
    y, _ = oracle.lp_pool(row([1, math.nan, 2, -math.inf, 1]), [2], p=2)
    same(y[0, 0], [math.nan, math.nan, math.inf, math.inf])
    y, _ = oracle.lp_pool(row([math.inf, math.nan]), [2], p=1)
    same(y[0, 0], [math.nan])


def test_lp_ceil_mode():
    # n=5, k=2, s=2, ceil: out 3, last window tap 4 + overhang 5: sqrt(x4^2) = |x4|
    y, _ = oracle.lp_pool(row([3, 4, 6, 8, -5]), [2], p=2, strides=[2], ceil_mode=1)
    same(y[0, 0], [5, 10, 5])


# ---------------------------------------------------------------------------------- global


def test_global_ops():
    x = np.arange(6, dtype=np.float64).reshape(1, 1, 2, 3)  # 0..5
    y, info = oracle.global_max_pool(x)
    same(y, np.full((1, 1, 1, 1), 5.0))
    y, info = oracle.global_average_pool(x)
    same(y, np.full((1, 1, 1, 1), 2.5))
    assert info.count.reshape(-1)[0] == 6 and info.maxabs.reshape(-1)[0] == 5
    y, _ = oracle.global_lp_pool(x, p=2)
    assert y.reshape(-1)[0] == math.sqrt(55)  # 0+1+4+9+16+25
    y, _ = oracle.global_lp_pool(x, p=1)
    assert y.reshape(-1)[0] == 15


def test_global_ops_rank_1_and_4():
    x = np.array([[[1.0, -7.0, 2.0]], [[0.5, 0.25, 0.25]]])  # N=2, C=1, n=3
    same(oracle.global_max_pool(x)[0].reshape(-1), [2.0, 0.5])
    same(oracle.global_average_pool(x)[0].reshape(-1), [-4 / 3, 1 / 3])
    x4 = np.ones((1, 2, 2, 1, 3, 2))
    y, info = oracle.global_average_pool(x4)
    assert y.shape == (1, 2, 1, 1, 1, 1) and (y == 1).all() and (info.count == 12).all()


def test_global_ops_zero_size_plane_and_specials():
    x = np.zeros((1, 2, 0, 3), dtype=np.float32)
    y, _ = oracle.global_max_pool(x)
    same(y, np.full((1, 2, 1, 1), -math.inf))
    y, _ = oracle.global_average_pool(x)
    same(y, np.full((1, 2, 1, 1), math.nan))
    y, _ = oracle.global_lp_pool(x)
    same(y, np.zeros((1, 2, 1, 1)))
    x = np.array([[[1.0, math.nan, 2.0], [math.inf, -math.inf, 0.0], [-1.0, -math.inf, -2.0]]])
    x = x.reshape(1, 3, 3)  # three channels
    same(oracle.global_max_pool(x)[0].reshape(-1), [math.nan, math.inf, -1.0])
    same(oracle.global_average_pool(x)[0].reshape(-1), [math.nan, math.nan, -math.inf])
    same(oracle.global_lp_pool(x)[0].reshape(-1), [math.nan, math.inf, math.inf])
    assert oracle.global_average_pool(np.zeros((0, 3, 2)))[0].shape == (0, 3, 1)


# ---------------------------------------------------------------------------------- the bound


def test_ulp():
    assert oracle.ulp(1.0, F32) == 2.0 ** -23
    assert oracle.ulp(1.0, F16) == 2.0 ** -10
    assert oracle.ulp(1.0, BF16) == 2.0 ** -7  # 2^(e-7), e = 0
    assert oracle.ulp(1.0, F64) == 2.0 ** -52
    assert oracle.ulp(3.0, BF16) == 2.0 ** -6
    assert oracle.ulp(-1e-3, F16) == 2.0 ** -20  # 1e-3 in [2^-10, 2^-9)
    assert oracle.ulp(0.0, F16) == 2.0 ** -24  # the subnormal spacing
    assert oracle.ulp(1e-40, F32) == 2.0 ** -149


def _one(value):
    return np.array([[[value]]], dtype=np.float64)


def _info(count, maxabs):
    return oracle.BoundInfo(np.array([[[count]]]), np.array([[[maxabs]]], dtype=np.float64))


def test_bound_average_accepts_and_rejects():
    exact = _one(1.0)
    info = _info(1, 1.0)  # bound = 2 * 2^-23 + 2^-24 = 5 * 2^-24
    ok = np.array([[[1.0 + 2 * 2.0 ** -23]]], dtype=np.float32)
    oracle.assert_within_bound(ok, exact, info, F32, "average")
    bad = np.array([[[1.0 + 3 * 2.0 ** -23]]], dtype=np.float32)
    with pytest.raises(AssertionError, match="outside the bound"):
        oracle.assert_within_bound(bad, exact, info, F32, "average")
    # a larger |V| * max|x| widens it
    oracle.assert_within_bound(bad, exact, _info(8, 1.0), F32, "average")
    # dtype and shape must match
    with pytest.raises(AssertionError):
        oracle.assert_within_bound(ok.astype(F64), exact, info, F32, "average")
    with pytest.raises(AssertionError):
        oracle.assert_within_bound(ok.reshape(1, 1, 1, 1), exact, info, F32, "average")


def test_bound_specials():
    info = _info(2, 1.0)
    nan = np.array([[[math.nan]]], dtype=np.float32)
    one = np.array([[[1.0]]], dtype=np.float32)
    inf = np.array([[[math.inf]]], dtype=np.float32)
    oracle.assert_within_bound(nan, _one(math.nan), info, F32, "average")
    with pytest.raises(AssertionError):
        oracle.assert_within_bound(one, _one(math.nan), info, F32, "average")
    with pytest.raises(AssertionError):
        oracle.assert_within_bound(nan, _one(1.0), info, F32, "average")
    oracle.assert_within_bound(inf, _one(math.inf), info, F32, "lp")
    with pytest.raises(AssertionError):
        oracle.assert_within_bound(-inf, _one(math.inf), info, F32, "lp")
    with pytest.raises(AssertionError):
        oracle.assert_within_bound(inf, _one(1.0), info, F32, "lp")
    # past float16's largest (65504): inf of the same sign allowed
    big = _one(120000.0)
    oracle.assert_within_bound(np.array([[[math.inf]]], F16), big, info, F16, "lp")
    with pytest.raises(AssertionError):
        oracle.assert_within_bound(np.array([[[-math.inf]]], F16), big, info, F16, "lp")


def test_bound_lp_and_bfloat16():
    # LpPool: 2 ulp_T(exact) + (|V| + 2) u exact; bfloat16 at 1.0: 2 * 2^-7 + 4 * 2^-24
    exact = _one(1.0)
    info = _info(2, 1.0)
    oracle.assert_within_bound(np.array([[[1.0 + 2 * 2.0 ** -7]]], BF16), exact, info, BF16, "lp")
    with pytest.raises(AssertionError):
        oracle.assert_within_bound(np.array([[[1.0 + 3 * 2.0 ** -7]]], BF16), exact, info, BF16,
                                   "lp")
    # max: exact equality
    oracle.assert_within_bound(np.array([[[1.0]]], F16), exact, info, F16, "max")
    with pytest.raises(AssertionError):
        oracle.assert_within_bound(np.array([[[1.0009765625]]], F16), exact, info, F16, "max")


# ---------------------------------------------------------------------------------- vs ORT

ort = pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper  # noqa: E402


def _ort_average_pool(x, **attrs):
    node = helper.make_node("AveragePool", ["x"], ["y"], **attrs)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                         x.shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])
    model.ir_version = 8
    options = ort.SessionOptions()
    options.log_severity_level = 3
    session = ort.InferenceSession(model.SerializeToString(), options,
                                   providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x})[0]


@pytest.mark.parametrize("attrs", [
    dict(kernel_shape=[3, 3], strides=[3, 1], ceil_mode=1),
    dict(kernel_shape=[3, 3], strides=[3, 1], ceil_mode=1, count_include_pad=1),
    dict(kernel_shape=[2, 3], pads=[1, 1, 1, 2], count_include_pad=1),
    dict(kernel_shape=[2, 3], pads=[1, 1, 1, 2], strides=[2, 2], ceil_mode=1),
    dict(kernel_shape=[2, 2], auto_pad="SAME_LOWER", count_include_pad=1, strides=[2, 1]),
])
def test_oracle_matches_onnxruntime(attrs):
    x = np.random.default_rng(7).standard_normal((2, 2, 7, 5)).astype(np.float32)
    want = _ort_average_pool(x, **attrs)
    args = {k: v for k, v in attrs.items() if k != "kernel_shape"}
    y, info = oracle.average_pool(x, attrs["kernel_shape"], **args)
    oracle.assert_within_bound(want, y, info, F32, "average")
