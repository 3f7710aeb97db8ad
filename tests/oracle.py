"""Test oracle for poolfold, written from docs/semantics.md alone.

This module is deliberately slow and simple: every output element is computed
by plain Python loops (``itertools.product`` over output positions and kernel
or block offsets), following the rules of the semantics document one by one,
so that a reader can check each line against that document.  MaxPool alone
takes each step of its window scan for all outputs at once (numpy over every
plane and output position, one kernel offset at a time, in window order): the
suite calls it on thousands of inputs, and the same rules output by output took
most of its time.  It shares no code with poolfold and never imports it.  Use
it on small tensors only.

It does not validate user input the way poolfold must; it *asserts* its
preconditions (a failed assertion means the test asked for something the
semantics call an error).
"""

from __future__ import annotations

import decimal
import itertools
import math
from fractions import Fraction

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

    # Every output's window is scanned tap by tap in window order (row-major over the kernel
    # offsets j), as the rules below say for one output; one step of the scan is taken for
    # every output at once (numpy over all planes and output positions), which visits each
    # output's taps in the same order as a loop per output would.
    if is_float:
        empty_value = np.array(-np.inf, dtype=dtype)
        values = x.astype(np.float64)  # exact for every floating type here
    else:
        empty_value = np.array(np.iinfo(dtype).min, dtype=dtype)
        values = x.astype(np.int64)  # exact for int8 and uint8
    plane_size = _product(D)
    outputs = np.meshgrid(*[np.arange(v) for v in out_shape], indexing="ij")  # o, per axis
    best_value = np.zeros((N, C, *out_shape), dtype=values.dtype)
    best_at = np.full((N, C, *out_shape), -1, dtype=np.int64)  # row-major in the plane; -1: none
    for j in itertools.product(*[range(v) for v in kernel]):
        if plane_size == 0:
            break  # no tap of any window lies inside the input
        pos = [outputs[i] * stride[i] - pad_begin[i] + j[i] * dilation[i] for i in range(r)]
        inside = np.ones(out_shape, dtype=bool)
        for i in range(r):
            inside &= (pos[i] >= 0) & (pos[i] < D[i])  # padding never wins
        pos = [np.clip(p, 0, D[i] - 1) for i, p in enumerate(pos)]  # read only where inside
        value = values[(slice(None), slice(None), *pos)]
        first = best_at < 0
        if is_float:
            # the first NaN stays; a NaN propagates; otherwise ties keep the first one
            beats = ~np.isnan(best_value) & (np.isnan(value) | (value > best_value))
        else:
            beats = value > best_value  # ties: the first one stays
        take = inside & (first | beats)
        best_value = np.where(take, value, best_value)
        best_at = np.where(take, np.ravel_multi_index(pos, D), best_at)

    empty = best_at < 0
    y = np.full((N, C, *out_shape), empty_value, dtype=dtype)
    if plane_size > 0:  # copy the winning element bit for bit
        winners = np.take_along_axis(_bits(x).reshape(N, C, plane_size),
                                     np.maximum(best_at, 0).reshape(N, C, _product(out_shape)),
                                     axis=2)
        _bits(y)[...] = np.where(empty, _bits(y), winners.reshape(y.shape))
    if storage_order == 0 or plane_size == 0:  # row-major: last axis fastest
        flat = best_at
    else:  # storage_order 1: first axis fastest
        flat = np.ravel_multi_index(np.unravel_index(np.maximum(best_at, 0), D), D, order="F")
    planes = np.arange(N * C, dtype=np.int64).reshape(N, C, *([1] * r))
    indices = np.where(empty, -1, planes * plane_size + flat)
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


# --------------------------------------------------------------------------
# The averaging family: AveragePool, LpPool, GlobalMaxPool, GlobalAveragePool, GlobalLpPool
# --------------------------------------------------------------------------
#
# Windows are MaxPool's (docs/semantics.md, "The averaging family"): the output size and the
# begin pad come from _max_pool_geometry above.  Per window and axis,
#   V = the taps inside X, [0, n);
#   P = the taps inside the padded extent, [-pb, n + pe) (computed SAME pads count as pads);
# taps of the ceil-mode overhang, past n + pe, are in neither.
#
# Each windowed oracle returns (y, info): y is float64 and holds the exact result rounded once
# to float64 (Fraction / Decimal arithmetic, never a float accumulator); info holds, per output
# element, |V| (``count``) and the largest finite |x| over V (``maxabs``), which the
# contract's error bound needs (see assert_within_bound).


class BoundInfo:
    """Per output element: ``count`` = |V| (int64) and ``maxabs`` = max |x| over the finite
    taps of V (float64, 0 where there are none)."""

    def __init__(self, count, maxabs):
        self.count = count
        self.maxabs = maxabs

    def transpose(self, axes):
        return BoundInfo(self.count.transpose(axes), self.maxabs.transpose(axes))


def _pad_end(n, k, s, d, pb, pe, auto_pad, out, begin):
    """The end pad of one axis (the part of the padded extent past n)."""
    if auto_pad == "NOTSET":
        return pe
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        K = (k - 1) * d + 1
        total = max(0, (out - 1) * s + K - n)
        return total - begin
    return 0  # VALID


def _average_family_windows(spatial, kernel_shape, strides, pads, dilations, auto_pad,
                            ceil_mode):
    """(out_shape, windows): windows maps each output position o to (V, |P|), V the list of
    in-X tap positions in window order."""
    if isinstance(auto_pad, bytes):
        auto_pad = auto_pad.decode()
    D = [int(v) for v in spatial]
    r = len(D)
    kernel = _ints(kernel_shape, None, r, "kernel_shape")
    stride = _ints(strides, 1, r, "strides")
    dilation = _ints(dilations, 1, r, "dilations")
    pad = _ints(pads, 0, 2 * r, "pads")
    out_shape, begins, ends = [], [], []
    for i in range(r):
        out, begin = _max_pool_geometry(D[i], kernel[i], stride[i], dilation[i], pad[i],
                                        pad[r + i], auto_pad, bool(ceil_mode))
        assert out >= 1, f"no window fits (out = {out})"
        out_shape.append(out)
        begins.append(begin)
        ends.append(_pad_end(D[i], kernel[i], stride[i], dilation[i], pad[i], pad[r + i],
                             auto_pad, out, begin))
    windows = {}
    for o in itertools.product(*[range(v) for v in out_shape]):
        taps_v = []
        count_p = 0
        for j in itertools.product(*[range(v) for v in kernel]):
            pos = tuple(o[i] * stride[i] - begins[i] + j[i] * dilation[i] for i in range(r))
            if all(0 <= p < D[i] for i, p in enumerate(pos)):
                taps_v.append(pos)
            if all(-begins[i] <= p < D[i] + ends[i] for i, p in enumerate(pos)):
                count_p += 1
        windows[o] = (taps_v, count_p)
    return tuple(out_shape), windows


def _check_float_input(x, op):
    x = np.asarray(x)
    assert x.ndim >= 3, f"{op} needs rank >= 3"
    assert x.dtype in _FLOAT_DTYPES, f"{op}: dtype {x.dtype}"
    return x


def _exact_mean(values, count):
    """sum(values) / count, exact, rounded once to float64.  values are Python floats."""
    if any(math.isnan(v) for v in values):
        return math.nan
    has_pos_inf = any(v == math.inf for v in values)
    has_neg_inf = any(v == -math.inf for v in values)
    if has_pos_inf and has_neg_inf:
        return math.nan  # inf + -inf
    if has_pos_inf:
        return math.inf
    if has_neg_inf:
        return -math.inf
    if count == 0:
        return math.nan  # 0 / 0: an empty window with count_include_pad = 0
    total = sum((Fraction(v) for v in values), Fraction(0))
    return float(total / count)  # Fraction -> float rounds correctly


def _exact_lp(values, p):
    """(sum |v|^p) ^ (1/p) to ~60 significant digits, rounded once to float64.

    Scaled by the largest |v| (m): m * (sum (|v|/m)^p) ^ (1/p), in Decimal arithmetic, so no
    intermediate leaves the range whatever the magnitudes."""
    if any(math.isnan(v) for v in values):
        return math.nan
    if any(math.isinf(v) for v in values):
        return math.inf
    m = max((abs(v) for v in values), default=0.0)
    if m == 0.0:
        return 0.0  # empty V, or only zeros
    with decimal.localcontext() as ctx:
        ctx.prec = 60
        # the widest exponents: at p < 1 the root raises the sum to 1/p (LpPool-1's float p)
        ctx.Emax = decimal.MAX_EMAX
        ctx.Emin = decimal.MIN_EMIN
        dm = decimal.Decimal(m)  # exact
        dp = decimal.Decimal(p)  # exact (p is an int or a float)
        total = sum(((decimal.Decimal(abs(v)) / dm) ** dp for v in values), decimal.Decimal(0))
        try:
            y = dm * total ** (decimal.Decimal(1) / dp)
        except decimal.Overflow:  # past even Decimal's range: far past float64's
            return math.inf
        return float(y)  # correctly rounded; inf past float64's range


def _windowed(x, op, reduce, kernel_shape, strides, pads, dilations, auto_pad, ceil_mode):
    """Apply reduce(values over V, |V|, |P|) -> float to every window."""
    x = _check_float_input(x, op)
    N, C = x.shape[0], x.shape[1]
    out_shape, windows = _average_family_windows(x.shape[2:], kernel_shape, strides, pads,
                                                 dilations, auto_pad, ceil_mode)
    y = np.empty((N, C, *out_shape), dtype=np.float64)
    count = np.empty((N, C, *out_shape), dtype=np.int64)
    maxabs = np.empty((N, C, *out_shape), dtype=np.float64)
    for n, c in itertools.product(range(N), range(C)):
        for o, (taps_v, count_p) in windows.items():
            values = [float(x[(n, c, *pos)]) for pos in taps_v]  # exact for every float type
            y[(n, c, *o)] = reduce(values, len(taps_v), count_p)
            count[(n, c, *o)] = len(taps_v)
            maxabs[(n, c, *o)] = max((abs(v) for v in values if math.isfinite(v)),
                                     default=0.0)
    return y, BoundInfo(count, maxabs)


def average_pool(x, kernel_shape, strides=None, pads=None, dilations=None, auto_pad="NOTSET",
                 ceil_mode=0, count_include_pad=0):
    """AveragePool: sum over V / |V| (count_include_pad 0) or / |P| (1).  Returns (y, info),
    y the exact result as float64."""
    assert count_include_pad in (0, 1, False, True)

    def reduce(values, count_v, count_p):
        return _exact_mean(values, count_p if count_include_pad else count_v)

    return _windowed(x, "AveragePool", reduce, kernel_shape, strides, pads, dilations,
                     auto_pad, ceil_mode)


def lp_pool(x, kernel_shape, p=2, strides=None, pads=None, dilations=None, auto_pad="NOTSET",
            ceil_mode=0):
    """LpPool: (sum over V of |x|^p)^(1/p); padded taps add nothing.  Returns (y, info)."""
    assert p > 0, "p must be > 0"

    def reduce(values, count_v, count_p):
        return _exact_lp(values, p)

    return _windowed(x, "LpPool", reduce, kernel_shape, strides, pads, dilations, auto_pad,
                     ceil_mode)


def _global(x, op, reduce):
    """Apply reduce(values over the whole plane) to every (n, c); Y keeps X's rank."""
    x = _check_float_input(x, op)
    N, C = x.shape[0], x.shape[1]
    D = x.shape[2:]
    out_shape = (N, C) + (1,) * len(D)
    y = np.empty(out_shape, dtype=np.float64)
    count = np.empty(out_shape, dtype=np.int64)
    maxabs = np.empty(out_shape, dtype=np.float64)
    ones = (0,) * len(D)
    for n, c in itertools.product(range(N), range(C)):
        values = [float(x[(n, c, *pos)]) for pos in itertools.product(*[range(v) for v in D])]
        y[(n, c, *ones)] = reduce(values)
        count[(n, c, *ones)] = len(values)
        maxabs[(n, c, *ones)] = max((abs(v) for v in values if math.isfinite(v)), default=0.0)
    return y, BoundInfo(count, maxabs)


def _max_of(values):
    """MaxPool's rule over one window: NaN propagates, empty gives -inf."""
    if any(math.isnan(v) for v in values):
        return math.nan
    return max(values, default=-math.inf)


def global_max_pool(x):
    """GlobalMaxPool: y (float64; the max is exact) and info."""
    return _global(x, "GlobalMaxPool", _max_of)


def global_average_pool(x):
    """GlobalAveragePool: the exact mean over the plane (NaN over a zero-size plane)."""
    return _global(x, "GlobalAveragePool", lambda values: _exact_mean(values, len(values)))


def global_lp_pool(x, p=2):
    """GlobalLpPool: (sum |x|^p)^(1/p) over the plane (0 over a zero-size plane)."""
    assert p > 0, "p must be > 0"
    return _global(x, "GlobalLpPool", lambda values: _exact_lp(values, p))


# The contract's comparison: |actual - exact| <= 2 ulp_T(exact) + slack, with
#   AveragePool: slack = |V| * u * max|x over V|
#   LpPool:      slack = (|V| + 2) * u * exact
# u = 2^-24 for float16 / bfloat16 / float32 inputs (a float32 accumulator), 2^-53 for float64.
# NaN must be NaN, an infinity the same infinity; an exact value past T's largest finite one
# may also come out as the infinity of its sign.

# (precision p including the implicit bit, minimum normal exponent) per type
_FLOAT_FORMAT = {
    np.dtype(np.float16): (11, -14),
    np.dtype(ml_dtypes.bfloat16): (8, -126),
    np.dtype(np.float32): (24, -126),
    np.dtype(np.float64): (53, -1022),
}


def ulp(values, dtype):
    """ulp_T of each float64 value: 2^(max(e, emin) - p + 1), e = floor(log2 |v|)."""
    precision, emin = _FLOAT_FORMAT[np.dtype(dtype)]
    magnitude = np.abs(np.asarray(values, dtype=np.float64))
    _, e = np.frexp(magnitude)  # |v| = m 2^e, m in [0.5, 1)
    exponent = np.maximum(e.astype(np.int64) - 1, emin)
    exponent = np.where(magnitude == 0, emin, exponent)  # 0: the subnormal spacing
    return np.ldexp(1.0, (exponent - (precision - 1)).astype(np.int32))


def assert_within_bound(actual, exact, info, dtype, kind):
    """Check poolfold's ``actual`` (dtype T) against the oracle's ``exact`` (float64).

    kind: "average" (AveragePool, GlobalAveragePool), "lp" (LpPool, GlobalLpPool) or "max"
    (GlobalMaxPool: exact equality)."""
    dtype = np.dtype(dtype)
    assert isinstance(actual, np.ndarray), type(actual)
    assert actual.dtype == dtype, f"dtype {actual.dtype} != {dtype}"
    assert actual.shape == exact.shape, f"shape {actual.shape} != {exact.shape}"
    got = actual.astype(np.float64)
    want = np.asarray(exact, dtype=np.float64)
    u = 2.0 ** -53 if dtype == np.float64 else 2.0 ** -24
    with np.errstate(all="ignore"):
        if kind == "average":
            slack = info.count * u * info.maxabs
        elif kind == "lp":
            slack = (info.count + 2) * u * np.abs(want)
        elif kind == "max":
            slack = np.zeros_like(want)
        else:
            raise AssertionError(f"unknown kind {kind!r}")
        bound = (2 * ulp(want, dtype) if kind != "max" else 0.0) + slack
        diff = np.abs(got - want)
        finite = np.isfinite(want)
        ok = np.where(np.isnan(want), np.isnan(got),
                      np.where(~finite, got == want, ~np.isnan(got) & (diff <= bound)))
        largest = float(ml_dtypes.finfo(dtype).max)  # numpy's finfo refuses bfloat16
        past = finite & (np.abs(want) > largest) & np.isinf(got) & (np.sign(got) == np.sign(want))
        ok = ok | past
    if not ok.all():
        bad = np.argwhere(~ok)
        lines = []
        for index in bad[:5]:
            pos = tuple(int(v) for v in index)
            lines.append(f"  at {pos}: got {got[pos]!r}, exact {want[pos]!r}, "
                         f"|diff| {diff[pos]!r} > bound {np.broadcast_to(bound, want.shape)[pos]!r}"
                         f" (|V| {int(info.count[pos])}, max|x| {info.maxabs[pos]!r})")
        raise AssertionError(f"{kind} ({dtype}): {len(bad)} of {want.size} outside the bound\n"
                             + "\n".join(lines))
