"""ONNX nodes to poolfold calls: the one place that maps a node's attributes and inputs to the
ops, for the backend, the ReferenceEvaluator ops and the command line.

Every op is called through its ``prepare`` (the functional API's checks, so the same errors),
which gives the inputs as checked and the launch that runs on them; a node keeps the launch
for later calls with the same kind of inputs (:class:`_Prepared`).  A new op is a row of
:data:`_OPS`.
"""

from __future__ import annotations

import functools
from typing import Callable, NamedTuple, Sequence

import numpy as np
import onnx
from onnx import helper

from . import schema
from .errors import PoolfoldError
from .kernels.threads import kernel_threads
from .ops import averaging, col2im, max_pool, max_unpool, nhwc

# How an input keys a node's prepared launches: a data input by its shape and type (the
# checks depend on nothing else), a shape input (output_shape, image_shape, block_shape) by
# its values as well.
_DATA, _SHAPE = "data", "shape"
_PREPARED_SHAPES = 8  # launches a node keeps: a model meets few shapes per node


class _Node(NamedTuple):
    """What a node fixes for all its calls."""

    spec: schema.OpVersion
    attributes: dict  # the op's keywords of the same names
    return_indices: bool  # MaxPool: the node has an Indices output
    inferred_shape_indices: bool  # MaxUnpool's option of that name


def _one_output(prepare, node: _Node, inputs):
    """An op whose inputs are all required and whose launch gives its one output (Col2Im,
    the averaging family)."""
    given = [_input(node.spec, inputs, position) for position in range(len(node.spec.inputs))]
    x, launch = prepare(node.spec, *given, **node.attributes)
    return (x,), lambda x: [launch(x)]


def _pool(prepare, node: _Node, inputs):
    """MaxPool: X in; Y, and Indices where the node asks for them, out."""
    x, launch = prepare(node.spec, _input(node.spec, inputs, 0), **node.attributes,
                        return_indices=node.return_indices)
    if node.return_indices:
        return (x,), lambda x: list(launch(x))
    return (x,), lambda x: [launch(x)[0]]


def _unpool(prepare, node: _Node, inputs):
    """MaxUnpool: X, I and the optional output_shape in; the output out."""
    output_shape = inputs[2] if len(inputs) > 2 else None
    x, indices, launch = prepare(
        node.spec, _input(node.spec, inputs, 0), _input(node.spec, inputs, 1), **node.attributes,
        output_shape=output_shape, inferred_shape_indices=node.inferred_shape_indices)
    return (x, indices), lambda x, indices: [launch(x, indices)]


class _Op(NamedTuple):
    """How the nodes of one op run."""

    call: Callable  # how a node calls ``prepare``: which inputs go in, which outputs come out
    prepare: Callable  # the op's checks: (version row, inputs, attributes) -> (inputs, launch)
    kinds: tuple[str, ...]  # per input, how it keys the kept launches (_DATA or _SHAPE)


_X = (_DATA,)  # X, the op's one input

# The ops whose prepare serves either domain (the version row says which layout).
_EITHER_DOMAIN = {
    "MaxUnpool": _Op(_unpool, max_unpool.prepare, (_DATA, _DATA, _SHAPE)),
    "AveragePool": _Op(_one_output, averaging.prepare_average_pool, _X),
    "LpPool": _Op(_one_output, averaging.prepare_lp_pool, _X),
    "GlobalMaxPool": _Op(_one_output, averaging.prepare_global_pool, _X),
    "GlobalAveragePool": _Op(_one_output, averaging.prepare_global_pool, _X),
    "GlobalLpPool": _Op(_one_output, averaging.prepare_global_pool, _X),
}

# (domain, op) -> how its nodes run.
_OPS = {
    (schema.AI_ONNX, "MaxPool"): _Op(_pool, max_pool.prepare, _X),
    (schema.NHWC, "MaxPool"): _Op(_pool, nhwc.prepare_max_pool, _X),
    (schema.AI_ONNX, "Col2Im"): _Op(_one_output, col2im.prepare, (_DATA, _SHAPE, _SHAPE)),
    **{(domain, op): row for op, row in _EITHER_DOMAIN.items()
       for domain in (schema.AI_ONNX, schema.NHWC)},
}


def implements(domain: str, op_type: str) -> bool:
    return (domain, op_type) in _OPS


def replayable(op_type: str, constant_inputs: Sequence[bool]) -> bool:
    """Whether a node's call, once its inputs are checked, is only its outputs' allocation
    and its kernel launches, nothing that depends on the values of its inputs or runs
    outside the launches: MaxPool of either domain (a fused activation is one more launch),
    and Col2Im whose image_shape and block_shape are constants (``constant_inputs``: per
    input, whether no run changes it; a half type's rounding copy and a string tensor's
    fold are not launches, and leave its output out of place, which no replay takes).
    Inside onnxruntime's session such a node can run its last call's launch again where it
    is handed the same buffers (:mod:`poolfold.session_ops`)."""
    if op_type == "MaxPool":
        return True
    return op_type == "Col2Im" and len(constant_inputs) == 3 and all(constant_inputs[1:])


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
    if len(outputs) > len(spec.outputs):
        raise PoolfoldError(
            f"{spec.label}: the node has {len(outputs)} outputs; this version has "
            f"{len(spec.outputs)} ({', '.join(spec.outputs)})"
        )
    node = _Node(spec, dict(attributes), len(outputs) > 1 and bool(outputs[1]),
                 inferred_shape_indices)
    op = _OPS[(domain, op_type)]
    return _Prepared(functools.partial(op.call, op.prepare, node), op.kinds)


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


def _input(spec, inputs, position):
    """A call's input at ``position``, which the node must give (an omitted one is None)."""
    if len(inputs) <= position or inputs[position] is None:
        raise PoolfoldError(f"{spec.label}: input '{spec.inputs[position]}' is missing")
    return inputs[position]
