"""Test oracle for poolfold, written from docs/semantics.md alone.

This module is deliberately slow and simple: every output element is computed
by plain Python loops (``itertools.product`` over output positions and kernel
or block offsets), following the rules of the semantics document one by one,
so that a reader can check each line against that document.  It shares no code
with poolfold and never imports it.  Use it on small tensors only.

It does not validate user input the way poolfold must; it *asserts* its
preconditions (a failed assertion means the test asked for something the
semantics call an error).
"""

from __future__ import annotations

import itertools
import math

import ml_dtypes
import numpy as np

_FLOAT_DTYPES = (
    np.dtype(np.float16),
    np.dtype(np.float32),
    np.dtype(np.float64),
    np.dtype(ml_dtypes.bfloat16),
)
_MAXPOOL_INT_DTYPES = (np.dtype(np.int8), np.dtype(np.uint8))


# --------------------------------------------------------------------------
# small helpers
# --------------------------------------------------------------------------


def _ints(seq, default, length, name):
    """A plain list of Python ints, or ``[default] * length`` when seq is None."""
    if seq is None:
        return [default] * length
    values = [int(v) for v in seq]
    assert len(values) == length, f"{name} has {len(values)} values, expected {length}"
    return values


def _product(values):
    result = 1
    for v in values:
        result *= v
    return result


def _bits(array):
    """A view of `array` as unsigned integers of the same width.

    Copying through this view moves the exact bit pattern of an element
    (-0.0 stays -0.0, a NaN keeps its payload), whatever the dtype.
    """
    return array.view(np.dtype(f"u{array.dtype.itemsize}"))


def _floor_div(a, b):
    return a // b  # Python ints: exact floor


def _ceil_div(a, b):
    return -((-a) // b)  # Python ints: exact ceil


# --------------------------------------------------------------------------
# MaxPool
# --------------------------------------------------------------------------


def _max_pool_geometry(n, k, s, d, pb, pe, auto_pad, ceil_mode):
    """(out, pad_begin) for one spatial axis, as docs/semantics.md 'MaxPool' says.  An axis
    of size 0 is allowed: pads alone may hold windows (all of them empty)."""
    assert n >= 0 and k >= 1 and s >= 1 and d >= 1
    K = (k - 1) * d + 1  # effective kernel
    if auto_pad == "NOTSET":
        assert pb >= 0 and pe >= 0
        num = n + pb + pe - K
        if ceil_mode:
            out = _ceil_div(num, s) + 1
            # a window that would start in the right padding is dropped
            if (out - 1) * s >= n + pb:
                out -= 1
        else:
            out = _floor_div(num, s) + 1
        begin = pb
    elif auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        assert pb == 0 and pe == 0, "explicit pads with SAME_* must be all 0"
        out = _ceil_div(n, s)
        total = max(0, (out - 1) * s + K - n)
        if auto_pad == "SAME_UPPER":
            begin = total // 2  # floor(total / 2)
        else:
            begin = _ceil_div(total, 2)  # ceil(total / 2)
    elif auto_pad == "VALID":
        assert pb == 0 and pe == 0, "explicit pads with VALID must be all 0"
        out = _floor_div(n - K, s) + 1
        begin = 0
    else:
        raise AssertionError(f"unknown auto_pad {auto_pad!r}")
    return out, begin


def max_pool_geometry(spatial, kernel, strides=None, pads=None, dilations=None,
                      auto_pad="NOTSET", ceil_mode=False):
    """(out_shape, pad_begins) of MaxPool over ``spatial``, or None when on some axis no
    window fits (out < 1)."""
    r = len(spatial)
    stride = _ints(strides, 1, r, "strides")
    dilation = _ints(dilations, 1, r, "dilations")
    pad = _ints(pads, 0, 2 * r, "pads")
    outs, begins = [], []
    for i in range(r):
        out, begin = _max_pool_geometry(int(spatial[i]), int(kernel[i]), stride[i], dilation[i],
                                        pad[i], pad[r + i], auto_pad, bool(ceil_mode))
        if out < 1:
            return None
        outs.append(out)
        begins.append(begin)
    return tuple(outs), tuple(begins)


def max_pool(x, kernel_shape, strides=None, pads=None, dilations=None,
             auto_pad="NOTSET", ceil_mode=False, storage_order=0):
    """returns (y, indices): y has x's dtype, indices int64, same shape as y."""
    x = np.asarray(x)
    assert x.ndim >= 3, "MaxPool needs rank >= 3"
    dtype = x.dtype
    assert dtype in _FLOAT_DTYPES or dtype in _MAXPOOL_INT_DTYPES, dtype
    is_float = dtype in _FLOAT_DTYPES
    assert storage_order in (0, 1)
    if isinstance(auto_pad, bytes):
        auto_pad = auto_pad.decode()

    N, C = x.shape[0], x.shape[1]
    D = [int(v) for v in x.shape[2:]]
    r = len(D)
    kernel = _ints(kernel_shape, None, r, "kernel_shape")
    stride = _ints(strides, 1, r, "strides")
    dilation = _ints(dilations, 1, r, "dilations")
    pad = _ints(pads, 0, 2 * r, "pads")

    out_shape = []
    pad_begin = []
    for i in range(r):
        o, b = _max_pool_geometry(D[i], kernel[i], stride[i], dilation[i],
                                  pad[i], pad[r + i], auto_pad, bool(ceil_mode))
        assert o >= 1, f"no window fits (out = {o})"
        out_shape.append(o)
        pad_begin.append(b)

    y = np.empty((N, C, *out_shape), dtype=dtype)
    indices = np.empty((N, C, *out_shape), dtype=np.int64)
    y_bits = _bits(y)
    x_bits = _bits(x)
    if is_float:
        empty_value = np.array(-np.inf, dtype=dtype)
    else:
        empty_value = np.array(np.iinfo(dtype).min, dtype=dtype)
    plane_size = _product(D)

    def value_of(element):
        # float() is exact for every floating type here; int() for integers.
        return float(element) if is_float else int(element)

    def flat_position(pos):
        if storage_order == 0:  # row-major: last axis fastest
            flat = 0
            for i in range(r):
                flat = flat * D[i] + pos[i]
            return flat
        flat = 0  # storage_order 1: first axis fastest
        step = 1
        for i in range(r):
            flat += pos[i] * step
            step *= D[i]
        return flat

    for n, c in itertools.product(range(N), range(C)):
        for o in itertools.product(*[range(v) for v in out_shape]):
            best_pos = None
            best_value = None
            # window order: row-major over the kernel offsets j
            for j in itertools.product(*[range(v) for v in kernel]):
                pos = tuple(o[i] * stride[i] - pad_begin[i] + j[i] * dilation[i]
                            for i in range(r))
                if any(p < 0 or p >= D[i] for i, p in enumerate(pos)):
                    continue  # padding never wins
                value = value_of(x[(n, c, *pos)])
                if best_pos is None:
                    take = True
                elif is_float and math.isnan(best_value):
                    take = False  # the first NaN stays
                elif is_float and math.isnan(value):
                    take = True  # NaN propagates
                else:
                    take = value > best_value  # ties: the first one stays
                if take:
                    best_pos = pos
                    best_value = value
            if best_pos is None:  # empty window
                y[(n, c, *o)] = empty_value
                indices[(n, c, *o)] = -1
            else:
                # copy the winning element bit for bit
                y_bits[(n, c, *o)] = x_bits[(n, c, *best_pos)]
                indices[(n, c, *o)] = (n * C + c) * plane_size + flat_position(best_pos)
    return y, indices


# --------------------------------------------------------------------------
# MaxUnpool
# --------------------------------------------------------------------------


def max_unpool(x, indices, kernel_shape, strides=None, pads=None, output_shape=None):
    """returns the unpooled tensor (x's dtype)."""
    x = np.asarray(x)
    ind = np.asarray(indices)
    assert x.ndim >= 3, "MaxUnpool needs rank >= 3"
    assert ind.shape == x.shape, "X and I must have the same shape"
    N, C = x.shape[0], x.shape[1]
    D = [int(v) for v in x.shape[2:]]
    r = len(D)
    kernel = _ints(kernel_shape, None, r, "kernel_shape")
    stride = _ints(strides, 1, r, "strides")
    pad = _ints(pads, 0, 2 * r, "pads")

    if output_shape is None:
        spatial = [(D[i] - 1) * stride[i] + kernel[i] - pad[i] - pad[r + i]
                   for i in range(r)]
        shape = (N, C, *spatial)
    else:
        shape = tuple(int(v) for v in output_shape)
        assert len(shape) == x.ndim, "output_shape must have rank(X) values"
        assert shape[0] == N and shape[1] == C, "output_shape must keep N and C"
    assert all(v >= 1 for v in shape[2:]), f"bad output spatial shape {shape}"

    y = np.zeros(shape, dtype=x.dtype)
    total = _product(shape)
    y_flat_bits = _bits(y).reshape(-1)  # y is fresh and contiguous: a view
    x_bits = _bits(x)
    # row-major over X: on duplicate indices the last one written wins
    for pos in itertools.product(*[range(v) for v in x.shape]):
        target = int(ind[pos])
        assert 0 <= target < total, f"index {target} at {pos} outside [0, {total})"
        y_flat_bits[target] = x_bits[pos]
    return y


# --------------------------------------------------------------------------
# Col2Im
# --------------------------------------------------------------------------


def _wrap_int(value, dtype):
    """Python int -> the value two's complement arithmetic in `dtype` gives.

    Adding in a fixed-width integer type and wrapping after every step gives
    the same result as adding exactly and wrapping once (arithmetic mod 2**bits).
    """
    bits = 8 * dtype.itemsize
    value %= 1 << bits
    if dtype.kind == "i" and value >= 1 << (bits - 1):
        value -= 1 << bits
    return value


def col2im(x, image_shape, block_shape, dilations=None, pads=None, strides=None):
    """returns the folded image [N, C, *image_shape]."""
    x = np.asarray(x)
    assert x.ndim == 3, "Col2Im input must be [N, C*K, L]"
    image = [int(v) for v in image_shape]
    block = [int(v) for v in block_shape]
    r = len(image)
    assert r >= 1 and len(block) == r
    assert all(v >= 1 for v in image) and all(v >= 1 for v in block)
    dilation = _ints(dilations, 1, r, "dilations")
    stride = _ints(strides, 1, r, "strides")
    pad = _ints(pads, 0, 2 * r, "pads")

    N, CK, L = (int(v) for v in x.shape)
    K = _product(block)
    assert CK % K == 0, "dim 1 must be a multiple of prod(block_shape)"
    C = CK // K
    nblk = [_floor_div(image[i] + pad[i] + pad[r + i] - ((block[i] - 1) * dilation[i] + 1),
                       stride[i]) + 1
            for i in range(r)]
    assert all(v >= 1 for v in nblk), f"no block fits (nblk = {nblk})"
    assert L == _product(nblk), f"L = {L} but prod(nblk) = {_product(nblk)}"

    dtype = x.dtype
    out_shape = (N, C, *image)

    # Choose the accumulator: start value, how to read an input element, how to add.
    if dtype == np.bool_:
        acc = np.zeros(out_shape, dtype=np.bool_)

        def add(old, element):
            return bool(old) or bool(element)
    elif dtype.kind in "iu":
        acc = np.zeros(out_shape, dtype=object)  # exact Python ints, wrapped at the end
        acc[...] = 0

        def add(old, element):
            return old + int(element)
    elif dtype in (np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16)):
        acc = np.zeros(out_shape, dtype=np.float32)  # round once, at the end

        def add(old, element):
            return np.float32(old) + np.float32(element)
    elif dtype in (np.dtype(np.float32), np.dtype(np.float64),
                   np.dtype(np.complex64), np.dtype(np.complex128)):
        acc = np.zeros(out_shape, dtype=dtype)  # in the type itself

        def add(old, element):
            return old + element  # numpy scalars of `dtype`: adds in `dtype`
    elif dtype.kind in "UO":
        acc = np.empty(out_shape, dtype=object)
        acc[...] = ""

        def add(old, element):
            assert isinstance(element, str), "object arrays must hold str"
            return old + element
    elif dtype.kind == "S":
        acc = np.empty(out_shape, dtype=object)
        acc[...] = b""

        def add(old, element):
            return old + bytes(element)
    else:
        raise AssertionError(f"unsupported dtype {dtype}")

    # Summation order.  Strings must concatenate in increasing block order (l outer).  For
    # numbers the order only matters to floating-point rounding; poolfold sums block offset
    # outer, block inner (k outer, l inner), the order onnxruntime and PyTorch use, so that
    # float results agree with theirs bit for bit.  Integer and bool sums do not depend on it.
    blocks = list(enumerate(itertools.product(*[range(v) for v in nblk])))
    offsets = list(enumerate(itertools.product(*[range(v) for v in block])))
    if dtype.kind in "USO":
        order = [(l_blk, k_off) for l_blk in blocks for k_off in offsets]
    else:
        order = [(l_blk, k_off) for k_off in offsets for l_blk in blocks]
    with np.errstate(all="ignore"):
        for n, c in itertools.product(range(N), range(C)):
            for (l, blk), (k, off) in order:
                pos = tuple(blk[i] * stride[i] - pad[i] + off[i] * dilation[i] for i in range(r))
                if any(p < 0 or p >= image[i] for i, p in enumerate(pos)):
                    continue  # taps outside the image are skipped
                target = (n, c, *pos)
                acc[target] = add(acc[target], x[n, c * K + k, l])

    if dtype == np.bool_:
        return acc
    if dtype.kind in "iu":
        out = np.zeros(out_shape, dtype=dtype)
        for pos in itertools.product(*[range(v) for v in out_shape]):
            out[pos] = _wrap_int(acc[pos], dtype)
        return out
    if dtype in (np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16)):
        return acc.astype(dtype)  # one rounding float32 -> float16 / bfloat16
    if dtype.kind == "O":
        return acc
    if dtype.kind == "U":
        return np.array(acc.tolist(), dtype=str).reshape(out_shape)
    if dtype.kind == "S":
        return np.array(acc.tolist(), dtype=bytes).reshape(out_shape)
    return acc
