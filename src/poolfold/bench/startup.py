"""Start-up costs, each measured in child processes:

- the first-ever call of each (op, dtype, with or without Indices) with an empty numba cache
  (a temporary ``NUMBA_CACHE_DIR``): wall and CPU time, the compile included;
- a fresh process with a warm cache: importing poolfold and pooling a small tensor, beside
  numba's own floor (importing numba and setting up its target) measured in the same run;
- the Quickstart's first command, ``poolfold run`` on the bundled model, with an empty cache;
- processes started together with an empty cache (a dask cluster's workers, a process pool),
  each making the same first calls, beside one process alone.
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass

from ..console import progress
from .child import run_child, run_command, run_commands_together
from .report import table

STARTUP_ROUNDS = 5  # the cold start is the median of this many fresh processes
STARTUP_SNIPPET = (
    "import poolfold, numpy as np; poolfold.max_pool(np.zeros((1,1,8,8),np.float32),[2,2])"
)
# The least a fresh process pays before it can load any cached numba kernel: importing numba,
# setting up its target (all its typing and lowering registries) and tearing that down at exit.
NUMBA_FLOOR_SNIPPET = (
    "import numpy as np, numba; from numba.core.registry import cpu_target; "
    "cpu_target.target_context.refresh()"
)
QUICKSTART = ("poolfold", "run")  # the Quickstart's first command after installing
# Processes that start together with an empty cache, each making the same first calls
# (kernels/sharing.py: one of them compiles each kernel, the others load it), every kernel
# compiled in the processes themselves (no background compile).
TOGETHER_PROCESSES = 3
TOGETHER_SNIPPET = (
    "import poolfold, numpy as np; x = np.ones((2, 8, 20, 20), np.float32); "
    "poolfold.average_pool(x, [3, 3], pads=[1, 1, 1, 1]); "
    "poolfold.max_pool(x, [3, 3], strides=[2, 2])"
)

# What a newcomer should wait at most (wall time; CPU time is shown beside it, steadier on a
# shared machine): the first call of an op with an empty cache, the Quickstart's first command
# with an empty cache, and a warm-cache start beyond numba's own floor.
FIRST_CALL_TARGET_S = {"MaxPool": 3.0, "MaxPool 2x2": 3.0, "MaxUnpool": 2.0, "Col2Im": 2.0,
                       "nhwc MaxPool": 3.0}
QUICKSTART_TARGET_S = 15.0
COLD_START_MARGIN_S = 0.1


@dataclass(frozen=True)
class FirstCall:
    """One first-ever call: ``op`` on ``dtype``, on the benchmark's 2-D shapes.  "MaxPool"
    is the table's 3x3 stride-2 pool (the separable kernel), "MaxPool 2x2" a 2x2 stride-2
    pool of the same input, whose windows tile it (the fused kernel, a smaller compile)."""

    op: str
    dtype: str
    indices: bool = False  # MaxPool's second output

    @property
    def key(self) -> str:
        return "-".join([self.op.lower().replace(" ", "-"), self.dtype]
                        + (["indices"] if self.indices else []))


_POOL_DTYPES = ("float32", "float16", "float64", "int8", "uint8", "bfloat16")
ALL_CASES: tuple[FirstCall, ...] = (
    *(FirstCall("MaxPool", d, i) for d in _POOL_DTYPES for i in (False, True)),
    *(FirstCall("MaxPool 2x2", d, i) for d in _POOL_DTYPES for i in (False, True)),
    *(FirstCall("MaxUnpool", d) for d in ("float32", "float16", "bfloat16")),
    *(FirstCall("Col2Im", d) for d in ("float32", "float64", "float16")),
    FirstCall("nhwc MaxPool", "float32"),
)
CASES = {case.key: case for case in ALL_CASES}
# `--startup` alone: the Quickstart's ops on float32, a few minutes today (`--startup-all`: all).
DEFAULT_CASES = ("maxpool-float32", "maxpool-float32-indices", "maxpool-2x2-float32",
                 "maxpool-2x2-float32-indices", "maxunpool-float32", "col2im-float32")


def _first_call_inputs(case: FirstCall):
    """The call of ``case`` on seeded data, built with numpy only (so that nothing of
    poolfold's is compiled before the timed call)."""
    import numpy as np

    import poolfold

    from ..dtypes import BFLOAT16
    from .workloads import FOLD_2D, POOL_2D, UNPOOL_2D, normal

    dtype = BFLOAT16 if case.dtype == BFLOAT16.name else np.dtype(case.dtype)
    rng = np.random.default_rng(0)

    def data(shape):
        if dtype.kind in "iu":
            info = np.iinfo(dtype)
            return rng.integers(info.min, int(info.max) + 1, shape, dtype=dtype)
        return normal(shape, dtype)

    if case.op == "MaxPool":
        x = data((8, 64, 112, 112))
        return lambda: poolfold.max_pool(x, **POOL_2D, return_indices=case.indices)
    if case.op == "MaxPool 2x2":
        x = data((8, 64, 112, 112))
        return lambda: poolfold.max_pool(x, [2, 2], strides=[2, 2], return_indices=case.indices)
    if case.op == "nhwc MaxPool":
        x = data((8, 112, 112, 64))
        return lambda: poolfold.nhwc.max_pool(x, **POOL_2D)
    if case.op == "MaxUnpool":
        # Y of a 2x2 stride-2 pool of (8,64,112,112) and, for each value, the flat index of one
        # element of its window: the indices a MaxPool would give.
        n, c, h, w = 8, 64, 56, 56
        y = data((n, c, h, w))
        rows = 2 * np.arange(h)[:, None] + rng.integers(0, 2, (n, c, h, w))
        cols = 2 * np.arange(w)[None, :] + rng.integers(0, 2, (n, c, h, w))
        planes = np.arange(n * c).reshape(n, c, 1, 1)
        indices = ((planes * 2 * h + rows) * 2 * w + cols).astype(np.int64)
        shape = np.array([n, c, 2 * h, 2 * w], np.int64)
        return lambda: poolfold.max_unpool(y, indices, **UNPOOL_2D, output_shape=shape)
    if case.op == "Col2Im":
        x = data((8, 576, 3136))
        image, block = np.array([56, 56], np.int64), np.array([3, 3], np.int64)
        return lambda: poolfold.col2im(x, image, block, **FOLD_2D)
    raise ValueError(f"unknown op {case.op!r}")


def first_call(key: str, threads: str) -> dict:
    """In the child (empty numba cache): the first call of case ``key`` and the second, wall
    and CPU seconds; their difference is what compiling cost.  If a kernel compiled in the
    background meanwhile: how much longer that took after the second call (``background_s``)
    and the call after it (``switched_s``), which loads it from the cache."""
    from ..kernels import background
    from .peers import set_threads

    set_threads(int(threads))
    call = _first_call_inputs(CASES[key])
    seconds = {}
    for which in ("first", "second"):
        wall, cpu = time.perf_counter(), time.process_time()
        out = call()
        seconds[f"{which}_s"] = time.perf_counter() - wall
        seconds[f"{which}_cpu_s"] = time.process_time() - cpu
    # A kernel still compiling in the background (the separable MaxPool kernel, while the
    # direct scan stands in): how much longer it took, and the first call that loads it.
    if background.pending():
        wall = time.perf_counter()
        background.wait()
        seconds["background_s"] = time.perf_counter() - wall
        wall = time.perf_counter()
        del out
        out = call()
        seconds["switched_s"] = time.perf_counter() - wall
    return {**seconds, "compile_s": seconds["first_s"] - seconds["second_s"],
            "compile_cpu_s": seconds["first_cpu_s"] - seconds["second_cpu_s"]}


def measure_first_calls(keys, threads: int, tick=lambda i: None) -> list[dict]:
    rows = []
    for i, key in enumerate(keys):
        case = CASES[key]
        with tempfile.TemporaryDirectory(prefix="poolfold-bench-numba-") as cache:
            measured = run_child(f"{__name__}:first_call", key, threads,
                                 env={"NUMBA_CACHE_DIR": cache})
        rows.append({"key": key, "op": case.op, "dtype": case.dtype, "indices": case.indices,
                     "target_s": FIRST_CALL_TARGET_S[case.op], **measured})
        tick(i + 1)
    return rows


def _warm_bytecode() -> None:
    """Python's bytecode cache filled for poolfold's sources, as ``pip install`` leaves it:
    an editable install or a PYTHONPATH checkout under PYTHONDONTWRITEBYTECODE would
    otherwise compile them in every process timed here."""
    import poolfold

    run_command([sys.executable, "-m", "compileall", "-q", os.path.dirname(poolfold.__file__)],
                unset=("PYTHONDONTWRITEBYTECODE",))


def measure_cold_start() -> dict:
    """A fresh process with a warm cache: poolfold's snippet, ``import numpy`` and numba's
    floor, each the median of :data:`STARTUP_ROUNDS` processes (wall and CPU seconds)."""

    def median(code: str) -> tuple[float, float]:
        runs = [run_command([sys.executable, "-c", code]) for _ in range(STARTUP_ROUNDS)]
        failed = [r["error"] for r in runs if "error" in r]
        if failed:
            raise RuntimeError(failed[0])
        return (statistics.median(r["wall_s"] for r in runs),
                statistics.median(r["cpu_s"] for r in runs))

    result = {"command": f'python -c "{STARTUP_SNIPPET}"', "rounds": STARTUP_ROUNDS,
              "margin_target_s": COLD_START_MARGIN_S}
    try:
        # The warm-up fills numba's cache (normally a no-op: it is already full) and Python's
        # bytecode cache of every module the snippet imports, as a first run in a default
        # environment does.  The timed runs keep the caller's environment.
        warm = run_command([sys.executable, "-c", STARTUP_SNIPPET],
                           unset=("PYTHONDONTWRITEBYTECODE",))
        if "error" in warm:
            raise RuntimeError(warm["error"])
        result["wall_s"], result["cpu_s"] = median(STARTUP_SNIPPET)
        result["numpy_import_s"], _ = median("import numpy")
        result["numba_floor_s"], result["numba_floor_cpu_s"] = median(NUMBA_FLOOR_SNIPPET)
    except RuntimeError as error:
        result["error"] = str(error)
    return result


def measure_quickstart() -> dict:
    """``poolfold run`` (the bundled model) in a fresh process with an empty numba cache:
    the Quickstart's first command on a machine that has never run poolfold."""
    result = {"command": " ".join(QUICKSTART), "target_s": QUICKSTART_TARGET_S}
    with tempfile.TemporaryDirectory(prefix="poolfold-bench-numba-") as cache:
        done = run_command([sys.executable, "-m", "poolfold.cli", *QUICKSTART[1:]],
                           env={"NUMBA_CACHE_DIR": cache})
    done.pop("stdout", None)
    return {**result, **done}


def measure_together(processes: int = TOGETHER_PROCESSES) -> dict:
    """:data:`TOGETHER_SNIPPET` in one process, then in ``processes`` started at once, each
    time with an empty numba cache: wall seconds until the last ends, CPU seconds of all."""
    result = {"command": f'python -c "{TOGETHER_SNIPPET}"', "processes": processes}
    for key, count in (("alone", 1), ("together", processes)):
        with tempfile.TemporaryDirectory(prefix="poolfold-bench-numba-") as cache:
            done = run_commands_together([[sys.executable, "-c", TOGETHER_SNIPPET]] * count,
                                         env={"NUMBA_CACHE_DIR": cache,
                                              "POOLFOLD_BACKGROUND_COMPILE": "0"})
        if "error" in done:
            return {**result, "error": done["error"]}
        result[f"{key}_wall_s"], result[f"{key}_cpu_s"] = done["wall_s"], done["cpu_s"]
    return result


def chosen_cases(args) -> list[str]:
    """The first-call cases to measure: ``--startup-case`` ones, all with ``--startup-all``,
    else :data:`DEFAULT_CASES`."""
    if args.startup_case:
        return list(dict.fromkeys(args.startup_case))
    return list(CASES) if args.startup_all else list(DEFAULT_CASES)


def measure(args) -> dict:
    """``--startup``: the first calls, the warm-cache cold start, the Quickstart, processes
    started together."""
    keys = chosen_cases(args)
    total = len(keys) + 3

    def tick(done: int) -> None:
        label = f"first call {keys[done]}" if done < len(keys) else "cold start, quickstart"
        progress(done, total, label)

    _warm_bytecode()
    tick(0)
    first_calls = measure_first_calls(keys, args.threads, tick)
    cold_start = measure_cold_start()
    progress(len(keys) + 1, total, "quickstart (compiles)")
    quickstart = measure_quickstart()
    progress(len(keys) + 2, total, "processes started together (compile)")
    together = measure_together()
    progress(total, total)
    return {"first_calls": first_calls, "cold_start": cold_start, "quickstart": quickstart,
            "together": together}


def _verdict(seconds: float, limit: float) -> str:
    return "ok" if seconds <= limit else "OVER"


def summary(startup: dict) -> str:
    cells = []
    for row in startup["first_calls"]:
        if "error" in row:
            cells.append([row["key"], "-", "-", "-", f"failed: {row['error']}"])
            continue
        background = (f"{row['background_s']:.2f}", f"{row['switched_s']:.3f}") \
            if "background_s" in row else ("-", "-")
        cells.append([row["key"], f"{row['first_s']:.2f}", f"{row['first_cpu_s']:.2f}",
                      f"{row['second_s']:.3f}", *background,
                      f"<= {row['target_s']:g}: {_verdict(row['first_s'], row['target_s'])}"])
    lines = [
        "first call with an empty numba cache (a child process each, temporary NUMBA_CACHE_DIR;",
        "2-D shapes of the timing table; wall and CPU s of the first call, wall s of the second;",
        "where a stand-in kernel answered while the fast one compiled in the background: how",
        "much longer that compile took after the second call, and the call that loaded it)",
        table(["case", "first s", "first CPU s", "second s", "background s", "then s",
               "target"], cells),
        "",
    ]
    cold = startup["cold_start"]
    if "error" in cold:
        lines.append(f"cold start with a warm cache: failed: {cold['error']}")
    else:
        over = cold["wall_s"] - cold["numba_floor_s"]
        lines += [
            f"cold start with a warm cache: {cold['wall_s']:.2f} s wall, {cold['cpu_s']:.2f} s CPU "
            f"(median of {cold['rounds']}) for",
            f"  {cold['command']}",
            f"  numba's own floor (import numba, set up its target): {cold['numba_floor_s']:.2f} s "
            f"wall, {cold['numba_floor_cpu_s']:.2f} s CPU; poolfold {over:+.2f} s beyond it "
            f"(<= {cold['margin_target_s']:g}: {_verdict(over, cold['margin_target_s'])})",
            f"  python -c \"import numpy\" alone: {cold['numpy_import_s']:.2f} s",
        ]
    quick = startup["quickstart"]
    if "error" in quick:
        lines.append(f"quickstart `{quick['command']}` with an empty cache: failed: {quick['error']}")
    else:
        lines.append(f"quickstart `{quick['command']}` with an empty cache (a fresh process, "
                     f"compiles included): {quick['wall_s']:.2f} s wall, {quick['cpu_s']:.2f} s CPU "
                     f"(<= {quick['target_s']:g}: {_verdict(quick['wall_s'], quick['target_s'])})")
    together = startup.get("together")
    if together is not None:
        lines.append(together_line(together))
    return "\n".join(lines)


def together_line(together: dict) -> str:
    """The processes started together, beside one alone."""
    head = (f"{together['processes']} processes started together with an empty cache, each "
            f"running {together['command']}")
    if "error" in together:
        return f"{head}: failed: {together['error']}"
    return (f"{head}: {together['together_wall_s']:.1f} s wall, "
            f"{together['together_cpu_s']:.1f} s CPU in all; one process alone: "
            f"{together['alone_wall_s']:.1f} s wall, {together['alone_cpu_s']:.1f} s CPU")
