"""The com.ms.internal.nhwc domain: channels-last MaxPool and MaxUnpool with fused activations.

X and Y are ``(N, D1, ..., Dr, C)``.  MaxPool's Indices and MaxUnpool's I and output_shape
stay channels-first (NCHW shape, NCHW-flat values), as onnxruntime's layout transformer
leaves them.  Everything else (versions, attributes, geometry, index rules) is the ai.onnx
op's, through the same code.
"""

from __future__ import annotations

import numpy as np

from .. import activations, dtypes, schema
from ..kernels import launch
from ..kernels.window_max_channels_last import window_max_channels_last
from ..memory import allocate
from ._common import as_tensor
from .max_pool import check_index_request, resolve_plan
from .max_unpool import resolve_indices, unpool_planes


def _nchw_shape(shape: tuple[int, ...]) -> tuple[int, ...]:
    return (shape[0], shape[-1]) + tuple(shape[1:-1])


def max_pool(
    x,
    kernel_shape,
    *,
    strides=None,
    pads=None,
    dilations=None,
    auto_pad="NOTSET",
    ceil_mode=False,
    storage_order=0,
    return_indices=False,
    activation=None,
    activation_params=None,
    opset=None,
):
    """Channels-last MaxPool (com.ms.internal.nhwc, versions 1, 8, 10, 11, 12).

    ``x`` is ``(N, D1, ..., Dr, C)`` and so is Y; Indices (with ``return_indices``) are the
    ai.onnx MaxPool's on the NCHW tensor: shape ``(N, C, out...)``, NCHW-flat values.
    ``activation`` (Relu, Tanh, Sigmoid, LeakyRelu, Clip, HardSigmoid) with its
    ``activation_params`` is applied to every element of Y as it is stored.

    >>> import numpy as np
    >>> x = np.arange(32, dtype=np.float32).reshape(1, 4, 4, 2) - 16   # N, H, W, C
    >>> max_pool(x, [2, 2], strides=[2, 2], activation="Relu")[0, :, :, 0].tolist()
    [[0.0, 0.0], [10.0, 14.0]]
    """
    spec = schema.resolve("MaxPool", opset, schema.NHWC)
    storage_order = check_index_request(spec, storage_order, return_indices)
    x = as_tensor(spec, x, "X")
    act = activations.resolve(spec, activation, activation_params, x.dtype)
    nchw = _nchw_shape(x.shape)
    plan = resolve_plan(spec, nchw, kernel_shape, strides, pads, dilations, auto_pad, ceil_mode)
    n, c = nchw[:2]
    y = allocate(spec.label, "Y", (n,) + plan.out_shape + (c,), x.dtype)
    indices = allocate(spec.label, "Indices", (n, c) + plan.out_shape, np.int64) \
        if return_indices else None
    if y.size:
        xs, half_inf_bits = dtypes.comparable(np.ascontiguousarray(x).reshape(n, -1, c))
        empty_value, _ = dtypes.comparable(dtypes.lowest(x.dtype))
        taps = plan.taps
        launch(
            window_max_channels_last,
            xs,
            dtypes.bits_view(y).reshape(n, -1, c),
            indices.reshape(n, c, -1) if return_indices else np.empty((0, 0, 0), np.int64),
            return_indices,
            taps.first,
            taps.lo,
            taps.hi,
            np.array(plan.in_shape, np.int64),
            np.array(plan.out_shape, np.int64),
            np.array(plan.dilations, np.int64),
            storage_order == 1,
            empty_value[()],
            half_inf_bits,
            act.code,
            act.params,
            act.table,
        )
    return (y, indices) if return_indices else y


def max_unpool(
    x,
    indices,
    kernel_shape,
    *,
    strides=None,
    pads=None,
    output_shape=None,
    activation=None,
    activation_params=None,
    opset=None,
    inferred_shape_indices=False,
):
    """Channels-last MaxUnpool (com.ms.internal.nhwc, versions 9 and 11).

    ``x`` is ``(N, D1, ..., Dr, C)`` and so is the result; ``indices`` has the NCHW shape
    ``(N, C, D1, ..., Dr)`` with NCHW-flat values, and ``output_shape`` is NCHW-ordered, as
    the ai.onnx MaxUnpool would take them.  The activation applies to every element of the
    result, the zeros included.
    """
    spec = schema.resolve("MaxUnpool", opset, schema.NHWC)
    x = as_tensor(spec, x, "X")
    act = activations.resolve(spec, activation, activation_params, x.dtype)
    indices, out_shape = resolve_indices(
        spec, _nchw_shape(x.shape), x.dtype, indices, kernel_shape, strides, pads, output_shape,
        inferred_shape_indices,
    )
    return unpool_planes(spec, x, indices, out_shape, act, channels_last=True)
