"""An ONNX backend (in the shape of ``onnxruntime.backend``) that runs any model.

MaxPool, MaxUnpool, Col2Im and the com.ms.internal.nhwc ops run on poolfold's kernels; every
other node runs on onnx's ReferenceEvaluator, into which poolfold's ops are plugged.  Each
node runs at the version the model's opset imports give its domain.

>>> import poolfold.backend as backend
>>> rep = backend.prepare(model)                 # doctest: +SKIP
>>> outputs = rep.run([x])                       # doctest: +SKIP
>>> outputs = backend.run_model(model, [x])      # doctest: +SKIP
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np
import onnx
from onnx import helper
from onnx.backend.base import Backend, BackendRep, namedtupledict
from onnx.reference import ReferenceEvaluator

from . import nodes, reference, schema
from .errors import PoolfoldError, PoolfoldTypeError


class PoolfoldRep(BackendRep):
    """A prepared model: ``run`` takes the inputs as a list (graph input order, initializers
    excluded) or a dict, and returns the outputs in graph output order."""

    def __init__(self, model: onnx.ModelProto, inferred_shape_indices: bool = False):
        self.model = model
        self._session = ReferenceEvaluator(
            model, new_ops=reference.make_ops(inferred_shape_indices=inferred_shape_indices)
        )
        initializers = {i.name for i in model.graph.initializer}
        self.input_names = [i.name for i in model.graph.input if i.name not in initializers]
        self.output_names = [o.name for o in model.graph.output]

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
            results = self._session.run(None, feeds)
        except (TypeError, ValueError) as error:
            # onnx's evaluator re-raises an op's TypeError as its own "Issues with types";
            # poolfold's message, which names the node's op and attribute, is the useful one.
            cause = error.__cause__ or error.__context__
            if isinstance(cause, (PoolfoldError, PoolfoldTypeError)):
                raise cause from None
            raise
        return namedtupledict("Outputs", self.output_names)(*results)


def _load(model) -> onnx.ModelProto:
    """``model`` (a ModelProto, its bytes or a path) as a ModelProto with a graph; bytes that
    are not one are a PoolfoldError (a missing file stays an OSError)."""
    if not isinstance(model, onnx.ModelProto):
        try:
            if isinstance(model, (bytes, bytearray)):
                model = onnx.load_from_string(bytes(model))
            else:
                model = onnx.load(model)
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
    return model


class PoolfoldBackend(Backend):
    @classmethod
    def is_compatible(cls, model: onnx.ModelProto, device: str = "CPU", **kwargs: Any) -> bool:
        return cls.supports_device(device)

    @classmethod
    def supports_device(cls, device: str) -> bool:
        return str(device).upper() == "CPU"

    @classmethod
    def prepare(cls, model, device: str = "CPU", **kwargs: Any) -> PoolfoldRep:
        """``model`` is a ModelProto, its bytes or a path.  The keyword
        ``inferred_shape_indices=True`` gives MaxUnpool nodes that option (see the README)."""
        if not cls.supports_device(device):
            raise PoolfoldError(f"poolfold runs on the CPU only, not {device!r}")
        return PoolfoldRep(_load(model), bool(kwargs.get("inferred_shape_indices", False)))

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
