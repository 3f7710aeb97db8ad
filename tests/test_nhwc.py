"""poolfold.nhwc (com.ms.internal.nhwc MaxPool 1/8/10/11/12 and MaxUnpool 9/11) against the oracle.

The contract (docs/semantics.md, docs/semantics.md): the nhwc op on a channels-last tensor equals the
ai.onnx op on its NCHW transpose, followed by the activation; MaxPool's Indices and MaxUnpool's I
and output_shape stay channels-first.  The activation is computed in float64 from Y's value and
rounded once to Y's type; NaN passes through.  So the expected result here is
``oracle.<op>(nchw transpose)`` -> float64 -> activation formula (written below from the
contract) -> cast to the dtype -> transposed back to channels-last.

Relu, LeakyRelu, Clip, HardSigmoid and no activation must match exactly (NaN positions included);
Tanh and Sigmoid within a last-place tolerance (libm and numba's math may differ by an ulp in
float64 before the rounding).  Indices must equal the oracle's exactly.
"""

from __future__ import annotations

import functools

import ml_dtypes
import numpy as np
import pytest
from hypothesis import assume, given, note, settings
from hypothesis import strategies as st

import oracle
import poolfold
import poolfold.ops.nhwc as nhwc_module

F16 = np.dtype(np.float16)
F32 = np.dtype(np.float32)
F64 = np.dtype(np.float64)
I8 = np.dtype(np.int8)
U8 = np.dtype(np.uint8)
FLOATS = (F16, F32, F64)

POOL_VERSIONS = (1, 8, 10, 11, 12)
# opsets (for the nhwc domain) that resolve to each version; None is the latest (12)
POOL_OPSETS = {1: (1, 7), 8: (8, 9), 10: (10,), 11: (11,), 12: (12, 21, None)}
UNPOOL_VERSIONS = (9, 11)
UNPOOL_OPSETS = {9: (9, 10), 11: (11, 22, None)}

# Parameters are exactly representable in float32 and float64, so whether poolfold keeps them
# as float32 (like an ONNX attribute) or float64 makes no difference.
ACTIVATIONS = {
    None: [None],
    "Relu": [None, []],
    "Tanh": [None, []],
    "Sigmoid": [None, []],
    "LeakyRelu": [[0.5], [0.25], [2.0], [-0.75]],
    "Clip": [[-1.0, 2.0], [0.0, 0.5], [-0.25, -0.25], [-6.0, 6.0]],
    "HardSigmoid": [[0.25, 0.5], [0.5, 0.375], [-0.5, 0.5], [2.0, -1.0]],
}
INEXACT = ("Tanh", "Sigmoid")
RTOL = {F16: 1e-3, F32: 1e-6, F64: 1e-12}
ATOL = {F16: 6e-8, F32: 1e-44, F64: 1e-300}


def types_of(version: int) -> tuple[np.dtype, ...]:
    return FLOATS + ((I8, U8) if version >= 12 else ())


def activation_reference(y: np.ndarray, name, params) -> np.ndarray:
    """The contract's formulas, in float64, rounded once to y's dtype."""
    if name is None:
        return y.copy()
    v = y.astype(np.float64)
    with np.errstate(all="ignore"):
        if name == "Relu":
            r = np.where(v < 0, 0.0, v)
        elif name == "Tanh":
            r = np.tanh(v)
        elif name == "Sigmoid":
            r = 1.0 / (1.0 + np.exp(-v))
        elif name == "LeakyRelu":
            r = np.where(v < 0, params[0] * v, v)
        elif name == "Clip":
            lo, hi = params
            r = np.where(v < lo, lo, np.where(v > hi, hi, v))
        elif name == "HardSigmoid":
            alpha, beta = params
            h = alpha * v + beta
            r = np.where(h < 0, 0.0, np.where(h > 1, 1.0, h))
        else:  # pragma: no cover
            raise AssertionError(name)
        return r.astype(y.dtype)


def to_nhwc(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(np.moveaxis(a, 1, -1))


def bits(a: np.ndarray) -> np.ndarray:
    """A contiguous same-width unsigned-int view of ``a``'s elements (any float type,
    bfloat16 and float16 included): -0.0 != 0.0, and NaN payloads and signs count."""
    return np.ascontiguousarray(a).view(np.dtype(f"u{a.dtype.itemsize}"))


def assert_matches(got: np.ndarray, want: np.ndarray, dtype: np.dtype, activation) -> None:
    assert isinstance(got, np.ndarray)
    assert got.dtype == want.dtype, (got.dtype, want.dtype)
    assert got.shape == want.shape, (got.shape, want.shape)
    if dtype.kind == "f":
        assert np.array_equal(np.isnan(got), np.isnan(want)), "NaN positions differ"
    if activation in INEXACT:
        np.testing.assert_allclose(got, want, rtol=RTOL[dtype], atol=ATOL[dtype], equal_nan=True)
    else:  # exact: the same bits
        g, w = bits(got), bits(want)
        if not np.array_equal(g, w):
            bad = tuple(int(v) for v in np.argwhere(g != w)[0])
            raise AssertionError(
                f"{int((g != w).sum())} elements differ in their bits, first at {bad}: got "
                f"{got[bad]!r} ({int(g[bad]):#x}), want {want[bad]!r} ({int(w[bad]):#x})")


# ------------------------------------------------------------------------------ strategies

FLOAT_SPECIALS = [0.0, -0.0, 1.0, -1.0, 2.0, -2.0, 0.5, -0.5, 3.0, -3.0, 0.375, 100.0,
                  -100.0, 1e-3, -7.25, np.nan, np.inf, -np.inf]


@st.composite
def values(draw, shape, dtype):
    size = int(np.prod(shape))
    if dtype.kind == "f":
        pool = FLOAT_SPECIALS if draw(st.booleans()) else FLOAT_SPECIALS[:6]  # many ties
        element = st.one_of(st.sampled_from(pool),
                            st.floats(-50, 50, width=16))
    else:
        info = np.iinfo(dtype)
        element = st.one_of(st.sampled_from([info.min, info.max, 0, 1, 2]),
                            st.integers(info.min, info.max))
    flat = draw(st.lists(element, min_size=size, max_size=size))
    return np.array(flat, dtype=np.float64 if dtype.kind == "f" else np.int64) \
        .astype(dtype).reshape(shape)


@st.composite
def activations(draw, dtype):
    if dtype.kind != "f":
        return None, None
    name = draw(st.sampled_from(list(ACTIVATIONS)))
    return name, draw(st.sampled_from(ACTIVATIONS[name]))


@st.composite
def pool_cases(draw):
    version = draw(st.sampled_from(POOL_VERSIONS))
    opset = draw(st.sampled_from(POOL_OPSETS[version]))
    dtype = draw(st.sampled_from(types_of(version)))
    rank = draw(st.integers(1, 3))
    n = draw(st.integers(1, 2))
    c = draw(st.integers(1, 3))
    dims = draw(st.lists(st.integers(1, 5 if rank < 3 else 4), min_size=rank, max_size=rank))
    kernel = draw(st.lists(st.integers(1, 3), min_size=rank, max_size=rank))
    kw = {}
    strides = draw(st.none() | st.lists(st.integers(1, 3), min_size=rank, max_size=rank))
    if strides is not None:
        kw["strides"] = strides
    dilations = None
    if version >= 10:
        dilations = draw(st.none() | st.lists(st.integers(1, 2), min_size=rank, max_size=rank))
        if dilations is not None:
            kw["dilations"] = dilations
        kw["ceil_mode"] = draw(st.booleans())
    auto_pad = draw(st.sampled_from(["NOTSET", "NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID"]))
    kw["auto_pad"] = auto_pad
    if auto_pad == "NOTSET":
        pads = draw(st.none() | st.lists(st.integers(0, 3), min_size=2 * rank, max_size=2 * rank))
        if pads is not None:
            kw["pads"] = pads
    # every axis must have at least one window (else an error, tested elsewhere)
    s = strides or [1] * rank
    d = dilations or [1] * rank
    p = kw.get("pads") or [0] * (2 * rank)
    assume(oracle.max_pool_geometry(dims, kernel, s, p, d, auto_pad,
                                    kw.get("ceil_mode", False)) is not None)
    return_indices = version >= 8 and draw(st.booleans())
    if version >= 8:
        kw["storage_order"] = draw(st.sampled_from([0, 1]))
    act, params = draw(activations(dtype))
    x = draw(values((n, c, *dims), dtype))
    return dict(version=version, opset=opset, x=x, kernel=kernel, kw=kw,
                return_indices=return_indices, activation=act, params=params,
                view=draw(st.booleans()))


@st.composite
def unpool_cases(draw):
    version = draw(st.sampled_from(UNPOOL_VERSIONS))
    opset = draw(st.sampled_from(UNPOOL_OPSETS[version]))
    dtype = draw(st.sampled_from(FLOATS))
    rank = draw(st.integers(1, 3))
    n = draw(st.integers(1, 2))
    c = draw(st.integers(1, 3))
    dims = draw(st.lists(st.integers(1, 3), min_size=rank, max_size=rank))
    kernel = draw(st.lists(st.integers(1, 3), min_size=rank, max_size=rank))
    strides = draw(st.none() | st.lists(st.integers(1, 3), min_size=rank, max_size=rank))
    pads = draw(st.none() | st.lists(st.integers(0, 2), min_size=2 * rank, max_size=2 * rank))
    s = strides or [1] * rank
    p = pads or [0] * (2 * rank)
    inferred = [(dims[i] - 1) * s[i] + kernel[i] - p[i] - p[rank + i] for i in range(rank)]
    if draw(st.booleans()):
        output_shape = None
        assume(min(inferred) >= 1)
        out = inferred
    else:
        out = draw(st.lists(st.integers(1, 6), min_size=rank, max_size=rank))
        output_shape = [n, c, *out]
    total = n * c * int(np.prod(out))
    x = draw(values((n, c, *dims), dtype))
    # indices anywhere in the output, duplicates included (the last in NCHW row-major order wins)
    flat = draw(st.lists(st.integers(0, total - 1), min_size=x.size, max_size=x.size))
    indices = np.array(flat, dtype=np.int64).reshape(x.shape)
    act, params = draw(activations(dtype))
    return dict(version=version, opset=opset, x=x, indices=indices, kernel=kernel,
                strides=strides, pads=pads, output_shape=output_shape, activation=act,
                params=params, shape_as_array=draw(st.booleans()))


# ------------------------------------------------------------------------------ MaxPool

@settings(max_examples=150, deadline=None)
@given(pool_cases())
def test_nhwc_max_pool_matches_oracle(case):
    x = case["x"]
    note(f"x (NCHW) = {x.tolist()!r}")
    want_y, want_i = oracle.max_pool(x, case["kernel"], **case["kw"])
    want_y = to_nhwc(activation_reference(want_y, case["activation"], case["params"]))
    # channels-last input: a contiguous copy or a non-contiguous view of the NCHW array
    x_nhwc = np.moveaxis(x, 1, -1) if case["view"] else to_nhwc(x)
    kwargs = dict(case["kw"])
    if case["activation"] is not None:
        kwargs["activation"] = case["activation"]
    if case["params"] is not None:
        kwargs["activation_params"] = case["params"]
    result = poolfold.nhwc.max_pool(x_nhwc, case["kernel"], return_indices=case["return_indices"],
                                    opset=case["opset"], **kwargs)
    if case["return_indices"]:
        y, indices = result
        assert indices.dtype == np.int64
        assert indices.shape == want_i.shape  # NCHW-shaped
        np.testing.assert_array_equal(indices, want_i)
    else:
        y = result
    assert_matches(y, want_y, x.dtype, case["activation"])


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("storage_order", [0, 1])
@pytest.mark.parametrize("dims, kernel, strides, pads", [
    ((9, 10), [3, 3], [2, 2], [1, 1, 1, 1]),
    ((6, 5, 8), [2, 3, 2], [2, 1, 2], [0, 1, 1, 1, 0, 0]),
])
def test_nhwc_max_pool_separable_path(monkeypatch, dtype, storage_order, dims, kernel, strides,
                                      pads):
    """Force the older separable passes on NCHW-style planes (slabs of two output rows) to
    check the channel axis riding along them, the NCHW Indices and the activation."""
    from poolfold.ops.max_pool import forced_kernel

    monkeypatch.setattr(nhwc_module, "pool_planes",
                        functools.partial(nhwc_module.pool_planes, slab_rows=2))
    rng = np.random.default_rng(7)
    x = rng.integers(-4, 5, size=(2, 5) + dims).astype(dtype)  # NCHW, many ties
    x.reshape(-1)[[3, 40, 41]] = np.nan
    want_y, want_i = oracle.max_pool(x, kernel, strides=strides, pads=pads,
                                     storage_order=storage_order)
    with forced_kernel("separable") as override:
        y, indices = poolfold.nhwc.max_pool(to_nhwc(x), kernel, strides=strides, pads=pads,
                                            storage_order=storage_order, return_indices=True,
                                            activation="LeakyRelu", activation_params=[0.5])
    assert override.ran == ["separable"]
    np.testing.assert_array_equal(indices, want_i)
    assert_matches(y, to_nhwc(activation_reference(want_y, "LeakyRelu", [0.5])), x.dtype,
                   "LeakyRelu")


# ------------------------------------------------------------------------------ MaxUnpool

@settings(max_examples=150, deadline=None)
@given(unpool_cases())
def test_nhwc_max_unpool_matches_oracle(case):
    x, indices = case["x"], case["indices"]
    note(f"x (NCHW) = {x.tolist()!r}, I = {indices.tolist()!r}")
    want = oracle.max_unpool(x, indices, case["kernel"], strides=case["strides"],
                             pads=case["pads"], output_shape=case["output_shape"])
    want = to_nhwc(activation_reference(want, case["activation"], case["params"]))
    output_shape = case["output_shape"]
    if output_shape is not None and case["shape_as_array"]:
        output_shape = np.array(output_shape, np.int64)
    kwargs = {}
    if case["activation"] is not None:
        kwargs["activation"] = case["activation"]
    if case["params"] is not None:
        kwargs["activation_params"] = case["params"]
    got = poolfold.nhwc.max_unpool(to_nhwc(x), indices, case["kernel"], strides=case["strides"],
                                   pads=case["pads"], output_shape=output_shape,
                                   opset=case["opset"], **kwargs)
    assert_matches(got, want, x.dtype, case["activation"])


@settings(max_examples=40, deadline=None)
@given(pool_cases().filter(lambda c: c["version"] >= 8 and c["x"].dtype.kind == "f"))
def test_nhwc_pool_then_unpool_restores_maxima(case):
    """nhwc MaxPool's NCHW Indices feed nhwc MaxUnpool (output_shape NCHW) directly."""
    x = case["x"]
    kw = {k: v for k, v in case["kw"].items() if k != "storage_order"}
    y, indices = poolfold.nhwc.max_pool(to_nhwc(x), case["kernel"], return_indices=True,
                                        opset=case["opset"], **kw)
    assume((indices >= 0).all())  # empty windows give -1, not an unpoolable index
    restored = poolfold.nhwc.max_unpool(y, indices, case["kernel"], output_shape=list(x.shape))
    want = oracle.max_unpool(np.moveaxis(y, -1, 1), indices, case["kernel"],
                             output_shape=list(x.shape))
    assert restored.shape == to_nhwc(x).shape and restored.dtype == x.dtype
    assert np.array_equal(bits(restored), bits(to_nhwc(want)))
    # against x itself (docs/semantics.md, MaxUnpool): every maximum back in its place, bit for
    # bit, and 0 everywhere else.  The indices are NCHW-flat positions in x.
    restored_flat = bits(np.moveaxis(restored, -1, 1)).reshape(-1)
    x_flat = bits(x).reshape(-1)
    hit = np.zeros(x.size, bool)
    hit[indices.reshape(-1)] = True
    assert hit.any()
    assert np.array_equal(restored_flat[hit], x_flat[hit])
    assert (restored_flat[~hit] == 0).all()  # +0.0


# ------------------------------------------------------------------------------ fixed examples

def test_readme_example_nhwc_equals_nchw_indices():
    x = np.random.default_rng(0).standard_normal((2, 3, 9, 7)).astype(np.float32)
    y, ind = poolfold.max_pool(x, [3, 3], strides=[2, 2], pads=[1, 1, 1, 1], return_indices=True)
    y2, ind2 = poolfold.nhwc.max_pool(to_nhwc(x), [3, 3], strides=[2, 2], pads=[1, 1, 1, 1],
                                      return_indices=True, activation="Relu")
    np.testing.assert_array_equal(ind2, ind)
    np.testing.assert_array_equal(y2, to_nhwc(np.maximum(y, 0)))


@pytest.mark.parametrize("name, params, want", [
    ("Relu", None, 0.0),
    ("Tanh", None, -1.0),
    ("Sigmoid", None, 0.0),
    ("LeakyRelu", [0.5], -np.inf),
    ("LeakyRelu", [-0.5], np.inf),
    ("Clip", [-1.0, 2.0], -1.0),
    ("HardSigmoid", [0.25, 0.5], 0.0),
    ("HardSigmoid", [-0.25, 0.5], 1.0),
])
@pytest.mark.parametrize("dtype", FLOATS)
def test_activation_of_empty_window(dtype, name, params, want):
    """Pads bigger than the kernel: the corner windows are empty, their -inf goes through the
    activation."""
    x = np.ones((1, 1, 1, 1), dtype)  # N, H, W, C
    y, ind = poolfold.nhwc.max_pool(x, [1, 1], pads=[1, 1, 1, 1], return_indices=True,
                                    activation=name, activation_params=params)
    assert y.shape == (1, 3, 3, 1) and y.dtype == dtype
    assert ind[0, 0, 0, 0] == -1 and ind[0, 0, 1, 1] == 0
    assert y[0, 0, 0, 0] == want
    assert y[0, 1, 1, 0] == activation_reference(np.ones(1, dtype), name, params)[0]


@pytest.mark.parametrize("name, params", [(n, p[-1]) for n, p in ACTIVATIONS.items() if n])
@pytest.mark.parametrize("dtype", FLOATS)
def test_unpool_activation_applies_to_zeros(dtype, name, params):
    x = np.array([[[[np.nan], [-3.0]]]], dtype)  # (1, 1, 2, 1): N, H, W, C
    indices = np.array([[[[0, 3]]]], np.int64)  # NCHW (1, 1, 1, 2)
    got = poolfold.nhwc.max_unpool(x, indices, [2, 2], strides=[2, 2], output_shape=[1, 1, 2, 2],
                                   activation=name, activation_params=params)
    raw = np.array([np.nan, 0.0, 0.0, -3.0], dtype)
    want = activation_reference(raw, name, params).reshape(1, 2, 2, 1)
    assert_matches(got, want, np.dtype(dtype), name)
    assert np.isnan(got[0, 0, 0, 0])  # NaN passes through every activation


@pytest.mark.parametrize("dtype", [I8, U8])
def test_integer_pooling_without_activation(dtype):
    rng = np.random.default_rng(3)
    info = np.iinfo(dtype)
    x = rng.integers(info.min, info.max, (2, 3, 5, 4), endpoint=True).astype(dtype)
    want_y, want_i = oracle.max_pool(x, [2, 3], strides=[2, 1], pads=[1, 1, 1, 0])
    y, ind = poolfold.nhwc.max_pool(to_nhwc(x), [2, 3], strides=[2, 1], pads=[1, 1, 1, 0],
                                    return_indices=True, opset=12)
    assert y.dtype == dtype
    np.testing.assert_array_equal(y, to_nhwc(want_y))
    np.testing.assert_array_equal(ind, want_i)


def test_zero_batch_and_zero_channels():
    for shape in [(0, 4, 4, 2), (1, 4, 4, 0)]:
        y, ind = poolfold.nhwc.max_pool(np.zeros(shape, np.float32), [2, 2], return_indices=True)
        assert y.shape == (shape[0], 3, 3, shape[3])
        assert ind.shape == (shape[0], shape[3], 3, 3)


# ------------------------------------------------------------------------------ errors

X4 = np.zeros((1, 4, 4, 2), np.float32)


def _raises(exc, call, *words):
    with pytest.raises(exc) as info:
        call()
    message = str(info.value)
    for word in words:
        assert word in message, f"{word!r} not in {message!r}"
    return message


@pytest.mark.parametrize("opset, label", [(None, "com.ms.internal.nhwc.MaxPool-12"),
                                          (10, "com.ms.internal.nhwc.MaxPool-10")])
def test_error_unknown_activation(opset, label):
    _raises(ValueError, lambda: poolfold.nhwc.max_pool(X4, [2, 2], activation="Gelu", opset=opset),
            label, "Gelu", "activation")


def test_error_unknown_activation_unpool():
    _raises(ValueError, lambda: poolfold.nhwc.max_unpool(
        X4, np.zeros((1, 2, 4, 4), np.int64), [2, 2], activation="Softplus"),
        "com.ms.internal.nhwc.MaxUnpool-11", "Softplus")


@pytest.mark.parametrize("name, params", [
    ("LeakyRelu", None), ("LeakyRelu", []), ("LeakyRelu", [0.1, 0.2]),
    ("Clip", [1.0]), ("Clip", [0.0, 1.0, 2.0]), ("HardSigmoid", [0.2]),
    ("Relu", [1.0]), ("Tanh", [0.5]), ("Sigmoid", [1.0, 2.0]),
])
def test_error_wrong_number_of_activation_params(name, params):
    _raises(ValueError, lambda: poolfold.nhwc.max_pool(X4, [2, 2], activation=name,
                                                      activation_params=params),
            "com.ms.internal.nhwc.MaxPool-12", name, "activation_params")
    _raises(ValueError, lambda: poolfold.nhwc.max_unpool(
        X4, np.zeros((1, 2, 4, 4), np.int64), [2, 2], activation=name, activation_params=params,
        opset=9), "com.ms.internal.nhwc.MaxUnpool-9", name, "activation_params")


def test_error_activation_params_without_activation():
    _raises(ValueError, lambda: poolfold.nhwc.max_pool(X4, [2, 2], activation_params=[0.5]),
            "com.ms.internal.nhwc.MaxPool-12", "activation_params", "activation")
    _raises(ValueError, lambda: poolfold.nhwc.max_unpool(
        X4, np.zeros((1, 2, 4, 4), np.int64), [2, 2], activation_params=[1.0, 2.0]),
        "com.ms.internal.nhwc.MaxUnpool-11", "activation_params")


@pytest.mark.parametrize("dtype", [I8, U8])
@pytest.mark.parametrize("name, params", [("Relu", None), ("Clip", [0.0, 6.0])])
def test_error_activation_on_integer_data(dtype, name, params):
    _raises(ValueError, lambda: poolfold.nhwc.max_pool(X4.astype(dtype), [2, 2], activation=name,
                                                      activation_params=params),
            "com.ms.internal.nhwc.MaxPool-12", name, np.dtype(dtype).name)


@pytest.mark.parametrize("opset", [None, 8])
def test_error_integer_data_before_version_12(opset):
    if opset is None:  # version 12 accepts it
        poolfold.nhwc.max_pool(X4.astype(np.int8), [2, 2])
        return
    _raises(TypeError, lambda: poolfold.nhwc.max_pool(X4.astype(np.int8), [2, 2], opset=opset),
            "com.ms.internal.nhwc.MaxPool-8", "int8")


@pytest.mark.parametrize("opset", [None, 12, 22, 30])
def test_error_bfloat16_pool(opset):
    x = X4.astype(ml_dtypes.bfloat16)
    _raises(TypeError, lambda: poolfold.nhwc.max_pool(x, [2, 2], opset=opset),
            "com.ms.internal.nhwc.MaxPool-12", "bfloat16")


@pytest.mark.parametrize("opset", [None, 9, 22])
def test_error_bfloat16_unpool(opset):
    x = X4.astype(ml_dtypes.bfloat16)
    label = "com.ms.internal.nhwc.MaxUnpool-9" if opset == 9 else "com.ms.internal.nhwc.MaxUnpool-11"
    _raises(TypeError, lambda: poolfold.nhwc.max_unpool(x, np.zeros((1, 2, 4, 4), np.int64),
                                                        [2, 2], opset=opset),
            label, "bfloat16")


@pytest.mark.parametrize("i_shape", [(1, 4, 4, 2), (1, 2, 4), (1, 2, 4, 4, 1), (2, 2, 4, 4)])
def test_error_indices_not_nchw_shaped(i_shape):
    _raises(ValueError, lambda: poolfold.nhwc.max_unpool(X4, np.zeros(i_shape, np.int64), [2, 2]),
            "com.ms.internal.nhwc.MaxUnpool-11", "'I'")


def test_error_output_shape_channels_last_order():
    """output_shape is NCHW-ordered: (N, H, W, C) with C != H is refused (N and C must match)."""
    x = np.zeros((1, 2, 2, 3), np.float32)
    _raises(ValueError, lambda: poolfold.nhwc.max_unpool(
        x, np.zeros((1, 3, 2, 2), np.int64), [2, 2], strides=[2, 2], output_shape=[1, 4, 4, 3]),
        "com.ms.internal.nhwc.MaxUnpool-11", "output_shape")


def test_error_version_attributes():
    _raises(ValueError, lambda: poolfold.nhwc.max_pool(X4, [2, 2], dilations=[2, 2], opset=8),
            "com.ms.internal.nhwc.MaxPool-8", "dilations")
    _raises(ValueError, lambda: poolfold.nhwc.max_pool(X4, [2, 2], return_indices=True, opset=1),
            "com.ms.internal.nhwc.MaxPool-1", "Indices")
    _raises(ValueError, lambda: poolfold.nhwc.max_unpool(X4, np.zeros((1, 2, 4, 4), np.int64),
                                                         [2, 2], opset=8),
            "MaxUnpool", "8")


@pytest.mark.parametrize("op, dtype, opset, hinted", [
    ("MaxPool", ml_dtypes.bfloat16, None, None),  # no com.ms.internal.nhwc version has bfloat16
    ("MaxUnpool", ml_dtypes.bfloat16, None, None),
    ("MaxUnpool", np.int8, None, None),  # nor MaxUnpool int8
    ("MaxPool", np.int8, 8, 12),  # int8 from nhwc MaxPool-12
    ("MaxPool", np.int8, 1, 12),
], ids=str)
def test_type_error_hint_points_to_a_version_that_accepts_the_type(op, dtype, opset, hinted):
    """A type error may say from which version a type is accepted; for the nhwc domain that
    version must exist there and accept it, and where no nhwc version accepts the type the
    message must not point to one (an ai.onnx version would be a false lead)."""
    import re

    x = X4.astype(dtype)
    if op == "MaxPool":
        def call(opset=None):
            return poolfold.nhwc.max_pool(x, [2, 2], opset=opset)
    else:
        def call(opset=None):
            return poolfold.nhwc.max_unpool(x, np.zeros((1, 2, 4, 4), np.int64), [2, 2],
                                            opset=opset)
    with pytest.raises(TypeError) as info:
        call(opset)
    hint = re.search(r"accepted from \S*?-(\d+)", str(info.value))
    if hinted is None:
        assert hint is None, str(info.value)
    else:
        assert hint is not None, str(info.value)
        assert int(hint.group(1)) == hinted, str(info.value)
        call(hinted)  # the version the message points to accepts the type


def test_float16_activation_emits_no_spurious_warning():
    """float16 data of ones through LeakyRelu(3.0) overflows nothing: no RuntimeWarning may
    escape (with warnings turned into errors, the call must still work)."""
    import warnings

    x = np.ones((1, 2, 2, 1), np.float16)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        y = poolfold.nhwc.max_pool(x, [1, 1], activation="LeakyRelu", activation_params=[3.0])
    np.testing.assert_array_equal(y, x)
