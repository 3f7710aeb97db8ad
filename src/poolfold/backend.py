"""An ONNX backend (in the shape of ``onnxruntime.backend``) that runs any model.

MaxPool, MaxUnpool, Col2Im, the averaging family (AveragePool, LpPool, GlobalMaxPool,
GlobalAveragePool, GlobalLpPool) and the com.ms.internal.nhwc ops run on poolfold's kernels
(with ``poolfold_nodes="needed"``, only those :mod:`poolfold.placement` says onnxruntime cannot
run right).  Every other node runs on onnxruntime when it is installed: :mod:`poolfold.partition`
splits the graph into poolfold's nodes and maximal stretches of other nodes, and each stretch
becomes one onnxruntime ``InferenceSession``, built once by ``prepare``.  Without onnxruntime (or with
``other_ops="reference"``) the other nodes run on onnx's ReferenceEvaluator, into which
poolfold's ops are plugged.  Each node runs at the version the model's opset imports give its
domain.

>>> import poolfold.backend as backend
>>> rep = backend.prepare(model)                 # doctest: +SKIP
>>> outputs = rep.run([x])                       # doctest: +SKIP
>>> outputs = backend.run_model(model, [x])      # doctest: +SKIP
"""

from __future__ import annotations

import os
import warnings
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import onnx
from onnx import TensorProto, helper
from onnx.backend.base import Backend, BackendRep, namedtupledict
from onnx.reference import ReferenceEvaluator

from . import blocked, nodes, partition, placement, reference, schema, session_ops
from .errors import PoolfoldError, PoolfoldTypeError
from .kernels.threads import park_spinning_threads

ONNXRUNTIME = "onnxruntime"
REFERENCE = "reference"
OTHER_OPS = (ONNXRUNTIME, REFERENCE)

# prepare()'s keywords for onnxruntime, passed to its sessions as they are.
_SESSION_KEYWORDS = ("session_options", "providers", "provider_options",
                     "intra_op_num_threads", "inter_op_num_threads")


class FallbackWarning(UserWarning):
    """onnxruntime refused part of a model, which runs on onnx's ReferenceEvaluator instead."""


def onnxruntime_available() -> bool:
    try:
        import onnxruntime  # noqa: F401
    except ImportError:
        return False
    return True


class PoolfoldRep(BackendRep):
    """A prepared model: ``run`` takes the inputs as a list (graph input order, initializers
    excluded) or a dict, and returns the outputs in graph output order.

    ``other_ops`` says what runs the nodes poolfold does not implement: ``"onnxruntime"`` or
    ``"reference"``; ``poolfold_nodes`` which of poolfold's nodes run on poolfold (see
    :mod:`poolfold.placement`).  ``steps`` lists, in running order, each node that runs on
    poolfold and each stretch of other nodes: its ``nodes``, its ``runner`` (``"poolfold"``,
    ``"onnxruntime"`` or ``"reference"``), its ``session`` (None for poolfold's nodes) and
    its ``reason`` (why a node runs on poolfold; None for a stretch); :meth:`describe` says
    it in words.  With
    ``other_ops="reference"`` it is one step, the whole model on the reference evaluator.
    ``constants`` holds the initializers poolfold's nodes or the graph's outputs read (the
    sessions carry their own).  ``one_session``: whether the whole model runs as one
    onnxruntime session with poolfold's nodes inside it as custom ops (each stretch's
    ``session`` is then that one; see :mod:`poolfold.session_ops`)."""

    def __init__(self, model: onnx.ModelProto, inferred_shape_indices: bool = False,
                 other_ops: str = REFERENCE, session: dict | None = None,
                 poolfold_nodes: str = placement.ALL, folder: str | None = None,
                 one_session: bool = True):
        self.model = model
        self.other_ops = other_ops
        self.poolfold_nodes = poolfold_nodes
        initializers = {i.name for i in model.graph.initializer}
        self.input_names = [i.name for i in model.graph.input if i.name not in initializers]
        self.output_names = [o.name for o in model.graph.output]
        self._outputs = namedtupledict("Outputs", self.output_names)
        self._ops = reference.make_ops(inferred_shape_indices=inferred_shape_indices)
        self.constants: dict[str, np.ndarray] = {}
        if other_ops == REFERENCE:
            if any(t.data_location == TensorProto.EXTERNAL for t in model.graph.initializer):
                onnx.external_data_helper.load_external_data_for_model(model, folder or "")
            self._session = _reference_evaluator(model, model.graph.node, self._ops)
            self.steps = [_WholeModel(list(model.graph.node), self._session)]
            self.one_session = False
            return
        self._weights = _Weights(model, folder)  # the sessions read them: kept as long
        self.steps, self._session = _build_steps(
            model, inferred_shape_indices, self._ops, session or {}, self.constants,
            self._weights, poolfold_nodes, one_session)
        self.one_session = self._session is not None
        self._released = _last_reads(self.steps, set(self.output_names))

    def describe(self) -> str:
        """What runs where, one line per step: the runner, its nodes, and for each node of
        poolfold's ops the reason it runs on poolfold or that it is left to onnxruntime."""
        lines = []
        if self.one_session:
            lines.append("one onnxruntime session runs the model; poolfold's nodes run inside "
                         "it, called back as custom ops:")
        for number, step in enumerate(self.steps, 1):
            if step.runner == "poolfold":
                lines.append(f"{number}. poolfold: {partition.describe(step.nodes[0])}: "
                             f"{step.reason}")
                continue
            ops = sorted({n.op_type for n in step.nodes})
            kept = [partition.describe(n) for n in step.nodes if partition.every_poolfold_op(n)]
            line = (f"{number}. {step.runner}: {len(step.nodes)} node(s) "
                    f"({', '.join(ops[:6])}{', ...' if len(ops) > 6 else ''})")
            if kept:
                line += f"; left to {step.runner}: {', '.join(kept)}"
            lines.append(line)
        return "\n".join(lines)

    def run(self, inputs: Any, **kwargs: Any) -> tuple[Any, ...]:
        if isinstance(inputs, Mapping):
            feeds = dict(inputs)
        else:
            if isinstance(inputs, np.ndarray):
                inputs = [inputs]
            inputs = list(inputs)
            if len(inputs) != len(self.input_names):
                raise PoolfoldError(
                    f"the model has {len(self.input_names)} inputs "
                    f"({', '.join(self.input_names)}), got {len(inputs)}"
                )
            feeds = dict(zip(self.input_names, inputs))
        unknown = sorted(set(feeds) - set(self.input_names))
        if unknown:
            raise PoolfoldError(
                f"unknown input(s) {', '.join(unknown)}; the model's inputs are "
                f"{', '.join(self.input_names)}"
            )
        try:
            return self._run(feeds)
        except (TypeError, ValueError) as error:
            # onnx's evaluator re-raises an op's TypeError as its own "Issues with types";
            # poolfold's message, which names the node's op and attribute, is the useful one.
            cause = error.__cause__ or error.__context__
            if isinstance(cause, (PoolfoldError, PoolfoldTypeError)):
                raise cause from None
            raise

    def _run(self, feeds: dict) -> tuple[Any, ...]:
        if self._session is not None and not self.one_session:
            return self._outputs(*self._session.run(None, feeds))
        missing = [name for name in self.input_names if name not in feeds]
        if missing:
            raise PoolfoldError(f"missing input(s) {', '.join(missing)}")
        # onnxruntime takes arrays, not numpy's scalars (the reference evaluator takes both)
        feeds = {name: np.asarray(value) if isinstance(value, (np.generic, int, float))
                 else value for name, value in feeds.items()}
        if self.one_session:
            return self._outputs(*self._session.run(None, feeds))
        values = dict(self.constants)
        values.update(feeds)
        for step, released in zip(self.steps, self._released):
            step.run(values)
            for name in released:  # an intermediate no later step reads: free it now
                values.pop(name, None)
        return self._outputs(*[values[name] for name in self.output_names])


def _last_reads(steps: list, kept: set[str]) -> list[list[str]]:
    """For each step, the values to drop after it: those it is the last to read, and those it
    writes that no one reads (graph outputs are kept)."""
    last: dict[str, int] = {}
    for index, step in enumerate(steps):
        for name in step.reads:
            last[name] = index
    released: list[list[str]] = [[] for _ in steps]
    for index, step in enumerate(steps):
        released[index] += [name for name in step.writes if name not in last and name not in kept]
    for name, index in last.items():
        if name not in kept:
            released[index].append(name)
    return released


# ------------------------------------------------------------------------------ the steps

class _PoolfoldStep:
    """One of poolfold's nodes, its version and attributes checked once, by prepare."""

    runner = "poolfold"
    session = None

    def __init__(self, node: onnx.NodeProto, opsets: Mapping[str, int],
                 inferred_shape_indices: bool, reason: str | None = None):
        self.nodes = [node]
        self.reason = reason  # why this node runs on poolfold (see poolfold.placement)
        domain = partition.default_domain(node.domain)
        opset = opsets.get(domain)
        if opset is None:
            raise PoolfoldError(f"{partition.describe(node)}: the model imports no opset for "
                                f"domain {domain or 'ai.onnx'!r}")
        self._run = nodes.bind(domain, node.op_type, opset, nodes.attributes_of(node),
                               node.output, inferred_shape_indices,
                               input_count=len(node.input))
        self.output_names = schema.resolve(node.op_type, opset, domain).outputs
        self._inputs = list(node.input)
        self._outputs = list(node.output)  # "" for an omitted output, which is not kept
        self.reads = [name for name in node.input if name]
        self.writes = [name for name in node.output if name]

    def call(self, inputs: Sequence) -> list:
        """The node's outputs for its inputs (None for an omitted one)."""
        return self._run(inputs)

    def run(self, values: dict) -> None:
        results = self._run([values[name] if name else None for name in self._inputs])
        for name, value in zip(self._outputs, results):
            if name:
                values[name] = value


class _StretchStep:
    """A stretch of other nodes: one onnxruntime session, or one ReferenceEvaluator.

    A stretch whose input types nothing tells before the run (onnx's inference stops at an op
    it does not know) gets its session on the first run, typed from the arrays it is fed.

    The session is told its inputs' shapes where prepare knows them (the graph's declared
    inputs, what earlier sessions infer, what poolfold's geometry gives its nodes): without
    them onnxruntime does not fuse a Conv with the Add and Relu after it (it must know the
    Add's inputs are of one shape): resnet18's stretch after its MaxPool kept 8 Adds and 8
    Relus of its own and ran about 5% slower single-threaded.  A session that then refuses
    the arrays it is fed (a model fed other shapes than it declares) is built again without
    them."""

    runner = ONNXRUNTIME
    reason = None

    def __init__(self, step: partition.Step, sessions: "_Sessions", types: dict,
                 refused: list[str], shapes: dict):
        self.nodes = step.nodes
        self._step = step
        self._inputs = self.reads = step.inputs
        self._outputs = self.writes = step.outputs
        self._sessions = sessions
        self._types = types
        self._shaped = any(name in shapes for name in step.inputs)
        self.session = None
        if step.kind == partition.NESTED:
            self.session, self.runner = sessions.reference(step, types), REFERENCE
        elif all(name in types for name in step.inputs):
            self._build(types, refused, shapes)
        else:
            sessions.check_known(step)

    def _build(self, types: dict, refused: list[str], shapes: Mapping = {}) -> None:
        self.session, reason = self._sessions.onnxruntime(self._step, types, shapes)
        if self.session is None:
            refused.append(f"{', '.join(partition.describe(n) for n in self.nodes[:3])}"
                           f"{' ...' if len(self.nodes) > 3 else ''}: {reason}")
            self.session, self.runner = self._sessions.reference(self._step, types), REFERENCE

    def run(self, values: dict) -> None:
        feeds = {name: values[name] for name in self._inputs}
        if self.session is None:
            refused: list[str] = []
            self._build(_runtime_types(feeds), refused)
            _warn_refused(refused, stacklevel=4)
        # poolfold's idle threads would spin on through the stretch, taking its cores
        park_spinning_threads()
        try:
            results = self.session.run(self._outputs, feeds)
        except Exception as error:
            if not (self._shaped and self.runner == ONNXRUNTIME and _shape_refusal(error)):
                raise
            self._shaped = False
            refused = []
            self._build(self._types, refused)
            _warn_refused(refused, stacklevel=4)
            results = self.session.run(self._outputs, feeds)
        values.update(zip(self._outputs, results))


def _shape_refusal(error: Exception) -> bool:
    """Whether onnxruntime refused a feed for its shape ("Got invalid dimensions")."""
    return "dimensions" in str(error) and "INVALID_ARGUMENT" in str(error)


def _runtime_types(feeds: Mapping[str, Any]) -> dict[str, onnx.TypeProto]:
    """The tensor types of the arrays fed (a value of another kind stays untyped, and
    onnxruntime then refuses the stretch)."""
    types = {}
    for name, value in feeds.items():
        if isinstance(value, np.ndarray):
            try:
                elem = helper.np_dtype_to_tensor_dtype(value.dtype)
            except (KeyError, TypeError, ValueError):
                continue
            types[name] = helper.make_tensor_type_proto(elem, None)
    return types


class _WholeModel:
    """``other_ops="reference"``: the whole model on one ReferenceEvaluator."""

    runner = REFERENCE
    reason = None

    def __init__(self, graph_nodes, session):
        self.nodes = graph_nodes
        self.session = session

    def run(self, values: dict) -> None:
        feeds = {name: values[name] for name in self.session.input_names}
        values.update(zip(self.session.output_names, self.session.run(None, feeds)))


def _opsets(model: onnx.ModelProto) -> dict[str, int]:
    return {partition.default_domain(o.domain): o.version for o in model.opset_import}


def _stretch_model(model: onnx.ModelProto, step: partition.Step,
                   types: Mapping[str, onnx.TypeProto], initializers: list[onnx.TensorProto],
                   shapes: Mapping[str, partition.Shape] = {}) -> onnx.ModelProto:
    """A model of the stretch's nodes alone: its inputs typed from ``types`` (untyped where
    unknown) and shaped from ``shapes`` where known, ``initializers`` for the ones it reads,
    the model's opsets, IR version and functions."""
    def value(name, shape=None):
        if name in types:
            type_proto = types[name]
            if shape is not None and type_proto.WhichOneof("value") == "tensor_type":
                return helper.make_tensor_value_info(name, type_proto.tensor_type.elem_type,
                                                     list(shape))
            return helper.make_value_info(name, type_proto)
        return helper.make_empty_tensor_value_info(name)

    used = set(step.constants)
    graph = helper.make_graph(
        step.nodes, f"{model.graph.name}_stretch",
        [value(name, shapes.get(name)) for name in step.inputs],
        [value(name) for name in step.outputs],
        initializers,
        sparse_initializer=[t for t in model.graph.sparse_initializer if t.values.name in used],
    )
    stretch = helper.make_model(graph, opset_imports=model.opset_import,
                                functions=model.functions)
    stretch.ir_version = model.ir_version
    return stretch


def _reference_evaluator(model: onnx.ModelProto, graph_nodes, ops) -> ReferenceEvaluator:
    """onnx's evaluator with poolfold's ops; an op it does not know is a PoolfoldError that
    names the node."""
    try:
        return ReferenceEvaluator(model, new_ops=ops)
    except Exception as error:
        unknown = _unknown_node(model, graph_nodes)
        if unknown is not None:
            raise _unknown_op_error(unknown) from None
        raise PoolfoldError(f"onnx's reference evaluator cannot run the model: "
                            f"{_first_line(error)}") from error


def _unknown_op_error(node: onnx.NodeProto) -> PoolfoldError:
    return PoolfoldError(f"{partition.describe(node)}: no implementation of this op: neither "
                         f"poolfold, onnxruntime nor onnx's reference evaluator knows it")


def _unknown_node(model: onnx.ModelProto, graph_nodes) -> onnx.NodeProto | None:
    """The first node (subgraphs included) whose op has no schema, local function or poolfold
    kernel at the model's opset."""
    opsets = _opsets(model)
    functions = {(f.domain, f.name) for f in model.functions}

    def known(node):
        domain = partition.default_domain(node.domain)
        if nodes.implements(domain, node.op_type) or (node.domain, node.op_type) in functions:
            return True
        version = opsets.get(domain)
        return version is not None and onnx.defs.has(node.op_type, version, domain)

    def search(graph_nodes):
        for node in graph_nodes:
            if not known(node):
                return node
            for graph in partition.subgraphs(node):
                found = search(graph.node)
                if found is not None:
                    return found
        return None

    return search(graph_nodes)


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


# onnxruntime's session setting: its threads stop spinning when the last run returns
STOP_SPINNING = "session.force_spinning_stop"


def _session_options(options: Mapping[str, Any], between_kernels: bool = True):
    """onnxruntime's SessionOptions and providers from prepare()'s keywords;
    ``between_kernels``: poolfold's kernels run between the sessions."""
    import onnxruntime

    threads = {k: options[k] for k in ("intra_op_num_threads", "inter_op_num_threads")
               if options.get(k) is not None}
    given = options.get("session_options")
    if given is not None and threads:
        raise PoolfoldError("give the thread counts in session_options or as keywords, not both")
    if given is None:
        given = onnxruntime.SessionOptions()
        given.log_severity_level = 3  # a refused stretch is reported once, by poolfold
        if between_kernels:
            # onnxruntime's idle threads spin after each run, waiting for more work; between
            # stretches that work is poolfold's kernels, whose threads they then slow down
            # (on 2 busy cores, the bundled model took 0.4 s a run with spinning, 34 ms
            # without).  So they stop spinning when a stretch's run returns, but spin
            # between its own nodes as in one session, where spinning off altogether wakes
            # each node's threads from sleep.  Measured, googlenet and squeezenet: the same
            # within 3% on a quiet machine; their stretches 8-10% faster with the load
            # average at 1.3-1.4.  A model that is one session alone keeps onnxruntime's
            # default.
            given.add_session_config_entry(STOP_SPINNING, "1")
        for name, count in threads.items():
            setattr(given, name, int(count))
    providers = options.get("providers") or ["CPUExecutionProvider"]
    return given, providers, options.get("provider_options")


# The element types numpy, and so onnxruntime's Python API, can hand over.
_EXCHANGEABLE = frozenset(
    getattr(TensorProto, name) for name in (
        "FLOAT", "DOUBLE", "FLOAT16", "INT8", "INT16", "INT32", "INT64", "UINT8", "UINT16",
        "UINT32", "UINT64", "BOOL", "STRING", "COMPLEX64", "COMPLEX128"))


def _unexchangeable(type_proto: onnx.TypeProto | None) -> str | None:
    """The name of a tensor type numpy cannot hold (bfloat16, float8...), else None."""
    if type_proto is None or type_proto.WhichOneof("value") != "tensor_type":
        return None
    elem = type_proto.tensor_type.elem_type
    return None if elem in _EXCHANGEABLE else TensorProto.DataType.Name(elem).lower()


class _Weights:
    """The model's initializers, each read once and shared from there.  Weights in an
    external-data file of a model read from a path stay there: each session reads its own
    from the file, as onnxruntime does for the whole model, and poolfold's nodes map them
    (``np.memmap``).  Weights in the model are read into one array each, which poolfold's
    nodes use and every session takes by reference (``add_external_initializers``) instead
    of a copy serialised into its model.  On vgg11 (500 MB of weights, 11 stretches) prepare
    went from 16-24 s (each stretch's model serialised with its weights, onnx's shape
    inference over all of them) to 1.8-2.1 s, where onnxruntime's own session takes
    1.0-1.5 s."""

    def __init__(self, model: onnx.ModelProto, folder: str | None):
        self._tensors = {t.name: t for t in model.graph.initializer}
        self.folder = folder  # where a model read from a path keeps its external data
        self._arrays: dict[str, np.ndarray] = {}
        self._ort_values: dict[str, Any] = {}

    def array(self, name: str) -> np.ndarray:
        if name not in self._arrays:
            tensor = self._tensors[name]
            if tensor.data_location == TensorProto.EXTERNAL:
                self._arrays[name] = self._mapped(tensor)
            else:
                self._arrays[name] = onnx.numpy_helper.to_array(tensor)
        return self._arrays[name]

    def _mapped(self, tensor: onnx.TensorProto) -> np.ndarray:
        info = {entry.key: entry.value for entry in tensor.external_data}
        path = os.path.join(self.folder or "", info.get("location", ""))
        try:
            dtype = helper.tensor_dtype_to_np_dtype(tensor.data_type)
            if tensor.data_type in (TensorProto.STRING,) or dtype.itemsize == 0:
                raise TypeError("not a fixed-size type")
            count = int(np.prod(tensor.dims, dtype=np.int64))
            if count == 0:
                return np.zeros(tuple(tensor.dims), dtype)
            return np.memmap(path, dtype=dtype, mode="r", offset=int(info.get("offset", 0)),
                             shape=tuple(tensor.dims))
        except (OSError, ValueError, TypeError, KeyError) as error:
            loaded = onnx.TensorProto()
            loaded.CopyFrom(tensor)
            try:
                onnx.external_data_helper.load_external_data_for_tensor(loaded,
                                                                        self.folder or "")
            except Exception:
                raise PoolfoldError(f"cannot read initializer '{tensor.name}' from its "
                                    f"external data file {path!r}: {_first_line(error)}") \
                    from None
            return onnx.numpy_helper.to_array(loaded)

    def tensor(self, name: str) -> onnx.TensorProto:
        """The initializer with its data in it (read from the external file if it is there)."""
        tensor = self._tensors[name]
        if tensor.data_location != TensorProto.EXTERNAL:
            return tensor
        return onnx.numpy_helper.from_array(np.asarray(self.array(name)), name)

    def in_file(self, name: str) -> bool:
        """Whether the initializer sits in an external-data file of a model read from a path
        (the sessions read it from there)."""
        return self.folder is not None and \
            self._tensors[name].data_location == TensorProto.EXTERNAL

    def reference(self, name: str) -> onnx.TensorProto:
        """The initializer as the model holds it: for one in a file, where it is there."""
        return self._tensors[name]

    def stub(self, name: str) -> onnx.TensorProto:
        """The initializer's name, type and dims, its data left to ``ort_value``."""
        tensor = self._tensors[name]
        stub = onnx.TensorProto(name=name, data_type=tensor.data_type, dims=tensor.dims,
                                data_location=TensorProto.EXTERNAL)
        stub.external_data.add(key="location", value="poolfold-shared-weights")
        return stub

    def by_reference(self, name: str) -> bool:
        """Whether a session takes the initializer by reference: a large one of a type numpy
        holds (a small one is cheaper to embed, and shape inference reads it)."""
        tensor = self._tensors.get(name)
        return (tensor is not None and not partition.is_small(tensor)
                and tensor.data_type in _EXCHANGEABLE and tensor.data_type != TensorProto.STRING)

    def __contains__(self, name: str) -> bool:
        return name in self._tensors

    def ort_value(self, name: str):
        if name not in self._ort_values:
            import onnxruntime

            array = np.ascontiguousarray(self.array(name))
            self._ort_values[name] = onnxruntime.OrtValue.ortvalue_from_numpy(array)
        return self._ort_values[name]


class _Sessions:
    """Builds the stretches' sessions: onnxruntime's with the caller's options, or onnx's
    evaluator with poolfold's ops."""

    def __init__(self, model: onnx.ModelProto, options: Mapping[str, Any], ops,
                 weights: _Weights, between_kernels: bool = True):
        import onnxruntime

        self._onnxruntime = onnxruntime
        self._model = model
        self._ops = ops
        self._weights = weights
        self._given = options
        # A SessionOptions of the caller's is used as it is, for every stretch; the shared
        # weights need one SessionOptions per session (each carries its own list of them),
        # so with the caller's, the stretches embed their weights instead.
        self._share_weights = options.get("session_options") is None
        self._between_kernels = between_kernels
        _session_options(options)  # checks the keywords now, not at the first stretch

    def onnxruntime(self, step: partition.Step, types: dict,
                    shapes: Mapping[str, partition.Shape] = {}):
        """(session, None), or (None, why onnxruntime cannot run the stretch).  Records the
        types and shapes of the session's outputs in ``types`` and ``shapes``."""
        for name in step.inputs:
            unusable = _unexchangeable(types.get(name))
            if unusable:
                return None, f"its input '{name}' is {unusable}, which numpy cannot hand over"
        options, providers, provider_options = _session_options(self._given,
                                                                 self._between_kernels)
        initializers, shared = self._initializers(step.constants, options)
        stretch = _stretch_model(self._model, step, types, initializers, shapes)
        try:
            session = self._session(stretch, options, shared, providers, provider_options)
        except Exception as error:  # onnxruntime's errors are not one family
            return None, _first_line(error)
        wanted = set(step.outputs)
        for output in session.get_outputs():
            given = partition.type_from_ort(output.type)
            unusable = _unexchangeable(given)
            if unusable and output.name in wanted:
                return None, (f"its output '{output.name}' is {unusable}, which numpy cannot "
                              f"hand over")
            if given is not None:
                types.setdefault(output.name, given)
            if isinstance(shapes, dict) and isinstance(output.shape, list):
                shapes.setdefault(output.name, tuple(
                    n if isinstance(n, (int, str)) else None for n in output.shape))
        return session, None

    def _initializers(self, names, options) -> tuple[list[onnx.TensorProto], list[str]]:
        """The initializers ``names`` as a session's model carries them, and those of them
        handed over by reference (see :class:`_Weights`); tells ``options`` where the
        model's external-data file is when one of them stays in it."""
        initializers, shared, in_file = [], [], False
        for name in names:
            if name not in self._weights:
                continue  # a sparse initializer, which the session's model carries
            if self._share_weights and self._weights.in_file(name):
                initializers.append(self._weights.reference(name))
                in_file = True
            elif self._share_weights and self._weights.by_reference(name):
                initializers.append(self._weights.stub(name))
                shared.append(name)
            else:
                initializers.append(self._weights.tensor(name))
        if in_file:
            # onnxruntime maps the external-data file itself, as for the model's own path
            # (vgg11's one session: 1.3 s, as from the path; 1.85 s with the mapped arrays
            # handed over by reference).
            options.add_session_config_entry(
                "session.model_external_initializers_file_folder_path", self._weights.folder)
        return initializers, shared

    def _session(self, model: onnx.ModelProto, options, shared: list[str], providers,
                 provider_options):
        if shared:
            options.add_external_initializers(
                shared, [self._weights.ort_value(name) for name in shared])
        return self._onnxruntime.InferenceSession(
            model.SerializeToString(), sess_options=options, providers=providers,
            provider_options=provider_options)

    def whole(self, graph_nodes: list[onnx.NodeProto], declared: session_ops.Declared,
              shaped: bool = True, layout: blocked.Layout | None = None):
        """One session of the whole model, ``graph_nodes`` standing for its nodes, with the
        custom ops ``declared`` registered: (session, None), or (None, why not).  Not
        ``shaped``: its inputs' shapes are left out.  With a ``layout``, onnxruntime saves
        the graph it optimised there."""
        options, providers, provider_options = _session_options(self._given,
                                                                 between_kernels=False)
        if layout is not None:
            layout.save_options(options)
        if self._given.get("session_options") is None:
            # a node's error is raised as poolfold's own; onnxruntime need not log it too
            options.log_severity_level = 4
        graph = self._model.graph
        initializers, shared = self._initializers([t.name for t in graph.initializer], options)
        inputs = list(graph.input)
        if not shaped:
            constants = {t.name for t in graph.initializer}
            inputs = [helper.make_value_info(v.name, partition.without_shape(v.type))
                      if v.name not in constants else v for v in inputs]
        whole = helper.make_graph(graph_nodes, graph.name, inputs, graph.output,
                                  initializers, value_info=graph.value_info,
                                  sparse_initializer=graph.sparse_initializer)
        model = helper.make_model(
            whole, opset_imports=[*self._model.opset_import,
                                  helper.make_opsetid(declared.domain, 1)],
            functions=self._model.functions)
        model.ir_version = self._model.ir_version
        try:
            declared.register(options)
            return self._session(model, options, shared, providers, provider_options), None
        except Exception as error:  # onnxruntime's errors are not one family
            return None, _first_line(error)

    def may_lay_out(self) -> bool:
        """Whether the one session may be laid out by onnxruntime first (see
        :meth:`blocked`): not with the caller's own SessionOptions (they are used as they
        are) or providers other than onnxruntime's CPU, nor with large weights."""
        return (self._given.get("session_options") is None
                and self._given.get("providers") in (None, ["CPUExecutionProvider"])
                and blocked.weights_bytes(self._model) <= blocked.WEIGHTS_LIMIT)

    def blocked(self, graph_nodes: list[onnx.NodeProto], declared: session_ops.Declared,
                left: Sequence[onnx.NodeProto], plain: Mapping[str, onnx.NodeProto],
                opsets: Mapping[str, int], blocks: int):
        """The whole model's session with the pools ``left`` (nodes of ``graph_nodes``, each
        of which runs as the custom op ``plain[its output]``) taken into onnxruntime's
        blocked layout of ``blocks`` channels a block and run there by poolfold
        (:mod:`poolfold.blocked`): (session, the outputs of the pools that run blocked), or
        None where none of them is blocked or one is not found again."""
        layout = blocked.Layout()
        try:
            laid_out, _ = self.whole(graph_nodes, declared, layout=layout)
            if laid_out is None or not os.path.exists(layout.saved):
                return None
            del laid_out
            if not layout.put_back(left, plain, lambda node: blocked.declare(
                    declared, node, opsets, blocks)) or not layout.blocked:
                return None
            options, providers, provider_options = _session_options(self._given,
                                                                     between_kernels=False)
            options.log_severity_level = 4  # as whole()'s: a node's error is poolfold's
            layout.read_options(options)
            declared.register(options)
            return self._session(layout.graph, options, [], providers,
                                 provider_options), layout.blocked
        except Exception:  # noqa: BLE001 -- onnxruntime's errors are not one family
            return None
        finally:
            layout.close()

    def reference(self, step: partition.Step, types: dict) -> ReferenceEvaluator:
        initializers = [self._weights.tensor(name) for name in step.constants
                        if name in self._weights]
        return _reference_evaluator(_stretch_model(self._model, step, types, initializers),
                                    step.nodes, self._ops)

    def check_known(self, step: partition.Step) -> None:
        unknown = _unknown_node(self._model, step.nodes)
        if unknown is not None:
            raise _unknown_op_error(unknown)


def _warn_refused(refused: list[str], stacklevel: int) -> None:
    if refused:
        warnings.warn(
            f"onnxruntime refused {len(refused)} stretch(es) of the model, which run on onnx's "
            f"ReferenceEvaluator instead (slower): " + "; ".join(refused),
            FallbackWarning, stacklevel=stacklevel)


def _build_steps(model: onnx.ModelProto, inferred_shape_indices: bool, ops,
                 options: Mapping[str, Any], constants: dict, weights: _Weights,
                 poolfold_nodes: str, one_session: bool) -> tuple[list, Any]:
    """The steps, and the one session that runs them all when poolfold's nodes run inside
    it (else None: each stretch has its own)."""
    opsets = _opsets(model)
    types, inferred_shapes = partition.known_types(model)
    where = placement.Placement(poolfold_nodes, opsets, types, inferred_shapes,
                                _small_constants(model, weights), inferred_shape_indices)
    plan = partition.plan(model.graph, model.functions, where.on_poolfold)
    split = any(s.kind != partition.OTHER for s in plan)
    sessions = _Sessions(model, options, ops, weights, between_kernels=split)
    if split and one_session:
        steps, session = _one_session(model, plan, where, opsets, dict(types), sessions,
                                      inferred_shape_indices)
        if session is not None:
            return steps, session
    # Shapes a session may be told: exact ones only (see _StretchStep), from the graph's
    # declared inputs on.
    shapes: dict[str, partition.Shape] = {}
    for value in model.graph.input:
        shape = partition.shape_of(value.type)
        if shape is not None and value.name not in weights:
            shapes[value.name] = shape
    steps: list = []
    refused: list[str] = []
    readers_of_constants: set[str] = {v.name for v in model.graph.output}
    for step in plan:
        if step.kind == partition.POOLFOLD:
            node = step.nodes[0]
            steps.append(_PoolfoldStep(node, opsets, inferred_shape_indices,
                                       where.reason(node)))
            partition.poolfold_output_types(node, types)
            _poolfold_output_shapes(node, opsets, shapes, weights)
            readers_of_constants.update(node.input)
        else:
            steps.append(_StretchStep(step, sessions, types, refused, shapes))
    for name in readers_of_constants:
        if name in weights:
            constants[name] = weights.array(name)
    _warn_refused(refused, stacklevel=5)
    return steps, None


def _one_session(model: onnx.ModelProto, plan: list[partition.Step],
                 where: placement.Placement, opsets: Mapping[str, int], types: dict,
                 sessions: _Sessions, inferred_shape_indices: bool) -> tuple[list, Any]:
    """The model as one onnxruntime session in which poolfold's nodes are custom ops
    (:mod:`poolfold.session_ops`), and the plan's steps, each stretch's ``session`` that
    one; (None, None) where it cannot be: no library, a node inside a subgraph or local
    function, a type not known before the run, or a session onnxruntime refuses."""
    if any(step.kind == partition.NESTED for step in plan):
        return None, None
    graph = model.graph
    if any(_unexchangeable(types.get(value.name)) for value in [*graph.input, *graph.output]):
        return None, None  # numpy cannot feed or take it (bfloat16): poolfold's nodes can
    lib, _ = session_ops.library()
    if lib is None:
        return None, None
    declared = session_ops.Declared(lib)
    steps: list = []
    replaced: dict[int, onnx.NodeProto] = {}  # id of a node of the graph -> its custom op
    # values no run changes: initializers (not those that are also graph inputs, which may
    # be fed another value) and Constant nodes' outputs (as torch exports Col2Im's shapes)
    constants = ({t.name for t in graph.initializer} - {v.name for v in graph.input}) | {
        n.output[0] for n in graph.node
        if n.op_type == "Constant" and partition.default_domain(n.domain) == schema.AI_ONNX}
    for step in plan:
        if step.kind != partition.POOLFOLD:
            steps.append(_SessionPart(step))
            continue
        node = step.nodes[0]
        poolfold_step = _PoolfoldStep(node, opsets, inferred_shape_indices, where.reason(node))
        partition.poolfold_output_types(node, types)
        element = {}
        for name in [*node.input, *node.output]:
            given = types.get(name)
            if name and (given is None or given.WhichOneof("value") != "tensor_type"):
                return None, None  # typed only by the run: the split route types its feeds
            if name:
                element[name] = given.tensor_type.elem_type
        op = declared.add(poolfold_step.call,
                          [element[n] if n else None for n in node.input],
                          [element[n] if n else None for n in node.output],
                          poolfold_step.output_names,
                          replayable=nodes.replayable(
                              node.op_type, [n in constants for n in node.input]))
        replaced[id(node)] = helper.make_node(
            op, [n for n in node.input if n], [n for n in node.output if n],
            name=node.name, domain=declared.domain)
        steps.append(poolfold_step)
    graph_nodes = [replaced.get(id(node), node) for node in graph.node]
    # the pools onnxruntime may take into its blocked layout, left as its own nodes first
    blocks = blocked.block_size() if sessions.may_lay_out() else 0
    left = [node for node in graph.node
            if blocks and id(node) in replaced and blocked.blockable(node, types, blocks)]
    laid_out = None
    if left:
        left_ids = {id(node) for node in left}
        plain = {node.output[0]: replaced[id(node)] for node in left}
        laid_out = sessions.blocked(
            [node if id(node) in left_ids else replaced.get(id(node), node)
             for node in graph.node], declared, left, plain, opsets, blocks)
    if laid_out is not None:
        built, in_blocks = laid_out
        for step in steps:
            if step.runner == "poolfold" and step.nodes[0].output[0] in in_blocks:
                step.reason = f"{step.reason}; {blocked.REASON}"
    else:
        built, _ = sessions.whole(graph_nodes, declared)
    if built is None:
        return None, None
    session = _OneSession(built, declared, lambda: sessions.whole(graph_nodes, declared,
                                                                  shaped=False)[0])
    for step in steps:
        if step.runner == ONNXRUNTIME:
            step.session = built
    return steps, session


class _SessionPart:
    """A stretch of other nodes inside the one session that runs the whole model (so it is
    not run as a step of its own)."""

    runner = ONNXRUNTIME
    reason = None
    session = None

    def __init__(self, step: partition.Step):
        self.nodes = step.nodes
        self.reads = step.inputs
        self.writes = step.outputs


class _OneSession:
    """The one session with poolfold's nodes inside: a run that a node's kernel failed
    raises that node's error."""

    def __init__(self, session, declared: session_ops.Declared, unshaped: Callable):
        self.session = session
        self._declared = declared  # the nodes' callbacks live as long as the session
        self._unshaped = unshaped  # the session again, its inputs' declared shapes dropped

    def run(self, outputs, feeds):
        try:
            return self.session.run(outputs, feeds)
        except Exception as error:
            failure = self._declared.take_failure()
            if failure is not None:
                raise failure from None
            if self._unshaped is None or not _shape_refusal(error):
                raise
        # fed other shapes than the model declares, which poolfold's nodes take (as the
        # split route's sessions do, see _StretchStep)
        rebuilt, self._unshaped = self._unshaped(), None
        if rebuilt is None:
            raise PoolfoldError("onnxruntime refused the model without its inputs' shapes")
        self.session = rebuilt
        return self.run(outputs, feeds)


def _small_constants(model: onnx.ModelProto, weights: _Weights) -> dict[str, np.ndarray]:
    """The values of the small initializers (a Col2Im's block_shape, a MaxUnpool's
    output_shape), which tell prepare about the nodes that read them."""
    return {t.name: weights.array(t.name) for t in model.graph.initializer
            if partition.is_small(t) and t.data_type == TensorProto.INT64}


def _poolfold_output_shapes(node: onnx.NodeProto, opsets: Mapping[str, int], shapes: dict,
                            weights: _Weights) -> None:
    domain = partition.default_domain(node.domain)
    constant = [weights.array(name) if name in weights else None for name in node.input]
    given = [shapes.get(name) for name in node.input]
    try:
        found = nodes.output_shapes(domain, node.op_type, opsets.get(domain, 0),
                                    nodes.attributes_of(node), given, constant)
    except Exception:  # a shape is a help: the run itself says what is wrong with the node
        return
    for name, shape in zip(node.output, found):
        if name and shape is not None:
            shapes[name] = shape


def load_model(model) -> tuple[onnx.ModelProto, str | None]:
    """``model`` (a ModelProto, its bytes or a path) as a ModelProto with a graph, and the
    folder its external data files are in (a path's; else the working directory).  A model
    read from a path leaves its external data in its files: the weights are mapped from
    there, once (see _Weights).  Bytes that are not a model are a PoolfoldError (a missing
    file stays an OSError)."""
    folder = None
    if not isinstance(model, onnx.ModelProto):
        try:
            if isinstance(model, (bytes, bytearray)):
                model = onnx.load_from_string(bytes(model))
            else:
                folder = os.path.dirname(os.path.abspath(os.fspath(model)))
                model = onnx.load(model, load_external_data=False)
        except OSError:
            raise
        except Exception as error:  # protobuf's decode errors are not one family
            text = str(error).strip().splitlines()
            raise PoolfoldError(
                f"cannot read the model: not an ONNX protobuf ({text[0] if text else type(error).__name__})"
            ) from None
    if not model.graph.node or not model.graph.output:
        # Empty or unrelated bytes can parse as an empty ModelProto.
        raise PoolfoldError("not an ONNX model: the graph has no nodes or no outputs")
    return model, folder


class PoolfoldBackend(Backend):
    @classmethod
    def is_compatible(cls, model: onnx.ModelProto, device: str = "CPU", **kwargs: Any) -> bool:
        return cls.supports_device(device)

    @classmethod
    def supports_device(cls, device: str) -> bool:
        return str(device).upper() == "CPU"

    @classmethod
    def prepare(cls, model, device: str = "CPU", **kwargs: Any) -> PoolfoldRep:
        """``model`` is a ModelProto, its bytes or a path.  Keywords:

        - ``other_ops``: what runs the nodes poolfold does not implement: ``"onnxruntime"``
          (the default when it is installed: each stretch of them is one InferenceSession) or
          ``"reference"`` (onnx's ReferenceEvaluator; the default without onnxruntime).
        - ``session_options`` (an ``onnxruntime.SessionOptions``), ``providers``,
          ``provider_options``, ``intra_op_num_threads``, ``inter_op_num_threads``: passed to
          onnxruntime's sessions (the thread counts on poolfold's own SessionOptions; give them
          there or in ``session_options``, not both).
        - ``inferred_shape_indices=True`` gives MaxUnpool nodes that option (see the README).
        - ``poolfold_nodes``: which nodes of poolfold's ops run on poolfold when the other
          nodes run on onnxruntime: ``"all"`` (the default) or ``"needed"``: only those
          onnxruntime cannot run or would not compute as poolfold's semantics say, judged
          from each node's op, version, attributes, types and ranks
          (:mod:`poolfold.placement` lists the rules); the others stay in onnxruntime's
          stretches, so a model onnxruntime runs right as a whole is one session.  The one
          difference "needed" leaves is in the data: where a MaxPool window holds a NaN,
          onnxruntime's answer depends on where the NaN sits (poolfold's is NaN).
        - ``one_session``: with onnxruntime running the other nodes, ``True`` (the default)
          runs the whole model as one onnxruntime session in which poolfold's nodes are
          custom ops that call back into poolfold (:mod:`poolfold.session_ops`; it needs a
          C compiler once, and falls back to the split below where it cannot be had, where a
          node of poolfold's sits in a subgraph or local function, or where a type is known
          only at the run); ``False`` cuts the model into one session per stretch of other
          nodes, run between poolfold's nodes.  ``rep.one_session`` says which it got.
        """
        if not cls.supports_device(device):
            raise PoolfoldError(f"poolfold runs on the CPU only, not {device!r}")
        known = {"other_ops", "inferred_shape_indices", "poolfold_nodes", "one_session",
                 *_SESSION_KEYWORDS}
        unknown = sorted(set(kwargs) - known)
        if unknown:
            raise PoolfoldError(f"prepare() has no keyword {', '.join(map(repr, unknown))}; "
                                f"it takes {', '.join(sorted(known))}")
        other_ops = kwargs.get("other_ops")
        if other_ops is None:
            other_ops = ONNXRUNTIME if onnxruntime_available() else REFERENCE
        elif other_ops not in OTHER_OPS:
            raise PoolfoldError(f"other_ops must be one of {', '.join(map(repr, OTHER_OPS))}, "
                                f"not {other_ops!r}")
        elif other_ops == ONNXRUNTIME and not onnxruntime_available():
            raise PoolfoldError("other_ops='onnxruntime' needs onnxruntime, which is not "
                                "installed (pip install onnxruntime)")
        poolfold_nodes = placement.check_choice(kwargs.get("poolfold_nodes", placement.ALL))
        model, folder = load_model(model)
        session = {k: kwargs[k] for k in _SESSION_KEYWORDS if kwargs.get(k) is not None}
        one_session = kwargs.get("one_session", True)
        if not isinstance(one_session, bool):
            raise PoolfoldError(f"one_session must be True or False, not {one_session!r}")
        return PoolfoldRep(model, bool(kwargs.get("inferred_shape_indices", False)), other_ops,
                           session, poolfold_nodes, folder, one_session)

    @classmethod
    def run_model(cls, model, inputs: Any, device: str = "CPU", **kwargs: Any) -> tuple[Any, ...]:
        return cls.prepare(model, device, **kwargs).run(inputs)

    @classmethod
    def run_node(
        cls,
        node: onnx.NodeProto,
        inputs: Any,
        device: str = "CPU",
        outputs_info: Sequence | None = None,
        **kwargs: Any,
    ) -> tuple[Any, ...]:
        """Run one node; its opset is ``opset_version`` when given, else the latest version
        of the op."""
        if not cls.supports_device(device):
            raise PoolfoldError(f"poolfold runs on the CPU only, not {device!r}")
        inputs = list(inputs.values()) if isinstance(inputs, Mapping) else list(inputs)
        opset = kwargs.get("opset_version")
        if nodes.implements(node.domain, node.op_type):
            if opset is None:
                opset = schema.versions(node.op_type, node.domain)[-1].version
            results = nodes.run(node.domain, node.op_type, opset, nodes.attributes_of(node),
                                inputs, node.output,
                                bool(kwargs.get("inferred_shape_indices", False)))
            return namedtupledict("Outputs", [o for o in node.output if o])(*results)
        # Anything else: a one-node model on the reference evaluator.
        names = [name for name in node.input]
        graph = helper.make_graph(
            [node], "node",
            [helper.make_empty_tensor_value_info(n) for n in names if n],
            [helper.make_empty_tensor_value_info(o) for o in node.output if o],
        )
        imports = [helper.make_opsetid(node.domain, opset or onnx.defs.onnx_opset_version())]
        model = helper.make_model(graph, opset_imports=imports)
        feeds = {n: v for n, v in zip(names, inputs) if n}
        results = ReferenceEvaluator(model, new_ops=reference.ops).run(None, feeds)
        return namedtupledict("Outputs", [o for o in node.output if o])(*results)


is_compatible = PoolfoldBackend.is_compatible
prepare = PoolfoldBackend.prepare
run_model = PoolfoldBackend.run_model
run_node = PoolfoldBackend.run_node
supports_device = PoolfoldBackend.supports_device
