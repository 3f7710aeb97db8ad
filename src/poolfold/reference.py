"""poolfold's ops for onnx's ReferenceEvaluator.

>>> from onnx.reference import ReferenceEvaluator
>>> import poolfold.reference
>>> session = ReferenceEvaluator(model, new_ops=poolfold.reference.ops)   # doctest: +SKIP

MaxPool, MaxUnpool, Col2Im, AveragePool, LpPool, GlobalMaxPool, GlobalAveragePool and
GlobalLpPool (ai.onnx) and the com.ms.internal.nhwc MaxPool, MaxUnpool, AveragePool, LpPool
and global pools (one class per row of :data:`poolfold.schema.TABLE`) then run poolfold's
kernels, with poolfold's semantics, at the version the model imports.
"""

from __future__ import annotations

from onnx.reference.op_run import OpRun

from . import nodes, schema


class _PoolfoldOp(OpRun):
    op_domain = schema.AI_ONNX
    options: dict = {}

    def _run(self, *inputs, **_attributes):
        # The evaluator fills absent attributes with the latest schema's defaults; poolfold
        # needs to know which ones the node really sets, so it reads the node itself.
        opset = self.run_params["opsets"][self.op_domain]
        return tuple(
            nodes.run(self.op_domain, self.onnx_node.op_type, opset,
                      nodes.attributes_of(self.onnx_node), inputs, self.onnx_node.output,
                      **self.options)
        )


def make_ops(inferred_shape_indices: bool = False) -> list[type]:
    """The op classes, with poolfold's options (see :func:`poolfold.max_unpool`)."""
    options = {"inferred_shape_indices": inferred_shape_indices} if inferred_shape_indices else {}
    return [
        type(op, (_PoolfoldOp,), {"op_domain": domain, "options": options, "__module__": __name__})
        for (domain, op) in schema.TABLE
    ]


ops = make_ops()

__all__ = ["make_ops", "ops"]
