"""The averaging matrix (``poolfold bench --averaging-matrix``): AveragePool, LpPool and the
global pools on the shapes users run, as :mod:`.matrix` does for MaxPool.

AveragePool in ranks 1 to 3; windows from 2 to 31, with the stride-1 same-padded windows 3, 7,
15 and 31 on one input (the cost of the window); strides 1, 2 and the kernel's; pads with
count_include_pad 0 and 1, ceil_mode and dilations; float32, float16, bfloat16 and float64;
channels-first and channels-last; batch 1 and large batches.  LpPool with p = 2 (3x3 and 2x2
stride 2), 1 and 3; GlobalAveragePool, GlobalMaxPool and GlobalLpPool on a classifier's
head shapes.  The float16 and bfloat16 cases also time poolfold's float32 call on the same
values (column ``pf f32``): their cost over poolfold's own float32.

Peers, as in the MaxPool matrix: onnxruntime at its best (its default and no-spin settings,
the faster), PyTorch where it has the case, and ``scipy.ndimage.uniform_filter`` where it
computes the same thing; where onnxruntime has no kernel (float64, bfloat16) poolfold's ratio
is to the fastest other peer.  No case puts SAME padding with a dilation: onnxruntime sizes
that padding without the dilation (wrong windows; see :mod:`poolfold.placement`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

import poolfold

from .matrix import case_data, case_workloads, symmetric_padding
from .workloads import FLOAT32, OnnxNode, Runner, Workload, to_nchw

AVERAGE, LP = "AveragePool", "LpPool"
GLOBAL_AVERAGE, GLOBAL_MAX, GLOBAL_LP = "GlobalAveragePool", "GlobalMaxPool", "GlobalLpPool"
FUNCTIONS = {AVERAGE: "average_pool", LP: "lp_pool", GLOBAL_AVERAGE: "global_average_pool",
             GLOBAL_MAX: "global_max_pool", GLOBAL_LP: "global_lp_pool"}
GLOBAL = (GLOBAL_AVERAGE, GLOBAL_MAX, GLOBAL_LP)

# onnxruntime's CPU provider has float32 and float16 kernels for these ops (float16 run in
# float32 through casts it inserts), no float64 and no bfloat16 ones.  Version 21 is the newest
# it has for all five (GlobalLpPool-22 has no kernel); for these types it computes what
# version 22, poolfold's default, does.
ONNXRUNTIME_TYPES = ("float32", "float16")
ONNXRUNTIME_OPSET = 21


@dataclass(frozen=True)
class Case:
    key: str
    op: str
    shape: tuple  # NCHW order; channels-last cases transpose it
    kernel: tuple = ()  # () for the global pools
    strides: tuple | None = None
    pads: tuple | None = None  # begins then ends; None with auto_pad
    auto_pad: str = "NOTSET"
    dilations: tuple | None = None
    ceil_mode: int = 0
    count_include_pad: int = 0  # AveragePool only
    p: int = 2  # LpPool and GlobalLpPool only
    dtype: str = "float32"
    channels_last: bool = False
    relu: bool = False  # a ReLU's output (see matrix.case_data)

    @property
    def rank(self) -> int:
        return len(self.shape) - 2

    def extents(self) -> tuple[int, ...]:
        """How far each window reaches along each spatial axis (the whole axis: global)."""
        if self.op in GLOBAL:
            return (1,) * self.rank
        dilations = self.dilations or (1,) * self.rank
        return tuple(d * (k - 1) + 1 for k, d in zip(self.kernel, dilations))

    def attributes(self) -> dict:
        """The node's attributes, which are also poolfold's keyword arguments."""
        attributes = {"p": self.p} if self.op in (LP, GLOBAL_LP) else {}
        if self.op in GLOBAL:
            return attributes
        attributes["kernel_shape"] = list(self.kernel)
        for name in ("strides", "pads", "dilations"):
            if getattr(self, name) is not None:
                attributes[name] = list(getattr(self, name))
        if self.auto_pad != "NOTSET":
            attributes["auto_pad"] = self.auto_pad
        if self.ceil_mode:
            attributes["ceil_mode"] = 1
        if self.op == AVERAGE and self.count_include_pad:
            attributes["count_include_pad"] = 1
        return attributes


def _same(k, **more):
    return dict(strides=(1,) * len(k), auto_pad="SAME_UPPER", **more)


P1 = dict(strides=(2, 2), pads=(1, 1, 1, 1))  # 3x3 stride 2 pad 1
CIP = dict(count_include_pad=1)

CASES = (
    # AveragePool rank 1
    Case("avg-1d-k3-s1-same", AVERAGE, (8, 64, 4096), (3,), **_same((3,))),
    Case("avg-1d-k4-s4", AVERAGE, (8, 64, 16384), (4,), strides=(4,)),
    Case("avg-1d-k5-s2-d2-p4", AVERAGE, (8, 24, 8192), (5,), strides=(2,), pads=(4, 4),
         dilations=(2,)),
    # AveragePool rank 2, float32: the CNN shapes (DenseNet's transition 2x2 s2, Inception's
    # 3x3 s1 p1 with count_include_pad), then the cost of the window, then the rest.
    Case("avg-2d-k2-s2", AVERAGE, (8, 256, 56, 56), (2, 2), strides=(2, 2)),
    Case("avg-2d-k2-s2-b1", AVERAGE, (1, 256, 56, 56), (2, 2), strides=(2, 2)),
    Case("avg-2d-k3-s1-p1-cip1", AVERAGE, (8, 192, 35, 35), (3, 3), pads=(1, 1, 1, 1), **CIP),
    Case("avg-2d-k3-s1-p1-cip1-b1", AVERAGE, (1, 192, 35, 35), (3, 3), pads=(1, 1, 1, 1),
         **CIP),
    Case("avg-2d-k3-s2-p1", AVERAGE, (8, 64, 112, 112), (3, 3), **P1),
    Case("avg-2d-k3-s2-p1-cip1", AVERAGE, (8, 64, 112, 112), (3, 3), **P1, **CIP),
    Case("avg-2d-k3-s1-same-cip1", AVERAGE, (4, 16, 256, 256), (3, 3), **_same((3, 3), **CIP)),
    Case("avg-2d-k7-s1-same-cip1", AVERAGE, (4, 16, 256, 256), (7, 7), **_same((7, 7), **CIP)),
    Case("avg-2d-k15-s1-same-cip1", AVERAGE, (4, 16, 256, 256), (15, 15),
         **_same((15, 15), **CIP)),
    Case("avg-2d-k31-s1-same-cip1", AVERAGE, (4, 16, 256, 256), (31, 31),
         **_same((31, 31), **CIP)),
    Case("avg-2d-k7-s1-same", AVERAGE, (4, 16, 256, 256), (7, 7), **_same((7, 7))),
    Case("avg-2d-k8-s8", AVERAGE, (4, 16, 512, 512), (8, 8), strides=(8, 8)),
    Case("avg-2d-k5-s3-p2", AVERAGE, (4, 16, 128, 128), (5, 5), strides=(3, 3),
         pads=(2, 2, 2, 2)),
    Case("avg-2d-k3-s2-ceil-c24", AVERAGE, (8, 24, 56, 56), (3, 3), strides=(2, 2), ceil_mode=1),
    Case("avg-2d-k3-s2-p1-ceil-cip1", AVERAGE, (8, 24, 56, 56), (3, 3), **P1, ceil_mode=1,
         **CIP),
    Case("avg-2d-k3-s1-d2-p2-c30", AVERAGE, (4, 30, 100, 100), (3, 3), pads=(2, 2, 2, 2),
         dilations=(2, 2)),
    # AveragePool rank 2, other types (the column pf f32: poolfold's float32 on the same values)
    Case("avg-2d-k3-s2-p1-f16", AVERAGE, (8, 64, 112, 112), (3, 3), **P1, dtype="float16"),
    Case("avg-2d-k3-s2-p1-bf16", AVERAGE, (8, 64, 112, 112), (3, 3), **P1, dtype="bfloat16"),
    Case("avg-2d-k3-s2-p1-f64", AVERAGE, (8, 64, 112, 112), (3, 3), **P1, dtype="float64"),
    Case("avg-2d-k2-s2-f16", AVERAGE, (8, 256, 56, 56), (2, 2), strides=(2, 2), dtype="float16"),
    Case("avg-2d-k7-s1-same-cip1-bf16", AVERAGE, (4, 16, 256, 256), (7, 7),
         **_same((7, 7), **CIP), dtype="bfloat16"),
    # channels-last
    Case("nhwc-avg-k3-s2-p1", AVERAGE, (8, 64, 112, 112), (3, 3), **P1, channels_last=True),
    Case("nhwc-avg-k2-s2-b1", AVERAGE, (1, 256, 56, 56), (2, 2), strides=(2, 2),
         channels_last=True),
    Case("nhwc-avg-k3-s1-same", AVERAGE, (8, 64, 56, 56), (3, 3), **_same((3, 3)),
         channels_last=True),
    # AveragePool rank 3
    Case("avg-3d-k2-s2", AVERAGE, (2, 32, 64, 64, 64), (2, 2, 2), strides=(2, 2, 2)),
    Case("avg-3d-k3-s2-p1", AVERAGE, (2, 16, 48, 48, 48), (3, 3, 3), strides=(2, 2, 2),
         pads=(1,) * 6),
    Case("avg-3d-k3-s1-p1-cip1", AVERAGE, (2, 16, 32, 32, 32), (3, 3, 3), pads=(1,) * 6, **CIP),
    # LpPool
    Case("lp2-2d-k3-s2", LP, (8, 64, 112, 112), (3, 3), strides=(2, 2)),
    Case("lp2-2d-k2-s2", LP, (8, 64, 112, 112), (2, 2), strides=(2, 2)),
    Case("lp1-2d-k3-s2-p1", LP, (8, 64, 112, 112), (3, 3), **P1, p=1),
    Case("lp3-2d-k3-s2-p1", LP, (8, 64, 112, 112), (3, 3), **P1, p=3),
    # the global pools: a classifier's head
    Case("gap-8x2048x7x7", GLOBAL_AVERAGE, (8, 2048, 7, 7)),
    Case("gap-1x512x7x7", GLOBAL_AVERAGE, (1, 512, 7, 7)),
    Case("gap-8x64x56x56", GLOBAL_AVERAGE, (8, 64, 56, 56)),
    Case("gap-8x2048x7x7-f16", GLOBAL_AVERAGE, (8, 2048, 7, 7), dtype="float16"),
    Case("nhwc-gap-8x2048x7x7", GLOBAL_AVERAGE, (8, 2048, 7, 7), channels_last=True),
    Case("gmp-8x2048x7x7", GLOBAL_MAX, (8, 2048, 7, 7)),
    Case("gmp-8x64x56x56", GLOBAL_MAX, (8, 64, 56, 56)),
    Case("glp2-8x2048x7x7", GLOBAL_LP, (8, 2048, 7, 7)),
)


def _tensor(x: np.ndarray, case: Case):
    import torch

    x = np.ascontiguousarray(x)
    x = torch.from_numpy(x.view(np.int16)).view(torch.bfloat16) \
        if case.dtype == "bfloat16" else torch.from_numpy(x)
    if case.channels_last and case.rank == 2:
        x = x.contiguous(memory_format=torch.channels_last)
    return x


def _torch(case: Case):
    """``avg_pool1d/2d/3d``, ``lp_pool1d/2d/3d`` and ``adaptive_avg/max_pool`` where they
    compute the case: symmetric pads PyTorch accepts, no dilation; LpPool with an even p (it
    raises x, not |x|, to p), no pads and no ceil_mode (it scales a clipped window's average
    by the whole window)."""
    lp = case.op in (LP, GLOBAL_LP)
    if lp and case.p % 2:
        return None
    if case.op in GLOBAL:
        def pool(F, x):
            if case.op == GLOBAL_LP:
                return getattr(F, f"lp_pool{case.rank}d")(x, case.p, tuple(x.shape[2:]))
            kind = "avg" if case.op == GLOBAL_AVERAGE else "max"
            return getattr(F, f"adaptive_{kind}_pool{case.rank}d")(x, 1)
    else:
        padding = symmetric_padding(case)
        if padding is None or any(d != 1 for d in case.dilations or ()):
            return None
        if any(2 * p > k for p, k in zip(padding, case.kernel)):  # PyTorch refuses such pads
            return None
        stride = list(case.strides or (1,) * case.rank)  # ONNX's default, not PyTorch's
        if lp:
            if any(padding) or case.ceil_mode:
                return None

            def pool(F, x):
                return getattr(F, f"lp_pool{case.rank}d")(x, case.p, list(case.kernel), stride)
        else:
            def pool(F, x):
                return getattr(F, f"avg_pool{case.rank}d")(
                    x, list(case.kernel), stride, padding, ceil_mode=bool(case.ceil_mode),
                    count_include_pad=bool(case.count_include_pad))

    def build(feeds: dict) -> Runner:
        import torch.nn.functional as F

        x = _tensor(feeds["X"], case)
        return lambda: pool(F, x)

    return build


def _scipy(case: Case):
    """``uniform_filter`` averages every position's centred window, zeros outside: a stride-1
    AveragePool of an odd window padded by half of it on each side, counting the pads."""
    if (case.op != AVERAGE or not case.count_include_pad or case.channels_last
            or case.dtype not in ("float32", "float64") or case.dilations
            or any(k % 2 == 0 for k in case.kernel)
            or any(s != 1 for s in case.strides or ())
            or symmetric_padding(case) != [(k - 1) // 2 for k in case.kernel]):
        return None

    def build(feeds: dict) -> Runner:
        from scipy import ndimage

        x = feeds["X"]
        size = (1, 1) + tuple(case.kernel)
        return lambda: ndimage.uniform_filter(x, size=size, mode="constant", cval=0.0)

    return build


def _float32(case: Case, function, attributes: dict):
    """poolfold's float32 call on the same values as a float16 or bfloat16 case."""
    def build(feeds: dict) -> Runner:
        x = feeds["X"]
        if case.channels_last:  # the feeds are the node's, in NCHW
            x = np.moveaxis(x, 1, -1)
        x = np.ascontiguousarray(x, np.float32)
        return lambda: function(x, **attributes)

    return build


def _title(case: Case) -> str:
    layout = "channels-last " if case.channels_last else ""
    window = "" if case.op in GLOBAL else f" k{'x'.join(map(str, case.kernel))}"
    details = [f"{k}={v}" for k, v in case.attributes().items() if k != "kernel_shape"]
    return (f"{case.op} {case.rank}-D {layout}{case.shape}{window} {case.dtype}"
            + (f" ({', '.join(details)})" if details else ""))


def _workload(case: Case) -> Workload:
    attributes = case.attributes()
    function = getattr(poolfold.nhwc if case.channels_last else poolfold, FUNCTIONS[case.op])
    node = None
    if case.dtype in ONNXRUNTIME_TYPES:
        node = OnnxNode(case.op, attributes, ("X",), ("Y",), ONNXRUNTIME_OPSET)
    extras = {}
    if case.dtype in ("float16", "bfloat16"):
        extras[FLOAT32] = _float32(case, function, attributes)
    return Workload(
        case.key, _title(case),
        inputs=lambda: {"X": case_data(case)},
        poolfold=lambda d: function(d["X"], **attributes),
        node=node,
        node_feeds=to_nchw if case.channels_last else (lambda feeds: feeds),
        torch=_torch(case),
        scipy=_scipy(case),
        reference=False,
        extras=extras,
    )


def workloads(tiny: bool = False) -> tuple[Workload, ...]:
    """The matrix's workloads; ``tiny``: on :func:`~.matrix.tiny_shape` inputs."""
    return case_workloads(CASES, _workload, tiny)
