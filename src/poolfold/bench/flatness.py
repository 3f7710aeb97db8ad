"""``--flatness``: how a stride-1 pool's time grows with its window, on one input.

For MaxPool and AveragePool over a 1-D, a 2-D and a 3-D float32 input, windows of 3, 7, 15,
31 and 63 taps along every axis, stride 1, SAME padding: poolfold's time for each, timed as
the other benchmarks time an implementation (blocks of calls after a pause, the windows'
blocks in turn, the median), and each over the 3-wide window's time.  A kernel whose cost
does not grow with the window (van Herk / Gil-Werman runs, running sums) keeps that growth
small; the target is at most 2.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass

import numpy as np

from ..console import progress
from .report import load_text, machine_text, table, versions_text

WINDOWS = (3, 7, 15, 31, 63)
# (label, input shape) per rank: 4 Mi float32 elements each
INPUTS = (("1-D", (4, 16, 65536)), ("2-D", (4, 16, 256, 256)), ("3-D", (2, 8, 64, 64, 64)))
OPS = ("MaxPool", "AveragePool")
GROWTH_TARGET = 2.0


@dataclass
class Row:
    op: str
    rank: str
    shape: tuple
    ms: dict  # window -> median milliseconds

    def growth(self) -> float:
        """The slowest window's time over the 3-wide window's."""
        return max(self.ms.values()) / self.ms[WINDOWS[0]]


def _call(op: str, x: np.ndarray, window: int):
    import poolfold

    kernel_shape = [window] * (x.ndim - 2)
    if op == "MaxPool":
        return lambda: poolfold.max_pool(x, kernel_shape, auto_pad="SAME_UPPER")
    return lambda: poolfold.average_pool(x, kernel_shape, auto_pad="SAME_UPPER")


def measure(args) -> list[dict]:
    """Each op and input, its windows timed in blocks
    (:func:`poolfold.bench.runner.time_blocks`) with at least ``--repeat`` rounds and
    blocks of ``--block-ms``, the windows' blocks taken in turn, as the timing table's
    implementations are: a ratio of two windows' times then compares blocks taken minutes
    apart no more (on a shared host one window's blocks, all taken in a row, ran up to
    1.8x another run's)."""
    from .runner import PAUSE_S, WARMUP_CALLS, rounds_for, steady_seconds, time_blocks

    rng = np.random.default_rng(0)
    rows = []
    total = len(OPS) * len(INPUTS)
    done = 0
    for label, shape in INPUTS:
        x = rng.standard_normal(shape).astype(np.float32)
        for op in OPS:
            progress(done, total, f"flatness {op} {label}")
            runners, rounds = {}, {}
            for window in WINDOWS:
                run = runners[window] = _call(op, x, window)
                for _ in range(WARMUP_CALLS):
                    run()
                rounds[window] = rounds_for(steady_seconds(run), args.repeat,
                                            args.block_ms / 1e3)
            times = time_blocks(runners, rounds, args.repeat, pause_s=PAUSE_S)
            ms = {window: statistics.median(times[window]) * 1e3 for window in WINDOWS}
            rows.append(asdict(Row(op, label, shape, ms)))
            done += 1
    progress(total, total)
    return rows


def _cells(rows: list[Row]) -> list[list[str]]:
    return [[r.op, f"{r.rank} {tuple(r.shape)}"] + [f"{r.ms[w]:.3g}" for w in WINDOWS]
            + [f"{r.growth():.2f}", "ok" if r.growth() <= GROWTH_TARGET else "OVER"]
            for r in rows]


def _header() -> list[str]:
    return (["op", "input (float32)"] + [f"{w} ms" for w in WINDOWS]
            + ["slowest / 3-wide", f"<= {GROWTH_TARGET:g}"])


def _rows(result: list[dict]) -> list[Row]:
    rows = []
    for row in result:
        row = dict(row)
        row["ms"] = {int(w): t for w, t in row["ms"].items()}
        rows.append(Row(**row))
    return rows


def summary(result: list[dict]) -> str:
    return "\n".join([
        "flatness: a stride-1 pool's time as its window grows (SAME pads; every axis the "
        "window's length; target: the slowest at most 2x the 3-wide window's)",
        table(_header(), _cells(_rows(result)))])


def markdown(result: list[dict], meta: dict, command: str) -> str:
    header = _header()
    lines = ["| " + " | ".join(header) + " |",
             "|" + "|".join(["---", "---"] + ["---:"] * (len(header) - 2)) + "|"]
    lines += ["| " + " | ".join(cells) + " |" for cells in _cells(_rows(result))]
    lines += ["", f"`{command}` on {meta['date']}: {machine_text(meta)}, {meta['threads']} "
                  f"threads; {versions_text(meta)}. Each window timed in its own blocks "
                  f"after a pause, the windows' blocks in turn, as the timing table's "
                  f"implementations are; the median, in milliseconds. {load_text(meta)}"]
    return "\n".join(lines)


def glance(result: list[dict], meta: dict, command: str) -> list:
    return []
