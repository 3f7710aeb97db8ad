"""Channels-last layout, the rules of the ``com.ms.internal.nhwc`` domain's tensors, for the
in-memory ops and the chunked ones (:mod:`poolfold.dask`) alike.

X and Y are ``(N, D1, ..., Dr, C)``; MaxPool's Indices and MaxUnpool's I and output_shape
stay channels-first, as onnxruntime's layout transformer leaves them.  So the ops move C
between the two orders in shapes, in chunks and in block numbers: the same permutation of
per-axis values each time, written here once.
"""

from __future__ import annotations

import functools

from .. import schema
from ..geometry import WindowPlan


def is_channels_last(spec: schema.OpVersion) -> bool:
    """Whether the op's X and Y are channels-last: the ops of the nhwc domain."""
    return spec.domain == schema.NHWC


def nchw_order(values: tuple) -> tuple:
    """Per-axis values of a channels-last tensor (its shape, chunks, a block's number) in
    NCHW order: ``(N, D1, ..., Dr, C)`` -> ``(N, C, D1, ..., Dr)``."""
    return (values[0], values[-1]) + tuple(values[1:-1])


def channels_last_order(values: tuple) -> tuple:
    """Per-axis values in NCHW order put in channels-last order: the inverse of
    :func:`nchw_order`."""
    return (values[0],) + tuple(values[2:]) + (values[1],)


def axes(ndim: int, channels_last: bool) -> tuple[int, int, list[int]]:
    """The N axis, the C axis and the spatial axes of a tensor of rank ``ndim``."""
    if channels_last:
        return 0, ndim - 1, list(range(1, ndim - 1))
    return 0, 1, list(range(2, ndim))


@functools.lru_cache(maxsize=512)
def with_channels(plan: WindowPlan, channels: int) -> WindowPlan:
    """``plan`` over ``(spatial..., C)``: one more axis, with a window of one on C, so that
    the channels-first kernels pool a channels-last sample as one plane (cached, as plans
    are, so its tap table is built once)."""
    return WindowPlan(plan.in_shape + (channels,), plan.kernel + (1,), plan.strides + (1,),
                      plan.dilations + (1,), plan.pad_begin + (0,), plan.pad_end + (0,),
                      plan.out_shape + (channels,), plan.label)
