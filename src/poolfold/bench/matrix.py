"""The MaxPool shape matrix (``poolfold bench --matrix``): the shapes users run, not one
benchmark shape.

Ranks 1 to 3; windows from 2 to 31 and a 256-wide 1-D window; strides 1, 2 and the kernel's;
with and without pads, dilations and ceil_mode; float32, float16, bfloat16, int8, uint8 and
float64; channels-first and channels-last; batch 1 (latency) and large batches; C a multiple of
16 and not; with and without Indices.  Each case runs against onnxruntime at its best (its
default and no-spin settings, the faster), PyTorch's ``max_pool1d/2d/3d`` where it has the
case, and ``scipy.ndimage.maximum_filter`` for stride-1 windows centred on each element; where
onnxruntime has no kernel (bfloat16), poolfold's ratio is to the fastest other peer.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import ml_dtypes
import numpy as np

import poolfold

from .workloads import OnnxNode, Runner, Workload, normal, to_nchw

# onnxruntime's CPU provider registers MaxPool up to version 12 for these types.
ONNXRUNTIME_TYPES = ("float32", "float16", "float64", "int8", "uint8")


@dataclass(frozen=True)
class Case:
    key: str
    shape: tuple  # NCHW order; channels-last cases transpose it
    kernel: tuple
    strides: tuple | None = None
    pads: tuple | None = None  # begins then ends; None with auto_pad
    auto_pad: str = "NOTSET"
    dilations: tuple | None = None
    ceil_mode: int = 0
    dtype: str = "float32"
    channels_last: bool = False
    indices: bool = False
    relu: bool = False  # a ReLU's output (half the elements +0.0), what a CNN's MaxPool sees

    @property
    def rank(self) -> int:
        return len(self.kernel)

    def extents(self) -> tuple[int, ...]:
        """How far each window reaches along each spatial axis."""
        dilations = self.dilations or (1,) * self.rank
        return tuple(d * (k - 1) + 1 for k, d in zip(self.kernel, dilations))

    def attributes(self) -> dict:
        attributes = {"kernel_shape": list(self.kernel)}
        for name in ("strides", "pads", "dilations"):
            if getattr(self, name) is not None:
                attributes[name] = list(getattr(self, name))
        if self.auto_pad != "NOTSET":
            attributes["auto_pad"] = self.auto_pad
        if self.ceil_mode:
            attributes["ceil_mode"] = 1
        return attributes


def _same(k):
    return dict(strides=(1,) * len(k), auto_pad="SAME_UPPER")


CASES = (
    # rank 1
    Case("1d-k256-s1-same", (4, 16, 65536), (256,), **_same((256,))),
    Case("1d-k3-s1-same", (8, 64, 4096), (3,), **_same((3,))),
    Case("1d-k4-s4", (8, 64, 16384), (4,), strides=(4,)),
    Case("1d-k5-s2-d2-p4", (8, 24, 8192), (5,), strides=(2,), pads=(4, 4), dilations=(2,)),
    Case("1d-k31-s1-same-b1", (1, 32, 16384), (31,), **_same((31,))),
    # rank 2, float32
    Case("2d-k3-s2-p1", (8, 64, 112, 112), (3, 3), strides=(2, 2), pads=(1, 1, 1, 1)),
    Case("2d-k3-s2-p1-b1", (1, 64, 56, 56), (3, 3), strides=(2, 2), pads=(1, 1, 1, 1)),
    Case("2d-k3-s2-p1-b1-112", (1, 64, 112, 112), (3, 3), strides=(2, 2), pads=(1, 1, 1, 1)),
    Case("2d-k3-s1-same", (8, 64, 112, 112), (3, 3), **_same((3, 3))),
    Case("2d-k7-s1-same", (4, 16, 256, 256), (7, 7), **_same((7, 7))),
    Case("2d-k15-s1-same", (4, 16, 256, 256), (15, 15), **_same((15, 15))),
    Case("2d-k31-s1-same", (2, 8, 256, 256), (31, 31), **_same((31, 31))),
    Case("2d-k8-s8", (4, 16, 512, 512), (8, 8), strides=(8, 8)),
    Case("2d-k2-s2", (8, 64, 56, 56), (2, 2), strides=(2, 2)),
    Case("2d-k3-s2-ceil-c24", (8, 24, 55, 55), (3, 3), strides=(2, 2), ceil_mode=1),
    Case("2d-k3-s1-d2-p2-c30", (4, 30, 100, 100), (3, 3), pads=(2, 2, 2, 2), dilations=(2, 2)),
    Case("2d-k5-s3-p2", (4, 16, 128, 128), (5, 5), strides=(3, 3), pads=(2, 2, 2, 2)),
    Case("2d-k2-s2-c3-b1", (1, 3, 224, 224), (2, 2), strides=(2, 2)),
    Case("2d-k3-s2-p1-relu", (8, 64, 112, 112), (3, 3), strides=(2, 2), pads=(1, 1, 1, 1),
         relu=True),
    Case("2d-k3-s2-ceil-b1-relu", (1, 256, 54, 54), (3, 3), strides=(2, 2), ceil_mode=1,
         relu=True),
    # inception-style: many channels on small planes (googlenet's last blocks)
    Case("2d-k3-s1-p1-c832-7-b1", (1, 832, 7, 7), (3, 3), pads=(1, 1, 1, 1), ceil_mode=1),
    Case("2d-k2-s2-c832-14-b1", (1, 832, 14, 14), (2, 2), strides=(2, 2), ceil_mode=1),
    # YOLO-style spatial pyramid pooling: stride-1 windows of 5, 9 and 13 over 20x20 planes
    Case("2d-k9-s1-p4-c256-20-b1", (1, 256, 20, 20), (9, 9), pads=(4, 4, 4, 4)),
    Case("2d-k13-s1-p6-c256-20-b1", (1, 256, 20, 20), (13, 13), pads=(6, 6, 6, 6)),
    # rank 2, other types
    Case("2d-k3-s2-p1-f16", (8, 64, 112, 112), (3, 3), strides=(2, 2), pads=(1, 1, 1, 1),
         dtype="float16"),
    Case("2d-k3-s2-p1-bf16", (8, 64, 112, 112), (3, 3), strides=(2, 2), pads=(1, 1, 1, 1),
         dtype="bfloat16"),
    Case("2d-k3-s2-p1-i8", (8, 64, 112, 112), (3, 3), strides=(2, 2), pads=(1, 1, 1, 1),
         dtype="int8"),
    Case("2d-k3-s2-p1-u8", (8, 64, 112, 112), (3, 3), strides=(2, 2), pads=(1, 1, 1, 1),
         dtype="uint8"),
    Case("2d-k3-s2-p1-f64", (8, 64, 112, 112), (3, 3), strides=(2, 2), pads=(1, 1, 1, 1),
         dtype="float64"),
    Case("2d-k15-s1-same-f16", (4, 16, 256, 256), (15, 15), **_same((15, 15)), dtype="float16"),
    # with Indices
    Case("2d-k3-s2-p1-idx", (8, 64, 112, 112), (3, 3), strides=(2, 2), pads=(1, 1, 1, 1),
         indices=True),
    Case("2d-k3-s2-p1-b1-idx", (1, 64, 56, 56), (3, 3), strides=(2, 2), pads=(1, 1, 1, 1),
         indices=True),
    Case("2d-k7-s1-same-idx", (4, 16, 256, 256), (7, 7), **_same((7, 7)), indices=True),
    Case("3d-k2-s2-idx", (2, 32, 64, 64, 64), (2, 2, 2), strides=(2, 2, 2), indices=True),
    # channels-last
    Case("nhwc-k3-s2-p1", (8, 64, 112, 112), (3, 3), strides=(2, 2), pads=(1, 1, 1, 1),
         channels_last=True),
    Case("nhwc-k3-s2-p1-b1", (1, 64, 56, 56), (3, 3), strides=(2, 2), pads=(1, 1, 1, 1),
         channels_last=True),
    Case("nhwc-k2-s2-c24", (8, 24, 112, 112), (2, 2), strides=(2, 2), channels_last=True),
    Case("nhwc-k7-s1-same", (4, 16, 256, 256), (7, 7), **_same((7, 7)), channels_last=True),
    # rank 3
    Case("3d-k3-s2-p1", (2, 32, 64, 64, 64), (3, 3, 3), strides=(2, 2, 2), pads=(1,) * 6),
    Case("3d-k2-s2", (2, 32, 64, 64, 64), (2, 2, 2), strides=(2, 2, 2)),
    Case("3d-k1x3x3-s1-same", (1, 16, 32, 64, 64), (1, 3, 3), **_same((1, 3, 3))),
    Case("3d-k5-s1-same", (2, 8, 48, 48, 48), (5, 5, 5), **_same((5, 5, 5))),
)


def tiny_shape(shape: tuple, extents: tuple, strides: tuple | None) -> tuple:
    """``--tiny``: batch 1, at most 3 channels, each spatial axis cut to a few windows' reach
    (never below one window) and kept the same modulo the stride (a ceil_mode case keeps its
    partial last window), so that every case runs in milliseconds."""
    strides = strides or (1,) * len(extents)
    return (1, min(shape[1], 3)) + tuple(
        n if n <= 2 * e + 3 else 2 * e + 3 + (n - 2 * e - 3) % s
        for n, e, s in zip(shape[2:], extents, strides))


def case_data(case: Case) -> np.ndarray:
    shape = case.shape
    if case.channels_last:
        shape = (shape[0],) + shape[2:] + (shape[1],)
    if case.dtype in ("int8", "uint8"):
        info = np.iinfo(case.dtype)
        return np.random.default_rng(0).integers(info.min, info.max, shape, dtype=case.dtype,
                                                 endpoint=True)
    dtype = ml_dtypes.bfloat16 if case.dtype == "bfloat16" else np.dtype(case.dtype)
    x = normal(shape, dtype)
    return np.maximum(x, x.dtype.type(0)) if case.relu else x


def symmetric_padding(case: Case) -> list[int] | None:
    """PyTorch's padding (one per axis, both sides), where the case has such pads."""
    r = case.rank
    if case.auto_pad == "SAME_UPPER":
        if any(s != 1 or k % 2 == 0 for s, k in zip(case.strides, case.kernel)) or case.dilations:
            return None
        return [(k - 1) // 2 for k in case.kernel]
    if case.auto_pad != "NOTSET":
        return None
    pads = case.pads or (0,) * (2 * r)
    if pads[:r] != pads[r:]:
        return None
    return list(pads[:r])


def _torch(case: Case):
    padding = symmetric_padding(case)
    if padding is None or case.rank > 3 or case.dtype in ("int8", "uint8"):
        return None
    if any(2 * p > k for p, k in zip(padding, case.kernel)):  # PyTorch refuses such pads
        return None

    def build(feeds: dict) -> Runner:
        import torch
        import torch.nn.functional as F

        x = np.ascontiguousarray(feeds["X"])
        x = torch.from_numpy(x.view(np.int16)).view(torch.bfloat16) \
            if case.dtype == "bfloat16" else torch.from_numpy(x)
        if case.channels_last and case.rank == 2:
            x = x.contiguous(memory_format=torch.channels_last)
        pool = (F.max_pool1d, F.max_pool2d, F.max_pool3d)[case.rank - 1]
        kwargs = dict(kernel_size=list(case.kernel), stride=list(case.strides or [1] * case.rank),
                      padding=padding, dilation=list(case.dilations or [1] * case.rank),
                      ceil_mode=bool(case.ceil_mode), return_indices=case.indices)
        return lambda: pool(x, **kwargs)

    return build


def _scipy(case: Case):
    """``maximum_filter`` computes every position's centred window: a stride-1 SAME pool of
    an odd window, without Indices."""
    if (case.auto_pad != "SAME_UPPER" or case.indices or case.dilations
            or any(k % 2 == 0 for k in case.kernel)):
        return None

    def build(feeds: dict) -> Runner:
        from scipy import ndimage

        x = feeds["X"]
        size = (1, 1) + tuple(case.kernel)
        if x.dtype.kind == "f":
            cval = -np.inf
        elif x.dtype.name == "bfloat16":
            raise ValueError("scipy has no bfloat16")
        else:
            cval = np.iinfo(x.dtype).min
        return lambda: ndimage.maximum_filter(x, size=size, mode="constant", cval=cval)

    return build


def _workload(case: Case) -> Workload:
    attributes = case.attributes()
    function = poolfold.nhwc.max_pool if case.channels_last else poolfold.max_pool
    layout = "channels-last " if case.channels_last else ""
    title = (f"MaxPool {case.rank}-D {layout}{case.shape} k{'x'.join(map(str, case.kernel))} "
             f"{case.dtype}" + (" +Indices" if case.indices else ""))
    node = None
    if case.dtype in ONNXRUNTIME_TYPES:
        node = OnnxNode("MaxPool", attributes, ("X",),
                        ("Y", "Indices") if case.indices else ("Y",), 12)
    return Workload(
        case.key, title,
        inputs=lambda: {"X": case_data(case)},
        poolfold=lambda d: function(d["X"], **attributes, return_indices=case.indices),
        node=node,
        node_feeds=to_nchw if case.channels_last else (lambda feeds: feeds),
        torch=_torch(case),
        scipy=_scipy(case) if not case.channels_last else None,
        reference=False,
    )


def workloads(tiny: bool = False) -> tuple[Workload, ...]:
    """The matrix's workloads; ``tiny``: on :func:`tiny_shape` inputs."""
    return case_workloads(CASES, _workload, tiny)


def case_workloads(cases, make, tiny: bool) -> tuple[Workload, ...]:
    """``make(case)`` for each case (a matrix's), on :func:`tiny_shape` inputs if ``tiny``."""
    if tiny:
        cases = [replace(case, shape=tiny_shape(case.shape, case.extents(), case.strides))
                 for case in cases]
    return tuple(make(case) for case in cases)


MATRIX: tuple[Workload, ...] = workloads()
MATRIX_BY_KEY = {w.key: w for w in MATRIX}
