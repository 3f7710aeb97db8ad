"""Where a node of poolfold's ops runs when the other nodes run on onnxruntime: prepare's
``poolfold_nodes``.

- ``"all"`` (the default): every MaxPool, MaxUnpool, Col2Im, AveragePool, LpPool,
  GlobalMaxPool, GlobalAveragePool, GlobalLpPool and com.ms.internal.nhwc node runs on
  poolfold's kernels.
- ``"needed"``: a node runs on poolfold only where onnxruntime (1.32, CPU) cannot run it or
  would not compute it as poolfold's semantics say, or where poolfold is measured faster;
  every other node stays inside onnxruntime's stretch, so that a model onnxruntime runs right
  as a whole runs as one onnxruntime session.

The decision is made at prepare time, from what the node says (op, domain, version,
attributes, which outputs are used) and what shape inference tells of its data input (element
type, rank, sizes).  Where that is not known, the node runs on poolfold: a doubt never hands a
node to an implementation that might compute it differently.  :data:`RULES` is the one list of
reasons, checked in order; tests/test_placement.py checks each against what onnxruntime
actually does with a one-node model.

**The differences "needed" leaves** are in the data, which prepare cannot see:

- where a MaxPool window or a GlobalMaxPool plane holds a NaN, onnxruntime's answer depends
  on where the NaN sits (it may give the largest number instead), while poolfold's is NaN
  (and its index the first NaN's);
- a GlobalMaxPool plane of -inf only gives onnxruntime's lowest finite value, not -inf;
- float32 AveragePool and GlobalAveragePool sum in float32 on onnxruntime: a window whose
  sum passes float32's largest value gives inf there, although its average is finite.

A model whose pooled tensors may hold NaN, infinities or values near float32's limits should
run with ``poolfold_nodes="all"``.  (A MaxUnpool index out of range is an error either way,
but onnxruntime's own exception, not poolfold's ValueError.)
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Mapping

import numpy as np
import onnx
from onnx import TensorProto

from . import schema
from .errors import PoolfoldError
from .partition import Shape, default_domain, every_poolfold_op

ALL = "all"
NEEDED = "needed"
CHOICES = (ALL, NEEDED)

ALL_REASON = "poolfold_nodes='all'"


def check_choice(value) -> str:
    if not isinstance(value, str) or value not in CHOICES:
        raise PoolfoldError(f"poolfold_nodes must be one of {', '.join(map(repr, CHOICES))}, "
                            f"not {value!r}")
    return value


@dataclass(frozen=True)
class NodeFacts:
    """What prepare knows of one node of poolfold's ops."""

    domain: str  # "" for ai.onnx
    op_type: str
    version: int | None  # the model's opset import for the domain
    attributes: Mapping = field(default_factory=dict)
    dtype: int | None = None  # the data input's TensorProto element type; None: unknown
    shape: Shape | None = None  # the data input's shape as inferred; None: unknown
    spatial_rank: int | None = None  # None: unknown
    indices_used: bool = False  # MaxPool's second output is read
    inferred_shape_indices: bool = False  # prepare's MaxUnpool option

    def ints(self, name: str, default: int) -> list[int]:
        value = self.attributes.get(name)
        rank = self.spatial_rank or 0
        if value is None:
            return [default] * (2 * rank if name == "pads" else rank)
        return [int(v) for v in value]

    @property
    def dtype_name(self) -> str:
        return TensorProto.DataType.Name(self.dtype).lower() if self.dtype is not None else "?"


_F16, _F32, _F64 = TensorProto.FLOAT16, TensorProto.FLOAT, TensorProto.DOUBLE

_WINDOWED = ("AveragePool", "LpPool")
_GLOBAL = ("GlobalMaxPool", "GlobalAveragePool", "GlobalLpPool")
_AVERAGING = _WINDOWED + _GLOBAL
_LP = ("LpPool", "GlobalLpPool")

# The averaging family's CPU kernels in onnxruntime 1.32, by the model's ai.onnx opset: the
# first opset with a kernel, and the first without one again (GlobalLpPool-22 has none).
_ONNXRUNTIME_OPSETS = {"AveragePool": (7, None), "LpPool": (2, None),
                       "GlobalMaxPool": (1, None), "GlobalAveragePool": (1, None),
                       "GlobalLpPool": (2, 22)}
# onnxruntime runs the averaging family's float16 nodes in float32, through Casts it inserts
# (InsertedPrecisionFreeCast), which are invalid below Cast-6 (its "to" was a string then).
_CAST_TO_INT = 6


def onnxruntime_types(op_type: str, version: int | None) -> frozenset[int]:
    """The element types onnxruntime 1.32's CPU kernels take for an ai.onnx op at the model's
    opset ``version`` (others it refuses when the session is built)."""
    if op_type == "MaxPool":
        if version is not None and version >= 12:
            return frozenset({_F16, _F32, _F64, TensorProto.INT8, TensorProto.UINT8})
        return frozenset({_F16, _F32, _F64})
    if op_type in _AVERAGING:  # no double and no bfloat16 kernel, in any version
        first, past = _ONNXRUNTIME_OPSETS[op_type]
        opset = version if version is not None else onnx.defs.onnx_opset_version()
        if opset < first or (past is not None and opset >= past):
            return frozenset()
        return frozenset({_F16, _F32}) if opset >= _CAST_TO_INT else frozenset({_F32})
    return frozenset({_F16, _F32})  # MaxUnpool (no double kernel), Col2Im (float only)


def _pads_reach_kernel(facts: NodeFacts) -> bool:
    kernel = facts.ints("kernel_shape", 0)
    pads = facts.ints("pads", 0)
    rank = len(kernel)
    return len(pads) == 2 * rank and any(
        max(pads[a], pads[a + rank]) >= kernel[a] for a in range(rank))


def _same_with_dilation(facts: NodeFacts) -> bool:
    return (str(facts.attributes.get("auto_pad", "NOTSET")).startswith("SAME")
            and any(d > 1 for d in facts.ints("dilations", 1)))


def _window_may_be_empty(facts: NodeFacts) -> bool:
    """Whether a window can hold padding only: its taps, ``d`` apart, step over the whole
    axis, which takes a dilation larger than the axis and a begin pad (with pads < kernel and
    the ceil-mode drop rule, no window lies wholly in one side's padding)."""
    if facts.dtype not in (_F16, _F32, _F64):
        return False  # integers: onnxruntime gives the type's minimum there, as poolfold
    dilations = facts.ints("dilations", 1)
    pads = facts.ints("pads", 0)
    rank = len(dilations)
    sizes = facts.shape[2:] if facts.shape is not None and len(facts.shape) == rank + 2 \
        else (None,) * rank
    return any(d > 1 and pads[a] > 0 and (not isinstance(n, int) or n < d)
               for a, (d, n) in enumerate(zip(dilations, sizes)))


def _no_channels(facts: NodeFacts) -> bool:
    return facts.shape is not None and len(facts.shape) > 1 and facts.shape[1] == 0


def _empty_spatial_axis(facts: NodeFacts) -> bool:
    return facts.shape is not None and any(n == 0 for n in facts.shape[2:])


def _empty_average(facts: NodeFacts) -> bool:
    """An AveragePool window that can hold padding only, counting its taps inside X
    (count_include_pad 0): 0 / 0."""
    return not facts.attributes.get("count_include_pad", 0) and _window_may_be_empty(facts)


def _output_shape(facts: NodeFacts) -> tuple | str | None:
    """The node's output shape from the data input's static sizes and its window attributes
    (the windows are MaxPool's); geometry's error text where none comes out; None where the
    sizes are not all known or the node is faulty otherwise (the run reports that)."""
    shape = facts.shape
    if shape is None or len(shape) < 3 or not all(isinstance(n, int) for n in shape):
        return None
    from .ops.max_pool import max_pool_shape

    window = ("strides", "pads", "dilations", "auto_pad", "ceil_mode")
    options = {k: v for k, v in facts.attributes.items() if k in window}
    try:
        return tuple(max_pool_shape(shape, facts.attributes.get("kernel_shape"), **options))
    except PoolfoldError as error:
        return str(error)
    except (TypeError, ValueError):
        return None


def _no_window_fits(facts: NodeFacts) -> bool:
    """Whether an output axis comes out < 1, told from the data input's static sizes."""
    out = _output_shape(facts)
    return isinstance(out, str) and "no window fits" in out  # geometry.py's one error


# Past these p, |x| ** p leaves float32's range (or float16's precision sinks into float32's
# subnormals) for some x of the type whose Y is representable: onnxruntime raises every |x|
# to p in float32, where poolfold scales by the window's largest |x|.  float32, p = 2:
# 2x2 of 1e20 gives inf, of 1e-25 gives 0.  float16 (run in float32): p <= 6 met the
# contract's bound for every magnitude tried (2^-24 to 65504, windows of 1 to 256), p = 7
# gives 0 for 16x16 of 2^-24, p = 9 inf for one 65504.  p = 1 only adds |x|: safe wherever Y
# is finite.
_LP_SAFE_P = {_F32: 1, _F16: 6}


def _lp_leaves_float32(facts: NodeFacts) -> bool:
    p = facts.attributes.get("p", 2)
    return facts.dtype in _LP_SAFE_P and p > _LP_SAFE_P[facts.dtype]


# A node taken out of onnxruntime's stretch cuts it in two: another session run, its inputs
# and outputs handed over, and layout reorders onnxruntime no longer fuses away.  On the
# bundled model (2 threads) that cost about 95 us a node: its two MaxPools with Indices, over
# (1, 8, 64, 64) and (1, 16, 32, 32), made "needed" take 0.33-0.37 ms against 0.22 as one
# session.  What poolfold saves on the node itself is told by its window taps (outputs times
# kernel taps): onnxruntime's time steps up where it starts sharing the work, which its cost
# model decides by them.  float32, onnxruntime's time against poolfold's: 2x2 at stride 2,
# 32768 taps 53 against 12 us, 49152 76 / 15, 57344 186 / 17, 65536 208 / 18; 3x3 at stride
# 2 with pads 1, 73728 taps 91 / 33, 110592 276 / 46, 147456 405 / 58.  So the node goes to
# poolfold from 2^16 taps, about where the step lies for both windows.
_SPLIT_PAYS = 1 << 16


def _too_small_for_a_split(facts: NodeFacts) -> bool:
    """Whether the node is known to have fewer than _SPLIT_PAYS window taps (a size only
    known at run time may be a large batch: the node goes to poolfold)."""
    out = _output_shape(facts)
    if not isinstance(out, tuple):
        return False
    return math.prod(out) * math.prod(facts.ints("kernel_shape", 1)) < _SPLIT_PAYS


@dataclass(frozen=True)
class Rule:
    """One reason a node runs on poolfold: ``applies`` to its facts; ``reason`` is formatted
    with ``op``, ``dtype``, ``rank``, ``version`` and ``p``."""

    ops: tuple[str, ...]
    applies: Callable[[NodeFacts], bool]
    reason: str


_POOL_OPS = ("MaxPool", "MaxUnpool")
_EVERY_OP = ("MaxPool", "MaxUnpool", "Col2Im") + _AVERAGING

# Checked in order; the first that applies is the node's reason.  Each was observed on
# onnxruntime 1.32 (tests/test_placement.py and tests/test_backend_averaging.py keep checking
# it).
RULES: tuple[Rule, ...] = (
    Rule(_POOL_OPS + _AVERAGING, lambda f: f.domain == schema.NHWC,
         "onnxruntime has no CPU kernel for com.ms.internal.nhwc {op} outside its own layout "
         "transformer: it refuses the node"),
    Rule(_EVERY_OP, lambda f: f.dtype is None,
         "its data type is unknown before the run"),
    Rule(_EVERY_OP,
         lambda f: f.dtype not in onnxruntime_types(f.op_type, f.version),
         "onnxruntime has no {op}-{version} kernel for {dtype}"),
    Rule(_EVERY_OP, lambda f: f.spatial_rank is None,
         "its spatial rank is unknown before the run"),
    Rule(_POOL_OPS + _AVERAGING, lambda f: f.spatial_rank > 3,
         "onnxruntime's {op} stops at 3 spatial axes (this node has {rank}): it fails when run"),
    Rule(("MaxUnpool",), lambda f: f.inferred_shape_indices,
         "inferred_shape_indices is poolfold's own reading of I"),
    # MaxPool: with strides, a wrong output shape; AveragePool, LpPool: the same shape, but
    # windows off by the missing pads.
    Rule(("MaxPool",) + _WINDOWED, _same_with_dilation,
         "onnxruntime sizes SAME padding without the dilation: wrong windows"),
    Rule(("MaxPool",) + _WINDOWED, _pads_reach_kernel,
         "onnxruntime refuses pads >= kernel_shape, which the spec allows"),
    Rule(("MaxPool",), _window_may_be_empty,
         "a dilated window can lie wholly in the padding, where onnxruntime gives the "
         "lowest finite {dtype}, not -inf"),
    Rule(("AveragePool",), _empty_average,
         "a dilated window can lie wholly in the padding, where onnxruntime's average is 0, "
         "not NaN (0 / 0 with count_include_pad = 0)"),
    Rule(_WINDOWED, _no_window_fits,
         "no window fits on an axis: onnxruntime returns an empty tensor where the spec "
         "makes it an error"),
    Rule(("MaxPool",) + _AVERAGING, _no_channels,
         "onnxruntime fails on an input with no channels (C = 0)"),
    Rule(_AVERAGING, _empty_spatial_axis,
         "onnxruntime fails on an input with a spatial axis of size 0"),
    Rule(_LP, _lp_leaves_float32,
         "onnxruntime raises |x| to p = {p} in float32, which overflows or underflows where "
         "Y is representable; poolfold scales each window"),
    # onnxruntime computes it right, but slowly: (1, 64, 224, 224), 2x2 stride 2, took 40 ms
    # there and 3.3 ms on poolfold; (8, 32, 64, 64) 6.3 ms and 0.64 ms.  Not below
    # _SPLIT_PAYS window taps, where the stretch boundaries the node makes cost more.
    Rule(("MaxPool",), lambda f: f.indices_used and not _too_small_for_a_split(f),
         "poolfold is measured faster than onnxruntime for MaxPool with Indices of 2^16 "
         "window taps or more (outputs times kernel taps; or of a size unknown before the "
         "run)"),
    # Seen wrong with C > 1 in 1-D to 4-D and with C = 1 in 3-D (dilations 2, 2, 1); right
    # in 2-D whatever C.  The rule takes every dilation outside 2-D.
    Rule(("Col2Im",),
         lambda f: f.spatial_rank != 2 and any(d > 1 for d in f.ints("dilations", 1)),
         "onnxruntime's Col2Im outside 2-D misplaces dilated blocks ({rank}-D here)"),
)


def needed_reason(facts: NodeFacts) -> str | None:
    """Why the node must run on poolfold under "needed", or None: onnxruntime runs it."""
    for rule in RULES:
        if facts.op_type in rule.ops and rule.applies(facts):
            return rule.reason.format(op=facts.op_type, dtype=facts.dtype_name,
                                      rank=facts.spatial_rank, version=facts.version,
                                      p=facts.attributes.get("p", 2))
    return None


class Placement:
    """The decision for every node of one model (see the module's docstring)."""

    def __init__(self, choice: str, opsets: Mapping[str, int],
                 types: Mapping[str, onnx.TypeProto], shapes: Mapping[str, Shape],
                 constants: Mapping[str, np.ndarray], inferred_shape_indices: bool = False):
        self.choice = check_choice(choice)
        self._opsets = opsets
        self._types = types
        self._shapes = shapes
        self._constants = constants
        self._inferred_shape_indices = inferred_shape_indices
        self._reasons: dict[tuple, str | None] = {}

    def on_poolfold(self, node: onnx.NodeProto) -> bool:
        return self.reason(node) is not None

    def reason(self, node: onnx.NodeProto) -> str | None:
        """Why the node runs on poolfold; None for a node onnxruntime runs."""
        if not every_poolfold_op(node):
            return None
        if self.choice == ALL:
            return ALL_REASON
        # A graph's outputs are unique, but a subgraph's node may repeat them: the key holds
        # the inputs and attributes too.
        key = (node.domain, node.op_type, tuple(node.input), tuple(node.output),
               node.SerializeToString())
        if key not in self._reasons:
            self._reasons[key] = needed_reason(self.facts(node))
        return self._reasons[key]

    def facts(self, node: onnx.NodeProto) -> NodeFacts:
        domain = default_domain(node.domain)
        attributes = {}
        for attribute in node.attribute:
            value = onnx.helper.get_attribute_value(attribute)
            attributes[attribute.name] = value.decode() if isinstance(value, bytes) else value
        data = node.input[0] if node.input else ""
        type_proto = self._types.get(data)
        dtype = None
        if type_proto is not None and type_proto.WhichOneof("value") == "tensor_type":
            dtype = type_proto.tensor_type.elem_type
        shape = self._shapes.get(data)
        return NodeFacts(
            domain=domain, op_type=node.op_type, version=self._opsets.get(domain),
            attributes=attributes, dtype=dtype, shape=shape,
            spatial_rank=self._spatial_rank(node, attributes, shape),
            indices_used=node.op_type == "MaxPool" and len(node.output) > 1
            and bool(node.output[1]),
            inferred_shape_indices=self._inferred_shape_indices)

    def _spatial_rank(self, node, attributes, shape) -> int | None:
        if node.op_type in _POOL_OPS + _AVERAGING:
            if "kernel_shape" in attributes:
                return len(attributes["kernel_shape"])
            return len(shape) - 2 if shape is not None and len(shape) >= 2 else None
        for name in node.input[1:3]:  # Col2Im: image_shape, block_shape hold r values each
            if name in self._constants:
                return int(np.asarray(self._constants[name]).size)
            given = self._shapes.get(name)
            if given is not None and len(given) == 1 and isinstance(given[0], int):
                return given[0]
        return None
