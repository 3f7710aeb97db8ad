"""ONNX nodes to poolfold calls: the one place that maps a node's attributes and inputs to the
functional API, for the backend, the ReferenceEvaluator ops and the command line.
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np
import onnx
from onnx import helper

from . import schema
from .errors import PoolfoldError
from .ops import col2im, max_pool, max_unpool, nhwc

# (domain, op) -> the function; node attributes map to its keywords of the same names.
_FUNCTIONS = {
    (schema.AI_ONNX, "MaxPool"): max_pool.max_pool,
    (schema.AI_ONNX, "MaxUnpool"): max_unpool.max_unpool,
    (schema.AI_ONNX, "Col2Im"): col2im.col2im,
    (schema.NHWC, "MaxPool"): nhwc.max_pool,
    (schema.NHWC, "MaxUnpool"): nhwc.max_unpool,
}


# Inputs each op takes (MaxUnpool's output_shape is optional).
_MOST_INPUTS = {"MaxPool": 1, "MaxUnpool": 3, "Col2Im": 3}


def implements(domain: str, op_type: str) -> bool:
    return (domain, op_type) in _FUNCTIONS


def attributes_of(node: onnx.NodeProto) -> dict:
    """The attributes a node sets, strings decoded (absent ones stay absent)."""
    values = {}
    for attribute in node.attribute:
        value = helper.get_attribute_value(attribute)
        if isinstance(value, bytes):
            value = value.decode("utf-8")
        values[attribute.name] = value
    return values


def run(domain: str, op_type: str, opset: int, attributes: dict, inputs: Sequence,
        outputs: Sequence[str], inferred_shape_indices: bool = False) -> list[np.ndarray]:
    """Run one node of poolfold's ops: ``opset`` is the model's import for ``domain``;
    ``outputs`` the node's output names ("" for an omitted optional output);
    ``inferred_shape_indices`` is MaxUnpool's option of that name."""
    return bind(domain, op_type, opset, attributes, outputs, inferred_shape_indices,
                input_count=len(inputs))(inputs)


def bind(domain: str, op_type: str, opset: int, attributes: dict, outputs: Sequence[str],
         inferred_shape_indices: bool = False, *, input_count: int
         ) -> Callable[[Sequence], list[np.ndarray]]:
    """:func:`run` in two halves: the node's version, attributes and number of inputs are
    checked now, and the function returned takes the inputs (a prepared model checks once,
    runs many times)."""
    spec = schema.resolve(op_type, opset, domain)
    for name in attributes:
        if name not in spec.attributes:
            since = spec.introduced.get(name)
            hint = f" (it exists from {op_type}-{since})" if since else ""
            raise PoolfoldError(f"{spec.label}: unknown attribute '{name}'{hint}")
    for attribute in spec.attributes.values():
        if attribute.required and attribute.name not in attributes:
            raise PoolfoldError(f"{spec.label}: required attribute '{attribute.name}' is missing")
    most = _MOST_INPUTS[op_type]
    if input_count > most:
        raise PoolfoldError(
            f"{spec.label}: the node has {input_count} inputs; this op takes at most {most}"
        )
    wanted = [bool(name) for name in outputs]
    function = _FUNCTIONS[(domain, op_type)]
    kwargs = dict(attributes)
    kernel_shape = kwargs.pop("kernel_shape", None)
    if op_type == "MaxPool":
        if len(wanted) > len(spec.outputs):
            raise PoolfoldError(
                f"{spec.label}: the node has {len(wanted)} outputs; this version has "
                f"{len(spec.outputs)} ({', '.join(spec.outputs)})"
            )
        return_indices = len(wanted) > 1 and wanted[1]

        def max_pool(inputs):
            result = function(_input(spec, inputs, 0, "X"), kernel_shape, **kwargs,
                              return_indices=return_indices, opset=spec.version)
            return list(result) if return_indices else [result]

        return max_pool
    if op_type == "MaxUnpool":
        def max_unpool(inputs):
            output_shape = inputs[2] if len(inputs) > 2 else None
            return [function(_input(spec, inputs, 0, "X"), _input(spec, inputs, 1, "I"),
                             kernel_shape, **kwargs, output_shape=output_shape,
                             opset=spec.version, inferred_shape_indices=inferred_shape_indices)]

        return max_unpool

    # Col2Im
    def col2im(inputs):
        return [function(_input(spec, inputs, 0, "input"), _input(spec, inputs, 1, "image_shape"),
                         _input(spec, inputs, 2, "block_shape"), **kwargs, opset=spec.version)]

    return col2im


def _input(spec, inputs, position, name):
    if len(inputs) <= position or inputs[position] is None:
        raise PoolfoldError(f"{spec.label}: input '{name}' is missing")
    return inputs[position]
