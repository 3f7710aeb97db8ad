"""The public chunked ops (channels-first): MaxPool, MaxUnpool and the averaging family; the
checks are the in-memory ops' own, run on shapes and dtypes before any graph is built."""

from __future__ import annotations

from .. import schema
from ..ops.averaging import check_p, resolve_count_include_pad
from ..ops.max_pool import check_index_request, resolve_plan
from . import _graph
from .averaging import pool_global_chunked, pool_windows_chunked
from .pool import pool
from .unpool import unpool


def max_pool(x, kernel_shape, *, strides=None, pads=None, dilations=None, auto_pad="NOTSET",
             ceil_mode=False, storage_order=0, return_indices=False, opset=None):
    """:func:`poolfold.max_pool` on a chunked ``(N, C, D1, ..., Dr)`` array: Y, or
    ``(Y, Indices)`` as dask arrays, equal bit for bit to the in-memory result.

    Output chunks follow input chunks: N and C chunks are the input's; along each spatial axis,
    an output position belongs to the input chunk holding its window's centre (tap ``(K-1)//2``
    of the dilated extent K; windows centred in the padding belong to the first or last chunk),
    and input chunks holding no centre have no output chunk.  So pooling with "same" padding at
    stride 1 keeps the chunks, and strides s turn chunks of c elements into about c/s.  Each task reads its chunk plus exactly the halo its windows reach into from the
    neighbouring chunks; no spatial axis is ever rechunked.  Indices are flat positions in the
    whole X (plane offset and storage_order included), int64.
    """
    spec = schema.resolve("MaxPool", opset)
    storage_order = check_index_request(spec, storage_order, return_indices)
    x = _graph.as_dask(spec, x, "X")
    plan = resolve_plan(spec, x.shape, kernel_shape, strides, pads, dilations, auto_pad, ceil_mode)
    y, indices = pool(spec, x, plan, return_indices, storage_order)
    return (y, indices) if return_indices else y


def max_unpool(x, indices, kernel_shape, *, strides=None, pads=None, output_shape=None,
               opset=None, inferred_shape_indices=False):
    """:func:`poolfold.max_unpool` on chunked X and I: the output as a dask array, equal bit
    for bit to the in-memory result.

    X and I may be chunked differently (I is rechunked to X's chunks).  Output chunks along N
    and C are X's; along each spatial axis, output chunk j covers the positions the windows of
    X's chunk j reach, ``[o0*s - pb, o1*s - pb)`` cut at the output's ends.  Each value is sent
    to the output chunk that owns its flat position: a task per X chunk sorts its values by
    owner, a task per output chunk gathers its values (from the X chunks whose windows reach it,
    plus any stray values that point elsewhere) and writes them; no task holds the whole
    output.  On duplicate positions the element of X that comes last in row-major order wins.
    An index out of range raises the in-memory error (the first such index in row-major order)
    when computed, before any output chunk is produced.  ``inferred_shape_indices`` reads I as
    in memory (positions in the inferred shape, moved chunk by chunk), with the same checks.
    """
    spec = schema.resolve("MaxUnpool", opset)
    x = _graph.as_dask(spec, x, "X")
    return unpool(spec, x, indices, kernel_shape, strides, pads, output_shape,
                  inferred_shape_indices)


def average_pool(x, kernel_shape, *, strides=None, pads=None, dilations=None,
                 auto_pad="NOTSET", ceil_mode=0, count_include_pad=0, opset=None):
    """:func:`poolfold.average_pool` on a chunked ``(N, C, D1, ..., Dr)`` array: Y as a dask
    array, equal bit for bit to the in-memory result.

    Output chunks are :func:`max_pool`'s (N and C chunks kept; along a spatial axis, by the
    input chunk holding each window's centre); each task pools the input its windows read
    under a plan that keeps the whole tensor's windows and divisors (count_include_pad and
    ceil mode included).  For float32, float16 and bfloat16 input, an axis whose windows have
    many taps and overlap heavily is summed by running sums in memory: from the first
    such axis on, the spatial axes are one output chunk and each task reads them whole.
    """
    spec = schema.resolve("AveragePool", opset)
    count_include_pad = resolve_count_include_pad(spec, count_include_pad)
    x = _graph.as_dask(spec, x, "X")
    plan = resolve_plan(spec, x.shape, kernel_shape, strides, pads, dilations, auto_pad, ceil_mode)
    return pool_windows_chunked(spec, x, plan, "average", count_include_pad)


def lp_pool(x, kernel_shape, *, p=2, strides=None, pads=None, dilations=None,
            auto_pad="NOTSET", ceil_mode=0, opset=None):
    """:func:`poolfold.lp_pool` on a chunked ``(N, C, D1, ..., Dr)`` array, equal bit for bit
    to the in-memory result.  Output chunks as :func:`average_pool` (running sums only for
    p <= 7 on float32, float16 and bfloat16 input)."""
    spec = schema.resolve("LpPool", opset)
    p = check_p(spec, p)
    x = _graph.as_dask(spec, x, "X")
    plan = resolve_plan(spec, x.shape, kernel_shape, strides, pads, dilations, auto_pad, ceil_mode)
    return pool_windows_chunked(spec, x, plan, "lp", p=p)


def global_max_pool(x, *, opset=None):
    """:func:`poolfold.global_max_pool` on a chunked array: Y ``(N, C, 1, ..., 1)`` with X's N
    and C chunks, equal bit for bit to the in-memory result.  No rechunk: each chunk's
    winner per plane (first NaN, else first largest value) is combined by a tree of tasks."""
    spec = schema.resolve("GlobalMaxPool", opset)
    return pool_global_chunked(spec, _graph.as_dask(spec, x, "X"), "max")


def global_average_pool(x, *, opset=None):
    """:func:`poolfold.global_average_pool` on a chunked array, equal bit for bit to the
    in-memory result: the spatial axes are rechunked into one chunk (N and C chunks kept),
    each reduced by the in-memory function."""
    spec = schema.resolve("GlobalAveragePool", opset)
    return pool_global_chunked(spec, _graph.as_dask(spec, x, "X"), "average")


def global_lp_pool(x, *, p=2, opset=None):
    """:func:`poolfold.global_lp_pool` on a chunked array, equal bit for bit to the in-memory
    result; chunks as :func:`global_average_pool`."""
    spec = schema.resolve("GlobalLpPool", opset)
    p = check_p(spec, p)
    return pool_global_chunked(spec, _graph.as_dask(spec, x, "X"), "lp", p)
