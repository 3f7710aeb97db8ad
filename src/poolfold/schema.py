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
