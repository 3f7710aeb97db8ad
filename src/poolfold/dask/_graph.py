"""Graph-building helpers shared by the chunked ops: input checks, chunk geometry, and the
low-level task graphs the ops write (one task per output chunk, reading the input chunks it
needs by key)."""

from __future__ import annotations

import operator
from itertools import product

import dask.array as da
import numpy as np
from dask.highlevelgraph import HighLevelGraph

from ..errors import PoolfoldError
from ..ops._common import check_tensor, native, not_convertible
from ..schema import OpVersion


def as_dask(spec: OpVersion, value, name: str, min_rank: int = 3) -> da.Array:
    """``value`` as a dask array of a type the version accepts, of rank >= ``min_rank``: the
    in-memory ops' checks and messages (:func:`poolfold.ops._common.check_tensor`)."""
    if not isinstance(value, da.Array):
        try:
            stored = getattr(value, "chunks", None)  # zarr, h5py: keep the stored chunks
            if isinstance(stored, tuple) and hasattr(value, "shape") and all(
                    isinstance(c, (int, np.integer)) for c in stored):
                value = da.from_array(value, chunks=stored)
            else:
                value = da.asarray(value)
        except (ValueError, TypeError, NotImplementedError) as error:
            raise not_convertible(spec, name, error) from None
    check_tensor(spec, value.dtype, value.shape, name, min_rank)
    if any(np.isnan(n) for n in value.shape):
        raise PoolfoldError(
            f"{spec.label}: input '{name}' has unknown chunk sizes {value.chunks}; "
            "call compute_chunk_sizes() first"
        )
    return native(value)


def bounds(chunks: tuple[int, ...]) -> np.ndarray:
    """Chunk boundaries along one axis: ``[0, c0, c0 + c1, ..., n]``."""
    return np.concatenate([[0], np.cumsum(chunks, dtype=np.int64)])


def pieces(edges: np.ndarray, lo: int, hi: int) -> list[tuple[int, slice, slice]]:
    """The chunks (of boundaries ``edges``) that ``[lo, hi)`` overlaps: per chunk, its
    number, where its part lands in ``[lo, hi)``, and which part of the chunk it is."""
    out = []
    if hi <= lo:
        return out
    first = int(np.searchsorted(edges, lo, side="right")) - 1
    for j in range(first, len(edges) - 1):
        start, stop = int(edges[j]), int(edges[j + 1])
        if start >= hi:
            break
        if stop <= lo:
            continue
        a, b = max(start, lo), min(stop, hi)
        out.append((j, slice(a - lo, b - lo), slice(a - start, b - start)))
    return out


def assemble(arrays: list, placements: list, shape: tuple[int, ...], dtype):
    """One block from parts of chunks: ``block[dst] = array[src]`` for each part (``src``
    slices of a chunk, or a part's number in the tuple a task of :class:`Parts` returns).
    A block that is one whole chunk is that chunk, uncopied."""
    if len(arrays) == 1:
        dst, src = placements[0]
        part = arrays[0][src]
        if part.shape == tuple(shape):
            return part
    block = np.empty(shape, dtype)
    for array, (dst, src) in zip(arrays, placements):
        block[dst] = array[src]
    return block


def block_inputs(name: str, fixed: dict, spatial_axes: list[int], axis_pieces: list, ndim: int):
    """Keys of the chunks of array ``name`` that make up one block, with their placements.

    ``fixed`` maps the axes taken one chunk to one chunk (N, C) to (chunk number, length);
    ``axis_pieces[i]`` lists :func:`pieces` along ``spatial_axes[i]``."""
    keys, placements = [], []
    for combo in product(*axis_pieces):
        index = [0] * ndim
        dst = [slice(None)] * ndim
        src = [slice(None)] * ndim
        for axis, (chunk, _) in fixed.items():
            index[axis] = chunk
        for axis, (chunk, d, s) in zip(spatial_axes, combo):
            index[axis] = chunk
            dst[axis] = d
            src[axis] = s
        keys.append((name,) + tuple(index))
        placements.append((tuple(dst), tuple(src)))
    return keys, placements


class Parts:
    """The parts of ``array``'s chunks that blocks read, cut (copied) from each chunk by a
    task of its own that returns them all: a block then depends on the parts it reads of a
    neighbouring chunk, not on the whole chunk, and a chunk can be let go once its parts are
    cut.  (A slab of 256^3 whose windows reach 3 elements into its 26 neighbours made a
    worker fetch and hold 27 chunks of 64 MiB, 1.7 GiB, and workers of 4 GiB died.)  One
    task a chunk, not one a part: on dask's threads, 3x3x3 MaxPool over 512^3 in chunks of
    128^3 took 0.54-0.57 s without parts, 0.57 with a task a chunk, 0.67 with a task a part
    (26 a block).  Their tasks form a layer of their own, ``name``, after ``array``'s."""

    def __init__(self, array: da.Array, prefix: str, token):
        self.chunks = array.chunks
        self.name = f"{prefix}-part-{token}"
        self._cuts = {}  # per chunk key: {part's bounds: its number}, and the parts

    def take(self, keys: list, placements: list) -> tuple[list, list]:
        """``keys`` and ``placements`` (:func:`block_inputs`') with every part smaller than
        its chunk read from its chunk's task of parts (the placement's source then the
        part's number in what that task returns)."""
        taken_keys, taken_placements = [], []
        for key, (dst, src) in zip(keys, placements):
            if self._whole(key, src):
                taken_keys.append(key)
                taken_placements.append((dst, src))
                continue
            numbers, cuts = self._cuts.setdefault(key, ({}, []))
            bounds = tuple((part.start, part.stop) for part in src)
            if bounds not in numbers:
                numbers[bounds] = len(cuts)
                cuts.append(src)
            taken_keys.append((self.name,) + key[1:])
            taken_placements.append((dst, numbers[bounds]))
        return taken_keys, taken_placements

    @property
    def tasks(self) -> dict:
        """The layer's tasks, once every block has taken its parts."""
        return {(self.name,) + key[1:]: (_cut, key, cuts)
                for key, (_, cuts) in self._cuts.items()}

    def _whole(self, key, src) -> bool:
        for axis, part in enumerate(src):
            length = self.chunks[axis][key[1 + axis]]
            if part.indices(length)[:2] != (0, length):
                return False
        return True


def _cut(chunk, cuts) -> tuple:
    """Parts of a chunk, copied: a view would keep the whole chunk alive with it."""
    return tuple(chunk[src].copy() for src in cuts)


def slab_inputs(name: str, n_axis: int, c_axis: int, n_chunk: tuple[int, int],
                c_chunk: tuple[int, int], spatial_axes: list[int], reach: list, ndim: int,
                parts: Parts | None = None):
    """The input chunks a pooling slab reads: ``(keys, placements, block_shape)``.

    ``n_chunk`` and ``c_chunk`` are (chunk number, length) of the slab's N and C chunks;
    ``reach[i]`` is ``(lo, hi, pieces)`` along ``spatial_axes[i]``: the input range the
    windows read and its :func:`pieces`.  A slab that reads nothing (its windows all in the
    padding) takes an element-less slice of the block's first chunk.  With ``parts``, the
    parts of chunks it reads are cut by tasks of their own (:class:`Parts`)."""
    if any(hi - lo == 0 for lo, hi, _ in reach):
        keys = [tuple([name] + [n_chunk[0] if i == n_axis else c_chunk[0] if i == c_axis else 0
                                for i in range(ndim)])]
        placements = [(None, tuple(slice(None) if i in (n_axis, c_axis) else slice(0, 0)
                                   for i in range(ndim)))]
        block_shape = tuple(n_chunk[1] if i == n_axis else c_chunk[1] if i == c_axis else 0
                            for i in range(ndim))
        return keys, placements, block_shape
    keys, placements = block_inputs(name, {n_axis: n_chunk, c_axis: c_chunk}, spatial_axes,
                                    [pieces_ for _, _, pieces_ in reach], ndim)
    if parts is not None:
        keys, placements = parts.take(keys, placements)
    block_shape = [0] * ndim
    block_shape[n_axis], block_shape[c_axis] = n_chunk[1], c_chunk[1]
    for axis, (lo, hi, _) in zip(spatial_axes, reach):
        block_shape[axis] = hi - lo
    return keys, placements, tuple(block_shape)


def arrays_from_tasks(prefix: str, tasks: dict, dependencies: list, outputs: list,
                      token, parts: Parts | None = None) -> list[da.Array]:
    """Dask arrays from a layer of tasks keyed by block.  ``outputs`` lists per array its
    ``(chunks, meta, renumber)``: with one output each task returns that array's block; with
    several, a tuple, and output ``k`` takes item ``k`` of every task, at block
    ``renumber(block)`` (``None``: the task's own block number).  ``parts``: the layer of
    parts of the first dependency's chunks that the tasks read (:class:`Parts`)."""
    name = f"{prefix}-{token}"
    graph = {(name,) + block: task for block, task in tasks.items()}
    deps = {d.name for d in dependencies}
    inputs = HighLevelGraph.merge(*[d.dask for d in dependencies])
    if parts is not None and parts.tasks:
        inputs = HighLevelGraph.merge(
            HighLevelGraph({parts.name: parts.tasks}, {parts.name: {dependencies[0].name}}),
            inputs)
        deps.add(parts.name)
    if len(outputs) == 1:
        chunks, meta_, _ = outputs[0]
        hlg = HighLevelGraph.merge(HighLevelGraph({name: graph}, {name: deps}), inputs)
        return [da.Array(hlg, name, chunks, meta=meta_)]
    arrays = []
    for k, (chunks, meta_, renumber) in enumerate(outputs):
        out_name = f"{prefix}-{k}-{token}"
        layer = {(out_name,) + (renumber(block) if renumber else block):
                 (operator.getitem, (name,) + block, k) for block in tasks}
        hlg = HighLevelGraph({name: graph, out_name: layer}, {name: deps, out_name: {name}})
        arrays.append(da.Array(HighLevelGraph.merge(hlg, inputs), out_name, chunks, meta=meta_))
    return arrays


def meta(ndim: int, dtype) -> np.ndarray:
    return np.empty((0,) * ndim, dtype)

