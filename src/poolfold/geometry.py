"""Window geometry: where windows sit on the spatial axes, and how many there are.

This is the only place the rules live: output sizes for explicit pads (with the ceil-mode drop
rule), SAME_UPPER / SAME_LOWER (dilation included), VALID, pads next to auto_pad, and the
"no window fits" error.  :func:`window_plan` compiles them into a frozen, cached
:class:`WindowPlan`; kernels only execute a plan's tap table.

Per spatial axis, with effective kernel ``K = (k-1)*d + 1``, output position ``o`` reads input
coordinates ``o*s - pad_begin + j*d`` for ``j`` in ``[0, k)``; coordinates outside ``[0, n)``
are padding.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from .errors import PoolfoldError, PoolfoldTypeError
from .memory import building, check_table

AUTO_PADS = ("NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID")

# Attribute values beyond this are refused: they cannot describe a real tensor, and keeping
# them small guarantees every coordinate the kernels compute fits in int64.
MAX_ATTRIBUTE_VALUE = 2**40


def int_tuple(
    label: str, attribute: str, values, length: int, minimum: int, what: str = "attribute"
) -> tuple[int, ...]:
    """Validate a list of integers: ``length`` values, each in ``[minimum, 2**40]``."""
    if isinstance(values, (str, bytes)) or not hasattr(values, "__len__"):
        raise PoolfoldTypeError(
            f"{label}: {what} '{attribute}' must be a sequence of integers, got {values!r}"
        )
    if isinstance(values, np.ndarray):
        # an integer array's values as Python ints (bool arrays, kind "b", stay refused)
        items = values.ravel().tolist() if values.dtype.kind in "iu" else list(values.ravel())
    else:
        items = list(values)
    if not all(type(v) is int for v in items):  # the common case, checked fast; bool is not int
        for v in items:
            if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)):
                raise PoolfoldTypeError(
                    f"{label}: {what} '{attribute}' must hold integers, got {v!r} in {values!r}"
                )
    if len(items) != length:
        raise PoolfoldError(
            f"{label}: {what} '{attribute}' must have {length} values, got {len(items)}: {items}"
        )
    if not items or (min(items) >= minimum and max(items) <= MAX_ATTRIBUTE_VALUE):
        return tuple(int(v) for v in items)
    for v in items:
        if v < minimum:
            raise PoolfoldError(
                f"{label}: {what} '{attribute}' values must be >= {minimum}, got {items}"
            )
        if v > MAX_ATTRIBUTE_VALUE:
            raise PoolfoldError(
                f"{label}: {what} '{attribute}' value {v} is too large (limit {MAX_ATTRIBUTE_VALUE})"
            )
    return tuple(int(v) for v in items)


@dataclass(frozen=True)
class WindowAttributes:
    """Validated kernel / strides / dilations / pads for ``rank`` spatial axes."""

    kernel: tuple[int, ...]
    strides: tuple[int, ...]
    dilations: tuple[int, ...]
    pads: tuple[int, ...]  # begins then ends, as ONNX lists them

    @classmethod
    def validate(
        cls,
        label: str,
        rank: int,
        kernel_shape,
        strides=None,
        dilations=None,
        pads=None,
        kernel_name: str = "kernel_shape",
        what: str = "attribute",
    ) -> "WindowAttributes":
        given = tuple(exact_key(v) for v in (kernel_shape, strides, dilations, pads))
        if INEXACT in given:  # arrays, numpy integers, ...: checked afresh
            return _checked_attributes(label, rank, kernel_name, what, kernel_shape, strides,
                                       dilations, pads)
        return _cached_attributes(label, rank, kernel_name, what, *given)


def _checked_attributes(label, rank, kernel_name, what, kernel_shape, strides, dilations, pads):
    return WindowAttributes(
        int_tuple(label, kernel_name, kernel_shape, rank, 1, what),
        (1,) * rank if strides is None else int_tuple(label, "strides", strides, rank, 1),
        (1,) * rank if dilations is None else int_tuple(label, "dilations", dilations, rank, 1),
        (0,) * (2 * rank) if pads is None else int_tuple(label, "pads", pads, 2 * rank, 0),
    )


# A model calls its ops with the same attributes every run: the checks' result (never an
# error: lru_cache keeps no exceptions) is kept per exact value, as tuples of Python ints.
_cached_attributes = functools.lru_cache(maxsize=512)(_checked_attributes)
INEXACT = object()


def exact_key(values):
    """``values`` as a key that equals only values the checks treat alike (a list or tuple of
    Python ints, or None), else :data:`INEXACT`: ``True == 1`` and ``2.0 == 2``, but bools
    and floats are refused where ints pass, so those never share a key with ints."""
    if values is None:
        return None
    kind = type(values)
    if kind is not tuple and kind is not list:
        return INEXACT
    for v in values:  # a loop, not all() over a generator: a third of the time, per call
        if type(v) is not int:
            return INEXACT
    return values if kind is tuple else tuple(values)


@dataclass(frozen=True)
class TapTable:
    """Per axis and output position: the first input coordinate and the in-bounds taps.

    Arrays are ``(rank, max output size)`` int64.  Along axis ``a``, output position ``o``
    reads coordinates ``first[a, o] + j * dilations[a]`` for ``j`` in ``[lo[a, o], hi[a, o])``;
    ``lo >= hi`` means every tap of that axis is padding (an empty window).
    """

    first: np.ndarray
    lo: np.ndarray
    hi: np.ndarray


class PlanDims(NamedTuple):
    """A plan's per-axis sizes as int64 arrays, the form kernels take them in."""

    in_shape: np.ndarray
    out_shape: np.ndarray
    kernel: np.ndarray
    dilations: np.ndarray


@dataclass(frozen=True)
class WindowPlan:
    """Where the windows of one op call sit; shared by every plane of the tensor."""

    in_shape: tuple[int, ...]  # spatial input dims
    kernel: tuple[int, ...]
    strides: tuple[int, ...]
    dilations: tuple[int, ...]
    pad_begin: tuple[int, ...]  # padding actually applied before each axis
    pad_end: tuple[int, ...]  # padding after each axis that the output can reach
    out_shape: tuple[int, ...]  # spatial output dims, each >= 1
    # The op and version that planned it, for the errors of the tables built from it; not
    # part of the geometry (plans of different ops with the same windows are equal).
    label: str = field(default="", compare=False, repr=False)

    @property
    def rank(self) -> int:
        return len(self.in_shape)

    def __hash__(self) -> int:
        return self._hash

    @functools.cached_property
    def _hash(self) -> int:
        """Computed once: plans key the caches of every call's kernel arguments, and hashing
        seven tuples on each lookup would cost a small call more than its kernel's launch."""
        return hash((self.in_shape, self.kernel, self.strides, self.dilations, self.pad_begin,
                     self.pad_end, self.out_shape))

    def planes_from_leading_axes(self) -> tuple[WindowPlan, int]:
        """This plan without its leading axes that every window spans one element of, in
        place (kernel 1, stride 1, no padding), and how many positions those axes hold: each
        is a plane of its own.  A 3-D 1x3x3 window is a 2-D 3x3 window over D times as many
        planes, the same elements at the same flat offsets (so row-major Indices too).  The
        last axis always stays."""
        m = 0
        while m < self.rank - 1 and self.kernel[m] == 1 and self.strides[m] == 1 and (
                self.pad_begin[m] == 0 and self.pad_end[m] == 0
                and self.out_shape[m] == self.in_shape[m]):
            m += 1
        if m == 0:
            return self, 1
        return WindowPlan(self.in_shape[m:], self.kernel[m:], self.strides[m:],
                          self.dilations[m:], self.pad_begin[m:], self.pad_end[m:],
                          self.out_shape[m:], self.label), math.prod(self.in_shape[:m])

    def first_axis_cut(self, pieces: int) -> WindowPlan:
        """This plan over one of ``pieces`` equal slices of the first axis, for windows that
        tile it (each slice ``in_shape[0] / pieces`` long, holding ``out_shape[0] / pieces``
        whole windows): every slice is a plane of its own, its elements at the same flat
        offsets as in the whole plane (so row-major Indices too)."""
        n, out = self.in_shape[0], self.out_shape[0]
        assert n % pieces == 0 and out % pieces == 0 and n == out * self.strides[0]
        return WindowPlan((n // pieces,) + self.in_shape[1:], self.kernel, self.strides,
                          self.dilations, self.pad_begin, self.pad_end,
                          (out // pieces,) + self.out_shape[1:], self.label)

    @functools.cached_property
    def dims(self) -> PlanDims:
        """Built once per plan (plans are cached), not on every call: kernels only read them."""
        return PlanDims(*(np.array(v, np.int64) for v in (self.in_shape, self.out_shape,
                                                           self.kernel, self.dilations)))

    @functools.cached_property
    def window_offsets(self) -> np.ndarray:
        """Offsets, in a row-major plane, of a whole window's taps from its first tap, in
        window (row-major kernel) order; just ``[0]`` when no window fits wholly inside the
        input, so the array is never larger than a plane."""
        if any((k - 1) * d >= n for n, k, d in zip(self.in_shape, self.kernel, self.dilations)):
            return np.zeros(1, np.int64)
        # No larger than a plane, but a plane of an empty batch holds no data: still checked.
        check_table(self.label, "the window's tap offsets", (math.prod(self.kernel),), np.int64)
        offsets = np.zeros(1, np.int64)
        for k, d, stride in zip(self.kernel, self.dilations, row_major_strides(self.in_shape)):
            offsets = np.add.outer(offsets, np.arange(k, dtype=np.int64) * (d * stride)).ravel()
        return offsets

    @functools.cached_property
    def taps(self) -> TapTable:
        width = max(self.out_shape)
        # A row per output along an axis: an empty batch with huge pads has an output of no
        # element but rows of terabytes, refused here rather than as numpy's MemoryError.
        check_table(self.label, "the window tap table", (3, self.rank, width), np.int64)
        with building(self.label, "the window tap table"):
            first = np.zeros((self.rank, width), np.int64)
            lo = np.zeros((self.rank, width), np.int64)
            hi = np.zeros((self.rank, width), np.int64)
            for a, (n, k, s, d, pb, out) in enumerate(
                zip(self.in_shape, self.kernel, self.strides, self.dilations, self.pad_begin,
                    self.out_shape)
            ):
                start = np.arange(out, dtype=np.int64) * s - pb
                first[a, :out] = start
                # Smallest j with start + j*d >= 0, and one past the largest with
                # start + j*d < n.
                lo[a, :out] = np.maximum(0, -(start // d))
                hi[a, :out] = np.minimum(k, np.maximum(0, (n - start + d - 1) // d))
        return TapTable(first, lo, hi)


# Tap positions are int64 in the kernels (start + j * dilation): windows whose extent with
# their pads passes this are refused rather than overflowing (SAME pads of a 2**40 kernel
# dilated by 2**40 are about 2**79).
POSITION_LIMIT = 2**62


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def window_plan(
    label: str,
    in_shape: tuple[int, ...],
    attributes: WindowAttributes,
    auto_pad: str = "NOTSET",
    ceil_mode: bool = False,
    kernel_name: str = "attribute 'kernel_shape'",
    indexed: bool = True,
) -> WindowPlan:
    """Compute the output size and begin pads of every spatial axis (see the module doc).

    ``label`` names the op and version in error messages, ``kernel_name`` what sets the kernel.
    ``indexed``: kernels will index the windows' positions (int64), which POSITION_LIMIT
    bounds; a plan of shapes alone (``max_pool_shape``) has no such limit.
    Plans are cached: a model's repeated calls with the same shapes reuse them.
    """
    if not isinstance(auto_pad, str):
        raise PoolfoldTypeError(f"{label}: attribute 'auto_pad' must be a string, got {auto_pad!r}")
    return _window_plan(label, tuple(in_shape), attributes, auto_pad, bool(ceil_mode), kernel_name,
                        indexed)


@functools.lru_cache(maxsize=512)
def _window_plan(label, in_shape, attributes, auto_pad, ceil_mode, kernel_name,
                 indexed=True) -> WindowPlan:
    if auto_pad not in AUTO_PADS:
        raise PoolfoldError(
            f"{label}: attribute 'auto_pad' must be one of {', '.join(AUTO_PADS)}, got {auto_pad!r}"
        )
    rank = len(in_shape)
    pads = attributes.pads
    if auto_pad != "NOTSET" and any(pads):
        raise PoolfoldError(
            f"{label}: attribute 'pads' {list(pads)} cannot be used with auto_pad {auto_pad}"
            " (only all-zero pads are allowed there)"
        )
    begins, ends, outs = [], [], []
    for a in range(rank):
        n, k, s, d = in_shape[a], attributes.kernel[a], attributes.strides[a], attributes.dilations[a]
        span = (k - 1) * d + 1
        if auto_pad == "NOTSET":
            pb, pe = pads[a], pads[a + rank]
            if ceil_mode:
                out = _ceil_div(n + pb + pe - span, s) + 1
                if (out - 1) * s >= n + pb:  # the last window would start in the end padding
                    out -= 1
            else:
                out = (n + pb + pe - span) // s + 1
        elif auto_pad == "VALID":
            pb = pe = 0
            out = (n - span) // s + 1
        else:
            out = _ceil_div(n, s)
            total = max(0, (out - 1) * s + span - n)
            pb = total // 2 if auto_pad == "SAME_UPPER" else total - total // 2
            pe = total - pb
        if out < 1:
            raise PoolfoldError(
                f"{label}: no window fits along spatial axis {a}: input size {n}, "
                f"{kernel_name} {k} (dilated extent {span}), pads {pb}+{pe}, "
                f"stride {s}, auto_pad {auto_pad}"
            )
        if indexed and pb + (out - 1) * s + span + n >= POSITION_LIMIT:
            raise PoolfoldError(
                f"{label}: the windows along spatial axis {a} reach {pb + (out - 1) * s + span}"
                f" positions past the input's start (pads {pb}+{pe}, {kernel_name} {k}, "
                f"dilation {d}, auto_pad {auto_pad}): beyond the 2**62 positions poolfold "
                "can index"
            )
        begins.append(pb)
        ends.append(pe)
        outs.append(out)
    return WindowPlan(
        tuple(in_shape),
        attributes.kernel,
        attributes.strides,
        attributes.dilations,
        tuple(begins),
        tuple(ends),
        tuple(outs),
        label,
    )


def unpooled_shape(label: str, in_shape: tuple[int, ...], attributes: WindowAttributes):
    """MaxUnpool's inferred spatial output: ``(in - 1)*s + k - pb - pe`` per axis, each >= 1."""
    rank = len(in_shape)
    out = []
    for a, n in enumerate(in_shape):
        size = (n - 1) * attributes.strides[a] + attributes.kernel[a] - attributes.pads[a] \
            - attributes.pads[a + rank]
        if size < 1:
            raise PoolfoldError(
                f"{label}: the inferred output size along spatial axis {a} is {size} < 1 "
                f"(input {n}, attribute 'kernel_shape' {attributes.kernel[a]}, "
                f"strides {attributes.strides[a]}, pads {attributes.pads[a]}+"
                f"{attributes.pads[a + rank]}); give a larger input or an output_shape"
            )
        out.append(size)
    return tuple(out)


def row_major_strides(shape) -> np.ndarray:
    """Element strides of a C-contiguous array of ``shape``."""
    strides = np.ones(len(shape), np.int64)
    for a in range(len(shape) - 2, -1, -1):
        strides[a] = strides[a + 1] * shape[a + 1]
    return strides
