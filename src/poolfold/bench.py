"""Benchmarks: poolfold against onnxruntime on the same data, in one process.

Each workload is run by every implementation available, warmed up, then the implementations
are alternated round by round so that machine noise hits them alike; medians are reported,
with the ratio to onnxruntime and the time as a multiple of the memory-copy limit
(``np.copyto`` of as many bytes as the op reads and writes, measured in the same run).

    poolfold bench [WORKLOAD ...] [--repeat N] [--threads T] [--json]
"""

from __future__ import annotations

import json
import os
import statistics
import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np


@dataclass
class Workload:
    name: str
    inputs: Callable[[], dict]  # name -> array, built once per run
    poolfold: Callable[[dict], object]
    onnx_node: Callable[[], tuple] | None = None  # (op, attributes, input names, outputs, opset)
    results: dict = field(default_factory=dict)


def _max_pool_2d(indices: bool) -> Workload:
    import poolfold

    attributes = dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    outputs = ["Y", "Indices"] if indices else ["Y"]
    return Workload(
        name=f"MaxPool 2-D (8,64,112,112) 3x3 s2 p1{' +Indices' if indices else ''}",
        inputs=lambda: {
            "X": np.random.default_rng(0).standard_normal((8, 64, 112, 112), np.float32)
        },
        poolfold=lambda d: poolfold.max_pool(d["X"], **attributes, return_indices=indices),
        onnx_node=lambda: ("MaxPool", attributes, ["X"], outputs, 12),
    )


def _max_unpool_2d() -> Workload:
    import poolfold

    def inputs():
        # Y and Indices of a 2x2 stride-2 MaxPool of a (8,64,112,112) tensor: the usual source.
        x = np.random.default_rng(0).standard_normal((8, 64, 112, 112), np.float32)
        y, indices = poolfold.max_pool(x, [2, 2], strides=[2, 2], return_indices=True)
        return {"X": y, "I": indices, "output_shape": np.array(x.shape, np.int64)}

    attributes = dict(kernel_shape=[2, 2], strides=[2, 2])
    return Workload(
        name="MaxUnpool 2-D (8,64,56,56) -> (8,64,112,112) 2x2 s2",
        inputs=inputs,
        poolfold=lambda d: poolfold.max_unpool(
            d["X"], d["I"], **attributes, output_shape=d["output_shape"]
        ),
        onnx_node=lambda: ("MaxUnpool", attributes, ["X", "I", "output_shape"], ["Y"], 11),
    )


def _col2im() -> Workload:
    import poolfold

    attributes = dict(pads=[1, 1, 1, 1])
    return Workload(
        name="Col2Im (8,576,3136) -> (8,64,56,56) 3x3 p1",
        inputs=lambda: {
            "X": np.random.default_rng(0).standard_normal((8, 576, 3136), np.float32),
            "image_shape": np.array([56, 56], np.int64),
            "block_shape": np.array([3, 3], np.int64),
        },
        poolfold=lambda d: poolfold.col2im(d["X"], d["image_shape"], d["block_shape"], **attributes),
        onnx_node=lambda: ("Col2Im", attributes, ["X", "image_shape", "block_shape"], ["Y"], 18),
    )


WORKLOADS = {
    "maxpool2d": lambda: _max_pool_2d(False),
    "maxpool2d-indices": lambda: _max_pool_2d(True),
    "maxunpool2d": _max_unpool_2d,
    "col2im": _col2im,
}


def _onnxruntime_runner(workload: Workload, feeds: dict, threads: int):
    try:
        import onnxruntime
        from onnx import helper
    except ImportError:
        return None
    op, attributes, input_names, outputs, opset = workload.onnx_node()
    node = helper.make_node(op, input_names, outputs, **attributes)
    inputs = [
        helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(feeds[n].dtype), feeds[n].shape)
        for n in input_names
    ]
    graph = helper.make_graph(
        [node], "bench", inputs, [helper.make_empty_tensor_value_info(o) for o in outputs]
    )
    # onnxruntime lags the onnx package's newest IR version; 8 is understood by every build.
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    # Idle onnxruntime threads otherwise spin for a while after each run and steal the cores
    # from whatever runs next, poolfold included.
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    session = onnxruntime.InferenceSession(
        model.SerializeToString(), options, providers=["CPUExecutionProvider"]
    )
    return lambda: session.run(None, {n: feeds[n] for n in input_names})


def _bytes_moved(feeds: dict, outputs) -> int:
    outputs = outputs if isinstance(outputs, tuple) else (outputs,)
    return sum(a.nbytes for a in feeds.values()) + sum(a.nbytes for a in outputs)


def run(names, repeat: int = 15, threads: int = 2, progress=print) -> list[dict]:
    import numba

    numba.set_num_threads(min(threads, numba.config.NUMBA_NUM_THREADS))
    rows = []
    for name in names:
        workload = WORKLOADS[name]()
        feeds = workload.inputs()
        runners = {"poolfold": lambda: workload.poolfold(feeds)}
        ort = _onnxruntime_runner(workload, feeds, threads)
        if ort is not None:
            runners["onnxruntime"] = ort
        moved = _bytes_moved(feeds, runners["poolfold"]())
        source = np.ones(moved // 8, np.float64)
        target = np.empty_like(source)
        runners["memcopy"] = lambda: np.copyto(target, source)  # reads and writes `moved` bytes
        times = {key: [] for key in runners}
        for run_ in runners.values():  # warm up (and compile)
            run_()
        for _ in range(repeat):
            for key, run_ in runners.items():
                start = time.perf_counter()
                run_()
                times[key].append(time.perf_counter() - start)
        medians = {key: statistics.median(values) * 1e3 for key, values in times.items()}
        row = {"workload": workload.name, "ms": medians}
        if "onnxruntime" in medians:
            row["ratio_to_onnxruntime"] = medians["poolfold"] / medians["onnxruntime"]
        row["ratio_to_memcopy"] = medians["poolfold"] / medians["memcopy"]
        rows.append(row)
        progress(_format(row))
    return rows


def _format(row: dict) -> str:
    ms = row["ms"]
    parts = [f"{row['workload']:<45}", f"poolfold {ms['poolfold']:8.2f} ms"]
    if "onnxruntime" in ms:
        parts.append(f"onnxruntime {ms['onnxruntime']:8.2f} ms")
        parts.append(f"ratio {row['ratio_to_onnxruntime']:5.2f}")
    parts.append(f"x memcopy {row['ratio_to_memcopy']:5.2f}")
    return "  ".join(parts)


DESCRIPTION = __doc__.split("\n\n    python")[0]


def add_arguments(parser) -> None:
    parser.add_argument("workloads", nargs="*", default=list(WORKLOADS), metavar="WORKLOAD",
                        help=f"which workloads (default all): {', '.join(WORKLOADS)}")
    parser.add_argument("--repeat", type=int, default=15, help="timed rounds per implementation")
    parser.add_argument("--threads", type=int, default=2, help="threads for every implementation")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    parser.set_defaults(handler=command)


def command(args) -> int:
    unknown = [w for w in args.workloads if w not in WORKLOADS]
    if unknown:
        print(f"poolfold bench: error: unknown workload(s) {', '.join(unknown)}; "
              f"known: {', '.join(WORKLOADS)}")
        return 2
    rows = run(args.workloads, args.repeat, args.threads,
               progress=(lambda s: None) if args.json else print)
    if args.json:
        print(json.dumps({"threads": args.threads, "cpus": os.cpu_count(), "results": rows}, indent=2))
    return 0


def main(argv=None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m poolfold.bench", description=DESCRIPTION)
    add_arguments(parser)
    return command(parser.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
