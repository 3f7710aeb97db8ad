"""Benchmarks of :mod:`poolfold.dask` (``poolfold bench --dask``), and its options.  dask,
distributed and zarr are imported inside the functions that use them: the command line reads
the options without them.

Two parts:

- **out of core**: a float32 ``(1, 1, S, S, S)`` volume (S = 2048: 32 GiB, more than most
  machines' memory) written to a zarr store under a temporary folder, pooled 2x2x2 with Indices
  from zarr to zarr on a ``LocalCluster`` of process workers with a memory limit each; wall
  time, throughput, the peak resident memory of every worker (sampled), and a spot check of some
  output chunks against the in-memory function on their slice of the input.  The folder is
  deleted afterwards.
- **in memory**: the same pool on a volume that fits, the in-memory call (1 and 2 threads)
  against ``poolfold.dask`` on a cluster of 1 and 2 single-threaded workers, the input already
  in the workers' memory and the outputs left there: the cost of chunking, per core.
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


def _warm(client):
    """Compile (or load from numba's cache) the kernels in every worker before timing."""
    import dask.array as da

    import poolfold.dask

    x = da.ones((1, 1, 8, 8, 8), np.float32, chunks=4)
    y, i = poolfold.dask.max_pool(x, KERNEL, strides=STRIDES, return_indices=True)
    client.run(lambda: None)
    for _ in range(2):
        client.compute([y, i], sync=True)


def out_of_core(size=2048, chunk=256, workers=2, memory_limit="4GiB", directory=None,
                spot_checks=4, tick=print) -> dict:
    """The out-of-core run (see the module doc); returns its figures."""
    import dask.array as da
    import zarr

    import poolfold
    import poolfold.dask

    shape = (1, 1, size, size, size)
    in_chunks = (1, 1, chunk, chunk, chunk)
    out_shape = poolfold.max_pool_shape(shape, KERNEL, strides=STRIDES)
    out_chunks = (1, 1) + (chunk // 2,) * 3
    folder = tempfile.mkdtemp(prefix="poolfold-dask-bench-", dir=directory)
    cluster, client = _cluster(workers, memory_limit)
    try:
        _warm(client)
        pids = list(client.run(os.getpid).values())
        source = zarr.create_array(os.path.join(folder, "x.zarr"), shape=shape,
                                   chunks=in_chunks, dtype=np.float32, compressors=None)
        tick(f"writing {math.prod(shape) * 4 / 2**30:.1f} GiB of input to {folder}")
        start = time.perf_counter()
        da.store(_volume(shape, in_chunks), source, lock=False, compute=True)
        write_s = time.perf_counter() - start
        y_store = zarr.create_array(os.path.join(folder, "y.zarr"), shape=out_shape,
                                    chunks=out_chunks, dtype=np.float32, compressors=None)
        i_store = zarr.create_array(os.path.join(folder, "i.zarr"), shape=out_shape,
                                    chunks=out_chunks, dtype=np.int64, compressors=None)
        x = da.from_zarr(source)
        y, i = poolfold.dask.max_pool(x, KERNEL, strides=STRIDES, return_indices=True)
        tick("pooling zarr -> zarr")
        with _PeakMemory(pids) as memory:
            start = time.perf_counter()
            da.store([y, i], [y_store, i_store], lock=False, compute=True)
            pool_s = time.perf_counter() - start
        checks = _spot_check(source, y_store, i_store, chunk, spot_checks)
        in_bytes = math.prod(shape) * 4
        out_bytes = math.prod(out_shape) * (4 + 8)
        return {
            "shape": list(shape), "chunks": list(in_chunks), "workers": workers,
            "memory_limit": memory_limit, "input_gib": in_bytes / 2**30,
            "output_gib": out_bytes / 2**30, "write_s": write_s, "pool_s": pool_s,
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


def _spot_check(source, y_store, i_store, chunk, count) -> list[dict]:
    """Some output chunks against the in-memory MaxPool of their input slice; the Indices
    turned from the slice's numbering to the volume's with numpy's own ravel / unravel."""
    import poolfold

    size = source.shape[2]
    rng = np.random.default_rng(1)
    grid = size // chunk
    blocks = [(0, 0, 0), (grid - 1,) * 3] + [tuple(rng.integers(0, grid, 3))
                                             for _ in range(max(0, count - 2))]
    results = []
    for block in blocks[:count]:
        lo = [b * chunk for b in block]
        piece = source[(0, slice(0, 1)) + tuple(slice(a, a + chunk) for a in lo)]
        y, local = poolfold.max_pool(piece[None], KERNEL, strides=STRIDES, return_indices=True)
        coords = np.unravel_index(local, piece[None].shape)
        coords = coords[:2] + tuple(c + a for c, a in zip(coords[2:], lo))
        expected = np.ravel_multi_index(coords, source.shape)
        out = tuple(slice(a // 2, (a + chunk) // 2) for a in lo)
        y_read, i_read = y_store[(0, slice(0, 1)) + out], i_store[(0, slice(0, 1)) + out]
        results.append({"block": [int(b) for b in block],
                        "equal": bool(np.array_equal(y_read[None], y)
                                      and np.array_equal(i_read[None], expected))})
    return results


def in_memory(shape=(1, 1, 512, 512, 512), chunk=256, repeat=3, tick=print) -> dict:
    """Throughput of the in-memory call against ``poolfold.dask`` on 1 and 2 workers."""
    from distributed import wait

    import poolfold
    import poolfold.dask

    nbytes = math.prod(shape) * 4
    x_host = np.random.default_rng(0).random(shape, dtype=np.float32)
    figures = {"shape": list(shape), "chunk": chunk}
    previous = os.environ.get("POOLFOLD_NUM_THREADS")
    try:
        for threads in (1, 2):
            os.environ["POOLFOLD_NUM_THREADS"] = str(threads)
            poolfold.max_pool(x_host, KERNEL, strides=STRIDES, return_indices=True)
            best = best_cpu = math.inf
            for _ in range(repeat):
                start, cpu = time.perf_counter(), time.process_time()
                poolfold.max_pool(x_host, KERNEL, strides=STRIDES, return_indices=True)
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
            _warm(client)
            import psutil

            workers_now = [psutil.Process(p) for p in client.run(os.getpid).values()]
            best = best_cpu = math.inf
            for r in range(repeat):
                # A fresh input each round, in the workers' memory before the clock starts:
                # new output keys, so no round finds the last one's results.
                x = client.persist(_volume(shape, (1, 1, chunk, chunk, chunk),
                                           name=f"bench-input-{workers}-{r}"))
                wait(x)
                y, i = poolfold.dask.max_pool(x, KERNEL, strides=STRIDES, return_indices=True)
                cpu = sum(sum(p.cpu_times()[:2]) for p in workers_now)
                start = time.perf_counter()
                out = client.persist([y, i])
                wait(out)
                best = min(best, time.perf_counter() - start)
                best_cpu = min(best_cpu, sum(sum(p.cpu_times()[:2]) for p in workers_now) - cpu)
                del out, y, i, x
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
        lines.append(f"MaxPool 2x2x2 with Indices, float32 {side}^3 ({side**3 * 4 / 2**20:.0f} MiB)"
                     f", chunks {m['chunk']}^3, input and outputs in memory:")
        lines.append("| | 1 core | 2 cores |")
        lines.append("|---|---|---|")
        lines.append(f"| in-memory poolfold.max_pool | {m['in_memory_1_threads_gb_per_s']:.2f} GB/s "
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
            f"{tuple(o['chunks'])}, no compressor, MaxPool 2x2x2 with Indices to zarr "
            f"({o['output_gib']:.0f} GiB), {o['workers']} workers of {o['memory_limit']}:",
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

    results = {}
    if args.dask_in_memory_size:
        results["in_memory"] = in_memory((1, 1) + (args.dask_in_memory_size,) * 3,
                                         args.dask_chunk, tick=tick)
    if args.dask_size:
        results["out_of_core"] = out_of_core(args.dask_size, args.dask_chunk, 2,
                                             args.dask_memory_limit, args.dask_dir, tick=tick)
    return results


summary = format_results
