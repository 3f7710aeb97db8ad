"""MaxUnpool on chunked arrays: values routed to the output chunk that owns their position.

Three kinds of task: per X chunk a *route* task sorts its values by the output chunk that owns
each index, for the output chunks its windows reach (its neighbourhood), and a *scan* task
finds its first out-of-range index and the stray values that point outside its neighbourhood
(none for MaxPool's indices); one *check* task raises the in-memory error for the first bad
index in row-major order, or gathers the strays; per output chunk a *write* task, run only
after the check, places the values of its neighbours and its strays.  On duplicate positions
the element of X that comes last in row-major (N, C, spatial) order wins, as in memory.
"""

from __future__ import annotations

import math

import dask.array as da
import numpy as np
from dask.base import tokenize
from dask.highlevelgraph import HighLevelGraph

from .. import activations, dtypes
from ..errors import PoolfoldError, PoolfoldTypeError
from ..geometry import WindowAttributes, unpooled_shape
from ..memory import check_size
from ..geometry import row_major_strides
from ..ops._common import activate
from ..ops.layout import channels_last_order, nchw_order
from ..ops.max_unpool import resolve_output_shape
from . import _graph


class _Layout:
    """Where everything sits: X's chunks (NCHW order), the output's chunks, neighbourhoods."""

    def __init__(self, x_chunks_nchw, out_shape, strides, kernel, pad_begin):
        self.out_shape = tuple(out_shape)
        self.total = math.prod(out_shape)
        self.plane = math.prod(out_shape[2:])
        self.channels = out_shape[1]
        self.x_shape = tuple(sum(c) for c in x_chunks_nchw)
        self.x_plane = math.prod(self.x_shape[2:])
        self.x_edges = [_graph.bounds(c) for c in x_chunks_nchw]
        self.out_edges = self.x_edges[:2]
        self.near = []  # per spatial axis, per X chunk: (first, last + 1) output chunk
        for a, edges in enumerate(self.x_edges[2:]):
            size, s, k, pb = out_shape[2 + a], strides[a], kernel[a], pad_begin[a]
            cuts = sorted({int(np.clip(b * s - pb, 0, size)) for b in edges[1:-1]} | {0, size})
            out_edges = np.array(cuts, np.int64)
            self.out_edges.append(out_edges)
            near = []
            for j in range(len(edges) - 1):
                lo = int(np.clip(edges[j] * s - pb, 0, size - 1))
                hi = int(np.clip((edges[j + 1] - 1) * s - pb + k, 1, size))
                if edges[j + 1] == edges[j]:
                    near.append((0, 0))
                    continue
                first = int(np.searchsorted(out_edges, lo, side="right")) - 1
                last = int(np.searchsorted(out_edges, max(hi, lo + 1) - 1, side="right"))
                near.append((first, last))
            self.near.append(near)
        self.out_chunks = tuple(tuple(int(v) for v in np.diff(e)) for e in self.out_edges)
        self.numblocks = tuple(len(c) for c in self.out_chunks)

    def owner(self, positions: np.ndarray) -> np.ndarray:
        """Flat number of the output chunk owning each (in-range) flat position."""
        plane, within = np.divmod(positions, self.plane)
        n, c = np.divmod(plane, self.channels)
        coords = [n, c] + list(np.unravel_index(within, self.out_shape[2:]))
        blocks = [np.searchsorted(e, v, side="right") - 1 for e, v in zip(self.out_edges, coords)]
        return np.ravel_multi_index(blocks, self.numblocks)

    def neighbours(self, block) -> set:
        """Flat numbers of the output chunks X chunk ``block`` (NCHW-numbered) may reach."""
        ranges = [range(block[0], block[0] + 1), range(block[1], block[1] + 1)]
        ranges += [range(*self.near[a][j]) for a, j in enumerate(block[2:])]
        return {int(np.ravel_multi_index(b, self.numblocks)) for b in np.ndindex(
            *[len(r) for r in ranges]) for b in [tuple(r[i] for r, i in zip(ranges, b))]}

    def order_keys(self, block, shape) -> np.ndarray:
        """Row-major (NCHW) position in X of every element of X chunk ``block``."""
        origin = [int(e[b]) for e, b in zip(self.x_edges, block)]
        strides = row_major_strides(self.x_shape)
        keys = np.zeros(shape, np.int64)
        for axis, (o, size) in enumerate(zip(origin, shape)):
            view = [1] * len(shape)
            view[axis] = size
            keys += ((o + np.arange(size, dtype=np.int64)) * strides[axis]).reshape(view)
        return keys


def _nchw(x: np.ndarray, channels_last: bool) -> np.ndarray:
    return np.moveaxis(x, -1, 1) if channels_last else x


def _entries(layout, block, x, indices, channels_last):
    """(positions, values, order keys, owners) of a chunk's in-range entries, flat."""
    x = _nchw(x, channels_last)
    positions = indices.reshape(-1)
    valid = (positions >= 0) & (positions < layout.total)
    keys = layout.order_keys(block, indices.shape).reshape(-1)
    values = x.reshape(-1) if x.flags.c_contiguous else np.ascontiguousarray(x).reshape(-1)
    if not valid.all():
        positions, values, keys = positions[valid], values[valid], keys[valid]
    return positions, values, keys, layout.owner(positions)


def _route(x, indices, layout, block, channels_last):
    """Route task: {output chunk: (positions, values, keys)} over the chunk's neighbourhood."""
    positions, values, keys, owners = _entries(layout, block, x, indices, channels_last)
    order = np.argsort(owners, kind="stable")
    owners = owners[order]
    cuts = np.flatnonzero(np.diff(owners)) + 1
    starts = np.concatenate([[0], cuts])
    stops = np.concatenate([cuts, [owners.size]])
    near = layout.neighbours(block)
    routed = {}
    for a, b in zip(starts, stops):
        if b > a and int(owners[a]) in near:
            pick = order[a:b]
            routed[int(owners[a])] = (positions[pick], values[pick], keys[pick])
    return routed


def _first(layout, block, shape, bad: np.ndarray, flat: np.ndarray):
    """The first flagged entry of a chunk of I: (row-major position in the whole I, value),
    or None."""
    hits = np.flatnonzero(bad)
    if not hits.size:
        return None
    local = np.unravel_index(int(hits[0]), shape)
    origin = [int(e[b]) for e, b in zip(layout.x_edges, block)]
    where = tuple(o + i for o, i in zip(origin, local))
    return int(np.ravel_multi_index(where, layout.x_shape)), int(flat[hits[0]])


def _scan(x, indices, layout, block, channels_last, given=None, inferred=None):
    """Scan task: the chunk's first bad indices (each as :func:`_first`) and its stray
    entries.  With ``inferred`` (I read in the inferred shape), ``given`` is the chunk of I
    as given, checked first against the inferred shape, then against the output."""
    flat = indices.reshape(-1)
    if inferred is None:
        firsts = (_first(layout, block, indices.shape, (flat < 0) | (flat >= layout.total), flat),)
    else:
        raw = given.reshape(-1)
        outside_inferred = (raw < 0) | (raw >= math.prod(inferred))
        firsts = (_first(layout, block, given.shape, outside_inferred, raw),
                  _first(layout, block, given.shape, ~outside_inferred & (flat < 0), raw))
    positions, values, keys, owners = _entries(layout, block, x, indices, channels_last)
    near = np.array(sorted(layout.neighbours(block)), np.int64)
    stray = ~np.isin(owners, near)
    return firsts, (positions[stray], values[stray], keys[stray])


def _check(scans, label, layout, dtype, inferred=None):
    """Check task: raise for the first bad index (in the in-memory order of the checks),
    else all strays."""
    for kind in range(len(scans[0][0]) if scans else 0):
        firsts = [s[0][kind] for s in scans if s[0][kind] is not None]
        if not firsts:
            continue
        position, value = min(firsts)
        where = tuple(int(i) for i in np.unravel_index(position, layout.x_shape))
        if inferred is None:
            space = f"the output {layout.out_shape}"
        elif kind == 0:
            space = f"the inferred shape {tuple(inferred)}"
        else:
            raise PoolfoldError(
                f"{label}: input 'I' holds index {value} at position {where}, which lies "
                f"outside output_shape {layout.out_shape} when read in the inferred shape "
                f"{tuple(inferred)}"
            )
        total = layout.total if inferred is None else math.prod(inferred)
        raise PoolfoldError(
            f"{label}: input 'I' holds index {value} at position {where}, outside the valid "
            f"range [0, {total}) of {space}"
        )
    parts = [s[1] for s in scans if s[1][0].size]
    if not parts:
        return (np.empty(0, np.int64), np.empty(0, dtype), np.empty(0, np.int64))
    return tuple(np.concatenate([p[k] for p in parts]) for k in range(3))


def _from_inferred(indices, inferred, out_shape):
    """Flat positions in ``inferred`` as flat positions in ``out_shape`` (the inferred block
    at the output's origin); -1 where the index is outside either (the check task reports
    those)."""
    inside = (indices >= 0) & (indices < math.prod(inferred))
    coords = np.unravel_index(np.where(inside, indices, 0), inferred)
    for axis in range(2, len(out_shape)):
        inside &= coords[axis] < out_shape[axis]
    coords = tuple(np.where(inside, c, 0) for c in coords)
    return np.where(inside, np.ravel_multi_index(coords, out_shape), -1).astype(np.int64)


def _write(strays, routes, layout, block, dtype, channels_last, act):
    """Write task: one output chunk, zeros where nothing lands, last writer (in X's row-major
    order) winning on duplicate positions."""
    flat_block = int(np.ravel_multi_index(block, layout.numblocks))
    parts = [r[flat_block] for r in routes if flat_block in r]
    if strays[0].size:
        mine = layout.owner(strays[0]) == flat_block
        if mine.any():
            parts.append(tuple(p[mine] for p in strays))
    shape = tuple(layout.out_chunks[a][b] for a, b in enumerate(block))
    out = np.zeros(shape, dtype)
    if parts:
        positions = np.concatenate([p[0] for p in parts])
        values = np.concatenate([p[1] for p in parts])
        keys = np.concatenate([p[2] for p in parts])
        if len(parts) > 1 or not (np.diff(keys) > 0).all():
            order = np.argsort(keys, kind="stable")
            positions, values = positions[order], values[order]
        # The last write of each position wins: keep its last occurrence.
        reverse = positions[::-1]
        _, last = np.unique(reverse, return_index=True)
        positions, values = reverse[last], values[::-1][last]
        plane, within = np.divmod(positions, layout.plane)
        n, c = np.divmod(plane, layout.channels)
        coords = [n, c] + list(np.unravel_index(within, layout.out_shape[2:]))
        local = tuple(v - layout.out_edges[a][b] for a, (v, b) in enumerate(zip(coords, block)))
        out[local] = values
    if channels_last:
        out = np.ascontiguousarray(np.moveaxis(out, 1, -1))
    return out if act is None else activate(out, act)


def _indices_array(spec, indices, nchw_shape) -> da.Array:
    """I as an int64 dask array of X's (NCHW) shape, with the in-memory messages."""
    given_array = isinstance(indices, (np.ndarray, da.Array)) or hasattr(indices, "dtype")
    if not isinstance(indices, da.Array):
        indices = da.asarray(indices if given_array else np.asarray(indices))
    if indices.dtype.byteorder not in "=|":
        indices = indices.astype(indices.dtype.newbyteorder("="))
    if indices.dtype != np.int64:
        if not given_array and (indices.dtype.kind in "iu" or indices.size == 0):
            indices = indices.astype(np.int64)
        else:
            raise PoolfoldTypeError(
                f"{spec.label}: input 'I' must be int64, got {dtypes.name(indices.dtype)}"
            )
    if indices.shape != tuple(nchw_shape):
        raise PoolfoldError(
            f"{spec.label}: input 'I' {indices.shape} must have the (NCHW) shape of X, "
            f"{tuple(nchw_shape)}"
        )
    return indices


def unpool(spec, x, indices, kernel_shape, strides, pads, output_shape, inferred_shape_indices,
           channels_last=False, act=activations.NONE):
    """The chunked MaxUnpool of a checked dask array ``x``: the output dask array."""
    if channels_last:
        nchw_shape, nchw_chunks = nchw_order(x.shape), nchw_order(x.chunks)
    else:
        nchw_shape, nchw_chunks = x.shape, x.chunks
    indices = _indices_array(spec, indices, nchw_shape)
    spatial = tuple(nchw_shape[2:])
    attributes = WindowAttributes.validate(spec.label, len(spatial), kernel_shape, strides, None,
                                           pads)
    rank = len(spatial)
    if output_shape is None:
        out_shape = tuple(nchw_shape[:2]) + unpooled_shape(spec.label, spatial, attributes)
        pad_begin = attributes.pads[:rank]
    else:
        out_shape = resolve_output_shape(spec, nchw_shape, output_shape)
        pad_begin = (0,) * rank  # pads are ignored with output_shape
    indices = indices.rechunk(nchw_chunks)
    given = inferred = None
    if output_shape is not None and inferred_shape_indices:
        inferred = tuple(nchw_shape[:2]) + unpooled_shape(spec.label, spatial, attributes)
        given = indices
        indices = indices.map_blocks(_from_inferred, inferred, out_shape, dtype=np.int64)
    layout = _Layout(nchw_chunks, out_shape, attributes.strides, attributes.kernel, pad_begin)
    biggest = tuple(max(c) for c in layout.out_chunks)
    check_size(spec.label, "output", biggest, x.dtype)
    token = tokenize(x.name, indices.name, out_shape, attributes, channels_last, act,
                     spec.label)
    route_name, scan_name = f"max-unpool-route-{token}", f"max-unpool-scan-{token}"
    check_name, out_name = f"max-unpool-check-{token}", f"max-unpool-{token}"
    # The layout goes into the graph once, and every task names it by key.
    layout_name = f"max-unpool-layout-{token}"
    layout_key = (layout_name,)
    routes, scans, writes = {}, {}, {}
    reached: dict[tuple, list] = {}
    for block in np.ndindex(*[len(c) for c in nchw_chunks]):
        x_block = channels_last_order(block) if channels_last else block
        x_key, i_key = (x.name,) + x_block, (indices.name,) + block
        routes[(route_name,) + block] = (_route, x_key, i_key, layout_key, block, channels_last)
        scans[(scan_name,) + block] = (_scan, x_key, i_key, layout_key, block, channels_last,
                                       None if given is None else (given.name,) + block,
                                       inferred)
        for target in layout.neighbours(block):
            reached.setdefault(target, []).append((route_name,) + block)
    check = {(check_name,): (_check, list(scans), spec.label, layout_key, x.dtype, inferred)}
    for block in np.ndindex(*layout.numblocks):
        flat = int(np.ravel_multi_index(block, layout.numblocks))
        key = channels_last_order(block) if channels_last else block
        writes[(out_name,) + key] = (_write, (check_name,), reached.get(flat, []), layout_key,
                                     block, x.dtype, channels_last, act)
    layers = {layout_name: {layout_key: layout}, route_name: routes, scan_name: scans,
              check_name: check, out_name: writes}
    deps = {layout_name: set(), route_name: {x.name, indices.name, layout_name},
            scan_name: {x.name, indices.name, layout_name} | ({given.name} if given is not None
                                                              else set()),
            check_name: {scan_name, layout_name},
            out_name: {route_name, check_name, layout_name}}
    graph = HighLevelGraph.merge(HighLevelGraph(layers, deps), x.dask, indices.dask,
                                 *([given.dask] if given is not None else []))
    chunks = layout.out_chunks
    if channels_last:
        chunks = channels_last_order(chunks)
    return da.Array(graph, out_name, chunks, meta=_graph.meta(len(chunks), x.dtype))
