"""Each MaxPool kernel, forced, against the oracle bit for bit, and the kernel that ran asserted.

``poolfold.ops.max_pool.choose_kernel`` picks one kernel per plan; tests force each in turn
(``forced_kernel``) on hypothesis-drawn and hand-picked calls: ranks 1-4, short and long
windows, strides, dilations, pads up to and beyond the window (empty windows), ceil_mode,
SAME / VALID, every pooling type, NaN and ties, both storage orders, with and without Indices,
channels-first and channels-last (the row kernel takes channels-first calls without Indices
only).  The separable passes also run with their slabs and van Herk
threshold shrunk (``tiny_slabs``), so that tiny tensors take the paths large ones do.
"""

from __future__ import annotations

import contextlib
import math
import zlib

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import oracle
from kernel_types import kernel_types
import poolfold
from poolfold.kernels import max_rows as rows_module
from poolfold.ops import max_pool as max_pool_module
from poolfold.ops.max_pool import (DIRECT, LINES, PASSES, PLANE_LANES, ROW_BLOCKS, ROWS, RUNS,
                                   SEPARABLE, TILES, forced_kernel)

DTYPES = [np.dtype(t) for t in (np.float32, np.float64, np.float16, ml_dtypes.bfloat16,
                                np.int8, np.uint8)]
# Kernels that pool any plan with no 0-size axis (the tiling and older separable kernels take
# only some: tested where they apply, below and in test_window_kernels.py).
GENERAL = [PASSES, DIRECT]
# ...and the kernel that pools any channels-first plan without Indices.
PLAIN = [ROWS]
# The kernels that pool without Indices only.
WITHOUT_INDICES = (ROWS, ROW_BLOCKS, LINES, PLANE_LANES, RUNS)


@contextlib.contextmanager
def patched(settings, caches):
    """Module attributes set (``settings``: (module, name, value) triples) for the block,
    with the launches, tables and choices built meanwhile dropped on both sides (``caches``
    and the calls' kept launches), so nothing leaks into other tests."""
    saved = [(module, name, getattr(module, name)) for module, name, _ in settings]

    def drop():
        for cache in caches:
            cache.cache_clear()
        max_pool_module._LAUNCHES.clear()

    drop()
    for module, name, value in settings:
        setattr(module, name, value)
    try:
        yield
    finally:
        for module, name, value in saved:
            setattr(module, name, value)
        drop()


def tiny_slabs(slab_bytes=64):
    """The separable passes cut every plane into slabs of a row or two and reduce every window
    of two taps or more by van Herk runs, whatever the stride."""
    module = max_pool_module
    return patched([(module, "SLAB_BYTES", slab_bytes),
                    (module, "_van_herk", lambda kernel, stride: kernel >= 2)],
                   (module.passes_tables, module._pool_launch, module.choose_kernel))


def values(rng, shape, dtype, nan_rate=0.05):
    """Small integers (many ties), some NaN for floating types."""
    x = rng.integers(-3, 4, shape)
    if dtype.kind in "iu":
        return x.astype(dtype)
    x = x.astype(np.float64)
    x[rng.random(shape) < nan_rate] = np.nan
    x[rng.random(shape) < 0.05] = -0.0
    return x.astype(dtype)


def same_bits(a, b):
    a, b = np.ascontiguousarray(a), np.ascontiguousarray(b)
    return a.shape == b.shape and np.array_equal(a.view(np.uint8), b.view(np.uint8))


def run_forced(kernel, x, kernel_shape, channels_last=False, **attributes):
    """(Y, Indices or None) from ``kernel`` forced, asserting it is the kernel that ran."""
    call = poolfold.nhwc.max_pool if channels_last else poolfold.max_pool
    with forced_kernel(kernel) as override:
        result = call(x, kernel_shape, **attributes)
    assert override.ran == [kernel], (kernel, override.ran)
    return result if attributes.get("return_indices") else (result, None)


def check(kernel, x, kernel_shape, channels_last=False, **attributes):
    """``kernel`` forced against the oracle, with and without Indices (an NCHW ``x``: moved
    to channels-last for ``channels_last``; the nhwc MaxPool takes no bfloat16: not run).
    The row kernels run without Indices only."""
    if channels_last and x.dtype == ml_dtypes.bfloat16:
        return
    want_y, want_i = oracle.max_pool(
        x, kernel_shape, strides=attributes.get("strides"), pads=attributes.get("pads"),
        dilations=attributes.get("dilations"), auto_pad=attributes.get("auto_pad", "NOTSET"),
        ceil_mode=attributes.get("ceil_mode", False),
        storage_order=attributes.get("storage_order", 0))
    given_x = np.moveaxis(x, 1, -1).copy() if channels_last else x
    for return_indices in (False,) if kernel in WITHOUT_INDICES else (True, False):
        y, i = run_forced(kernel, given_x, kernel_shape, channels_last,
                          return_indices=return_indices, **attributes)
        if channels_last:
            y = np.moveaxis(y, -1, 1)
        assert same_bits(y, want_y), (kernel, return_indices, y, want_y)
        if return_indices:
            np.testing.assert_array_equal(i, want_i)


@st.composite
def calls(draw, max_rank=4):
    """An NCHW input and MaxPool attributes whose oracle run stays cheap."""
    rank = draw(st.integers(1, max_rank))
    max_dim, max_k = {1: (24, 9), 2: (9, 5), 3: (5, 3), 4: (4, 2)}[rank]
    spatial = [draw(st.integers(1, max_dim)) for _ in range(rank)]
    kernel = [draw(st.integers(1, max_k)) for _ in range(rank)]
    strides = [draw(st.sampled_from([1, 1, 2, 3, k])) for k in kernel]
    dilations = [draw(st.integers(1, 3)) for _ in range(rank)]
    spans = [(k - 1) * d + 1 for k, d in zip(kernel, dilations)]
    auto_pad = draw(st.sampled_from(["NOTSET"] * 4 + ["SAME_UPPER", "SAME_LOWER", "VALID"]))
    pads = None
    if auto_pad == "NOTSET":  # up to past the window: windows of padding only
        pads = [draw(st.integers(0, spans[a % rank] + 1)) for a in range(2 * rank)]
    ceil_mode = draw(st.booleans())
    outs = []
    for a in range(rank):  # the sizes, to skip calls where no window fits
        n, s, span = spatial[a], strides[a], spans[a]
        if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
            out = -(-n // s)
        elif auto_pad == "VALID":
            out = (n - span) // s + 1
        else:
            total = n + pads[a] + pads[a + rank] - span
            out = (-(-total // s) if ceil_mode else total // s) + 1
            if ceil_mode and (out - 1) * s >= n + pads[a]:
                out -= 1
        outs.append(out)
    if min(outs) < 1:
        spatial = [n + span for n, span in zip(spatial, spans)]  # then every axis fits
        auto_pad, pads, ceil_mode = "VALID", None, False
    dtype = draw(st.sampled_from(kernel_types(DTYPES)))
    n, c = draw(st.integers(1, 2)), draw(st.integers(1, 3))
    seed = draw(st.integers(0, 2**32 - 1))
    x = values(np.random.default_rng(seed), (n, c, *spatial), dtype)
    return x, kernel, dict(strides=strides, dilations=dilations, pads=pads, auto_pad=auto_pad,
                           ceil_mode=ceil_mode, storage_order=draw(st.integers(0, 1)))


@pytest.mark.parametrize("kernel", GENERAL)
@settings(max_examples=150)
@given(call=calls())
def test_forced_kernel_matches_oracle(kernel, call):
    x, kernel_shape, attributes = call
    check(kernel, x, kernel_shape, **attributes)


@settings(max_examples=150)
@given(call=calls())
def test_rows_forced_match_oracle(call):
    """The row kernel on every plan it takes: ranks 1-4, cut and empty windows, strides
    1-4 (a loop each) and beyond."""
    x, kernel_shape, attributes = call
    check(ROWS, x, kernel_shape, **attributes)


def plan_of(x, kernel_shape, attributes):
    return max_pool_module.resolve_plan(
        poolfold.schema.resolve("MaxPool", None), x.shape, kernel_shape,
        attributes.get("strides"), attributes.get("pads"), attributes.get("dilations"),
        attributes.get("auto_pad", "NOTSET"), attributes.get("ceil_mode", False))


def row_blocks_fit(x, kernel_shape, attributes) -> bool:
    return max_pool_module.row_blocks_fit(plan_of(x, kernel_shape, attributes))


def check_or_fallback(kernel, fits, x, kernel_shape, **attributes):
    """``kernel`` forced against the oracle where it ``fits`` the plan; elsewhere forcing it
    falls back to another kernel, whose values are right."""
    if fits:
        check(kernel, x, kernel_shape, **attributes)
        return
    want = oracle.max_pool(
        x, kernel_shape, strides=attributes.get("strides"), pads=attributes.get("pads"),
        dilations=attributes.get("dilations"), auto_pad=attributes.get("auto_pad", "NOTSET"),
        ceil_mode=attributes.get("ceil_mode", False))[0]
    with forced_kernel(kernel) as override:
        y = poolfold.max_pool(x, kernel_shape, **attributes)
    assert override.ran and override.ran != [kernel]
    assert same_bits(y, want)


def check_row_blocks(x, kernel_shape, **attributes):
    """The row blocks forced where they can pool the plan (channels-last input too: of one
    channel natively, of several as channels-first planes); elsewhere (windows of 8 taps
    and more along the last axis, or none reaching an input column) forcing them falls back
    to another kernel."""
    fits = row_blocks_fit(x, kernel_shape, attributes)
    if fits:
        check(ROW_BLOCKS, x, kernel_shape, channels_last=True, **attributes)
    check_or_fallback(ROW_BLOCKS, fits, x, kernel_shape, **attributes)


@settings(max_examples=150)
@given(call=calls())
def test_lines_forced_match_oracle(call):
    """The line kernel on every plan it takes (ranks 1-4, one stream per work item or a
    fold per row, cut and empty windows, strides 1-4 and beyond, -0.0 beside +0.0 and NaN
    anywhere in a window), and elsewhere forcing it falls back."""
    x, kernel_shape, attributes = call
    fits = max_pool_module.lines_fit(plan_of(x, kernel_shape, attributes))
    check_or_fallback(LINES, fits, x, kernel_shape, **attributes)


@pytest.mark.parametrize("shape,kernel_shape,attributes", [
    # one stream per item (rows a whole number of strides long), cut windows at both ends
    ((1, 3, 14, 12), [3, 3], dict(strides=[2, 2], pads=[1, 1, 1, 1])),
    ((1, 2, 11, 10), [3, 3], dict(strides=[2, 2], ceil_mode=True)),
    # a fold per row: rows not a whole number of strides long
    ((2, 2, 9, 11), [3, 2], dict(strides=[2, 2], pads=[0, 1, 0, 1])),
    # strides beyond the vector folds' literals, dilation, windows wholly in the padding
    ((1, 2, 12, 17), [2, 3], dict(strides=[3, 5], dilations=[2, 2], pads=[3, 4, 3, 4])),
    # 3-D, the leading taps two axes deep; 1-D
    ((1, 2, 5, 6, 8), [2, 3, 2], dict(strides=[1, 2, 2], pads=[1, 1, 0, 1, 1, 0])),
    ((2, 3, 20), [3], dict(strides=[2], pads=[2, 2])),
])
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda t: t.name)
def test_lines_hand_picked_match_oracle(shape, kernel_shape, attributes, dtype):
    check(LINES, values(np.random.default_rng(3), shape, dtype), kernel_shape, **attributes)


def test_lines_cut_planes_into_runs_of_first_axis_outputs():
    """Few large planes: each plane's first-axis outputs are cut into runs the threads
    share, each run's folded rows within the kernel's scratch bound; the runs meet
    seamlessly."""
    x = values(np.random.default_rng(4), (1, 1, 300, 64), np.dtype(np.float32))
    plan = plan_of(x, [3, 3], dict(strides=[1, 1], pads=[1, 1, 1, 1]))
    tables = max_pool_module.lines_tables("MaxPool-22", plan, 1, 4, 2)
    assert tables.items > 1
    check(LINES, x, [3, 3], strides=[1, 1], pads=[1, 1, 1, 1])


@settings(max_examples=150)
@given(call=calls())
def test_row_blocks_forced_match_oracle(call):
    """The row blocks on every plan they take: ranks 1-4, blocks across planes, rows whose
    padding shares elements with the next row's and rows staged apart, empty windows and
    rows, strides 1-4 and beyond."""
    x, kernel_shape, attributes = call
    check_row_blocks(x, kernel_shape, **attributes)


def check_plane_lanes(x, kernel_shape, **attributes):
    """The plane lanes forced where they can pool the plan; elsewhere (a 1-byte type, large
    planes, long windows) forcing them falls back to another kernel."""
    fits = max_pool_module.plane_lanes_fit(plan_of(x, kernel_shape, attributes),
                                           x.dtype.itemsize)
    check_or_fallback(PLANE_LANES, fits, x, kernel_shape, **attributes)


@settings(max_examples=150)
@given(call=calls())
def test_plane_lanes_forced_match_oracle(call):
    """The plane lanes on every plan they take: ranks 1-4, cut and empty windows, strides,
    dilations, planes shorter than a tile and outputs fewer than a tile's side."""
    x, kernel_shape, attributes = call
    check_plane_lanes(x, kernel_shape, **attributes)


def runs_fit(x, kernel_shape, attributes) -> bool:
    return max_pool_module.runs_fit(plan_of(x, kernel_shape, attributes))


@settings(max_examples=150)
@given(call=calls())
def test_runs_forced_match_oracle(call):
    """The streamed running maxima on every plan they take (all but dilated ones): ranks
    1-4, windows longer than their axis, cut and empty windows, strides beyond the window,
    sides shorter than a transposed tile."""
    x, kernel_shape, attributes = call
    check_or_fallback(RUNS, runs_fit(x, kernel_shape, attributes), x, kernel_shape,
                      **attributes)


def small_runs_slabs(slab_bytes):
    """``max_runs`` cuts planes into slabs of at most ``slab_bytes`` (a few rows), and the
    rows of a leading axis's pass before the last into strips of a few elements."""
    module = max_pool_module
    return patched([(module, "RUNS_SLAB_BYTES", slab_bytes), (module, "RUNS_STRIP_BYTES", 64)],
                   (module.runs_tables, module._pool_launch, module.choose_kernel))


# Sides of a transposed tile and more (16 float32 with AVX-512, the last tile overlapping),
# windows over several blocks of rows, cut by pads before and after, longer than the axis,
# padding-only windows, ceil_mode, strides up to the window; 1-D blocks of rows; 3-D and 4-D.
RUNS_CASES = [
    ((2, 3, 40, 37), [17, 17], dict(auto_pad="SAME_UPPER")),
    ((1, 2, 50, 20), [20, 5], dict(strides=[2, 1], pads=[3, 1, 4, 2], ceil_mode=True)),
    ((1, 1, 19, 70), [3, 31], dict(strides=[1, 4])),
    ((1, 2, 33, 18), [40, 9], dict(pads=[20, 4, 19, 4])),  # windows longer than the axis
    ((1, 1, 20, 24), [16, 16], dict(pads=[18, 17, 18, 17])),  # padding-only windows
    ((1, 3, 70, 48), [33, 1], dict(auto_pad="SAME_LOWER")),  # the last axis left as it is
    ((1, 2, 64, 48), [1, 25], dict(strides=[1, 8])),
    ((300, 1, 45), [24], dict(auto_pad="SAME_UPPER")),  # 1-D: blocks of rows
    ((2, 3, 12, 10, 19), [9, 4, 7], dict(strides=[1, 2, 3], auto_pad="SAME_LOWER")),
    ((1, 2, 5, 6, 7, 20), [3, 4, 2, 12], dict(pads=[1, 2, 0, 5, 2, 3, 1, 6])),
]


def signed_ties(rng, shape, dtype):
    """Negative values and zeros of both signs, so that most maxima are a zero whose sign
    shows which tap was kept, and a few NaNs of two payloads (a float type's)."""
    x = rng.choice(np.array([-2.0, -1.0, 0.0, -0.0]), shape).astype(dtype)
    if dtype.kind in "iu":
        return x
    bits = x.view(np.dtype(f"u{dtype.itemsize}"))
    nan = np.array(np.nan, dtype).view(bits.dtype)
    where = rng.random(shape)
    bits[where < 0.004] = nan
    bits[where < 0.002] = nan | 1  # another payload
    return x


def late_signed_ties(rng, shape, dtype):
    """:func:`signed_ties` in the second half of the first spatial axis, zeros of one sign
    and no NaN before: what the rows hold is found as they are read, and the kernel must
    turn to NaN-aware folds and window-order screens where it first meets a NaN or a -0.0."""
    x = signed_ties(rng, shape, dtype)
    if dtype.kind in "iu":
        return x
    early = x[:, :, :shape[2] // 2]
    bits = early.view(np.dtype(f"u{dtype.itemsize}"))
    bits[np.isnan(early.astype(np.float64))] = np.array(-1.0, dtype).view(bits.dtype)
    bits[early.astype(np.float64) == 0] = 0  # +0.0
    return x


@pytest.mark.parametrize("values_kind", ["nan", "no-nan", "signed-ties", "late-signed-ties"])
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("shape, kernel_shape, attributes", RUNS_CASES)
def test_runs_match_oracle(shape, kernel_shape, attributes, dtype, values_kind):
    """Long windows by streamed running maxima, bit for bit: the first maximum in window
    order, NaNs and zeros of both signs included (also only in an axis's later rows), whole
    planes and slabs of a few rows."""
    rng = np.random.default_rng(zlib.crc32(f"{shape}-{kernel_shape}-{values_kind}".encode()))
    if values_kind == "signed-ties":
        x = signed_ties(rng, shape, dtype)
    elif values_kind == "late-signed-ties":
        x = late_signed_ties(rng, shape, dtype)
    else:
        x = values(rng, shape, dtype, nan_rate=0.02 if values_kind == "nan" else 0.0)
    check(RUNS, x, kernel_shape, **attributes)
    with small_runs_slabs(4 * x.dtype.itemsize * shape[-1]):
        check(RUNS, x, kernel_shape, **attributes)


@pytest.mark.parametrize("values_kind", ["nan", "signed-ties"])
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("shape, kernel_shape, attributes", RUNS_CASES[:5] + [
    ((1, 2, 9, 8, 10), [5, 4, 5], dict(strides=[2, 1, 3], dilations=[1, 2, 1], pads=[2] * 6,
                                      ceil_mode=True)),
    ((2, 1, 12, 11), [9, 8], dict(pads=[8, 0, 0, 7])),  # windows of padding only
])
def test_the_stand_in_pools_long_windows_axis_by_axis(monkeypatch, shape, kernel_shape,
                                                       attributes, dtype, values_kind):
    """While a kernel compiles in a child process, windows of more than 64 taps are pooled
    by the direct scan an axis at a time, the last first: the same bits as the oracle's, NaN
    payloads and zeros' signs included."""
    rng = np.random.default_rng(zlib.crc32(f"{shape}-{kernel_shape}-{values_kind}".encode()))
    if values_kind == "signed-ties":
        x = signed_ties(rng, shape, dtype)
    else:
        x = values(rng, shape, dtype, nan_rate=0.02)
    assert math.prod(kernel_shape) > max_pool_module.STAND_IN_MOST_TAPS
    monkeypatch.setattr(max_pool_module.background, "ready", lambda kernel, arguments: False)
    monkeypatch.setattr(max_pool_module.background, "start_queued", lambda: None)
    ran = []
    by_axes = max_pool_module._PoolLaunch._axis_by_axis
    monkeypatch.setattr(max_pool_module._PoolLaunch, "_axis_by_axis",
                        lambda self, xs, ys: ran.append(1) or by_axes(self, xs, ys))
    max_pool_module._pool_launch.cache_clear()
    try:
        want, _ = oracle.max_pool(
            x, kernel_shape, strides=attributes.get("strides"), pads=attributes.get("pads"),
            dilations=attributes.get("dilations"),
            auto_pad=attributes.get("auto_pad", "NOTSET"),
            ceil_mode=attributes.get("ceil_mode", False))
        y = poolfold.max_pool(x, kernel_shape, **attributes)
        assert ran == [1]
        assert same_bits(y, want)
    finally:
        max_pool_module._pool_launch.cache_clear()


def test_runs_cut_planes_into_slabs_and_rows_into_blocks():
    """Large planes are cut into slabs of output rows, enough that neighbouring slabs share at
    most a third of their rows; few planes into as many slabs as the threads need; 1-D rows
    go in blocks."""
    spec = poolfold.schema.resolve("MaxPool", None)

    def tables(shape, kernel_shape, parts=1):
        plan = max_pool_module.resolve_plan(spec, shape, kernel_shape, None, None, None,
                                            "SAME_UPPER", False)
        return max_pool_module.runs_tables("MaxPool", plan, shape[0] * shape[1], 4, parts)

    big = tables((1, 1, 2048, 2048), [63, 63])
    rows = big.setup[max_pool_module.runs.ROWS_PER_ITEM]
    assert rows >= 2 * 62 and big.items == -(-2048 // rows)
    assert tables((4, 16, 256, 256), [31, 31]).items == 64  # a plane an item
    assert tables((1, 2, 256, 256), [31, 31], parts=2).items > 2  # slabs for the threads
    one_d = tables((4, 512, 256), [63])
    assert one_d.setup[max_pool_module.runs.PLANES_PER_ITEM] > 16 and one_d.items < 2048


# Planes across blocks (64 float32, 32 float64 at a time; the last block partly filled),
# planes and outputs shorter and longer than a tile (16 float32), windows cut and empty.
PLANE_LANES_CASES = [
    ((1, 70, 7, 7), [3, 3], dict(pads=[1, 1, 1, 1])),
    ((2, 37, 14, 14), [2, 2], dict(strides=[2, 2])),
    ((1, 130, 9, 11), [3, 2], dict(strides=[2, 1], pads=[1, 0, 2, 1])),
    ((3, 11, 4, 4), [2, 2], dict(pads=[0, 0, 3, 3])),  # windows of padding only
    ((1, 65, 40), [5], dict(strides=[3], dilations=[2], ceil_mode=True)),
    ((1, 33, 5, 6, 7), [3, 3, 3], dict(strides=[2, 1, 1], pads=[1] * 6)),
    ((2, 40, 28, 28), [3, 3], dict(strides=[2, 2], auto_pad="SAME_UPPER")),
    # windows that tile the rows: the last axis folded first (plane_lanes_row_fold), at a
    # stride of a vector loop (2 to 4) and of the scalar one, with a dilation
    ((1, 70, 6, 12), [2, 2], dict(strides=[2, 3], dilations=[1, 2])),
    ((1, 40, 5, 15), [1, 3], dict(strides=[1, 5])),
    ((1, 33, 4, 6, 8), [2, 2, 2], dict(strides=[2, 2, 2])),
]


@pytest.mark.parametrize("nan", [True, False], ids=["nan", "no-nan"])
@pytest.mark.parametrize("dtype", DTYPES[:4], ids=lambda t: t.name)
@pytest.mark.parametrize("shape, kernel_shape, attributes", PLANE_LANES_CASES)
def test_plane_lanes_match_oracle(shape, kernel_shape, attributes, dtype, nan):
    """Many planes, with NaNs (every block folds NaN-aware) and without (plain comparisons:
    ties of -0.0 and +0.0 must keep the first in window order all the same)."""
    rng = np.random.default_rng(zlib.crc32(f"{shape}-{kernel_shape}-{nan}".encode()))
    x = values(rng, shape, dtype, nan_rate=0.02 if nan else 0.0)
    check(PLANE_LANES, x, kernel_shape, **attributes)


def test_plane_lanes_chosen_for_small_planes_without_indices():
    spec = poolfold.schema.resolve("MaxPool", None)

    def chosen(shape, kernel_shape, strides, itemsize=4, by_rows=True, planes=None):
        plan = max_pool_module.resolve_plan(spec, shape, kernel_shape, strides,
                                            [1] * 2 * (len(shape) - 2), None, "NOTSET", False)
        planes = shape[0] * shape[1] if planes is None else planes
        return max_pool_module.choose_kernel(plan, itemsize, 0, None, by_rows,
                                             planes=planes)[0]

    assert chosen((1, 832, 7, 7), [3, 3], [1, 1]) == PLANE_LANES  # Inception's late pools
    assert chosen((1, 832, 14, 14), [2, 2], [2, 2]) == PLANE_LANES  # before the tiles
    assert chosen((1, 64, 28, 28), [3, 3], [1, 1], itemsize=2) == PLANE_LANES
    # ...but not a half type's plane of more taps, whose rows the row blocks pool fast
    assert chosen((1, 64, 32, 32), [3, 3], [1, 1], itemsize=2) != PLANE_LANES
    assert chosen((1, 64, 32, 32), [3, 3], [1, 1]) == PLANE_LANES
    assert chosen((1, 64, 8, 8, 8), [3, 3, 3], [1, 1, 1], itemsize=8) == PLANE_LANES
    assert chosen((1, 64, 56, 56), [3, 3], [2, 2]) != PLANE_LANES  # planes too large
    assert chosen((1, 64, 20, 20), [3, 3], [1, 1], itemsize=8) != PLANE_LANES  # 2-D float64
    assert chosen((1, 832, 7, 7), [3, 3], [1, 1], itemsize=1) != PLANE_LANES  # 1-byte types
    assert chosen((1, 832, 7, 7), [3, 3], [1, 1], by_rows=False) != PLANE_LANES  # Indices
    assert chosen((1, 2, 7, 7), [3, 3], [1, 1]) != PLANE_LANES  # too few planes
    assert chosen((1, 832, 7, 7), [3, 3], [1, 1], planes=0) != PLANE_LANES  # channels-last
    assert chosen((1, 64, 31, 31), [11, 11], [1, 1]) != PLANE_LANES  # too many taps an output
    assert chosen((1, 256, 20, 20), [9, 9], [1, 1]) == PLANE_LANES  # ...but not 81
    assert chosen((1, 64, 256), [9], [1]) == PLANE_LANES  # 1-D: windows up to 9 taps
    assert chosen((1, 64, 256), [11], [1]) != PLANE_LANES


RELU_CASES = [
    ((2, 3, 20, 17), [3, 3], dict(strides=[2, 2], ceil_mode=True)),
    ((1, 2, 19, 16), [3, 2], dict(dilations=[2, 3], pads=[1, 0, 2, 1])),  # rows with gaps
    ((1, 2, 7, 6, 9), [2, 3, 3], dict(strides=[1, 2, 1], pads=[0, 1, 1, 0, 1, 1])),
]


@pytest.mark.parametrize("where", ["none", "first", "middle", "last"])
@pytest.mark.parametrize("dtype", DTYPES[:4], ids=lambda t: t.name)
@pytest.mark.parametrize("shape, kernel_shape, attributes", RELU_CASES)
def test_row_kernels_search_zeros_only_where_a_negative_zero_is(shape, kernel_shape,
                                                                attributes, dtype, where):
    """Many +0.0 among negative values, with -0.0 in one input row or none: the row kernels
    search windows in window order only where a -0.0 may change the bits (a ReLU's output
    never needs it), so the -0.0 row is the first, a middle and the last, that every part of
    the input is screened."""
    rng = np.random.default_rng(zlib.crc32(f"{shape}-{where}".encode()))
    x = rng.integers(-2, 1, shape).astype(np.float64)  # -2, -1 and +0.0
    rows = x.reshape(-1, shape[-1])
    row = {"none": None, "first": 0, "middle": len(rows) // 2 + 1, "last": len(rows) - 1}[where]
    if row is not None:
        rows[row, rng.random(shape[-1]) < 0.5] = -0.0
    x = x.astype(dtype)
    check(ROWS, x, kernel_shape, **attributes)
    check(ROWS, x, kernel_shape, channels_last=True, **attributes)
    check_row_blocks(x, kernel_shape, **attributes)


def blocks_of_one_row():
    """Blocks of a single output row: the blocks' first and last row are the same."""
    module = max_pool_module
    return patched([(module, "ROW_BLOCK_ELEMENTS", 1)],
                   (module.rows_tables, module._pool_launch, module.choose_kernel))


@settings(max_examples=60)
@given(call=calls(max_rank=3))
def test_row_blocks_of_one_row_match_oracle(call):
    x, kernel_shape, attributes = call
    with blocks_of_one_row():
        check_row_blocks(x, kernel_shape, **attributes)


def test_row_blocks_write_y_in_place_or_staged():
    """Both of the row blocks' layouts (see max_row_blocks): a row's padding shared with the
    next row's where the windows overlap by no more than the padding before the axis, rows
    apart otherwise; and blocks across planes."""
    spec = poolfold.schema.resolve("MaxPool", None)

    def layout(shape, kernel_shape, strides, pads):
        plan = max_pool_module.resolve_plan(spec, shape, kernel_shape, strides, pads, None,
                                            "NOTSET", False)
        return max_pool_module._row_block_layout(plan), plan.out_shape[-1]

    # 57 columns, one of padding before them and one after: 58 elements a row, 29 strides
    (out_pitch, padded, data), out = layout((1, 4, 57, 57), [3, 3], [2, 2], [1, 1, 1, 1])
    assert out_pitch == out == 29 and (padded, data) == (59, 57)
    # 56 columns and one of padding before them do not fit 28 strides
    (out_pitch, padded, data), out = layout((1, 4, 56, 56), [3, 3], [2, 2], [1, 1, 1, 1])
    assert out_pitch == out + 1 == 29 and (padded, data) == (57, 56)
    (out_pitch, padded, data), out = layout((1, 4, 8, 8), [2, 2], [2, 2], None)
    assert out_pitch == out == 4 and (padded, data) == (8, 8)
    (out_pitch, padded, data), out = layout((1, 4, 9, 9), [3, 3], [1, 1], [1, 1, 1, 1])
    assert out_pitch == 11 > out
    rng = np.random.default_rng(4)
    for shape, kernel_shape, attributes in [
            ((2, 3, 57, 57), [3, 3], dict(strides=[2, 2], pads=[1, 1, 1, 1])),
            ((2, 3, 56, 56), [3, 3], dict(strides=[2, 2], pads=[1, 1, 1, 1])),
            ((2, 3, 8, 8), [2, 2], dict(strides=[2, 2])),
            ((2, 3, 9, 9), [3, 3], dict(pads=[1, 1, 1, 1]))]:
        check(ROW_BLOCKS, values(rng, shape, np.dtype(np.float32)), kernel_shape,
              **attributes)


def signed_zeros_and_payloads(rng, shape):
    """float32 values that only window order tells apart: -0.0 and +0.0, NaNs of two
    payloads, below every one of them -1."""
    nans = np.array([0x7FC00001, 0xFFC00002], np.uint32).view(np.float32)
    x = rng.choice(np.array([-1.0, -1.0, 0.0, -0.0], np.float32), shape)
    x[rng.random(shape) < 0.03] = nans[0]
    x[rng.random(shape) < 0.03] = nans[1]
    return x


@pytest.mark.parametrize("kernel_shape,attributes", [
    ([3, 3], dict(strides=[1, 1], pads=[1, 1, 1, 1])),  # rows written in place
    ([3, 3], dict(strides=[2, 2], pads=[1, 1, 1, 1])),  # rows staged apart
    ([2, 4], dict(strides=[2, 3])),
    ([3, 2], dict(strides=[1, 5])),  # a stride past the folds' literals: scanned after
    ([2, 2, 3], dict(strides=[1, 2, 2])),
])
def test_row_blocks_find_zeros_and_nans_again_in_window_order(kernel_shape, attributes):
    """Folding the leading taps first can pick a later -0.0 over an earlier +0.0, or a
    later NaN over an earlier one: the row blocks note, as they store a block's outputs,
    whether any may be a zero or a NaN, and find each such output again in window order
    (same bits as the oracle, payloads and signs included)."""
    rng = np.random.default_rng(8)
    shape = (2, 3) + (7,) * (len(kernel_shape) - 1) + (23,)
    x = signed_zeros_and_payloads(rng, shape)
    check(ROW_BLOCKS, x, kernel_shape, **attributes)


def short_ladders():
    """The row kernel reduces every last-axis window of two taps or more by its ladder of
    runs (at a stride of at most half the window), in chunks of a few outputs: the paths of
    long rows and windows on tiny ones."""
    module = max_pool_module
    return patched([(module, "LADDER_TAPS", 2), (rows_module, "LADDER_CHUNK", 1)],
                   (module.rows_tables, module._pool_launch, module.choose_kernel))


@settings(max_examples=100)
@given(call=calls())
def test_rows_by_short_ladders_match_oracle(call):
    x, kernel_shape, attributes = call
    with short_ladders():
        assert max_pool_module.ladder_wins(2, 1) and not max_pool_module.ladder_wins(2, 2)
        check(ROWS, x, kernel_shape, **attributes)


@settings(max_examples=100)
@given(call=calls(max_rank=3))
def test_passes_in_tiny_slabs_match_oracle(call):
    """Slabs of a row or two (or a few elements of a 1-D row) and van Herk runs on every
    window of two taps or more: the paths of large planes and long windows on tiny ones."""
    x, kernel_shape, attributes = call
    with tiny_slabs():
        check(PASSES, x, kernel_shape, **attributes)


@pytest.mark.parametrize("kernel", GENERAL + PLAIN)
@settings(max_examples=60)
@given(call=calls(max_rank=3))
def test_forced_kernel_channels_last_matches_oracle(kernel, call):
    x, kernel_shape, attributes = call
    check(kernel, x, kernel_shape, channels_last=True, **attributes)


# Long 1-D windows: van Herk runs at their real threshold, cut windows at both ends.
LONG_WINDOWS = [
    (150, [40], dict(strides=[1])),
    (150, [40], dict(strides=[1], pads=[39, 39])),
    (160, [40], dict(strides=[3], pads=[5, 17], ceil_mode=True)),
    (157, [40], dict(strides=[40])),
    (300, [130], dict(strides=[1], auto_pad="SAME_UPPER")),
    (300, [130], dict(strides=[2], auto_pad="SAME_LOWER")),
    (300, [130], dict(strides=[1], dilations=[2], pads=[130, 3])),
    (263, [130], dict(strides=[7], pads=[129, 129])),
]


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("length, kernel_shape, attributes", LONG_WINDOWS)
def test_long_windows_match_oracle(length, kernel_shape, attributes, dtype):
    rng = np.random.default_rng(zlib.crc32(f"{length}-{kernel_shape}-{attributes}".encode()))
    x = values(rng, (2, 3, length), dtype, nan_rate=0.003)
    check(PASSES, x, kernel_shape, **attributes)
    check(ROWS, x, kernel_shape, **attributes)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("shape, kernel_shape, attributes", [
    ((1, 37, 150), [40], dict(dilations=[2], pads=[10, 20])),
    ((2, 3, 21, 50), [3, 20], dict(dilations=[1, 2], auto_pad="SAME_UPPER")),
    ((1, 70, 17), [9], dict(pads=[4, 4])),  # rows of a vector and a bit
])
def test_long_windows_through_lane_tiles(shape, kernel_shape, attributes, dtype):
    """The passes turn rows into lanes by tiles transposed in registers (values alone):
    groups of more rows than a tile's side (half types: two tiles a group), the last group
    partly filled, rows and outputs just longer than a tile."""
    rng = np.random.default_rng(zlib.crc32(f"{shape}-{kernel_shape}".encode()))
    x = values(rng, shape, dtype, nan_rate=0.01)
    check(PASSES, x, kernel_shape, **attributes)


# Hand-picked: every window length 1-9 at strides 1, 2, 3 and = kernel, with pads and
# dilations, in 2-D (the last axis read shifted, as words, or through lanes).
HAND_PICKED = [
    ((2, 3, 11, 13), [k, k], dict(strides=[s, s], pads=[k // 2] * 4))
    for k in range(1, 10) for s in (1, 2, 3)
] + [
    ((2, 3, 11, 13), [k, k], dict(strides=[k, k])) for k in range(1, 10)
] + [
    ((1, 2, 12, 10), [3, 4], dict(strides=[2, 3], dilations=[2, 3], pads=[3, 0, 5, 6])),
    ((1, 2, 9, 10), [3, 3], dict(pads=[3, 3, 3, 3])),  # empty corner windows
    ((1, 2, 9, 10), [3, 3], dict(strides=[2, 2], pads=[4, 5, 4, 5], ceil_mode=True)),
    ((1, 2, 9, 10), [5, 5], dict(strides=[2, 2], auto_pad="SAME_LOWER", dilations=[2, 1])),
    ((2, 2, 5, 6, 7), [3, 3, 3], dict(strides=[2, 2, 2], pads=[1] * 6)),
    ((1, 2, 6, 7, 9), [3, 3, 5], dict(auto_pad="SAME_UPPER")),  # rows: runs on the last axis
    ((1, 2, 4, 5, 3, 4), [2, 3, 2, 2], dict(strides=[1, 2, 1, 2], pads=[0, 1, 1, 0] * 2)),
    ((1, 3, 1, 17), [1, 9], dict(strides=[1, 1], pads=[0, 8, 0, 8])),
    # last-axis windows of 8 taps and more: the row kernel's ladder of runs
    ((1, 2, 5, 40), [3, 17], dict(strides=[1, 2], pads=[1, 8, 1, 8])),
    ((1, 2, 6, 50), [2, 9], dict(dilations=[1, 3], auto_pad="SAME_LOWER")),
]


# Leading axes that every window spans one element of, in place (kernel 1, stride 1, no
# pads), are pooled as planes of their own (WindowPlan.planes_from_leading_axes): a 3-D
# 1x3x3 window as a 2-D 3x3 one over D times the planes.  Row-major Indices keep their flat
# offsets; column-major ones, and channels-last Indices, keep the whole plan.
LEADING_PLANES = [
    ((2, 3, 4, 7, 9), [1, 3, 3], dict(strides=[1, 2, 2], pads=[0, 1, 1, 0, 1, 1]), 24),
    ((1, 2, 3, 2, 6, 8), [1, 1, 2, 3], dict(strides=[1, 1, 2, 1], pads=[0, 0, 1, 1] * 2), 12),
    ((2, 2, 5, 8), [1, 3], dict(dilations=[4, 1], pads=[0, 2, 0, 2]), 20),  # a 1-tap dilation
    ((1, 2, 3, 6), [1, 1], {}, 6),  # windows of one tap: the last axis stays
    ((2, 2, 4, 6, 6), [1, 2, 2], dict(strides=[1, 2, 2]), 16),  # 2x2 tiles
    ((2, 2, 4, 6, 6), [1, 2, 2], dict(pads=[1, 0, 0, 0, 0, 0]), 4),  # padded: not planes
    ((2, 2, 4, 6, 6), [1, 2, 2], dict(strides=[2, 1, 1]), 4),  # strided: not planes
]


@pytest.mark.parametrize("dtype", [np.dtype(np.float32), np.dtype(np.float16),
                                   np.dtype(np.int8)], ids=lambda t: t.name)
@pytest.mark.parametrize("shape, kernel_shape, attributes, planes", LEADING_PLANES)
def test_leading_axes_of_one_tap_are_planes(shape, kernel_shape, attributes, planes, dtype):
    rng = np.random.default_rng(zlib.crc32(f"{shape}-{kernel_shape}-{attributes}".encode()))
    x = values(rng, shape, dtype)
    for kernel in GENERAL + PLAIN:
        for storage_order in (0, 1):
            check(kernel, x, kernel_shape, storage_order=storage_order, **attributes)
        check(kernel, x, kernel_shape, channels_last=True, **attributes)
    check_row_blocks(x, kernel_shape, **attributes)
    max_pool_module._LAUNCHES.clear()
    poolfold.max_pool(x, kernel_shape, **attributes)
    for storage_order in (0, 1):
        poolfold.max_pool(x, kernel_shape, storage_order=storage_order, return_indices=True,
                          **attributes)
    launches = list(max_pool_module._LAUNCHES.values())
    assert [launch.planes for launch in launches] == [planes, planes, shape[0] * shape[1]]
    for launch in launches[:2]:  # the kernel chosen for the plan with the planes taken out
        plan = max_pool_module.resolve_plan(
            poolfold.schema.resolve("MaxPool", None), shape, kernel_shape,
            attributes.get("strides"), attributes.get("pads"), attributes.get("dilations"),
            "NOTSET", False).planes_from_leading_axes()[0]
        assert launch.kernel == max_pool_module.choose_kernel(
            plan, dtype.itemsize, 0, None, launch is launches[0], planes=planes)[0]


@pytest.mark.parametrize("kernel", GENERAL)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("shape, kernel_shape, attributes", HAND_PICKED)
def test_hand_picked_match_oracle(shape, kernel_shape, attributes, dtype, kernel):
    if kernel == DIRECT and math.prod(kernel_shape) > 9 and dtype.itemsize != 4:
        pytest.skip("the direct scan's long windows: float32 is enough")
    rng = np.random.default_rng(zlib.crc32(f"{shape}-{kernel_shape}-{attributes}".encode()))
    x = values(rng, shape, dtype)
    for storage_order in (0, 1):
        check(kernel, x, kernel_shape, storage_order=storage_order, **attributes)
    check(kernel, x, kernel_shape, channels_last=True, **attributes)
    if kernel == PASSES:  # the row kernels beside it, on the same values
        check(ROWS, x, kernel_shape, **attributes)
        check(ROWS, x, kernel_shape, channels_last=True, **attributes)
        check_row_blocks(x, kernel_shape, **attributes)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda t: t.name)
def test_tiles_and_separable_forced_where_they_apply(dtype):
    rng = np.random.default_rng(3)
    x = values(rng, (2, 3, 8, 10), dtype)
    if dtype.itemsize < 8:  # pairs of elements read as words
        check(TILES, x, [2, 2], strides=[2, 2])
    check(SEPARABLE, x, [3, 3], strides=[2, 2], pads=[1, 1, 1, 1])


def test_a_forced_kernel_that_cannot_pool_the_plan_falls_back_and_says_so():
    # rows not short, too few planes for the plane lanes
    x = np.arange(3 * 7 * 40, dtype=np.float32).reshape(1, 3, 7, 40)
    with forced_kernel(TILES) as override:
        poolfold.max_pool(x, [3, 3])
    assert override.ran == [LINES]  # the kernel the call takes unforced
    plan = max_pool_module.resolve_plan(
        poolfold.schema.resolve("MaxPool", None), x.shape, [3, 3], None, None, None,
        "NOTSET", False)
    kernel, reason = max_pool_module.choose_kernel(plan, 4, 0, TILES)
    assert kernel == PASSES and "forced tiles refused" in reason


def test_rows_are_chosen_where_measured_faster_and_never_for_indices():
    x = np.zeros((1, 2, 30, 30), np.float32)
    spec = poolfold.schema.resolve("MaxPool", None)

    def chosen(kernel_shape, strides, by_rows=True, shape=x.shape, itemsize=4, lanes=1,
               planes=0):
        plan = max_pool_module.resolve_plan(spec, shape, kernel_shape, strides, None, None,
                                            "NOTSET", False)
        return max_pool_module.choose_kernel(plan, itemsize, 0, None, by_rows, lanes,
                                             planes)[0]

    wide = (1, 2, 30, 600)  # rows too long for blocks of rows
    assert chosen([5, 5], [3, 3], shape=wide) == ROWS  # a strided last axis
    assert chosen([5, 5], [3, 3]) == ROW_BLOCKS  # ...whose rows are short
    assert chosen([7, 7], [1, 1]) == ROW_BLOCKS  # a window van Herk runs would take
    assert chosen([7, 7], [1, 1], itemsize=8, shape=wide) == RUNS  # ...over long rows
    assert chosen([7, 7], [1, 1], itemsize=2, shape=wide) == RUNS
    assert chosen([5, 5], [1, 1], itemsize=8, shape=wide) == ROWS
    assert chosen([5, 5], [3, 3], by_rows=False) not in WITHOUT_INDICES  # Indices
    # 2-D windows of 2 or 3 taps an axis at strides 1 and 2, 4- and 8-byte types: the lines,
    # whatever the rows' length
    assert chosen([3, 3], [1, 1]) == LINES
    assert chosen([3, 3], [1, 1], shape=(1, 832, 7, 7)) == LINES
    assert chosen([3, 3], [1, 1], shape=(1, 2, 15, 15), itemsize=8) == LINES
    assert chosen([3, 3], [2, 2], shape=wide) == LINES
    assert chosen([3, 3], [2, 2]) == LINES
    assert chosen([2, 2], [2, 2]) == LINES
    assert chosen([2, 2], [2, 2], shape=wide) == LINES
    assert chosen([3, 3], [2, 2], shape=(1, 2, 31, 31)) == ROW_BLOCKS  # ...not rows of 31
    assert chosen([3, 3], [3, 3]) == ROW_BLOCKS  # ...nor at stride 3
    assert chosen([4, 4], [2, 2]) == ROW_BLOCKS  # ...nor windows of 4
    # short windows at stride 1 elsewhere: the passes, but for rows of at most 112 bytes in
    # 2-D, 32 in 3-D
    assert chosen([3, 3], [1, 1], shape=(1, 2, 28, 28), itemsize=2) == ROW_BLOCKS
    assert chosen([3, 3, 3], [1, 1, 1], shape=(1, 2, 7, 7, 8)) == ROW_BLOCKS
    assert chosen([3], [1], shape=(1, 2, 7)) == PASSES  # 1-D: the passes
    assert chosen([3, 3], [1, 1], itemsize=2) == ROW_BLOCKS  # ...but for the narrow types
    assert chosen([3, 3], [1, 1], itemsize=1) == ROW_BLOCKS
    assert chosen([3, 3], [2, 2], shape=wide, itemsize=2) == ROWS  # a last axis at stride 2
    assert chosen([3, 3], [2, 2], itemsize=2) == ROW_BLOCKS
    assert chosen([3, 3, 3], [2, 2, 2], shape=(1, 2, 9, 9, 9)) == ROW_BLOCKS
    assert chosen([17, 1], [1, 1]) == RUNS  # each output row would fold 17 rows
    assert chosen([17, 3], [2, 2], itemsize=2) == PASSES  # a half type's short rows
    assert chosen([17, 3], [2, 2], itemsize=2, shape=(1, 2, 30, 40)) == RUNS
    assert chosen([17, 1], [1, 1], by_rows=False) == PASSES
    # 3-D at stride 1: rows where the passes would take the last axis by van Herk runs and
    # the leading axes hold at most 25 taps
    cube, long_rows = (1, 2, 12, 12, 12), (1, 2, 9, 9, 300)
    assert chosen([3, 3, 3], [1, 1, 1], shape=cube) == PASSES
    assert chosen([5, 5, 5], [1, 1, 1], shape=cube) == ROW_BLOCKS
    assert chosen([5, 5, 5], [1, 1, 1], shape=cube, itemsize=1) == ROW_BLOCKS
    assert chosen([3, 3, 5], [1, 1, 1], shape=long_rows) == ROWS
    assert chosen([3, 3, 5], [1, 1, 1], shape=long_rows, itemsize=2) == ROWS
    assert chosen([5, 5, 3], [1, 1, 1], shape=cube) == PASSES  # runs on a leading axis only
    assert chosen([7, 7, 5], [1, 1, 1], shape=cube) == PASSES  # short rows: not runs
    assert chosen([7, 7, 5], [1, 1, 1], shape=(1, 2, 12, 12, 40)) == RUNS  # 245 taps
    assert chosen([3, 3, 3], [2, 2, 2], shape=(1, 2, 9, 9, 9), itemsize=1) == ROW_BLOCKS
    assert chosen([3, 3, 3], [2, 2, 2], shape=(1, 2, 9, 300, 300), itemsize=1) not in \
        WITHOUT_INDICES  # uint8, long rows: not the row kernel
    assert chosen([3, 3, 3], [1, 1, 1], shape=(1, 2, 9, 9, 9)) not in WITHOUT_INDICES
    assert chosen([3, 3, 3], [1, 1, 1], shape=(1, 2, 9, 9, 9), itemsize=1) == PASSES
    assert chosen([2, 2], [2, 2], itemsize=2) == ROW_BLOCKS  # the tiles: slower without
    # Indices
    assert chosen([2, 2], [2, 2], shape=wide, itemsize=2) == TILES  # ...but over rows too
    # long for blocks
    assert chosen([2, 2], [2, 2], itemsize=2, by_rows=False) == TILES  # Indices
    # long windows: streamed running maxima, not with Indices nor channels-last
    assert chosen([21, 21], [1, 1]) == RUNS
    assert chosen([9, 9], [1, 1]) == RUNS
    assert chosen([9, 9], [2, 2]) != RUNS  # ...at a stride of more than an eighth
    assert chosen([7, 7], [1, 1]) != RUNS
    assert chosen([32, 32], [8, 8], shape=(1, 2, 90, 600)) == RUNS
    assert chosen([21, 21], [21, 21], shape=(1, 2, 90, 600)) != RUNS  # windows apart
    assert chosen([21, 21], [1, 1], by_rows=False) == PASSES
    assert chosen([21, 21], [1, 1], lanes=16) == PASSES
    assert chosen([31], [1], shape=(1, 2, 300)) == RUNS  # 1-D: running maxima
    assert chosen([31], [1], shape=(1, 2, 3000)) == ROWS  # ...but over long rows
    assert chosen([31], [4], shape=(1, 2, 300)) == ROWS  # ...or at a stride
    assert chosen([5], [1], shape=(1, 2, 200), itemsize=2) == ROW_BLOCKS
    assert chosen([5], [1], shape=(1, 2, 200)) == PASSES  # short 1-D rows at stride 1
    assert chosen([5], [2], shape=(1, 2, 200)) == ROW_BLOCKS
    assert chosen([128], [1], shape=(1, 2, 3000)) == ROWS  # long rows: a ladder of runs
    # channels-last samples (lanes: their channels): rows for windows of up to 16 taps an
    # axis, but 8-byte 1-D windows the passes take by van Herk runs; never tiles
    assert chosen([2, 2], [2, 2], lanes=24) == ROWS
    assert chosen([3, 3], [1, 1], lanes=8) == ROWS
    assert chosen([7, 7], [1, 1], lanes=16) == ROWS
    assert chosen([21, 21], [1, 1], lanes=16) == PASSES
    assert chosen([9], [1], shape=(1, 2, 300), lanes=4) == ROWS
    assert chosen([9], [1], shape=(1, 2, 300), itemsize=8, lanes=4) == PASSES
    assert chosen([128], [1], shape=(1, 2, 300), lanes=4) == PASSES  # no ladder with lanes
    assert chosen([3, 3], [2, 2], by_rows=False, lanes=8) == PASSES  # Indices
    plan = max_pool_module.resolve_plan(spec, x.shape, [3, 3], [2, 2], None, None, "NOTSET",
                                        False)
    kernel, reason = max_pool_module.choose_kernel(plan, 4, 0, ROW_BLOCKS, True, 8)
    assert kernel != ROW_BLOCKS and "several channels" in reason  # blocks: one channel
    with forced_kernel(ROWS) as override:  # forced with Indices: refused, and said so
        poolfold.max_pool(x, [3, 3], return_indices=True)
    assert override.ran == [PASSES]


def test_forced_and_chosen_launches_are_cached_apart():
    """A forced kernel never reuses the launch a plain call built, nor the other way round."""
    x = values(np.random.default_rng(1), (1, 2, 9, 9), np.dtype(np.float32))
    plain = poolfold.max_pool(x, [3, 3], strides=[2, 2])
    for kernel in (DIRECT, PASSES):
        with forced_kernel(kernel) as override:
            forced = poolfold.max_pool(x, [3, 3], strides=[2, 2])
        assert override.ran == [kernel]
        assert same_bits(forced, plain)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("channels_last", [False, True])
def test_a_stride_far_beyond_the_axis_needs_no_scratch_for_it(dtype, channels_last):
    """Found by the fuzz judge: kernel 4 at stride 2**31 over a 4-element axis (one output)
    was refused for 128 GiB of scratch: the passes sized their phases by the stride, though
    an axis of n rows fills at most n of them."""
    import poolfold.nhwc

    x = np.random.default_rng(1).standard_normal((6, 6, 4)).astype(dtype)
    want = oracle.max_pool(x, [4], strides=[2**31])[0]
    with forced_kernel(PASSES) as override:
        if channels_last:
            got = poolfold.nhwc.max_pool(np.ascontiguousarray(np.moveaxis(x, 1, -1)), [4],
                                         strides=[2**31])
            got = np.moveaxis(got, -1, 1)
        else:
            got = poolfold.max_pool(x, [4], strides=[2**31])
    assert override.ran == [PASSES], override.ran
    np.testing.assert_array_equal(got, want)


def test_plane_lanes_refuse_plans_whose_table_would_be_large():
    """Planes padded far beyond their size have many outputs, long windows many taps, even
    where few lie in bounds: the plane lanes take neither, forced or not."""
    spec = poolfold.schema.resolve("MaxPool", None)
    padded = max_pool_module.resolve_plan(spec, (1, 64, 4, 4), [1, 1], None, [100] * 4,
                                          None, "NOTSET", False)
    long = max_pool_module.resolve_plan(spec, (1, 64, 8, 8, 8), [64, 64, 64], None,
                                        [63] * 6, None, "NOTSET", False)
    for plan in (padded, long):
        assert not max_pool_module.plane_lanes_fit(plan, 4)
    x = np.ones((1, 64, 4, 4), np.float32)
    with forced_kernel(PLANE_LANES) as override:
        y = poolfold.max_pool(x, [1, 1], pads=[100] * 4)
    assert override.ran != [PLANE_LANES] and y.shape == (1, 64, 204, 204)
