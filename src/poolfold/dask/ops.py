"""The public chunked MaxPool and MaxUnpool (channels-first); the checks are the in-memory
ops' own, run on shapes and dtypes before any graph is built."""

from __future__ import annotations

from .. import schema
from ..ops.max_pool import check_index_request, resolve_plan
from . import _graph
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
