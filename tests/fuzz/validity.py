"""Whether the contract lets a call be refused: the fuzz judge's second oracle.

The value oracle (tests/oracle.py) computes what a valid call returns; it does not know the
versions, the types each allows or the Python API's argument rules.  This module does, from
../shared/SEMANTICS.md and the operator schemas the installed onnx package carries, never from
poolfold's own tables: :func:`verdict` says whether a call must be computed (``VALID``), must
be refused (``INVALID``), or may go either way (``EITHER``: the contract leaves it open, such
as a Python bool where an ONNX attribute wants an int, or an int32 index array that a Python
API might convert).  Each non-valid verdict carries the reason.

Sizes: a call whose output or tables need more than the machine's memory is ``TOO_LARGE``,
which a refusal may answer only by saying so.

The averaging family reads each version's attributes and types from the schemas: onnx's
``defs.get_schema`` for ai.onnx, onnxruntime's ``get_all_operator_schema()`` for
com.ms.internal.nhwc; the versions are SEMANTICS.md's table.  Its verdicts weigh every
argument: a call holding one invalid argument is ``INVALID`` even if another is only
``EITHER``.
"""

from __future__ import annotations

import functools
import math
import os
import resource
from typing import NamedTuple

import numpy as np
from onnx import defs, helper

VALID, INVALID, EITHER, TOO_LARGE = "valid", "invalid", "either", "too large"

NHWC = "com.ms.internal.nhwc"
VERSIONS = {
    ("", "MaxPool"): (1, 8, 10, 11, 12, 22),
    ("", "MaxUnpool"): (9, 11, 22),
    ("", "Col2Im"): (18,),
    (NHWC, "MaxPool"): (1, 8, 10, 11, 12),
    (NHWC, "MaxUnpool"): (9, 11),
    ("", "AveragePool"): (1, 7, 10, 11, 19, 22),
    ("", "LpPool"): (1, 2, 11, 18, 22),
    ("", "GlobalMaxPool"): (1, 22),
    ("", "GlobalAveragePool"): (1, 22),
    ("", "GlobalLpPool"): (1, 2, 22),
    (NHWC, "AveragePool"): (7, 10, 11, 19),
    (NHWC, "LpPool"): (11, 18),
    (NHWC, "GlobalMaxPool"): (1,),
    (NHWC, "GlobalAveragePool"): (1,),
    (NHWC, "GlobalLpPool"): (2,),
}
# Activations of the nhwc domain and how many parameters each takes (SEMANTICS.md).
ACTIVATIONS = {"Relu": 0, "Tanh": 0, "Sigmoid": 0, "LeakyRelu": 1, "Clip": 2, "HardSigmoid": 2}
AUTO_PADS = ("NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID")
# The library documents attribute values beyond 2**40 as refused: no real tensor has them.
ATTRIBUTE_LIMIT = 2**40


class Verdict(NamedTuple):
    kind: str
    reason: str = ""


class _Refuse(Exception):
    def __init__(self, kind, reason):
        super().__init__(reason)
        self.verdict = Verdict(kind, reason)


def _invalid(reason):
    raise _Refuse(INVALID, reason)


def _memory() -> int:
    """What this process may allocate: the machine's memory, or less under an address-space
    limit (the campaign's workers have one), where numpy's allocation fails first."""
    physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    limit = resource.getrlimit(resource.RLIMIT_AS)[0]
    return physical if limit == resource.RLIM_INFINITY else min(physical, limit)


# ------------------------------------------------------------------------- versions, types

def _version(domain, op, opset):
    if opset is None:
        return VERSIONS[domain, op][-1]
    if type(opset) is not int:
        _invalid(f"opset {opset!r} is not an int")
    fitting = [v for v in VERSIONS[domain, op] if v <= opset]
    if not fitting:
        _invalid(f"no {op} version <= opset {opset}")
    return fitting[-1]


def _onnx_type(array: np.ndarray) -> str | None:
    """The ONNX tensor type of ``array``'s elements, or None for a type ONNX lacks."""
    if array.dtype.kind in "US":
        return "tensor(string)"
    if array.dtype.kind == "O":
        flat = array.ravel()
        return "tensor(string)" if all(isinstance(v, str) for v in flat) else None
    dtype = array.dtype
    if dtype.byteorder not in "=|":  # the values count, not their byte order
        dtype = dtype.newbyteorder("=")
    try:
        code = helper.np_dtype_to_tensor_dtype(dtype)
    except (ValueError, KeyError, TypeError):
        return None
    name = helper.tensor_dtype_to_string(code).removeprefix("TensorProto.")
    return {"FLOAT": "tensor(float)", "DOUBLE": "tensor(double)"}.get(name, f"tensor({name.lower()})")


def _allowed_types(domain, op, version) -> set[str]:
    """The data input's types in the ai.onnx schema; the nhwc ops take the types of the ai.onnx version of the
    same number (SEMANTICS.md)."""
    if domain == NHWC and op == "MaxUnpool":
        return {"tensor(float16)", "tensor(float)", "tensor(double)"}
    schema = defs.get_schema(op, version)
    data_type = schema.inputs[0].type_str  # "T" or "T1"
    constraint = next(c for c in schema.type_constraints if c.type_param_str == data_type)
    return set(constraint.allowed_type_strs)


def _data(value, label, min_rank, exact_rank=None):
    try:
        array = np.asarray(value)
    except (ValueError, TypeError) as error:
        _invalid(f"{label} is not an array: {error}")
    if array.ndim < min_rank or (exact_rank is not None and array.ndim != exact_rank):
        _invalid(f"{label} has rank {array.ndim}")
    return array


def _check_type(array, domain, op, version, label):
    name = _onnx_type(array)
    if name is None or name not in _allowed_types(domain, op, version):
        _invalid(f"{label} of type {array.dtype} not in {op}-{version}'s T")
    return name


# ----------------------------------------------------------------------------- attributes

def _is_int(v) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))


def _ints(name, value, length, low, required=False):
    """An int-list attribute: its values, or None when absent."""
    if value is None:
        if required:
            _invalid(f"'{name}' is required")
        return None
    either = False
    if isinstance(value, np.ndarray):
        if value.ndim != 1 or value.dtype.kind not in "iu":
            _invalid(f"'{name}' is an array of {value.dtype}, shape {value.shape}")
        either = value.dtype != np.int64  # a narrower integer array: a Python API may take it
        value = value.tolist()
    if not isinstance(value, (list, tuple)):
        _invalid(f"'{name}' is not a sequence: {value!r}")
    if not all(_is_int(v) for v in value):
        _invalid(f"'{name}' holds a non-integer: {value!r}")
    value = [int(v) for v in value]
    if len(value) != length:
        _invalid(f"'{name}' has length {len(value)}, not {length}")
    if any(v < low for v in value):
        _invalid(f"'{name}' {value} has a value below {low}")
    if any(v > ATTRIBUTE_LIMIT for v in value):
        raise _Refuse(EITHER, f"'{name}' {value} beyond the documented 2**40 limit")
    if either:
        raise _Refuse(EITHER, f"'{name}' given as a {np.asarray(value).dtype} array")
    return value


def _lacking(name, value, default, version):
    """An attribute the version lacks, given: an error (SEMANTICS.md), but given at its
    default value a Python API may read as not given (a node cannot: it names it)."""
    try:  # (a nested list compares element-wise, as arrays: not the default either way)
        at_default = np.array_equal(np.atleast_1d(value), np.atleast_1d(default))
    except (TypeError, ValueError):  # ragged
        at_default = False
    if at_default:
        raise _Refuse(EITHER, f"'{name}' at its default on version {version}, which lacks it")
    _invalid(f"'{name}' on version {version}, which lacks it")


def _flag(name, value):
    if isinstance(value, (bool, np.bool_)):
        return int(value)
    if not _is_int(value) or int(value) not in (0, 1):
        _invalid(f"'{name}' is {value!r}, not 0 or 1")
    return int(value)


def _activation(kwargs, integer_type):
    name = kwargs.get("activation")
    params = kwargs.get("activation_params")
    if name is None:
        if params is not None:
            raise _Refuse(EITHER, "activation_params without an activation")
        return
    if not isinstance(name, str) or name not in ACTIVATIONS:
        _invalid(f"unknown activation {name!r}")
    if integer_type:
        _invalid("an activation on an integer type")
    if params is None:
        params = []
    if not isinstance(params, (list, tuple)) or len(params) != ACTIVATIONS[name]:
        _invalid(f"activation {name} with params {params!r}")


# ----------------------------------------------------------------------------- geometry

def _pool_outputs(spatial, kernel, strides, pads, dilations, auto_pad, ceil_mode):
    """SEMANTICS.md's output size per axis, or a refusal when no window fits."""
    r = len(spatial)
    outs = []
    for a in range(r):
        n, k, s, d = spatial[a], kernel[a], strides[a], dilations[a]
        span = (k - 1) * d + 1
        if auto_pad == "NOTSET":
            pb, pe = pads[a], pads[a + r]
            if ceil_mode:
                out = -(-(n + pb + pe - span) // s) + 1
                if (out - 1) * s >= n + pb:
                    out -= 1
            else:
                out = (n + pb + pe - span) // s + 1
        elif auto_pad == "VALID":
            out = (n - span) // s + 1
        else:
            out = -(-n // s)
        if out < 1:
            _invalid(f"no window fits along spatial axis {a}")
        outs.append(out)
    return outs


def _size(shape, itemsize, extra=0) -> None:
    """Refuse as too large an array of ``shape`` (plus ``extra`` bytes of tables) beyond
    memory, or one numpy cannot describe even empty."""
    nonzero = math.prod(v for v in shape if v)
    if nonzero * max(itemsize, 1) >= 2**63:
        raise _Refuse(TOO_LARGE, f"shape {tuple(shape)} beyond numpy's index range")
    if math.prod(shape) * itemsize + extra > _memory():
        raise _Refuse(TOO_LARGE, f"shape {tuple(shape)} beyond memory")


# ----------------------------------------------------------------------------- the ops

def _max_pool(op, args, kwargs, shape_only=False):
    domain = NHWC if op.startswith("nhwc.") else ""
    version = _version(domain, "MaxPool", kwargs.get("opset"))
    if shape_only:
        shape = args[0]
        if isinstance(shape, np.ndarray):
            shape = shape.tolist() if shape.ndim == 1 and shape.dtype.kind in "iu" else None
        if not isinstance(shape, (list, tuple)) or not all(_is_int(v) for v in shape):
            _invalid(f"input shape {args[0]!r} is not a sequence of ints")
        shape = [int(v) for v in shape]
        if len(shape) < 3 or min(shape) < 0:
            _invalid(f"input shape {shape}")
        integer_type = False
    else:
        x = _data(args[0], "X", 3)
        name = _check_type(x, domain, "MaxPool", version, "X")
        integer_type = name in ("tensor(int8)", "tensor(uint8)")
        shape = list(x.shape)
        if domain == NHWC:
            shape = [shape[0], shape[-1]] + shape[1:-1]
    r = len(shape) - 2
    kernel = _ints("kernel_shape", args[1], r, 1, required=True)
    strides = _ints("strides", kwargs.get("strides"), r, 1) or [1] * r
    pads = _ints("pads", kwargs.get("pads"), 2 * r, 0) or [0] * (2 * r)
    dilations = kwargs.get("dilations")
    if dilations is not None and version < 10:
        _lacking("dilations", dilations, [1] * r, version)
    dilations = _ints("dilations", dilations, r, 1) or [1] * r
    auto_pad = kwargs.get("auto_pad", "NOTSET")
    if not isinstance(auto_pad, str) or auto_pad not in AUTO_PADS:
        _invalid(f"auto_pad {auto_pad!r}")
    ceil_mode = _flag("ceil_mode", kwargs.get("ceil_mode", 0))
    if "ceil_mode" in kwargs and version < 10:
        _lacking("ceil_mode", ceil_mode, 0, version)
    if auto_pad != "NOTSET" and any(pads):
        _invalid(f"pads {pads} with auto_pad {auto_pad}")
    if not shape_only:
        storage_order = _flag("storage_order", kwargs.get("storage_order", 0))
        if "storage_order" in kwargs and version < 8:
            _lacking("storage_order", storage_order, 0, version)
        return_indices = kwargs.get("return_indices", False)
        if not isinstance(return_indices, (bool, np.bool_)):
            _invalid(f"return_indices {return_indices!r} is not a bool")
        if return_indices and version < 8:
            _invalid("Indices on MaxPool-1")
        if domain == NHWC:
            _activation(kwargs, integer_type)
    outs = _pool_outputs(shape[2:], kernel, strides, pads, dilations, auto_pad,
                         ceil_mode and auto_pad == "NOTSET")
    if not shape_only:
        itemsize = np.asarray(args[0]).dtype.itemsize + (8 if return_indices else 0)
        _size(shape[:2] + outs, itemsize, extra=24 * r * max(outs))


def _max_unpool(op, args, kwargs):
    domain = NHWC if op.startswith("nhwc.") else ""
    version = _version(domain, "MaxUnpool", kwargs.get("opset"))
    x = _data(args[0], "X", 3)
    _check_type(x, domain, "MaxUnpool", version, "X")
    shape = list(x.shape)
    if domain == NHWC:
        shape = [shape[0], shape[-1]] + shape[1:-1]
        _activation(kwargs, False)
    indices = args[1]
    either = None
    if not isinstance(indices, np.ndarray):
        either = "I given as a list"
        indices = _data(indices, "I", 0)
    if indices.dtype != np.int64:
        if either and (indices.dtype.kind in "iu" or indices.size == 0):
            pass  # a list of Python ints: numpy makes it int64 or uint64, float64 if empty
        else:
            _invalid(f"I of type {indices.dtype}")
    if list(indices.shape) != shape:
        _invalid(f"I of shape {indices.shape}, X (NCHW) {tuple(shape)}")
    r = len(shape) - 2
    kernel = _ints("kernel_shape", args[2], r, 1, required=True)
    strides = _ints("strides", kwargs.get("strides"), r, 1) or [1] * r
    pads = _ints("pads", kwargs.get("pads"), 2 * r, 0) or [0] * (2 * r)
    output_shape = kwargs.get("output_shape")
    if output_shape is None:
        out = [(n - 1) * s + k - pb - pe for n, k, s, pb, pe in
               zip(shape[2:], kernel, strides, pads[:r], pads[r:])]
        if min(out, default=1) < 1:
            _invalid(f"inferred output {out}")
        out = shape[:2] + out
    else:
        if isinstance(output_shape, np.ndarray):
            if output_shape.ndim != 1 or output_shape.dtype.kind not in "iu":
                _invalid(f"output_shape {output_shape!r}")
            if output_shape.dtype != np.int64:
                either = either or f"output_shape of type {output_shape.dtype}"
            output_shape = output_shape.tolist()
        if not isinstance(output_shape, (list, tuple)) or \
                not all(_is_int(v) for v in output_shape):
            _invalid(f"output_shape {output_shape!r}")
        out = [int(v) for v in output_shape]
        if len(out) != len(shape) or out[:2] != shape[:2] or min(out[2:], default=1) < 1:
            _invalid(f"output_shape {out} for X (NCHW) {tuple(shape)}")
    _size(out, x.dtype.itemsize)
    total = math.prod(out)
    if indices.size and (indices.min() < 0 or indices.max() >= total):
        _invalid(f"an index outside [0, {total})")
    if either:
        raise _Refuse(EITHER, either)


def _col2im(args, kwargs):
    version = _version("", "Col2Im", kwargs.get("opset"))
    x = _data(args[0], "input", 3, exact_rank=3)
    _check_type(x, "", "Col2Im", version, "input")
    either = None
    shapes = []
    for name, value in (("image_shape", args[1]), ("block_shape", args[2])):
        if isinstance(value, np.ndarray) and value.dtype != np.int64 and value.dtype.kind in "iu":
            either = f"{name} of type {value.dtype}"
            value = value.astype(np.int64)
        if isinstance(value, np.ndarray):
            if value.ndim != 1 or value.dtype.kind not in "iu":
                _invalid(f"{name} {value!r}")
            value = value.tolist()
        if not isinstance(value, (list, tuple)) or not all(_is_int(v) for v in value):
            _invalid(f"{name} {value!r}")
        shapes.append([int(v) for v in value])
    image, block = shapes
    r = len(image)
    if r < 1 or len(block) != r:
        _invalid(f"image_shape {image}, block_shape {block}")
    if min(image) < 1 or min(block) < 1:
        _invalid(f"image_shape {image}, block_shape {block}")
    strides = _ints("strides", kwargs.get("strides"), r, 1) or [1] * r
    dilations = _ints("dilations", kwargs.get("dilations"), r, 1) or [1] * r
    pads = _ints("pads", kwargs.get("pads"), 2 * r, 0) or [0] * (2 * r)
    if max(image + block) > ATTRIBUTE_LIMIT:
        raise _Refuse(EITHER, "a shape beyond the documented 2**40 limit")
    grid = [(n + pb + pe - ((k - 1) * d + 1)) // s + 1 for n, k, s, d, pb, pe in
            zip(image, block, strides, dilations, pads[:r], pads[r:])]
    if min(grid) < 1:
        _invalid(f"no block fits: grid {grid}")
    size = math.prod(block)
    if x.shape[1] % size or x.shape[2] != math.prod(grid):
        _invalid(f"input {x.shape} for {size} taps per block and a {grid} grid")
    itemsize = 4 if x.dtype.itemsize < 4 else x.dtype.itemsize  # half types sum in float32
    _size((x.shape[0], x.shape[1] // size, *image), itemsize)
    if either:
        raise _Refuse(EITHER, either)


# ------------------------------------------------------------------- the averaging family

AVERAGING = {"average_pool": "AveragePool", "lp_pool": "LpPool",
             "global_max_pool": "GlobalMaxPool", "global_average_pool": "GlobalAveragePool",
             "global_lp_pool": "GlobalLpPool"}
# The Python functions' keywords for attributes some versions lack, and their defaults:
# given at the default, a keyword cannot be told from none (see _lacking).
_KEYWORDS = {"average_pool": ("dilations", "ceil_mode", "count_include_pad"),
             "lp_pool": ("dilations", "ceil_mode")}
_KEYWORDS.update({f"nhwc.{op}": names for op, names in _KEYWORDS.items()})


class OpSchema(NamedTuple):
    attributes: dict  # name -> "INT", "INTS", "FLOAT", "STRING", "FLOATS"
    types: frozenset  # the data input's types, "tensor(float)" ...


@functools.lru_cache(maxsize=None)
def _nhwc_schemas() -> dict:
    """onnxruntime's com.ms.internal.nhwc schemas: (op, since_version) -> OpSchema."""
    from onnxruntime.capi.onnxruntime_pybind11_state import get_all_operator_schema

    found = {}
    for schema in get_all_operator_schema():
        if schema.domain != NHWC:
            continue
        data_type = schema.inputs[0].typeStr
        types = next((c.allowed_type_strs for c in schema.type_constraints
                      if c.type_param_str == data_type), [data_type])
        found[schema.name, schema.since_version] = OpSchema(
            {name: a.type.name for name, a in schema.attributes.items()}, frozenset(types))
    return found


def warm() -> None:
    """Read onnxruntime's schemas now (a third of a second), not in each worker."""
    _nhwc_schemas()


@functools.lru_cache(maxsize=None)
def op_schema(domain: str, op: str, version: int) -> OpSchema:
    if domain == NHWC:
        return _nhwc_schemas()[op, version]
    schema = defs.get_schema(op, version)
    data_type = schema.inputs[0].type_str
    constraint = next(c for c in schema.type_constraints if c.type_param_str == data_type)
    return OpSchema({name: a.type.name for name, a in schema.attributes.items()},
                    frozenset(constraint.allowed_type_strs))


class _Weighed:
    """The reasons a call may go either way, gathered while the checks go on: an invalid
    argument found after them still makes the call INVALID."""

    def __init__(self):
        self.either = []

    def run(self, check, *args):
        """``check(*args)``; an EITHER it raises is noted, and None returned."""
        try:
            return check(*args)
        except _Refuse as refusal:
            if refusal.verdict.kind != EITHER:
                raise
            self.either.append(refusal.verdict.reason)
            return None


def _soft_ints(weighed, name, value, length, low, required=False):
    """_ints, with an EITHER (a value past 2**40, a narrow integer array) noted and the values
    kept (the geometry still decides whether a window fits)."""
    try:
        return _ints(name, value, length, low, required)
    except _Refuse as refusal:
        if refusal.verdict.kind != EITHER:
            raise
        weighed.either.append(refusal.verdict.reason)  # raised once every value checked out
        return [int(v) for v in (value.tolist() if isinstance(value, np.ndarray) else value)]


def _number(value):
    """A real number of Python or numpy (not bool), as int or float; None otherwise."""
    if isinstance(value, (bool, np.bool_)):
        return None
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        return float(value)
    return None


def _p(weighed, label, value, kind):
    """LpPool's p: a number > 0 where the schema types it FLOAT (version 1), an integer >= 1
    where INT (SEMANTICS.md)."""
    if isinstance(value, (bool, np.bool_)):
        if not value:
            _invalid(f"p {value!r}")
        weighed.either.append(f"p {value!r}: a bool where a number is wanted")
        return 1
    number = _number(value)
    if number is None:
        if isinstance(value, np.ndarray) and value.ndim == 0 and value.dtype.kind in "iuf":
            weighed.either.append(f"p given as a 0-d {value.dtype} array")
            number = value.item()
            if not number > 0 or (kind == "INT" and (not math.isfinite(number)
                                                       or number != int(number))):
                _invalid(f"p {value!r}")
            return number
        _invalid(f"p {value!r} is not a number")
    if math.isnan(number) or number <= 0:
        _invalid(f"p {value!r} is not > 0")
    if kind == "INT":
        if isinstance(number, float):
            if not math.isfinite(number) or number != math.floor(number):
                _invalid(f"p {value!r} is not an integer ({label} types it INT)")
            weighed.either.append(f"p {value!r}: an integral float where an int is wanted")
        return number
    if math.isinf(number):
        # (sum |x|^p)^(1/p) has no value at p = inf, only a limit: the contract is silent
        weighed.either.append("p = inf")
    return number


def _averaging_attribute(weighed, op, label, schema, name, value, rank, version):
    """A name the version's schema lacks: a keyword of the Python function given at its
    default may pass for not given (a node names it: either answer is fair, as for
    MaxPool); anything else is an error."""
    if name in schema.attributes or (name == "dilations" and value is None):
        return  # None: the Python keyword's "not given"
    if name in _KEYWORDS.get(op, ()):
        weighed.run(_lacking, name, value, [1] * rank if name == "dilations" else 0, version)
        return
    _invalid(f"{label} has no attribute {name!r}")


def _averaging(op, args, kwargs):
    """AveragePool, LpPool and the global pools (SEMANTICS.md, "The averaging family"):
    the version's schema says which attributes exist; windows are MaxPool's; p as _p says;
    a node has one output."""
    channels_last = op.startswith("nhwc.")
    domain = NHWC if channels_last else ""
    base = op.removeprefix("nhwc.")
    name = AVERAGING[base]
    version = _version(domain, name, kwargs.get("opset"))
    schema = op_schema(domain, name, version)
    label = f"{name}-{version}"
    weighed = _Weighed()
    x = _data(args[0], "X", 3)
    if _onnx_type(x) not in schema.types:
        _invalid(f"X of type {x.dtype} not in {label}'s T")
    shape = list(x.shape)
    if channels_last:
        shape = [shape[0], shape[-1]] + shape[1:-1]
    r = len(shape) - 2
    if kwargs.get("node_outputs", 1) != 1:
        _invalid(f"a node with {kwargs['node_outputs']} outputs; {label} has one")
    rest = {k: v for k, v in kwargs.items() if k not in ("opset", "node_outputs")}
    if "p" in schema.attributes:
        _p(weighed, label, rest.pop("p", 2), schema.attributes["p"])
    if "activation" in schema.attributes:
        weighed.run(_activation, rest, False)
        rest.pop("activation", None)
        rest.pop("activation_params", None)
    if base.startswith("global_"):
        for key, value in rest.items():
            _invalid(f"{label} has no attribute {key!r}")
        _finish(weighed)
        return
    kernel = _soft_ints(weighed, "kernel_shape", args[1], r, 1, required=True)
    strides = _soft_ints(weighed, "strides", rest.get("strides"), r, 1) or [1] * r
    pads = _soft_ints(weighed, "pads", rest.get("pads"), 2 * r, 0) or [0] * (2 * r)
    dilations = _soft_ints(weighed, "dilations", rest.get("dilations"), r, 1) or [1] * r
    auto_pad = rest.get("auto_pad", "NOTSET")
    if not isinstance(auto_pad, str) or auto_pad not in AUTO_PADS:
        _invalid(f"auto_pad {auto_pad!r}")
    ceil_mode = _flag("ceil_mode", rest.get("ceil_mode", 0))
    if "count_include_pad" in rest:
        _flag("count_include_pad", rest["count_include_pad"])
    for key, value in rest.items():
        _averaging_attribute(weighed, op, label, schema, key, value, r, version)
    if auto_pad != "NOTSET" and any(pads):
        _invalid(f"pads {pads} with auto_pad {auto_pad}")
    outs = _pool_outputs(shape[2:], kernel, strides, pads, dilations, auto_pad,
                         ceil_mode and auto_pad == "NOTSET")
    _finish(weighed)
    y_shape = shape[:2] + outs
    # the tables of a non-empty Y: a row per output along each axis, a divisor per position
    tables = 24 * r * max(outs) + 16 * math.prod(outs) if math.prod(y_shape) else 0
    _size(y_shape, x.dtype.itemsize, extra=tables)


def _finish(weighed):
    if weighed.either:
        raise _Refuse(EITHER, "; ".join(weighed.either))


def verdict(op: str, args, kwargs) -> Verdict:
    """Whether the call ``op(*args, **kwargs)`` (the judge's names: "max_pool",
    "nhwc.max_unpool", ...) must be computed, refused, or may be either."""
    try:
        if op in ("max_pool", "nhwc.max_pool"):
            _max_pool(op, args, kwargs)
        elif op == "max_pool_shape":
            _max_pool(op, args, kwargs, shape_only=True)
        elif op in ("max_unpool", "nhwc.max_unpool"):
            _max_unpool(op, args, kwargs)
        elif op.removeprefix("nhwc.") in AVERAGING:
            _averaging(op, args, kwargs)
        else:
            _col2im(args, kwargs)
    except _Refuse as refusal:
        return refusal.verdict
    return Verdict(VALID)

