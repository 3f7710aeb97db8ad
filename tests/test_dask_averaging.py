"""poolfold.dask's averaging family (AveragePool, LpPool, the global pools, channels-first and
channels-last) against the in-memory functions: the same bits on every chunking (chunks of
one, chunks smaller than a window, uneven chunks), every attribute and type; errors when the
graph is built, with the in-memory messages; nothing computed until asked; and a run on a
LocalCluster of two process workers."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

da = pytest.importorskip("dask.array")
dask = pytest.importorskip("dask")
distributed = pytest.importorskip("distributed")

import poolfold  # noqa: E402
import poolfold.dask as pdask  # noqa: E402
from poolfold import schema  # noqa: E402
from poolfold.dask.averaging import slab_plan, whole_axes  # noqa: E402
from poolfold.ops.averaging import row_start_axes, running_sum_axes, window_tables  # noqa: E402
from poolfold.ops.max_pool import resolve_plan  # noqa: E402

THREADS = {"scheduler": "threads"}
BF16 = ml_dtypes.bfloat16


@pytest.fixture(scope="module")
def client():
    """Two single-threaded process workers; kernels load from numba's on-disk cache."""
    cluster = distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                       dashboard_address=None, memory_limit="2GiB",
                                       env={"POOLFOLD_NUM_THREADS": "1"})
    with distributed.Client(cluster) as c:
        yield c
    cluster.close()


def assert_same(got, expected):
    """Equal dtype, shape and bits (NaN payloads and the sign of zero included)."""
    assert got.dtype == expected.dtype
    assert got.shape == expected.shape
    assert got.tobytes() == expected.tobytes()


def data(shape, dtype=np.float32, seed=0, specials=True, spread=8):
    """Values over 2 * ``spread`` binades, signs mixed; with ``specials`` a NaN, an inf and a
    -inf at random places."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape) * 2.0 ** rng.integers(-spread, spread, shape)
    with np.errstate(over="ignore"):  # float16 and a wide spread: some infinities
        x = x.astype(dtype)
    if specials and x.size > 6:
        places = rng.choice(x.size, 3, replace=False)
        x.flat[places] = np.array([np.nan, np.inf, -np.inf]).astype(dtype)
    return x


# Every windowed op, as (in-memory, chunked, attributes beyond the geometry).
def average(cip):
    return poolfold.average_pool, pdask.average_pool, dict(count_include_pad=cip)


def lp(p):
    return poolfold.lp_pool, pdask.lp_pool, dict(p=p)


WINDOWED = {"avg0": average(0), "avg1": average(1), "lp1": lp(1), "lp2": lp(2), "lp3": lp(3),
            "lp9": lp(9)}  # p = 9: LpPool's scaled sums

GEOMETRIES_2D = [
    dict(kernel_shape=[2, 2], strides=[2, 2]),
    dict(kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
    dict(kernel_shape=[3, 2], strides=[2, 1], pads=[1, 0, 4, 3], dilations=[2, 1], ceil_mode=1),
    dict(kernel_shape=[3, 3], strides=[2, 3], auto_pad="SAME_UPPER"),
    dict(kernel_shape=[3, 3], strides=[2, 3], auto_pad="SAME_LOWER", dilations=[2, 1]),
    dict(kernel_shape=[2, 3], strides=[3, 2], auto_pad="VALID"),
    dict(kernel_shape=[2, 2], strides=[2, 2], pads=[3, 3, 3, 3], dilations=[3, 2]),  # empty
    dict(kernel_shape=[3, 4], strides=[2, 3], pads=[0, 2, 0, 0], ceil_mode=1),  # overhang
    # windows too large for the row sums: running sums on both axes (float32), on the last
    dict(kernel_shape=[25, 16], pads=[12, 8, 12, 8]),
    dict(kernel_shape=[2, 70], pads=[0, 35, 1, 35], dilations=[2, 1], ceil_mode=1),
]
SHAPE_2D = (2, 2, 9, 10)
CHUNKS_2D = [(1, 1, 1, 1), (1, 2, 2, 3), (2, (1, 1), (4, 1, 4), (2, 5, 3)), SHAPE_2D]


@pytest.mark.parametrize("chunks", CHUNKS_2D, ids=["ones", "small", "uneven", "whole"])
@pytest.mark.parametrize("geometry", range(len(GEOMETRIES_2D)))
def test_windowed_2d_matches_in_memory(geometry, chunks):
    x = data(SHAPE_2D, seed=geometry)
    kw = GEOMETRIES_2D[geometry]
    for op in ("avg0", "avg1", "lp2"):
        in_memory, chunked, extra = WINDOWED[op]
        expected = in_memory(x, **kw, **extra)
        got = chunked(da.from_array(x, chunks=chunks), **kw, **extra)
        assert_same(got.compute(**THREADS), expected)


def test_geometries_cover_empty_windows_overhang_and_running_sums():
    """The cases above reach what they claim: windows with no tap in X (NaN / 0), a ceil-mode
    window whose |P| is cut by the end of the padded extent, running sums."""
    x = data(SHAPE_2D, specials=False)
    assert np.isnan(poolfold.average_pool(x, **GEOMETRIES_2D[6])).any()
    assert (poolfold.average_pool(x, **GEOMETRIES_2D[6], count_include_pad=1) == 0).any()
    spec = schema.resolve("AveragePool", None)
    plan = resolve_plan(spec, SHAPE_2D, **{"pads": None, "dilations": None, "strides": None,
                                           "auto_pad": "NOTSET", "ceil_mode": 0,
                                           **GEOMETRIES_2D[7]})
    padded = window_tables(plan, "padded").divisor.reshape(plan.out_shape)
    assert padded[0, -1] < padded[0, 0]  # the last window along W counts fewer taps
    for geometry, expected in ((8, (True, True)), (9, (False, True)), (1, (False, False))):
        plan = resolve_plan(spec, SHAPE_2D, **{"pads": None, "dilations": None, "strides": None,
                                               "auto_pad": "NOTSET", "ceil_mode": 0,
                                               **GEOMETRIES_2D[geometry]})
        assert running_sum_axes(plan, np.float32, "average") == expected
        assert running_sum_axes(plan, np.float64, "average") == (False, False)


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16, BF16])
@pytest.mark.parametrize("geometry", [2, 7, 8])
def test_types_and_every_op(dtype, geometry):
    x = data(SHAPE_2D, dtype, seed=3)
    kw = GEOMETRIES_2D[geometry]
    for op, (in_memory, chunked, extra) in WINDOWED.items():
        expected = in_memory(x, **kw, **extra)
        got = chunked(da.from_array(x, chunks=CHUNKS_2D[2]), **kw, **extra)
        assert_same(got.compute(**THREADS), expected)


def test_rank_1_and_3():
    x1 = data((2, 3, 23), seed=1)
    for kw in (dict(kernel_shape=[4], strides=[3], pads=[2, 2]),
               dict(kernel_shape=[3], strides=[2], pads=[0, 1], ceil_mode=1),
               dict(kernel_shape=[8], auto_pad="SAME_UPPER"),
               dict(kernel_shape=[2], dilations=[3], auto_pad="SAME_LOWER")):
        for op in ("avg0", "avg1", "lp1", "lp3"):
            in_memory, chunked, extra = WINDOWED[op]
            for chunks in ((1, 2, 3), (2, 1, 1), (1, 3, (5, 1, 9, 8))):
                got = chunked(da.from_array(x1, chunks=chunks), **kw, **extra)
                assert_same(got.compute(**THREADS), in_memory(x1, **kw, **extra))
    x3 = data((1, 2, 6, 5, 7), np.float64, seed=2)
    for kw in (dict(kernel_shape=[2, 3, 2], strides=[2, 1, 2], pads=[0, 1, 1, 1, 1, 0],
                    ceil_mode=1),
               dict(kernel_shape=[3, 2, 3], dilations=[1, 2, 2], auto_pad="SAME_UPPER")):
        for op in ("avg0", "avg1", "lp2", "lp9"):
            in_memory, chunked, extra = WINDOWED[op]
            for chunks in ((1, 1, 2, 3, 4), (1, 2, 1, 1, 1)):
                got = chunked(da.from_array(x3, chunks=chunks), **kw, **extra)
                assert_same(got.compute(**THREADS), in_memory(x3, **kw, **extra))
    x3 = data((1, 2, 8, 5, 9), seed=4)  # float32: block sums, axis 1 by blocks
    kw = dict(kernel_shape=[2, 13, 70], pads=[1, 6, 35, 0, 6, 35])
    got = pdask.average_pool(da.from_array(x3, chunks=(1, 1, 3, 2, 4)), **kw)
    assert all(len(c) > 1 for c in got.chunks[2:])
    assert_same(got.compute(**THREADS), poolfold.average_pool(x3, **kw))


def test_overhang_divisor_on_every_slab():
    """count_include_pad=1 with the ceil-mode overhang at the tensor's end: each slab's own
    plan counts the whole tensor's |P| for every window (a slab that stops at the tensor's end
    while its last window reaches past the padded extent), and |V| likewise."""
    spec = schema.resolve("AveragePool", None)
    for kw, chunks in ((dict(kernel_shape=[3], strides=[2], pads=[1, 1], ceil_mode=1), (3, 4, 5)),
                       (dict(kernel_shape=[3], strides=[2], dilations=[2], pads=[0, 0],
                             ceil_mode=1), (1,) * 12),
                       (dict(kernel_shape=[4], strides=[3], pads=[2, 0], ceil_mode=1), (5, 7))):
        plan = resolve_plan(spec, (1, 1, 12), kw["kernel_shape"], kw["strides"], kw["pads"],
                            kw.get("dilations"), "NOTSET", 1)
        y = pdask.average_pool(da.from_array(np.ones((1, 1, 12), np.float32),
                                             chunks=(1, 1, chunks)), **kw)
        starts = np.concatenate([[0], np.cumsum(y.chunks[2])])
        for divisor in ("padded", "valid"):
            whole = window_tables(plan, divisor).divisor
            assert divisor == "valid" or whole[-1] < kw["kernel_shape"][0]  # an overhang
            for key, task in dict(y.dask.layers[y.name]).items():
                sub = task[6]  # the slab's plan (see _windows_block's arguments)
                o0 = int(starts[key[3]])
                assert window_tables(sub, divisor).divisor.tolist() == \
                    whole[o0:o0 + sub.out_shape[0]].tolist()
        x = data((1, 1, 12), seed=5, specials=False)
        for cip in (0, 1):
            assert_same(pdask.average_pool(da.from_array(x, chunks=(1, 1, chunks)),
                                           count_include_pad=cip, **kw).compute(**THREADS),
                        poolfold.average_pool(x, count_include_pad=cip, **kw))
    # The slab plan the MaxPool graph uses (padding only as far as the windows reach) would
    # count the overhang: the reason for slab_plan's end padding.
    from poolfold.dask.pool import block_plan

    plan = resolve_plan(spec, (1, 1, 12), [3], [2], [1, 1], None, "NOTSET", 1)
    last = ((plan.out_shape[0] - 2, plan.out_shape[0]), (9, 12))
    assert window_tables(block_plan(plan, [last]), "padded").divisor.tolist() == [3.0, 3.0]
    assert window_tables(slab_plan(plan, [last]), "padded").divisor.tolist() == [3.0, 2.0]


def test_running_sums_keep_axes_whole_and_match_bits():
    """The separable passes' running sums (channels-last, windows of many overlapping taps)
    start where a row starts, and a non-finite value anywhere in a row turns it to direct
    adds: pooling slabs on their own may round differently, so the chunked op keeps such
    axes whole, and the axes after them, and has the in-memory bits."""
    x = data((1, 40, 12, 20), seed=3, spread=40)
    x[0, 4, 7, 2] = np.inf
    kw = dict(kernel_shape=[30, 6], strides=[10, 1], pads=[15, 2, 14, 3])
    plan = resolve_plan(schema.resolve("AveragePool", None), (1, 20, 40, 12),
                        kw["kernel_shape"], kw["strides"], kw["pads"], None, "NOTSET", 0)
    assert row_start_axes(plan, np.float32, "average", one_channel=False) == (False, True)
    for op in ("avg1", "lp3"):
        in_memory, chunked, extra = WINDOWED[op]
        in_memory = getattr(poolfold.nhwc, in_memory.__name__)
        chunked = getattr(pdask.nhwc, chunked.__name__)
        got = chunked(da.from_array(x, chunks=(1, 7, 5, 9)), **kw, **extra)
        assert len(got.chunks[1]) > 1 and len(got.chunks[2]) == 1
        assert_same(got.compute(**THREADS), in_memory(x, **kw, **extra))


def test_block_sums_chunk_every_axis():
    """The block sums place a leading axis's blocks from the whole row's first position,
    and a slab is told where its rows start in it: every axis stays chunked, and each
    window is summed as in memory.  A column of values over 140 binades, pooled along 80
    taps by blocks, rounds otherwise wherever the blocks fall elsewhere; the last axis,
    by doubling, groups a window's sum by its taps' places in the window alone."""
    rng = np.random.default_rng(0)
    column = np.concatenate([[2.0 ** 100], rng.random(59) * 2.0 ** 40, rng.random(340) + 0.5])
    column = column.astype(np.float32)
    spec = schema.resolve("AveragePool", None)
    x = np.repeat(column.reshape(1, 1, 400, 1), 3, axis=3)
    plan = resolve_plan(spec, x.shape, [80, 1], None, None, None, "NOTSET", 0)
    assert running_sum_axes(plan, np.float32, "average") == (True, False)
    assert row_start_axes(plan, np.float32, "average") == (False, False)
    got = pdask.average_pool(da.from_array(x, chunks=(1, 1, 100, 2)), [80, 1])
    assert got.chunks[2:] == ((61, 100, 100, 60), (2, 1))
    assert_same(got.compute(**THREADS), poolfold.average_pool(x, [80, 1]))
    x = column.reshape(1, 1, 400)
    plan = resolve_plan(spec, x.shape, [80], None, None, None, "NOTSET", 0)
    assert running_sum_axes(plan, np.float32, "average") == (True,)
    assert row_start_axes(plan, np.float32, "average") == (False,)
    got = pdask.average_pool(da.from_array(x, chunks=(1, 1, 100)), [80])
    assert len(got.chunks[2]) > 1
    assert_same(got.compute(**THREADS), poolfold.average_pool(x, [80]))
    # A non-finite value at the row's end stays in the windows that hold it.
    x[0, 0, 399] = np.inf
    assert_same(pdask.average_pool(da.from_array(x, chunks=(1, 1, 7)), [80]).compute(**THREADS),
                poolfold.average_pool(x, [80]))
    # A direct leading axis and one by blocks, each with a doubled last axis.
    x2 = data((1, 2, 12, 100), seed=6, spread=40)
    x2[0, 1, 5, 30] = -np.inf
    for kw in (dict(kernel_shape=[3, 70], pads=[1, 0, 1, 0]),
               dict(kernel_shape=[30, 3], strides=[1, 2], pads=[15, 0, 15, 0])):
        for op in ("avg1", "lp3"):
            in_memory, chunked, extra = WINDOWED[op]
            got = chunked(da.from_array(x2, chunks=(1, 1, 5, 9)), **kw, **extra)
            assert_same(got.compute(**THREADS), in_memory(x2, **kw, **extra))
            assert len(got.chunks[2]) > 1 and len(got.chunks[3]) > 1


@pytest.mark.parametrize("kw", [dict(kernel_shape=[13, 13], auto_pad="SAME_UPPER"),
                                dict(kernel_shape=[9, 9, 15], strides=[1, 2, 1],
                                     pads=[4, 0, 3, 4, 0, 5]),
                                dict(kernel_shape=[1, 15, 15], auto_pad="SAME_LOWER")],
                         ids=["13x13", "9x9x15-s2", "1x15x15"])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_block_sums_chunks_match_bits(kw, dtype):
    """Chunks smaller than the windows, on every axis, give the in-memory bits: each column
    is summed along the leading axes on its own, blocks placed as the whole tensor's, the
    last axis by doubling, and a window whose float32 sum is not finite is summed again in
    float64 whichever columns a slab holds (sums past float32 in one corner, a NaN and an
    inf elsewhere)."""
    rank = len(kw["kernel_shape"])
    shape = (1, 2) + ((40, 90) if rank == 2 else (11, 17, 60))
    x = np.random.default_rng(12).standard_normal(shape)
    corner = (0, 0) + (slice(2, 9),) * (rank - 1) + (slice(20, 50),)
    x[corner] = 3.0e37 if dtype == np.float32 else 6.0e4
    x[(0, 1) + (5,) * rank] = np.nan
    x[(0, 1) + (3,) * (rank - 1) + (40,)] = np.inf
    x = x.astype(dtype)
    chunks = (1, 1) + (7,) * rank
    got = pdask.average_pool(da.from_array(x, chunks=chunks), **kw)
    geometry = [kw.get("strides"), kw.get("pads"), None, kw.get("auto_pad", "NOTSET"), 0]
    plan = resolve_plan(schema.resolve("AveragePool", None), x.shape, kw["kernel_shape"],
                        *geometry)
    assert any(running_sum_axes(plan, x.dtype, "average")[:-1])
    assert not any(whole_axes(plan, x.dtype, "average", 2.0, True))
    assert all(len(c) > 1 for c in got.chunks[2:])
    expected = poolfold.average_pool(x, **kw)
    assert np.isfinite(expected[0, 0].astype(np.float32)).all()
    assert_same(got.compute(**THREADS), expected)


@pytest.mark.parametrize("seed", range(8))
def test_block_sums_random_slabs_match_bits(seed):
    """Random windows of 6 to 13 taps on 2 or 3 axes (leading axes by blocks), strides,
    dilations, pads, ceil mode, over values of 40 binades, chunked at random sizes: slabs
    whose rows start anywhere in the whole tensor's blocks give its bits, AveragePool and
    LpPool, float32, float16 and bfloat16."""
    rng = np.random.default_rng(seed)
    spec = schema.resolve("AveragePool", None)
    taken = 0
    while taken < 3:
        rank = int(rng.integers(2, 4))
        shape = (1, 2) + tuple(int(v) for v in rng.integers(8, 30 if rank == 3 else 60, rank))
        kw = dict(kernel_shape=[int(v) for v in rng.integers(6, 14, rank)],
                  strides=[int(rng.choice([1, 1, 2])) for _ in range(rank)],
                  dilations=[int(rng.choice([1, 1, 2])) for _ in range(rank)],
                  pads=[int(v) for v in rng.integers(0, 5, 2 * rank)],
                  ceil_mode=int(rng.integers(0, 2)))
        dtype = [np.float32, np.float16, BF16][taken]
        try:
            plan = resolve_plan(spec, shape, kw["kernel_shape"], kw["strides"], kw["pads"],
                                kw["dilations"], "NOTSET", kw["ceil_mode"])
        except poolfold.PoolfoldError:
            continue
        if not any(running_sum_axes(plan, dtype, "average")[:-1]):
            continue  # no leading axis by blocks
        taken += 1
        x = data(shape, dtype, seed=seed, spread=20)
        chunks = (1, 1) + tuple(int(v) for v in rng.integers(3, 12, rank))
        for op in ("avg0", "avg1", "lp1", "lp2"):
            in_memory, chunked, extra = WINDOWED[op]
            kind, p = ("average", 2.0) if "p" not in extra else ("lp", extra["p"])
            assert not any(whole_axes(plan, x.dtype, kind, p, True))
            got = chunked(da.from_array(x, chunks=chunks), **kw, **extra)
            assert_same(got.compute(**THREADS), in_memory(x, **kw, **extra))


def test_float32_block_sums_redone_in_float64_match_bits():
    """Averages by block sums add float32 and take a window whose float32 sum is not finite
    again in float64: which windows those are depends on their values alone, so slabs of the
    tensor give the in-memory bits, on leading axes by blocks and a doubled last axis."""
    x = np.random.default_rng(9).standard_normal((1, 2, 40, 90)).astype(np.float32)
    x[0, 0, 10:30, 20:60] = 3.0e37  # sums past float32, averages well inside it
    x[0, 1, 5, 7] = np.nan
    for kw in (dict(kernel_shape=[9, 25]), dict(kernel_shape=[31, 31], auto_pad="SAME_UPPER"),
               dict(kernel_shape=[5, 40], strides=[1, 3], pads=[2, 10, 2, 10])):
        expected = poolfold.average_pool(x, **kw)
        assert np.isfinite(expected[0, 0]).all()
        got = pdask.average_pool(da.from_array(x, chunks=(1, 1, 7, 30)), **kw)
        assert_same(got.compute(**THREADS), expected)


def test_slab_without_input_has_the_kernels_nan():
    """A chunk whose windows all lie in the padding reads no input: its empty windows' NaN
    (count_include_pad 0) is the one the kernels' 0 * (1 / 0) gives, sign included (found
    by test_hypothesis: a quiet NaN of the other sign)."""
    x = data((1, 3, 2, 4, 3), seed=5, spread=20)
    kw = dict(kernel_shape=[2, 4, 1], strides=[2, 3, 3], dilations=[2, 2, 1],
              pads=[5, 1, 4, 0, 3, 1])
    expected = poolfold.average_pool(x, **kw)
    assert np.isnan(expected).any()
    got = pdask.average_pool(da.from_array(x, chunks=(1, (1, 2), 1, (3, 1), (2, 1))), **kw)
    assert_same(got.compute(**THREADS), expected)


def test_rows_summed_in_blocks_match_rows_summed_alone():
    """In memory, output rows at stride 1 are summed in blocks of consecutive rows; a slab
    that cuts the axis before the last between them sums fewer rows per block, or one at a
    time.  Every output keeps its bits (a cut window's float32 sum once took float64 in the
    blocks: the last bit of one output differed)."""
    x = data((2, 3, 2, 6, 8), seed=0, spread=20)
    kw = dict(kernel_shape=[4, 5, 4], strides=[3, 1, 1], dilations=[1, 1, 2],
              pads=[4, 0, 0, 5, 4, 2], ceil_mode=1)
    expected = poolfold.average_pool(x, **kw)
    for chunks in ((2, 3, 2, (3, 3), 8), (2, 3, (1, 1), (1, 2, 3), (5, 1, 1, 1))):
        got = pdask.average_pool(da.from_array(x, chunks=chunks), **kw)
        assert_same(got.compute(**THREADS), expected)


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_planes_summed_as_lanes_match_planes_summed_alone(dtype):
    """In memory, 16 or more small channels-first planes are summed many at once as lanes;
    a chunk with fewer planes sums its rows one plane at a time.  Every output keeps its
    bits (chunks of 24 planes and of 4 here, NaN and inf among the values)."""
    x = data((2, 24, 7, 9), dtype, seed=3)
    for kw in (dict(kernel_shape=[3, 3], pads=[1, 1, 1, 1], count_include_pad=1),
               dict(kernel_shape=[3, 2], strides=[2, 2], ceil_mode=1)):
        expected = poolfold.average_pool(x, **kw)
        for chunks in ((2, 24, 7, 9), (1, 4, 7, 9), (2, (20, 4), (3, 4), 9)):
            got = pdask.average_pool(da.from_array(x, chunks=chunks), **kw)
            assert_same(got.compute(**THREADS), expected)
    expected = poolfold.lp_pool(x, [2, 2], p=2)
    got = pdask.lp_pool(da.from_array(x, chunks=(1, 4, 7, 9)), [2, 2], p=2)
    assert_same(got.compute(**THREADS), expected)


def test_float64_average_of_subnormals():
    rng = np.random.default_rng(0)
    x = rng.integers(1, 50, (1, 4, 12)) * 5e-324  # multiples of the smallest subnormal
    kw = dict(kernel_shape=[3], pads=[1, 1])
    got = pdask.average_pool(da.from_array(x, chunks=1), **kw)
    assert_same(got.compute(**THREADS), poolfold.average_pool(x, **kw))


def test_nhwc_with_activation_and_channel_blocks():
    x = data((2, 9, 10, 5), seed=7)
    for kw in (dict(kernel_shape=[3, 2], strides=[2, 2], pads=[1, 0, 1, 1], activation="Relu"),
               dict(kernel_shape=[2, 2], auto_pad="SAME_LOWER", count_include_pad=1,
                    activation="Clip", activation_params=[-1.0, 1.5]),
               dict(kernel_shape=[6, 7], pads=[2, 3, 3, 3], activation="LeakyRelu",
                    activation_params=[0.25])):
        for chunks in ((1, 4, 3, 2), (2, 1, 1, 1)):
            got = pdask.nhwc.average_pool(da.from_array(x, chunks=chunks), **kw)
            assert_same(got.compute(**THREADS), poolfold.nhwc.average_pool(x, **kw))
    for p in (1, 3):
        kw = dict(kernel_shape=[3, 3], strides=[1, 2], pads=[1, 1, 0, 1], ceil_mode=1, p=p)
        got = pdask.nhwc.lp_pool(da.from_array(x, chunks=(1, 2, 3, 4)), **kw)
        assert_same(got.compute(**THREADS), poolfold.nhwc.lp_pool(x, **kw))
    # Running sums over 80 channels (a window too large for the row sums): the in-memory
    # items take 64 of them; C chunks of 30 and 70 are cut at 64 so that each slab's items
    # are the whole tensor's.
    xc = data((1, 8, 9, 80), np.float16, seed=8, spread=12)
    kw = dict(kernel_shape=[30, 6], pads=[15, 2, 14, 3], activation="HardSigmoid",
              activation_params=[0.2, 0.5])
    got = pdask.nhwc.average_pool(da.from_array(xc, chunks=(1, 3, 4, (70, 10))), **kw)
    assert got.chunks[-1] == (64, 16)
    assert_same(got.compute(**THREADS), poolfold.nhwc.average_pool(xc, **kw))
    kw = dict(kernel_shape=[30, 6], pads=[15, 2, 14, 3], p=2)
    got = pdask.nhwc.lp_pool(da.from_array(xc, chunks=(1, 3, 4, (30, 50))), **kw)
    assert got.chunks[-1] == (80,)
    assert_same(got.compute(**THREADS), poolfold.nhwc.lp_pool(xc, **kw))
    # In memory one channel takes the channels-first paths: no chunk of one channel (C > 1).
    got = pdask.nhwc.lp_pool(da.from_array(xc[..., :65], chunks=(1, 3, 4, (64, 1))), **kw)
    assert got.chunks[-1] == (65,)
    assert_same(got.compute(**THREADS), poolfold.nhwc.lp_pool(xc[..., :65], **kw))
    kw = dict(kernel_shape=[3, 2], strides=[1, 2], count_include_pad=1, activation="Tanh")
    got = pdask.nhwc.average_pool(da.from_array(x, chunks=(1, 4, 3, (1, 1, 2, 1))), **kw)
    assert got.chunks[-1] == (2, 3)
    assert_same(got.compute(**THREADS), poolfold.nhwc.average_pool(x, **kw))


def test_output_chunks_are_max_pools():
    x = da.zeros((1, 2, 16, 12), dtype=np.float32, chunks=(1, 1, 4, 6))
    for kw in (dict(kernel_shape=[2, 2], strides=[2, 2]), dict(kernel_shape=[3, 3],
                                                                  pads=[1, 1, 1, 1])):
        assert pdask.average_pool(x, **kw).chunks == pdask.max_pool(x, **kw).chunks
        assert pdask.lp_pool(x, **kw).chunks == pdask.max_pool(x, **kw).chunks
    assert pdask.global_average_pool(x).chunks == ((1,), (1, 1), (1,), (1,))
    assert pdask.global_max_pool(x).chunks == ((1,), (1, 1), (1,), (1,))


@pytest.mark.parametrize("module", ["average_pool", "max_pool"])
def test_slabs_read_parts_of_their_neighbours(module):
    """A slab depends on its own chunk and on the parts it reads of its neighbours, each
    neighbour's parts cut by one task of that chunk (not on the neighbours' whole chunks,
    which a cluster's worker would fetch and hold), and has the in-memory bits."""
    x = data((1, 1, 12, 12, 12), seed=13)
    chunked = getattr(pdask, module)(da.from_array(x, chunks=4), [3, 3, 3], pads=[1] * 6)
    graph = dict(chunked.__dask_graph__())
    dependencies = dask.core.get_dependencies(graph, (chunked.name, 0, 0, 1, 1, 1))
    inputs = [key for key in dependencies if "-part-" not in key[0]]
    parts = [key for key in dependencies if "-part-" in key[0]]
    assert len(inputs) == 1 and inputs[0][2:] == (0, 1, 1, 1)  # its own chunk, whole
    assert len(parts) == 26  # one task a neighbour
    part_tasks = [key for key in graph if isinstance(key, tuple) and "-part-" in key[0]]
    assert len(part_tasks) == 27  # every chunk has parts its neighbours read
    assert_same(chunked.compute(**THREADS), getattr(poolfold, module)(x, [3, 3, 3],
                                                                      pads=[1] * 6))


def test_empty_axes_and_batches():
    x = np.zeros((2, 3, 0, 4), np.float32)
    for cip in (0, 1):
        kw = dict(kernel_shape=[2, 2], pads=[1, 0, 1, 1], count_include_pad=cip)
        assert_same(pdask.average_pool(da.from_array(x, chunks=(1, 2, 1, 3)), **kw)
                    .compute(**THREADS), poolfold.average_pool(x, **kw))
    assert_same(pdask.lp_pool(da.from_array(x), [2, 2], pads=[1, 0, 1, 1]).compute(**THREADS),
                poolfold.lp_pool(x, [2, 2], pads=[1, 0, 1, 1]))
    for name in ("global_max_pool", "global_average_pool", "global_lp_pool"):
        for shape in ((2, 3, 0, 4), (0, 3, 5, 4)):
            z = np.zeros(shape, np.float32)
            assert_same(getattr(pdask, name)(da.from_array(z, chunks=2)).compute(**THREADS),
                        getattr(poolfold, name)(z))


# ---------------------------------------------------------------------------------------------
# global pools

GLOBAL = ("global_max_pool", "global_average_pool", "global_lp_pool")


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16, BF16])
def test_global_pools_match_in_memory(dtype):
    x = data((2, 3, 7, 9), dtype, seed=9)
    x[1, 2] = np.array(-np.inf).astype(dtype)  # a plane of -inf only
    for chunks in ((1, 1, 1, 1), (2, 2, 3, 4), (1, (1, 2), (5, 2), (1, 8))):
        for name in GLOBAL:
            for p in ((1, 2, 3, 9) if name == "global_lp_pool" else (None,)):
                kw = {} if p is None else dict(p=p)
                got = getattr(pdask, name)(da.from_array(x, chunks=chunks), **kw)
                assert_same(got.compute(**THREADS), getattr(poolfold, name)(x, **kw))
                if dtype == BF16:
                    continue  # no nhwc version takes bfloat16
                xn = np.ascontiguousarray(np.moveaxis(x, 1, -1))
                chunks_n = (chunks[0],) + tuple(chunks[2:]) + (chunks[1],)
                got = getattr(pdask.nhwc, name)(da.from_array(xn, chunks=chunks_n), **kw)
                assert_same(got.compute(**THREADS), getattr(poolfold.nhwc, name)(xn, **kw))


def test_float64_lp_pool_1_below_p_one_matches_in_memory():
    """float64 LpPool-1 at p < 1 sums in double-doubles, window by window: any chunking has
    the in-memory bits."""
    x = data(SHAPE_2D, np.float64, seed=11) * 10.0 ** np.linspace(-90, 90, 360).reshape(SHAPE_2D)
    for p in (0.05, 0.6):
        for kw in (GEOMETRIES_2D[1], GEOMETRIES_2D[3]):  # (no dilations in version 1)
            expected = poolfold.lp_pool(x, p=p, opset=1, **kw)
            for chunks in CHUNKS_2D[:3]:
                got = pdask.lp_pool(da.from_array(x, chunks=chunks), p=p, opset=1, **kw)
                assert_same(got.compute(**THREADS), expected)
        expected = poolfold.global_lp_pool(x, p=p, opset=1)
        got = pdask.global_lp_pool(da.from_array(x, chunks=CHUNKS_2D[2]), p=p, opset=1)
        assert_same(got.compute(**THREADS), expected)


def test_global_max_ties_and_nans_across_chunks():
    """The element the in-memory scan keeps: the first NaN in the plane's row-major order
    (NaNs of other payloads and signs after it lose), else the first of equal largest values
    (0.0 and -0.0), though its chunk comes later in chunk order."""
    x = np.zeros((1, 3, 4, 6), np.float32)
    x[0, 0] = -1.0
    x[0, 0, 0, 5] = -0.0  # chunk (0, 1) of 2x2 chunks, flat position 5
    x[0, 0, 1, 0] = 0.0  # chunk (1, 0), flat position 6
    x[0, 0, 3, 3] = 0.0
    nans = np.array([0x7FC00001, 0xFFC00002, 0x7FC00003], np.uint32).view(np.float32)
    x[0, 1, 3, 0], x[0, 1, 0, 4], x[0, 1, 2, 5] = nans  # the first in flat order: 0, 4
    x[0, 2] = -np.inf
    for chunks in ((1, 1, 2, 3), (1, 1, 1, 1), (1, 3, (3, 1), (4, 2))):
        got = pdask.global_max_pool(da.from_array(x, chunks=chunks)).compute(**THREADS)
        assert_same(got, poolfold.global_max_pool(x))
    assert poolfold.global_max_pool(x)[0, 0, 0, 0].tobytes() == np.float32(-0.0).tobytes()
    assert poolfold.global_max_pool(x)[0, 1].view(np.uint32)[0, 0] == 0xFFC00002
    # 24 chunks of one element per plane: a tree of combines, two levels deep.
    y = pdask.global_max_pool(da.from_array(x, chunks=1))
    assert sum(name.startswith("global-max-pool-combine") for name in y.dask.layers) == 1
    xb = x.astype(BF16)
    assert_same(pdask.global_max_pool(da.from_array(xb, chunks=1)).compute(**THREADS),
                poolfold.global_max_pool(xb))


# ---------------------------------------------------------------------------------------------
# hypothesis: random geometry, chunking, op and type


def _split(n, sizes):
    """Chunk sizes summing to n, taken from ``sizes`` (the last one cut to fit)."""
    out, left = [], n
    for s in sizes:
        if left == 0:
            break
        out.append(min(s, left))
        left -= out[-1]
    if left:
        out.append(left)
    return out or [0]


@settings(max_examples=40)
@given(draw=st.data())
def test_hypothesis(draw):
    rank = draw.draw(st.integers(1, 3))
    channels_last = draw.draw(st.booleans())
    shape = [draw.draw(st.integers(1, 2)), draw.draw(st.integers(1, 3))]
    shape += [draw.draw(st.integers(1, 9)) for _ in range(rank)]
    kernel = [draw.draw(st.integers(1, 7)) for _ in range(rank)]
    auto_pad = draw.draw(st.sampled_from(["NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID"]))
    kw = dict(kernel_shape=kernel, strides=[draw.draw(st.integers(1, 3)) for _ in range(rank)],
              dilations=[draw.draw(st.integers(1, 3)) for _ in range(rank)], auto_pad=auto_pad,
              pads=[draw.draw(st.integers(0, 5)) for _ in range(2 * rank)]
              if auto_pad == "NOTSET" else None, ceil_mode=draw.draw(st.integers(0, 1)))
    op = draw.draw(st.sampled_from(sorted(WINDOWED)))
    in_memory, chunked, extra = WINDOWED[op]
    kw.update(extra)
    dtype = draw.draw(st.sampled_from([np.float32, np.float64, np.float16]
                                      + ([] if channels_last else [BF16])))
    x = data(shape, dtype, seed=draw.draw(st.integers(0, 100)), spread=20)
    if channels_last:
        x = np.ascontiguousarray(np.moveaxis(x, 1, -1))
        module_memory, module_chunked = poolfold.nhwc, pdask.nhwc
        in_memory = getattr(module_memory, in_memory.__name__)
        chunked = getattr(module_chunked, chunked.__name__)
    try:
        expected = in_memory(x, **kw)
    except poolfold.PoolfoldError as error:
        with pytest.raises(poolfold.PoolfoldError) as info:
            chunked(da.from_array(x), **kw)
        assert str(info.value) == str(error)
        return
    chunks = tuple(tuple(draw.draw(st.lists(st.integers(1, n), min_size=1, max_size=4).map(
        lambda sizes, n=n: _split(n, sizes)))) for n in x.shape)
    assert_same(chunked(da.from_array(x, chunks=chunks), **kw).compute(**THREADS), expected)


# ---------------------------------------------------------------------------------------------
# errors and laziness


def _raises_alike(in_memory, chunked):
    with pytest.raises((poolfold.PoolfoldError, poolfold.PoolfoldTypeError)) as expected:
        in_memory()
    with pytest.raises(type(expected.value)) as got:
        chunked()
    assert str(got.value) == str(expected.value)


@pytest.mark.parametrize("name, kw", [
    ("average_pool", dict(kernel_shape=[2])),
    ("average_pool", dict(kernel_shape=[2, 2], auto_pad="SAME")),
    ("average_pool", dict(kernel_shape=[2, 2], pads=[1, 1, 1, 1], auto_pad="VALID")),
    ("average_pool", dict(kernel_shape=[9, 2])),
    ("average_pool", dict(kernel_shape=[2, 2], strides=[0, 1])),
    ("average_pool", dict(kernel_shape=[2, 2], count_include_pad=2)),
    ("average_pool", dict(kernel_shape=[2, 2], count_include_pad=1, opset=1)),
    ("average_pool", dict(kernel_shape=[2, 2], count_include_pad=1.0)),
    ("average_pool", dict(kernel_shape=[2, 2], ceil_mode=1, opset=7)),
    ("average_pool", dict(kernel_shape=[2, 2], dilations=[2, 1], opset=11)),
    ("lp_pool", dict(kernel_shape=[2, 2], p=0)),
    ("lp_pool", dict(kernel_shape=[2, 2], p=1.5)),
    ("lp_pool", dict(kernel_shape=[2, 2], p=-1.0, opset=1)),
    ("lp_pool", dict(kernel_shape=[2, 2], p="2")),
    ("lp_pool", dict(kernel_shape=[2, 2], ceil_mode=1, opset=11)),
    ("global_lp_pool", dict(p=0)),
    ("global_lp_pool", dict(p=True)),
    ("global_max_pool", dict(opset=0)),
])
def test_errors_at_graph_time(name, kw):
    x = np.zeros((1, 1, 5, 5), np.float32)
    for memory, chunked in ((poolfold, pdask), (poolfold.nhwc, pdask.nhwc)):
        if memory is poolfold.nhwc and kw.get("opset") in (0, 1) and name != "global_max_pool":
            continue  # the nhwc domain has no such version (another message, also checked)
        _raises_alike(lambda: getattr(memory, name)(x, **kw),
                      lambda: getattr(chunked, name)(da.from_array(x, chunks=2), **kw))


def test_type_rank_and_activation_errors_at_graph_time():
    for name in ("average_pool", "lp_pool") + GLOBAL:
        args = ([2],) if name in ("average_pool", "lp_pool") else ()
        for x, kw in ((np.zeros((1, 1, 4), np.int32), {}), (np.zeros((1, 4), np.float32), {}),
                      (np.zeros((1, 1, 4), BF16), dict(opset=19 if "lp" not in name else 18)),
                      (np.zeros((1, 1, 4), BF16), dict(opset=1))):
            _raises_alike(lambda: getattr(poolfold, name)(x, *args, **kw),
                          lambda: getattr(pdask, name)(da.from_array(x), *args, **kw))
            _raises_alike(lambda: getattr(poolfold.nhwc, name)(x, *args, **kw),
                          lambda: getattr(pdask.nhwc, name)(da.from_array(x), *args, **kw))
    x = np.zeros((1, 4, 4, 2), np.float32)
    for kw in (dict(activation="Gelu"), dict(activation="LeakyRelu"),
               dict(activation_params=[1.0]), dict(activation="Relu", count_include_pad=3),
               dict(activation="Clip", activation_params=[0.0])):
        _raises_alike(lambda: poolfold.nhwc.average_pool(x, [2, 2], **kw),
                      lambda: pdask.nhwc.average_pool(da.from_array(x), [2, 2], **kw))
    # The in-memory order of the checks: the type before count_include_pad (nhwc), and
    # count_include_pad before the type (ai.onnx).
    bad = np.zeros((1, 4, 4, 2), np.int64)
    _raises_alike(lambda: poolfold.nhwc.average_pool(bad, [2, 2], count_include_pad=5),
                  lambda: pdask.nhwc.average_pool(da.from_array(bad), [2, 2], count_include_pad=5))
    _raises_alike(lambda: poolfold.average_pool(bad, [2, 2], count_include_pad=5),
                  lambda: pdask.average_pool(da.from_array(bad), [2, 2], count_include_pad=5))


def test_nothing_computed_at_call_time():
    def explode(block):
        raise RuntimeError("computed")

    for shape, chunks, module in (((1, 2, 9, 10), (1, 1, 4, 3), pdask),
                                  ((1, 9, 10, 70), (1, 4, 3, 30), pdask.nhwc)):
        x = da.zeros(shape, dtype=np.float32, chunks=chunks).map_blocks(explode,
                                                                         dtype=np.float32)
        results = [module.average_pool(x, [3, 3], pads=[1, 1, 1, 1], count_include_pad=1),
                   # block sums channels-first, running sums kept whole channels-last
                   module.average_pool(x, [12, 12], auto_pad="SAME_UPPER"),
                   module.lp_pool(x, [2, 2], strides=[2, 2], p=3),
                   module.global_max_pool(x), module.global_average_pool(x),
                   module.global_lp_pool(x, p=1)]
        for y in results:
            with pytest.raises(RuntimeError, match="computed"):
                y.compute(**THREADS)


def test_exports():
    for module in (pdask, pdask.nhwc):
        for name in ("average_pool", "lp_pool") + GLOBAL:
            assert name in module.__all__ and callable(getattr(module, name))


# ---------------------------------------------------------------------------------------------
# On a LocalCluster: kernels run in two worker processes.


def test_distributed(client):
    x = data((2, 3, 11, 13), seed=10)
    chunks = ((1, 1), (2, 1), (4, 1, 6), (2, 2, 2, 7))
    for kw in (dict(GEOMETRIES_2D[2], count_include_pad=1), dict(GEOMETRIES_2D[8])):
        got = pdask.average_pool(da.from_array(x, chunks=chunks), **kw)
        assert_same(client.compute(got, sync=True), poolfold.average_pool(x, **kw))
    got = pdask.lp_pool(da.from_array(x, chunks=chunks), [3, 3], p=3, pads=[1, 1, 1, 1])
    assert_same(client.compute(got, sync=True), poolfold.lp_pool(x, [3, 3], p=3,
                                                                 pads=[1, 1, 1, 1]))
    xn = np.ascontiguousarray(np.moveaxis(x, 1, -1)).astype(np.float16)
    kw = dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1], activation="Sigmoid")
    got = pdask.nhwc.average_pool(da.from_array(xn, chunks=(1, 3, 5, 2)), **kw)
    assert_same(client.compute(got, sync=True), poolfold.nhwc.average_pool(xn, **kw))
    for name in GLOBAL:
        got = getattr(pdask, name)(da.from_array(x, chunks=(1, 2, 3, 4)))
        assert_same(client.compute(got, sync=True), getattr(poolfold, name)(x))
