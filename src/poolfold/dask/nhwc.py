"""Channels-last MaxPool, MaxUnpool and the averaging family (``com.ms.internal.nhwc``) on
chunked arrays, bit-identical to :mod:`poolfold.nhwc`.

X and Y are ``(N, D1, ..., Dr, C)``; Indices, I and output_shape stay channels-first, as in
memory.  Output chunks follow input chunks as in :func:`poolfold.dask.max_pool` (N and C
chunks kept, spatial chunks by where windows start); Indices have the same chunks in NCHW
order.  AveragePool, LpPool and the global pools chunk as their channels-first versions in
:mod:`poolfold.dask`; where an AveragePool or LpPool axis is kept whole (running sums), C
chunk boundaries are moved down to multiples of the in-memory kernels' channel block.
"""

from __future__ import annotations

from .. import activations, schema
from ..ops.averaging import check_p, resolve_count_include_pad
from ..ops.layout import nchw_order
from ..ops.max_pool import check_index_request, resolve_plan
from . import _graph
from .averaging import pool_global_chunked, pool_windows_chunked
from .pool import pool
from .unpool import unpool

__all__ = ["average_pool", "global_average_pool", "global_lp_pool", "global_max_pool",
           "lp_pool", "max_pool", "max_unpool"]


def max_pool(x, kernel_shape, *, strides=None, pads=None, dilations=None, auto_pad="NOTSET",
             ceil_mode=False, storage_order=0, return_indices=False, activation=None,
             activation_params=None, opset=None):
    """:func:`poolfold.nhwc.max_pool` on a chunked ``(N, D1, ..., Dr, C)`` array: Y, or
    ``(Y, Indices)``, as dask arrays.  Output chunks: see the module doc and
    :func:`poolfold.dask.max_pool`."""
    spec = schema.resolve("MaxPool", opset, schema.NHWC)
    storage_order = check_index_request(spec, storage_order, return_indices)
    x = _graph.as_dask(spec, x, "X")
    act = activations.resolve(spec, activation, activation_params, x.dtype)
    plan = resolve_plan(spec, nchw_order(x.shape), kernel_shape, strides, pads, dilations,
                        auto_pad, ceil_mode)
    y, indices = pool(spec, x, plan, return_indices, storage_order, channels_last=True, act=act)
    return (y, indices) if return_indices else y


def max_unpool(x, indices, kernel_shape, *, strides=None, pads=None, output_shape=None,
               activation=None, activation_params=None, opset=None,
               inferred_shape_indices=False):
    """:func:`poolfold.nhwc.max_unpool` on chunked arrays: X ``(N, D1, ..., Dr, C)``, I of
    the NCHW shape.  Output chunks and routing as :func:`poolfold.dask.max_unpool`."""
    spec = schema.resolve("MaxUnpool", opset, schema.NHWC)
    x = _graph.as_dask(spec, x, "X")
    act = activations.resolve(spec, activation, activation_params, x.dtype)
    return unpool(spec, x, indices, kernel_shape, strides, pads, output_shape,
                  inferred_shape_indices, channels_last=True, act=act)


def average_pool(x, kernel_shape, *, strides=None, pads=None, dilations=None,
                 auto_pad="NOTSET", ceil_mode=0, count_include_pad=0, activation=None,
                 activation_params=None, opset=None):
    """:func:`poolfold.nhwc.average_pool` on a chunked ``(N, D1, ..., Dr, C)`` array, the
    fused activation included.  Output chunks: see :func:`poolfold.dask.average_pool`."""
    spec = schema.resolve("AveragePool", opset, schema.NHWC)
    x = _graph.as_dask(spec, x, "X")
    act = activations.resolve(spec, activation, activation_params, x.dtype)
    count_include_pad = resolve_count_include_pad(spec, count_include_pad)
    plan = resolve_plan(spec, nchw_order(x.shape), kernel_shape, strides, pads, dilations,
                        auto_pad, ceil_mode)
    return pool_windows_chunked(spec, x, plan, "average", count_include_pad,
                                channels_last=True, act=act)


def lp_pool(x, kernel_shape, *, p=2, strides=None, pads=None, dilations=None,
            auto_pad="NOTSET", ceil_mode=0, opset=None):
    """:func:`poolfold.nhwc.lp_pool` on a chunked ``(N, D1, ..., Dr, C)`` array."""
    spec = schema.resolve("LpPool", opset, schema.NHWC)
    p = check_p(spec, p)
    x = _graph.as_dask(spec, x, "X")
    plan = resolve_plan(spec, nchw_order(x.shape), kernel_shape, strides, pads, dilations,
                        auto_pad, ceil_mode)
    return pool_windows_chunked(spec, x, plan, "lp", p=p, channels_last=True)


def global_max_pool(x, *, opset=None):
    """:func:`poolfold.nhwc.global_max_pool` on a chunked array: Y ``(N, 1, ..., 1, C)``."""
    spec = schema.resolve("GlobalMaxPool", opset, schema.NHWC)
    return pool_global_chunked(spec, _graph.as_dask(spec, x, "X"), "max", channels_last=True)


def global_average_pool(x, *, opset=None):
    """:func:`poolfold.nhwc.global_average_pool` on a chunked array."""
    spec = schema.resolve("GlobalAveragePool", opset, schema.NHWC)
    return pool_global_chunked(spec, _graph.as_dask(spec, x, "X"), "average",
                               channels_last=True)


def global_lp_pool(x, *, p=2, opset=None):
    """:func:`poolfold.nhwc.global_lp_pool` on a chunked array."""
    spec = schema.resolve("GlobalLpPool", opset, schema.NHWC)
    p = check_p(spec, p)
    return pool_global_chunked(spec, _graph.as_dask(spec, x, "X"), "lp", p, channels_last=True)
