"""Benchmarks of :mod:`poolfold.dask` (``poolfold bench --dask``), and its options.  dask,
distributed and zarr are imported inside the functions that use them: the command line reads
the options without them.

Two parts, each of one op (:data:`OPS`: MaxPool 2x2x2 at stride 2 with Indices, a
downsampling, or AveragePool 7x7x7 at stride 1 with SAME pads, a box filter):

- **out of core**: a float32 ``(1, 1, S, S, S)`` volume (S = 2048: 32 GiB, more than most
  machines' memory) written to a zarr store under a temporary folder, pooled from zarr to zarr
  on a ``LocalCluster`` of process workers with a memory limit each; wall time, throughput,
  the peak resident memory of every worker (sampled), and a spot check of some output chunks
  against the in-memory function on their slice of the input.  The folder is deleted
  afterwards.
- **in memory**: the same pool on a volume that fits, the in-memory call (1 and 2 threads)
  against ``poolfold.dask`` on a cluster of 1 and 2 single-threaded workers, the input already
  in the workers' memory and the outputs left there: the cost of chunking, per core.

``--markdown`` writes the figures between ``<!-- bench:dask-OP -->`` markers (OP ``max`` or
``average``).
"""

from __future__ import annotations

import math
import os
import shutil
import tempfile
import threading
import time

import numpy as np

KERNEL, STRIDES = [2, 2, 2], [2, 2, 2]
# The box filter's window (AveragePool, stride 1, SAME_UPPER pads of 3 before and after).
BOX = 7


class _Op:
    """A benchmarked op: its name in the tables, its outputs' types, and the in-memory and
    chunked calls on a 5-D volume (a tuple of outputs)."""

    def __init__(self, title, out_types, shrink):
        self.title, self.out_types, self.shrink = title, out_types, shrink

    def memory(self, x):
        import poolfold

        if self.shrink:
            return poolfold.max_pool(x, KERNEL, strides=STRIDES, return_indices=True)
        return (poolfold.average_pool(x, [BOX] * 3, auto_pad="SAME_UPPER"),)

    def chunked(self, x):
        import poolfold.dask

        if self.shrink:
            return poolfold.dask.max_pool(x, KERNEL, strides=STRIDES, return_indices=True)
        return (poolfold.dask.average_pool(x, [BOX] * 3, auto_pad="SAME_UPPER"),)


OPS = {"max": _Op("MaxPool 2x2x2 with Indices", (np.float32, np.int64), True),
       "average": _Op(f"AveragePool {BOX}x{BOX}x{BOX} stride 1 SAME", (np.float32,), False)}


def add_dask_arguments(parser) -> None:
    parser.add_argument("--dask-size", type=int, default=2048, metavar="S",
                        help="side of the out-of-core float32 (1, 1, S, S, S) zarr volume "
                             "(default 2048: 32 GiB on disk; 0 skips the out-of-core run)")
    parser.add_argument("--dask-chunk", type=int, default=256, metavar="C",
                        help="chunk side of both volumes (default 256)")
    parser.add_argument("--dask-memory-limit", default="4GiB", metavar="M",
                        help="memory limit of each of the 2 workers (default 4GiB)")
    parser.add_argument("--dask-dir", default=None, metavar="DIR",
                        help="where the temporary zarr stores go (default: the temp dir)")
    parser.add_argument("--dask-in-memory-size", type=int, default=512, metavar="S",
                        help="side of the in-memory comparison volume (default 512; 0 skips it)")
    parser.add_argument("--dask-op", choices=sorted(OPS), default="max",
                        help="the op of both parts: max (MaxPool 2x2x2 at stride 2 with "
                             f"Indices, the default) or average (AveragePool {BOX}x{BOX}x{BOX} "
                             "at stride 1, SAME pads: a box filter)")


def _make_chunk(block_info=None):
    """One chunk of the benchmark volume: random float32, seeded by the chunk's place."""
    info = block_info[None]
    seed = hash(tuple(info["chunk-location"])) & 0xFFFFFFFF
    return np.random.default_rng(seed).random(info["chunk-shape"], dtype=np.float32)


def _volume(shape, chunks, name=None):
    import dask.array as da

    return da.map_blocks(_make_chunk, dtype=np.float32, chunks=da.core.normalize_chunks(
        chunks, shape), meta=np.empty((0,) * len(shape), np.float32), name=name)


class _PeakMemory:
    """Samples the resident memory of some processes in a thread; the peak of each."""

    def __init__(self, pids, interval=0.2):
        import psutil

        self.processes = {pid: psutil.Process(pid) for pid in pids}
        self.peak = {pid: 0 for pid in pids}
        self.interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.is_set():
            for pid, process in self.processes.items():
                try:
                    self.peak[pid] = max(self.peak[pid], process.memory_info().rss)
                except Exception:  # a worker that went away: keep what was seen
                    pass
            self._stop.wait(self.interval)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


def _cluster(workers: int, memory_limit: str):
    from distributed import Client, LocalCluster

    # One kernel thread per single-threaded worker: the workers are the parallelism.
    cluster = LocalCluster(n_workers=workers, threads_per_worker=1, processes=True,
                           memory_limit=memory_limit, dashboard_address=None,
                           env={"POOLFOLD_NUM_THREADS": "1"})
    return cluster, Client(cluster)


def _warm(client, op):
    """Compile (or load from numba's cache) the kernels in every worker before timing."""
    import dask.array as da

    x = da.ones((1, 1, 16, 16, 16), np.float32, chunks=8)
    outputs = op.chunked(x)
    client.run(lambda: None)
    for _ in range(2):
        client.compute(list(outputs), sync=True)


def out_of_core(size=2048, chunk=256, workers=2, memory_limit="4GiB", directory=None,
                spot_checks=4, tick=print, op="max") -> dict:
    """The out-of-core run of ``op`` (a key of :data:`OPS`; see the module doc); returns
    its figures."""
    import dask.array as da
    import zarr

    op = OPS[op]
    shape = (1, 1, size, size, size)
    in_chunks = (1, 1, chunk, chunk, chunk)
    folder = tempfile.mkdtemp(prefix="poolfold-dask-bench-", dir=directory)
    cluster, client = _cluster(workers, memory_limit)
    try:
        _warm(client, op)
        pids = list(client.run(os.getpid).values())
        source = zarr.create_array(os.path.join(folder, "x.zarr"), shape=shape,
                                   chunks=in_chunks, dtype=np.float32, compressors=None)
        tick(f"writing {math.prod(shape) * 4 / 2**30:.1f} GiB of input to {folder}")
        start = time.perf_counter()
        da.store(_volume(shape, in_chunks), source, lock=False, compute=True)
        write_s = time.perf_counter() - start
        outputs = op.chunked(da.from_zarr(source))
        stores = [zarr.create_array(os.path.join(folder, f"out{n}.zarr"), shape=y.shape,
                                    chunks=tuple(c[0] for c in y.chunks), dtype=dtype,
                                    compressors=None)
                  for n, (y, dtype) in enumerate(zip(outputs, op.out_types))]
        tick(f"{op.title}: zarr -> zarr")
        with _PeakMemory(pids) as memory:
            start = time.perf_counter()
            da.store(list(outputs), stores, lock=False, compute=True)
            pool_s = time.perf_counter() - start
        checks = _spot_check(op, source, stores, chunk, spot_checks)
        in_bytes = math.prod(shape) * 4
        out_bytes = sum(math.prod(y.shape) * np.dtype(t).itemsize
                        for y, t in zip(outputs, op.out_types))
        return {
            "op": op.title, "shape": list(shape), "chunks": list(in_chunks),
            "workers": workers, "memory_limit": memory_limit,
            "input_gib": in_bytes / 2**30, "output_gib": out_bytes / 2**30,
            "largest_output_chunk_mib": max(
                math.prod(max(c) for c in y.chunks) * np.dtype(t).itemsize
                for y, t in zip(outputs, op.out_types)) / 2**20,
            "write_s": write_s, "pool_s": pool_s,
            "input_gb_per_s": in_bytes / pool_s / 1e9,
            "io_gb_per_s": (in_bytes + out_bytes) / pool_s / 1e9,
            "worker_peak_rss_gib": [memory.peak[p] / 2**30 for p in pids],
            "machine_memory_gib": _machine_memory() / 2**30,
            "spot_checks": checks,
        }
    finally:
        client.close()
        cluster.close()
        shutil.rmtree(folder, ignore_errors=True)


def _machine_memory() -> int:
    import psutil

    return psutil.virtual_memory().total


def _spot_check(op, source, stores, chunk, count) -> list[dict]:
    """Some output chunks (input chunk ``block`` along each axis) against the in-memory op
    on a slice of the input.  MaxPool: the chunk's own slice, its Indices turned from the
    slice's numbering to the volume's with numpy's own ravel / unravel.  The box filter:
    the chunk's slice with the windows' reach, from a multiple of its window on (or the
    volume's edge), cropped to the chunk: the in-memory sums place a leading axis's blocks
    of 7 from the first padded position, 3 before the slice, so they are the volume's
    blocks and every output the volume's bits."""
    size = source.shape[2]
    rng = np.random.default_rng(1)
    grid = size // chunk
    blocks = [(0, 0, 0), (grid - 1,) * 3] + [tuple(rng.integers(0, grid, 3))
                                             for _ in range(max(0, count - 2))]
    results = []
    for block in blocks[:count]:
        lo = [b * chunk for b in block]
        if op.shrink:
            piece = source[(0, slice(0, 1)) + tuple(slice(a, a + chunk) for a in lo)]
            y, local = op.memory(piece[None])
            coords = np.unravel_index(local, piece[None].shape)
            coords = coords[:2] + tuple(c + a for c, a in zip(coords[2:], lo))
            expected = [y, np.ravel_multi_index(coords, source.shape)]
            out = tuple(slice(a // 2, (a + chunk) // 2) for a in lo)
        else:
            reach = BOX // 2
            first = [0 if a - reach <= 0 else (a - reach) // BOX * BOX for a in lo]
            last = [min(size, a + chunk + reach) for a in lo]
            piece = source[(0, slice(0, 1)) + tuple(slice(f, e) for f, e in zip(first, last))]
            y, = op.memory(piece[None])
            expected = [y[(slice(None),) * 2 + tuple(slice(a - f, a - f + chunk)
                                                     for a, f in zip(lo, first))]]
            out = tuple(slice(a, a + chunk) for a in lo)
        read = [store[(0, slice(0, 1)) + out][None] for store in stores]
        results.append({"block": [int(b) for b in block],
                        "equal": all(got.tobytes() == want.tobytes()
                                     for got, want in zip(read, expected))})
    return results


def in_memory(shape=(1, 1, 512, 512, 512), chunk=256, repeat=3, tick=print,
              op="max") -> dict:
    """Throughput of the in-memory call of ``op`` (a key of :data:`OPS`) against
    ``poolfold.dask`` on 1 and 2 workers."""
    from distributed import wait

    op = OPS[op]
    nbytes = math.prod(shape) * 4
    x_host = np.random.default_rng(0).random(shape, dtype=np.float32)
    figures = {"op": op.title, "shape": list(shape), "chunk": chunk}
    previous = os.environ.get("POOLFOLD_NUM_THREADS")
    try:
        for threads in (1, 2):
            os.environ["POOLFOLD_NUM_THREADS"] = str(threads)
            op.memory(x_host)
            best = best_cpu = math.inf
            for _ in range(repeat):
                start, cpu = time.perf_counter(), time.process_time()
                op.memory(x_host)
                best = min(best, time.perf_counter() - start)
                best_cpu = min(best_cpu, time.process_time() - cpu)
            figures[f"in_memory_{threads}_threads_gb_per_s"] = nbytes / best / 1e9
            figures[f"in_memory_{threads}_threads_gb_per_cpu_s"] = nbytes / best_cpu / 1e9
            tick(f"in memory, {threads} thread(s): {nbytes / best / 1e9:.2f} GB/s")
    finally:
        if previous is None:
            os.environ.pop("POOLFOLD_NUM_THREADS", None)
        else:
            os.environ["POOLFOLD_NUM_THREADS"] = previous
    del x_host
    for workers in (1, 2):
        cluster, client = _cluster(workers, "4GiB")
        try:
            _warm(client, op)
            import psutil

            workers_now = [psutil.Process(p) for p in client.run(os.getpid).values()]
            best = best_cpu = math.inf
            for r in range(repeat):
                # A fresh input each round, in the workers' memory before the clock starts:
                # new output keys, so no round finds the last one's results.
                x = client.persist(_volume(shape, (1, 1, chunk, chunk, chunk),
                                           name=f"bench-input-{workers}-{r}"))
                wait(x)
                outputs = op.chunked(x)
                cpu = sum(sum(p.cpu_times()[:2]) for p in workers_now)
                start = time.perf_counter()
                out = client.persist(list(outputs))
                wait(out)
                best = min(best, time.perf_counter() - start)
                best_cpu = min(best_cpu, sum(sum(p.cpu_times()[:2]) for p in workers_now) - cpu)
                del out, outputs, x
            figures[f"dask_{workers}_workers_gb_per_s"] = nbytes / best / 1e9
            figures[f"dask_{workers}_workers_gb_per_cpu_s"] = nbytes / best_cpu / 1e9
            tick(f"poolfold.dask, {workers} worker(s): {nbytes / best / 1e9:.2f} GB/s")
        finally:
            client.close()
            cluster.close()
    for n in (1, 2):
        figures[f"dask_vs_in_memory_{n}"] = (figures[f"dask_{n}_workers_gb_per_s"]
                                             / figures[f"in_memory_{n}_threads_gb_per_s"])
    return figures


def format_results(results: dict) -> str:
    lines = []
    m = results.get("in_memory")
    if m:
        side = m["shape"][2]
        lines.append(f"{m.get('op', OPS['max'].title)}, float32 {side}^3 "
                     f"({side**3 * 4 / 2**20:.0f} MiB), chunks {m['chunk']}^3, input and "
                     "outputs in memory:")
        lines.append("| | 1 core | 2 cores |")
        lines.append("|---|---|---|")
        lines.append(f"| in-memory poolfold | {m['in_memory_1_threads_gb_per_s']:.2f} GB/s "
                     f"| {m['in_memory_2_threads_gb_per_s']:.2f} GB/s |")
        lines.append(f"| poolfold.dask, LocalCluster | {m['dask_1_workers_gb_per_s']:.2f} GB/s "
                     f"| {m['dask_2_workers_gb_per_s']:.2f} GB/s |")
        lines.append(f"| dask / in-memory | {m['dask_vs_in_memory_1']:.0%} "
                     f"| {m['dask_vs_in_memory_2']:.0%} |")
        lines.append(f"| per CPU second: in-memory | {m['in_memory_1_threads_gb_per_cpu_s']:.2f} "
                     f"GB/s | {m['in_memory_2_threads_gb_per_cpu_s']:.2f} GB/s |")
        lines.append(f"| per CPU second: poolfold.dask | {m['dask_1_workers_gb_per_cpu_s']:.2f} "
                     f"GB/s | {m['dask_2_workers_gb_per_cpu_s']:.2f} GB/s |")
    o = results.get("out_of_core")
    if o:
        peaks = ", ".join(f"{p:.2f}" for p in o["worker_peak_rss_gib"])
        checks = sum(c["equal"] for c in o["spot_checks"])
        lines += [
            "",
            f"Out of core: float32 {tuple(o['shape'])} ({o['input_gib']:.0f} GiB), zarr chunks "
            f"{tuple(o['chunks'])}, no compressor, {o.get('op', OPS['max'].title)} to zarr "
            f"({o['output_gib']:.0f} GiB; output chunks of at most "
            f"{o.get('largest_output_chunk_mib', 0):.0f} MiB), {o['workers']} workers of "
            f"{o['memory_limit']}:",
            f"- writing the input: {o['write_s']:.0f} s",
            f"- pooling zarr -> zarr: {o['pool_s']:.0f} s, {o['input_gb_per_s']:.2f} GB/s of input "
            f"({o['io_gb_per_s']:.2f} GB/s read + written)",
            f"- peak resident memory per worker: {peaks} GiB "
            f"(machine: {o['machine_memory_gib']:.0f} GiB)",
            f"- spot check: {checks} of {len(o['spot_checks'])} output chunks equal to the "
            "in-memory result on their input slice",
        ]
    return "\n".join(lines)


def measure(args) -> dict:
    """``poolfold bench --dask``: the in-memory comparison, then the out-of-core run."""
    import sys

    def tick(message):
        print(f"poolfold bench --dask: {message}", file=sys.stderr, flush=True)

    results = {"op": args.dask_op}
    if args.dask_in_memory_size:
        results["in_memory"] = in_memory((1, 1) + (args.dask_in_memory_size,) * 3,
                                         args.dask_chunk, tick=tick, op=args.dask_op)
    if args.dask_size:
        results["out_of_core"] = out_of_core(args.dask_size, args.dask_chunk, 2,
                                             args.dask_memory_limit, args.dask_dir, tick=tick,
                                             op=args.dask_op)
    return results


summary = format_results


def section_name(result: dict) -> str:
    """The markers ``--markdown`` writes this op's figures between (``bench:dask-OP``)."""
    return f"dask-{result['op']}"


def markdown(result: dict, meta: dict, command: str) -> str:
    from .report import load_text, machine_text, versions_text

    return (f"{format_results(result)}\n\n`{command}` on {meta['date']}: "
            f"{machine_text(meta)}; {versions_text(meta)}. {load_text(meta)}")


def glance(result: dict, meta: dict, command: str) -> list:
    return []
