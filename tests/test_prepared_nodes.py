"""A node's prepared launches (poolfold.nodes): checks run once per kind of input, and every
call, kept or not, gives the oracle's values and the functional API's errors."""

import numba
import numpy as np
import pytest

from poolfold import nodes, schema
from poolfold.errors import PoolfoldError

import oracle

RNG = np.random.default_rng(2026)


def _bind(op_type, attributes, outputs, opset, inferred_shape_indices=False, inputs=1):
    return nodes.bind(schema.AI_ONNX, op_type, opset, attributes, outputs,
                      inferred_shape_indices, input_count=inputs)


def _kept(node) -> int:
    return len(node._launches)


def test_max_pool_node_alternating_shapes_and_types():
    node = _bind("MaxPool", {"kernel_shape": [2, 2], "strides": [2, 2], "pads": [0, 0, 1, 1]},
                 ["Y", "I"], 12)
    cases = [RNG.standard_normal((1, 3, 9, 8)).astype(np.float32),
             RNG.standard_normal((2, 2, 6, 7)).astype(np.float32),
             RNG.integers(-100, 100, (1, 3, 9, 8)).astype(np.int8)]
    for _ in range(3):  # the first round prepares, the next ones run kept launches
        for x in cases:
            y, indices = node([x])
            want_y, want_i = oracle.max_pool(x, [2, 2], strides=[2, 2], pads=[0, 0, 1, 1])
            np.testing.assert_array_equal(y, want_y)
            np.testing.assert_array_equal(indices, want_i)
            assert y.dtype == x.dtype
    assert _kept(node) == len(cases)


def test_max_pool_node_converted_inputs_are_checked_every_call():
    """Input the checks had to convert (byte-swapped, a list) is never kept under a key."""
    node = _bind("MaxPool", {"kernel_shape": [3]}, ["Y"], 22)
    native = RNG.standard_normal((1, 2, 10)).astype(np.float32)
    swapped = native.astype(">f4")
    for x in (swapped, native.tolist(), swapped):
        (y,) = node([x])
        np.testing.assert_array_equal(y, oracle.max_pool(native, [3])[0])
    assert _kept(node) == 0
    node([native])
    assert _kept(node) == 1
    (y,) = node([swapped])  # same shape, another byte order: its own key, checked afresh
    np.testing.assert_array_equal(y, oracle.max_pool(native, [3])[0])
    assert _kept(node) == 1


def test_max_pool_node_refuses_a_type_after_a_kept_one():
    node = _bind("MaxPool", {"kernel_shape": [2]}, ["Y"], 8)
    node([np.zeros((1, 1, 4), np.float32)])
    with pytest.raises(TypeError, match="MaxPool-8"):
        node([np.zeros((1, 1, 4), np.int8)])  # int8 arrives with MaxPool-12


def test_max_unpool_node_checks_index_range_on_kept_launches():
    node = _bind("MaxUnpool", {"kernel_shape": [2, 2], "strides": [2, 2]}, ["Y"], 11, inputs=3)
    x = RNG.standard_normal((1, 2, 2, 2)).astype(np.float32)
    _, indices = oracle.max_pool(RNG.standard_normal((1, 2, 4, 4)).astype(np.float32), [2, 2],
                                 strides=[2, 2])
    shape = np.array([1, 2, 4, 4], np.int64)
    (y,) = node([x, indices, shape])
    np.testing.assert_array_equal(y, oracle.max_unpool(x, indices, [2, 2], strides=[2, 2],
                                                       output_shape=shape))
    assert _kept(node) == 1
    bad = indices.copy()
    bad[0, 1, 1, 1] = 32  # one past the output
    with pytest.raises(PoolfoldError, match=r"MaxUnpool-11: input 'I' holds index 32"):
        node([x, bad, shape])
    crossing = indices.copy()
    crossing[0, 0, 0, 0] = 20  # inside the output, in the other plane: allowed, in order
    (y,) = node([x, crossing, shape])
    np.testing.assert_array_equal(y, oracle.max_unpool(x, crossing, [2, 2], strides=[2, 2],
                                                       output_shape=shape))


def test_max_unpool_node_output_shape_values_key_the_launch():
    node = _bind("MaxUnpool", {"kernel_shape": [2], "strides": [2]}, ["Y"], 22, inputs=3)
    x = np.array([[[1.0, 2.0]]], np.float32)
    indices = np.array([[[1, 2]]], np.int64)
    for length in (4, 5, 4, 3):
        shape = np.array([1, 1, length], np.int64)
        (y,) = node([x, indices, shape])
        assert y.shape == (1, 1, length)
        np.testing.assert_array_equal(y, oracle.max_unpool(x, indices, [2], strides=[2],
                                                           output_shape=shape))
    with pytest.raises(PoolfoldError, match="outside the valid range"):
        node([x, indices, np.array([1, 1, 2], np.int64)])
    with pytest.raises(TypeError, match="output_shape"):
        node([x, indices, np.array([1, 1, 4], np.int32)])


def test_max_unpool_node_inferred_indices_follow_each_call():
    """With inferred_shape_indices, I is rewritten from its values every call."""
    node = _bind("MaxUnpool", {"kernel_shape": [2], "strides": [2]}, ["Y"], 11,
                 inferred_shape_indices=True, inputs=3)
    x = np.array([[[1.0, 2.0]]], np.float32)
    shape = np.array([1, 1, 6], np.int64)
    for positions in ([0, 3], [1, 2], [0, 3]):
        (y,) = node([x, np.array([[positions]], np.int64), shape])
        want = np.zeros((1, 1, 6), np.float32)
        want[0, 0, positions] = x[0, 0]
        np.testing.assert_array_equal(y, want)
    assert _kept(node) == 0


def test_col2im_node_image_shape_values_key_the_launch():
    node = _bind("Col2Im", {"pads": [0, 1, 0, 1]}, ["Y"], 18, inputs=3)
    block = np.array([1, 2], np.int64)
    x = RNG.standard_normal((1, 2, 6)).astype(np.float32)
    for image in ([2, 2], [1, 5], [2, 2], [3, 1]):  # 6 blocks: 2x3, 1x6, 2x3, 3x2
        image = np.array(image, np.int64)
        (y,) = node([x, image, block])
        np.testing.assert_allclose(y, oracle.col2im(x, image, block, pads=[0, 1, 0, 1]), rtol=0,
                                   atol=0)
    with pytest.raises(PoolfoldError, match="must equal the number of blocks"):
        node([x, np.array([4, 4], np.int64), block])


def test_col2im_node_strings_checked_every_call():
    node = _bind("Col2Im", {}, ["Y"], 18, inputs=3)
    image, block = np.array([1, 3], np.int64), np.array([1, 2], np.int64)
    x = np.array([[["a", "b"], ["c", "d"]]], dtype=object)
    for _ in range(2):
        (y,) = node([x, image, block])
        assert y.tolist() == [[[["a", "cb", "d"]]]]  # block 0 is columns' first: "c" then "b"
        assert y.tolist() == oracle.col2im(x, image, block).tolist()
    with pytest.raises(TypeError, match="object array holding int"):
        node([np.array([[["a", 1], ["c", "d"]]], dtype=object), image, block])


def test_kept_launches_follow_the_thread_count(monkeypatch):
    node = _bind("MaxPool", {"kernel_shape": [2, 2], "strides": [2, 2]}, ["Y"], 22)
    x = RNG.standard_normal((4, 8, 64, 64)).astype(np.float32)
    want = oracle.max_pool(x, [2, 2], strides=[2, 2])[0]
    for threads in ("1", "2", "1"):
        monkeypatch.setenv("POOLFOLD_NUM_THREADS", threads)
        np.testing.assert_array_equal(node([x])[0], want)
    assert _kept(node) == len({1, min(2, numba.config.NUMBA_NUM_THREADS)})
