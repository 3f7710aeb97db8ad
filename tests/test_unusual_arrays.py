"""Unusual but valid arrays give the oracle's values, and are never modified.

Big-endian, strided (non-contiguous), reversed (negative strides), Fortran-order, transposed,
broadcast (zero strides) and read-only inputs, and 0-size ones, to every op, the nhwc ones
and the backend: the result must equal the oracle's on a plain native C-ordered copy, bit
for bit, and every input must keep its bytes and its flags.
"""

from __future__ import annotations

import sys

import ml_dtypes
import numba
import numpy as np
import pytest
from onnx import helper

import oracle
import poolfold
import poolfold.backend
import poolfold.nhwc

OTHER_ORDER = ">" if sys.byteorder == "little" else "<"


def big_endian(a):
    return a.astype(a.dtype.newbyteorder(OTHER_ORDER)) if a.dtype.itemsize > 1 else a


def strided(a):
    wide = np.zeros(a.shape[:-1] + (2 * a.shape[-1],), a.dtype)
    wide[..., 1::2] = a
    return wide[..., 1::2]


def reversed_(a):
    flipped = np.ascontiguousarray(a[(slice(None, None, -1),) * a.ndim])
    return flipped[(slice(None, None, -1),) * a.ndim]


def fortran(a):
    return np.asfortranarray(a)


def transposed(a):
    return np.ascontiguousarray(a.T).T


def read_only(a):
    a = a.copy()
    a.flags.writeable = False
    return a


def broadcast(a):
    """Zero strides along the batch axis (read-only, as numpy makes them)."""
    return np.broadcast_to(a[:1], a.shape) if a.shape[0] else a


def big_endian_reversed_read_only(a):
    return read_only(reversed_(big_endian(a)))


LAYOUTS = [big_endian, strided, reversed_, fortran, transposed, read_only, broadcast,
           big_endian_reversed_read_only]
POOL_DTYPES = [np.float32, np.float64, np.float16, ml_dtypes.bfloat16, np.int8, np.uint8]


def values(shape, dtype, seed=0):
    rng = np.random.default_rng(seed)
    a = rng.integers(-4, 5, shape)  # ties on purpose
    if np.dtype(dtype).kind == "u":
        a = np.abs(a)
    a = a.astype(dtype)
    if np.dtype(dtype).kind == "f" or dtype is ml_dtypes.bfloat16:
        a.flat[::7] = np.nan
    return a


def native(a):
    a = np.asarray(a)
    if a.dtype.byteorder not in "=|":
        a = a.astype(a.dtype.newbyteorder("="))
    return np.ascontiguousarray(a)


def assert_bits_equal(got, want):
    want = native(want)
    assert got.shape == want.shape and got.dtype == want.dtype, (got.shape, got.dtype,
                                                                  want.shape, want.dtype)
    assert got.tobytes() == want.tobytes()


class Untouched:
    """Records inputs' bytes and flags; ``check`` asserts they are unchanged."""

    def __init__(self, *arrays):
        self.records = [(a, a.tobytes(), a.flags.writeable, a.strides) for a in arrays]

    def check(self):
        for a, data, writeable, strides in self.records:
            assert a.tobytes() == data, "an input was modified"
            assert a.flags.writeable == writeable and a.strides == strides


@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda f: f.__name__)
@pytest.mark.parametrize("dtype", POOL_DTYPES, ids=lambda d: np.dtype(d).name)
def test_max_pool(layout, dtype):
    base = values((2, 3, 7, 6), dtype)
    x = layout(base)
    kept = Untouched(x)
    y, i = poolfold.max_pool(x, [3, 2], strides=[2, 1], pads=[1, 0, 1, 1], dilations=[1, 2],
                             return_indices=True)
    kept.check()
    want_y, want_i = oracle.max_pool(native(x), [3, 2], strides=[2, 1], pads=[1, 0, 1, 1],
                                     dilations=[1, 2])
    assert_bits_equal(y, want_y)
    assert_bits_equal(i, want_i)


@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda f: f.__name__)
def test_max_pool_3d_storage_order(layout):
    x = layout(values((1, 2, 4, 5, 3), np.float32, seed=1))
    kept = Untouched(x)
    y, i = poolfold.max_pool(x, [2, 2, 2], storage_order=1, ceil_mode=True, strides=[2, 2, 2],
                             return_indices=True)
    kept.check()
    want_y, want_i = oracle.max_pool(native(x), [2, 2, 2], strides=[2, 2, 2], ceil_mode=True,
                                     storage_order=1)
    assert_bits_equal(y, want_y)
    assert_bits_equal(i, want_i)


@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda f: f.__name__)
@pytest.mark.parametrize("dtype", [np.float32, np.float16, ml_dtypes.bfloat16, np.float64],
                         ids=lambda d: np.dtype(d).name)
def test_max_unpool(layout, dtype):
    source = values((2, 3, 6, 5), dtype, seed=2)
    pooled, indices = oracle.max_pool(source, [2, 2], strides=[2, 2])
    x, i = layout(pooled), layout(indices)
    kept = Untouched(x, i)
    got = poolfold.max_unpool(x, i, [2, 2], strides=[2, 2], output_shape=source.shape)
    kept.check()
    assert_bits_equal(got, oracle.max_unpool(native(x), native(i), [2, 2], strides=[2, 2],
                                             output_shape=source.shape))


@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda f: f.__name__)
@pytest.mark.parametrize("dtype", [np.float32, np.float16, ml_dtypes.bfloat16, np.int8,
                                   np.int64, np.uint16, np.bool_, np.complex128],
                         ids=lambda d: np.dtype(d).name)
def test_col2im(layout, dtype):
    x = layout(values((2, 2 * 4, 3 * 2), dtype, seed=3))
    image = big_endian(np.array([4, 3], np.int64))
    kept = Untouched(x, image)
    got = poolfold.col2im(x, image, [2, 2], dilations=[1, 1], strides=[1, 1])
    kept.check()
    assert_bits_equal(got, oracle.col2im(native(x), [4, 3], [2, 2]))


@pytest.mark.parametrize("layout", [big_endian, reversed_, fortran, read_only],
                         ids=lambda f: f.__name__)
@pytest.mark.parametrize("kind", ["U", "S", "O"])
def test_col2im_strings(layout, kind):
    words = np.array([["a", "bc", "d"], ["e", "", "fg"]] * 2, dtype=object).reshape(1, 4, 3)
    x = words.astype(kind) if kind != "O" else words
    x = layout(x) if kind != "O" or layout is not big_endian else x
    kept = Untouched(x) if kind != "O" else None
    got = poolfold.col2im(x, [4], [2])
    if kept:
        kept.check()
    want = oracle.col2im(np.ascontiguousarray(x), [4], [2])
    assert got.tolist() == want.tolist()


@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda f: f.__name__)
@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.int8],
                         ids=lambda d: np.dtype(d).name)
def test_nhwc_max_pool_and_unpool(layout, dtype):
    nchw = values((2, 3, 6, 5), dtype, seed=4)
    x = layout(np.ascontiguousarray(nchw.transpose(0, 2, 3, 1)))
    kept = Untouched(x)
    y, i = poolfold.nhwc.max_pool(x, [2, 2], strides=[2, 2], pads=[0, 0, 0, 1],
                                  return_indices=True, opset=12)
    kept.check()
    nchw = np.ascontiguousarray(native(x).transpose(0, 3, 1, 2))  # what the layout left
    want_y, want_i = oracle.max_pool(nchw, [2, 2], strides=[2, 2], pads=[0, 0, 0, 1])
    assert_bits_equal(y, want_y.transpose(0, 2, 3, 1))
    assert_bits_equal(i, want_i)
    if np.dtype(dtype).kind != "f":
        return
    y_in, i_in = layout(np.ascontiguousarray(want_y.transpose(0, 2, 3, 1))), layout(want_i)
    kept = Untouched(y_in, i_in)
    got = poolfold.nhwc.max_unpool(y_in, i_in, [2, 2], strides=[2, 2],
                                   output_shape=nchw.shape, opset=11)
    kept.check()
    want = oracle.max_unpool(np.ascontiguousarray(native(y_in).transpose(0, 3, 1, 2)),
                             native(i_in), [2, 2], strides=[2, 2], output_shape=nchw.shape)
    assert_bits_equal(got, want.transpose(0, 2, 3, 1))


@pytest.mark.parametrize("layout", [big_endian, strided, reversed_, fortran, read_only],
                         ids=lambda f: f.__name__)
def test_backend_run_node(layout):
    x = layout(values((1, 2, 5, 5), np.float32, seed=5))
    kept = Untouched(x)
    node = helper.make_node("MaxPool", ["X"], ["Y", "I"], kernel_shape=[3, 3], pads=[1, 1, 1, 1],
                            strides=[2, 2])
    y, i = poolfold.backend.run_node(node, [x])
    kept.check()
    want_y, want_i = oracle.max_pool(native(x), [3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    assert_bits_equal(y, want_y)
    assert_bits_equal(i, want_i)


# ------------------------------------------------------------------------------- 0-size

@pytest.mark.parametrize("shape", [(0, 3, 4, 4), (2, 0, 4, 4), (0, 0, 5)])
@pytest.mark.parametrize("dtype", POOL_DTYPES, ids=lambda d: np.dtype(d).name)
def test_max_pool_zero_size(shape, dtype):
    x = read_only(np.zeros(shape, dtype))
    y, i = poolfold.max_pool(x, [2] * (len(shape) - 2), return_indices=True)
    want_y, want_i = oracle.max_pool(x, [2] * (len(shape) - 2))
    assert_bits_equal(y, want_y)
    assert_bits_equal(i, want_i)


@pytest.mark.parametrize("shape", [(0, 3, 4, 4), (2, 0, 4, 4)])
def test_max_unpool_zero_size(shape):
    x = reversed_(np.zeros(shape, np.float32))
    i = np.zeros(shape, np.int64)
    got = poolfold.max_unpool(x, i, [2, 2], strides=[2, 2])
    assert_bits_equal(got, oracle.max_unpool(x, i, [2, 2], strides=[2, 2]))
    y, idx = poolfold.nhwc.max_pool(np.zeros((shape[0], 4, 4, shape[1]), np.float32), [2, 2],
                                    return_indices=True)
    assert y.shape == (shape[0], 3, 3, shape[1]) and idx.shape == (shape[0], shape[1], 3, 3)


@pytest.mark.parametrize("shape", [(0, 4, 9), (2, 0, 9)])
@pytest.mark.parametrize("dtype", [np.float32, np.int32, np.bool_, np.str_],
                         ids=lambda d: np.dtype(d).name)
def test_col2im_zero_size(shape, dtype):
    x = fortran(np.zeros(shape, dtype))
    got = poolfold.col2im(x, [4, 4], [2, 2])
    want = oracle.col2im(x, [4, 4], [2, 2])
    assert got.shape == want.shape and got.tolist() == want.tolist()


def test_max_pool_zero_spatial_dim_with_pads_gives_empty_windows():
    """n = 0 along a spatial axis is not an error when the pads make room for a window:
    every window is then empty (docs: -inf / the minimum, index -1)."""
    y, i = poolfold.max_pool(np.zeros((1, 2, 0), np.float32), [1], pads=[1, 1],
                             return_indices=True)
    assert y.shape == (1, 2, 2) and np.isneginf(y).all() and (i == -1).all()
    assert poolfold.max_pool_shape((1, 2, 0), [1], pads=[1, 1]) == (1, 2, 2)


# ------------------------------------------------------- read-only inputs, no second compile

def _compiled_signatures() -> dict:
    """Every poolfold kernel's compiled signatures, by kernel."""
    import importlib
    import pkgutil

    import numba

    import poolfold.kernels as kernels

    found = {}
    for info in pkgutil.iter_modules(kernels.__path__):
        module = importlib.import_module(f"{kernels.__name__}.{info.name}")
        for name, value in vars(module).items():
            if isinstance(value, numba.core.registry.CPUDispatcher):
                found[f"{info.name}.{name}"] = set(value.signatures)
    return found


READ_ONLY_CALLS = {
    "max_pool": lambda x: poolfold.max_pool(x, [3, 3], strides=[2, 2], pads=[1, 1, 1, 1]),
    "max_pool-indices": lambda x: poolfold.max_pool(x, [2, 2], strides=[2, 2],
                                                    return_indices=True),
    "max_pool-long-window": lambda x: poolfold.max_pool(x, [1, 9], auto_pad="SAME_UPPER"),
    "nhwc.max_pool": lambda x: poolfold.nhwc.max_pool(x, [3, 3], strides=[2, 2]),
    "average_pool": lambda x: poolfold.average_pool(x, [3, 3], pads=[1, 1, 1, 1]),
    "lp_pool": lambda x: poolfold.lp_pool(x, [2, 2], strides=[2, 2]),
    "global_max_pool": poolfold.global_max_pool,
    "global_average_pool": poolfold.global_average_pool,
    "max_unpool": lambda x: poolfold.max_unpool(
        x, np.arange(x.size, dtype=np.int64).reshape(x.shape) * 4, [2, 2], strides=[2, 2]),
    "col2im": lambda x: poolfold.col2im(x.reshape(2, 12, 15), np.array([4, 6]),
                                        np.array([2, 2])),
}


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("op", list(READ_ONLY_CALLS))
def test_read_only_input_reuses_the_compiled_kernels(op, dtype):
    """numba types an array by whether it may be written: a read-only input (np.frombuffer,
    onnx's tensors, memory maps) must run the kernels the writeable one compiled, not compile
    each a second time (tens of seconds for a first call)."""
    x = np.random.default_rng(3).standard_normal((2, 3, 6, 10)).astype(dtype)
    call = READ_ONLY_CALLS[op]
    want = call(x)
    before = _compiled_signatures()
    frozen = x.copy()
    frozen.flags.writeable = False
    got = call(frozen)
    for w, g in zip(want if isinstance(want, tuple) else (want,),
                    got if isinstance(got, tuple) else (got,)):
        np.testing.assert_array_equal(g, w)
    after = _compiled_signatures()
    grown = {k: after[k] - before.get(k, set()) for k in after if after[k] - before.get(k, set())}
    assert not grown, grown


# Helpers that read the input (read-only) in one pass and the kernel's scratch in the next:
# the kernels hand them the scratch through poolfold.kernels.read_only, so each compiles
# once per type, not once for each kind of source.
SCRATCH_READERS = ("max_passes._run_pass", "max_passes._van_herk", "folds.fold",
                   "window_max._axis_pass", "window_max._first_max_rows")


def test_helpers_reading_input_and_scratch_compile_once():
    from poolfold.ops.max_pool import PASSES, SEPARABLE, forced_kernel

    x = np.random.default_rng(4).standard_normal((1, 2, 9, 40)).astype(np.float32)
    for kernel in (PASSES, SEPARABLE):  # a long last-axis window: van Herk runs and lanes
        with forced_kernel(kernel):
            y, indices = poolfold.max_pool(x, [3, 9], strides=[2, 1], return_indices=True)
        want = oracle.max_pool(x, [3, 9], strides=[2, 1])
        np.testing.assert_array_equal(y, want[0])
        np.testing.assert_array_equal(indices, want[1])
    compiled = _compiled_signatures()
    signatures = {name: compiled.get(name, set()) for name in SCRATCH_READERS}
    if not any(signatures.values()):
        pytest.skip("the kernels came from numba's cache: their helpers were not compiled here")
    for name, found in signatures.items():
        # signatures that differ only in which arrays may be written
        kinds = {}
        for signature in found:
            key = tuple(t.copy(readonly=True) if isinstance(t, numba.types.Array) else t
                        for t in signature)
            kinds.setdefault(key, []).append(signature)
        twins = [group for group in kinds.values() if len(group) > 1]
        assert not twins, (name, twins)
