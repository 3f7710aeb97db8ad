"""poolfold.dask against the in-memory functions: equal values and dtypes for every attribute
combination and chunking, on the threaded scheduler and on a LocalCluster of two process
workers; errors raised when the graph is built, with the in-memory messages."""

from __future__ import annotations

import subprocess
import sys

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

da = pytest.importorskip("dask.array")
dask = pytest.importorskip("dask")
distributed = pytest.importorskip("distributed")

import poolfold  # noqa: E402
import poolfold.dask as pdask  # noqa: E402
from poolfold.geometry import WindowAttributes, window_plan  # noqa: E402

THREADS = {"scheduler": "threads"}


@pytest.fixture(scope="session")
def client():
    """Two single-threaded process workers; kernels load from numba's on-disk cache."""
    cluster = distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                       dashboard_address=None, memory_limit="2GiB",
                                       env={"POOLFOLD_NUM_THREADS": "1"})
    with distributed.Client(cluster) as c:
        yield c
    cluster.close()


def assert_same(got, expected):
    """Equal values (NaN where NaN), equal dtype and shape, equal bits for floating types."""
    assert got.dtype == expected.dtype
    assert got.shape == expected.shape
    if expected.dtype.kind in "fc" or expected.dtype == ml_dtypes.bfloat16:
        assert got.tobytes() == expected.tobytes()
    else:
        np.testing.assert_array_equal(got, expected)


def tied(shape, dtype=np.float32, seed=0, nan=True):
    """Few distinct values (many ties), a NaN or two."""
    rng = np.random.default_rng(seed)
    x = rng.integers(-3, 4, shape).astype(dtype)
    if nan and x.size > 3 and (np.dtype(dtype).kind == "f" or dtype == ml_dtypes.bfloat16):
        x.flat[rng.integers(0, x.size, 2)] = np.nan
    return x


POOL_CASES = [
    dict(kernel_shape=[2, 2], strides=[2, 2]),
    dict(kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
    dict(kernel_shape=[3, 2], strides=[2, 1], pads=[1, 0, 4, 3], dilations=[2, 1], ceil_mode=1),
    dict(kernel_shape=[3, 3], strides=[2, 3], auto_pad="SAME_UPPER"),
    dict(kernel_shape=[3, 3], strides=[2, 3], auto_pad="SAME_LOWER", dilations=[2, 1]),
    dict(kernel_shape=[2, 3], strides=[3, 2], auto_pad="VALID"),
    dict(kernel_shape=[2, 2], strides=[2, 2], pads=[3, 3, 3, 3], dilations=[3, 2]),  # empty
    dict(kernel_shape=[4, 4], strides=[3, 3], pads=[2, 1, 2, 2], ceil_mode=1),
]
CHUNKS_2D = [(2, 3, 11, 13), (1, 2, 3, 5), (1, 1, 1, 1), (2, (1, 2), (4, 1, 6), (2, 2, 2, 7))]


@pytest.mark.parametrize("chunks", CHUNKS_2D)
@pytest.mark.parametrize("case", range(len(POOL_CASES)))
def test_max_pool_matches_in_memory(case, chunks):
    x = tied((2, 3, 11, 13))
    kw = POOL_CASES[case]
    for storage_order in (0, 1):
        expected = poolfold.max_pool(x, return_indices=True, storage_order=storage_order, **kw)
        got = pdask.max_pool(da.from_array(x, chunks=chunks), return_indices=True,
                             storage_order=storage_order, **kw)
        for g, e in zip(dask.compute(*got, **THREADS), expected):
            assert_same(g, e)
    assert_same(pdask.max_pool(da.from_array(x, chunks=chunks), **kw).compute(**THREADS),
                poolfold.max_pool(x, **kw))


def test_cases_cover_empty_windows_nan_and_ties():
    x = tied((2, 3, 11, 13))
    _, indices = poolfold.max_pool(x, return_indices=True, **POOL_CASES[6])
    assert (indices == -1).any()
    assert np.isnan(x).any() and len(np.unique(x)) < 10


@settings(max_examples=30)
@given(data=st.data())
def test_max_pool_hypothesis(data):
    rank = data.draw(st.integers(1, 3))
    shape = [data.draw(st.integers(1, 2)), data.draw(st.integers(1, 2))]
    shape += [data.draw(st.integers(1, 9)) for _ in range(rank)]
    kernel = [data.draw(st.integers(1, 4)) for _ in range(rank)]
    strides = [data.draw(st.integers(1, 3)) for _ in range(rank)]
    dilations = [data.draw(st.integers(1, 3)) for _ in range(rank)]
    auto_pad = data.draw(st.sampled_from(["NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID"]))
    pads = [data.draw(st.integers(0, 5)) for _ in range(2 * rank)] if auto_pad == "NOTSET" else None
    kw = dict(kernel_shape=kernel, strides=strides, dilations=dilations, auto_pad=auto_pad,
              pads=pads, ceil_mode=data.draw(st.integers(0, 1)),
              storage_order=data.draw(st.integers(0, 1)), return_indices=True)
    x = tied(shape, seed=data.draw(st.integers(0, 100)))
    try:
        expected = poolfold.max_pool(x, **kw)
    except poolfold.PoolfoldError as error:
        with pytest.raises(poolfold.PoolfoldError, match=None) as info:
            pdask.max_pool(da.from_array(x), **kw)
        assert str(info.value) == str(error)
        return
    chunks = tuple(tuple(data.draw(st.lists(st.integers(1, n), min_size=1, max_size=4).map(
        lambda sizes, n=n: _split(n, sizes)))) for n in shape)
    got = pdask.max_pool(da.from_array(x, chunks=chunks), **kw)
    for g, e in zip(dask.compute(*got, **THREADS), expected):
        assert_same(g, e)


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
    return out


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16, np.int8, np.uint8, np.float64])
def test_max_pool_types(dtype):
    x = tied((1, 2, 7, 6), dtype)
    kw = dict(kernel_shape=[3, 2], strides=[2, 2], pads=[1, 1, 1, 1], return_indices=True)
    expected = poolfold.max_pool(x, **kw)
    got = pdask.max_pool(da.from_array(x, chunks=(1, 1, 2, 3)), **kw)
    for g, e in zip(dask.compute(*got, **THREADS), expected):
        assert_same(g, e)


def test_max_pool_3d_and_1d():
    x = tied((1, 2, 6, 5, 7))
    kw = dict(kernel_shape=[2, 3, 2], strides=[2, 1, 2], pads=[0, 1, 1, 1, 1, 0],
              return_indices=True, storage_order=1)
    got = pdask.max_pool(da.from_array(x, chunks=(1, 1, 2, 3, 4)), **kw)
    for g, e in zip(dask.compute(*got, **THREADS), poolfold.max_pool(x, **kw)):
        assert_same(g, e)
    x1 = tied((2, 2, 17))
    got = pdask.max_pool(da.from_array(x1, chunks=(1, 2, 3)), [4], strides=[3], pads=[2, 2],
                         return_indices=True)
    for g, e in zip(dask.compute(*got, **THREADS),
                    poolfold.max_pool(x1, [4], strides=[3], pads=[2, 2], return_indices=True)):
        assert_same(g, e)


def test_output_chunks_follow_input_chunks_and_read_only_their_halo():
    x = da.zeros((1, 1, 16, 12), dtype=np.float32, chunks=(1, 1, 4, 6))
    y = pdask.max_pool(x, [2, 2], strides=[2, 2])
    assert y.chunks == ((1,), (1,), (2, 2, 2, 2), (3, 3))
    # Stride 2 over chunks of 4 and 6: every window inside one chunk, one chunk per task.
    assert all(len(task[1]) == 1 for task in _tasks(y).values())  # (kernel, input keys, ...)
    # A 3x3 window at stride 1 with pads 1 reads one row / column of each neighbour.
    y = pdask.max_pool(x, [3, 3], pads=[1, 1, 1, 1])
    assert y.chunks == ((1,), (1,), (4, 4, 4, 4), (6, 6))
    shapes = {key[3:]: task[3] for key, task in _tasks(y).items()}  # the block's shape
    assert shapes[(0, 0)] == (1, 1, 5, 7)  # first chunk: 4+1 rows, 6+1 columns
    assert shapes[(1, 1)] == (1, 1, 6, 7)  # inner rows: 1+4+1
    # Pieces read: 2 row chunks x 2 column chunks at the first and last rows, 3 x 2 inside.
    assert sorted(len(task[1]) for task in _tasks(y).values()) == [4] * 4 + [6] * 4
    # Chunks one element wide, smaller than a window.
    x = da.zeros((1, 1, 5, 5), dtype=np.float32, chunks=1)
    y = pdask.max_pool(x, [3, 3], strides=[2, 2])
    assert y.chunks == ((1,), (1,), (1, 1), (1, 1))


def _tasks(array):
    """The tasks of an array's own layer (poolfold.dask writes them as tuples)."""
    return dict(array.dask.layers[array.name])


def test_nhwc_max_pool_with_activation():
    x = tied((2, 9, 8, 3))
    # Input chunks N (1, 1), H (4, 4, 1), W (3, 3, 2), C (2, 1).  Spatial output chunks by the
    # documented rule (an output belongs to the chunk holding its window's centre tap
    # o*s - pb + (K-1)//2; centres in the padding go to the first / last chunk):
    # - kernel [3, 2], strides 2, pads begin [1, 0]: H centres 0 2 4 6 8 -> (2, 2, 1);
    #   W centres 0 2 4 6 -> (2, 1, 1).
    # - kernel [2, 2], SAME_LOWER, stride 1 (pads begin 1): H centres -1..7 -> (5, 4), the
    #   last chunk holds none; W centres -1..6 -> (4, 3, 1).
    # Indices (NCHW) have those chunks in NCHW order.
    for kw, spatial_chunks in (
            (dict(kernel_shape=[3, 2], strides=[2, 2], pads=[1, 0, 1, 1], activation="Relu"),
             ((2, 2, 1), (2, 1, 1))),
            (dict(kernel_shape=[2, 2], auto_pad="SAME_LOWER", activation="Clip",
                  activation_params=[-1.0, 1.5], storage_order=1),
             ((5, 4), (4, 3, 1)))):
        expected = poolfold.nhwc.max_pool(x, return_indices=True, **kw)
        got = pdask.nhwc.max_pool(da.from_array(x, chunks=(1, 4, 3, 2)), return_indices=True,
                                  **kw)
        assert got[0].chunks == ((1, 1), *spatial_chunks, (2, 1))
        assert got[1].chunks == ((1, 1), (2, 1), *spatial_chunks)
        for g, e in zip(dask.compute(*got, **THREADS), expected):
            assert_same(g, e)


def _unpool_inputs(seed=0, foreign=True):
    """X and I for MaxUnpool: MaxPool's own Indices, or random positions anywhere in the
    tensor (other planes, duplicates)."""
    x = tied((2, 3, 10, 9), seed=seed, nan=False)
    y, i = poolfold.max_pool(x, [2, 3], strides=[2, 2], pads=[0, 1, 1, 0], return_indices=True)
    if foreign:
        i = np.random.default_rng(seed).integers(0, x.size, i.shape)
        y = np.arange(y.size, dtype=np.float32).reshape(y.shape)  # tell duplicates apart
    return x, y, i


@pytest.mark.parametrize("foreign", [False, True])
@pytest.mark.parametrize("chunks", [((1, 1), (2, 1), (2, 3), (3, 1)), (1, 1, 1, 1),
                                    (2, 3, 5, 5)])
def test_max_unpool_matches_in_memory(foreign, chunks):
    x, y, i = _unpool_inputs(foreign=foreign)
    kw = dict(kernel_shape=[2, 3], strides=[2, 2], output_shape=x.shape)
    expected = poolfold.max_unpool(y, i, **kw)
    got = pdask.max_unpool(da.from_array(y, chunks=chunks), da.from_array(i, chunks=2), **kw)
    assert_same(got.compute(**THREADS), expected)
    if foreign:
        assert len(np.unique(i)) < i.size  # duplicates: the last in row-major order wins
    # Without output_shape: the inferred shape, pads included.
    kw = dict(kernel_shape=[2, 3], strides=[2, 2], pads=[0, 1, 1, 0])
    if not foreign:
        i = np.minimum(i, int(np.prod(y.shape[:2])) * 8 * 9 - 1)
    i = i % (y.shape[0] * y.shape[1] * 8 * 9)
    expected = poolfold.max_unpool(y, i, **kw)
    got = pdask.max_unpool(da.from_array(y, chunks=chunks), i, **kw)
    assert_same(got.compute(**THREADS), expected)


def test_nhwc_max_unpool_with_activation():
    x, y, i = _unpool_inputs(seed=3, foreign=True)
    y = np.ascontiguousarray(np.moveaxis(y - 10, 1, -1)).astype(np.float16)
    kw = dict(kernel_shape=[2, 3], strides=[2, 2], output_shape=x.shape, activation="LeakyRelu",
              activation_params=[0.5])
    expected = poolfold.nhwc.max_unpool(y, i, **kw)
    got = pdask.nhwc.max_unpool(da.from_array(y, chunks=(1, 2, 3, 2)), da.from_array(i, chunks=3),
                                **kw)
    assert got.chunks[0] == (1, 1) and got.chunks[-1] == (2, 1)
    assert_same(got.compute(**THREADS), expected)


def test_max_unpool_out_of_range_raises_the_in_memory_error_and_writes_nothing():
    x, y, i = _unpool_inputs()
    i[1, 2, 3, 1] = x.size + 5
    i[0, 1, 4, 3] = -2  # the first bad index in row-major order
    kw = dict(kernel_shape=[2, 3], strides=[2, 2], output_shape=x.shape)
    with pytest.raises(poolfold.PoolfoldError) as expected:
        poolfold.max_unpool(y, i, **kw)
    got = pdask.max_unpool(da.from_array(y, chunks=(1, 1, 2, 2)), da.from_array(i, chunks=2), **kw)
    # Every output chunk waits on the range check: nothing can be written before it passes.
    assert all("check" in task[1][0] for task in _tasks(got).values())
    with pytest.raises(poolfold.PoolfoldError) as info:
        got.compute(**THREADS)
    assert str(info.value) == str(expected.value)


def _col2im_case(dtype, image, block, kw, seed=0):
    plan = window_plan("x", tuple(image), WindowAttributes.validate(
        "x", len(image), block, kw.get("strides"), kw.get("dilations"), kw.get("pads")))
    shape = (2, 3 * int(np.prod(block)), int(np.prod(plan.out_shape)))
    rng = np.random.default_rng(seed)
    if dtype in (object, "U", "S"):
        x = np.array([str(v) for v in rng.integers(0, 10, int(np.prod(shape)))], object)
        return x.reshape(shape) if dtype is object else x.astype(dtype).reshape(shape)
    if dtype is bool:
        return rng.random(shape) < 0.3
    if np.dtype(dtype).kind in "iu":
        return rng.integers(0, 255, shape).astype(dtype)
    if np.dtype(dtype).kind == "c":
        return (rng.standard_normal(shape) + 1j * rng.standard_normal(shape)).astype(dtype)
    return (rng.standard_normal(shape) * 1000).astype(dtype)


COL2IM_GEOMETRIES = [
    ([5, 7], [2, 3], dict(strides=[1, 2], pads=[1, 0, 2, 1], dilations=[2, 1])),
    ([9], [3], {}),
    ([4, 3, 5], [2, 2, 2], dict(strides=[2, 1, 2], pads=[1, 1, 1, 0, 0, 1])),
]


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16, np.float32, np.int8, bool,
                                   np.complex64, object, "U"])
@pytest.mark.parametrize("geometry", range(len(COL2IM_GEOMETRIES)))
def test_col2im_matches_in_memory(dtype, geometry):
    image, block, kw = COL2IM_GEOMETRIES[geometry]
    x = _col2im_case(dtype, image, block, kw)
    expected = poolfold.col2im(x, image, block, **kw)
    k, length = int(np.prod(block)), x.shape[2]
    for chunks in [(1, k + 1, 3), (1, 1, 1), (1, 2 * k - 1, (length // 2, length - length // 2))]:
        got = pdask.col2im(da.from_array(x, chunks=chunks), image, block, **kw)
        assert_same(got.compute(**THREADS), expected)


def test_col2im_half_sums_keep_the_in_memory_bits():
    """Summing per-chunk partial images would round differently: the chained fold does not."""
    image, block, kw = [6, 6], [3, 3], {}
    x = (np.random.default_rng(5).standard_normal((2, 27, 16)) * 10).astype(np.float16)
    x[:, :, ::2] *= np.float16(100)
    expected = poolfold.col2im(x, image, block, **kw)
    halves = (8, 8)
    partials = []
    for j, start in enumerate((0, 8)):
        part = np.zeros_like(x)
        part[:, :, start:start + halves[j]] = x[:, :, start:start + halves[j]]
        partials.append(poolfold.col2im(part, image, block, **kw).astype(np.float32))
    naive = (partials[0] + partials[1]).astype(np.float16)
    assert naive.tobytes() != expected.tobytes()  # the case is sensitive to the order
    got = pdask.col2im(da.from_array(x, chunks=(1, 4, halves)), image, block, **kw)
    assert_same(got.compute(**THREADS), expected)


def _raises_alike(in_memory, chunked):
    with pytest.raises((poolfold.PoolfoldError, poolfold.PoolfoldTypeError)) as expected:
        in_memory()
    with pytest.raises(type(expected.value)) as got:
        chunked()
    assert str(got.value) == str(expected.value)


@pytest.mark.parametrize("kw", [
    dict(kernel_shape=[2]), dict(kernel_shape=[2, 2], auto_pad="SAME"),
    dict(kernel_shape=[2, 2], pads=[1, 1, 1, 1], auto_pad="VALID"),
    dict(kernel_shape=[9, 2]), dict(kernel_shape=[2, 2], storage_order=2),
    dict(kernel_shape=[2, 2], opset=1, return_indices=True),
    dict(kernel_shape=[2, 2], opset=8, dilations=[1, 1]),
    dict(kernel_shape=[2, 2], strides=[0, 1]),
])
def test_max_pool_errors_at_graph_time(kw):
    x = np.zeros((1, 1, 5, 5), np.float32)
    _raises_alike(lambda: poolfold.max_pool(x, **kw),
                  lambda: pdask.max_pool(da.from_array(x, chunks=2), **kw))


def test_type_and_rank_errors_at_graph_time():
    _raises_alike(lambda: poolfold.max_pool(np.zeros((1, 1, 4), np.int32), [2]),
                  lambda: pdask.max_pool(da.zeros((1, 1, 4), dtype=np.int32), [2]))
    _raises_alike(lambda: poolfold.max_pool(np.zeros((1, 4), np.float32), [2]),
                  lambda: pdask.max_pool(da.zeros((1, 4), dtype=np.float32), [2]))
    _raises_alike(lambda: poolfold.max_pool(np.zeros((1, 1, 4), ml_dtypes.bfloat16), [2], opset=12),
                  lambda: pdask.max_pool(da.zeros((1, 1, 4), dtype=ml_dtypes.bfloat16), [2], opset=12))
    _raises_alike(lambda: poolfold.nhwc.max_pool(np.zeros((1, 4, 1), np.int8), [2],
                                                 activation="Relu"),
                  lambda: pdask.nhwc.max_pool(da.zeros((1, 4, 1), dtype=np.int8), [2],
                                              activation="Relu"))


def test_unpool_and_col2im_errors_at_graph_time():
    x, y, i = _unpool_inputs()
    for in_i, kw in [(i.astype(np.int32), dict(output_shape=x.shape)),
                     (i[:, :, :2], dict(output_shape=x.shape)),
                     (i, dict(output_shape=(2, 4, 10, 9))),
                     (i, dict(output_shape=(2, 3, 10))),
                     (i, dict(pads=[5, 5, 5, 5]))]:
        _raises_alike(lambda: poolfold.max_unpool(y, in_i, [2, 3], strides=[2, 2], **kw),
                      lambda: pdask.max_unpool(da.from_array(y), in_i, [2, 3], strides=[2, 2],
                                               **kw))
    c = np.zeros((1, 12, 12), np.float32)
    for args, kw in [(([5, 5], [2, 2]), {}), (([4, 5], [5, 2]), {}), (([5, 5], [2, 2, 2]), {}),
                     (([5, 5], [2, 2]), dict(strides=[1])), (([4, 5], [2, 2]), dict(pads=[-1] * 4))]:
        _raises_alike(lambda: poolfold.col2im(c, *args, **kw),
                      lambda: pdask.col2im(da.from_array(c, chunks=5), *args, **kw))
    _raises_alike(lambda: poolfold.col2im(np.zeros((1, 4)), [2], [2]),
                  lambda: pdask.col2im(da.zeros((1, 4)), [2], [2]))


def test_non_dask_inputs_numpy_lists_and_zarr():
    zarr = pytest.importorskip("zarr")
    x = tied((1, 2, 8, 8))
    z = zarr.create_array(zarr.storage.MemoryStore(), shape=x.shape, chunks=(1, 1, 3, 5),
                          dtype=x.dtype)
    z[...] = x
    for source in (z, x, x.tolist()):
        expected = poolfold.max_pool(np.asarray(source), [2, 2], strides=[2, 2],
                                     return_indices=True)
        got = pdask.max_pool(source, [2, 2], strides=[2, 2], return_indices=True)
        for g, e in zip(dask.compute(*got, **THREADS), expected):
            assert_same(g, e)
    assert pdask.max_pool(z, [2, 2], strides=[2, 2]).chunks[2:] == ((2, 1, 1), (3, 1))
    assert pdask.max_pool_shape is poolfold.max_pool_shape


def test_import_poolfold_does_not_import_dask():
    code = ("import sys, poolfold, poolfold.bench, poolfold.cli; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in "
            "('dask', 'distributed', 'zarr')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


# On a LocalCluster: kernels run in two worker processes.

def test_distributed_max_pool_and_nhwc(client):
    x = tied((2, 3, 11, 13))
    kw = dict(POOL_CASES[2], return_indices=True, storage_order=1)
    got = pdask.max_pool(da.from_array(x, chunks=((1, 1), (2, 1), (4, 1, 6), (2, 2, 2, 7))), **kw)
    for g, e in zip(client.compute(list(got), sync=True), poolfold.max_pool(x, **kw)):
        assert_same(g, e)
    xn = np.ascontiguousarray(np.moveaxis(x, 1, -1))
    kw = dict(POOL_CASES[4], return_indices=True, activation="Sigmoid")
    got = pdask.nhwc.max_pool(da.from_array(xn, chunks=(1, 3, 5, 2)), **kw)
    for g, e in zip(client.compute(list(got), sync=True), poolfold.nhwc.max_pool(xn, **kw)):
        assert_same(g, e)


def test_distributed_max_unpool(client):
    x, y, i = _unpool_inputs(seed=1, foreign=True)
    kw = dict(kernel_shape=[2, 3], strides=[2, 2], output_shape=x.shape)
    got = pdask.max_unpool(da.from_array(y, chunks=(1, 2, 2, 3)), da.from_array(i, chunks=3), **kw)
    assert_same(client.compute(got, sync=True), poolfold.max_unpool(y, i, **kw))
    i[0, 0, 0, 0] = -1
    with pytest.raises(poolfold.PoolfoldError) as expected:
        poolfold.max_unpool(y, i, **kw)
    got = pdask.max_unpool(da.from_array(y, chunks=(1, 2, 2, 3)), da.from_array(i, chunks=3), **kw)
    with pytest.raises(poolfold.PoolfoldError) as info:
        client.compute(got, sync=True)
    assert str(info.value) == str(expected.value)


@pytest.mark.parametrize("dtype", [np.float16, object])
def test_distributed_col2im(client, dtype):
    image, block, kw = COL2IM_GEOMETRIES[0]
    x = _col2im_case(dtype, image, block, kw, seed=2)
    got = pdask.col2im(da.from_array(x, chunks=(1, 7, 4)), image, block, **kw)
    assert_same(client.compute(got, sync=True), poolfold.col2im(x, image, block, **kw))


@pytest.mark.parametrize("op", ["max", "average"])
def test_bench_out_of_core_small(op):
    """The zarr -> zarr run on a small volume: its spot checks pass (the box filter's on
    chunks in the volume's corners and inside it, its input slices with the windows' reach),
    and its output chunks are the input's (the box filter's leading axes by blocks
    chunked)."""
    from poolfold.bench import dask as bench

    results = bench.out_of_core(size=48, chunk=16, memory_limit="1GiB", spot_checks=3,
                                tick=lambda message: None, op=op)
    assert [c["equal"] for c in results["spot_checks"]] == [True, True, True]
    assert results["pool_s"] > 0 and len(results["worker_peak_rss_gib"]) == 2
    side = 16 if op == "average" else 8
    assert results["largest_output_chunk_mib"] * 2**20 == side**3 * (4 if op == "average" else 8)
    assert "spot check: 3 of 3" in bench.format_results({"out_of_core": results})


def test_max_unpool_inferred_shape_indices():
    """The ONNX page's reading of I (positions in the inferred shape), and its two errors."""
    x, y, i = _unpool_inputs(seed=4, foreign=False)
    inferred = (2, 3, 9, 8)  # (in-1)*s + k - pads, as MaxUnpool infers it
    i = np.random.default_rng(4).integers(0, np.prod(inferred), i.shape)
    kw = dict(kernel_shape=[2, 3], strides=[2, 2], pads=[0, 1, 1, 0], output_shape=(2, 3, 11, 8),
              inferred_shape_indices=True)
    expected = poolfold.max_unpool(y, i, **kw)
    got = pdask.max_unpool(da.from_array(y, chunks=(1, 2, 3, 2)), da.from_array(i, chunks=2), **kw)
    assert_same(got.compute(**THREADS), expected)
    small = dict(kw, output_shape=(2, 3, 7, 8))  # rows 7 and 8 of the inferred shape fall out
    bad_range = i.copy()
    bad_range[1, 0, 2, 2] = np.prod(inferred)
    for indices, options in [(i, small), (bad_range, small), (bad_range, kw)]:
        with pytest.raises(poolfold.PoolfoldError) as error:
            poolfold.max_unpool(y, indices, **options)
        got = pdask.max_unpool(da.from_array(y, chunks=(1, 2, 3, 2)),
                               da.from_array(indices, chunks=2), **options)
        with pytest.raises(poolfold.PoolfoldError) as info:
            got.compute(**THREADS)
        assert str(info.value) == str(error.value)
