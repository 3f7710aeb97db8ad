"""poolfold's ops on chunked dask arrays: bit-identical to the in-memory functions, for arrays
of any size, on any dask scheduler (threads, or a ``dask.distributed`` cluster).

Each function takes a ``dask.array.Array`` (or anything ``dask.array.asarray`` takes, a zarr
array included) with the in-memory function's keyword attributes, defaults and ``opset``, checks
everything shapes, dtypes and attributes can tell with the in-memory function's error types and
messages, and returns dask arrays without computing anything.  Each output chunk is computed by
the in-memory kernels inside a worker.

>>> import numpy as np, dask.array as da, poolfold, poolfold.dask
>>> x = da.from_array(np.arange(64, dtype=np.float32).reshape(1, 1, 8, 8), chunks=(1, 1, 3, 5))
>>> y, i = poolfold.dask.max_pool(x, [2, 2], strides=[2, 2], return_indices=True)
>>> y.chunks
((1,), (1,), (2, 1, 1), (3, 1))
>>> bool((y.compute() == poolfold.max_pool(x.compute(), [2, 2], strides=[2, 2])).all())
True

``import poolfold`` does not import this module (nor dask); ``import poolfold.dask`` does.
"""

from ..ops.max_pool import max_pool_shape
from . import nhwc
from .fold import col2im  # noqa: F401
from .ops import (average_pool, global_average_pool, global_lp_pool, global_max_pool, lp_pool,
                  max_pool, max_unpool)

__all__ = ["average_pool", "col2im", "global_average_pool", "global_lp_pool", "global_max_pool",
           "lp_pool", "max_pool", "max_pool_shape", "max_unpool", "nhwc"]
