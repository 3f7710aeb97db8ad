"""Benchmarks: poolfold against onnxruntime (and PyTorch and onnx's reference evaluator when
they are installed), on the same data, in one process.

Every implementation of a workload is warmed up, then the implementations are alternated
round by round (each round starting one implementation later) so that the noise of a shared
machine hits them alike; medians are reported.  Each row also gives poolfold's time over
onnxruntime's and over the memory-copy limit: ``np.copyto`` of as many bytes as the op reads
and writes (inputs + outputs), timed in the same rounds.  ``--memory`` and ``--startup`` add
measurements made in child processes: peak memory beyond the outputs, first-call compile time
and the cold start of a fresh interpreter.

    poolfold bench [WORKLOAD ...] [--repeat N] [--threads T] [--json] [--plot FILE.png]
                   [--memory] [--startup]
"""

from __future__ import annotations

import gc
import importlib.util
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from typing import Callable

import ml_dtypes
import numpy as np

import poolfold

Runner = Callable[[], object]  # one timed call; returns the outputs (freed after the clock stops)

POOLFOLD = "poolfold"
ONNXRUNTIME = "onnxruntime"
TORCH = "torch"
REFERENCE = "onnx-ref"
MEMCOPY = "memcopy"
NCHW = "poolfold NCHW"  # extra column of the channels-last workload
FLOAT32 = "poolfold float32"  # baseline of the bfloat16 workload (onnxruntime is not run there)

# Table order of the implementations, and their (short) column headers.
COLUMNS = {
    POOLFOLD: "poolfold",
    ONNXRUNTIME: "onnxruntime",
    TORCH: "torch",
    REFERENCE: "onnx-ref xN",
    NCHW: "pf NCHW",
    FLOAT32: "pf f32",
    MEMCOPY: "memcopy",
}

WARMUP_CALLS = 2  # the first call compiles (or loads from numba's cache), the second settles
REFERENCE_LIMIT_S = 20.0  # skip the reference for a workload when one N=1 run takes longer
REFERENCE_BUDGET_S = 20.0  # ...and give it only as many rounds as fit in this much time
MEMORY_TARGET = 0.10  # peak memory beyond the outputs, as a fraction of the outputs
STARTUP_SNIPPET = (
    "import poolfold, numpy as np; poolfold.max_pool(np.zeros((1,1,8,8),np.float32),[2,2])"
)
# The least a fresh process pays before it can load any cached numba kernel: importing numba,
# setting up its target (all its typing and lowering registries) and tearing that down at exit.
NUMBA_FLOOR_SNIPPET = (
    "import numpy as np, numba; from numba.core.registry import cpu_target; "
    "cpu_target.target_context.refresh()"
)
STARTUP_ROUNDS = 5  # the cold start is the median of this many fresh processes


# ------------------------------------------------------------------------------- workloads

@dataclass(frozen=True)
class OnnxNode:
    """The ai.onnx node that onnxruntime and the reference evaluator run for a workload."""

    op: str
    attributes: dict
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    opset: int


@dataclass(frozen=True)
class Workload:
    """One row of the benchmark; the table :data:`WORKLOADS` of these drives everything.

    ``inputs`` builds poolfold's inputs (by ONNX input name); ``node_feeds`` gives the same
    data in the ai.onnx op's layout (untimed; only the channels-last workload transposes),
    which every other implementation reads.  ``torch`` and each of ``extras`` take those feeds
    and return a :data:`Runner`, so that their own preparation (converting indices, ...) stays
    out of the clock.
    """

    key: str
    title: str
    inputs: Callable[[], dict]
    poolfold: Callable[[dict], object]
    node: OnnxNode | None = None  # None: onnxruntime is not run (shown as '-')
    node_feeds: Callable[[dict], dict] = lambda feeds: feeds
    torch: Callable[[dict], Runner] | None = None
    reference: bool = True  # run onnx's ReferenceEvaluator (on the N=1 slice)
    batched: tuple[str, ...] = ("X",)  # node inputs with the batch axis first, for that slice
    extras: dict = field(default_factory=dict)  # column name -> (node feeds -> Runner)
    baseline: str = ONNXRUNTIME  # what poolfold's ratio is taken against


def _normal(shape, dtype=np.float32) -> np.ndarray:
    """Seeded standard-normal data, so that every run (and every child process) sees the
    same values."""
    return np.random.default_rng(0).standard_normal(shape, np.float32).astype(dtype, copy=False)


def _to_nchw(feeds: dict) -> dict:
    return {"X": np.ascontiguousarray(feeds["X"].transpose(0, 3, 1, 2))}


def _tensor(array: np.ndarray):
    import torch

    return torch.from_numpy(np.ascontiguousarray(array))


def _torch_max_pool(rank: int, kernel: int, stride: int, padding: int, indices: bool):
    def build(feeds: dict) -> Runner:
        import torch.nn.functional as F

        x = _tensor(feeds["X"])
        pool = F.max_pool2d if rank == 2 else F.max_pool3d
        return lambda: pool(x, kernel, stride, padding, return_indices=indices)

    return build


def _torch_max_unpool_2d(feeds: dict) -> Runner:
    import torch.nn.functional as F

    out_hw = tuple(int(d) for d in feeds["output_shape"][2:])
    # ONNX indices count from the start of the tensor, PyTorch's from the start of each plane;
    # every index of plane (n, c) lies inside that plane, so the remainder converts them.
    indices = _tensor(feeds["I"] % (out_hw[0] * out_hw[1]))
    x = _tensor(feeds["X"])
    return lambda: F.max_unpool2d(x, indices, 2, 2, output_size=out_hw)


def _torch_fold(feeds: dict) -> Runner:
    import torch.nn.functional as F

    x = _tensor(feeds["X"])
    size = tuple(int(d) for d in feeds["image_shape"])
    return lambda: F.fold(x, size, kernel_size=3, padding=1)


def _unpool_inputs() -> dict:
    # Y and Indices of a 2x2 stride-2 MaxPool of a (8,64,112,112) tensor: MaxUnpool's usual
    # source, and the only one that gives realistic (non-colliding) indices.
    x = _normal((8, 64, 112, 112))
    y, indices = poolfold.max_pool(x, [2, 2], strides=[2, 2], return_indices=True)
    return {"X": y, "I": indices, "output_shape": np.array(x.shape, np.int64)}


POOL_2D = dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
POOL_3D = dict(kernel_shape=[2, 2, 2], strides=[2, 2, 2])
UNPOOL_2D = dict(kernel_shape=[2, 2], strides=[2, 2])
FOLD_2D = dict(pads=[1, 1, 1, 1])
# MaxPool-12 is the newest version onnxruntime's CPU provider registers for these types; its
# semantics for them are those of version 22, which poolfold runs by default.
NODE_POOL_2D = OnnxNode("MaxPool", POOL_2D, ("X",), ("Y",), 12)


def _pool_2d_of(dtype, make) -> Workload:
    """The 2-D pool on another element type, against onnxruntime only (where it has a kernel)."""
    name = np.dtype(dtype).name
    return Workload(
        f"maxpool2d-{name}", f"MaxPool 2-D (8,64,112,112) 3x3 s2 p1 {name}",
        inputs=lambda: {"X": make()},
        poolfold=lambda d: poolfold.max_pool(d["X"], **POOL_2D),
        node=NODE_POOL_2D, reference=False,
    )


WORKLOADS: tuple[Workload, ...] = (
    Workload(
        "maxpool2d", "MaxPool 2-D (8,64,112,112) 3x3 s2 p1",
        inputs=lambda: {"X": _normal((8, 64, 112, 112))},
        poolfold=lambda d: poolfold.max_pool(d["X"], **POOL_2D),
        node=NODE_POOL_2D,
        torch=_torch_max_pool(2, 3, 2, 1, indices=False),
    ),
    Workload(
        "maxpool2d-indices", "MaxPool 2-D (8,64,112,112) 3x3 s2 p1 +Indices",
        inputs=lambda: {"X": _normal((8, 64, 112, 112))},
        poolfold=lambda d: poolfold.max_pool(d["X"], **POOL_2D, return_indices=True),
        node=OnnxNode("MaxPool", POOL_2D, ("X",), ("Y", "Indices"), 12),
        torch=_torch_max_pool(2, 3, 2, 1, indices=True),
    ),
    Workload(
        "maxpool3d", "MaxPool 3-D (2,32,64,64,64) 2x2x2 s2",
        inputs=lambda: {"X": _normal((2, 32, 64, 64, 64))},
        poolfold=lambda d: poolfold.max_pool(d["X"], **POOL_3D),
        node=OnnxNode("MaxPool", POOL_3D, ("X",), ("Y",), 12),
        torch=_torch_max_pool(3, 2, 2, 0, indices=False),
    ),
    Workload(
        "maxpool3d-indices", "MaxPool 3-D (2,32,64,64,64) 2x2x2 s2 +Indices",
        inputs=lambda: {"X": _normal((2, 32, 64, 64, 64))},
        poolfold=lambda d: poolfold.max_pool(d["X"], **POOL_3D, return_indices=True),
        node=OnnxNode("MaxPool", POOL_3D, ("X",), ("Y", "Indices"), 12),
        torch=_torch_max_pool(3, 2, 2, 0, indices=True),
    ),
    Workload(
        "maxunpool2d", "MaxUnpool 2-D (8,64,56,56) -> (8,64,112,112) 2x2 s2",
        inputs=_unpool_inputs,
        poolfold=lambda d: poolfold.max_unpool(
            d["X"], d["I"], **UNPOOL_2D, output_shape=d["output_shape"]),
        node=OnnxNode("MaxUnpool", UNPOOL_2D, ("X", "I", "output_shape"), ("Y",), 11),
        torch=_torch_max_unpool_2d,
        batched=("X", "I"),
    ),
    Workload(
        "col2im", "Col2Im (8,576,3136) -> (8,64,56,56) 3x3 p1",
        inputs=lambda: {
            "X": _normal((8, 576, 3136)),
            "image_shape": np.array([56, 56], np.int64),
            "block_shape": np.array([3, 3], np.int64),
        },
        poolfold=lambda d: poolfold.col2im(d["X"], d["image_shape"], d["block_shape"], **FOLD_2D),
        node=OnnxNode("Col2Im", FOLD_2D, ("X", "image_shape", "block_shape"), ("Y",), 18),
        torch=_torch_fold,
    ),
    Workload(
        # onnxruntime runs the NCHW op on a transposed copy: what its own layout transformer
        # would otherwise feed to com.ms.internal.nhwc; poolfold's NCHW run is the extra column.
        "nhwc-maxpool2d", "nhwc MaxPool (8,112,112,64) 3x3 s2 p1",
        inputs=lambda: {"X": _normal((8, 112, 112, 64))},
        poolfold=lambda d: poolfold.nhwc.max_pool(d["X"], **POOL_2D),
        node=NODE_POOL_2D,
        node_feeds=_to_nchw,
        reference=False,
        extras={NCHW: lambda d: lambda: poolfold.max_pool(d["X"], **POOL_2D)},
    ),
    _pool_2d_of(np.float16, lambda: _normal((8, 64, 112, 112), np.float16)),
    _pool_2d_of(np.int8, lambda: np.random.default_rng(0).integers(
        -128, 128, (8, 64, 112, 112), dtype=np.int8)),
    Workload(
        # onnxruntime's CPU provider has no bfloat16 MaxPool; the yardstick is poolfold's own
        # float32 run on the same (exactly representable) values.
        "maxpool2d-bfloat16", "MaxPool 2-D (8,64,112,112) 3x3 s2 p1 bfloat16",
        inputs=lambda: {"X": _normal((8, 64, 112, 112), ml_dtypes.bfloat16)},
        poolfold=lambda d: poolfold.max_pool(d["X"], **POOL_2D),
        reference=False,
        extras={FLOAT32: lambda d: (lambda x: lambda: poolfold.max_pool(x, **POOL_2D))(
            d["X"].astype(np.float32))},
        baseline=FLOAT32,
    ),
)
BY_KEY = {w.key: w for w in WORKLOADS}


# ------------------------------------------------------------------------- implementations

class Unavailable(Exception):
    """An implementation that cannot run a workload: a '-' in the table, the reason in a note."""


def set_threads(threads: int) -> int:
    """Give poolfold the thread count every other implementation gets; numba's effective count.

    poolfold's kernels read POOLFOLD_NUM_THREADS on every launch, and the child processes of
    --memory and --startup inherit it.  numba cannot go past the pool it started with."""
    import numba

    os.environ["POOLFOLD_NUM_THREADS"] = str(threads)
    effective = min(threads, numba.config.NUMBA_NUM_THREADS)
    numba.set_num_threads(effective)
    return effective


def _first_line(error: BaseException, limit: int = 110) -> str:
    text = (str(error).strip().splitlines() or [type(error).__name__])[0]
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _onnx_model(node: OnnxNode, feeds: dict):
    from onnx import helper

    graph = helper.make_graph(
        [helper.make_node(node.op, list(node.inputs), list(node.outputs), **node.attributes)],
        "bench",
        [helper.make_tensor_value_info(
            n, helper.np_dtype_to_tensor_dtype(feeds[n].dtype), feeds[n].shape)
         for n in node.inputs],
        [helper.make_empty_tensor_value_info(o) for o in node.outputs],
    )
    # onnxruntime lags the onnx package's newest IR version; 8 is understood by every build.
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", node.opset)],
                             ir_version=8)


def _onnxruntime(workload: Workload, feeds: dict, threads: int) -> Runner:
    if workload.node is None:
        raise Unavailable(f"not run; the yardstick is {workload.baseline}")
    try:
        import onnxruntime
    except ImportError:
        raise Unavailable("not installed") from None
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    # Idle onnxruntime threads otherwise spin for a while after each run and steal the cores
    # from whatever runs next, poolfold included.
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    try:
        session = onnxruntime.InferenceSession(
            _onnx_model(workload.node, feeds).SerializeToString(), options,
            providers=["CPUExecutionProvider"])
    except Exception as error:  # onnxruntime's errors are not one family
        raise Unavailable(_first_line(error)) from None
    run_feeds = {n: feeds[n] for n in workload.node.inputs}
    return lambda: session.run(None, run_feeds)


def _torch(workload: Workload, feeds: dict, threads: int) -> Runner:
    import torch

    torch.set_num_threads(threads)
    return workload.torch(feeds)


def _first_batch(workload: Workload, feeds: dict) -> tuple[dict, int]:
    """The N=1 slice of the node feeds, and N.  MaxUnpool's indices of image 0 stay valid:
    they count from the start of the tensor, and image 0 starts it."""
    n = feeds[workload.batched[0]].shape[0]
    sliced = {k: v[:1] if k in workload.batched else v for k, v in feeds.items()}
    if "output_shape" in sliced:
        sliced["output_shape"] = np.concatenate([[1], feeds["output_shape"][1:]]).astype(np.int64)
    return sliced, n


def _reference(workload: Workload, feeds: dict) -> tuple[Runner, int, float]:
    """onnx's ReferenceEvaluator on the N=1 slice (it is pure numpy and Python, far too slow
    for the whole batch): the runner, N (its times are scaled by it), and one run's seconds."""
    try:
        from onnx.reference import ReferenceEvaluator
    except ImportError:
        raise Unavailable("not installed") from None
    sliced, n = _first_batch(workload, feeds)
    evaluator = ReferenceEvaluator(_onnx_model(workload.node, sliced))
    names = workload.node.inputs
    run = lambda: evaluator.run(None, {k: sliced[k] for k in names})  # noqa: E731
    start = time.perf_counter()  # the single timed run that decides whether to go on
    run()
    seconds = time.perf_counter() - start
    if seconds > REFERENCE_LIMIT_S:
        raise Unavailable(f"skipped: one N=1 run took {seconds:.0f} s (> {REFERENCE_LIMIT_S:.0f} s)")
    return run, n, seconds


def _nbytes(outputs) -> int:
    outputs = outputs if isinstance(outputs, (tuple, list)) else (outputs,)
    return sum(np.asarray(a).nbytes for a in outputs if a is not None)


# ---------------------------------------------------------------------------------- timing

@dataclass
class Result:
    key: str
    title: str
    ms: dict  # implementation -> median milliseconds; None where it did not run ('-')
    rounds: dict  # implementation -> timed rounds
    samples_ms: dict  # implementation -> every timed round, in order
    baseline: str
    ratio: float | None  # poolfold / baseline
    copy_multiple: float  # poolfold / memcopy
    bytes_moved: int  # inputs + outputs of poolfold's call: what memcopy copies
    notes: list


def _time_rounds(runners: dict, limits: dict, repeat: int, tick) -> dict:
    """Alternate the runners round by round, each round starting one runner later, so that a
    noisy stretch (or one runner's cache damage) does not always land on the same one."""
    keys = list(runners)
    times = {key: [] for key in keys}
    was_enabled = gc.isenabled()
    gc.collect()
    gc.disable()  # the reference evaluator's garbage would otherwise be collected on others' time
    try:
        for r in range(repeat):
            shift = r % len(keys)
            for key in keys[shift:] + keys[:shift]:
                if len(times[key]) >= limits.get(key, repeat):
                    continue
                start = time.perf_counter()
                out = runners[key]()
                times[key].append(time.perf_counter() - start)
                del out  # freed outside the clock, for every implementation alike
            tick(r + 1)
    finally:
        if was_enabled:
            gc.enable()
    return times


def run_workload(workload: Workload, repeat: int, threads: int, tick=lambda r: None) -> Result:
    """Time one workload: every implementation that can run it, plus the memory-copy limit."""
    feeds = workload.inputs()
    node_feeds = workload.node_feeds(feeds)
    notes: list[str] = []
    runners: dict[str, Runner | None] = {}
    limits: dict[str, int] = {}
    scale: dict[str, float] = {}

    runners[POOLFOLD] = lambda: workload.poolfold(feeds)
    moved = _nbytes(list(feeds.values())) + _nbytes(runners[POOLFOLD]())  # also the first warm-up

    def add(name: str, build: Callable[[], Runner]) -> None:
        try:
            runners[name] = build()
        except Unavailable as why:
            runners[name] = None
            notes.append(f"{name}: {why}")
        except Exception as error:  # a comparator failing must not stop the benchmark
            runners[name] = None
            notes.append(f"{name}: failed: {_first_line(error)}")

    add(ONNXRUNTIME, lambda: _onnxruntime(workload, node_feeds, threads))
    if workload.torch is not None and importlib.util.find_spec("torch") is not None:
        add(TORCH, lambda: _torch(workload, node_feeds, threads))
    if workload.reference and workload.node is not None:
        def reference() -> Runner:
            run, n, seconds = _reference(workload, node_feeds)
            scale[REFERENCE] = n
            limits[REFERENCE] = max(1, min(repeat, int(REFERENCE_BUDGET_S / max(seconds, 1e-9))))
            return run
        add(REFERENCE, reference)
    for name, build in workload.extras.items():
        add(name, lambda build=build: build(node_feeds))

    source = np.ones(moved, np.uint8)
    target = np.empty_like(source)
    runners[MEMCOPY] = lambda: np.copyto(target, source)  # reads and writes `moved` bytes

    # Warm up (numba compiles or loads its cache on the first call); a runner that fails here
    # is shown as '-' like one that could not be built.
    for name, run in list(runners.items()):
        if run is None:
            continue
        try:
            for _ in range(0 if name == REFERENCE else WARMUP_CALLS):  # its estimate warmed it
                run()
        except Exception as error:
            runners[name] = None
            notes.append(f"{name}: failed: {_first_line(error)}")
    tick(0)

    active = {k: v for k, v in runners.items() if v is not None}
    times = _time_rounds(active, limits, repeat, tick)
    ms = {k: (statistics.median(times[k]) * 1e3 * scale.get(k, 1) if k in times else None)
          for k in runners}
    if REFERENCE in scale and REFERENCE in times:
        notes.append(f"{REFERENCE}: N=1 slice, time x{scale[REFERENCE]}"
                     + (f", {limits[REFERENCE]} rounds" if limits[REFERENCE] < repeat else ""))
    base = ms.get(workload.baseline)
    return Result(
        key=workload.key, title=workload.title, ms=ms,
        rounds={k: len(v) for k, v in times.items()},
        samples_ms={k: [round(t * 1e3 * scale.get(k, 1), 4) for t in v] for k, v in times.items()},
        baseline=workload.baseline,
        ratio=ms[POOLFOLD] / base if base else None,
        copy_multiple=ms[POOLFOLD] / ms[MEMCOPY],
        bytes_moved=moved,
        notes=notes,
    )


# --------------------------------------------------------------------- child measurements

def child(argv: list[str]) -> int:
    """Entry point of the child processes: ``MODE KEY THREADS``; prints one JSON line.

    A child starts with nothing imported or compiled and nothing allocated but its inputs,
    which is what the memory peak and the first-call compile time need."""
    mode, key, threads = argv
    set_threads(int(threads))
    workload = BY_KEY[key]
    feeds = workload.inputs()
    call = lambda: workload.poolfold(feeds)  # noqa: E731
    if mode == "memory":
        import tracemalloc

        out = call()  # warm-up: compile or load the kernels, fill poolfold's small caches
        del out
        gc.collect()
        # numpy reports its data buffers to tracemalloc; started now, it sees only this call.
        tracemalloc.start()
        try:
            out = call()
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        outputs = _nbytes(out)
        result = {"output_bytes": outputs, "peak_bytes": peak, "extra_bytes": peak - outputs}
    elif mode == "compile":
        # NUMBA_CACHE_DIR points at an empty directory: the first call compiles everything it
        # needs; the second is a plain call, so the difference is the compile time.
        start = time.perf_counter()
        out = call()
        first = time.perf_counter() - start
        del out
        start = time.perf_counter()
        out = call()
        second = time.perf_counter() - start
        result = {"first_s": first, "second_s": second, "compile_s": first - second}
    else:
        raise SystemExit(f"unknown child mode {mode!r}")
    print(json.dumps(result))
    return 0


def _run_child(mode: str, key: str, threads: int, env: dict | None = None) -> dict:
    command = [sys.executable, "-c",
               "import sys, poolfold.bench as b; raise SystemExit(b.child(sys.argv[1:]))",
               mode, key, str(threads)]
    done = subprocess.run(command, capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, timeout=900)
    if done.returncode != 0:
        lines = done.stderr.strip().splitlines() or [f"exit status {done.returncode}"]
        return {"error": lines[-1][:110]}
    return json.loads(done.stdout.strip().splitlines()[-1])


def measure_memory(keys, threads: int, tick=lambda i: None) -> list[dict]:
    rows = []
    for i, key in enumerate(keys):
        rows.append({"key": key, **_run_child("memory", key, threads)})
        tick(i + 1)
    return rows


def measure_startup(keys, threads: int, tick=lambda i: None) -> dict:
    """First-call compile time per workload (fresh numba cache), then the warm-cache cold start."""
    compile_rows = []
    for i, key in enumerate(keys):
        with tempfile.TemporaryDirectory(prefix="poolfold-bench-numba-") as cache:
            compile_rows.append({"key": key,
                                 **_run_child("compile", key, threads, {"NUMBA_CACHE_DIR": cache})})
        tick(i + 1)

    def wall(code: str, env: dict | None = None) -> float:
        start = time.perf_counter()
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              env=env)
        seconds = time.perf_counter() - start
        if done.returncode != 0:
            raise RuntimeError((done.stderr.strip().splitlines() or ["failed"])[-1][:110])
        return seconds

    def median_wall(code: str) -> float:
        return statistics.median(wall(code) for _ in range(STARTUP_ROUNDS))

    result = {"compile": compile_rows, "cold_start_command": f'python -c "{STARTUP_SNIPPET}"'}
    try:
        # The warm-up fills numba's cache (normally a no-op: it is already full) and Python's
        # bytecode cache, as a first run in a default environment does: without
        # PYTHONDONTWRITEBYTECODE, which would otherwise leave an editable install compiling
        # poolfold's sources in every process.  The timed runs keep the caller's environment.
        wall(STARTUP_SNIPPET, {k: v for k, v in os.environ.items()
                               if k != "PYTHONDONTWRITEBYTECODE"})
        result["cold_start_s"] = median_wall(STARTUP_SNIPPET)
        result["numpy_import_s"] = median_wall("import numpy")
        result["numba_floor_s"] = median_wall(NUMBA_FLOOR_SNIPPET)
    except RuntimeError as error:
        result["cold_start_error"] = str(error)
    tick(len(keys) + 1)
    return result


# --------------------------------------------------------------------------------- output

def _table(header: list[str], rows: list[list[str]]) -> str:
    """Left-aligned first column, right-aligned numbers."""
    widths = [max(len(r[i]) for r in [header] + rows) for i in range(len(header))]
    fmt = lambda r: "  ".join(  # noqa: E731
        c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths)))
    return "\n".join(fmt(r).rstrip() for r in [header, ["-" * w for w in widths]] + rows)


def format_results(results: list[Result], meta: dict) -> str:
    columns = [c for c in COLUMNS if any(r.ms.get(c) is not None for r in results)]
    rows = []
    for r in results:
        cells = [r.key] + [f"{r.ms[c]:.2f}" if r.ms.get(c) is not None else "-" for c in columns]
        ratio = "-" if r.ratio is None else f"{r.ratio:.2f}" + ("*" if r.baseline != ONNXRUNTIME else "")
        rows.append(cells + [ratio, f"{r.copy_multiple:.2f}"])
    lines = [
        f"poolfold bench: median ms of {meta['repeat']} alternated rounds, {meta['threads']} "
        f"threads ({meta['cpu_count']} CPUs), {meta['platform']}",
        "",
        _table(["workload"] + [COLUMNS[c] for c in columns] + ["pf/ort", "pf/copy"], rows),
        "",
        "pf/ort: poolfold / onnxruntime (* = / poolfold float32 on the same values).",
        "pf/copy: poolfold / memcopy, np.copyto of the bytes poolfold reads and writes.",
    ]
    if REFERENCE in columns:
        lines.append(f"{COLUMNS[REFERENCE]}: onnx's ReferenceEvaluator on the N=1 slice, time "
                     "multiplied by N (extrapolated).")
    if importlib.util.find_spec("torch") is None:
        lines.append("torch: not installed.")
    if meta["numba_threads"] < meta["threads"]:
        lines.append(f"numba's pool has {meta['numba_threads']} threads: poolfold ran with "
                     f"{meta['numba_threads']} (raise NUMBA_NUM_THREADS to go further).")
    lines.append("")
    lines += [f"{r.key}: {r.title}" for r in results]
    notes = [f"  {r.key}: {n}" for r in results for n in r.notes]
    if notes:
        lines += ["", "notes:"] + notes
    return "\n".join(lines)


def format_memory(rows: list[dict]) -> str:
    table = []
    for row in rows:
        if "error" in row:
            table.append([row["key"], "-", "-", "-", f"failed: {row['error']}"])
            continue
        share = row["extra_bytes"] / max(row["output_bytes"], 1)
        table.append([row["key"], f"{row['output_bytes'] / 2**20:.2f}",
                      f"{row['extra_bytes'] / 2**20:.2f}", f"{100 * share:.1f} %",
                      "ok" if share < MEMORY_TARGET else "OVER"])
    return "\n".join([
        "memory: peak allocated during one poolfold call beyond its outputs (tracemalloc,",
        "in a child process, after a warm-up call; target: under 10 % of the outputs)",
        _table(["workload", "outputs MiB", "extra MiB", "extra", f"< {MEMORY_TARGET:.0%}"], table),
        "(tracemalloc sees numpy's buffers, not the few small arrays numba allocates inside kernels)",
    ])


def format_startup(startup: dict) -> str:
    table = [[row["key"], f"failed: {row['error']}" if "error" in row else f"{row['compile_s']:.2f}"]
             for row in startup["compile"]]
    return "\n".join([
        "compile: first call minus second call, in a child process with an empty NUMBA_CACHE_DIR",
        _table(["workload", "compile s"], table),
    ] + ([
        f"cold start with a warm cache: {startup['cold_start_s']:.2f} s "
        f"(median of {STARTUP_ROUNDS}) for",
        f"  {startup['cold_start_command']}",
        f"  (python -c \"import numpy\" alone: {startup['numpy_import_s']:.2f} s; importing numba"
        f" and setting up its target: {startup['numba_floor_s']:.2f} s)",
    ] if "cold_start_s" in startup else [
        f"cold start: failed: {startup['cold_start_error']}",
    ]))


def plot(results: list[Result], path: str) -> None:
    """Bars of each implementation's time over the workload's baseline (log scale)."""
    import matplotlib

    matplotlib.use("Agg")  # files only: no display needed
    import matplotlib.pyplot as plt

    shown = [r for r in results if r.ms.get(r.baseline)]
    names = [c for c in COLUMNS if c != MEMCOPY
             and any(r.ms.get(c) is not None and c != r.baseline for r in shown)]
    figure, axes = plt.subplots(figsize=(max(6.0, 1.2 * len(shown) + 2), 4.5))
    width = 0.8 / max(len(names), 1)
    for i, name in enumerate(names):
        xs, ys = [], []
        for j, r in enumerate(shown):
            if r.ms.get(name) is not None and name != r.baseline:
                xs.append(j + (i - (len(names) - 1) / 2) * width)
                ys.append(r.ms[name] / r.ms[r.baseline])
        # Bars grow from 1 (as fast as the baseline), down for faster, up for slower.
        bars = axes.bar(xs, [y - 1 for y in ys], width, bottom=1, label=name)
        axes.bar_label(bars, labels=[f"{y:.2g}" for y in ys], fontsize=7)
    axes.axhline(1.0, color="black", linewidth=0.8)
    axes.set_yscale("log")
    axes.set_ylabel("time / onnxruntime (log scale)")
    axes.set_xticks(range(len(shown)))
    axes.set_xticklabels([r.key + ("" if r.baseline == ONNXRUNTIME else "\n(/ pf float32)")
                          for r in shown], rotation=30, ha="right", fontsize=8)
    axes.legend(fontsize=8)
    axes.set_title("poolfold bench: lower is faster")
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


# ------------------------------------------------------------------------------------ CLI

DESCRIPTION = __doc__.split("\n\n    poolfold bench")[0]


def _positive(text: str) -> int:
    import argparse

    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text!r}")
    return value


def add_arguments(parser) -> None:
    parser.add_argument("workloads", nargs="*", metavar="WORKLOAD",
                        help=f"which workloads (default all): {', '.join(BY_KEY)}")
    parser.add_argument("--repeat", type=_positive, default=15, metavar="N",
                        help="timed rounds per implementation (default 15)")
    parser.add_argument("--threads", type=_positive, default=2, metavar="T",
                        help="threads for every implementation (default 2)")
    parser.add_argument("--json", action="store_true",
                        help="print the results as JSON instead of tables")
    parser.add_argument("--plot", metavar="FILE.png",
                        help="also draw the ratios to onnxruntime as a bar chart (needs matplotlib)")
    parser.add_argument("--memory", action="store_true",
                        help="also measure poolfold's peak memory beyond its outputs (child processes)")
    parser.add_argument("--startup", action="store_true",
                        help="also measure first-call compile times and the cold start (slow)")
    from .dask.options import add_dask_arguments  # imports no dask

    add_dask_arguments(parser)
    parser.set_defaults(handler=command)


def _meta(args, numba_threads: int) -> dict:
    import numba

    versions = {"python": platform.python_version(), "poolfold": poolfold.__version__,
                "numpy": np.__version__, "numba": numba.__version__}
    for name in ("onnxruntime", "onnx", "torch"):
        if importlib.util.find_spec(name) is not None:
            versions[name] = __import__(name).__version__
    return {"threads": args.threads, "numba_threads": numba_threads, "cpu_count": os.cpu_count(),
            "platform": platform.platform(), "processor": platform.processor() or platform.machine(),
            "repeat": args.repeat, "versions": versions}


def command(args) -> int:
    from .cli import progress

    if args.dask:
        from .dask.bench import command as dask_command

        return dask_command(args)
    keys = list(dict.fromkeys(args.workloads)) or list(BY_KEY)
    unknown = [k for k in keys if k not in BY_KEY]
    if unknown:
        print(f"poolfold bench: error: unknown workload {', '.join(unknown)} "
              f"(known: {', '.join(BY_KEY)})", file=sys.stderr)
        return 2
    # Checked before the run, not after minutes of it.
    if args.plot and importlib.util.find_spec("matplotlib") is None:
        print('poolfold bench: error: --plot needs matplotlib: pip install "poolfold[plot]"',
              file=sys.stderr)
        return 2
    numba_threads = set_threads(args.threads)
    meta = _meta(args, numba_threads)

    # One progress bar over everything: per workload a warm-up step and its rounds, then
    # one step per child process.
    total = len(keys) * (args.repeat + 1) + len(keys) * args.memory + (len(keys) + 1) * args.startup
    done = 0

    def ticker(base: int, label: str):
        return lambda i: progress(base + i, total, label)

    results = []
    for key in keys:
        results.append(run_workload(BY_KEY[key], args.repeat, args.threads,
                                    ticker(done, f"timing {key}")))
        done += args.repeat + 1
    memory = startup = None
    if args.memory:
        memory = measure_memory(keys, args.threads, ticker(done, "memory"))
        done += len(keys)
    if args.startup:
        startup = measure_startup(keys, args.threads, ticker(done, "compile and start-up"))
        done += len(keys) + 1
    progress(total, total)  # clears the bar

    if args.json:
        report = {**meta, "results": [asdict(r) for r in results]}
        if memory is not None:
            report["memory"] = memory
        if startup is not None:
            report["startup"] = startup
        print(json.dumps(report, indent=2))
    else:
        print(format_results(results, meta))
        if memory is not None:
            print("\n" + format_memory(memory))
        if startup is not None:
            print("\n" + format_startup(startup))
    if args.plot:
        plot(results, args.plot)
        print(f"poolfold bench: wrote {args.plot}", file=sys.stderr)
    return 0


def main(argv=None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m poolfold.bench", description=DESCRIPTION)
    add_arguments(parser)
    return command(parser.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
