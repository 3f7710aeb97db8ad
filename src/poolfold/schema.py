"""The versions table: what each (domain, op, version) accepts.

Each op's history is written as a list of changes ("since version 8: adds storage_order and
the Indices output"), and :func:`_history` expands it into one frozen :class:`OpVersion` row per
version.  Everything version-dependent in poolfold reads these rows: which attributes exist and
their defaults, the outputs, and the tensor types.  A new op or domain is new rows, not a new
code path.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Mapping

import numpy as np

from . import dtypes
from .errors import PoolfoldError, PoolfoldTypeError, op_label

AI_ONNX = ""


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
    types: tuple[np.dtype, ...]  # accepted types of the data input X (the "T" constraint)
    outputs: tuple[str, ...]
    # Version in which each attribute / type first appeared, for error messages.
    introduced: Mapping[str, int] = field(default_factory=dict, repr=False)

    @property
    def label(self) -> str:
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
        dtype = np.dtype(dtype)
        if dtype in self.types:
            return
        accepted = ", ".join(dtypes.name(t) for t in self.types)
        since = self.introduced.get(f"type:{dtypes.name(dtype)}")
        hint = f"; {dtypes.name(dtype)} is accepted from {self.op}-{since}" if since else ""
        raise PoolfoldTypeError(
            f"{self.label}: input '{input_name}' has type {dtypes.name(dtype)}, "
            f"but this version accepts {accepted}{hint}"
        )


@dataclass(frozen=True)
class Change:
    """What one version changes relative to the previous one."""

    since: int
    add_attributes: tuple[Attribute, ...] = ()
    add_types: tuple[np.dtype, ...] = ()
    outputs: tuple[str, ...] | None = None  # None: unchanged


def _history(domain: str, op: str, changes: Iterable[Change], versions=None) -> list[OpVersion]:
    """Expand a list of changes into one row per version (or per listed version)."""
    rows, attributes, types, outputs, introduced = [], {}, (), (), {}
    for change in changes:
        for attribute in change.add_attributes:
            attributes[attribute.name] = attribute
            introduced.setdefault(attribute.name, change.since)
        for t in change.add_types:
            introduced.setdefault(f"type:{dtypes.name(t)}", change.since)
        types = types + change.add_types
        outputs = change.outputs if change.outputs is not None else outputs
        if versions is None or change.since in versions:
            rows.append(
                OpVersion(domain, op, change.since, dict(attributes), types, outputs, introduced)
            )
    return rows


_FLOATS = (dtypes.FLOAT16, dtypes.FLOAT32, dtypes.FLOAT64)
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
    ),
    Change(8, add_attributes=(Attribute("storage_order", "int", 0),), outputs=("Y", "Indices")),
    Change(10, add_attributes=(Attribute("ceil_mode", "int", 0), _DILATIONS)),
    Change(11),  # pads may be given with auto_pad NOTSET only; no interface change
    Change(12, add_types=(dtypes.INT8, dtypes.UINT8)),
    Change(22, add_types=(dtypes.BFLOAT16,)),
)

TABLE: dict[tuple[str, str], list[OpVersion]] = {
    (AI_ONNX, "MaxPool"): _history(AI_ONNX, "MaxPool", MAX_POOL_CHANGES),
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
