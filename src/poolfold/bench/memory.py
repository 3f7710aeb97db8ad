"""Peak memory of one poolfold call beyond its outputs, measured in a child process."""

from __future__ import annotations

import gc

from ..console import progress
from .child import run_child
from .report import table

MEMORY_TARGET = 0.10  # peak memory beyond the outputs, as a fraction of the outputs


def peak(key: str, threads: str) -> dict:
    """In the child: one warm-up call of workload ``key``, then the traced peak of the next."""
    import tracemalloc

    from .peers import set_threads
    from .runner import nbytes
    from .workloads import BY_KEY

    set_threads(int(threads))
    workload = BY_KEY[key]
    feeds = workload.inputs()
    out = workload.poolfold(feeds)  # warm-up: compile or load the kernels, fill small caches
    del out
    gc.collect()
    # numpy reports its data buffers to tracemalloc; started now, it sees only this call.
    tracemalloc.start()
    try:
        out = workload.poolfold(feeds)
        peak_bytes = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    outputs = nbytes(out)
    return {"output_bytes": outputs, "peak_bytes": peak_bytes, "extra_bytes": peak_bytes - outputs}


def measure(args) -> list[dict]:
    """``--memory``: the peak of each workload ``args.workloads``, a child process each."""
    rows = []
    for i, key in enumerate(args.workloads):
        progress(i, len(args.workloads), f"memory {key}")
        rows.append({"key": key, **run_child(f"{__name__}:peak", key, args.threads)})
    progress(len(rows), len(rows))
    return rows


def summary(rows: list[dict]) -> str:
    cells = []
    for row in rows:
        if "error" in row:
            cells.append([row["key"], "-", "-", "-", f"failed: {row['error']}"])
            continue
        share = row["extra_bytes"] / max(row["output_bytes"], 1)
        cells.append([row["key"], f"{row['output_bytes'] / 2**20:.2f}",
                      f"{row['extra_bytes'] / 2**20:.2f}", f"{100 * share:.1f} %",
                      "ok" if share < MEMORY_TARGET else "OVER"])
    return "\n".join([
        "memory: peak allocated during one poolfold call beyond its outputs (tracemalloc,",
        "in a child process, after a warm-up call; target: under 10 % of the outputs)",
        table(["workload", "outputs MiB", "extra MiB", "extra", f"< {MEMORY_TARGET:.0%}"], cells),
        "(tracemalloc sees numpy's buffers, not the few small arrays numba allocates inside kernels)",
    ])
