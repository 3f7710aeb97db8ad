"""The implementations poolfold is compared with, each built into a :data:`Runner` outside
the clock: onnxruntime (at its defaults, and with its idle threads' spinning off), PyTorch
and onnx's ReferenceEvaluator.  Every one gets the same thread count; nothing else is tuned."""

from __future__ import annotations

import os
import time

import numpy as np

from ..console import first_line
from .workloads import OnnxNode, Runner, Workload

REFERENCE_LIMIT_S = 20.0  # skip the reference for a workload when one N=1 run takes longer


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


def onnx_model(node: OnnxNode, feeds: dict):
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


def onnxruntime_runner(workload: Workload, feeds: dict, threads: int, spinning: bool) -> Runner:
    """onnxruntime's CPU session at its default options but the thread count; with
    ``spinning=False`` its idle threads stop spinning after a run
    (``session.intra_op.allow_spinning=0``), which helps whatever runs next on the same
    cores and, on a busy machine, sometimes onnxruntime itself."""
    try:
        import onnxruntime
    except ImportError:
        raise Unavailable("not installed") from None
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = threads
    if not spinning:
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    try:
        session = onnxruntime.InferenceSession(
            onnx_model(workload.node, feeds).SerializeToString(), options,
            providers=["CPUExecutionProvider"])
    except Exception as error:  # onnxruntime's errors are not one family
        raise Unavailable(first_line(error)) from None
    run_feeds = {n: feeds[n] for n in workload.node.inputs}
    return lambda: session.run(None, run_feeds)


def torch_runner(workload: Workload, feeds: dict, threads: int) -> Runner:
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


def reference_runner(workload: Workload, feeds: dict) -> tuple[Runner, int, float]:
    """onnx's ReferenceEvaluator on the N=1 slice (it is pure numpy and Python, far too slow
    for the whole batch): the runner, N (its times are scaled by it), and one run's seconds."""
    try:
        from onnx.reference import ReferenceEvaluator
    except ImportError:
        raise Unavailable("not installed") from None
    sliced, n = _first_batch(workload, feeds)
    evaluator = ReferenceEvaluator(onnx_model(workload.node, sliced))
    names = workload.node.inputs
    run = lambda: evaluator.run(None, {k: sliced[k] for k in names})  # noqa: E731
    start = time.perf_counter()  # the single timed run that decides whether to go on
    run()
    seconds = time.perf_counter() - start
    if seconds > REFERENCE_LIMIT_S:
        raise Unavailable(f"skipped: one N=1 run took {seconds:.0f} s (> {REFERENCE_LIMIT_S:.0f} s)")
    return run, n, seconds
