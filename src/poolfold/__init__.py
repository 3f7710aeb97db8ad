"""poolfold: fast, spec-exact ONNX window operators for NumPy.

>>> import numpy as np, poolfold
>>> x = np.arange(16, dtype=np.float32).reshape(1, 1, 4, 4)
>>> poolfold.max_pool(x, [2, 2], strides=[2, 2])[0, 0].tolist()
[[5.0, 7.0], [13.0, 15.0]]
"""

from .errors import PoolfoldError, PoolfoldTypeError
from . import nhwc
from .ops.averaging import (average_pool, global_average_pool, global_lp_pool,
                            global_max_pool, lp_pool)
from .ops.col2im import col2im
from .ops.max_pool import max_pool, max_pool_shape
from .ops.max_unpool import max_unpool

__all__ = [
    "PoolfoldError", "PoolfoldTypeError", "average_pool", "col2im", "global_average_pool",
    "global_lp_pool", "global_max_pool", "lp_pool", "max_pool", "max_pool_shape", "max_unpool",
    "nhwc",
]
__version__ = "0.1.0"
