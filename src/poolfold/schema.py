"""The versions table: what each (domain, op, version) accepts.

Each op's history is written as a list of changes ("since version 8: adds storage_order and
the Indices output"), and :func:`_history` expands it into one frozen :class:`OpVersion` row per
version.  Everything version-dependent in poolfold reads these rows: which attributes exist and
their defaults, the outputs, and the tensor types.  A new op or domain is new rows, not a new
code path.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field, replace
from typing import Iterable, Mapping

import numpy as np

from . import dtypes
from .errors import PoolfoldError, PoolfoldTypeError, op_label

AI_ONNX = ""
NHWC = "com.ms.internal.nhwc"


@dataclass(frozen=True)
class Attribute:
    name: str
    kind: str  # "int", "ints", "string", "float", "floats"
    default: object = None  # None: required, or filled per spatial rank (strides, pads, ...)
    required: bool = False


@dataclass(frozen=True)
class OpVersion:
    """One row of the table: an op as it stands at one version of its domain."""

    domain: str
    op: str
    version: int
    attributes: Mapping[str, Attribute]
    types: tuple[str, ...]  # accepted types of the data input (the "T" constraint), by name
    outputs: tuple[str, ...]
    inputs: tuple[str, ...]  # every input the op takes, optional ones included
    # Version in which each attribute / type first appeared, for error messages.
    introduced: Mapping[str, int] = field(default_factory=dict, repr=False)

    @functools.cached_property
    def label(self) -> str:  # built once per row: every check of every call names it
        return op_label(self.op, self.version, self.domain)

    def has(self, attribute: str) -> bool:
        return attribute in self.attributes

    def reject_absent(self, attribute: str, given: bool) -> None:
        """Refuse an attribute the caller set but this version does not have."""
        if given and attribute not in self.attributes:
            since = self.introduced.get(attribute)
            hint = f" (it exists from {self.op}-{since})" if since else ""
            raise PoolfoldError(
                f"{self.label}: attribute '{attribute}' is not part of this version{hint}"
            )

    def check_type(self, dtype: np.dtype, input_name: str = "X") -> None:
        type_name = dtypes.name(dtype)
        if type_name in self.types:
            return
        since = self.introduced.get(f"type:{type_name}")
        hint = f"; {type_name} is accepted from {self.op}-{since}" if since else ""
        raise PoolfoldTypeError(
            f"{self.label}: input '{input_name}' has type {type_name}, "
            f"but this version accepts {', '.join(self.types)}{hint}"
        )


@dataclass(frozen=True)
class Change:
    """What one version changes relative to the previous one."""

    since: int
    add_attributes: tuple[Attribute, ...] = ()
    add_types: tuple[str, ...] = ()
    outputs: tuple[str, ...] | None = None  # None: unchanged
    inputs: tuple[str, ...] | None = None  # None: unchanged


def _history(domain: str, op: str, changes: Iterable[Change], versions=None) -> list[OpVersion]:
    """Expand a list of changes into one row per version (or per listed version)."""
    rows, attributes, types, outputs, inputs, introduced = [], {}, (), (), (), {}
    for change in changes:
        listed = versions is None or change.since in versions
        for attribute in change.add_attributes:
            attributes[attribute.name] = attribute
            if listed:  # a hint must name a version that exists in this domain
                introduced.setdefault(attribute.name, change.since)
        for t in change.add_types:
            if listed:
                introduced.setdefault(f"type:{t}", change.since)
        types = types + change.add_types
        outputs = change.outputs if change.outputs is not None else outputs
        inputs = change.inputs if change.inputs is not None else inputs
        if listed:
            rows.append(OpVersion(domain, op, change.since, dict(attributes), types, outputs,
                                  inputs, introduced))
    return rows


_FLOATS = ("float16", "float32", "float64")
_KERNEL_SHAPE = Attribute("kernel_shape", "ints", required=True)
_STRIDES = Attribute("strides", "ints")
_PADS = Attribute("pads", "ints")
_DILATIONS = Attribute("dilations", "ints")

MAX_POOL_CHANGES = (
    Change(
        1,
        add_attributes=(Attribute("auto_pad", "string", "NOTSET"), _KERNEL_SHAPE, _PADS, _STRIDES),
        add_types=_FLOATS,
        outputs=("Y",),
        inputs=("X",),
    ),
    Change(8, add_attributes=(Attribute("storage_order", "int", 0),), outputs=("Y", "Indices")),
    Change(10, add_attributes=(Attribute("ceil_mode", "int", 0), _DILATIONS)),
    Change(11),  # pads may be given with auto_pad NOTSET only; no interface change
    Change(12, add_types=("int8", "uint8")),
    Change(22, add_types=("bfloat16",)),
)

MAX_UNPOOL_CHANGES = (
    Change(
        9,
        add_attributes=(_KERNEL_SHAPE, _PADS, _STRIDES),
        add_types=_FLOATS,
        outputs=("output",),
        inputs=("X", "I", "output_shape"),
    ),
    Change(11),  # output_shape may be given with pads; no interface change
    Change(22, add_types=("bfloat16",)),
)

COL2IM_CHANGES = (
    Change(
        18,
        add_attributes=(_DILATIONS, _PADS, _STRIDES),
        add_types=(
            "float16", "bfloat16", "float32", "float64",
            "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
            "bool", "complex64", "complex128", dtypes.STRING,
        ),
        outputs=("output",),
        inputs=("input", "image_shape", "block_shape"),
    ),
)

# The averaging family (see "The averaging family" in docs/semantics.md).
_POOL_WINDOW = (Attribute("auto_pad", "string", "NOTSET"), _KERNEL_SHAPE, _PADS, _STRIDES)

AVERAGE_POOL_CHANGES = (
    Change(1, add_attributes=_POOL_WINDOW, add_types=_FLOATS, outputs=("Y",), inputs=("X",)),
    Change(7, add_attributes=(Attribute("count_include_pad", "int", 0),)),
    Change(10, add_attributes=(Attribute("ceil_mode", "int", 0),)),
    Change(11),  # pads may be given with auto_pad NOTSET only; no interface change
    Change(19, add_attributes=(_DILATIONS,)),
    Change(22, add_types=("bfloat16",)),
)

# LpPool-1 and GlobalLpPool-1 take p as a float; from version 2 it is an int.
_P_FLOAT = Attribute("p", "float", 2.0)
_P_INT = Attribute("p", "int", 2)

LP_POOL_CHANGES = (
    Change(1, add_attributes=_POOL_WINDOW + (_P_FLOAT,), add_types=_FLOATS, outputs=("Y",),
           inputs=("X",)),
    Change(2, add_attributes=(_P_INT,)),
    Change(11),  # pads may be given with auto_pad NOTSET only; no interface change
    Change(18, add_attributes=(Attribute("ceil_mode", "int", 0), _DILATIONS)),
    Change(22, add_types=("bfloat16",)),
)

GLOBAL_POOL_CHANGES = (
    Change(1, add_types=_FLOATS, outputs=("Y",), inputs=("X",)),
    Change(22, add_types=("bfloat16",)),
)

GLOBAL_LP_POOL_CHANGES = (
    Change(1, add_attributes=(_P_FLOAT,), add_types=_FLOATS, outputs=("Y",), inputs=("X",)),
    Change(2, add_attributes=(_P_INT,)),
    Change(22, add_types=("bfloat16",)),
)

# onnxruntime's channels-last domain: the ai.onnx op of the same version plus a fused
# activation, for the versions its layout transformer produces.
_ACTIVATION = (Attribute("activation", "string", None), Attribute("activation_params", "floats", None))


def _channels_last(changes: tuple[Change, ...]) -> tuple[Change, ...]:
    first = changes[0]
    return (replace(first, add_attributes=first.add_attributes + _ACTIVATION),) + changes[1:]


TABLE: dict[tuple[str, str], list[OpVersion]] = {
    (AI_ONNX, "MaxPool"): _history(AI_ONNX, "MaxPool", MAX_POOL_CHANGES),
    (AI_ONNX, "MaxUnpool"): _history(AI_ONNX, "MaxUnpool", MAX_UNPOOL_CHANGES),
    (AI_ONNX, "Col2Im"): _history(AI_ONNX, "Col2Im", COL2IM_CHANGES),
    (NHWC, "MaxPool"): _history(
        NHWC, "MaxPool", _channels_last(MAX_POOL_CHANGES), versions=(1, 8, 10, 11, 12)
    ),
    (NHWC, "MaxUnpool"): _history(
        NHWC, "MaxUnpool", _channels_last(MAX_UNPOOL_CHANGES), versions=(9, 11)
    ),
    (AI_ONNX, "AveragePool"): _history(AI_ONNX, "AveragePool", AVERAGE_POOL_CHANGES),
    (AI_ONNX, "LpPool"): _history(AI_ONNX, "LpPool", LP_POOL_CHANGES),
    (AI_ONNX, "GlobalMaxPool"): _history(AI_ONNX, "GlobalMaxPool", GLOBAL_POOL_CHANGES),
    (AI_ONNX, "GlobalAveragePool"): _history(AI_ONNX, "GlobalAveragePool",
                                             GLOBAL_POOL_CHANGES),
    (AI_ONNX, "GlobalLpPool"): _history(AI_ONNX, "GlobalLpPool", GLOBAL_LP_POOL_CHANGES),
    # onnxruntime's layout transformer gives AveragePool a fused activation; LpPool and the
    # global pools have none there.
    (NHWC, "AveragePool"): _history(
        NHWC, "AveragePool", _channels_last(AVERAGE_POOL_CHANGES), versions=(7, 10, 11, 19)
    ),
    (NHWC, "LpPool"): _history(NHWC, "LpPool", LP_POOL_CHANGES, versions=(11, 18)),
    (NHWC, "GlobalMaxPool"): _history(NHWC, "GlobalMaxPool", GLOBAL_POOL_CHANGES, versions=(1,)),
    (NHWC, "GlobalAveragePool"): _history(NHWC, "GlobalAveragePool", GLOBAL_POOL_CHANGES,
                                          versions=(1,)),
    (NHWC, "GlobalLpPool"): _history(NHWC, "GlobalLpPool", GLOBAL_LP_POOL_CHANGES,
                                     versions=(2,)),
}


def versions(op: str, domain: str = AI_ONNX) -> list[OpVersion]:
    return TABLE[(domain, op)]


def resolve(op: str, opset: int | None = None, domain: str = AI_ONNX) -> OpVersion:
    """The row a node runs: the highest version ``<= opset`` (the latest when opset is None)."""
    rows = versions(op, domain)
    if opset is None:
        return rows[-1]
    if isinstance(opset, bool) or not isinstance(opset, (int, np.integer)):
        raise PoolfoldTypeError(f"{op}: opset must be an integer, got {opset!r}")
    usable = [row for row in rows if row.version <= opset]
    if not usable:
        raise PoolfoldError(
            f"{op}: opset {opset} predates the op (first version: {rows[0].version})"
        )
    return usable[-1]
