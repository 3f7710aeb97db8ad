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
from .kernels import kernel_threads
from .ops import averaging, col2im, max_pool, max_unpool, nhwc

# (domain, op) -> the function; node attributes map to its keywords of the same names.
_FUNCTIONS = {
    (schema.AI_ONNX, "MaxPool"): max_pool.max_pool,
    (schema.AI_ONNX, "MaxUnpool"): max_unpool.max_unpool,
    (schema.AI_ONNX, "Col2Im"): col2im.col2im,
    (schema.NHWC, "MaxPool"): nhwc.max_pool,
    (schema.NHWC, "MaxUnpool"): nhwc.max_unpool,
    (schema.AI_ONNX, "AveragePool"): averaging.average_pool,
    (schema.AI_ONNX, "LpPool"): averaging.lp_pool,
    (schema.AI_ONNX, "GlobalMaxPool"): averaging.global_max_pool,
    (schema.AI_ONNX, "GlobalAveragePool"): averaging.global_average_pool,
    (schema.AI_ONNX, "GlobalLpPool"): averaging.global_lp_pool,
    (schema.NHWC, "AveragePool"): nhwc.average_pool,
    (schema.NHWC, "LpPool"): nhwc.lp_pool,
    (schema.NHWC, "GlobalMaxPool"): nhwc.global_max_pool,
    (schema.NHWC, "GlobalAveragePool"): nhwc.global_average_pool,
    (schema.NHWC, "GlobalLpPool"): nhwc.global_lp_pool,
}

# The averaging family: one output, X the only input, every attribute a keyword.
_AVERAGING = ("AveragePool", "LpPool", "GlobalMaxPool", "GlobalAveragePool", "GlobalLpPool")



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
    most = len(spec.inputs)
    if input_count > most:
        raise PoolfoldError(
            f"{spec.label}: the node has {input_count} inputs; this op takes at most {most}"
        )
    wanted = [bool(name) for name in outputs]
    kwargs = dict(attributes)
    if op_type in _AVERAGING:
        return _averaging_call(spec, wanted, kwargs)
    kernel_shape = kwargs.pop("kernel_shape", None)
    if domain == schema.NHWC:  # fused activations and channels-last layout: checked per call
        return _unprepared(spec, op_type, wanted, kernel_shape, kwargs, inferred_shape_indices)
    if op_type == "MaxPool":
        return_indices = _index_request(spec, wanted)

        def prepare_pool(inputs):
            x, launch = max_pool.prepare(spec, _input(spec, inputs, 0, "X"), kernel_shape,
                                         **kwargs, return_indices=return_indices)
            return (x,), lambda x: _pool_outputs(launch(x), return_indices)

        return _Prepared(prepare_pool, (_DATA,))
    if op_type == "MaxUnpool":
        def prepare_unpool(inputs):
            output_shape = inputs[2] if len(inputs) > 2 else None
            x, indices, launch = max_unpool.prepare(
                spec, _input(spec, inputs, 0, "X"), _input(spec, inputs, 1, "I"), kernel_shape,
                **kwargs, output_shape=output_shape,
                inferred_shape_indices=inferred_shape_indices)
            return (x, indices), lambda x, indices: [launch(x, indices)]

        return _Prepared(prepare_unpool, (_DATA, _DATA, _SHAPE))

    def prepare_fold(inputs):  # Col2Im
        x, launch = col2im.prepare(spec, _input(spec, inputs, 0, "input"),
                                   _input(spec, inputs, 1, "image_shape"),
                                   _input(spec, inputs, 2, "block_shape"), **kwargs)
        return (x,), lambda x: [launch(x)]

    return _Prepared(prepare_fold, (_DATA, _SHAPE, _SHAPE))


def output_shapes(domain: str, op_type: str, opset: int, attributes: dict,
                  input_shapes: Sequence, constant_inputs: Sequence) -> list[tuple | None]:
    """What prepare can tell of a node's output shapes before any data: ``input_shapes`` per
    input (a tuple of int, str or None per dim; None when unknown), ``constant_inputs`` the
    values of the inputs that are initializers (else None).  A dim it cannot tell is None; an
    output it cannot tell at all is None.  Computed by the geometry the ops run, so that an
    onnxruntime stretch after the node is told the exact shape it will be fed."""
    data = input_shapes[0] if input_shapes else None
    if domain != schema.AI_ONNX or data is None or len(data) < 3:
        return [None, None]
    kept = (data[0], data[1]) + (None,) * (len(data) - 2)  # N and C pass through
    if op_type.startswith("Global"):
        return [(data[0], data[1]) + (1,) * (len(data) - 2)]
    if op_type in ("MaxPool", "AveragePool", "LpPool"):
        shape = kept
        if all(isinstance(n, int) for n in data):
            # the windows are MaxPool's: its latest version plans them (the node's own
            # version's attribute checks are the run's)
            window = ("kernel_shape", "strides", "pads", "dilations", "auto_pad", "ceil_mode")
            options = {k: v for k, v in attributes.items() if k in window}
            kernel_shape = options.pop("kernel_shape", None)
            try:
                shape = max_pool.max_pool_shape(data, kernel_shape, **options)
            except (PoolfoldError, TypeError, ValueError):  # the run will say what is wrong
                pass
        return [shape, shape] if op_type == "MaxPool" else [shape]
    if op_type == "MaxUnpool":
        output_shape = constant_inputs[2] if len(constant_inputs) > 2 else None
        if output_shape is not None:
            return [tuple(int(n) for n in output_shape)]
        return [kept]
    image_shape = constant_inputs[1] if len(constant_inputs) > 1 else None  # Col2Im
    if image_shape is None:
        return [None]
    return [(data[0], None) + tuple(int(n) for n in image_shape)]


def _averaging_call(spec, wanted: list[bool], kwargs: dict):
    """A node of the averaging family as one functional call per run (its checks are a small
    part of these ops' cost)."""
    if len(wanted) > 1:
        raise PoolfoldError(f"{spec.label}: the node has {len(wanted)} outputs; this op has one (Y)")
    function = _FUNCTIONS[(spec.domain, spec.op)]
    if "kernel_shape" in kwargs:
        kernel_shape = kwargs.pop("kernel_shape")
        return lambda inputs: [function(_input(spec, inputs, 0, "X"), kernel_shape, **kwargs,
                                        opset=spec.version)]
    return lambda inputs: [function(_input(spec, inputs, 0, "X"), **kwargs, opset=spec.version)]


def _index_request(spec, wanted: list[bool]) -> bool:
    """Whether a MaxPool node asks for Indices (its outputs checked against the version)."""
    if len(wanted) > len(spec.outputs):
        raise PoolfoldError(
            f"{spec.label}: the node has {len(wanted)} outputs; this version has "
            f"{len(spec.outputs)} ({', '.join(spec.outputs)})"
        )
    return len(wanted) > 1 and wanted[1]


def _pool_outputs(result, return_indices: bool) -> list:
    y, indices = result
    return [y, indices] if return_indices else [y]


def _unprepared(spec, op_type, wanted, kernel_shape, kwargs, inferred_shape_indices):
    """The node as one functional call per run (the nhwc ops)."""
    function = _FUNCTIONS[(spec.domain, op_type)]
    if op_type == "MaxPool":
        return_indices = _index_request(spec, wanted)

        def max_pool_call(inputs):
            result = function(_input(spec, inputs, 0, "X"), kernel_shape, **kwargs,
                              return_indices=return_indices, opset=spec.version)
            return list(result) if return_indices else [result]

        return max_pool_call

    def max_unpool_call(inputs):
        output_shape = inputs[2] if len(inputs) > 2 else None
        return [function(_input(spec, inputs, 0, "X"), _input(spec, inputs, 1, "I"),
                         kernel_shape, **kwargs, output_shape=output_shape, opset=spec.version,
                         inferred_shape_indices=inferred_shape_indices)]

    return max_unpool_call


# How an input keys a node's prepared launches: a data input by its shape and type (the
# checks depend on nothing else), a shape input (output_shape, image_shape, block_shape) by
# its values as well.
_DATA, _SHAPE = "data", "shape"
_PREPARED_SHAPES = 8  # launches a node keeps: a model meets few shapes per node


class _Prepared:
    """A node's calls, its checks run once per kind of input.

    ``prepare(inputs)`` runs every check and returns the inputs as the kernels take them and
    the launch to run on them.  When the checks took the data inputs as they are (no
    conversion), the launch is kept under the inputs' key (:func:`_call_key`), and a later
    call with the same key goes straight to it: the checks it skips depend only on what the
    key holds.  What depends on the data itself (MaxUnpool's index range, the values of a
    string tensor) the launch checks on every call."""

    def __init__(self, prepare, kinds):
        self._prepare = prepare
        self._kinds = kinds
        self._launches: dict = {}

    def __call__(self, inputs: Sequence) -> list[np.ndarray]:
        key = _call_key(inputs, self._kinds)
        kept = self._launches.get(key) if key is not None else None
        if kept is not None:
            launch, count = kept
            return launch(*inputs[:count])
        checked, launch = self._prepare(inputs)
        if key is not None and all(c is v for c, v in zip(checked, inputs)):
            if len(self._launches) >= _PREPARED_SHAPES:
                self._launches.clear()
            self._launches[key] = (launch, len(checked))
        return launch(*checked)


def _call_key(inputs: Sequence, kinds) -> tuple | None:
    """The key of a call's inputs (see :data:`_DATA`), with poolfold's thread count, which
    launches split their work by; None when an input is not an ndarray (checked afresh)."""
    key: list = [kernel_threads(), len(inputs)]
    for kind, value in zip(kinds, inputs):
        if value is None:
            key.append(None)  # an omitted optional input
        elif type(value) is not np.ndarray:
            return None
        elif kind == _DATA:
            key.append((value.shape, value.dtype))
        elif value.ndim == 1 and value.size <= 64:
            key.append((value.shape, value.dtype, value.tobytes()))
        else:
            return None
    return tuple(key)


def _input(spec, inputs, position, name):
    if len(inputs) <= position or inputs[position] is None:
        raise PoolfoldError(f"{spec.label}: input '{name}' is missing")
    return inputs[position]
