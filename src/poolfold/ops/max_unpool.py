"""MaxUnpool, versions 9, 11 and 22, any spatial rank."""

from __future__ import annotations

import math

import numpy as np

from .. import activations, dtypes, schema
from ..errors import PoolfoldError, PoolfoldTypeError
from ..geometry import WindowAttributes, unpooled_shape
from ..kernels.threads import kernel_threads, launch, launch_split, split_parts
from ..kernels.scatter import first_out_of_range, scatter_ordered, scatter_planes
from ..memory import allocate, check_size
from ._common import as_tensor, int64_tensor, kernel_input
from .layout import channels_last_order, is_channels_last, nchw_order


def resolve_output_shape(spec, x_shape, output_shape) -> tuple[int, ...]:
    """Check the output_shape input against X's NCHW-ordered ``x_shape``: rank(X) integers,
    N and C as X's, spatial dims >= 1 (in memory and chunked alike)."""
    if isinstance(output_shape, np.ndarray):
        output_shape = int64_tensor(spec, output_shape, "output_shape")
        if output_shape.ndim != 1:
            raise PoolfoldError(
                f"{spec.label}: input 'output_shape' must be 1-D, got shape {output_shape.shape}"
            )
        values = output_shape.tolist()  # Python ints, as the check below wants them
    else:
        values = list(output_shape) if hasattr(output_shape, "__len__") else None
    if values is None or any(
        isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)) for v in values
    ):
        raise PoolfoldTypeError(
            f"{spec.label}: input 'output_shape' must be a sequence of integers, "
            f"got {output_shape!r}"
        )
    shape = tuple(int(v) for v in values)
    if len(shape) != len(x_shape):
        raise PoolfoldError(
            f"{spec.label}: input 'output_shape' must have {len(x_shape)} values "
            f"(the rank of X), got {list(shape)}"
        )
    if shape[:2] != tuple(x_shape[:2]):
        raise PoolfoldError(
            f"{spec.label}: input 'output_shape' {list(shape)} must keep X's N and C "
            f"{list(x_shape[:2])}"
        )
    if min(shape[2:]) < 1:
        raise PoolfoldError(
            f"{spec.label}: input 'output_shape' {list(shape)} has a spatial dim < 1"
        )
    return shape


def _check_range(label: str, indices: np.ndarray, total: int, out_shape, space="the output"):
    """Raise for the first index (row-major in I) outside ``[0, total)``."""
    position = launch(first_out_of_range, kernel_input(np.ascontiguousarray(indices).reshape(-1)),
                      total)
    if position >= 0:
        raise PoolfoldError(
            f"{label}: input 'I' holds index {int(indices.flat[position])} at position "
            f"{tuple(int(i) for i in np.unravel_index(position, indices.shape))}, outside the "
            f"valid range [0, {total}) of {space} {tuple(out_shape)}"
        )


def _from_inferred_space(spec, indices, inferred_shape, out_shape):
    """Re-express indices given as flat positions in ``inferred_shape`` as flat positions in
    ``out_shape``, the inferred block being pasted at the output's origin."""
    _check_range(spec.label, indices, math.prod(inferred_shape), inferred_shape,
                 "the inferred shape")
    coords = np.unravel_index(indices, inferred_shape)
    outside = np.zeros(indices.shape, bool)
    for axis in range(2, len(out_shape)):
        outside |= coords[axis] >= out_shape[axis]
    if outside.any():
        flat_position = int(np.flatnonzero(outside.ravel())[0])
        raise PoolfoldError(
            f"{spec.label}: input 'I' holds index {int(indices.flat[flat_position])} at position "
            f"{tuple(int(i) for i in np.unravel_index(flat_position, indices.shape))}, which "
            f"lies outside output_shape {tuple(out_shape)} when read in the inferred shape "
            f"{tuple(inferred_shape)}"
        )
    return np.ravel_multi_index(coords, out_shape).astype(np.int64)


def max_unpool(
    x,
    indices,
    kernel_shape,
    *,
    strides=None,
    pads=None,
    output_shape=None,
    opset=None,
    inferred_shape_indices=False,
):
    """ONNX MaxUnpool: scatter X to the flat positions I of a zero tensor.

    Without ``output_shape`` the output's spatial dims are ``(in-1)*s + k - pb - pe``; with it,
    the output has exactly that shape (pads are then ignored).  I holds flat positions in the
    output tensor, as MaxPool produced them from the tensor being restored, so
    ``max_unpool(*max_pool(x, k, return_indices=True), k, output_shape=x.shape)`` puts every
    maximum back in its place.  Every index is checked before anything is written; on duplicate
    indices the element of X that comes last in row-major order wins.

    ``inferred_shape_indices=True`` reads I as flat positions in the *inferred* shape and pastes
    that block at the origin of the ``output_shape`` tensor.  This reproduces the ONNX page's
    ``with_output_shape`` example (and onnx's reference implementation); it is not what
    onnxruntime or PyTorch do and is off by default (see the README's divergences section).

    >>> import numpy as np
    >>> x = np.array([[[[5.0, 6.0], [7.0, 8.0]]]], np.float32)
    >>> i = np.array([[[[5, 7], [13, 15]]]], np.int64)
    >>> max_unpool(x, i, [2, 2], strides=[2, 2])[0, 0].tolist()
    [[0.0, 0.0, 0.0, 0.0], [0.0, 5.0, 0.0, 6.0], [0.0, 0.0, 0.0, 0.0], [0.0, 7.0, 0.0, 8.0]]
    """
    spec = schema.resolve("MaxUnpool", opset)
    x, indices, launch = prepare(spec, x, indices, kernel_shape, strides=strides, pads=pads,
                                 output_shape=output_shape,
                                 inferred_shape_indices=inferred_shape_indices)
    return launch(x, indices)


def prepare(spec, x, indices, kernel_shape, *, strides=None, pads=None, output_shape=None,
            activation=None, activation_params=None, inferred_shape_indices=False):
    """:func:`max_unpool`'s checks, and the channels-last MaxUnpool's
    (:func:`poolfold.nhwc.max_unpool`, its fused activation included) for a ``spec`` of
    that domain: X and I as the kernel takes them (I as flat positions in the output), and
    the :class:`UnpoolLaunch` that scatters them.  The launch serves any X and I of these
    shapes and types, with the same output_shape."""
    channels_last = is_channels_last(spec)
    x = as_tensor(spec, x, "X")
    act = activations.resolve(spec, activation, activation_params, x.dtype)
    indices, out_shape = resolve_indices(
        spec, nchw_order(x.shape) if channels_last else x.shape, x.dtype, indices, kernel_shape,
        strides, pads, output_shape, inferred_shape_indices,
    )
    return x, indices, UnpoolLaunch(spec.label, x.dtype, out_shape, act, channels_last, x.size,
                                    kernel_threads())


def resolve_indices(spec, shape, dtype, indices, kernel_shape, strides, pads, output_shape,
                    inferred_shape_indices):
    """Check I and the attributes for an X of NCHW-ordered ``shape`` and ``dtype``: (I as flat
    positions in the output, the output's NCHW shape)."""
    indices = int64_tensor(spec, indices, "I")
    if indices.shape != tuple(shape):
        raise PoolfoldError(
            f"{spec.label}: input 'I' {indices.shape} must have the (NCHW) shape of X, {tuple(shape)}"
        )
    spatial = tuple(shape[2:])
    attributes = WindowAttributes.validate(spec.label, len(spatial), kernel_shape, strides, None, pads)
    if output_shape is None:
        return indices, tuple(shape[:2]) + unpooled_shape(spec.label, spatial, attributes)
    # With output_shape the pads are ignored (docs/semantics.md), so the inferred shape is needed,
    # and must be valid, only to read indices in it.
    out_shape = resolve_output_shape(spec, shape, output_shape)
    check_size(spec.label, "output", out_shape, dtype)
    if inferred_shape_indices:
        inferred = tuple(shape[:2]) + unpooled_shape(spec.label, spatial, attributes)
        indices = _from_inferred_space(spec, indices, inferred, out_shape)
    return indices, out_shape


class UnpoolLaunch:
    """Everything a MaxUnpool call does besides touching its arrays, for one output shape,
    type, activation and layout: the output's size check, the fill value and the parts.  A
    prepared node keeps it (:mod:`poolfold.nodes`); the range of I is checked on every call,
    by the kernel.  ``x_size`` is X's number of elements."""

    def __init__(self, label, dtype, out_shape, activation, channels_last, x_size, threads):
        n, c = out_shape[:2]
        self.label = label
        self.dtype = dtype
        self.out_shape = tuple(out_shape)  # NCHW
        self.shape = channels_last_order(self.out_shape) if channels_last else self.out_shape
        check_size(label, "output", self.shape, dtype)
        self.channels_last = channels_last
        self.fill = activation.scalar(np.zeros((), dtype))
        self.fill_bits = dtypes.bits_view(self.fill)[()]
        self.act = (activation.code, activation.params, activation.table)
        self.parts = split_parts(n * c, 2 * x_size + math.prod(self.shape), threads)

    def __call__(self, x: np.ndarray, indices: np.ndarray) -> np.ndarray:
        y = allocate(self.label, "output", self.shape, self.dtype, size_checked=True)
        if x.size == 0:
            y[...] = self.fill
            return y
        n, c = self.out_shape[:2]
        index_planes = kernel_input(np.ascontiguousarray(indices).reshape(n, c, -1))
        xs = kernel_input(dtypes.bits_view(np.ascontiguousarray(x)))
        ys = dtypes.bits_view(y)
        if self.channels_last:  # (N, C, S) views of the channels-last memory: no copies
            xs = xs.reshape(n, -1, c).transpose(0, 2, 1)
            ys = ys.reshape(n, -1, c).transpose(0, 2, 1)
        else:
            xs = xs.reshape(n, c, -1)
            ys = ys.reshape(n, c, -1)
        if any(launch_split(scatter_planes, n * c, xs, index_planes, ys, self.fill_bits,
                            *self.act, parts=self.parts)):
            # Some index leaves its plane: check them all, then one ordered pass.
            _check_range(self.label, indices, math.prod(self.out_shape), self.out_shape)
            ys[...] = self.fill_bits
            launch(scatter_ordered, xs, index_planes, ys, *self.act)
        return y
