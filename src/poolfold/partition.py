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
from typing import Iterator, Mapping, Sequence

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


def holds_poolfold_nodes(node: onnx.NodeProto, functions: Functions = {}) -> bool:
    """Whether one of poolfold's nodes is inside the node: in its subgraphs, or in the body of
    the model-local function it calls (``functions``: (domain, name) -> function)."""
    bodies = [list(graph.node) for graph in subgraphs(node)]
    function = functions.get((node.domain, node.op_type))
    if function is not None:
        bodies.append(list(function.node))
    return any(
        nodes.implements(default_domain(inner.domain), inner.op_type)
        or holds_poolfold_nodes(inner, functions)
        for body in bodies for inner in body
    )


def kind_of(node: onnx.NodeProto, functions: Functions = {}) -> str:
    if nodes.implements(default_domain(node.domain), node.op_type):
        return POOLFOLD
    return NESTED if holds_poolfold_nodes(node, functions) else OTHER


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


def plan(graph: onnx.GraphProto, functions: Sequence[onnx.FunctionProto] = ()) -> list[Step]:
    """The graph's nodes as an ordered list of steps (see the module's docstring);
    ``functions`` are the model's local functions."""
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
    kinds = [kind_of(node, by_name) for node in graph.node]
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

    # What each step reads and what it must hand on.
    needed_later: set[str] = {v.name for v in graph.output}
    for step in reversed(order):
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


# onnxruntime's names of element types ("float", "int64", "bfloat16") -> onnx's numbers
_TENSOR_TYPES = {name.lower(): value for name, value in onnx.TensorProto.DataType.items()}


def type_from_ort(text: str) -> onnx.TypeProto | None:
    """onnxruntime's type string (``tensor(float)``) as a TypeProto without a shape."""
    if text.startswith("tensor(") and text.endswith(")"):
        elem = _TENSOR_TYPES.get(text[len("tensor("):-1])
        if elem is not None:
            return helper.make_tensor_type_proto(elem, None)
    return None


def known_types(model: onnx.ModelProto) -> dict[str, onnx.TypeProto]:
    """The types onnx's shape inference (and the model's own value_info) give the graph's
    values, shapes removed: a stretch's inputs need their element type, and a shape taken from
    inference could be stricter than what poolfold's ops produce."""
    try:
        inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False)
    except Exception:  # inference is a help, not a requirement
        inferred = model
    graph = inferred.graph
    types: dict[str, onnx.TypeProto] = {}
    for value in [*model.graph.value_info, *graph.value_info, *graph.input, *graph.output]:
        if value.type.WhichOneof("value") is not None and value.name not in types:
            types[value.name] = without_shape(value.type)
    for tensor in graph.initializer:
        types.setdefault(tensor.name, helper.make_tensor_type_proto(tensor.data_type, None))
    return {name: t for name, t in types.items() if _complete(t)}


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
