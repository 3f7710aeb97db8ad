"""The MaxPool kernels (direct scan, separable passes at every slab height, and the fused
kernel for windows that tile the input) against the oracle, bit for bit.  The public API picks
one by a cost rule that tiny test tensors always resolve to the direct scan, so the separable
kernel is driven here directly."""

import ml_dtypes
import pytest
import numpy as np
from hypothesis import example, given, settings
from hypothesis import strategies as st

import oracle
from kernel_types import kernel_types
from poolfold.geometry import WindowAttributes, window_plan
from poolfold.ops.max_pool import pool_planes, tiles_fit

DTYPES = [np.float16, np.float32, np.float64, np.int8, np.uint8, ml_dtypes.bfloat16]


def plan_or_refusal(spatial, attributes, kernel, strides, dilations, pads, ceil_mode=False):
    """poolfold's plan where the oracle's geometry (docs/semantics.md's output-size rule) has
    a window on every axis, checked against it; None where it has none, after checking that
    poolfold refuses the case.  Validity is decided by the oracle, not by poolfold."""
    geometry = oracle.max_pool_geometry(spatial, kernel, strides, pads, dilations,
                                        ceil_mode=ceil_mode)
    if geometry is None:
        with pytest.raises(ValueError, match="no window fits"):
            window_plan("t", spatial, attributes, ceil_mode=ceil_mode)
        return None
    plan = window_plan("t", spatial, attributes, ceil_mode=ceil_mode)
    assert tuple(plan.out_shape) == geometry[0]
    assert tuple(plan.pad_begin) == geometry[1]
    return plan


@st.composite
def cases(draw):
    rank = draw(st.integers(1, 3))
    shape = tuple(draw(st.integers(1, 7)) for _ in range(rank))
    kernel = [draw(st.integers(1, 3)) for _ in range(rank)]
    strides = [draw(st.integers(1, 3)) for _ in range(rank)]
    dilations = [draw(st.integers(1, 2)) for _ in range(rank)]
    pads = [draw(st.integers(0, 3)) for _ in range(2 * rank)]
    dtype = np.dtype(draw(st.sampled_from(kernel_types(DTYPES))))
    planes = draw(st.integers(1, 5))
    values = draw(st.lists(st.integers(-3, 3), min_size=planes * int(np.prod(shape)),
                           max_size=planes * int(np.prod(shape))))
    x = np.array(values).reshape((1, planes) + shape)
    if dtype.kind in "iu":
        x = x.astype(dtype)
    else:
        x = x.astype(np.float64)
        special = draw(st.lists(st.sampled_from([np.nan, -0.0, np.inf, -np.inf]), max_size=3))
        for k, v in enumerate(special):
            x.flat[draw(st.integers(0, x.size - 1))] = v
        x = x.astype(dtype)
    return x, kernel, strides, dilations, pads, draw(st.integers(0, 1)), draw(st.integers(1, 4))


@settings(max_examples=150, deadline=None)
@given(cases())
# A slab of one output row whose window is only padding holds no input row: the separable
# passes once sliced their scratch with a negative count there, reading out of bounds
# (seen only under NUMBA_BOUNDSCHECK=1; the padding's value then overwrote the garbage).
@example((np.zeros((1, 1, 1, 2), np.int8), [1, 2], [1, 1], [1, 1], [0, 0, 1, 0], 0, 1))
@example((np.zeros((1, 2, 2, 3, 4), np.float32), [2, 1, 3], [1, 1, 1], [1, 1, 1],
          [0, 0, 1, 2, 0, 1], 1, 1))
def test_direct_and_separable_kernels_match_the_oracle(case):
    x, kernel, strides, dilations, pads, storage_order, slab_rows = case
    attributes = WindowAttributes.validate("t", x.ndim - 2, kernel, strides, dilations, pads)
    plan = plan_or_refusal(x.shape[2:], attributes, kernel, strides, dilations, pads)
    if plan is None:
        return  # no window fits, and poolfold refused it
    want_y, want_i = oracle.max_pool(x, kernel, strides=strides, pads=pads,
                                     dilations=dilations, storage_order=storage_order)
    bits = np.dtype(f"u{x.dtype.itemsize}")
    for rows in (None, slab_rows, plan.out_shape[0]):
        y, i = pool_planes("t", x, plan, True, storage_order, slab_rows=rows)
        assert np.array_equal(y.view(bits), want_y.view(bits)), (rows, y, want_y)
        assert np.array_equal(i, want_i), (rows, i, want_i)
        y_only, _ = pool_planes("t", x, plan, False, storage_order, slab_rows=rows)
        assert np.array_equal(y_only.view(bits), want_y.view(bits)), rows


def _ties_and_specials(shape, dtype, seed):
    """Few distinct values (many ties), with NaNs of two payloads and signed zeros for floats."""
    rng = np.random.default_rng(seed)
    x = rng.integers(-3, 4, size=shape)
    if np.dtype(dtype).kind in "iu":
        return x.astype(dtype)
    x = x.astype(np.float64)
    flat = x.reshape(-1)
    picks = rng.choice(flat.size, size=min(flat.size, 12), replace=False)
    flat[picks[:4]] = np.nan
    flat[picks[4:8]] = -0.0
    flat[picks[8:]] = 0.0
    x = x.astype(dtype)
    bits = x.view(f"u{x.itemsize}").reshape(-1)
    bits[picks[:2]] |= 1  # another NaN payload: the first in window order must win
    return x


# The separable kernel's own paths at sizes the hypothesis cases do not reach: the last
# axis by pairs of elements read as words (stride 2 with an even extent, kernels 1 to 6,
# windows starting at even and odd offsets, with or without cut windows), and the first axis
# both at every window start (short rows) and at its outputs only (rows of 512 elements or
# more).
@pytest.mark.parametrize("dtype", [np.float32, np.float16, ml_dtypes.bfloat16, np.int8,
                                   np.float64])
@pytest.mark.parametrize("spatial,kernel,strides,pads,ceil_mode", [
    ((10, 16), [3, 2], [2, 2], [0, 0, 0, 0], False),
    ((9, 18), [2, 4], [1, 2], [1, 1, 1, 1], False),
    ((7, 20), [3, 5], [2, 2], [2, 2, 2, 2], False),
    ((8, 16), [2, 4], [2, 2], [0, 1, 1, 0], True),
    ((6, 6, 12), [2, 2, 2], [2, 2, 2], [0, 0, 0, 0, 0, 0], False),
    ((5, 4, 256), [2, 1, 4], [1, 1, 2], [1, 0, 2, 1, 0, 1], False),
    ((6, 4, 160), [3, 2, 3], [2, 1, 2], [1, 0, 1, 1, 1, 1], False),
    ((24,), [4], [2], [1, 2], False),
    ((12, 14), [3, 3], [2, 2], [1, 1, 1, 1], False),
    ((7, 16), [3, 3], [2, 2], [0, 1, 0, 1], True),
    ((6, 10), [1, 1], [2, 2], [0, 0, 0, 0], False),
    ((5, 22), [2, 6], [1, 2], [0, 3, 1, 2], False),
])
def test_separable_paths_match_the_oracle(dtype, spatial, kernel, strides, pads, ceil_mode):
    x = _ties_and_specials((2, 3) + spatial, dtype, seed=len(spatial) * 100 + sum(spatial))
    attributes = WindowAttributes.validate("t", len(spatial), kernel, strides, None, pads)
    plan = window_plan("t", spatial, attributes, ceil_mode=ceil_mode)
    want_y, want_i = oracle.max_pool(x, kernel, strides=strides, pads=pads, ceil_mode=ceil_mode)
    bits = np.dtype(f"u{x.dtype.itemsize}")
    for rows in (1, 2, plan.out_shape[0]):
        for storage_order in (0, 1):
            y, i = pool_planes("t", x, plan, True, storage_order, slab_rows=rows)
            _, want_i = oracle.max_pool(x, kernel, strides=strides, pads=pads,
                                        ceil_mode=ceil_mode, storage_order=storage_order)
            assert np.array_equal(y.view(bits), want_y.view(bits)), (rows, storage_order)
            assert np.array_equal(i, want_i), (rows, storage_order)
        y_only, _ = pool_planes("t", x, plan, False, 0, slab_rows=rows)
        assert np.array_equal(y_only.view(bits), want_y.view(bits)), rows


@st.composite
def tiling_cases(draw):
    """2-wide windows at stride 2 on every axis: mostly tiling the input (the fused kernel),
    some cut by padding, ceil mode or an odd last dim, or over four axes (the other
    kernels)."""
    rank = draw(st.integers(2, 4))
    shape = [draw(st.integers(1, 6)) for _ in range(rank)]
    if draw(st.booleans()):
        shape[-1] = 2 * draw(st.integers(1, 4))
    pads = [0] * (2 * rank) if draw(st.integers(0, 3)) else \
        [draw(st.integers(0, 1)) for _ in range(2 * rank)]
    dtype = np.dtype(draw(st.sampled_from(kernel_types(DTYPES))))
    planes = draw(st.integers(1, 4))
    size = planes * int(np.prod(shape))
    values = np.array(draw(st.lists(st.integers(-2, 2), min_size=size, max_size=size)))
    x = values.reshape([1, planes] + shape).astype(np.float64)
    if dtype.kind == "f" or dtype == ml_dtypes.bfloat16:
        for v in draw(st.lists(st.sampled_from([np.nan, -0.0, np.inf, -np.inf]), max_size=3)):
            x.flat[draw(st.integers(0, x.size - 1))] = v
    return x.astype(dtype), pads, draw(st.booleans())


@settings(max_examples=150, deadline=None)
@given(tiling_cases())
def test_tiling_windows_match_the_oracle(case):
    """The fused kernel for windows that tile the input, chosen whenever they do."""
    x, pads, ceil_mode = case
    rank = x.ndim - 2
    kernel = strides = [2] * rank
    attributes = WindowAttributes.validate("t", rank, kernel, strides, None, pads)
    plan = plan_or_refusal(x.shape[2:], attributes, kernel, strides, None, pads,
                           ceil_mode=ceil_mode)
    if plan is None:
        return  # no window fits, and poolfold refused it
    inside = all(before == 0 and 2 * out <= n for before, out, n in
                 zip(plan.pad_begin, plan.out_shape, plan.in_shape))
    assert tiles_fit(plan, x.itemsize) == (inside and rank <= 3 and x.shape[-1] % 2 == 0
                                           and x.itemsize <= 4)
    want_y, want_i = oracle.max_pool(x, kernel, strides=strides, pads=pads,
                                     ceil_mode=ceil_mode)
    bits = np.dtype(f"u{x.dtype.itemsize}")
    y, i = pool_planes("t", x, plan, True, 0)
    assert np.array_equal(y.view(bits), want_y.view(bits)), (y, want_y)
    assert np.array_equal(i, want_i), (i, want_i)
    y_only, _ = pool_planes("t", x, plan, False, 0)
    assert np.array_equal(y_only.view(bits), want_y.view(bits))
    _, column_major = pool_planes("t", x, plan, True, 1)  # another kernel: first axis fastest
    np.testing.assert_array_equal(
        column_major, oracle.max_pool(x, kernel, strides=strides, pads=pads,
                                      ceil_mode=ceil_mode, storage_order=1)[1])


@pytest.mark.parametrize("shape", [(1, 1, 512, 512), (1, 3, 224, 224), (1, 2, 6, 4, 8),
                                   (2, 1, 14, 6)])
@pytest.mark.parametrize("threads", ["1", "2"])
def test_few_tiled_planes_are_cut_into_slices_the_threads_share(monkeypatch, shape, threads):
    """The tiling kernel splits a call by planes: a call of few planes has each cut into
    slices of whole windows along its first axis (tile_slices), each slice a plane of the
    same flat offsets, so that Y and the row-major Indices are the whole planes' own."""
    from poolfold.ops import max_pool as mp

    monkeypatch.setenv("POOLFOLD_NUM_THREADS", threads)
    x = np.random.default_rng(len(shape)).standard_normal(shape).astype(np.float32)
    x.flat[::11] = 0.5  # ties across the slices' edges
    kernel = [2] * (len(shape) - 2)
    rank = len(kernel)
    plan = window_plan("t", shape[2:], WindowAttributes.validate("t", rank, kernel, kernel,
                                                                 None, None), "NOTSET", False)
    planes = shape[0] * shape[1]
    cut = mp.tile_slices(plan, planes, int(threads))
    if threads == "1":
        assert cut == 1
    else:  # 8 items a thread, or a window row each
        assert cut > 1 and plan.out_shape[0] % cut == 0
        assert planes * cut >= min(16, planes * plan.out_shape[0])
    launch = mp._pool_launch("t", shape[:2], x.dtype, plan, True, 0, None, -1, int(threads))
    assert launch.kernel == mp.TILES and launch.kernel_planes == planes * cut
    if shape == (1, 1, 512, 512):
        assert launch.parts == int(threads)  # enough work for both threads
    want_y, want_i = oracle.max_pool(x, kernel, strides=kernel)
    y, i = pool_planes("t", x, plan, True, 0)
    np.testing.assert_array_equal(y, want_y)
    np.testing.assert_array_equal(i, want_i)
    np.testing.assert_array_equal(pool_planes("t", x, plan, False, 0)[0], want_y)
