"""The bundled example: a small SegNet-style encoder-decoder.

Two Conv+Relu+MaxPool stages keep their pooling Indices; the decoder restores each stage with
MaxUnpool (output_shape taken from the encoder tensor it mirrors), and the head is a 3x3
"transposed convolution" written as MatMul + Col2Im.  ``python -m poolfold.models.segnet``
rewrites ``segnet.onnx`` from this code (deterministic: seeded weights).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

INPUT_SHAPE = (1, 3, 64, 64)
CLASSES = 2


def build() -> onnx.ModelProto:
    rng = np.random.default_rng(2024)

    def weight(name, shape):
        fan_in = int(np.prod(shape[1:]))
        values = rng.standard_normal(shape).astype(np.float32) * np.float32(np.sqrt(2 / fan_in))
        return numpy_helper.from_array(values, name)

    initializers = [
        weight("enc1_w", (8, 3, 3, 3)),
        weight("enc2_w", (16, 8, 3, 3)),
        weight("dec2_w", (8, 16, 3, 3)),
        weight("head_w", (CLASSES * 9, 8)),
        numpy_helper.from_array(np.array([1, 8, -1], np.int64), "columns_shape"),
        numpy_helper.from_array(np.array(INPUT_SHAPE[2:], np.int64), "image_shape"),
        numpy_helper.from_array(np.array([3, 3], np.int64), "block_shape"),
    ]
    conv = dict(kernel_shape=[3, 3], pads=[1, 1, 1, 1])
    pool = dict(kernel_shape=[2, 2], strides=[2, 2])
    nodes = [
        # encoder
        helper.make_node("Conv", ["image", "enc1_w"], ["enc1"], **conv),
        helper.make_node("Relu", ["enc1"], ["enc1_act"]),
        helper.make_node("MaxPool", ["enc1_act"], ["pool1", "pool1_indices"], **pool),
        helper.make_node("Conv", ["pool1", "enc2_w"], ["enc2"], **conv),
        helper.make_node("Relu", ["enc2"], ["enc2_act"]),
        helper.make_node("MaxPool", ["enc2_act"], ["encoded", "pool2_indices"], **pool),
        # decoder: unpool to the exact shapes of the encoder tensors
        helper.make_node("Shape", ["enc2_act"], ["enc2_shape"]),
        helper.make_node("MaxUnpool", ["encoded", "pool2_indices", "enc2_shape"], ["unpool2"], **pool),
        helper.make_node("Conv", ["unpool2", "dec2_w"], ["dec2"], **conv),
        helper.make_node("Relu", ["dec2"], ["dec2_act"]),
        helper.make_node("Shape", ["enc1_act"], ["enc1_shape"]),
        helper.make_node("MaxUnpool", ["dec2_act", "pool1_indices", "enc1_shape"], ["unpool1"], **pool),
        # head: columns = W @ features, folded back with 3x3 blocks (a transposed convolution)
        helper.make_node("Reshape", ["unpool1", "columns_shape"], ["features"]),
        helper.make_node("MatMul", ["head_w", "features"], ["columns"]),
        helper.make_node("Col2Im", ["columns", "image_shape", "block_shape"], ["segmentation"],
                         pads=[1, 1, 1, 1]),
    ]
    graph = helper.make_graph(
        nodes,
        "segnet_mini",
        [helper.make_tensor_value_info("image", TensorProto.FLOAT, INPUT_SHAPE)],
        [
            helper.make_tensor_value_info("segmentation", TensorProto.FLOAT,
                                          (1, CLASSES) + INPUT_SHAPE[2:]),
            helper.make_tensor_value_info("encoded", TensorProto.FLOAT, (1, 16, 16, 16)),
        ],
        initializers,
    )
    # IR version 8 / opset 18: what onnxruntime and onnx's reference both read.
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=8,
        producer_name="poolfold",
    )
    onnx.checker.check_model(model)
    return model


if __name__ == "__main__":
    target = Path(__file__).with_name("segnet.onnx")
    onnx.save(build(), target)
    print(f"wrote {target}")
