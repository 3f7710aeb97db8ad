"""The com.ms.internal.nhwc domain: channels-last MaxPool and MaxUnpool with fused activations.

X and Y are ``(N, D1, ..., Dr, C)``.  MaxPool's Indices and MaxUnpool's I and output_shape
stay channels-first (NCHW shape, NCHW-flat values), as onnxruntime's layout transformer
leaves them (:mod:`poolfold.ops.layout`).  Everything else (versions, attributes, geometry,
index rules) is the ai.onnx op's, through the same code: MaxUnpool and the averaging family
are prepared by their ai.onnx modules, which read the layout from the version's domain.
"""

from __future__ import annotations

import functools

import numpy as np

from .. import activations, schema
from . import averaging
from ..kernels.channels_last import nchw_indices
from ..kernels.threads import launch_split
from ..memory import allocate
from ._common import CallCache, activate, as_tensor
from .layout import nchw_order, with_channels
from .max_unpool import prepare as prepare_max_unpool
from .max_pool import check_index_request, pool_channels_last, pool_planes, resolve_plan


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
    key, launch = _CALLS.find(
        x, (kernel_shape, strides, pads, dilations),
        ("MaxPool", auto_pad, ceil_mode, storage_order, return_indices, activation,
         activation_params, opset))
    if launch is None:
        x, launch = prepare_max_pool(
            schema.resolve("MaxPool", opset, schema.NHWC), x, kernel_shape, strides=strides,
            pads=pads, dilations=dilations, auto_pad=auto_pad, ceil_mode=ceil_mode,
            storage_order=storage_order, return_indices=return_indices,
            activation=activation, activation_params=activation_params)
        _CALLS.keep(key, launch)
    y, indices = launch(x)
    return (y, indices) if return_indices else y


def prepare_max_pool(spec, x, kernel_shape, *, strides=None, pads=None, dilations=None,
                     auto_pad="NOTSET", ceil_mode=False, storage_order=0, return_indices=False,
                     activation=None, activation_params=None):
    """:func:`max_pool`'s checks: X as the kernels take it, and the launch that pools it into
    ``(Y, Indices or None)``, the activation applied, which serves any X of this shape and
    type."""
    storage_order = check_index_request(spec, storage_order, return_indices)
    x = as_tensor(spec, x, "X")
    act = activations.resolve(spec, activation, activation_params, x.dtype)
    plan = resolve_plan(spec, nchw_order(x.shape), kernel_shape, strides, pads, dilations,
                        auto_pad, ceil_mode)
    return x, functools.partial(_pool, spec.label, plan, return_indices, storage_order, act)


def _pool(label, plan, return_indices, storage_order, act, x):
    """A prepared MaxPool's launch: ``(Y, Indices or None)`` of a checked X."""
    y, indices = pool_nhwc(label, x, plan, return_indices, storage_order)
    return activate(y, act), indices


def pool_nhwc(label, x, plan, return_indices, storage_order):
    """A checked channels-last X pooled (before any activation): Y channels-last, and
    Indices NCHW (shape and values) or None.  Every channels-last MaxPool goes through here,
    each chunk of :func:`poolfold.dask.nhwc.max_pool` included."""
    pooled = pool_channels_last(label, x, plan, return_indices, storage_order)
    if pooled is not None:  # the separable passes, the channels riding along
        return pooled
    return _pool_as_planes(label, x, plan, return_indices, storage_order)


def _pool_as_planes(label, x, plan, return_indices, storage_order):
    """Each sample as one plane with C as a last axis pooled by windows of one: the NCHW
    kernels, reading C-long contiguous runs; Y comes out channels-last, Indices NCHW."""
    n, c = x.shape[0], x.shape[-1]
    y, recorded = pool_planes(label, x.reshape((n, 1) + x.shape[1:]), with_channels(plan, c),
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
    x, indices, launch = prepare_max_unpool(
        spec, x, indices, kernel_shape, strides=strides, pads=pads, output_shape=output_shape,
        activation=activation, activation_params=activation_params,
        inferred_shape_indices=inferred_shape_indices)
    return launch(x, indices)


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
    key, launch = _CALLS.find(
        x, (kernel_shape, strides, pads, dilations),
        ("AveragePool", auto_pad, ceil_mode, count_include_pad, activation,
         activation_params, opset))
    if launch is None:
        x, launch = averaging.prepare_average_pool(
            schema.resolve("AveragePool", opset, schema.NHWC), x, kernel_shape,
            strides=strides, pads=pads, dilations=dilations, auto_pad=auto_pad,
            ceil_mode=ceil_mode, count_include_pad=count_include_pad, activation=activation,
            activation_params=activation_params)
        _CALLS.keep(key, launch)
    return launch(x)


def lp_pool(x, kernel_shape, *, p=2, strides=None, pads=None, dilations=None,
            auto_pad="NOTSET", ceil_mode=0, opset=None):
    """Channels-last LpPool (com.ms.internal.nhwc, versions 11 and 18)."""
    key, launch = _CALLS.find(x, (kernel_shape, strides, pads, dilations),
                              ("LpPool", p, auto_pad, ceil_mode, opset))
    if launch is None:
        x, launch = averaging.prepare_lp_pool(
            schema.resolve("LpPool", opset, schema.NHWC), x, kernel_shape, p=p,
            strides=strides, pads=pads, dilations=dilations, auto_pad=auto_pad,
            ceil_mode=ceil_mode)
        _CALLS.keep(key, launch)
    return launch(x)


def global_max_pool(x, *, opset=None):
    """Channels-last GlobalMaxPool (com.ms.internal.nhwc, version 1): Y is
    ``(N, 1, ..., 1, C)``."""
    return _global("GlobalMaxPool", x, opset)


def global_average_pool(x, *, opset=None):
    """Channels-last GlobalAveragePool (com.ms.internal.nhwc, version 1)."""
    return _global("GlobalAveragePool", x, opset)


def global_lp_pool(x, *, p=2, opset=None):
    """Channels-last GlobalLpPool (com.ms.internal.nhwc, version 2)."""
    return _global("GlobalLpPool", x, opset, p)


def _global(op: str, x, opset, p=2):
    key, launch = _CALLS.find(x, (), (op, p, opset))
    if launch is None:
        x, launch = averaging.prepare_global_pool(schema.resolve(op, opset, schema.NHWC), x,
                                                  p=p)
        _CALLS.keep(key, launch)
    return launch(x)


# The launches of calls checked before (see CallCache), MaxUnpool's aside (its I and
# output_shape are arrays).
_CALLS = CallCache()
