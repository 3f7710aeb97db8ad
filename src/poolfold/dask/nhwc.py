"""Channels-last MaxPool and MaxUnpool (``com.ms.internal.nhwc``) on chunked arrays, bit-identical
to :mod:`poolfold.nhwc`.

X and Y are ``(N, D1, ..., Dr, C)``; Indices, I and output_shape stay channels-first, as in
memory.  Output chunks follow input chunks as in :func:`poolfold.dask.max_pool` (N and C
chunks kept, spatial chunks by where windows start); Indices have the same chunks in NCHW
order.
"""

from __future__ import annotations

from .. import activations, schema
from ..ops.max_pool import check_index_request, resolve_plan
from ..ops.nhwc import _nchw_shape
from . import _graph
from .pool import pool
from .unpool import unpool


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
    plan = resolve_plan(spec, _nchw_shape(x.shape), kernel_shape, strides, pads, dilations,
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
