"""A short MaxPool example: pool a small image with Indices, then print what came out."""

import numpy as np

import poolfold

x = np.array(
    [[[[1, 2, 3, 4],
       [5, 6, 7, 8],
       [9, 10, 11, 12],
       [13, 14, 15, 16]]]],
    dtype=np.float32,
)
y, indices = poolfold.max_pool(x, [2, 2], strides=[2, 2], return_indices=True)
print("X", x.shape, "->", "Y", y.shape)
print("Y =", y[0, 0].tolist())
print("Indices =", indices[0, 0].tolist())

# Any spatial rank, any version's types: a 4-D spatial pool of int8 with SAME padding.
volume = np.arange(2 * 3 * 5 * 5 * 5 * 5, dtype=np.int64).reshape(2, 3, 5, 5, 5, 5) % 97
pooled = poolfold.max_pool(volume.astype(np.int8), [3, 3, 3, 3], strides=[2, 2, 2, 2],
                           auto_pad="SAME_UPPER")
print("4-D int8:", volume.shape, "->", pooled.shape, pooled.dtype)
print("shape without computing:",
      poolfold.max_pool_shape((8, 64, 112, 112), [3, 3], strides=[2, 2], pads=[1, 1, 1, 1]))
