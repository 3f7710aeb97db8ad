"""poolfold.col2im against the slow oracle (tests/oracle.py), bit for bit, for every type
(numbers, bool, complex, strings), spatial ranks 1-4, with strides, pads and dilations, plus
hand-checked accumulation rules and the error cases of the project semantics (docs/semantics.md).

Floating-point sums are compared bit for bit except inside NaNs: IEEE 754 does not say which
payload a sum of NaNs carries, so there only "both are NaN" is required.
"""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, note, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import oracle
from refusal import assert_refused_quickly
import poolfold
from poolfold import PoolfoldError, PoolfoldTypeError

BF16 = np.dtype(ml_dtypes.bfloat16)
NUMBER_DTYPES = [np.dtype(t) for t in (
    np.float16, np.float32, np.float64, np.int8, np.int16, np.int32, np.int64, np.uint8,
    np.uint16, np.uint32, np.uint64, np.bool_, np.complex64, np.complex128)] + [BF16]
STRING_KINDS = ["U", "S", "O"]
ALL_TYPES = NUMBER_DTYPES + STRING_KINDS
OPSETS = [None, 18, 19, 23]


def is_float(dtype):
    return dtype.kind in "fc" or dtype == BF16


def assert_same(actual, expected):
    """Same shape and values: bits for numbers (NaN: any NaN), Python objects for strings."""
    assert isinstance(actual, np.ndarray)
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    if expected.dtype.kind in "USO":
        assert actual.dtype.kind == expected.dtype.kind, (actual.dtype, expected.dtype)
        assert actual.tolist() == expected.tolist()
        return
    assert actual.dtype == expected.dtype, (actual.dtype, expected.dtype)
    a, e = np.ascontiguousarray(actual), np.ascontiguousarray(expected)
    if expected.dtype.kind == "c":  # real and imaginary parts as separate floats
        part = np.float32 if expected.dtype == np.complex64 else np.float64
        a, e = a.view(part), e.view(part)
    width = np.dtype(f"u{e.dtype.itemsize}")
    if is_float(e.dtype):
        a_nan = np.isnan(a.astype(np.float64))
        e_nan = np.isnan(e.astype(np.float64))
        np.testing.assert_array_equal(a_nan, e_nan)
        np.testing.assert_array_equal(a.view(width)[~e_nan], e.view(width)[~e_nan])
    else:
        np.testing.assert_array_equal(a.view(width), e.view(width))


# --------------------------------------------------------------------------------------
# Strategies
# --------------------------------------------------------------------------------------

TEXT = st.text(alphabet="ab字é", max_size=3)
BYTES = st.text(alphabet="xyz", max_size=3).map(str.encode)


def values(dtype, shape):
    if dtype == "U":
        return hnp.arrays(np.dtype("U3"), shape, elements=TEXT)
    if dtype == "S":
        return hnp.arrays(np.dtype("S3"), shape, elements=BYTES)
    if dtype == "O":
        size = math.prod(shape)

        def to_object(items):
            a = np.empty(size, dtype=object)
            a[:] = items
            return a.reshape(shape)

        return st.lists(TEXT, min_size=size, max_size=size).map(to_object)
    if dtype == BF16:
        return st.one_of(
            hnp.arrays(np.uint16, shape).map(lambda a: a.view(BF16)),  # any bit pattern
            hnp.arrays(np.int8, shape).map(lambda a: a.astype(BF16)),  # many exact sums
        )
    if dtype.kind == "f":
        return st.one_of(
            hnp.arrays(dtype, shape),  # hypothesis' mix: NaN, inf, -0.0, subnormals, extremes
            hnp.arrays(np.int8, shape).map(lambda a: a.astype(dtype)),
            hnp.arrays(dtype, shape, elements=st.sampled_from([1e8, 1.0, -1e8, 0.1, -0.0, 3.0])
                       if dtype != np.float16 else st.sampled_from([2048.0, 1.0, -0.0, 0.1])),
        )
    return hnp.arrays(dtype, shape)


@st.composite
def fold_geometry(draw):
    rank = draw(st.integers(1, 4))
    image_max, block_max = {1: (6, 3), 2: (5, 3), 3: (3, 2), 4: (3, 2)}[rank]
    image, block, strides, dilations, begins, ends = [], [], [], [], [], []
    for _ in range(rank):
        b = draw(st.integers(1, block_max))
        d = draw(st.integers(1, 2))
        pb, pe = draw(st.integers(0, 2)), draw(st.integers(0, 2))
        span = (b - 1) * d + 1
        low = max(1, span - pb - pe)  # smallest image with >= 1 block
        image.append(draw(st.integers(low, max(low, image_max))))
        block.append(b)
        strides.append(draw(st.integers(1, 3)))
        dilations.append(d)
        begins.append(pb)
        ends.append(pe)
    return image, block, strides, dilations, begins + ends


def block_counts(image, block, strides, dilations, pads):
    r = len(image)
    return [(image[i] + pads[i] + pads[r + i] - ((block[i] - 1) * dilations[i] + 1)) // strides[i] + 1
            for i in range(r)]


def shape_input(draw, values_):
    kind = draw(st.sampled_from(["list", "tuple", "array"]))
    if kind == "array":
        return np.array(values_, np.int64)
    return list(values_) if kind == "list" else tuple(values_)


# --------------------------------------------------------------------------------------
# Against the oracle
# --------------------------------------------------------------------------------------


@settings(max_examples=200)
@given(data=st.data())
def test_matches_oracle(data):
    dtype = data.draw(st.sampled_from(ALL_TYPES), label="dtype")
    image, block, strides, dilations, pads = data.draw(fold_geometry(), label="geometry")
    nblk = block_counts(image, block, strides, dilations, pads)
    n = data.draw(st.sampled_from([0, 1, 1, 2]), label="N")
    c = data.draw(st.sampled_from([0, 1, 1, 2]), label="C")
    shape = (n, c * math.prod(block), math.prod(nblk))
    x = data.draw(values(dtype, shape), label="x")
    note(f"blocks {nblk}")
    expected = oracle.col2im(x, image, block, dilations=dilations, pads=pads, strides=strides)
    kwargs = {}
    for name, value, default in (("strides", strides, 1), ("dilations", dilations, 1),
                                 ("pads", pads, 0)):
        if any(v != default for v in value) or data.draw(st.booleans(), label=f"give {name}"):
            kwargs[name] = value
    opset = data.draw(st.sampled_from(OPSETS), label="opset")
    if opset is not None:
        kwargs["opset"] = opset
    if dtype != "O" and data.draw(st.booleans(), label="non-contiguous input"):
        big = np.zeros(shape[:2] + (2 * shape[2],), x.dtype)
        big[..., 1::2] = x
        x = big[..., 1::2]
    got = poolfold.col2im(x, shape_input(data.draw, image), shape_input(data.draw, block),
                          **kwargs)
    assert got.shape == (n, c, *image)
    assert_same(got, expected)


# --------------------------------------------------------------------------------------
# Hand-checked accumulation rules (three taps of one block offset on one pixel)
# --------------------------------------------------------------------------------------


def three_taps(values_, dtype):
    """A 1-D fold where output pixel 0 receives values_[0], [1], [2] from blocks 0, 1, 2 in
    that order (block 3, pads 2+2: block l covers pixels l-2 .. l)."""
    x = np.zeros((1, 3, 5), dtype=dtype)
    with np.errstate(over="ignore"):  # 1e8 is inf in float16, on purpose
        for l, v in enumerate(values_):
            x[0, 2 - l, l] = v
    return x


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16, BF16], ids=str)
def test_matches_oracle_on_cancellation(dtype):
    for vals in ([1e8, 1.0, -1e8], [1.0, 1e8, -1e8], [2048.0, 1.0, 1.0], [256.0, 1.0, 1.0],
                 [65504.0, 65504.0, -65504.0], [1.0, 16777218.0, 3.0]):
        x = three_taps(vals, dtype)
        assert_same(poolfold.col2im(x, [3], [3], pads=[2, 2]),
                    oracle.col2im(x, [3], [3], pads=[2, 2]))


def test_float32_sums_in_float32():
    """float32 accumulates in float32, in the order block offset outer, block inner (the
    oracle's, onnxruntime's and PyTorch's).  In three_taps, pixel 0 gets v[2] from block
    offset 0, v[1] from offset 1, v[0] from offset 2, so that order is (v[2] + v[1]) + v[0];
    block order would be (v[0] + v[1]) + v[2]."""
    # 2**24 + 2 with 1 and 3: float32 spacing is 2 there, and every inexact sum is a tie
    # (rounded to even).  Each way of adding the three gives a different float32 result:
    #   (3 + 16777218) + 1 = 16777220 + 1 -> 16777220   block offset outer (required)
    #   (1 + 16777218) + 3 = 16777220 + 3 -> 16777224   block outer
    #   (1 + 3) + 16777218                -> 16777222   also the exact sum (float64)
    x = three_taps([1.0, 16777218.0, 3.0], np.float32)
    out = poolfold.col2im(x, [3], [3], pads=[2, 2])
    assert out.dtype == np.float32 and out.shape == (1, 1, 3)
    assert out[0, 0, 0] == np.float32(16777220.0)
    # float64 in float64, same order: the same values scaled by 2**29 (spacing 2 at 2**53)
    out64 = poolfold.col2im(three_taps([1.0, 2.0**53 + 2, 3.0], np.float64), [3], [3],
                            pads=[2, 2])
    assert out64.dtype == np.float64
    assert out64[0, 0, 0] == 2.0**53 + 4  # block outer: 2**53 + 8; exact: 2**53 + 6
    # cancellation: float32 loses the 1 in any order, float64 keeps it
    assert poolfold.col2im(three_taps([1e8, 1.0, -1e8], np.float32), [3], [3],
                           pads=[2, 2])[0, 0, 0] == 0.0
    assert poolfold.col2im(three_taps([1e8, 1.0, -1e8], np.float64), [3], [3],
                           pads=[2, 2])[0, 0, 0] == 1.0


@pytest.mark.parametrize("dtype, big", [(np.float16, 2048.0), (BF16, 256.0)], ids=["f16", "bf16"])
def test_half_types_accumulate_in_float32_and_round_once(dtype, big):
    # in the half type itself big + 1 + 1 would round to big twice; in float32 it is big + 2
    out = poolfold.col2im(three_taps([big, 1.0, 1.0], dtype), [3], [3], pads=[2, 2])
    assert out.dtype == np.dtype(dtype)
    assert float(out[0, 0, 0]) == big + 2


@pytest.mark.parametrize(
    "dtype, vals, expected",
    [(np.int8, [100, 100, 0], -56), (np.uint8, [200, 100, 0], 44),
     (np.int16, [30000, 30000, 0], -5536), (np.uint16, [65535, 2, 0], 1),
     (np.int32, [2**31 - 1, 1, 0], -(2**31)), (np.uint32, [2**32 - 1, 2**32 - 1, 0], 2**32 - 2),
     (np.int64, [2**63 - 1, 2**63 - 1, 2], 0), (np.uint64, [2**64 - 1, 1, 5], 5)],
    ids=lambda v: np.dtype(v).name if isinstance(v, type) else None,
)
def test_integers_wrap(dtype, vals, expected):
    out = poolfold.col2im(three_taps(vals, dtype), [3], [3], pads=[2, 2])
    assert out.dtype == np.dtype(dtype)
    assert int(out[0, 0, 0]) == expected


def test_bool_is_or():
    out = poolfold.col2im(three_taps([True, True, False], np.bool_), [3], [3], pads=[2, 2])
    assert out.dtype == np.bool_
    assert out.reshape(-1).tolist() == [True, False, False]
    ones = np.ones((1, 4, 4), bool)
    assert poolfold.col2im(ones, [3, 3], [2, 2]).all()


def test_complex():
    x = three_taps([1 + 2j, 3 - 1j, 0.5j], np.complex64)
    out = poolfold.col2im(x, [3], [3], pads=[2, 2])
    assert out.dtype == np.complex64
    assert out.reshape(-1).tolist() == [4 + 1.5j, 0, 0]


@pytest.mark.parametrize("kind", ["U", "S", "O"])
def test_strings_concatenate_in_block_order(kind):
    # 1-D image 4, block 2, stride 1: block l covers pixels l, l+1
    cols = [["a", "b", "c"], ["A", "B", "C"]]  # offset 0 / offset 1 of blocks 0, 1, 2
    expected = [["a", "Ab", "Bc", "C"]]
    if kind == "S":
        x = np.array([cols], dtype="S1")
        expected = [[s.encode() for s in expected[0]]]
    elif kind == "U":
        x = np.array([cols], dtype="U1")
    else:
        x = np.empty((1, 2, 3), object)
        x[0] = cols
    out = poolfold.col2im(x, [4], [2])
    assert out.dtype.kind == kind and out.shape == (1, 1, 4)
    assert out[0].tolist() == expected
    # positions no block reaches are empty strings
    out = poolfold.col2im(x[:, :, :2], [5], [2], strides=[3])
    empty = b"" if kind == "S" else ""
    assert out[0, 0, 2] == empty


def test_unreached_positions_are_zero():
    x = np.full((1, 1, 2), 7, np.int32)  # block 1, stride 3 over 4 pixels: 0 and 3
    out = poolfold.col2im(x, [4], [1], strides=[3])
    assert out.tolist() == [[[7, 0, 0, 7]]]


def test_two_d_with_channels_and_batch():
    """N = 2, C = 3: channel outer, block offset inner in dim 1."""
    rng = np.random.default_rng(0)
    x = rng.integers(-50, 50, size=(2, 3 * 4, 9)).astype(np.float64)
    out = poolfold.col2im(x, [4, 4], [2, 2])
    for n in range(2):
        for c in range(3):
            single = poolfold.col2im(x[n:n + 1, 4 * c:4 * c + 4], [4, 4], [2, 2])
            np.testing.assert_array_equal(out[n, c], single[0, 0])
    assert_same(out, oracle.col2im(x, [4, 4], [2, 2]))


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.int8, np.complex128, "U"], ids=str)
def test_larger_fold_matches_oracle(dtype):
    """Enough planes and blocks for the parallel kernels to split the work."""
    rng = np.random.default_rng(3)
    # 10x14 image, 3x3 blocks, strides (1, 2), dilations (2, 1), pads (1, 0, 1, 2): an 8x7 grid
    image, block = [10, 14], [3, 3]
    kwargs = dict(strides=[1, 2], dilations=[2, 1], pads=[1, 0, 1, 2])
    shape = (2, 3 * 9, 8 * 7)
    if dtype == "U":
        x = rng.choice(np.array(["a", "bc", "", "字"]), size=shape)
    elif np.dtype(dtype).kind == "c":
        x = (rng.standard_normal(shape) + 1j * rng.standard_normal(shape)).astype(dtype)
    elif np.dtype(dtype).kind == "i":
        x = rng.integers(-128, 128, size=shape).astype(dtype)
    else:
        x = (rng.standard_normal(shape) * 10.0 ** rng.integers(-3, 4, size=shape)).astype(dtype)
    expected = oracle.col2im(x, image, block, **kwargs)
    assert_same(poolfold.col2im(x, image, block, **kwargs), expected)


@pytest.mark.parametrize("dtype", [np.float32, np.float16, BF16, np.int8, np.uint8, np.bool_,
                                   np.complex64], ids=str)
@pytest.mark.parametrize("image, block, kwargs", [
    ([9, 11], [3, 3], dict(pads=[1, 1, 1, 1])),  # 'same' padding: runs of 10 in rows of 11
    ([7, 12], [2, 5], dict(pads=[0, 1, 1, 3], dilations=[1, 1])),  # uneven pads
    ([5, 6, 9], [2, 3, 3], dict(pads=[0, 1, 1, 1, 1, 1], dilations=[1, 2, 1])),
    ([6, 8], [3, 3], dict(pads=[1, 3, 1, 3])),  # a grid wider than the image
], ids=["same", "uneven", "3d", "wide-pads"])
def test_joined_rows_skip_the_padding_taps(dtype, image, block, kwargs):
    """With stride 1 on the last two axes, the runs of several grid rows are folded as one:
    the taps that fall in the padding between them must leave no trace, even NaN, inf or an
    integer that would wrap."""
    rng = np.random.default_rng(11)
    pads = kwargs["pads"]
    rank = len(image)
    dilations = kwargs.get("dilations", [1] * rank)
    grid = [image[a] + pads[a] + pads[a + rank] - dilations[a] * (block[a] - 1)
            for a in range(rank)]
    shape = (2, 2 * math.prod(block), math.prod(grid))
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        x = rng.random(shape) < 0.3
    elif dtype.kind in "iu":
        x = rng.integers(np.iinfo(dtype).min, np.iinfo(dtype).max, size=shape).astype(dtype)
    else:
        x = rng.standard_normal(shape).astype(dtype)
        special = rng.random(shape)
        x[special < 0.05] = np.nan
        x[(special >= 0.05) & (special < 0.1)] = np.inf
    expected = oracle.col2im(x, image, block, **kwargs)
    assert_same(poolfold.col2im(x, image, block, **kwargs), expected)


@pytest.mark.parametrize("shape", [(0, 4, 4), (1, 0, 4), (0, 0, 4)])
@pytest.mark.parametrize("dtype", [np.float32, np.float16, BF16, np.int8, np.uint64, np.bool_,
                                   np.complex64, "U", "S", "O"], ids=str)
def test_empty_n_or_c(shape, dtype):
    if dtype == "O":
        x = np.empty(shape, object)
    else:
        x = np.zeros(shape, dtype if dtype not in ("U", "S") else dtype + "2")
    out = poolfold.col2im(x, [3, 3], [2, 2])
    assert out.shape == (shape[0], shape[1] // 4, 3, 3)
    assert_same(out, oracle.col2im(x, [3, 3], [2, 2]))


# --------------------------------------------------------------------------------------
# Errors
# --------------------------------------------------------------------------------------

X = np.ones((1, 4, 4), np.float32)  # 2x2 blocks over a 3x3 image: 4 blocks


def test_valid_reference_call():
    assert poolfold.col2im(X, [3, 3], [2, 2]).tolist() == [[[[1, 2, 1], [2, 4, 2], [1, 2, 1]]]]


def check(error_type, words, *args, **kwargs):
    with pytest.raises(error_type) as info:
        poolfold.col2im(*args, **kwargs)
    message = str(info.value)
    assert "Col2Im-18" in message, message
    for word in words:
        assert word in message, (word, message)


@pytest.mark.parametrize("shape", [(4, 4), (1, 1, 4, 4), (4,), (1, 1, 1, 4, 4)])
def test_input_rank_must_be_3(shape):
    check(PoolfoldError, ["input"], np.ones(shape, np.float32), [3, 3], [2, 2])


@pytest.mark.parametrize("dim1", [1, 3, 5, 6, 7])
def test_dim1_multiple_of_block_size(dim1):
    check(PoolfoldError, ["input", "block_shape"], np.ones((1, dim1, 4), np.float32), [3, 3], [2, 2])


@pytest.mark.parametrize("length", [0, 1, 3, 5, 9])
def test_l_must_equal_the_number_of_blocks(length):
    check(PoolfoldError, ["input"], np.ones((1, 4, length), np.float32), [3, 3], [2, 2])


@pytest.mark.parametrize("block", [[2, 0], [0, 2], [-1, 2]])
def test_block_dims_at_least_1(block):
    for value in (block, np.array(block, np.int64)):
        check(PoolfoldError, ["block_shape"], X, [3, 3], value)


@pytest.mark.parametrize("image", [[3, 0], [0, 3], [-2, 3]])
def test_image_dims_at_least_1(image):
    for value in (image, np.array(image, np.int64)):
        check(PoolfoldError, ["image_shape"], X, value, [2, 2])


@pytest.mark.parametrize(
    "image, block, kwargs, word",
    [
        ([3, 3], [2, 2, 1], {}, "block_shape"),
        ([3, 3], [4], {}, "block_shape"),
        ([3, 3], [2, 2], {"strides": [1]}, "strides"),
        ([3, 3], [2, 2], {"strides": [1, 1, 1]}, "strides"),
        ([3, 3], [2, 2], {"dilations": [1]}, "dilations"),
        ([3, 3], [2, 2], {"dilations": [1, 1, 1]}, "dilations"),
        ([3, 3], [2, 2], {"pads": [0, 0]}, "pads"),
        ([3, 3], [2, 2], {"pads": [0, 0, 0, 0, 0]}, "pads"),
        ([], [], {}, "image_shape"),
    ],
)
def test_length_mismatches(image, block, kwargs, word):
    check(PoolfoldError, [word], X, image, block, **kwargs)


@pytest.mark.parametrize(
    "kwargs, word",
    [({"strides": [0, 1]}, "strides"), ({"strides": [1, -1]}, "strides"),
     ({"dilations": [0, 1]}, "dilations"), ({"pads": [0, -1, 0, 0]}, "pads")],
)
def test_attribute_values_out_of_range(kwargs, word):
    check(PoolfoldError, [word], X, [3, 3], [2, 2], **kwargs)


@pytest.mark.parametrize(
    "image, block, kwargs",
    [([3, 3], [4, 1], {}), ([3, 3], [1, 4], {}), ([3, 3], [2, 2], {"dilations": [3, 1]}),
     ([1], [2], {}), ([2, 2], [2, 2], {"dilations": [2, 2]})],
)
def test_no_block_fits(image, block, kwargs):
    k = math.prod(block)
    check(PoolfoldError, ["block_shape"], np.ones((1, k, 1), np.float32), image, block, **kwargs)


@pytest.mark.parametrize(
    "image, block, kwargs, word",
    [
        ([3, 3.0], [2, 2], {}, "image_shape"),
        (np.array([3.0, 3.0]), [2, 2], {}, "image_shape"),
        ([3, 3], [2, "2"], {}, "block_shape"),
        ([3, 3], np.array([2.0, 2.0]), {}, "block_shape"),
        ([3, 3], [2, None], {}, "block_shape"),
        ([3, 3], [2, 2], {"strides": [1.5, 1]}, "strides"),
        ([3, 3], [2, 2], {"pads": [0, 0, 0, 0.0]}, "pads"),
        ([3, 3], [2, 2], {"dilations": [1, "1"]}, "dilations"),
        (3, [2], {}, "image_shape"),
    ],
)
def test_non_integer_values_are_type_errors(image, block, kwargs, word):
    check(PoolfoldTypeError, [word], X, image, block, **kwargs)


def test_shape_inputs_must_be_1d():
    check(PoolfoldError, ["image_shape"], X, np.array([[3, 3]], np.int64), [2, 2])
    check(PoolfoldError, ["block_shape"], X, [3, 3], np.array([[2, 2]], np.int64))


def test_int64_shape_inputs_reuse_their_launch():
    """image_shape and block_shape as the int64 tensors a model holds: a call with the same
    values reuses the kept launch (``_LAUNCHES``), other values get their own, and arrays the
    checks refuse (int32, 2-D) are refused on every call, never served a launch."""
    from poolfold.ops import col2im as module

    x = np.arange(36, dtype=np.float32).reshape(1, 4, 9)
    module._LAUNCHES.clear()
    first = poolfold.col2im(x, np.array([4, 4], np.int64), np.array([2, 2], np.int64))
    assert len(module._LAUNCHES) == 1
    launch = next(iter(module._LAUNCHES.values()))
    again = poolfold.col2im(x, np.array([4, 4], np.int64), np.array([2, 2], np.int64))
    assert len(module._LAUNCHES) == 1 and next(iter(module._LAUNCHES.values())) is launch
    np.testing.assert_array_equal(first, again)
    np.testing.assert_array_equal(first, oracle.col2im(x, [4, 4], [2, 2]))
    # the same values as lists: a key of their own (the checks treat lists otherwise)
    np.testing.assert_array_equal(poolfold.col2im(x, [4, 4], [2, 2]), first)
    assert len(module._LAUNCHES) == 2
    wider = poolfold.col2im(x, np.array([4, 6], np.int64), np.array([2, 2], np.int64),
                            strides=[1, 2])
    np.testing.assert_array_equal(wider, oracle.col2im(x, [4, 6], [2, 2], strides=[1, 2]))
    assert len(module._LAUNCHES) == 3
    for _ in range(2):
        with pytest.raises(PoolfoldTypeError, match="image_shape"):
            poolfold.col2im(x, np.array([4, 4], np.int32), np.array([2, 2], np.int64))
        with pytest.raises(PoolfoldError, match="block_shape"):
            poolfold.col2im(x, np.array([4, 4], np.int64), np.array([[2, 2]], np.int64))
    assert len(module._LAUNCHES) == 3


@pytest.mark.parametrize("opset", [1, 11, 17])
def test_opset_before_18_is_an_error(opset):
    with pytest.raises(PoolfoldError, match="Col2Im"):
        poolfold.col2im(X, [3, 3], [2, 2], opset=opset)


def test_object_array_must_hold_str():
    x = np.empty((1, 4, 4), object)
    x[...] = "a"
    x[0, 1, 2] = 5
    with pytest.raises(PoolfoldTypeError, match="Col2Im-18"):
        poolfold.col2im(x, [3, 3], [2, 2])


@pytest.mark.parametrize("dtype", ["M8[s]", "m8[s]", np.longdouble], ids=str)
def test_unsupported_type(dtype):
    if np.dtype(dtype) == np.float64:
        pytest.skip("longdouble is float64 here")
    check(PoolfoldTypeError, ["input"], np.zeros((1, 4, 4), dtype), [3, 3], [2, 2])


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.int64, "U"], ids=str)
@pytest.mark.parametrize("image", [[2**40], [2**40, 2**40], [2**39, 7]], ids=str)
def test_huge_image_is_refused_quickly(image, dtype):
    """One block, a stride as large as the image: a tiny input asking for a huge output."""
    x = np.ones((1, 1, 1), dtype if dtype != "U" else "U1")
    assert_refused_quickly(
        lambda: poolfold.col2im(x, image, [1] * len(image), strides=image), "Col2Im-18")


@pytest.mark.parametrize("dtype", [">f4", ">i4", ">f8", ">c8", ">u2"])
def test_non_native_byte_order(dtype):
    """A big-endian float32 is still a float32 tensor: poolfold must fold it like the native
    one or refuse it with its own error, never crash inside numba."""
    x = np.arange(16).reshape(1, 4, 4).astype(dtype)
    try:
        got = poolfold.col2im(x, [3, 3], [2, 2])
    except (PoolfoldError, PoolfoldTypeError) as error:
        assert "Col2Im-18" in str(error)
    else:
        native = x.astype(np.dtype(dtype).newbyteorder("="))
        np.testing.assert_array_equal(got, poolfold.col2im(native, [3, 3], [2, 2]))
