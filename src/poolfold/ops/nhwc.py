"""The com.ms.internal.nhwc domain: channels-last MaxPool and MaxUnpool with fused activations.

X and Y are ``(N, D1, ..., Dr, C)``.  MaxPool's Indices and MaxUnpool's I and output_shape
stay channels-first (NCHW shape, NCHW-flat values), as onnxruntime's layout transformer
leaves them.  Everything else (versions, attributes, geometry, index rules) is the ai.onnx
op's, through the same code.
"""

from __future__ import annotations

import functools

import numpy as np

from .. import activations, dtypes, schema
from . import averaging
from ..geometry import WindowPlan
from ..kernels import launch_split
from ..kernels.activation import IDENTITY, activate_in_place
from ..kernels.channels_last import nchw_indices
from ..memory import allocate
from ._common import as_tensor
from .max_pool import check_index_request, pool_channels_last, pool_planes, resolve_plan
from .max_unpool import resolve_indices, unpool_planes


def _nchw_shape(shape: tuple[int, ...]) -> tuple[int, ...]:
    return (shape[0], shape[-1]) + tuple(shape[1:-1])


@functools.lru_cache(maxsize=512)
def _with_channels(plan: WindowPlan, channels: int) -> WindowPlan:
    """``plan`` over ``(spatial..., C)``: one more axis, with a window of one on C (cached, as
    plans are, so its tap table is built once)."""
    return WindowPlan(plan.in_shape + (channels,), plan.kernel + (1,), plan.strides + (1,),
                      plan.dilations + (1,), plan.pad_begin + (0,), plan.pad_end + (0,),
                      plan.out_shape + (channels,), plan.label)


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
    ``activation_params`` is applied to every element of Y (empty windows included).

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
    pooled = pool_channels_last(spec.label, x, plan, return_indices, storage_order)
    if pooled is not None:  # the separable passes, the channels riding along
        y, indices = pooled
    else:
        y, indices = _pool_as_planes(spec.label, x, plan, return_indices, storage_order)
    if act.code != IDENTITY and y.size:
        launch_split(activate_in_place, y.size, dtypes.bits_view(y).reshape(-1), act.code,
                     act.params, act.table, work=y.size)
    return (y, indices) if return_indices else y


def _pool_as_planes(label, x, plan, return_indices, storage_order):
    """Each sample as one plane with C as a last axis pooled by windows of one: the NCHW
    kernels, reading C-long contiguous runs; Y comes out channels-last, Indices NCHW."""
    n, c = x.shape[0], x.shape[-1]
    y, recorded = pool_planes(label, x.reshape((n, 1) + x.shape[1:]), _with_channels(plan, c),
                              return_indices, 0)
    y = y.reshape((n,) + plan.out_shape + (c,))
    indices = None
    if return_indices:
        indices = allocate(label, "Indices", (n, c) + plan.out_shape, np.int64)
        if indices.size:
            launch_split(nchw_indices, n * c, recorded.reshape(n, -1, c),
                         indices.reshape(n, c, -1), plan.dims.in_shape, storage_order == 1,
                         work=2 * indices.size)
    return y, indices


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


def average_pool(x, kernel_shape, *, strides=None, pads=None, dilations=None,
                 auto_pad="NOTSET", ceil_mode=0, count_include_pad=0, activation=None,
                 activation_params=None, opset=None):
    """Channels-last AveragePool (com.ms.internal.nhwc, versions 7, 10, 11, 19): ``x`` and Y
    are ``(N, D1, ..., Dr, C)``; the values are the ai.onnx AveragePool's, then the fused
    ``activation`` if any.

    >>> import numpy as np
    >>> x = np.arange(8, dtype=np.float32).reshape(1, 4, 2)   # N, W, C
    >>> average_pool(x, [2], strides=[2])[0].tolist()
    [[1.0, 2.0], [5.0, 6.0]]
    """
    return averaging.nhwc_average_pool(
        x, kernel_shape, strides=strides, pads=pads, dilations=dilations, auto_pad=auto_pad,
        ceil_mode=ceil_mode, count_include_pad=count_include_pad, activation=activation,
        activation_params=activation_params, opset=opset)


def lp_pool(x, kernel_shape, *, p=2, strides=None, pads=None, dilations=None,
            auto_pad="NOTSET", ceil_mode=0, opset=None):
    """Channels-last LpPool (com.ms.internal.nhwc, versions 11 and 18)."""
    return averaging.nhwc_lp_pool(x, kernel_shape, p=p, strides=strides, pads=pads,
                                  dilations=dilations, auto_pad=auto_pad, ceil_mode=ceil_mode,
                                  opset=opset)


def global_max_pool(x, *, opset=None):
    """Channels-last GlobalMaxPool (com.ms.internal.nhwc, version 1): Y is
    ``(N, 1, ..., 1, C)``."""
    return averaging.nhwc_global_pool("GlobalMaxPool", "max", x, opset)


def global_average_pool(x, *, opset=None):
    """Channels-last GlobalAveragePool (com.ms.internal.nhwc, version 1)."""
    return averaging.nhwc_global_pool("GlobalAveragePool", "average", x, opset)


def global_lp_pool(x, *, p=2, opset=None):
    """Channels-last GlobalLpPool (com.ms.internal.nhwc, version 2)."""
    return averaging.nhwc_global_pool("GlobalLpPool", "lp", x, opset, p)
