"""poolfold: fast, spec-exact ONNX window operators for NumPy.

>>> import numpy as np, poolfold
>>> x = np.arange(16, dtype=np.float32).reshape(1, 1, 4, 4)
>>> poolfold.max_pool(x, [2, 2], strides=[2, 2])[0, 0].tolist()
[[5.0, 7.0], [13.0, 15.0]]
"""

from importlib import import_module as _import_module

from .errors import PoolfoldError, PoolfoldTypeError
from .ops.max_pool import max_pool, max_pool_shape

# The other ops' modules are imported on first use (PEP 562): a process that pools with
# MaxPool alone starts without their kernels' dispatchers (a few ms of import and of exit).
_LAZY = {
    "average_pool": ".ops.averaging", "global_average_pool": ".ops.averaging",
    "global_lp_pool": ".ops.averaging", "global_max_pool": ".ops.averaging",
    "lp_pool": ".ops.averaging", "col2im": ".ops.col2im", "max_unpool": ".ops.max_unpool",
}

__all__ = [
    "PoolfoldError", "PoolfoldTypeError", "average_pool", "col2im", "global_average_pool",
    "global_lp_pool", "global_max_pool", "lp_pool", "max_pool", "max_pool_shape", "max_unpool",
    "nhwc",
]
__version__ = "0.1.0"


def __getattr__(name: str):
    if name == "nhwc":
        return _import_module(".nhwc", __name__)
    if name in _LAZY:
        value = getattr(_import_module(_LAZY[name], __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(__all__))
