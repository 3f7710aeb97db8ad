"""Splitting a model's graph between poolfold's kernels and another runtime.

A node poolfold implements (:func:`poolfold.nodes.implements`) runs on its own, on poolfold's
kernels.  Every other node belongs to a *stretch*: a maximal run of consecutive other nodes,
which the backend hands to onnxruntime as one small model.  A node whose subgraphs (If, Loop,
Scan) or model-local function hold one of poolfold's nodes is a stretch of its own, which only
onnx's ReferenceEvaluator with poolfold's ops plugged in can run: onnxruntime does not know
every op poolfold runs (the nhwc MaxUnpool, 4-D pooling) and would run the others with its
own semantics.

The nodes are put in an order that keeps the stretches long: among the nodes whose inputs are
ready, the other nodes run first, all of them, before the next of poolfold's nodes; so a Shape
that only reads an encoder's tensor joins the stretch before the MaxPool, not a stretch of its
own after it.  This module only plans; :mod:`poolfold.backend` builds the sessions and runs.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from typing import Callable, Iterator, Mapping, Sequence

import onnx
from onnx import helper

from . import nodes
from .errors import PoolfoldError

POOLFOLD = "poolfold"  # one of poolfold's nodes, alone
NESTED = "nested"  # a node holding poolfold's nodes inside it, alone, on the reference
OTHER = "other"  # a stretch of other nodes

# ONNX's default domain has two spellings.
_DEFAULT_DOMAINS = ("", "ai.onnx")


def default_domain(domain: str) -> str:
    return "" if domain in _DEFAULT_DOMAINS else domain


def describe(node: onnx.NodeProto) -> str:
    """``node 'conv1' (Conv)``: how errors and warnings name a node."""
    op = f"{node.domain}.{node.op_type}" if default_domain(node.domain) else node.op_type
    return f"node {node.name!r} ({op})" if node.name else f"a {op} node (unnamed)"


def subgraphs(node: onnx.NodeProto) -> Iterator[onnx.GraphProto]:
    for attribute in node.attribute:
        if attribute.type == onnx.AttributeProto.GRAPH:
            yield attribute.g
        elif attribute.type == onnx.AttributeProto.GRAPHS:
            yield from attribute.graphs


def outer_reads(graph: onnx.GraphProto) -> set[str]:
    """The names a subgraph reads from the scopes around it."""
    defined = {v.name for v in graph.input} | {t.name for t in graph.initializer}
    defined |= {t.values.name for t in graph.sparse_initializer}
    reads: set[str] = set()
    for node in graph.node:
        reads.update(name for name in node_reads(node) if name not in defined)
        defined.update(node.output)
    reads.update(v.name for v in graph.output if v.name not in defined)
    return reads


def node_reads(node: onnx.NodeProto) -> list[str]:
    """Every value a node reads: its inputs and what its subgraphs read from outside them."""
    reads = [name for name in node.input if name]
    for graph in subgraphs(node):
        reads.extend(sorted(outer_reads(graph) - set(reads)))
    return reads


Functions = Mapping[tuple[str, str], onnx.FunctionProto]  # (domain, name) -> local function

# Whether a node runs on poolfold's kernels: by default every node of poolfold's ops does
# (prepare's ``poolfold_nodes="all"``); :mod:`poolfold.placement` decides for "needed".
OnPoolfold = Callable[[onnx.NodeProto], bool]


def every_poolfold_op(node: onnx.NodeProto) -> bool:
    return nodes.implements(default_domain(node.domain), node.op_type)


def holds_poolfold_nodes(node: onnx.NodeProto, functions: Functions = {},
                         on_poolfold: OnPoolfold = every_poolfold_op) -> bool:
    """Whether a node that runs on poolfold is inside the node: in its subgraphs, or in the
    body of the model-local function it calls (``functions``: (domain, name) -> function)."""
    bodies = [list(graph.node) for graph in subgraphs(node)]
    function = functions.get((node.domain, node.op_type))
    if function is not None:
        bodies.append(list(function.node))
    return any(
        on_poolfold(inner) or holds_poolfold_nodes(inner, functions, on_poolfold)
        for body in bodies for inner in body
    )


def kind_of(node: onnx.NodeProto, functions: Functions = {},
            on_poolfold: OnPoolfold = every_poolfold_op) -> str:
    if on_poolfold(node):
        return POOLFOLD
    return NESTED if holds_poolfold_nodes(node, functions, on_poolfold) else OTHER


@dataclass
class Step:
    """One of poolfold's nodes (``kind`` POOLFOLD), or a stretch of other nodes (OTHER, or
    NESTED for the single node that must run on the reference evaluator).  ``inputs`` are the
    values it reads from graph inputs and earlier steps (initializers excluded: a stretch
    carries the ones it uses); ``outputs`` the values later steps or the graph's outputs read."""

    kind: str
    nodes: list[onnx.NodeProto]
    inputs: list[str] = field(default_factory=list)
    outputs: list[str] = field(default_factory=list)
    constants: list[str] = field(default_factory=list)  # initializers it reads


def plan(graph: onnx.GraphProto, functions: Sequence[onnx.FunctionProto] = (),
         on_poolfold: OnPoolfold = every_poolfold_op) -> list[Step]:
    """The graph's nodes as an ordered list of steps (see the module's docstring);
    ``functions`` are the model's local functions; ``on_poolfold`` says which nodes of
    poolfold's ops run on poolfold (the others join the stretches)."""
    constants = {t.name for t in graph.initializer}
    constants |= {t.values.name for t in graph.sparse_initializer}
    available = {v.name for v in graph.input} | constants
    producer: dict[str, int] = {}
    for index, node in enumerate(graph.node):
        for name in node.output:
            if name:
                producer[name] = index
    reads = [node_reads(node) for node in graph.node]
    by_name = {(f.domain, f.name): f for f in functions}
    kinds = [kind_of(node, by_name, on_poolfold) for node in graph.node]
    waiting = [0] * len(graph.node)
    readers: list[list[int]] = [[] for _ in graph.node]
    for index, (node, names) in enumerate(zip(graph.node, reads)):
        for name in dict.fromkeys(names):
            if name in producer:
                waiting[index] += 1
                readers[producer[name]].append(index)
            elif name not in available:
                raise PoolfoldError(
                    f"{describe(node)} reads '{name}', which no node, graph input or "
                    f"initializer gives"
                )
    ready: dict[bool, list[int]] = {True: [], False: []}  # stretchable? -> heap of indices
    for index, count in enumerate(waiting):
        if count == 0:
            heapq.heappush(ready[kinds[index] == OTHER], index)

    order: list[Step] = []

    def emit(index: int) -> None:
        for reader in readers[index]:
            waiting[reader] -= 1
            if waiting[reader] == 0:
                heapq.heappush(ready[kinds[reader] == OTHER], reader)

    emitted = 0
    while ready[True] or ready[False]:
        if ready[True]:
            stretch = Step(OTHER, [])
            while ready[True]:
                index = heapq.heappop(ready[True])
                stretch.nodes.append(graph.node[index])
                emit(index)
                emitted += 1
            order.append(stretch)
        while ready[False]:
            index = heapq.heappop(ready[False])
            order.append(Step(kinds[index], [graph.node[index]]))
            emit(index)
            emitted += 1
    if emitted != len(graph.node):
        stuck = next(node for node, count in zip(graph.node, waiting) if count)
        raise PoolfoldError(f"the graph has a cycle through {describe(stuck)}")
    folded = _fold_constants_into_readers(graph, order, kinds, producer, constants)

    # What each step reads and what it must hand on.
    needed_later: set[str] = {v.name for v in graph.output}
    for step in reversed(order):
        if step.kind == OTHER:
            step.nodes = _without_unread_constants(step.nodes, folded, needed_later)
        produced = {name for node in step.nodes for name in node.output if name}
        step.outputs = [name for node in step.nodes for name in node.output
                        if name and name in needed_later]
        step_reads = dict.fromkeys(name for node in step.nodes for name in node_reads(node)
                                   if name not in produced)
        step.inputs = [name for name in step_reads if name not in constants]
        step.constants = [name for name in step_reads if name in constants]
        needed_later |= set(step_reads)
    # A stretch none of whose values anyone reads is dead code: drop it.  (One of poolfold's
    # nodes always runs, so that its errors are not skipped.)
    return [step for step in order if step.outputs or step.kind == POOLFOLD]


# Ops whose output changes from run to run although they read no data.
_NONDETERMINISTIC = {"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike",
                     "Multinomial", "Bernoulli"}


def _fold_constants_into_readers(graph: onnx.GraphProto, order: list[Step], kinds: list[str],
                                 producer: Mapping[str, int], constants: set[str]) -> set[str]:
    """Give each stretch its own copy of the constant nodes it reads (a Constant, an Identity
    or a Reshape of an initializer...), so that its session sees a constant it can fold,
    instead of an input: onnxruntime prepacks, fuses and lays out (NCHWc) a Conv only when its
    weights and bias are constants.  torch.onnx.export shares equal tensors through Identity
    nodes (resnet18: 16 of its Conv biases); scheduled as they were, those ran in the first
    stretch and reached the one after the MaxPool as inputs, and 16 of its 19 Convs stayed
    in plain NCHW: 1.24x onnxruntime's CPU time single-threaded, 1.0x with the copies."""
    foldable: dict[int, bool] = {}

    def is_foldable(index: int) -> bool:
        if index not in foldable:
            node = graph.node[index]
            foldable[index] = False  # a cycle guard; plan() has ruled cycles out
            foldable[index] = (
                kinds[index] == OTHER and node.op_type not in _NONDETERMINISTIC
                and not any(True for _ in subgraphs(node))
                and all(name in constants or (name in producer and is_foldable(producer[name]))
                        for name in node.input if name))
        return foldable[index]

    for step in order:
        if step.kind != OTHER:
            continue
        produced = {name for node in step.nodes for name in node.output}
        wanted: set[int] = set()
        pending = [name for node in step.nodes for name in node_reads(node)
                   if name not in produced and name in producer]
        while pending:
            index = producer[pending.pop()]
            if index in wanted or not is_foldable(index):
                continue
            wanted.add(index)
            pending.extend(name for name in graph.node[index].input
                           if name in producer and name not in produced)
        if wanted:
            step.nodes[:0] = [graph.node[index] for index in sorted(wanted)]
    return {name for index, is_constant in foldable.items() if is_constant
            for name in graph.node[index].output if name}


def _without_unread_constants(step_nodes: list[onnx.NodeProto], folded: set[str],
                              needed_later: set[str]) -> list[onnx.NodeProto]:
    """The stretch's nodes less the constant nodes (``folded``: their outputs) whose values
    neither the stretch nor a later step reads: the copies its readers now carry made them
    dead here."""
    if not folded:
        return step_nodes
    wanted = set(needed_later)
    kept: list[onnx.NodeProto] = []
    for node in reversed(step_nodes):
        constant = bool(node.output) and node.output[0] in folded
        if constant and not any(name in wanted for name in node.output):
            continue
        kept.append(node)
        wanted.update(node_reads(node))
    return kept[::-1]


# onnxruntime's names of element types ("float", "int64", "bfloat16") -> onnx's numbers
_TENSOR_TYPES = {name.lower(): value for name, value in onnx.TensorProto.DataType.items()}


def type_from_ort(text: str) -> onnx.TypeProto | None:
    """onnxruntime's type string (``tensor(float)``) as a TypeProto without a shape."""
    if text.startswith("tensor(") and text.endswith(")"):
        elem = _TENSOR_TYPES.get(text[len("tensor("):-1])
        if elem is not None:
            return helper.make_tensor_type_proto(elem, None)
    return None


# An initializer up to this size is small enough to copy around: shape inference reads it (a
# Reshape's target shape), and a stretch's model embeds it.  Larger ones are weights, which
# neither inference nor a stretch's model copies (vgg11's 500 MB took 10 s through onnx's
# shape inference alone).
SMALL_INITIALIZER_BYTES = 64 * 2**10


def is_small(tensor: onnx.TensorProto) -> bool:
    """Whether the initializer holds at most SMALL_INITIALIZER_BYTES, told from its dims and
    type (protobuf's ByteSize serialises the tensor to count: 5 s over vgg11's weights)."""
    count = 1
    for dim in tensor.dims:
        count *= dim
    try:
        itemsize = helper.tensor_dtype_to_np_dtype(tensor.data_type).itemsize
    except (KeyError, TypeError, ValueError):
        itemsize = 0
    if tensor.data_type == onnx.TensorProto.STRING or itemsize == 0:
        itemsize = 16  # a guess: strings have no fixed size
    return count * itemsize <= SMALL_INITIALIZER_BYTES


def _skeleton(model: onnx.ModelProto) -> onnx.ModelProto:
    """The model with its large initializers turned into typed graph inputs: what shape
    inference needs, without the weights."""
    graph = model.graph
    light = onnx.GraphProto(name=graph.name)
    light.node.extend(graph.node)
    light.input.extend(graph.input)
    light.output.extend(graph.output)
    light.value_info.extend(graph.value_info)
    light.sparse_initializer.extend(graph.sparse_initializer)
    declared = {v.name for v in graph.input}
    for tensor in graph.initializer:
        if is_small(tensor) and tensor.data_location != onnx.TensorProto.EXTERNAL:
            light.initializer.append(tensor)
        elif tensor.name not in declared:
            light.input.append(helper.make_tensor_value_info(tensor.name, tensor.data_type,
                                                             tensor.dims))
    skeleton = helper.make_model(light, opset_imports=model.opset_import,
                                 functions=model.functions)
    skeleton.ir_version = model.ir_version
    return skeleton


Shape = tuple  # of int (a static dim), str (a named one) or None (unknown)


def shape_of(type_proto: onnx.TypeProto) -> Shape | None:
    if type_proto.WhichOneof("value") != "tensor_type" or \
            not type_proto.tensor_type.HasField("shape"):
        return None
    return tuple(d.dim_value if d.HasField("dim_value") else (d.dim_param or None)
                 for d in type_proto.tensor_type.shape.dim)


def known_types(model: onnx.ModelProto) -> tuple[dict[str, onnx.TypeProto], dict[str, Shape]]:
    """The types onnx's shape inference (and the model's own value_info) give the graph's
    values, without their shapes (a shape from onnx's inference could be stricter than what
    poolfold's ops produce), and, apart, the shapes inference gives: hints for deciding where
    a node runs, never declared to a session."""
    try:
        inferred = onnx.shape_inference.infer_shapes(_skeleton(model), strict_mode=False)
    except Exception:  # inference is a help, not a requirement
        inferred = model
    graph = inferred.graph
    types: dict[str, onnx.TypeProto] = {}
    shapes: dict[str, Shape] = {}
    for value in [*model.graph.value_info, *graph.value_info, *graph.input, *graph.output]:
        if value.type.WhichOneof("value") is not None and value.name not in types:
            types[value.name] = without_shape(value.type)
            shape = shape_of(value.type)
            if shape is not None:
                shapes[value.name] = shape
    for tensor in model.graph.initializer:
        types.setdefault(tensor.name, helper.make_tensor_type_proto(tensor.data_type, None))
        shapes.setdefault(tensor.name, tuple(tensor.dims))
    return {name: t for name, t in types.items() if _complete(t)}, shapes


def without_shape(type_proto: onnx.TypeProto) -> onnx.TypeProto:
    copy = onnx.TypeProto()
    copy.CopyFrom(type_proto)
    if copy.WhichOneof("value") == "tensor_type":
        copy.tensor_type.ClearField("shape")
    return copy


def _complete(type_proto: onnx.TypeProto) -> bool:
    which = type_proto.WhichOneof("value")
    if which == "tensor_type":
        return type_proto.tensor_type.elem_type != onnx.TensorProto.UNDEFINED
    if which == "sequence_type":
        return _complete(type_proto.sequence_type.elem_type)
    if which == "optional_type":
        return _complete(type_proto.optional_type.elem_type)
    return which is not None


def poolfold_output_types(node: onnx.NodeProto, types: dict[str, onnx.TypeProto]) -> None:
    """What one of poolfold's nodes gives: its data input's type, and int64 Indices."""
    data = types.get(node.input[0]) if node.input else None
    for position, name in enumerate(node.output):
        if not name or name in types:
            continue
        if position == 1:  # MaxPool's Indices
            types[name] = helper.make_tensor_type_proto(onnx.TensorProto.INT64, None)
        elif data is not None:
            types[name] = without_shape(data)
