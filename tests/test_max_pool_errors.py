"""Every invalid MaxPool call raises the right poolfold error, with a message that names the op,
its version (``MaxPool-<v>``) and the attribute or input at fault.

PoolfoldError (a ValueError) for bad values and shapes, PoolfoldTypeError (a TypeError) for a
tensor type the version lacks or a non-integer where integers belong.
"""

from __future__ import annotations

import re

import ml_dtypes
import numpy as np
import pytest

import poolfold
from refusal import assert_refused_quickly
from poolfold import PoolfoldError, PoolfoldTypeError

X2D = np.arange(2 * 3 * 5 * 6, dtype=np.float32).reshape(2, 3, 5, 6)
X1D = np.arange(8, dtype=np.float32).reshape(1, 1, 8)


def test_error_types_subclass_the_builtins():
    assert issubclass(PoolfoldError, ValueError)
    assert issubclass(PoolfoldTypeError, TypeError)
    assert not issubclass(PoolfoldError, TypeError)
    assert not issubclass(PoolfoldTypeError, ValueError)


def raises(cls, label, *words):
    """pytest.raises for ``cls`` whose message names ``label`` (e.g. MaxPool-12) and each of
    ``words`` (regexes), in any order."""
    assert cls in (PoolfoldError, PoolfoldTypeError)

    class _Check:
        def __enter__(self):
            self._ctx = pytest.raises(cls, match=rf"(?s)\b{re.escape(label)}\b")
            self._info = self._ctx.__enter__()
            return self._info

        def __exit__(self, *exc):
            result = self._ctx.__exit__(*exc)  # fails when nothing was raised
            if not result:  # another exception type: let it propagate as the failure
                return result
            message = str(self._info.value)
            base = ValueError if cls is PoolfoldError else TypeError
            assert isinstance(self._info.value, base)
            assert type(self._info.value) is cls, type(self._info.value)
            for word in words:
                assert re.search(word, message), f"{word!r} not in {message!r}"
            return result

    return _Check()


# --------------------------------------------------------------------------------------------
# attribute values and sizes
# --------------------------------------------------------------------------------------------

LABELS = [(None, "MaxPool-22"), (22, "MaxPool-22"), (21, "MaxPool-12"), (12, "MaxPool-12"),
          (11, "MaxPool-11"), (10, "MaxPool-10"), (9, "MaxPool-8"), (8, "MaxPool-8"),
          (7, "MaxPool-1"), (1, "MaxPool-1")]


@pytest.mark.parametrize("opset, label", LABELS)
@pytest.mark.parametrize(
    "pads", [[-1, 0, 0, 0], [0, 0, 0, -2], [-1, -1, -1, -1]], ids=["begin", "end", "all"]
)
def test_negative_pads(opset, label, pads):
    with raises(PoolfoldError, label, "'pads'", ">= 0"):
        poolfold.max_pool(X2D, [2, 2], pads=pads, opset=opset)
    with raises(PoolfoldError, label, "'pads'"):
        poolfold.max_pool_shape(X2D.shape, [2, 2], pads=pads, opset=opset)


SIZED = [
    ("pads", [1, 1], 4),
    ("pads", [1, 1, 1], 4),
    ("pads", [0] * 6, 4),
    ("pads", [], 4),
    ("strides", [1], 2),
    ("strides", [1, 1, 1], 2),
    ("strides", [], 2),
    ("dilations", [1], 2),
    ("dilations", [1, 1, 1], 2),
]


@pytest.mark.parametrize(
    "opset, label, attribute, value, count",
    [(o, lab, *s) for o, lab in LABELS for s in SIZED
     # dilations do not exist before MaxPool-10 (test_attributes_before_maxpool_10)
     if not (s[0] == "dilations" and o is not None and o < 10)],
)
def test_wrongly_sized_lists(opset, label, attribute, value, count):
    with raises(PoolfoldError, label, f"'{attribute}'", rf"\b{count}\b"):
        poolfold.max_pool(X2D, [2, 2], opset=opset, **{attribute: value})
    with raises(PoolfoldError, label, f"'{attribute}'"):
        poolfold.max_pool_shape(X2D.shape, [2, 2], opset=opset, **{attribute: value})


@pytest.mark.parametrize("opset, label", LABELS)
@pytest.mark.parametrize("kernel", [[2], [2, 2, 2], [], [1, 1, 1, 1]])
def test_kernel_rank_mismatch(opset, label, kernel):
    with raises(PoolfoldError, label, "'kernel_shape'", r"\b2\b"):
        poolfold.max_pool(X2D, kernel, opset=opset)
    with raises(PoolfoldError, label, "'kernel_shape'"):
        poolfold.max_pool_shape(X2D.shape, kernel, opset=opset)


@pytest.mark.parametrize("opset, label", LABELS)
@pytest.mark.parametrize("kernel", [[0, 2], [2, 0], [-1, 2]])
def test_zero_or_negative_kernel(opset, label, kernel):
    with raises(PoolfoldError, label, "'kernel_shape'", ">= 1"):
        poolfold.max_pool(X2D, kernel, opset=opset)


@pytest.mark.parametrize("opset, label", LABELS)
@pytest.mark.parametrize("strides", [[0, 1], [1, 0], [-1, 1]])
def test_zero_or_negative_strides(opset, label, strides):
    with raises(PoolfoldError, label, "'strides'", ">= 1"):
        poolfold.max_pool(X2D, [2, 2], strides=strides, opset=opset)


@pytest.mark.parametrize("opset, label", [(None, "MaxPool-22"), (12, "MaxPool-12"),
                                          (11, "MaxPool-11"), (10, "MaxPool-10")])
@pytest.mark.parametrize("dilations", [[0, 1], [1, 0], [-2, 1]])
def test_zero_or_negative_dilations(opset, label, dilations):
    with raises(PoolfoldError, label, "'dilations'", ">= 1"):
        poolfold.max_pool(X2D, [2, 2], dilations=dilations, opset=opset)


def test_kernel_shape_is_required_and_a_sequence():
    for kernel in (None, 2, "22", b"\x02\x02", 2.0):
        with raises(PoolfoldTypeError, "MaxPool-22", "'kernel_shape'"):
            poolfold.max_pool(X2D, kernel)


@pytest.mark.parametrize("attribute", ["kernel_shape", "strides", "pads", "dilations"])
@pytest.mark.parametrize("bad", [1.0, 2.5, "1", None, np.float32(1), True, 1 + 0j, b"1"],
                         ids=repr)
def test_non_integer_list_values(attribute, bad):
    good = {"kernel_shape": [2, 2], "strides": [1, 1], "pads": [0, 0, 0, 0],
            "dilations": [1, 1]}
    value = list(good[attribute])
    value[-1] = bad
    kwargs = {k: v for k, v in good.items() if k != "kernel_shape"}
    kwargs[attribute if attribute != "kernel_shape" else "_"] = value
    kernel = kwargs.pop("_", good["kernel_shape"])
    with raises(PoolfoldTypeError, "MaxPool-12", f"'{attribute}'", "integer"):
        poolfold.max_pool(X2D, kernel, opset=12, **kwargs)
    with raises(PoolfoldTypeError, "MaxPool-12", f"'{attribute}'"):
        poolfold.max_pool_shape(X2D.shape, kernel, opset=12, **kwargs)


def test_float_array_attributes_are_type_errors():
    with raises(PoolfoldTypeError, "MaxPool-22", "'strides'"):
        poolfold.max_pool(X2D, [2, 2], strides=np.array([1.0, 1.0]))
    with raises(PoolfoldTypeError, "MaxPool-22", "'kernel_shape'"):
        poolfold.max_pool(X2D, np.array([2.0, 2.0]))


@pytest.mark.parametrize("value", [1.5, "SAME_UPPER"], ids=repr)
def test_non_sequence_attributes(value):
    for attribute in ("strides", "pads", "dilations"):
        with raises(PoolfoldTypeError, "MaxPool-22", f"'{attribute}'"):
            poolfold.max_pool(X2D, [2, 2], **{attribute: value})


@pytest.mark.parametrize("attribute, default", [("strides", [1, 1]), ("pads", [0, 0, 0, 0]),
                                                ("dilations", [1, 1])])
def test_none_attribute_means_the_default(attribute, default):
    """None is not an error for these: it means the default (strides 1, pads 0, dilations 1)."""
    y, i = poolfold.max_pool(X2D, [2, 2], return_indices=True, **{attribute: None})
    # X2D increases along every axis: each 2x2 window's maximum is its last (bottom-right) tap
    want_y = X2D[:, :, 1:, 1:]
    want_i = np.arange(X2D.size, dtype=np.int64).reshape(X2D.shape)[:, :, 1:, 1:]
    assert y.dtype == X2D.dtype and y.shape == want_y.shape
    assert np.array_equal(y, want_y)
    assert i.dtype == np.int64 and np.array_equal(i, want_i)
    y2, i2 = poolfold.max_pool(X2D, [2, 2], return_indices=True, **{attribute: default})
    assert np.array_equal(y2, y) and np.array_equal(i2, i)
    assert poolfold.max_pool_shape(X2D.shape, [2, 2], **{attribute: None}) == want_y.shape


@pytest.mark.parametrize("opset, label", [(None, "MaxPool-22"), (8, "MaxPool-8"),
                                          (10, "MaxPool-10")])
@pytest.mark.parametrize("value", [2, -1, 3])
def test_storage_order_out_of_range(opset, label, value):
    with raises(PoolfoldError, label, "'storage_order'"):
        poolfold.max_pool(X2D, [2, 2], storage_order=value, opset=opset)


@pytest.mark.parametrize("value", [1.0, "1", [1], None], ids=repr)
def test_storage_order_non_integer(value):
    with raises(PoolfoldTypeError, "MaxPool-22", "'storage_order'"):
        poolfold.max_pool(X2D, [2, 2], storage_order=value)


@pytest.mark.parametrize("value", [2, -1])
def test_ceil_mode_out_of_range(value):
    with raises(PoolfoldError, "MaxPool-22", "'ceil_mode'"):
        poolfold.max_pool(X2D, [2, 2], ceil_mode=value)
    with raises(PoolfoldError, "MaxPool-22", "'ceil_mode'"):
        poolfold.max_pool_shape(X2D.shape, [2, 2], ceil_mode=value)


@pytest.mark.parametrize("value", [1.0, "1", None], ids=repr)
def test_ceil_mode_non_integer(value):
    with raises(PoolfoldTypeError, "MaxPool-22", "'ceil_mode'"):
        poolfold.max_pool(X2D, [2, 2], ceil_mode=value)


def test_return_indices_must_be_a_bool():
    with pytest.raises(PoolfoldTypeError, match="MaxPool-22.*return_indices"):
        poolfold.max_pool(X2D, [2, 2], return_indices="yes")


# --------------------------------------------------------------------------------------------
# auto_pad
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("opset, label", LABELS)
@pytest.mark.parametrize("auto_pad", ["same_upper", "SAME", "", "EXPLICIT", "VALID "])
def test_unknown_auto_pad(opset, label, auto_pad):
    with raises(PoolfoldError, label, "'auto_pad'"):
        poolfold.max_pool(X2D, [2, 2], auto_pad=auto_pad, opset=opset)
    with raises(PoolfoldError, label, "'auto_pad'"):
        poolfold.max_pool_shape(X2D.shape, [2, 2], auto_pad=auto_pad, opset=opset)


@pytest.mark.parametrize("auto_pad", [None, 1, b"VALID", ["VALID"], ("SAME_UPPER",),
                                      {"VALID"}], ids=repr)
def test_non_string_auto_pad(auto_pad):
    with raises(PoolfoldTypeError, "MaxPool-22", "'auto_pad'"):
        poolfold.max_pool(X2D, [2, 2], auto_pad=auto_pad)
    with raises(PoolfoldTypeError, "MaxPool-22", "'auto_pad'"):
        poolfold.max_pool_shape(X2D.shape, [2, 2], auto_pad=auto_pad)


@pytest.mark.parametrize("opset, label", LABELS)
@pytest.mark.parametrize("auto_pad", ["SAME_UPPER", "SAME_LOWER", "VALID"])
@pytest.mark.parametrize("pads", [[1, 0, 0, 0], [0, 0, 0, 1], [1, 1, 1, 1]])
def test_nonzero_pads_with_auto_pad(opset, label, auto_pad, pads):
    with raises(PoolfoldError, label, "'pads'", auto_pad):
        poolfold.max_pool(X2D, [2, 2], pads=pads, auto_pad=auto_pad, opset=opset)
    with raises(PoolfoldError, label, "'pads'"):
        poolfold.max_pool_shape(X2D.shape, [2, 2], pads=pads, auto_pad=auto_pad, opset=opset)


@pytest.mark.parametrize("auto_pad", ["SAME_UPPER", "SAME_LOWER", "VALID"])
def test_zero_pads_with_auto_pad_are_allowed(auto_pad):
    a = poolfold.max_pool(X2D, [2, 2], pads=[0, 0, 0, 0], auto_pad=auto_pad)
    b = poolfold.max_pool(X2D, [2, 2], auto_pad=auto_pad)
    assert np.array_equal(a, b)


# --------------------------------------------------------------------------------------------
# the input
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("opset, label", LABELS)
@pytest.mark.parametrize("shape", [(), (4,), (2, 4), (1, 0)])
def test_input_rank_below_3(opset, label, shape):
    x = np.zeros(shape, np.float32)
    with raises(PoolfoldError, label, "'X'", "rank"):
        poolfold.max_pool(x, [1], opset=opset)
    with raises(PoolfoldError, label, "'X'", "rank"):
        poolfold.max_pool_shape(shape, [1], opset=opset)


@pytest.mark.parametrize(
    "dtype, opset, label",
    [
        (np.int8, 11, "MaxPool-11"),
        (np.uint8, 11, "MaxPool-11"),
        (np.int8, 10, "MaxPool-10"),
        (np.uint8, 9, "MaxPool-8"),
        (np.int8, 1, "MaxPool-1"),
        (ml_dtypes.bfloat16, 12, "MaxPool-12"),
        (ml_dtypes.bfloat16, 21, "MaxPool-12"),
        (ml_dtypes.bfloat16, 11, "MaxPool-11"),
        (ml_dtypes.bfloat16, 1, "MaxPool-1"),
    ],
)
def test_dtype_the_version_lacks(dtype, opset, label):
    x = np.zeros((1, 1, 4, 4), dtype)
    name = np.dtype(dtype).name
    with raises(PoolfoldTypeError, label, "'X'", name):
        poolfold.max_pool(x, [2, 2], opset=opset)


@pytest.mark.parametrize("opset, label", LABELS)
@pytest.mark.parametrize(
    "dtype",
    [np.int32, np.int64, np.int16, np.uint16, np.uint32, np.bool_, np.complex64,
     np.longdouble, object, np.str_, "datetime64[s]", ml_dtypes.float8_e4m3fn],
    ids=lambda t: np.dtype(t).name,
)
def test_dtype_never_accepted(opset, label, dtype):
    x = np.zeros((1, 1, 4, 4), dtype)
    if np.dtype(dtype) == np.longdouble and np.dtype(np.longdouble) == np.float64:
        pytest.skip("longdouble is float64 here")
    with raises(PoolfoldTypeError, label, "'X'"):
        poolfold.max_pool(x, [2, 2], opset=opset)


def test_ragged_input_is_an_error():
    with pytest.raises((PoolfoldError, PoolfoldTypeError), match="MaxPool-22.*'X'"):
        poolfold.max_pool([[[1.0, 2.0], [3.0]]], [1])


@pytest.mark.parametrize("opset", [0, -1])
def test_opset_before_the_op(opset):
    with pytest.raises(PoolfoldError, match="MaxPool.*opset"):
        poolfold.max_pool(X2D, [2, 2], opset=opset)


@pytest.mark.parametrize("opset", ["12", 12.0, True])
def test_opset_not_an_integer(opset):
    with pytest.raises(PoolfoldTypeError, match="MaxPool.*opset"):
        poolfold.max_pool(X2D, [2, 2], opset=opset)


# --------------------------------------------------------------------------------------------
# attributes a version lacks
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("opset, label", [(8, "MaxPool-8"), (9, "MaxPool-8"), (1, "MaxPool-1"),
                                          (7, "MaxPool-1")])
@pytest.mark.parametrize(
    "kwargs, attribute",
    [
        (dict(dilations=[1, 1]), "dilations"),  # even the default value counts as given
        (dict(dilations=[2, 2]), "dilations"),
        (dict(ceil_mode=True), "ceil_mode"),
        (dict(ceil_mode=1), "ceil_mode"),
    ],
)
def test_attributes_before_maxpool_10(opset, label, kwargs, attribute):
    with raises(PoolfoldError, label, f"'{attribute}'", "MaxPool-10"):
        poolfold.max_pool(X2D, [2, 2], opset=opset, **kwargs)
    with raises(PoolfoldError, label, f"'{attribute}'"):
        poolfold.max_pool_shape(X2D.shape, [2, 2], opset=opset, **kwargs)


@pytest.mark.parametrize("opset", [8, 9])
def test_defaults_of_later_attributes_are_fine_at_maxpool_8(opset):
    a = poolfold.max_pool(X2D, [2, 2], opset=opset, dilations=None, ceil_mode=False)
    b = poolfold.max_pool(X2D, [2, 2], opset=opset, ceil_mode=0)
    assert np.array_equal(a, b)


@pytest.mark.parametrize("opset", [1, 2, 7])
def test_storage_order_at_maxpool_1(opset):
    with raises(PoolfoldError, "MaxPool-1", "'storage_order'", "MaxPool-8"):
        poolfold.max_pool(X2D, [2, 2], storage_order=1, opset=opset)
    poolfold.max_pool(X2D, [2, 2], storage_order=0, opset=opset)  # the default is fine


@pytest.mark.parametrize("opset", [1, 2, 7])
def test_indices_at_maxpool_1(opset):
    with raises(PoolfoldError, "MaxPool-1", "'Indices'", "MaxPool-8"):
        poolfold.max_pool(X2D, [2, 2], return_indices=True, opset=opset)


# --------------------------------------------------------------------------------------------
# no window fits
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "shape, kernel, kwargs",
    [
        ((1, 1, 3), [4], {}),  # floor mode
        ((1, 1, 3), [4], dict(strides=[2])),
        ((1, 1, 3), [5], dict(pads=[1, 0])),
        ((1, 1, 3), [2], dict(dilations=[3])),  # dilated extent 4 > 3
        ((1, 1, 5, 5), [3, 6], dict(strides=[1, 1])),  # second axis only
        ((1, 1, 3), [5], dict(strides=[2], ceil_mode=True)),  # ceil: ceil(-2/2)+1 = 0
        ((1, 1, 3), [4], dict(auto_pad="VALID")),  # VALID with kernel > input
        ((1, 1, 4, 3), [2, 4], dict(auto_pad="VALID", ceil_mode=True)),
        ((1, 1, 2, 2, 2, 2), [1, 1, 1, 3], {}),
        ((0, 1, 3), [4], {}),  # even with an empty batch
    ],
)
def test_no_window_fits(shape, kernel, kwargs):
    x = np.zeros(shape, np.float32)
    with raises(PoolfoldError, "MaxPool-22", "no window fits", "'kernel_shape'"):
        poolfold.max_pool(x, kernel, **kwargs)
    with raises(PoolfoldError, "MaxPool-22", "no window fits"):
        poolfold.max_pool_shape(shape, kernel, **kwargs)


def test_no_window_fits_names_the_version():
    x = np.zeros((1, 1, 3), np.float32)
    for opset, label in LABELS:
        with raises(PoolfoldError, label, "no window fits"):
            poolfold.max_pool(x, [4], opset=opset)


# --------------------------------------------------------------------------------------------
# max_pool_shape's input_shape
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "shape",
    [(1, 1, -1), (1, 1, -4), (-2, 1, 4), (1, -3, 4), (1, 1, 4, -4)],
)
def test_max_pool_shape_negative_dims(shape):
    """A negative dimension is no tensor shape: an error, never an output shape."""
    with raises(PoolfoldError, "MaxPool-22", "'X'"):
        poolfold.max_pool_shape(shape, [1] * (len(shape) - 2),
                                pads=[0] * (len(shape) - 2) + [5] * (len(shape) - 2))


@pytest.mark.parametrize("shape", [(1, 1, 5.7), (1, 1, "5"), (1.0, 1, 5), (1, 1, None)],
                         ids=repr)
def test_max_pool_shape_non_integer_dims(shape):
    with raises(PoolfoldTypeError, "MaxPool-22", "'X'"):
        poolfold.max_pool_shape(shape, [1])


# --------------------------------------------------------------------------------------------
# sizes: refused before any work, never a crash
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "shape, kernel, kwargs",
    [
        ((1, 1, 1), [1], dict(pads=[2**39, 2**39])),
        ((1, 1, 1, 1), [1, 1], dict(pads=[2**30, 2**30, 2**30, 2**30])),
        ((2, 3, 1, 1, 1), [1, 1, 1], dict(pads=[2**20] * 6)),
        ((1, 1, 1), [1], dict(pads=[2**40, 2**40])),
    ],
)
def test_huge_output_is_refused_quickly_without_allocating(shape, kernel, kwargs):
    x = np.ones(shape, np.float32)
    assert_refused_quickly(
        lambda: poolfold.max_pool(x, kernel, return_indices=True, **kwargs),
        "MaxPool-22", "'Y'", seconds=2.0)
    # the shape itself is computable, without data
    out = poolfold.max_pool_shape(shape, kernel, **kwargs)
    assert len(out) == len(shape) and all(v > 2**19 for v in out[2:])


def test_attribute_values_beyond_the_limit_are_refused():
    for kwargs in (dict(pads=[2**62, 0]), dict(strides=[2**63]), dict(dilations=[2**64])):
        with pytest.raises(PoolfoldError, match="MaxPool-22.*'(pads|strides|dilations)'"):
            poolfold.max_pool(X1D, [1], **kwargs)
    with pytest.raises(PoolfoldError, match="MaxPool-22.*'kernel_shape'"):
        poolfold.max_pool(X1D, [2**62])


_HUGE_KERNEL_CHILD = r"""
import os, threading
import numpy as np
import poolfold

RANK, K = {rank}, {k}
x = np.full((1, 1) + (1,) * RANK, 7.0, np.float32)
poolfold.max_pool(x, [3] * RANK, pads=[2] * RANK + [0] * RANK, return_indices=True)  # compile
poolfold.max_pool(x, [3] * RANK, pads=[2] * RANK + [0] * RANK)
print("READY", flush=True)
threading.Timer({deadline}, lambda: (print("TIMEOUT", flush=True), os._exit(3))).start()
try:
    y, i = poolfold.max_pool(x, [K] * RANK, pads=[K - 1] * RANK + [0] * RANK,
                             return_indices=True)
    print("RESULT", y.reshape(-1).tolist(), i.reshape(-1).tolist(), y.shape, flush=True)
except BaseException as error:
    print("ERROR", type(error).__module__, type(error).__name__, str(error)[:300], flush=True)
os._exit(0)
"""


@pytest.mark.parametrize("rank, k", [(1, 2**40), (2, 2**20), (3, 2**13)])
def test_huge_kernel_with_a_tiny_output_is_computed_or_refused_cleanly(rank, k):
    """A kernel of up to 2**40 taps (each value within poolfold's own attribute limit) on a
    one-element input, with pads such that exactly one window exists and its only in-bounds
    tap is element 0.  The output has one element and the answer is x itself (index 0).
    Either that, promptly, or a PoolfoldError naming 'kernel_shape' -- never a MemoryError
    from inside the kernel, never a loop over 2**40 taps of padding.  Run in a child process
    with a deadline, since the failure mode may be a hang."""
    import subprocess
    import sys

    deadline = 10.0
    script = _HUGE_KERNEL_CHILD.format(rank=rank, k=k, deadline=deadline)
    child = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                           timeout=600)
    out = child.stdout
    assert "READY" in out, (out, child.stderr[-2000:])
    assert "TIMEOUT" not in out, (
        f"max_pool(x of shape {(1, 1) + (1,) * rank}, kernel_shape={[k] * rank}, "
        f"pads={[k - 1] * rank + [0] * rank}) did not finish within {deadline} s "
        "(one output element)")
    if "ERROR" in out:
        line = out[out.index("ERROR"):]
        assert "PoolfoldError" in line and "MaxPool-22" in line and "'kernel_shape'" in line, line
    else:
        assert f"RESULT [7.0] [0] {(1, 1) + (1,) * rank}" in out, out
