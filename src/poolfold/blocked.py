"""poolfold's pooling nodes in onnxruntime's blocked channel layout, inside the one session.

On x86-64 CPUs with AVX2 or AVX-512, onnxruntime runs a float32 model's 2-D Convs in a
blocked layout, NCHWc: ``(N, C / b, H, W, b)``, b channels a block (8 or 16, the vector's
width).  Its own pools between those Convs stay in the layout; a node it does not know takes
the tensor back to NCHW, and the next Conv reorders it again.  As custom ops of the one
session (:mod:`poolfold.session_ops`), poolfold's nodes paid those two reorders each: 0.9 ms
of googlenet's 13.8 ms run, where onnxruntime alone takes 10.9.

So where the session's options are poolfold's own, prepare first builds the model with its
plain 4-D float32 pools (MaxPool without Indices, AveragePool, GlobalMaxPool,
GlobalAveragePool) left as onnxruntime's nodes, and has onnxruntime save the graph it
optimised.  Each pool it moved into the blocked layout becomes poolfold's node again, in
place: a custom op that reads the blocked tensor as ``N * C / b`` channels-last samples
``(H, W, b)`` and pools them with the com.ms.internal.nhwc op of the node's attributes (the
same windows over every channel).  The pools it left in NCHW get their plain custom op back.
The session is then built from that graph, its optimisations done.

Every node of poolfold's still runs on poolfold: where a pool is not found again in the saved
graph (onnxruntime folded or fused it) the model goes the plain way, as it does where no pool
went into the layout (onnxruntime blocks only pools whose channels fill whole blocks) or
where it has no such layout.  The saved graph carries the model's weights once more (the
Convs' weights in the blocked layout are new ones), written to a temporary folder and read
back: a model whose weights exceed :data:`WEIGHTS_LIMIT` goes the plain way, as that write
would cost more than the reorders save (vgg11's 0.5 GB: 2.6 s, against a session of 0.7 s).
"""

from __future__ import annotations

import functools
import math
import os
import tempfile
from typing import Callable, Mapping, Sequence

import numpy as np
import onnx
from onnx import TensorProto, helper

from . import nodes, partition, schema, session_ops

DOMAIN = "com.microsoft.nchwc"  # onnxruntime's ops of the blocked layout
POOLS = frozenset({"MaxPool", "AveragePool", "GlobalMaxPool", "GlobalAveragePool"})
WEIGHTS_LIMIT = 64 << 20  # bytes of initializers beyond which the model goes the plain way
REASON = "on onnxruntime's blocked channel layout (NCHWc), as channels-last samples"
_SUFFIX = "_nchwc"  # onnxruntime names a node it moves into the layout by its output's name


def blockable(node: onnx.NodeProto, types: Mapping[str, onnx.TypeProto], blocks: int) -> bool:
    """Whether onnxruntime may take ``node`` (one of poolfold's) into its blocked layout of
    ``blocks`` channels a block: a pool of the default domain with one output over a float32
    tensor of 4 dims whose channels fill whole blocks (what is not known before the run,
    onnxruntime decides)."""
    if partition.default_domain(node.domain) != schema.AI_ONNX or node.op_type not in POOLS:
        return False
    if len([name for name in node.output if name]) != 1 or node.output[0] == "":
        return False
    given = types.get(node.input[0]) if node.input else None
    if given is None or given.WhichOneof("value") != "tensor_type":
        return False
    tensor = given.tensor_type
    if tensor.elem_type != TensorProto.FLOAT:
        return False
    if not tensor.HasField("shape"):
        return True
    dims = tensor.shape.dim
    return len(dims) == 4 and (not dims[1].HasField("dim_value") or
                               dims[1].dim_value % blocks == 0)


def weights_bytes(model: onnx.ModelProto) -> int:
    """The bytes of the model's initializers (those in external files included)."""
    return sum(math.prod(t.dims) * helper.tensor_dtype_to_np_dtype(t.data_type).itemsize
               for t in model.graph.initializer if t.data_type != TensorProto.STRING)


@functools.lru_cache(maxsize=None)
def block_size() -> int:
    """onnxruntime's channels a block on this machine (0 where it has no blocked layout): the
    channels its reorder pads 4 channels to."""
    import onnxruntime

    graph = helper.make_graph(
        [helper.make_node("ReorderInput", ["x"], ["y"], domain=DOMAIN)], "block_size",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 1, 1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18),
                                                    helper.make_opsetid(DOMAIN, 1)])
    options = onnxruntime.SessionOptions()
    options.log_severity_level = 4
    options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL
    try:
        session = onnxruntime.InferenceSession(model.SerializeToString(), options,
                                               providers=["CPUExecutionProvider"])
        blocked = session.run(None, {"x": np.zeros((1, 4, 1, 1), np.float32)})[0]
    except Exception:  # noqa: BLE001 -- a build without the layout's ops
        return 0
    return int(blocked.shape[1]) if blocked.ndim == 4 and blocked.shape[1] % 4 == 0 else 0


class Layout:
    """The one session's graph laid out by onnxruntime, poolfold's pools put back in it:
    ``graph`` (the optimised graph, its weights in ``folder``) and ``blocked``, the output
    names of the nodes that run on the blocked layout; or ``graph`` None (the plain way)."""

    def __init__(self):
        self.graph: onnx.ModelProto | None = None
        self.blocked: set[str] = set()
        self._folder = tempfile.TemporaryDirectory(prefix="poolfold-layout-")
        self.folder = self._folder.name
        self.saved = os.path.join(self.folder, "model.onnx")

    def save_options(self, options) -> None:
        """Tells onnxruntime's ``options`` to save the graph it optimises, weights apart, and
        to skip what only a session that runs needs (the kernels' packed weights, a second
        thread): that session is dropped once it has saved the graph."""
        options.optimized_model_filepath = self.saved
        options.add_session_config_entry(
            "session.optimized_model_external_initializers_file_name", "weights.bin")
        options.add_session_config_entry("session.disable_prepacking", "1")
        options.intra_op_num_threads = 1

    def read_options(self, options) -> None:
        """Tells ``options`` where the saved graph's weights are, and that its optimisations
        are done."""
        import onnxruntime

        options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL
        options.add_session_config_entry(
            "session.model_external_initializers_file_folder_path", self.folder)

    def close(self) -> None:
        """Removes the saved files (a session built from them has read its weights)."""
        self._folder.cleanup()

    def put_back(self, originals: Sequence[onnx.NodeProto], plain: Mapping[str, onnx.NodeProto],
                 add_blocked: Callable[[onnx.NodeProto], onnx.NodeProto]) -> bool:
        """Reads the saved graph and puts each of ``originals`` (the pools left to
        onnxruntime) back as poolfold's: its plain custom op ``plain[output]`` where it is
        still in NCHW, ``add_blocked(original)`` where it went into the blocked layout,
        re-wired to that node's inputs and outputs.  False where one of them is not found
        (the plain way then)."""
        model = onnx.load(self.saved, load_external_data=False)
        by_output = {node.output[0]: node for node in originals}
        found: set[str] = set()
        graph_nodes = []
        for node in model.graph.node:
            if partition.default_domain(node.domain) == schema.AI_ONNX \
                    and node.op_type in POOLS and node.output and node.output[0] in by_output:
                name = node.output[0]
                if name in found or node.op_type != by_output[name].op_type:
                    return False
                found.add(name)
                graph_nodes.append(_rewired(plain[name], node))
                continue
            if node.domain == DOMAIN and node.op_type in POOLS:
                original = by_output.get(_original_output(node.name, by_output))
                if original is None or original.output[0] in found \
                        or node.op_type != original.op_type:
                    return False
                found.add(original.output[0])
                self.blocked.add(original.output[0])
                graph_nodes.append(_rewired(add_blocked(original), node))
                continue
            graph_nodes.append(node)
        if found != set(by_output):
            return False
        del model.graph.node[:]
        model.graph.node.extend(graph_nodes)
        self.graph = model
        return True


def _rewired(op: onnx.NodeProto, node: onnx.NodeProto) -> onnx.NodeProto:
    """The custom op ``op`` in ``node``'s place: its inputs, outputs and name."""
    return helper.make_node(op.op_type, list(node.input), list(node.output), name=node.name,
                            domain=op.domain)


def _original_output(name: str, outputs: Mapping[str, onnx.NodeProto]) -> str | None:
    """The output of the node that onnxruntime's blocked node ``name`` replaced: it names
    it after that output, a ``_token_<n>`` added where the name was taken."""
    if _SUFFIX not in name:
        return None
    base = name[:name.rindex(_SUFFIX)] if name.endswith(_SUFFIX) else \
        name[:name.rfind(_SUFFIX + "_token_")] if _SUFFIX + "_token_" in name else None
    return base if base in outputs else None


def channels_last_run(node: onnx.NodeProto, opsets: Mapping[str, int]) -> Callable:
    """``node``'s computation (a pool of the default domain) on channels-last samples: the
    com.ms.internal.nhwc op of its attributes, at that domain's version for the model's
    opset (the same attributes and windows)."""
    opset = opsets[schema.AI_ONNX]
    return nodes.bind(schema.NHWC, node.op_type, opset, nodes.attributes_of(node),
                      [node.output[0]], input_count=1)


def declare(declared: session_ops.Declared, node: onnx.NodeProto, opsets: Mapping[str, int],
            blocks: int) -> onnx.NodeProto:
    """The custom op that runs ``node`` on the blocked layout, declared in ``declared``
    (its inputs and outputs rewired by the caller)."""
    run = channels_last_run(node, opsets)
    op = declared.add(run, [TensorProto.FLOAT], [TensorProto.FLOAT],
                      [schema.resolve(node.op_type, opsets[schema.AI_ONNX],
                                      schema.NHWC).outputs[0]],
                      blocks=blocks,
                      replayable=nodes.replayable(node.op_type, [False]))
    return helper.make_node(op, [], [], domain=declared.domain)
