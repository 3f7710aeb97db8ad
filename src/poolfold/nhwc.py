"""Channels-last MaxPool and MaxUnpool of onnxruntime's ``com.ms.internal.nhwc`` domain.

>>> import numpy as np, poolfold
>>> x = np.zeros((1, 4, 4, 3), np.float32)            # N, H, W, C
>>> poolfold.nhwc.max_pool(x, [2, 2], strides=[2, 2]).shape
(1, 2, 2, 3)
"""

from .ops.nhwc import max_pool, max_unpool

__all__ = ["max_pool", "max_unpool"]
