"""Timing one workload: every implementation in its own blocks of consecutive calls.

Alternating single calls (one call of each implementation per round) is not fair to a peer
whose idle threads spin after a call, as onnxruntime's do by default: the spinning threads
then steal the cores of the next implementation, so a bench that alternates must turn the
spinning off, and that slows onnxruntime down.  Here each implementation runs as it would in
a loop of its own: after a pause (the previous implementation's threads go idle) and an
untimed call (its own threads wake up), a block of timed calls back to back.  The blocks of
the implementations take turns over a few passes, in a rotating order, so that a noisy
stretch of a shared machine does not fall on one implementation only.
"""

from __future__ import annotations

import gc
import importlib.util
import math
import statistics
import time
from dataclasses import dataclass
from typing import Callable

import numpy as np

from ..console import first_line
from ..kernels import background
from .peers import Unavailable, onnxruntime_runner, reference_runner, torch_runner
from .workloads import (BASELINE_SETTINGS, ONNXRUNTIME, ONNXRUNTIME_NO_SPIN,
                        OTHER_PEERS, POOLFOLD, REFERENCE, SCIPY, STREAM, TORCH, Runner, Workload)
from .yardstick import stream_runner

WARMUP_CALLS = 2  # the first call compiles (or loads from numba's cache), the second settles
PASSES = 3  # each implementation's rounds are split into this many blocks, taken in turns
PAUSE_S = 0.2  # before each block: the previous implementation's idle threads go to sleep
SETTLE_CALLS = 1  # untimed calls that start each block: this implementation's threads wake up
REFERENCE_BUDGET_S = 10.0  # the reference evaluator gets as many rounds as fit in this
# Each implementation's timed calls in one block last about this long at least, however
# fast a call (``--block-ms``): 15 calls of tens of microseconds lasted under a millisecond,
# and their median moved by tens of percent from one run of the bench to the next.  Every
# implementation gets the same floor, as it gets the same pauses.
BLOCK_FLOOR_S = 0.05
MOST_ROUNDS = 4000  # ... up to this many rounds in all (calls of about 40 us and less)
# An implementation's rounds come from its time per call once warm: the median of up to
# this many calls after the warm-up, for up to this long.
ESTIMATE_CALLS = 25
ESTIMATE_S = 0.02


@dataclass
class Result:
    key: str
    title: str
    ms: dict  # implementation -> median milliseconds; None where it did not run ('-')
    spread_ms: dict  # implementation -> [first quartile, third quartile] of its rounds
    rounds: dict  # implementation -> timed rounds
    samples_ms: dict  # implementation -> every timed round, in the order timed
    baseline: str  # the implementation poolfold's ratio is taken to: the fastest setting
    ratio: float | None  # poolfold / baseline
    stream_multiple: float  # poolfold / stream: how far from reading X and writing Y once
    bytes_moved: int  # inputs + outputs of poolfold's call: what the stream reads and writes
    notes: list


def passes(repeat: int) -> int:
    return min(PASSES, repeat)


def steps(repeat: int) -> int:
    """Progress steps of one workload: the warm-up, then one per pass."""
    return 1 + passes(repeat)


def rounds_for(seconds_per_call: float, repeat: int, block_s: float = BLOCK_FLOOR_S) -> int:
    """Timed rounds for an implementation whose call takes ``seconds_per_call``: at least
    ``repeat``, and enough that each of its blocks lasts ``block_s``, up to MOST_ROUNDS."""
    floor = math.ceil(passes(repeat) * block_s / max(seconds_per_call, 1e-9))
    return max(repeat, min(MOST_ROUNDS, floor))


def steady_seconds(run: Runner) -> float:
    """``run``'s time per call once warm: the median of up to ESTIMATE_CALLS calls made
    in ESTIMATE_S (one call, where it takes that long).  The last warm-up call alone was
    no estimate: onnxruntime's second run of a session took 1.6 ms where its runs settle at
    0.1 (a batch-1 AveragePool), so its blocks held 31 calls, 3 ms, against the 50 ms floor
    everyone else's lasted."""
    times: list[float] = []
    begun = time.perf_counter()
    while len(times) < ESTIMATE_CALLS and (not times or time.perf_counter() - begun < ESTIMATE_S):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _block_sizes(rounds: int, count: int) -> list[int]:
    """``rounds`` split into ``count`` blocks as even as possible, the larger ones first."""
    return [rounds // count + (i < rounds % count) for i in range(count)]


def _quartiles(samples: list[float]) -> list[float]:
    if len(samples) < 2:
        return [samples[0], samples[0]]
    q1, _, q3 = statistics.quantiles(samples, n=4, method="inclusive")
    return [q1, q3]


def nbytes(outputs) -> int:
    outputs = outputs if isinstance(outputs, (tuple, list)) else (outputs,)
    return sum(np.asarray(a).nbytes for a in outputs if a is not None)


def time_blocks(runners: dict, rounds: dict, repeat: int, tick=lambda p: None,
                pause_s: float = PAUSE_S) -> dict:
    """Seconds of each timed call, per runner: ``rounds[name]`` calls (default ``repeat``),
    in blocks as this module's docstring says; ``pause_s`` 0 skips the garbage collection and
    the pause before each block (``--tiny``: a check that everything runs, in seconds)."""
    names = list(runners)
    count = passes(repeat)
    sizes = {name: _block_sizes(rounds.get(name, repeat), count) for name in names}
    times = {name: [] for name in names}
    was_enabled = gc.isenabled()
    try:
        for p in range(count):
            shift = p % len(names)
            for name in names[shift:] + names[:shift]:
                if not sizes[name][p]:
                    continue
                run = runners[name]
                if pause_s:  # 0 (--tiny): no settling, whose times are no figures
                    gc.collect()  # nobody's garbage is collected on another's time
                    time.sleep(pause_s)
                for _ in range(0 if name == REFERENCE else SETTLE_CALLS):  # seconds per call
                    run()
                gc.disable()
                for _ in range(sizes[name][p]):
                    start = time.perf_counter()
                    out = run()
                    times[name].append(time.perf_counter() - start)
                    del out  # freed outside the clock, for every implementation alike
                if was_enabled:
                    gc.enable()
            tick(p + 1)
    finally:
        if was_enabled:
            gc.enable()
    return times


def run_workload(workload: Workload, repeat: int, threads: int, tick=lambda s: None,
                 pause_s: float = PAUSE_S, block_s: float = BLOCK_FLOOR_S) -> Result:
    """Time one workload: every implementation that can run it, plus the memory-speed
    yardstick (:mod:`.yardstick`); ``pause_s`` before each block (0 for ``--tiny``), each
    block of timed calls at least ``block_s`` long (:func:`rounds_for`)."""
    feeds = workload.inputs()
    node_feeds = workload.node_feeds(feeds)
    notes: list[str] = []
    runners: dict[str, Runner | None] = {}
    rounds: dict[str, int] = {}
    scale: dict[str, float] = {}

    runners[POOLFOLD] = lambda: workload.poolfold(feeds)
    read = nbytes(list(feeds.values()))
    written = nbytes(runners[POOLFOLD]())  # also the first warm-up
    moved = read + written
    # With an empty cache that call may have run a stand-in kernel while the fast one compiles
    # in a child process: time the kernel poolfold settles on, not the stand-in.
    background.wait()

    def add(name: str, build: Callable[[], Runner]) -> None:
        try:
            runners[name] = build()
        except Unavailable as why:
            runners[name] = None
            notes.append(f"{name}: {why}")
        except Exception as error:  # a comparator failing must not stop the benchmark
            runners[name] = None
            notes.append(f"{name}: failed: {first_line(error)}")

    if workload.node is None:
        runners[ONNXRUNTIME] = runners[ONNXRUNTIME_NO_SPIN] = None
        notes.append(f"{ONNXRUNTIME}: no kernel for this case; the ratio is to the fastest "
                     "other peer" if workload.baseline == ONNXRUNTIME else
                     f"{ONNXRUNTIME}: not run; the yardstick is {workload.baseline}")
    else:
        for name, spinning in ((ONNXRUNTIME, True), (ONNXRUNTIME_NO_SPIN, False)):
            add(name, lambda spinning=spinning: onnxruntime_runner(
                workload, node_feeds, threads, spinning))
    if workload.torch is not None and importlib.util.find_spec("torch") is not None:
        add(TORCH, lambda: torch_runner(workload, node_feeds, threads))
    if workload.scipy is not None and importlib.util.find_spec("scipy") is not None:
        add(SCIPY, lambda: workload.scipy(node_feeds))  # single-threaded: it has no threads
    if workload.reference and workload.node is not None:
        def reference() -> Runner:
            run, n, seconds = reference_runner(workload, node_feeds)
            scale[REFERENCE] = n
            rounds[REFERENCE] = max(1, min(repeat, int(REFERENCE_BUDGET_S / max(seconds, 1e-9))))
            return run
        add(REFERENCE, reference)
    for name, build in workload.extras.items():
        add(name, lambda build=build: build(node_feeds))

    runners[STREAM] = stream_runner(read, written)

    # Warm up (numba compiles or loads its cache on the first call); a runner that fails here
    # is shown as '-' like one that could not be built.  Its time per call once warm
    # (steady_seconds) sets the implementation's rounds (rounds_for), but for --tiny's.
    for name, run in list(runners.items()):
        if run is None:
            continue
        try:
            for _ in range(0 if name == REFERENCE else WARMUP_CALLS):  # its estimate warmed it
                run()
            if name != REFERENCE and pause_s and block_s:
                rounds[name] = rounds_for(steady_seconds(run), repeat, block_s)
        except Exception as error:
            runners[name] = None
            notes.append(f"{name}: failed: {first_line(error)}")
    tick(1)

    active = {k: v for k, v in runners.items() if v is not None}
    times = time_blocks(active, rounds, repeat, lambda p: tick(1 + p), pause_s)
    ms = {k: (statistics.median(times[k]) * 1e3 * scale.get(k, 1) if k in times else None)
          for k in runners}
    if REFERENCE in scale and REFERENCE in times:
        notes.append(f"{REFERENCE}: N=1 slice, time x{scale[REFERENCE]}"
                     + (f", {rounds[REFERENCE]} rounds" if rounds[REFERENCE] < repeat else ""))
    settings = [s for s in BASELINE_SETTINGS.get(workload.baseline, (workload.baseline,))
                if ms.get(s) is not None]
    if not settings and workload.baseline == ONNXRUNTIME:  # onnxruntime has no such kernel
        settings = [s for s in OTHER_PEERS if ms.get(s) is not None]
    baseline = min(settings, key=lambda s: ms[s]) if settings else workload.baseline
    base = ms.get(baseline)
    return Result(
        key=workload.key, title=workload.title, ms=ms,
        spread_ms={k: [round(q * 1e3 * scale.get(k, 1), 4) for q in _quartiles(v)]
                   for k, v in times.items()},
        rounds={k: len(v) for k, v in times.items()},
        samples_ms={k: [round(t * 1e3 * scale.get(k, 1), 4) for t in v] for k, v in times.items()},
        baseline=baseline,
        ratio=ms[POOLFOLD] / base if base else None,
        stream_multiple=ms[POOLFOLD] / ms[STREAM],
        bytes_moved=moved,
        notes=notes,
    )
