"""The benchmark's workloads: one table, :data:`WORKLOADS`, drives the timing, the memory
measurement and the plot.  Also the names of the implementations and the table's columns."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import ml_dtypes
import numpy as np

import poolfold

Runner = Callable[[], object]  # one timed call; returns the outputs (freed after the clock stops)

POOLFOLD = "poolfold"
ONNXRUNTIME = "onnxruntime"  # at its default session options: idle threads spin after a run
ONNXRUNTIME_NO_SPIN = "onnxruntime no-spin"  # the same with session.intra_op.allow_spinning=0
TORCH = "torch"
SCIPY = "scipy"  # ndimage.maximum_filter, for the stride-1 centred windows it computes
REFERENCE = "onnx-ref"
STREAM = "stream"  # read X once, write Y once: the memory-speed limit of a pool (yardstick.py)
NCHW = "poolfold NCHW"  # extra column of the channels-last workload
FLOAT32 = "poolfold float32"  # baseline of the bfloat16 workload (onnxruntime is not run there)
# A float16 or bfloat16 case's poolfold time over poolfold's float32 on the same values (the
# FLOAT32 column, where that is not the baseline) should stay within this.
FLOAT32_TARGET = 1.3

# Table order of the implementations, and their (short) column headers.
COLUMNS = {
    POOLFOLD: "poolfold",
    ONNXRUNTIME: "ort",
    ONNXRUNTIME_NO_SPIN: "ort nospin",
    TORCH: "torch",
    SCIPY: "scipy",
    REFERENCE: "onnx-ref xN",
    NCHW: "pf NCHW",
    FLOAT32: "pf f32",
    STREAM: "stream",
}
# A baseline measured under several settings: poolfold's ratio is taken against the fastest,
# so that no setting of the peer flatters poolfold.
BASELINE_SETTINGS = {ONNXRUNTIME: (ONNXRUNTIME, ONNXRUNTIME_NO_SPIN)}
# Where onnxruntime cannot run a workload, poolfold's ratio is to the fastest of these.
OTHER_PEERS = (TORCH, SCIPY)


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
    scipy: Callable[[dict], Runner] | None = None
    reference: bool = True  # run onnx's ReferenceEvaluator (on the N=1 slice)
    batched: tuple[str, ...] = ("X",)  # node inputs with the batch axis first, for that slice
    extras: dict = field(default_factory=dict)  # column name -> (node feeds -> Runner)
    baseline: str = ONNXRUNTIME  # poolfold's ratio is to this (its fastest setting: BASELINE_SETTINGS)


def normal(shape, dtype=np.float32) -> np.ndarray:
    """Seeded standard-normal data, so that every run (and every child process) sees the
    same values."""
    return np.random.default_rng(0).standard_normal(shape, np.float32).astype(dtype, copy=False)


def to_nchw(feeds: dict) -> dict:
    """A channels-last feed ``X`` as the channels-first array the NCHW peers take."""
    return {"X": np.ascontiguousarray(np.moveaxis(feeds["X"], -1, 1))}


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
    x = normal((8, 64, 112, 112))
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
        inputs=lambda: {"X": normal((8, 64, 112, 112))},
        poolfold=lambda d: poolfold.max_pool(d["X"], **POOL_2D),
        node=NODE_POOL_2D,
        torch=_torch_max_pool(2, 3, 2, 1, indices=False),
    ),
    Workload(
        "maxpool2d-indices", "MaxPool 2-D (8,64,112,112) 3x3 s2 p1 +Indices",
        inputs=lambda: {"X": normal((8, 64, 112, 112))},
        poolfold=lambda d: poolfold.max_pool(d["X"], **POOL_2D, return_indices=True),
        node=OnnxNode("MaxPool", POOL_2D, ("X",), ("Y", "Indices"), 12),
        torch=_torch_max_pool(2, 3, 2, 1, indices=True),
    ),
    Workload(
        "maxpool3d", "MaxPool 3-D (2,32,64,64,64) 2x2x2 s2",
        inputs=lambda: {"X": normal((2, 32, 64, 64, 64))},
        poolfold=lambda d: poolfold.max_pool(d["X"], **POOL_3D),
        node=OnnxNode("MaxPool", POOL_3D, ("X",), ("Y",), 12),
        torch=_torch_max_pool(3, 2, 2, 0, indices=False),
    ),
    Workload(
        "maxpool3d-indices", "MaxPool 3-D (2,32,64,64,64) 2x2x2 s2 +Indices",
        inputs=lambda: {"X": normal((2, 32, 64, 64, 64))},
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
            "X": normal((8, 576, 3136)),
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
        inputs=lambda: {"X": normal((8, 112, 112, 64))},
        poolfold=lambda d: poolfold.nhwc.max_pool(d["X"], **POOL_2D),
        node=NODE_POOL_2D,
        node_feeds=to_nchw,
        reference=False,
        extras={NCHW: lambda d: lambda: poolfold.max_pool(d["X"], **POOL_2D)},
    ),
    _pool_2d_of(np.float16, lambda: normal((8, 64, 112, 112), np.float16)),
    _pool_2d_of(np.int8, lambda: np.random.default_rng(0).integers(
        -128, 128, (8, 64, 112, 112), dtype=np.int8)),
    Workload(
        # onnxruntime's CPU provider has no bfloat16 MaxPool; the yardstick is poolfold's own
        # float32 run on the same (exactly representable) values.
        "maxpool2d-bfloat16", "MaxPool 2-D (8,64,112,112) 3x3 s2 p1 bfloat16",
        inputs=lambda: {"X": normal((8, 64, 112, 112), ml_dtypes.bfloat16)},
        poolfold=lambda d: poolfold.max_pool(d["X"], **POOL_2D),
        reference=False,
        extras={FLOAT32: lambda d: (lambda x: lambda: poolfold.max_pool(x, **POOL_2D))(
            d["X"].astype(np.float32))},
        baseline=FLOAT32,
    ),
)
BY_KEY = {w.key: w for w in WORKLOADS}
