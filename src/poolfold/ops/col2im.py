"""Col2Im (version 18): fold columns of blocks back into an image, any spatial rank, every type."""

from __future__ import annotations

import functools
import math

import numpy as np

from .. import dtypes, schema
from ..errors import PoolfoldError, PoolfoldTypeError
from ..geometry import WindowAttributes, WindowPlan, int_tuple, window_plan
from ..kernels.native_split import Crew
from ..kernels.threads import kernel_threads, launch_split, split_parts
from ..kernels.fold import fold, fold_tables
from ..memory import allocate, check_size, line_rows
from ._common import CallCache, as_tensor, int64_tensor, kernel_input


def _shape_input(spec, name: str, value, rank: int | None = None) -> tuple[int, ...]:
    """image_shape / block_shape: a 1-D list of integers >= 1 (of ``rank`` values if given)."""
    if isinstance(value, np.ndarray):
        value = int64_tensor(spec, value, name)
        if value.ndim != 1:
            raise PoolfoldError(f"{spec.label}: input '{name}' must be 1-D, got shape {value.shape}")
    length = len(value) if rank is None and hasattr(value, "__len__") else rank
    if length == 0:
        raise PoolfoldError(f"{spec.label}: input '{name}' must not be empty")
    return int_tuple(spec.label, name, value, length if length is not None else -1, 1, "input")


def fold_plan(spec, shape, image_shape, block_shape, strides, dilations, pads):
    """Check the input's rank and dim 1 and the fold's attributes against each other, and plan
    the blocks over the image: ``(image, block, plan)``."""
    if len(shape) != 3:
        raise PoolfoldError(
            f"{spec.label}: input 'input' must have rank 3 [N, C*prod(block_shape), L], "
            f"got shape {tuple(shape)}"
        )
    image = _shape_input(spec, "image_shape", image_shape)
    block = _shape_input(spec, "block_shape", block_shape, len(image))
    attributes = WindowAttributes.validate(
        spec.label, len(image), block, strides, dilations, pads, "block_shape", "input"
    )
    plan = window_plan(spec.label, image, attributes, kernel_name="input 'block_shape'")
    block_size = math.prod(block)
    if shape[1] % block_size:
        raise PoolfoldError(
            f"{spec.label}: dim 1 of input 'input' ({shape[1]}) is not a multiple of "
            f"prod(block_shape) = {block_size} (block_shape {list(block)})"
        )
    return image, block, attributes, plan


def col2im(x, image_shape, block_shape, *, dilations=None, pads=None, strides=None, opset=None):
    """ONNX Col2Im: ``x`` of shape ``[N, C*prod(block_shape), L]`` folded into
    ``[N, C, *image_shape]`` by summing overlapping blocks.

    Any spatial rank r >= 1 and every tensor type: integers wrap, bool sums are logical OR,
    float16 / bfloat16 accumulate in float32 and round once, strings concatenate in
    increasing block order; positions no block reaches are 0 / False / "".

    >>> import numpy as np
    >>> x = np.ones((1, 4, 4), np.float32)          # 2x2 blocks over a 3x3 image
    >>> col2im(x, [3, 3], [2, 2])[0, 0].tolist()
    [[1.0, 2.0, 1.0], [2.0, 4.0, 2.0], [1.0, 2.0, 1.0]]
    """
    key, launch = _LAUNCHES.find(x, (image_shape, block_shape, dilations, pads, strides),
                                 (opset,))
    if launch is None:
        x, launch = prepare(schema.resolve("Col2Im", opset), x, image_shape, block_shape,
                            dilations=dilations, pads=pads, strides=strides)
        _LAUNCHES.keep(key, launch)
    return launch(x)


# The launches of calls checked before (see CallCache): a launch keeps its kernel's crew,
# whose first threaded call looks the kernel up (about 0.1 ms, numba's Python typeof).
_LAUNCHES = CallCache()


def prepare(spec, x, image_shape, block_shape, *, dilations=None, pads=None, strides=None):
    """:func:`col2im`'s checks: the input as the kernel takes it, and the :class:`FoldLaunch`
    that folds it, which serves any input of this shape and type with the same image_shape
    and block_shape."""
    x = as_tensor(spec, x, "input")
    image, block, attributes, plan = fold_plan(spec, x.shape, image_shape, block_shape, strides,
                                               dilations, pads)
    block_size = math.prod(block)
    blocks = math.prod(plan.out_shape)
    if x.shape[2] != blocks:
        raise PoolfoldError(
            f"{spec.label}: dim 2 of input 'input' ({x.shape[2]}) must equal the number of "
            f"blocks, {blocks} (a {'x'.join(map(str, plan.out_shape))} grid for image_shape "
            f"{list(image)}, block_shape {list(block)}, strides {list(plan.strides)}, "
            f"dilations {list(plan.dilations)}, pads {list(attributes.pads)})"
        )
    out_shape = (x.shape[0], x.shape[1] // block_size) + image
    return x, FoldLaunch(spec, x.dtype, plan, out_shape, x.size, kernel_threads())


class FoldLaunch:
    """Everything a Col2Im call does besides touching its arrays, for one plan, type and
    output shape: the output's size check, the kernel's tables and its parts.  A prepared
    node keeps it (:mod:`poolfold.nodes`).  ``x_size`` is the input's number of elements."""

    def __init__(self, spec, dtype, plan: WindowPlan, out_shape, x_size, threads):
        self.spec = spec
        self.plan = plan
        self.out_shape = out_shape
        self.strings = dtypes.name(dtype) == dtypes.STRING
        self.half = dtypes.is_half(dtype)
        # Half types accumulate in float32, then round once.
        self.accumulator = np.float32 if self.half else dtype
        self.planes = out_shape[0] * out_shape[1]
        if not self.strings:
            check_size(spec.label, "output", out_shape, self.accumulator)
            # An output of no plane needs no tables (and an empty batch's may be huge).
            self.tables = fold_tables(plan) if self.planes else None
            self.identity = fold_identity(dtype)
        self.block_size = math.prod(plan.kernel)
        self.parts = split_parts(self.planes, x_size + math.prod(out_shape), threads)
        self.crew = Crew()  # its threaded calls run without the GIL once compiled

    def __call__(self, x: np.ndarray) -> np.ndarray:
        if self.strings:
            return fold_strings(self.spec, x, self.plan, self.out_shape)
        out = allocate(self.spec.label, "output", self.out_shape, self.accumulator,
                       size_checked=True)
        planes = self.planes
        if planes != 0:
            launch_split(
                fold,
                planes,
                kernel_input(dtypes.value_view(np.ascontiguousarray(x)).reshape(
                    planes, self.block_size, x.shape[2])),
                out.reshape(planes, -1),
                *self.tables,
                self.identity,
                False,  # a fresh image: overwrite
                line_rows(planes, 2 * self.plan.rank),  # the kernel's counters
                parts=self.parts,
                crew=self.crew,
            )
        return out.astype(x.dtype) if self.half else out


@functools.lru_cache(maxsize=64)
def fold_identity(dtype: np.dtype):
    """The additive identity as the scalar the fold kernel takes (one per dtype)."""
    return dtypes.value_view(dtypes.additive_identity(dtype))[()]


def fold_strings(spec, x, plan: WindowPlan, out_shape):
    """The fold of a string tensor, in memory and per chunk (:mod:`poolfold.dask.fold`).
    Strings concatenate; numba has no string arrays, so this path is vectorised numpy:
    one step per block, over every plane and block offset at once (offsets of one block land
    on distinct positions, so each step is a plain fancy-indexed concatenation)."""
    if x.dtype.kind == "O":
        is_str = np.frompyfunc(lambda v: isinstance(v, (str, bytes)), 1, 1)(x).astype(bool)
        if not is_str.all():
            bad = next(v for v in x.ravel() if not isinstance(v, (str, bytes)))
            raise PoolfoldTypeError(
                f"{spec.label}: input 'input' is an object array holding {type(bad).__name__} "
                f"{bad!r}; string tensors must hold str"
            )
    empty = b"" if x.dtype.kind == "S" else ""
    planes = out_shape[0] * out_shape[1]
    block_size = math.prod(plan.kernel)
    out = allocate(spec.label, "output", (planes, math.prod(plan.in_shape)), object, empty)
    if planes == 0:  # nothing to fold: no Python loop over an empty batch's blocks
        return out.reshape(out_shape) if x.dtype.kind == "O" else \
            out.reshape(out_shape).astype(x.dtype.kind)
    columns = x.reshape(planes, block_size, x.shape[2]).astype(object)
    offsets = np.indices(plan.kernel).reshape(plan.rank, -1)  # block offsets, row-major
    taps = plan.taps
    image_strides = [math.prod(plan.in_shape[a + 1:]) for a in range(plan.rank)]
    for l, grid in enumerate(np.ndindex(*plan.out_shape)):
        valid = np.ones(block_size, bool)
        position = np.zeros(block_size, np.int64)
        for a, g in enumerate(grid):
            valid &= (taps.lo[a, g] <= offsets[a]) & (offsets[a] < taps.hi[a, g])
            position += (taps.first[a, g] + offsets[a] * plan.dilations[a]) * image_strides[a]
        out[:, position[valid]] = out[:, position[valid]] + columns[:, valid, l]
    out = out.reshape(out_shape)
    return out if x.dtype.kind == "O" else out.astype(x.dtype.kind)
