"""Fold (Col2Im): sum blocks of columns back into an image, any spatial rank.

A plane is ``x[p]`` of shape ``(K, L)``: block offset k (row-major over the block) by block
l (row-major over the block grid).  Sums run block offset outer, block inner (strings, which
must concatenate in block order, take a numpy path of their own).
"""

from __future__ import annotations

import functools

import numpy as np
from numba import types

from ..geometry import row_major_strides
from ..memory import check_table
from . import helper_overload, kernel, uncounted_helper

from .half import HALF_BITS, as_float32
from .odometer import next_in_ranges, next_in_shape


def add_into(acc, i, v):  # pragma: no cover - replaced by the overload inside numba
    raise NotImplementedError


@helper_overload(add_into)
def _add_into(acc, i, v):
    if acc.dtype == types.float32 and v in HALF_BITS:
        # float16 / bfloat16 bits, accumulated in float32 (the caller rounds once at the end).
        def add_half(acc, i, v):
            acc[i] += as_float32(v)

        return add_half
    if acc.dtype == types.boolean:

        def add_bool(acc, i, v):  # bool sums are logical OR
            acc[i] = acc[i] or v

        return add_bool

    def add(acc, i, v):  # integers wrap on the store back into their own type
        acc[i] += v

    return add


@uncounted_helper
def _add_run(acc, values):
    """``acc[i] += values[i]`` (in the accumulation rule of the types) along a run of taps;
    both are views sliced to line up, which lets LLVM vectorise the contiguous case."""
    for i in range(values.size):
        add_into(acc, i, values[i])


@uncounted_helper
def _add_run_kept(acc, values, column, kept, identity):
    """:func:`_add_run`, adding ``identity`` instead of ``values[i]`` where ``column[i]`` is
    not below ``kept``.  Adding the type's identity leaves a sum exactly as it was, and the
    select vectorises; int16 columns keep the comparison narrow (int64 ones halve the lanes
    and cost 60% more than a plain run; int16 ones 10%)."""
    for i in range(values.size):
        v = values[i]
        add_into(acc, i, v if column[i] < kept else identity)


@functools.lru_cache(maxsize=256)
def fold_tables(plan) -> tuple:
    """The tables :func:`fold` reads for a Col2Im plan (a ``poolfold.geometry.WindowPlan`` of
    the block grid over the image), in the order it takes them.  Built here in numpy, once
    per plan, rather than inside the kernel: each array the kernel made for itself cost its
    first call a compile of numba's allocation code.

    - ``first``: the tap table's first image coordinate of each grid position, (rank, width);
    - ``g_lo``, ``g_hi``: for block offset k along axis a, the grid positions whose tap lands
      inside the image form the run ``[g_lo[a, k], g_hi[a, k])`` (empty if ``lo >= hi``);
    - ``image_strides``, ``grid_strides``: row-major strides of the image and the grid;
    - ``block_shape``, ``dilations``: as the plan's, int64;
    - ``column``: each block's place in its grid row (int16), when ``rows_join`` (below);
    - ``rows_join``: whether consecutive grid rows land on consecutive image rows with the
      same spacing in both, so that the runs of several rows can join into one;
    - ``step_last``: the stride along the last axis.
    """
    taps = plan.taps
    rank = plan.rank
    last = rank - 1
    image, block, grid = plan.in_shape, plan.kernel, plan.out_shape
    image_strides = row_major_strides(image)
    grid_strides = row_major_strides(grid)
    width = max(block)
    check_table(plan.label, "the fold's block tables", (2, rank, width), np.int64)
    g_lo = np.zeros((rank, width), np.int64)
    g_hi = np.zeros((rank, width), np.int64)
    for a in range(rank):
        for k in range(block[a]):
            inside = np.flatnonzero((taps.lo[a, :grid[a]] <= k) & (k < taps.hi[a, :grid[a]]))
            g_lo[a, k] = inside[0] if inside.size else grid[a]
            g_hi[a, k] = inside[-1] + 1 if inside.size else 0
    # A grid of one block along an axis has no step: 1 stands in, as for any one-block run.
    steps = [s if n > 1 else 1 for s, n in zip(plan.strides, grid)]
    step_last = steps[last]
    row_blocks = int(grid_strides[last - 1]) if rank > 1 else 0  # blocks per grid row
    rows_join = bool(rank > 1 and step_last == 1 and row_blocks <= 32767  # column is int16
                     and steps[last - 1] * image_strides[last - 1] == grid_strides[last - 1])
    if rows_join:
        check_table(plan.label, "the fold's column table", (grid[last - 1] * row_blocks,),
                    np.int64)  # np.arange's, before the int16 copy
    column = (np.arange(grid[last - 1] * row_blocks) % row_blocks).astype(np.int16) \
        if rows_join else np.zeros(0, np.int16)
    return (taps.first, g_lo, g_hi, image_strides, grid_strides,
            np.array(block, np.int64), np.array(plan.dilations, np.int64), column, rows_join,
            np.int64(step_last))


@kernel()
def fold(x, out, first, g_lo, g_hi, image_strides, grid_strides, block_shape, dilations,
         column, rows_join, step_last, identity, accumulate, counters, start, stop):
    """``out[p, position(l, k)] += x[p, k, l]`` for every in-image tap of the planes p in
    ``[start, stop)``; ``out`` is overwritten there, or with ``accumulate`` added to (a fold
    continued over more blocks, as a chunked Col2Im does: each position's sum then goes on in
    the same order).

    x : (planes, K, L);  out : (planes, prod(image_shape)), the accumulator type
    x holds the bits of half types (see :mod:`poolfold.kernels.half`); out is float32 then
    first ... step_last : the plan's tables, from :func:`fold_tables`
    identity : the value of x's type whose addition changes no sum (-0.0, 0 or False)
    counters : (planes, 2 * rank) int64 scratch, a row per plane (an array made in the kernel
    would cost its first call a compile of numba's allocation code)
    """
    planes, size, blocks = x.shape
    rank = block_shape.size
    last = rank - 1
    # Runs along the last axis are a few dozen blocks, shorter than the vectorised loop's
    # body.  When consecutive grid rows land on consecutive image rows with the same spacing
    # in both (``rows_join``), the runs of several rows join into one.  The few taps in
    # between (those that fall in the padding of a row's ends) add the identity instead,
    # told by their block's place in its grid row (``column``), so every sum is exactly as
    # if they were skipped.  Saving and restoring the image positions they land on instead
    # took a third of the time: each reload waited on the vector store just made there.
    row_blocks = grid_strides[last - 1] if rank > 1 else 0  # blocks per grid row
    for p in range(start, stop):
        k_at = counters[p, :rank]  # block offset of row k of xp
        g = counters[p, rank:]  # grid coordinate, outer axes
        acc = out[p]
        if not accumulate:
            for i in range(acc.size):
                acc[i] = 0
        xp = x[p]
        for a in range(rank):
            k_at[a] = 0
        # Block offset outer, blocks inner: each row of xp is read once, contiguously (the
        # order onnxruntime and PyTorch sum in, so float results agree with theirs bit for bit).
        for k in range(size):
            empty = False
            for a in range(rank):
                if g_lo[a, k_at[a]] >= g_hi[a, k_at[a]]:
                    empty = True
                g[a] = g_lo[a, k_at[a]]
            while not empty:
                row = 0
                block_row = 0
                for a in range(last):
                    row += (first[a, g[a]] + k_at[a] * dilations[a]) * image_strides[a]
                    block_row += g[a] * grid_strides[a]
                row += k_at[last] * dilations[last] + first[last, 0]
                g0 = g_lo[last, k_at[last]]
                n = g_hi[last, k_at[last]] - g0
                start = row + g0 * step_last
                gap = row_blocks - n  # taps skipped between the runs of two rows
                rows = g_hi[last - 1, k_at[last - 1]] - g[last - 1] if rows_join else 1
                if rows > 1 and gap <= n:  # join, when the extra taps cost less than they save
                    span = (rows - 1) * row_blocks + n
                    # The run starts at a row's first kept block: kept where column < n.
                    _add_run_kept(acc[start:start + span],
                                  xp[k, block_row + g0:block_row + g0 + span], column[:span],
                                  np.int32(n), identity)
                    g[last - 1] += rows - 1  # the rows joined in are done
                elif step_last == 1:  # contiguous on both sides: the loop vectorises
                    _add_run(acc[start:start + n], xp[k, block_row + g0:block_row + g0 + n])
                else:
                    _add_run(acc[start:start + (n - 1) * step_last + 1:step_last],
                             xp[k, block_row + g0:block_row + g0 + n])
                # Next row of blocks along the outer axes.
                empty = not next_in_ranges(g, k_at, g_lo, g_hi, last)
            next_in_shape(k_at, block_shape, rank)  # next block offset
