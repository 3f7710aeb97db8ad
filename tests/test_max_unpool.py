"""poolfold.max_unpool against the slow oracle (tests/oracle.py), bit for bit, plus the round
trip through max_pool, the spec page's examples and the error cases of docs/semantics.md.

Float tensors are drawn as raw bit patterns (every NaN payload, -0.0, subnormals, infinities),
so "bit for bit" really means it: MaxUnpool only moves elements, it never computes with them.
"""

from __future__ import annotations

import math
import time

import ml_dtypes
import numpy as np
import pytest
from hypothesis import assume, given, note, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import oracle
from refusal import assert_refused_quickly
import poolfold
from poolfold import PoolfoldError, PoolfoldTypeError

BF16 = np.dtype(ml_dtypes.bfloat16)
F16, F32, F64 = np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64)
# opset -> version it selects (None: the latest)
OPSETS = {9: 9, 10: 9, 11: 11, 12: 11, 21: 11, 22: 22, 23: 22, None: 22}


def dtypes_of(version):
    return (F16, F32, F64, BF16) if version >= 22 else (F16, F32, F64)


def assert_same(actual, expected):
    """Same dtype, same shape, same bits (-0.0 != 0.0, NaN payloads count)."""
    assert isinstance(actual, np.ndarray)
    assert actual.dtype == expected.dtype, (actual.dtype, expected.dtype)
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    width = np.dtype(f"u{expected.dtype.itemsize}")
    np.testing.assert_array_equal(np.ascontiguousarray(actual).view(width),
                                  np.ascontiguousarray(expected).view(width))


def raw_floats(shape, dtype):
    """Arrays of `dtype` with arbitrary bit patterns."""
    width = np.dtype(f"u{np.dtype(dtype).itemsize}")
    return hnp.arrays(width, shape).map(lambda a: a.view(dtype))


def layout(draw, a):
    """`a` itself, or the same values in a Fortran-ordered or non-contiguous array."""
    kind = draw(st.sampled_from(["c", "f", "strided"]))
    if kind == "f":
        return np.asfortranarray(a)
    if kind == "strided" and a.ndim:
        big = np.zeros(a.shape[:-1] + (2 * a.shape[-1],), a.dtype)
        big[..., ::2] = a
        return big[..., ::2]
    return a


@st.composite
def unpool_geometry(draw, max_rank=4):
    """(x_shape, kernel, strides, pads) with an inferred output size >= 1 on every axis."""
    rank = draw(st.integers(1, max_rank))
    dim_max = {1: 4, 2: 3, 3: 3, 4: 2}[rank]
    n = draw(st.integers(0, 2) if draw(st.integers(0, 9)) == 0 else st.integers(1, 2))
    c = draw(st.integers(0, 2) if draw(st.integers(0, 9)) == 0 else st.integers(1, 2))
    spatial, kernel, strides, begins, ends = [], [], [], [], []
    for _ in range(rank):
        d = draw(st.integers(1, dim_max))
        k = draw(st.integers(1, 3))
        s = draw(st.integers(1, 3))
        room = (d - 1) * s + k - 1  # pb + pe <= room keeps the inferred size >= 1
        pb = draw(st.integers(0, min(2, room)))
        pe = draw(st.integers(0, min(2, room - pb)))
        spatial.append(d)
        kernel.append(k)
        strides.append(s)
        begins.append(pb)
        ends.append(pe)
    return (n, c, *spatial), kernel, strides, begins + ends


def inferred_shape(x_shape, kernel, strides, pads):
    r = len(kernel)
    return tuple(x_shape[:2]) + tuple(
        (x_shape[2 + i] - 1) * strides[i] + kernel[i] - pads[i] - pads[r + i] for i in range(r)
    )


@st.composite
def index_array(draw, x_shape, out_shape):
    """int64 indices of X's shape into the flat output: plane-local (as MaxPool makes them,
    with duplicates inside a plane), anywhere (cross-plane), or a handful of shared targets
    (heavy duplicates across planes)."""
    planes = x_shape[0] * x_shape[1]
    plane_out = math.prod(out_shape[2:])
    total = planes * plane_out
    if total == 0:
        return np.zeros(x_shape, np.int64)
    mode = draw(st.sampled_from(["plane", "any", "shared"]))
    if mode == "plane":
        local = draw(hnp.arrays(np.int64, x_shape, elements=st.integers(0, plane_out - 1)))
        offsets = (np.arange(planes, dtype=np.int64) * plane_out).reshape(
            x_shape[:2] + (1,) * (len(x_shape) - 2))
        ind = local + offsets
    elif mode == "any":
        ind = draw(hnp.arrays(np.int64, x_shape, elements=st.integers(0, total - 1)))
    else:
        targets = draw(st.lists(st.integers(0, total - 1), min_size=1, max_size=3))
        ind = draw(hnp.arrays(np.int64, x_shape, elements=st.sampled_from(targets)))
    note(f"index mode {mode}")
    return ind


def as_shape_input(draw, shape):
    kind = draw(st.sampled_from(["list", "tuple", "array"]))
    if kind == "array":
        return np.array(shape, np.int64)
    return list(shape) if kind == "list" else tuple(shape)


# --------------------------------------------------------------------------------------
# Against the oracle
# --------------------------------------------------------------------------------------


@st.composite
def unpool_case(draw, with_output_shape):
    opset = draw(st.sampled_from(list(OPSETS)))
    version = OPSETS[opset]
    dtype = draw(st.sampled_from(dtypes_of(version)))
    x_shape, kernel, strides, pads = draw(unpool_geometry())
    rank = len(kernel)
    if with_output_shape:
        out_spatial = tuple(draw(st.integers(1, 5)) for _ in range(rank))
        out_shape = tuple(x_shape[:2]) + out_spatial
    else:
        out_shape = inferred_shape(x_shape, kernel, strides, pads)
    x = draw(raw_floats(x_shape, dtype))
    ind = draw(index_array(x_shape, out_shape))
    kwargs = {}
    if draw(st.booleans()) or strides != [1] * rank:
        kwargs["strides"] = strides
    if draw(st.booleans()) or any(pads):
        kwargs["pads"] = pads
    if opset is not None:
        kwargs["opset"] = opset
    if with_output_shape:
        kwargs["output_shape"] = as_shape_input(draw, out_shape)
    return x, ind, kernel, kwargs, version, out_shape


def run_against_oracle(x, ind, kernel, kwargs, out_shape, data):
    expected = oracle.max_unpool(x, ind, kernel, strides=kwargs.get("strides"),
                                 pads=kwargs.get("pads"), output_shape=kwargs.get("output_shape"))
    assert expected.shape == out_shape
    x_in = layout(data.draw, x)
    i_in = layout(data.draw, ind)
    if ind.size and data.draw(st.booleans(), label="I as a nested list"):
        i_in = ind.tolist()
    got = poolfold.max_unpool(x_in, i_in, kernel, **kwargs)
    assert_same(got, expected)


@settings(max_examples=150)
@given(case=unpool_case(with_output_shape=False), data=st.data())
def test_without_output_shape_matches_oracle(case, data):
    x, ind, kernel, kwargs, version, out_shape = case
    run_against_oracle(x, ind, kernel, kwargs, out_shape, data)


@settings(max_examples=150)
@given(case=unpool_case(with_output_shape=True), data=st.data())
def test_with_output_shape_matches_oracle(case, data):
    x, ind, kernel, kwargs, version, out_shape = case
    # With output_shape the pads are ignored; drawn pads always leave the inferred size >= 1
    # here (the case where they do not is test_output_shape_ignores_pads, below).
    run_against_oracle(x, ind, kernel, kwargs, out_shape, data)


def test_duplicates_within_and_across_planes_match_oracle():
    x = np.arange(8, dtype=np.float32).reshape(2, 2, 2)
    ind = np.array([[[0, 0], [0, 3]], [[3, 5], [7, 7]]], np.int64)
    assert_same(poolfold.max_unpool(x, ind, [2], strides=[2]),
                oracle.max_unpool(x, ind, [2], strides=[2]))


def test_duplicates_last_in_row_major_order_wins():
    x = np.arange(1, 9, dtype=np.float64).reshape(2, 2, 2)
    ind = np.zeros((2, 2, 2), np.int64)  # every element to position 0 (plane 0)
    y = poolfold.max_unpool(x, ind, [2], strides=[2])
    assert y.shape == (2, 2, 4)
    assert y.reshape(-1).tolist() == [8.0] + [0.0] * 15
    # two elements of plane 1 pointing into plane 0, one plane-0 element to the same place
    ind = np.array([[[1, 2], [3, 4]], [[2, 2], [2, 9]]], np.int64)
    y = poolfold.max_unpool(x, ind, [2], strides=[2])
    expected = np.zeros(16)
    expected[[1, 2, 3, 4, 9]] = [1, 7, 3, 4, 8]  # position 2 gets 2, 5, 6, 7: 7 is last
    np.testing.assert_array_equal(y.reshape(-1), expected)
    # the same within a plane only (MaxPool-style indices with overlapping windows)
    x = np.array([[[3.0, -1.0, 5.0]]], np.float32)
    y = poolfold.max_unpool(x, np.array([[[1, 1, 1]]]), [2])
    assert y.tolist() == [[[0.0, 5.0, 0.0, 0.0]]]


@pytest.mark.parametrize("mode", ["plane", "any", "shared"])
@pytest.mark.parametrize("dtype", [F32, BF16], ids=str)
def test_larger_tensor_matches_oracle_deterministically(mode, dtype):
    """Many planes (the scatter runs planes in parallel) and many duplicates."""
    rng = np.random.default_rng(7)
    x = rng.standard_normal((4, 8, 6, 10)).astype(dtype)
    out_shape = (4, 8, 12, 20)
    plane = 12 * 20
    if mode == "plane":
        ind = rng.integers(0, 40, size=x.shape) + (np.arange(32) * plane).reshape(4, 8, 1, 1)
    elif mode == "any":
        ind = rng.integers(0, 32 * plane, size=x.shape)
    else:
        ind = rng.choice(np.array([0, 5, plane + 3, 31 * plane + 7]), size=x.shape)
    ind = ind.astype(np.int64)
    expected = oracle.max_unpool(x, ind, [2, 2], strides=[2, 2])
    assert expected.shape == out_shape
    for _ in range(3):
        assert_same(poolfold.max_unpool(x, ind, [2, 2], strides=[2, 2]), expected)


def test_empty_n_or_c():
    for shape in [(0, 2, 3), (2, 0, 3), (0, 0, 2, 2)]:
        x = np.zeros(shape, np.float32)
        ind = np.zeros(shape, np.int64)
        k = [2] * (len(shape) - 2)
        y = poolfold.max_unpool(x, ind, k, strides=[2] * len(k))
        assert y.shape == shape[:2] + tuple(2 * d for d in shape[2:])
        assert y.dtype == np.float32
        os = shape[:2] + (5,) * len(k)
        assert poolfold.max_unpool(x, ind, k, output_shape=os).shape == os


def test_unwritten_positions_are_positive_zero():
    x = np.array([[[np.float16(-0.0), np.float16(2.0)]]], np.float16)
    y = poolfold.max_unpool(x, np.array([[[0, 3]]]), [3])
    assert y.dtype == np.float16 and y.shape == (1, 1, 4)
    assert y.view(np.uint16).tolist() == [[[0x8000, 0, 0, 0x4000]]]


# --------------------------------------------------------------------------------------
# inferred_shape_indices=True: I read in the inferred shape, pasted at the origin
# --------------------------------------------------------------------------------------


def pasted_expectation(x, ind, kernel, strides, pads, out_shape):
    """What inferred_shape_indices=True must give, built from the oracle: unpool in the
    inferred shape, then paste that block at the origin of the output.  None when an index
    lands outside output_shape (an error)."""
    inferred_y = oracle.max_unpool(x, ind, kernel, strides=strides, pads=pads)
    inferred = inferred_y.shape
    if ind.size:
        coords = np.unravel_index(ind.reshape(-1), inferred)
        for axis in range(2, len(inferred)):
            if (coords[axis] >= out_shape[axis]).any():
                return None
    y = np.zeros(out_shape, x.dtype)
    common = tuple(slice(0, min(a, b)) for a, b in zip(inferred, out_shape))
    y[common] = inferred_y[common]
    return y


@settings(max_examples=100)
@given(data=st.data())
def test_inferred_shape_indices(data):
    opset = data.draw(st.sampled_from(list(OPSETS)), label="opset")
    version = OPSETS[opset]
    dtype = data.draw(st.sampled_from(dtypes_of(version)), label="dtype")
    x_shape, kernel, strides, pads = data.draw(unpool_geometry(max_rank=3), label="geometry")
    inferred = inferred_shape(x_shape, kernel, strides, pads)
    out_shape = tuple(x_shape[:2]) + tuple(
        max(1, d + data.draw(st.integers(-2, 2))) for d in inferred[2:])
    x = data.draw(raw_floats(x_shape, dtype), label="x")
    ind = data.draw(index_array(x_shape, inferred), label="ind")
    expected = pasted_expectation(x, ind, kernel, strides, pads, out_shape)
    kwargs = dict(strides=strides, pads=pads, opset=opset,
                  output_shape=as_shape_input(data.draw, out_shape), inferred_shape_indices=True)
    if expected is None:
        with pytest.raises(PoolfoldError, match=f"MaxUnpool-{version}"):
            poolfold.max_unpool(x, ind, kernel, **kwargs)
    else:
        assert_same(poolfold.max_unpool(x, ind, kernel, **kwargs), expected)
        if out_shape == inferred:  # both readings agree when the shapes do
            kwargs["inferred_shape_indices"] = False
            assert_same(poolfold.max_unpool(x, ind, kernel, **kwargs), expected)


def test_inferred_shape_indices_without_output_shape_changes_nothing():
    x = np.array([[[[1, 2], [3, 4]]]], np.float32)
    ind = np.array([[[[5, 7], [13, 15]]]], np.int64)
    a = poolfold.max_unpool(x, ind, [2, 2], strides=[2, 2])
    b = poolfold.max_unpool(x, ind, [2, 2], strides=[2, 2], inferred_shape_indices=True)
    assert_same(a, b)


def test_inferred_shape_indices_out_of_inferred_range_is_an_error():
    x = np.array([[[1.0, 2.0]]], np.float32)
    # inferred shape (1, 1, 4): index 4 is outside it even though output_shape has 6
    with pytest.raises(PoolfoldError, match="MaxUnpool-22") as info:
        poolfold.max_unpool(x, np.array([[[0, 4]]]), [2], strides=[2], output_shape=[1, 1, 6],
                            inferred_shape_indices=True)
    assert "4" in str(info.value) and "(0, 0, 1)" in str(info.value)


# --------------------------------------------------------------------------------------
# The spec page's examples (MaxUnpool.txt)
# --------------------------------------------------------------------------------------

PAGE_XI = np.array([[[[5, 7], [13, 15]]]], dtype=np.int64)


@pytest.mark.parametrize("opset", [9, 11, 22, None])
def test_page_example_without_output_shape(opset):
    xT = np.array([[[[1, 2], [3, 4]]]], dtype=np.float32)
    y = np.array([[[[0, 0, 0, 0], [0, 1, 0, 2], [0, 0, 0, 0], [0, 3, 0, 4]]]], dtype=np.float32)
    assert_same(poolfold.max_unpool(xT, PAGE_XI, [2, 2], strides=[2, 2], opset=opset), y)


PAGE_WITH_OUTPUT_SHAPE_Y = np.array(
    [[[[0, 0, 0, 0, 0],
       [0, 5, 0, 6, 0],
       [0, 0, 0, 0, 0],
       [0, 7, 0, 8, 0],
       [0, 0, 0, 0, 0]]]], dtype=np.float32)


@pytest.mark.parametrize("output_shape", [(1, 1, 5, 5), np.array((1, 1, 5, 5), np.int64)])
def test_page_example_with_output_shape_default_reads_indices_in_the_output(output_shape):
    """docs/semantics.md: I holds flat positions of the 5x5 output: 5 -> (1, 0), 7 -> (1, 2),
    13 -> (2, 3), 15 -> (3, 0).  This is *not* the page's drawing (a documented divergence)."""
    xT = np.array([[[[5, 6], [7, 8]]]], dtype=np.float32)
    y = poolfold.max_unpool(xT, PAGE_XI, [2, 2], strides=[2, 2], output_shape=output_shape)
    expected = np.zeros((1, 1, 5, 5), np.float32)
    expected[0, 0, 1, 0] = 5
    expected[0, 0, 1, 2] = 6
    expected[0, 0, 2, 3] = 7
    expected[0, 0, 3, 0] = 8
    assert_same(y, expected)
    assert_same(y, oracle.max_unpool(xT, PAGE_XI, [2, 2], strides=[2, 2], output_shape=(1, 1, 5, 5)))
    assert not np.array_equal(y, PAGE_WITH_OUTPUT_SHAPE_Y)


@pytest.mark.parametrize("opset", [9, 11, 22])
def test_page_example_with_output_shape_inferred_shape_indices(opset):
    xT = np.array([[[[5, 6], [7, 8]]]], dtype=np.float32)
    y = poolfold.max_unpool(xT, PAGE_XI, [2, 2], strides=[2, 2], opset=opset,
                            output_shape=np.array((1, 1, 5, 5), np.int64),
                            inferred_shape_indices=True)
    assert_same(y, PAGE_WITH_OUTPUT_SHAPE_Y)


# --------------------------------------------------------------------------------------
# Round trip: MaxPool -> MaxUnpool(output_shape = x.shape) -> MaxPool gives Y back
# --------------------------------------------------------------------------------------


def nonnegative_floats(shape, dtype):
    """Non-negative values (+0.0 up to +inf, subnormals included, no NaN and no -0.0)."""
    dtype = np.dtype(dtype)
    width = np.dtype(f"u{dtype.itemsize}")
    inf_bits = int(np.array(np.inf, dtype).view(width))
    return hnp.arrays(width, shape, elements=st.integers(0, inf_bits)).map(lambda a: a.view(dtype))


@st.composite
def pool_geometry(draw, use_pads):
    """x shape, kernel, strides, pads < kernel (so no window is empty), with >= 1 window."""
    rank = draw(st.integers(1, 3))
    n, c = draw(st.integers(1, 2)), draw(st.integers(1, 2))
    spatial, kernel, strides, begins, ends = [], [], [], [], []
    for _ in range(rank):
        k = draw(st.integers(1, 3))
        pb = draw(st.integers(0, k - 1)) if use_pads else 0
        pe = draw(st.integers(0, k - 1)) if use_pads else 0
        d = draw(st.integers(max(1, k - pb - pe), 6 if rank == 1 else 4))
        spatial.append(d)
        kernel.append(k)
        strides.append(draw(st.integers(1, 3)))
        begins.append(pb)
        ends.append(pe)
    return (n, c, *spatial), kernel, strides, begins + ends


@settings(max_examples=120)
@given(data=st.data())
def test_round_trip(data):
    dtype = data.draw(st.sampled_from([F16, F32, F64, BF16]), label="dtype")
    use_pads = data.draw(st.booleans(), label="use pads")
    x_shape, kernel, strides, pads = data.draw(pool_geometry(use_pads), label="geometry")
    x = data.draw(nonnegative_floats(x_shape, dtype), label="x")
    y, ind = poolfold.max_pool(x, kernel, strides=strides, pads=pads, return_indices=True)
    inferred = inferred_shape(y.shape, kernel, strides, pads)
    note(f"pooled {y.shape}, inferred {inferred}, x {x.shape}")
    # pads that make the inferred size < 1 hit test_output_shape_ignores_pads (below)
    assume(min(inferred[2:]) >= 1)
    unpool_kwargs = dict(strides=strides, output_shape=x.shape)
    if use_pads:
        unpool_kwargs["pads"] = pads
    u = poolfold.max_unpool(y, ind, kernel, **unpool_kwargs)
    assert_same(u, oracle.max_unpool(y, ind, kernel, strides=strides, output_shape=x.shape))
    # every maximum is back in its place ...
    mask = np.zeros(x.size, bool)
    mask[ind.reshape(-1)] = True
    assert_same(u.reshape(-1)[mask], x.reshape(-1)[mask])
    # ... so pooling again gives Y (by value: a restored maximum may tie with the zero fill)
    y2 = poolfold.max_pool(u, kernel, strides=strides, pads=pads)
    assert y2.dtype == y.dtype and y2.shape == y.shape
    np.testing.assert_array_equal(y2.astype(np.float64), y.astype(np.float64))


@pytest.mark.parametrize("dtype", [F16, F32, F64, BF16], ids=str)
@pytest.mark.parametrize("height, width", [(4, 6), (6, 5), (5, 4), (7, 5)])
def test_round_trip_sizes_where_the_inferred_shape_differs(dtype, height, width):
    """Kernel 2, stride 2: the shape inferred from Y is 2*floor(d/2), which differs from x's on
    every odd axis.  Each axis is even in some cases and odd in others: both even (the
    inferred shape is x's), only the height odd, only the width odd, both odd."""
    rng = np.random.default_rng(height * 10 + width)
    x = rng.permutation(2 * 3 * height * width).reshape(2, 3, height, width).astype(dtype)
    y, ind = poolfold.max_pool(x, [2, 2], strides=[2, 2], return_indices=True)
    assert y.shape == (2, 3, height // 2, width // 2)
    u = poolfold.max_unpool(y, ind, [2, 2], strides=[2, 2], output_shape=x.shape)
    assert u.shape == x.shape
    expected = np.zeros_like(x)
    expected.reshape(-1)[ind.reshape(-1)] = x.reshape(-1)[ind.reshape(-1)]
    inferred = (2, 3) + tuple(2 * d for d in y.shape[2:])
    assert (inferred == x.shape) == (height % 2 == 0 and width % 2 == 0)
    assert_same(u, expected)
    assert_same(poolfold.max_pool(u, [2, 2], strides=[2, 2]), y)


# --------------------------------------------------------------------------------------
# output_shape ignores pads
# --------------------------------------------------------------------------------------


def test_output_shape_ignores_pads_round_trip():
    """docs/semantics.md: with output_shape "the pads attribute is ignored", so pads that would make
    the inferred size < 1 must not matter.  MaxPool of a length-2 x with kernel 2, stride 3,
    pads 1+1 has one window, over (padding, x[0]), so Y = x[0]; the shape inferred from those pads is
    (1-1)*3 + 2 - 1 - 1 = 0, but output_shape = x.shape is given."""
    x = np.array([[[3.0, 7.0]]], np.float32)
    y, ind = oracle.max_pool(x, [2], strides=[3], pads=[1, 1])
    assert y.tolist() == [[[3.0]]] and ind.tolist() == [[[0]]]
    got = poolfold.max_unpool(y, ind, [2], strides=[3], pads=[1, 1], output_shape=x.shape)
    assert_same(got, np.array([[[3.0, 0.0]]], np.float32))
    assert_same(got, oracle.max_unpool(y, ind, [2], strides=[3], pads=[1, 1],
                                       output_shape=x.shape))


@pytest.mark.parametrize("pads", [[1, 1], [0, 2], [3, 0], [5, 5]])
def test_output_shape_ignores_pads(pads):
    """Same rule, pads >= the kernel (the page allows any pads >= 0): inferred size
    (1-1)*1 + 1 - pb - pe < 1."""
    x = np.array([[[5.0]]], np.float64)
    ind = np.array([[[2]]], np.int64)
    expected = np.array([[[0.0, 0.0, 5.0]]])
    assert_same(oracle.max_unpool(x, ind, [1], pads=pads, output_shape=(1, 1, 3)), expected)
    assert_same(poolfold.max_unpool(x, ind, [1], pads=pads, output_shape=(1, 1, 3)), expected)
    # without pads the same call works: pads must make no difference
    assert_same(poolfold.max_unpool(x, ind, [1], output_shape=(1, 1, 3)), expected)


# --------------------------------------------------------------------------------------
# Errors
# --------------------------------------------------------------------------------------

X2 = np.arange(8, dtype=np.float32).reshape(1, 2, 2, 2)
I2 = np.array([[[[0, 2], [8, 10]], [[16, 18], [24, 26]]]], np.int64)  # (1, 2, 4, 4) output


def test_valid_reference_call():
    y = poolfold.max_unpool(X2, I2, [2, 2], strides=[2, 2])
    assert y.shape == (1, 2, 4, 4)
    assert y.reshape(-1)[I2.reshape(-1)].tolist() == X2.reshape(-1).tolist()


@pytest.mark.parametrize("ind_shape", [(1, 2, 2, 1), (1, 2, 4), (2, 2, 2, 2), (1, 1, 2, 2)])
def test_x_and_i_shapes_must_match(ind_shape):
    ind = np.zeros(ind_shape, np.int64)
    with pytest.raises(PoolfoldError, match="MaxUnpool-22") as info:
        poolfold.max_unpool(X2, ind, [2, 2], strides=[2, 2])
    assert "'I'" in str(info.value) and "X" in str(info.value)


@pytest.mark.parametrize("dtype", [np.int32, np.uint64, np.int8, np.float64, np.float32, bool])
def test_i_must_be_int64(dtype):
    with pytest.raises(PoolfoldTypeError, match="MaxUnpool-22") as info:
        poolfold.max_unpool(X2, I2.astype(dtype), [2, 2], strides=[2, 2])
    assert "'I'" in str(info.value) and "int64" in str(info.value)


def test_i_as_a_list_of_ints_is_accepted_but_not_floats():
    y = poolfold.max_unpool(X2, I2.tolist(), [2, 2], strides=[2, 2])
    assert_same(y, poolfold.max_unpool(X2, I2, [2, 2], strides=[2, 2]))
    with pytest.raises(PoolfoldTypeError, match="'I'"):
        poolfold.max_unpool(X2, I2.astype(float).tolist(), [2, 2], strides=[2, 2])


@pytest.mark.parametrize("opset, version", [(9, 9), (11, 11), (21, 11), (22, 22)])
@pytest.mark.parametrize("dtype", [np.int8, np.uint8, np.int32, np.int64, np.bool_,
                                   np.complex64], ids=lambda d: np.dtype(d).name)
def test_x_type_not_allowed(dtype, opset, version):
    with pytest.raises(PoolfoldTypeError, match=f"MaxUnpool-{version}") as info:
        poolfold.max_unpool(X2.astype(dtype), I2, [2, 2], strides=[2, 2], opset=opset)
    assert "'X'" in str(info.value)


@pytest.mark.parametrize("opset, version", [(9, 9), (11, 11), (21, 11)])
def test_bfloat16_needs_version_22(opset, version):
    with pytest.raises(PoolfoldTypeError, match=f"MaxUnpool-{version}") as info:
        poolfold.max_unpool(X2.astype(BF16), I2, [2, 2], strides=[2, 2], opset=opset)
    assert "bfloat16" in str(info.value)
    y = poolfold.max_unpool(X2.astype(BF16), I2, [2, 2], strides=[2, 2], opset=22)
    assert y.dtype == BF16


def test_opset_before_9_is_an_error():
    with pytest.raises(PoolfoldError, match="MaxUnpool"):
        poolfold.max_unpool(X2, I2, [2, 2], strides=[2, 2], opset=8)


@pytest.mark.parametrize("output_shape", [(1, 2, 4), (1, 2, 4, 4, 1), (4, 4), [], (1,)])
def test_output_shape_wrong_length(output_shape):
    with pytest.raises(PoolfoldError, match="MaxUnpool-22") as info:
        poolfold.max_unpool(X2, I2, [2, 2], strides=[2, 2], output_shape=output_shape)
    assert "output_shape" in str(info.value)


@pytest.mark.parametrize("output_shape", [(2, 2, 4, 4), (1, 1, 4, 4), (1, 3, 4, 4), (0, 2, 4, 4)])
def test_output_shape_must_keep_n_and_c(output_shape):
    for value in (output_shape, np.array(output_shape, np.int64)):
        with pytest.raises(PoolfoldError, match="MaxUnpool-22") as info:
            poolfold.max_unpool(X2, I2, [2, 2], strides=[2, 2], output_shape=value)
        assert "output_shape" in str(info.value)


@pytest.mark.parametrize("output_shape", [(1, 2, 0, 4), (1, 2, 4, -1), (1, 2, -5, 0)])
def test_output_shape_spatial_dims_at_least_1(output_shape):
    for value in (output_shape, np.array(output_shape, np.int64)):
        with pytest.raises(PoolfoldError, match="MaxUnpool-22") as info:
            poolfold.max_unpool(X2, I2, [2, 2], strides=[2, 2], output_shape=value)
        assert "output_shape" in str(info.value)


@pytest.mark.parametrize(
    "output_shape",
    [(1, 2, 4.0, 4), [1, 2, "4", 4], (1, 2, None, 4), np.array([1, 2, 4, 4], np.float64),
     np.array([1, 2, 4, 4], np.int32), (1, 2, 4.5, 4), (1, 2, True, 4), 5, "1244"],
    ids=["float", "str", "none", "float-array", "int32-array", "fraction", "bool", "scalar",
         "string"],
)
def test_output_shape_not_integers(output_shape):
    with pytest.raises(PoolfoldTypeError, match="MaxUnpool-22") as info:
        poolfold.max_unpool(X2, I2, [2, 2], strides=[2, 2], output_shape=output_shape)
    assert "output_shape" in str(info.value)


@settings(max_examples=80)
@given(data=st.data())
def test_index_out_of_range_or_negative(data):
    opset = data.draw(st.sampled_from(list(OPSETS)), label="opset")
    version = OPSETS[opset]
    x_shape, kernel, strides, pads = data.draw(unpool_geometry(), label="geometry")
    assume(x_shape[0] * x_shape[1] > 0)
    with_output_shape = data.draw(st.booleans(), label="with output_shape")
    if with_output_shape:
        out_shape = tuple(x_shape[:2]) + tuple(
            data.draw(st.integers(1, 5)) for _ in range(len(kernel)))
    else:
        out_shape = inferred_shape(x_shape, kernel, strides, pads)
    total = math.prod(out_shape)
    x = data.draw(raw_floats(x_shape, data.draw(st.sampled_from(dtypes_of(version)))), label="x")
    ind = data.draw(index_array(x_shape, out_shape), label="ind")
    position = tuple(data.draw(st.integers(0, d - 1)) for d in x_shape)
    bad = data.draw(st.one_of(st.integers(-(2**63), -1), st.integers(total, 2**63 - 1),
                              st.sampled_from([-1, total])), label="bad index")
    ind[position] = bad
    before = x.copy(), ind.copy()
    kwargs = dict(strides=strides, pads=pads, opset=opset)
    if with_output_shape:
        kwargs["output_shape"] = out_shape
    with pytest.raises(PoolfoldError) as info:
        poolfold.max_unpool(x, ind, kernel, **kwargs)
    message = str(info.value)
    assert f"MaxUnpool-{version}" in message
    assert str(bad) in message
    assert str(position) in message  # e.g. (0, 1, 2, 0)
    assert f"[0, {total})" in message
    assert_same(x, before[0])  # inputs untouched
    np.testing.assert_array_equal(ind, before[1])


def test_first_bad_index_in_row_major_order_is_named():
    ind = I2.copy()
    ind[0, 1, 0, 1] = 99
    ind[0, 0, 1, 1] = -3  # comes first in row-major order
    with pytest.raises(PoolfoldError) as info:
        poolfold.max_unpool(X2, ind, [2, 2], strides=[2, 2], opset=11)
    message = str(info.value)
    assert "MaxUnpool-11" in message and "-3" in message and "(0, 0, 1, 1)" in message
    assert "[0, 32)" in message


def test_page_indices_out_of_range_without_output_shape():
    xT = np.array([[[[1, 2], [3, 4]]]], dtype=np.float32)
    ind = PAGE_XI.copy()
    ind[0, 0, 1, 1] = 16  # the inferred output is 4x4
    with pytest.raises(PoolfoldError) as info:
        poolfold.max_unpool(xT, ind, [2, 2], strides=[2, 2], opset=9)
    message = str(info.value)
    assert "MaxUnpool-9" in message and "16" in message and "(0, 0, 1, 1)" in message
    assert "[0, 16)" in message


@pytest.mark.parametrize(
    "x_size, kernel, strides, pads",
    [(1, [1], [1], [1, 0]), (1, [2], [3], [1, 1]), (2, [1], [1], [1, 1]), (3, [1], [2], [3, 3])],
)
def test_inferred_output_size_below_1(x_size, kernel, strides, pads):
    x = np.ones((1, 1, x_size), np.float32)
    with pytest.raises(PoolfoldError, match="MaxUnpool-22") as info:
        poolfold.max_unpool(x, np.zeros(x.shape, np.int64), kernel, strides=strides, pads=pads)
    assert "output" in str(info.value) or "inferred" in str(info.value)


@pytest.mark.parametrize(
    "kwargs, word",
    [
        (dict(kernel_shape=[2]), "kernel_shape"),
        (dict(kernel_shape=[2, 0]), "kernel_shape"),
        (dict(kernel_shape=[2, 2], strides=[2]), "strides"),
        (dict(kernel_shape=[2, 2], strides=[0, 2]), "strides"),
        (dict(kernel_shape=[2, 2], pads=[0, 0, 0]), "pads"),
        (dict(kernel_shape=[2, 2], pads=[0, -1, 0, 0]), "pads"),
    ],
)
def test_bad_attributes(kwargs, word):
    kernel = kwargs.pop("kernel_shape")
    with pytest.raises(PoolfoldError, match="MaxUnpool-22") as info:
        poolfold.max_unpool(X2, I2, kernel, **kwargs)
    assert word in str(info.value)


def test_rank_below_3_is_an_error():
    with pytest.raises(PoolfoldError, match="MaxUnpool-22"):
        poolfold.max_unpool(np.ones((1, 4), np.float32), np.zeros((1, 4), np.int64), [1])


@pytest.mark.parametrize("inferred_shape_indices", [False, True])
@pytest.mark.parametrize(
    "output_shape",
    [(1, 2, 2**40, 2**40), (1, 2, 2**62, 2**62), np.array([1, 2, 2**62, 2**62], np.int64),
     (1, 2, 2**70, 3)],
    ids=["2^40", "2^62", "2^62-array", "2^70"],
)
def test_huge_output_shape_is_refused_quickly(output_shape, inferred_shape_indices):
    # warm up (numba compiles or loads its kernels on first use) outside the measurement
    poolfold.max_unpool(X2, I2, [2, 2], strides=[2, 2], output_shape=(1, 2, 4, 4),
                        inferred_shape_indices=inferred_shape_indices)
    assert_refused_quickly(
        lambda: poolfold.max_unpool(X2, I2, [2, 2], strides=[2, 2], output_shape=output_shape,
                                    inferred_shape_indices=inferred_shape_indices),
        "MaxUnpool-22")


def test_huge_inferred_output_is_refused_quickly():
    x = np.ones((1, 1, 2, 2), np.float32)
    start = time.perf_counter()
    with pytest.raises(PoolfoldError, match="MaxUnpool-22"):
        poolfold.max_unpool(x, np.zeros(x.shape, np.int64), [2**40, 2**40])
    assert time.perf_counter() - start < 5.0


@pytest.mark.parametrize("which", ["X", "I"])
def test_non_native_byte_order(which):
    """A big-endian float32 / int64 tensor is still a float32 / int64 tensor: poolfold must
    either compute the same result or refuse it with its own error, never crash in numba."""
    x, ind = X2, I2
    if which == "X":
        x = X2.astype(">f4")
    else:
        ind = I2.astype(">i8")
    try:
        got = poolfold.max_unpool(x, ind, [2, 2], strides=[2, 2])
    except (PoolfoldError, PoolfoldTypeError) as error:
        assert "MaxUnpool-22" in str(error)
    else:
        np.testing.assert_array_equal(got, poolfold.max_unpool(X2, I2, [2, 2], strides=[2, 2]))
