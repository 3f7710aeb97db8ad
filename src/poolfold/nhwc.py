"""The channels-last ops of onnxruntime's ``com.ms.internal.nhwc`` domain: MaxPool, MaxUnpool,
AveragePool, LpPool and the global pools.

>>> import numpy as np, poolfold
>>> x = np.zeros((1, 4, 4, 3), np.float32)            # N, H, W, C
>>> poolfold.nhwc.max_pool(x, [2, 2], strides=[2, 2]).shape
(1, 2, 2, 3)
"""

from .ops.nhwc import (average_pool, global_average_pool, global_lp_pool, global_max_pool,
                       lp_pool, max_pool, max_unpool)

__all__ = ["average_pool", "global_average_pool", "global_lp_pool", "global_max_pool",
           "lp_pool", "max_pool", "max_unpool"]
