"""AveragePool, LpPool, GlobalMaxPool, GlobalAveragePool, GlobalLpPool (ai.onnx and
com.ms.internal.nhwc) against the exact oracle in tests/oracle.py.

The contract is docs/semantics.md, "The averaging family": windows are MaxPool's; AveragePool
divides the sum over V (the taps inside X) by |V|, or by |P| (the taps inside the padded
extent) with count_include_pad; LpPool is (sum |x|^p)^(1/p) over V with no spurious overflow or
underflow; NaN propagates, inf follows IEEE; empty windows give NaN / 0 / 0.  Any summation
order is allowed, so results are compared with the exact value within the contract's bound
(``oracle.assert_within_bound``): ``2 ulp_T(exact) + |V| u max|x over V|`` for AveragePool and
``2 ulp_T(exact) + (|V| + 2) u exact`` for LpPool.  GlobalMaxPool must be exact.

Cases come from fixed seeds (``np.random.default_rng(<constant>)``) so a failure reproduces;
one hypothesis property test adds random geometry.  Differential tests against onnxruntime
(float32 AveragePool, spatial rank <= 3, where the contract says ORT is right) and
torch.nn.functional.avg_pool2d (when torch imports) use a tolerance that does not come from
the oracle, so they check the oracle too.  Sizes are small: the oracle is pure Python.
"""

from __future__ import annotations

import functools
import math
import re
from dataclasses import dataclass, field

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, note, settings
from hypothesis import strategies as st

import oracle
import poolfold
from poolfold import PoolfoldError, PoolfoldTypeError
from poolfold.kernels import window_blocks
from poolfold.ops._common import CallCache

F16 = np.dtype(np.float16)
F32 = np.dtype(np.float32)
F64 = np.dtype(np.float64)
BF16 = np.dtype(ml_dtypes.bfloat16)
FLOATS = (F16, BF16, F32, F64)

# the largest spatial size per axis, by spatial rank, so that the oracle stays fast
MAX_DIM = {1: 14, 2: 7, 3: 5, 4: 4}


# --------------------------------------------------------------------------------------------
# cases
# --------------------------------------------------------------------------------------------


@dataclass
class Case:
    shape: tuple  # (N, C, D1..Dr)
    kernel: list
    strides: list | None = None
    pads: list | None = None
    dilations: list | None = None
    auto_pad: str = "NOTSET"
    ceil_mode: int = 0
    count_include_pad: int = 0
    p: int = 2
    dtype: np.dtype = F32
    specials: bool = False  # NaN / +inf / -inf sprinkled in
    scale: float = 4.0
    seed: int = 0
    name: str = field(default="")

    @property
    def geometry(self) -> dict:
        """The window attributes, as keyword arguments (None ones left out)."""
        kw = dict(strides=self.strides, pads=self.pads, dilations=self.dilations)
        kw = {k: v for k, v in kw.items() if v is not None}
        kw["auto_pad"] = self.auto_pad
        kw["ceil_mode"] = self.ceil_mode
        return kw

    def data(self) -> np.ndarray:
        return make_data(self.shape, self.dtype, self.seed, self.specials, self.scale)

    def __str__(self):
        parts = [self.name] if self.name else []
        parts += [f"x{list(self.shape)}", f"k{self.kernel}"]
        if self.strides:
            parts.append(f"s{self.strides}")
        if self.pads:
            parts.append(f"p{self.pads}")
        if self.dilations:
            parts.append(f"d{self.dilations}")
        if self.auto_pad != "NOTSET":
            parts.append(self.auto_pad)
        if self.ceil_mode:
            parts.append("ceil")
        if self.count_include_pad:
            parts.append("cip")
        parts.append(self.dtype.name)
        if self.specials:
            parts.append("specials")
        return "-".join(parts)


def make_data(shape, dtype, seed, specials=False, scale=4.0) -> np.ndarray:
    """Normal values (times ``scale``) with some small integers (exact ties and cancellations),
    and, with ``specials``, about 4% each of NaN, +inf and -inf."""
    rng = np.random.default_rng(seed)
    values = rng.standard_normal(shape) * scale
    ints = rng.random(shape) < 0.3
    values[ints] = rng.integers(-3, 4, size=int(ints.sum()))
    if specials:
        pick = rng.random(shape)
        values[pick < 0.04] = np.nan
        values[(pick >= 0.04) & (pick < 0.08)] = np.inf
        values[(pick >= 0.08) & (pick < 0.12)] = -np.inf
    return values.astype(dtype)


def fits(case: Case) -> bool:
    """Every axis holds at least one window (else the op must refuse: tested separately)."""
    return oracle.max_pool_geometry(case.shape[2:], case.kernel, case.strides, case.pads,
                                    case.dilations, case.auto_pad, case.ceil_mode) is not None


def random_cases(seed: int, count: int, *, op: str) -> list[Case]:
    """``count`` valid cases drawn from ``np.random.default_rng(seed)``: spatial ranks 1-4,
    kernels 1..7, strides 1..3, dilations 1..3, pads up to and past the kernel, every auto_pad,
    ceil_mode, count_include_pad (AveragePool) or p in {1, 2, 3} (LpPool), every float type."""
    rng = np.random.default_rng(seed)
    cases = []
    while len(cases) < count:
        i = len(cases)
        r = [1, 2, 3, 4, 1, 2][i % 6]
        spatial = [int(rng.integers(1, MAX_DIM[r] + 1)) for _ in range(r)]
        kmax = 7 if r <= 2 else 3
        kernel = [int(rng.integers(1, kmax + 1)) for _ in range(r)]
        strides = [int(rng.integers(1, 4)) for _ in range(r)] if rng.random() < 0.7 else None
        dilations = ([int(rng.integers(1, 4)) for _ in range(r)]
                     if rng.random() < 0.35 else None)
        auto_pad = str(rng.choice(["NOTSET"] * 5 + ["SAME_UPPER", "SAME_LOWER", "VALID"]))
        pads = None
        if auto_pad == "NOTSET" and rng.random() < 0.7:
            # mostly below the kernel, sometimes at or past it
            pads = [int(rng.integers(0, kernel[a % r] + (2 if rng.random() < 0.2 else 0)))
                    for a in range(2 * r)]
        case = Case(
            shape=(int(rng.integers(1, 3)), int(rng.integers(1, 3)), *spatial),
            kernel=kernel, strides=strides, pads=pads, dilations=dilations, auto_pad=auto_pad,
            ceil_mode=int(rng.random() < 0.4),
            count_include_pad=int(rng.random() < 0.5) if op == "average" else 0,
            p=int(rng.integers(1, 4)),
            dtype=FLOATS[i % 4],
            specials=bool(rng.random() < 0.3),
            seed=int(rng.integers(0, 2**31)),
            name=f"r{i}",
        )
        if fits(case):
            cases.append(case)
    return cases


# Hand-picked cases for the rules most likely to go wrong, then the random ones.
EDGE_CASES = [
    Case((1, 1, 4), [2], name="spec1d"),
    Case((1, 1, 7, 5), [3, 3], strides=[3, 1], ceil_mode=1, name="ceil-overhang"),
    Case((1, 1, 7, 5), [3, 3], strides=[3, 1], ceil_mode=1, count_include_pad=1,
         name="ceil-overhang"),
    Case((2, 3, 5, 6), [3, 3], strides=[2, 2], pads=[1, 1, 1, 1], ceil_mode=1,
         count_include_pad=1, name="ceil-pads"),
    Case((1, 2, 4), [1], pads=[3, 2], name="pads-past-kernel"),
    Case((1, 2, 4), [1], pads=[3, 2], count_include_pad=1, name="pads-past-kernel"),
    Case((1, 1, 3, 3), [2, 2], pads=[2, 3, 3, 2], count_include_pad=1, dtype=F64,
         name="pads-past-kernel"),
    Case((1, 1, 5), [2], dilations=[4], pads=[3, 3], name="empty-by-dilation"),
    Case((1, 1, 5), [2], dilations=[4], pads=[3, 3], count_include_pad=1,
         name="empty-by-dilation"),
    Case((1, 2, 6, 5), [3, 2], dilations=[2, 2], auto_pad="SAME_UPPER", count_include_pad=1,
         name="same-dilation"),
    Case((1, 2, 6, 5), [3, 2], dilations=[2, 2], auto_pad="SAME_LOWER", count_include_pad=1,
         name="same-dilation"),
    Case((1, 1, 7), [2], strides=[5], auto_pad="SAME_UPPER", count_include_pad=1,
         name="same-stride-past-kernel"),
    Case((1, 1, 6, 4), [3, 2], strides=[2, 3], auto_pad="VALID", ceil_mode=1,
         name="valid-ceil"),
    Case((1, 2, 45), [40], strides=[2], dtype=F16, scale=1.0, name="long-window"),
    Case((1, 2, 45), [40], strides=[3], pads=[5, 5], count_include_pad=1, dtype=BF16,
         name="long-window"),
    Case((1, 1, 45), [40], dtype=F32, specials=True, name="long-window"),
    Case((1, 1, 3, 4, 3, 3), [2, 3, 2, 2], strides=[1, 2, 1, 2], pads=[1, 0, 1, 1, 0, 1, 0, 1],
         ceil_mode=1, count_include_pad=1, dtype=F64, name="4d"),
    Case((2, 1, 4, 3, 4, 3), [2, 2, 3, 1], dilations=[2, 1, 1, 2], auto_pad="SAME_LOWER",
         dtype=BF16, name="4d"),
    Case((1, 3, 4, 4, 4), [2, 2, 2], strides=[2, 2, 2], dtype=F16, specials=True, name="3d"),
    Case((1, 1, 7, 7), [7, 7], dtype=F32, name="kernel-7"),
    Case((1, 1, 9), [7], strides=[3], pads=[6, 6], ceil_mode=1, count_include_pad=1,
         dtype=F64, name="kernel-7"),
]
for _i, _c in enumerate(EDGE_CASES):
    _c.seed = 1000 + _i

AVERAGE_CASES = EDGE_CASES + random_cases(20240601, 110, op="average")
LP_CASES = [Case(**{**c.__dict__, "count_include_pad": 0, "p": 1 + i % 3})
            for i, c in enumerate(EDGE_CASES) if not c.count_include_pad]
LP_CASES += random_cases(20240602, 70, op="lp")


def ids(cases):
    return [str(c) for c in cases]


# --------------------------------------------------------------------------------------------
# AveragePool and LpPool, ai.onnx
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("case", AVERAGE_CASES, ids=ids(AVERAGE_CASES))
def test_average_pool(case):
    x = case.data()
    want, info = oracle.average_pool(x, case.kernel, count_include_pad=case.count_include_pad,
                                     **case.geometry)
    got = poolfold.average_pool(x, case.kernel, count_include_pad=case.count_include_pad,
                                **case.geometry)
    oracle.assert_within_bound(got, want, info, case.dtype, "average")


@pytest.mark.parametrize("case", LP_CASES, ids=[f"{c}-p{c.p}" for c in LP_CASES])
def test_lp_pool(case):
    x = case.data()
    want, info = oracle.lp_pool(x, case.kernel, p=case.p, **case.geometry)
    got = poolfold.lp_pool(x, case.kernel, p=case.p, **case.geometry)
    oracle.assert_within_bound(got, want, info, case.dtype, "lp")


# Every fourth case again, on the kernel path the default choice did not take: the row sums
# (windows of up to a few dozen taps) and the separable passes each meet the oracle whatever
# window they are given.
SWAPPED_CASES = [("average", c) for c in AVERAGE_CASES[::4]] + [
    ("lp", c) for c in LP_CASES[::4] if c.dtype != F64]


def pooled(kind, case, x, by=poolfold):
    """``case``'s AveragePool (``kind`` "average") or LpPool of ``x``, by poolfold or by the
    oracle (which also gives its bound's information)."""
    if kind == "lp":
        return by.lp_pool(x, case.kernel, p=case.p, **case.geometry)
    return by.average_pool(x, case.kernel, count_include_pad=case.count_include_pad,
                           **case.geometry)


def fresh_launches(monkeypatch):
    """Fresh kept launches for a test that swaps a kernel choice: a launch of the same call
    made before would not ask the swapped choice."""
    from poolfold.ops import averaging

    monkeypatch.setattr(averaging, "_CALLS", CallCache())
    monkeypatch.setattr(averaging, "_windows_launch",
                        functools.lru_cache(maxsize=256)(averaging._WindowsLaunch))


@pytest.mark.parametrize("kind,case", SWAPPED_CASES,
                         ids=[f"{k}-{c}" for k, c in SWAPPED_CASES])
def test_other_kernel_path(kind, case, monkeypatch):
    from poolfold.ops import averaging

    chosen = averaging.takes_row_sums
    decisions = []

    def other_path(plan, dtype, kind, p):
        rows = (kind == "average" or (np.dtype(dtype).itemsize <= 4 and p in (1.0, 2.0)
                                      and not averaging.is_scaled(kind, dtype, p)))
        rows = rows and not chosen(plan, dtype, kind, p)
        decisions.append(rows)
        return rows

    ran = []
    kernel = averaging.window_rows
    fresh_launches(monkeypatch)
    monkeypatch.setattr(averaging, "takes_row_sums", other_path)
    monkeypatch.setattr(averaging, "window_rows",
                        lambda *args: ran.append(True) or kernel(*args))
    x = case.data()
    want, info = pooled(kind, case, x, by=oracle)
    got = pooled(kind, case, x)
    oracle.assert_within_bound(got, want, info, case.dtype, kind)
    # the row kernel ran exactly where the swapped choice asked for it (inputs with elements)
    assert bool(ran) == (any(decisions) and x.size > 0 and got.size > 0), (decisions, ran)


# The row kernel takes channels-first output rows in blocks (window_rows' _store_block, whose
# averages read the plan's plane_factors) where a work piece holds several rows of a plane,
# and one at a time otherwise: where the threads' pieces start must not change a bit.  Rows
# cut by padding inside blocks, per-row divisors, 3-D, NaN and inf, float32 overflow.
BLOCK_CASES = [
    Case((1, 4, 9, 9), [3, 3], strides=[1, 1], pads=[1, 1, 1, 1]),
    Case((1, 3, 12, 12), [3, 3], strides=[2, 2], pads=[1, 1, 1, 1], count_include_pad=1),
    Case((1, 2, 9, 9), [7, 7], pads=[3, 3, 3, 3], specials=True),
    Case((1, 2, 5, 6, 6), [3, 3, 3], pads=[1] * 6, dtype=F16),
    Case((2, 2, 8, 10), [2, 3], strides=[2, 1], pads=[3, 1, 3, 1], dtype=F64),
    Case((1, 2, 9, 9), [3, 3], pads=[1, 1, 1, 1], scale=3e37),
]
for _i, _c in enumerate(BLOCK_CASES):
    _c.seed = 4000 + _i


@pytest.mark.parametrize("kind", ["average", "lp"])
@pytest.mark.parametrize("case", BLOCK_CASES, ids=ids(BLOCK_CASES))
def test_row_blocks_give_the_bits_of_rows_taken_one_at_a_time(kind, case, monkeypatch):
    from poolfold.ops import averaging

    rows_kernel = averaging.window_rows
    x = case.data()

    def run(one_at_a_time: bool):
        ran = []

        def rows(*args):
            ran.append(True)
            *arguments, start, stop = args
            if not one_at_a_time:
                return rows_kernel(*args)
            for item in range(start, stop):
                rows_kernel(*arguments, item, item + 1)

        fresh_launches(monkeypatch)
        monkeypatch.setattr(averaging, "takes_plane_lanes", lambda *args: False)
        monkeypatch.setattr(averaging, "window_rows", rows)
        got = pooled(kind, case, x)
        return got, bool(ran)

    in_blocks, ran = run(False)
    one_by_one, _ = run(True)
    assert ran or kind == "lp"  # every case's average takes the row kernel
    assert in_blocks.tobytes() == one_by_one.tobytes()
    want, info = pooled(kind, case, x, by=oracle)
    oracle.assert_within_bound(in_blocks, want, info, case.dtype, kind)


# Small channels-first planes summed many at once as lanes (averaging.takes_plane_lanes): the
# row kernel's sums, bit for bit, wherever the row kernel would run.  Enough planes for a
# few blocks of lanes and a partial last one; NaN and inf, and sums that overflow float32
# (their float64 path), in the lanes as in the rows.
LANE_CASES = [
    Case((2, 9, 7, 7), [3, 3], strides=[1, 1], pads=[1, 1, 1, 1], count_include_pad=1),
    Case((1, 40, 6, 5), [2, 3], strides=[2, 1], pads=[0, 1, 1, 0], ceil_mode=1, dtype=F16),
    Case((1, 33, 7, 6), [3, 2], strides=[1, 2], dilations=[2, 1], dtype=BF16, specials=True),
    Case((1, 17, 4, 4, 4), [2, 2, 2], pads=[1] * 6, dtype=F64),
    Case((3, 7, 7, 7), [3, 3], strides=[2, 2], auto_pad="SAME_UPPER", specials=True),
    Case((1, 20, 7, 7), [7, 7], pads=[3, 3, 3, 3], scale=3e37),
    Case((1, 70, 3, 5), [1, 3], pads=[0, 9, 0, 9], count_include_pad=1),  # empty windows
]
for _i, _c in enumerate(LANE_CASES):
    _c.seed = 3000 + _i


@pytest.mark.parametrize("kind", ["average", "lp"])
@pytest.mark.parametrize("case", LANE_CASES, ids=ids(LANE_CASES))
def test_plane_lanes_sum_as_the_rows_do(kind, case, monkeypatch):
    from poolfold.ops import averaging

    rows_kernel, lanes_kernel = averaging.window_rows, averaging.sum_plane_lanes
    x = case.data()

    def run(lanes: bool):
        ran = []
        fresh_launches(monkeypatch)
        monkeypatch.setattr(averaging, "takes_plane_lanes",
                            lambda plan, itemsize, channels, planes: lanes and channels == 1)
        monkeypatch.setattr(averaging, "window_rows",
                            lambda *args: ran.append("rows") or rows_kernel(*args))
        monkeypatch.setattr(averaging, "sum_plane_lanes",
                            lambda *args: ran.append("lanes") or lanes_kernel(*args))
        got = pooled(kind, case, x)
        return got, set(ran)

    by_rows, rows_ran = run(False)
    by_lanes, lanes_ran = run(True)
    assert lanes_ran == ({"lanes"} if rows_ran == {"rows"} else rows_ran)
    assert by_lanes.dtype == by_rows.dtype and by_lanes.shape == by_rows.shape
    assert by_lanes.tobytes() == by_rows.tobytes()
    want, info = pooled(kind, case, x, by=oracle)
    oracle.assert_within_bound(by_lanes, want, info, case.dtype, kind)


# Windows too large for the row sums, channels-first, spatial rank 1 to 3, X of at most 4
# bytes: the block sums (kernels/window_blocks.py).  Axes by blocks and window by window,
# strides, dilations (several phases), pads, ceil mode, both divisors, empty windows, NaN and
# inf, a partial group of rows (fewer than a vector's worth), rows longer than a segment,
# sums that would overflow float32.
BLOCK_SUM_CASES = [
    Case((1, 3, 300), [70], name="1d-running"),
    Case((2, 5, 1500), [100], strides=[3], pads=[10, 40], dtype=F16, name="1d-segments"),
    Case((1, 9, 700), [65], strides=[65], ceil_mode=1, count_include_pad=1,
         pads=[3, 30], name="1d-direct"),
    Case((1, 2, 600), [66], dilations=[3], auto_pad="SAME_UPPER", specials=True,
         name="1d-phases"),
    Case((1, 2, 40, 37), [31, 31], auto_pad="SAME_UPPER", specials=True, name="2d-running"),
    Case((2, 3, 30, 41), [25, 7], strides=[2, 3], pads=[3, 4, 5, 6], ceil_mode=1,
         count_include_pad=1, dtype=BF16, name="2d-mixed"),
    Case((1, 2, 80, 29), [25, 9], dilations=[3, 2], pads=[2, 5, 3, 1], name="2d-phases"),
    Case((1, 1, 9, 8), [30, 30], pads=[15, 15, 15, 15], name="2d-empty-windows"),
    Case((1, 3, 20, 140), [5, 70], pads=[2, 30, 2, 30], scale=3e37, name="2d-large-values"),
    Case((1, 2, 11, 12, 13), [7, 7, 7], auto_pad="SAME_UPPER", dtype=F16, specials=True,
         name="3d-running"),
    Case((1, 2, 12, 13, 14), [5, 9, 3], strides=[2, 1, 2], pads=[1, 2, 3, 4, 5, 6],
         count_include_pad=1, name="3d-mixed"),
    Case((1, 1, 9, 10, 21), [5, 7, 9], dilations=[2, 1, 2], ceil_mode=1, strides=[2, 2, 1],
         dtype=BF16, name="3d-phases"),
    # pads past the window: whole blocks of the leading axes hold no input (before and
    # after the data), windows start in them, some hold padding only
    Case((1, 2, 20, 30), [7, 30], pads=[16, 2, 17, 3], specials=True,
         name="2d-blocks-in-padding"),
    Case((1, 1, 12, 9, 40), [9, 8, 40], dilations=[2, 1, 1], strides=[1, 2, 1],
         pads=[20, 9, 3, 19, 10, 4], ceil_mode=1, count_include_pad=1, dtype=F16,
         name="3d-blocks-in-padding"),
]
for _i, _c in enumerate(BLOCK_SUM_CASES):
    _c.seed = 5000 + _i


def block_sum_calls(monkeypatch, arguments: list | None = None) -> list:
    """The ``dims`` table of each block-sums kernel call from now on (fresh launches), and
    into ``arguments`` each call's arguments."""
    from poolfold.ops import averaging

    ran = []
    kernels = averaging.BLOCK_SUM_KERNELS

    def record(args):
        ran.append(args[3])
        if arguments is not None:
            arguments.append(args)

    fresh_launches(monkeypatch)
    monkeypatch.setattr(averaging, "BLOCK_SUM_KERNELS", {
        rank: (lambda *args, kernel=kernel: record(args) or kernel(*args))
        for rank, kernel in kernels.items()})
    return ran


@pytest.mark.parametrize("kind", ["average", "lp"])
@pytest.mark.parametrize("case", BLOCK_SUM_CASES, ids=ids(BLOCK_SUM_CASES))
def test_block_sums_match_oracle(kind, case, monkeypatch):
    ran = block_sum_calls(monkeypatch)
    x = case.data()
    if kind == "lp":
        case = Case(**{**case.__dict__, "count_include_pad": 0, "p": 1 + case.seed % 3})
    got = pooled(kind, case, x)
    assert ran, "the block sums did not run"
    dims = ran[0]
    assert dims[window_blocks.RUNNING].any() or "direct" in case.name or "phases" in case.name
    want, info = pooled(kind, case, x, by=oracle)
    oracle.assert_within_bound(got, want, info, case.dtype, kind)


@pytest.mark.parametrize("kind", ["average", "lp"])
@pytest.mark.parametrize("case", [c for c in BLOCK_SUM_CASES if len(c.shape) > 3],
                         ids=ids([c for c in BLOCK_SUM_CASES if len(c.shape) > 3]))
def test_block_sums_in_bands_have_the_planes_bits(kind, case, monkeypatch):
    """A plane cut into bands of its first axis's outputs (work items for idle threads:
    averaging.block_bands), and a band into passes (averaging.block_pass_outputs: bounded
    scratch), gives each window the bits of the whole plane's, every band's and pass's
    blocks placed as the plane's; 2, 3 and 5 bands (more than some planes' outputs), passes
    of 1, 2 and 3 outputs, against one band in one pass, and the oracle.  Values over 24
    binades: sums grouped otherwise round otherwise."""
    from poolfold.ops import averaging

    x = case.data()
    spread = 2.0 ** np.random.default_rng(case.seed).integers(-12, 12, x.shape)
    with np.errstate(over="ignore"):  # float16: some infinities
        x = (x.astype(np.float64) * spread).astype(x.dtype)
    if kind == "lp":
        case = Case(**{**case.__dict__, "count_include_pad": 0, "p": 1 + case.seed % 3})
    whole = 1 << 30  # outputs a pass: the kernels' scratch is sized by it, so capped below
    results = {}
    for bands, at_once in ((1, whole), (2, whole), (3, whole), (5, whole), (1, 1), (1, 2),
                           (2, 3), (3, 1)):
        arguments = []
        ran = block_sum_calls(monkeypatch, arguments)
        monkeypatch.setattr(averaging, "block_bands", lambda *args, bands=bands: bands)
        monkeypatch.setattr(averaging, "block_pass_outputs",
                            lambda plan, size, at_once=at_once: min(at_once, plan.out_shape[0]))
        results[bands, at_once] = got = pooled(kind, case, x)
        assert ran, "the block sums did not run"
        assert arguments[0][-3:-2] == (min(at_once, got.shape[2]),), "not the passes asked"
    for split, got in results.items():
        assert got.tobytes() == results[1, whole].tobytes(), split
    want, info = pooled(kind, case, x, by=oracle)
    oracle.assert_within_bound(results[3, whole], want, info, case.dtype, kind)
    oracle.assert_within_bound(results[2, 3], want, info, case.dtype, kind)


def test_block_bands_give_idle_threads_work():
    """Bands only where planes are fewer than threads, enough for every thread, each band at
    least BAND_LEAST_SPANS windows' spans of outputs."""
    from poolfold.ops import averaging
    from poolfold.ops.max_pool import resolve_plan

    spec = poolfold.schema.resolve("AveragePool", None)

    def bands(shape, kernel, planes, threads, **kw):
        plan = resolve_plan(spec, (1, 1) + shape, kernel, kw.get("strides"), kw.get("pads"),
                            kw.get("dilations"), kw.get("auto_pad", "NOTSET"), 0)
        return averaging.block_bands(plan, planes, threads)

    assert bands((256, 256, 256), [7, 7, 7], 1, 2) == 2
    assert bands((256, 256, 256), [7, 7, 7], 3, 8) == 3  # 9 items on 8 threads
    assert bands((256, 256, 256), [7, 7, 7], 2, 2) == 1
    assert bands((64, 64, 64), [63, 63, 63], 1, 4) == 1  # 64 outputs: not 4 spans of 63
    assert bands((1024, 1024), [31, 31], 1, 16) == 8  # 1024 // (4 * 31)
    assert bands((1024, 1024), [15, 15], 1, 16, dilations=[2, 1]) == 8  # span 29
    assert bands((1024,), [63], 1, 16) == 1  # 1-D rows are items already


def test_block_passes_keep_the_first_axis_sums_small():
    """A pass takes as many first-axis outputs as keep their sums within PASS_BYTES (512
    KiB), at least BAND_LEAST_SPANS windows' spans, at most the axis's outputs."""
    from poolfold.ops import averaging
    from poolfold.ops.max_pool import resolve_plan

    assert averaging.PASS_BYTES == 512 * 1024 and averaging.BAND_LEAST_SPANS == 4
    spec = poolfold.schema.resolve("AveragePool", None)

    def at_once(shape, kernel, itemsize=4, **kw):
        plan = resolve_plan(spec, (1, 1) + shape, kernel, kw.get("strides"), None,
                            kw.get("dilations"), "SAME_UPPER", 0)
        return averaging.block_pass_outputs(plan, itemsize)

    assert at_once((1024, 1024), [15, 15]) == 524288 // ((1024 + 14) * 4)  # 126 rows
    assert at_once((1024, 1024), [15, 15], itemsize=8) == 524288 // ((1024 + 14) * 8)
    assert at_once((1024, 1024), [63, 63]) == 4 * 63  # the least: four spans
    assert at_once((1024, 1024), [15, 15], dilations=[3, 1]) == 4 * 43
    assert at_once((1024, 1024), [16, 16], strides=[4, 4]) == 524288 // (1036 * 4)
    assert at_once((1024, 1024), [64, 64], strides=[2, 2]) == 4 * 64 // 2  # not 120
    assert at_once((256, 256, 256), [7, 7, 7]) == 28  # 7 MiB, not 64
    assert at_once((64, 64, 64), [7, 7, 7]) == 32  # 16 KiB slices
    assert at_once((64, 64, 64), [63, 63, 63]) == 64  # the axis's outputs
    assert at_once((1024,), [63]) == 1  # 1-D rows are items


# 1-D averages whose windows overlap enough go to the block sums, which sum the row by
# doubling (ops/averaging.py, doubles_rows); the rest stay with the row sums.
DOUBLED_ROW_CASES = [
    (Case((2, 3, 500), [3], auto_pad="SAME_UPPER", specials=True, name="k3"), True),
    (Case((1, 4, 700), [20], strides=[4], pads=[3, 3], dtype=F16, name="k20-s4"), True),
    (Case((1, 4, 700), [9], strides=[2], pads=[3, 3], name="k9-s2"), False),
    (Case((1, 2, 2100), [2], count_include_pad=1, pads=[1, 0], dtype=BF16, specials=True,
          name="k2-segments"), True),
    (Case((1, 3, 300), [13], dilations=[2], strides=[5], ceil_mode=1, pads=[4, 9],
          name="k13-d2-s5"), True),
    (Case((1, 3, 300), [3], strides=[2], name="k3-s2"), False),
]
for _i, (_c, _) in enumerate(DOUBLED_ROW_CASES):
    _c.seed = 5100 + _i


@pytest.mark.parametrize("case, doubled", DOUBLED_ROW_CASES,
                         ids=[c.name for c, _ in DOUBLED_ROW_CASES])
def test_short_1d_windows_are_summed_by_doubling(case, doubled, monkeypatch):
    ran = block_sum_calls(monkeypatch)
    x = case.data()
    got = pooled("average", case, x)
    assert bool(ran) == doubled
    if doubled:
        assert ran[0][window_blocks.RUNNING, 0] == 1
    want, info = pooled("average", case, x, by=oracle)
    oracle.assert_within_bound(got, want, info, case.dtype, "average")


# Windows of 2 or 3 axes with BLOCK_MIN_TAPS taps or more go to the block sums though the
# row sums could take them (ops/averaging.py, takes_block_sums); smaller ones stay with the
# row sums.
WIDE_WINDOW_CASES = [
    (Case((1, 3, 40, 37), [13, 13], auto_pad="SAME_UPPER", specials=True, name="13x13"), True),
    (Case((2, 2, 30, 33), [8, 16], strides=[1, 2], pads=[2, 3, 4, 5], dtype=F16,
          name="8x16-s2"), True),
    (Case((1, 2, 9, 10, 40), [4, 4, 15], auto_pad="SAME_LOWER", dtype=BF16, name="4x4x15"),
     True),
    (Case((1, 3, 40, 37), [11, 11], auto_pad="SAME_UPPER", name="11x11"), False),
    (Case((1, 2, 12, 13, 14), [3, 5, 5], auto_pad="SAME_UPPER", name="3x5x5"), False),
]
for _i, (_c, _) in enumerate(WIDE_WINDOW_CASES):
    _c.seed = 5200 + _i


@pytest.mark.parametrize("case, blocks", WIDE_WINDOW_CASES,
                         ids=[c.name for c, _ in WIDE_WINDOW_CASES])
def test_windows_of_many_taps_take_the_block_sums(case, blocks, monkeypatch):
    from poolfold.ops import averaging

    assert (math.prod(case.kernel) >= averaging.BLOCK_MIN_TAPS) == blocks
    ran = block_sum_calls(monkeypatch)
    x = case.data()
    got = pooled("average", case, x)
    assert bool(ran) == blocks
    want, info = pooled("average", case, x, by=oracle)
    oracle.assert_within_bound(got, want, info, case.dtype, "average")


@pytest.mark.parametrize("shape, kernel", [((2, 3, 900), [70]), ((1, 2, 40, 50), [25, 31]),
                                           ((1, 2, 20, 21, 22), [9, 9, 9])])
@pytest.mark.parametrize("dtype", [np.float32, np.float16, ml_dtypes.bfloat16])
def test_block_sums_past_float32_are_taken_again_in_float64(shape, kernel, dtype):
    """Averages by block sums add float32; where a window's float32 sum overflows (values
    near float32's largest, whose average is one of them), or holds an inf or a NaN, the
    window is summed again in float64: the average is the oracle's, not inf or NaN, and the
    other planes keep their float32 sums."""
    rng = np.random.default_rng(sum(shape))
    big = {np.float32: 3.0e37, np.float16: 6.0e4}.get(dtype, 3.0e37)
    x = (rng.random(shape) * big).astype(dtype)  # positive: every window's sum overflows
    x[-1] = rng.standard_normal(shape[1:]).astype(dtype)  # a plane of ordinary values
    x[0, 0].flat[7] = np.inf
    x[0, 0].flat[300] = np.nan
    case = Case(shape, kernel, auto_pad="SAME_UPPER", dtype=np.dtype(dtype))
    got = pooled("average", case, x)
    want, info = pooled("average", case, x, by=oracle)
    oracle.assert_within_bound(got, want, info, np.dtype(dtype), "average")
    assert np.isfinite(got[:, 1:].astype(np.float32)).all()
    assert not np.isfinite(got[0, 0].astype(np.float32)).all()


@pytest.mark.parametrize("rank", [1, 2])
def test_block_sums_of_a_row_do_not_depend_on_its_segments(rank):
    """A long row's last axis is summed by doubling a segment at a time: each window's sum
    is grouped by its taps' places in the window alone, so it has the bits of the same
    window in a short row (one segment) that starts anywhere.  A stride; small integers
    among values of 2^60 (exact in float32), so that how a window's sum is grouped shows in
    Y (2^60 + 1 is 2^60 in float64), where the rounding of ordinary values would vanish in
    Y's float32."""
    rng = np.random.default_rng(7)
    shape = (1, 9) + (3,) * (rank - 1) + (6000,)
    x = rng.integers(-3, 4, shape).astype(np.float32)
    big = rng.random(shape) < 0.05
    x[big] = np.where(rng.random(int(big.sum())) < 0.5, -2.0 ** 60, 2.0 ** 60)
    x[0, 2, ..., 1234] = np.nan
    k, s, m = 71, 2, 60  # m outputs: fewer than a segment holds
    kernel, strides = [1] * (rank - 1) + [k], [1] * (rank - 1) + [s]
    assert window_blocks.segments(k, 1, True, 6000)[window_blocks.STARTS] > (m - 1) * s
    whole = poolfold.average_pool(x, kernel, strides=strides)
    for start in (0, 2, 36, 2 * k, 1030, 2052, 4000):  # even: a window of the whole row's
        short = poolfold.average_pool(x[..., start:start + (m - 1) * s + k], kernel,
                                      strides=strides)
        o = start // s
        assert short.tobytes() == whole[..., o:o + m].tobytes(), start


# The last axis's rows share their padding (window_blocks.row_pitch) where one row's windows
# reach past its inputs: symmetric, lopsided both ways, and padding longer than the row.
SHARED_PADDING_CASES = [
    Case((1, 2, 20, 9), [16, 9], auto_pad="SAME_UPPER", name="2d-same"),
    Case((1, 2, 40, 11), [16, 8], pads=[0, 7, 1, 2], name="2d-more-before"),
    Case((1, 2, 40, 11), [16, 8], pads=[1, 2, 0, 7], name="2d-more-after"),
    Case((1, 1, 30, 7), [22, 6], pads=[1, 9, 1, 12], count_include_pad=1, name="2d-past-row"),
    Case((1, 2, 6, 5, 9), [4, 4, 9], pads=[1, 0, 2, 1, 1, 6], name="3d-lopsided"),
    Case((1, 1, 6, 6, 7), [4, 5, 7], dilations=[1, 1, 2], auto_pad="SAME_LOWER", dtype=F16,
         name="3d-dilated"),
]


@pytest.mark.parametrize("case", SHARED_PADDING_CASES, ids=ids(SHARED_PADDING_CASES))
def test_rows_sharing_their_padding_keep_to_their_own_inputs(case, monkeypatch):
    """Each row's first and last inputs are an inf, a -inf or a NaN: a window that read a
    neighbouring row's inputs through the padding the rows share would hold one and give
    inf or NaN where the oracle's average is finite (or the other way round)."""
    arguments = []
    block_sum_calls(monkeypatch, arguments)
    x = case.data()
    x[..., 0] = np.inf
    x[..., -1] = -np.inf
    x[..., 1, 0] = np.nan
    got = pooled("average", case, x)
    dims = arguments[0][3]
    last = dims.shape[1] - 1
    assert dims[window_blocks.RUNNING, last] == 1
    pad, length = dims[window_blocks.PAD_BEGIN, last], dims[window_blocks.PADDED, last]
    assert window_blocks.row_pitch(pad, length, dims[window_blocks.N, last],
                                   dims[window_blocks.OUT, last]) < length
    want, info = pooled("average", case, x, by=oracle)
    oracle.assert_within_bound(got, want, info, case.dtype, "average")


def test_block_inputs_bound_the_leading_axis_cache():
    """A leading axis by blocks sizes its steps of columns by the most inputs one block
    holds (at least the suffixes it takes): counted here position by position, every
    phase's blocks of k taps from where the row's blocks start, OFFSET positions before its
    first position (inputs there too where the row starts past the first input)."""
    rng = np.random.default_rng(11)
    for _ in range(300):
        n, k, d = int(rng.integers(1, 40)), int(rng.integers(2, 20)), int(rng.integers(1, 4))
        pad, offset = int(rng.integers(-5, 25)), int(rng.integers(0, k * d))
        length = int(rng.integers(1, 90))
        held = {}  # (phase, block) -> inputs
        for j in range(length + offset):  # positions from the blocks' start
            if 0 <= j - offset - pad < n:
                key = (j % d, j // d // k)
                held[key] = held.get(key, 0) + 1
        want = max(held.values(), default=0)
        got = window_blocks._inputs_a_block_holds(n, k, d, pad, length, offset)
        assert got == want, (n, k, d, pad, length, offset)
    assert window_blocks._inputs_a_block_holds(64, 63, 1, 31, 126, 0) == 32


def test_block_programs_fit_their_room_and_are_made_anew_for_new_arguments():
    """A leading axis's block program never holds more entries than ``program_room`` leaves
    for them (its kernels allocate that much; numba checks no bounds), over random axes
    (strides, dilations, pads past either end, offsets of a slab's blocks); a program kept
    for one axis's arguments is made anew for another's, entry for entry as a fresh one."""
    rng = np.random.default_rng(12)
    fields = window_blocks.PROGRAM_FIELDS
    kept = window_blocks.new_program(1 << 16)
    for _ in range(400):
        k, s, d = int(rng.integers(2, 20)), int(rng.integers(1, 5)), int(rng.integers(1, 4))
        out = int(rng.integers(1, 60))
        length = window_blocks.padded_length(out, k, s, d)
        pad, n = int(rng.integers(-6, (k - 1) * d + 1)), int(rng.integers(1, 80))
        offset, w, width = int(rng.integers(0, k * d)), 16 * int(rng.integers(1, 5)), 300
        room = window_blocks.program_room(length, out, k, d)
        fresh = window_blocks.new_program(1 << 16)
        args = (7, width, w, n, k, s, d, pad, length, offset, out)
        entries = window_blocks._block_program(fresh, *args)
        assert 0 < entries and window_blocks.PROGRAM_AT + entries * fields <= room, args
        assert window_blocks._block_program(kept, *args) == entries
        used = window_blocks.PROGRAM_AT + entries * fields
        assert np.array_equal(kept[:used], fresh[:used]), args
    assert window_blocks._block_program(kept, *args) == entries  # kept as it is


def test_block_sums_windows_between_grouped_rows_change_no_average(monkeypatch):
    """Short rows have their last axis's levels taken several rows at a time, as one row;
    averages then sum each row's own windows alone, so the windows that start between one
    row's outputs and the next's, which add values of both, are never summed for them.
    Where such a window would overflow float32 (the last input of one row and the first of
    the next, 3e38 each, 32 positions apart, while each output's window holds one of them),
    the plane is not marked for the float64 redo, and every average is finite, within the
    oracle's bound."""
    arguments = []
    ran = block_sum_calls(monkeypatch, arguments)
    x = np.zeros((1, 2, 8, 64), np.float32)
    x[0, :, 2, -1] = x[0, :, 3, 0] = np.float32(3e38)
    x[0, 1, :, :] += np.linspace(0, 1, 512, dtype=np.float32).reshape(8, 64)
    case = Case(x.shape, [63, 63], auto_pad="SAME_UPPER")
    got = pooled("average", case, x)
    assert ran and not arguments[0][2].any(), "a window between rows was summed"
    assert np.isfinite(got).all()
    want, info = pooled("average", case, x, by=oracle)
    oracle.assert_within_bound(got, want, info, case.dtype, "average")


def test_block_sums_store_one_nan():
    """Which of two NaNs an x86 sum keeps depends on the order of its operands, which LLVM
    may choose: the block sums store every NaN as one quiet NaN."""
    x = np.zeros((1, 8, 200), np.float32)
    x[:, :, 50] = np.float32(-np.nan)
    x[:, :, 51] = np.frombuffer(np.uint32(0x7FC01234).tobytes(), np.float32)[0]
    y = poolfold.average_pool(x, [70], auto_pad="SAME_UPPER")
    bits = y.view(np.uint32)[np.isnan(y)]
    assert bits.size and (bits == np.float32(np.nan).view(np.uint32)).all()


@pytest.mark.parametrize("lanes", [False, True], ids=["rows", "lanes"])
@pytest.mark.parametrize("kind", ["average", "lp"])
def test_row_sums_store_one_nan(kind, lanes, monkeypatch):
    """The row sums (and the plane lanes, which run them) store every NaN of a window that
    holds NaNs of both signs, or a NaN and inf + -inf, as one quiet NaN, as the block sums
    do: which NaN a sum keeps otherwise follows the order LLVM gives its operands, and that
    differs between the row and lane kernels' compiles."""
    from poolfold.ops import averaging

    fresh_launches(monkeypatch)
    monkeypatch.setattr(averaging, "takes_plane_lanes",
                        lambda plan, itemsize, channels, planes: lanes and channels == 1)
    x = np.ones((1, 70, 6, 6), np.float32)
    x[0, :, 1, 1], x[0, :, 1, 2] = np.float32(-np.nan), np.float32(np.nan)
    x[0, :, 4, 1], x[0, :, 4, 2], x[0, :, 4, 3] = np.inf, -np.inf, np.float32(-np.nan)
    case = Case(x.shape, [3, 3], pads=[1, 1, 1, 1])
    y = pooled(kind, case, x)
    nan = np.isnan(y)
    # the NaNs' windows, and inf + -inf's (LpPool adds inf^2 twice: no NaN)
    first = 2 if kind == "lp" else 1
    assert nan[0, :, 0:3, 0:4].all() and nan[0, :, 3:6, first:5].all()
    assert not nan[0, :, 0:3, 4:].any() and not nan[0, :, 3:6, :first].any()
    assert (y.view(np.uint32)[nan] == np.float32(np.nan).view(np.uint32)).all()


def test_plane_lanes_chosen_for_many_small_planes():
    from poolfold import schema
    from poolfold.ops import averaging
    from poolfold.ops.max_pool import resolve_plan

    def chosen(shape, kernel, strides=None, itemsize=4, channels=1):
        plan = resolve_plan(schema.resolve("AveragePool", None), shape, kernel, strides,
                            [1] * 2 * len(kernel), None, "NOTSET", 0)
        return averaging.takes_plane_lanes(plan, itemsize, channels, shape[0] * shape[1])

    assert chosen((1, 2048, 8, 8), [3, 3])  # Inception's last average pools
    assert chosen((1, 768, 17, 17), [3, 3]) and chosen((1, 16, 24, 24), [3, 3])
    assert chosen((1, 64, 8, 8, 8), [3, 3, 3])
    assert not chosen((1, 192, 35, 35), [3, 3])  # rows long enough for the row blocks
    assert not chosen((1, 192, 35, 35), [3, 3], [2, 2])
    assert chosen((1, 64, 30, 30), [2, 2])  # rows with more outputs than n / s
    assert not chosen((1, 64, 60, 60), [2, 2])  # ...but planes too large
    assert not chosen((1, 64, 56, 56), [3, 3], [2, 2])  # planes large enough for their rows
    assert not chosen((1, 8, 8, 8), [3, 3])  # too few planes for a vector of lanes
    assert not chosen((1, 256, 200), [3])  # 1-D: one row, long enough alone
    assert not chosen((1, 64, 8, 8), [3, 3], channels=64)  # channels-last
    assert chosen((1, 64, 16, 16), [3, 3], itemsize=8)
    assert not chosen((1, 64, 17, 17), [3, 3], itemsize=8)


def test_row_blocks_pitch_and_a_stride_far_beyond_the_row():
    """A block's rows lie at the row's length rounded up to the stride, only where two rows
    fit a block: a stride of 10**12 over a row of 10 (one output a row) once made the row
    kernel's scratch 10**12 elements long."""
    from poolfold.kernels.window_rows import block_pitch

    assert block_pitch(35, 2, 18) == 36 and block_pitch(56, 2, 28) == 56
    assert block_pitch(35, 2, 19) == 0  # more outputs than the pitch holds
    assert block_pitch(1500, 1, 1500) == 0  # two rows would not fit a block
    assert block_pitch(10, 10**12, 1) == 0
    x = make_data((1, 2, 3, 10), F32, 7)
    for op in ("average", "lp"):
        function = poolfold.average_pool if op == "average" else poolfold.lp_pool
        want, info = (oracle.average_pool if op == "average" else oracle.lp_pool)(
            x, [1, 2], strides=[1, 10**12])
        got = function(x, [1, 2], strides=[1, 10**12])
        oracle.assert_within_bound(got, want, info, F32, op)



# Averages whose sums are exact in float32 (small integers) are the float32 nearest the exact
# average: the row kernel scales a float32 sum by its factor split in two float32, within
# 2^-47 of the product (window_rows' module doc), where these averages lie at least 2^-28 from
# a tie.  One float32 factor (1/9 rounded to float32) would miss the nearest value in about a
# quarter of such outputs, which the contract's bound would still let through.  The plan's
# table of factors (a block of short rows, cut windows), its one factor (count_include_pad,
# or no cut window: a small plane, and one past the table's size), rows one at a time (a
# stride far along the last axis, channels-last), 3-D, windows cut by padding, float16
# (rounded through float32, as the kernel stores it) and many small planes (the lanes).
NEAREST_CASES = [
    Case((1, 3, 7, 7), [3, 3], pads=[1, 1, 1, 1], count_include_pad=1),
    Case((1, 2, 95, 95), [3, 3], pads=[1, 1, 1, 1], count_include_pad=1),
    Case((1, 2, 12, 12), [3, 3], strides=[3, 3]),
    Case((1, 2, 7, 7), [3, 3], strides=[1, 1], pads=[2, 1, 2, 1]),
    Case((1, 2, 5, 40), [3, 3], strides=[1, 13], pads=[1, 1, 1, 1]),
    Case((2, 3, 4, 5, 6), [3, 2, 3], pads=[1, 1, 0, 1, 0, 1]),
    Case((1, 40, 6, 6), [3, 3], pads=[1, 1, 1, 1], count_include_pad=1),
    Case((1, 3, 9, 9), [3, 3], strides=[2, 2], ceil_mode=1, dtype=F16),
]


@pytest.mark.parametrize("channels_last", [False, True])
@pytest.mark.parametrize("case", NEAREST_CASES, ids=ids(NEAREST_CASES))
def test_float32_averages_are_the_nearest_float32_to_the_exact_average(case, channels_last):
    x = np.random.default_rng(77).integers(-20, 21, case.shape).astype(case.dtype)
    want, _ = oracle.average_pool(x, case.kernel, count_include_pad=case.count_include_pad,
                                  **case.geometry)
    nearest = np.asarray(want, np.float64).astype(np.float32).astype(case.dtype)
    if channels_last:
        got = np.moveaxis(poolfold.nhwc.average_pool(
            np.ascontiguousarray(np.moveaxis(x, 1, -1)), case.kernel,
            count_include_pad=case.count_include_pad, **case.geometry), -1, 1)
    else:
        got = poolfold.average_pool(x, case.kernel, count_include_pad=case.count_include_pad,
                                    **case.geometry)
    assert got.dtype == case.dtype
    np.testing.assert_array_equal(got, nearest)

def test_average_pool_defaults():
    """Only kernel_shape: strides 1, no pads, count_include_pad 0, floor mode."""
    x = make_data((2, 3, 6, 5), F32, 5)
    want, info = oracle.average_pool(x, [2, 3])
    oracle.assert_within_bound(poolfold.average_pool(x, [2, 3]), want, info, F32, "average")
    want, info = oracle.lp_pool(x, [2, 3])  # p = 2
    oracle.assert_within_bound(poolfold.lp_pool(x, [2, 3]), want, info, F32, "lp")


@pytest.mark.parametrize("op", ["average", "lp"])
def test_unusual_memory_layouts(op):
    """A transposed, strided, read-only view is read by its values, not its buffer."""
    base = make_data((6, 7, 3, 2), F32, 11, specials=True)
    x = base.transpose(3, 2, 1, 0)[:, :, ::2, 1:]  # (2, 3, 4, 5), not contiguous
    x.flags.writeable = False
    kw = dict(strides=[2, 1], pads=[1, 0, 1, 2], ceil_mode=1)
    if op == "average":
        want, info = oracle.average_pool(x, [3, 2], count_include_pad=1, **kw)
        got = poolfold.average_pool(x, [3, 2], count_include_pad=1, **kw)
    else:
        want, info = oracle.lp_pool(x, [3, 2], p=3, **kw)
        got = poolfold.lp_pool(x, [3, 2], p=3, **kw)
    oracle.assert_within_bound(got, want, info, F32, op)


@pytest.mark.parametrize("shape", [(0, 3, 5, 4), (2, 0, 5, 4), (0, 0, 5)])
@pytest.mark.parametrize("dtype", [F32, BF16])
def test_empty_batches(shape, dtype):
    """N = 0 or C = 0: an empty output of the right shape and type."""
    x = np.zeros(shape, dtype=dtype)
    kernel = [2] * (len(shape) - 2)
    for fn, ofn in ((poolfold.average_pool, oracle.average_pool),
                    (poolfold.lp_pool, oracle.lp_pool)):
        want, _ = ofn(x, kernel, strides=[2] * len(kernel), ceil_mode=1)
        got = fn(x, kernel, strides=[2] * len(kernel), ceil_mode=1)
        assert got.dtype == dtype and got.shape == want.shape, (got.dtype, got.shape)
    for fn in (poolfold.global_max_pool, poolfold.global_average_pool, poolfold.global_lp_pool):
        got = fn(x)
        assert got.dtype == dtype and got.shape == shape[:2] + (1,) * (len(shape) - 2)


@pytest.mark.parametrize("dtype", FLOATS)
def test_every_window_empty(dtype):
    """Windows made only of padding: AveragePool NaN (count_include_pad 0) or 0 (1); LpPool 0."""
    x = make_data((1, 2, 3), dtype, 3)
    kw = dict(pads=[4, 4], strides=[3])  # windows at -4, -1, 2, 5: two empty
    for cip in (0, 1):
        want, info = oracle.average_pool(x, [2], count_include_pad=cip, **kw)
        assert np.isnan(want).any() == (cip == 0)
        got = poolfold.average_pool(x, [2], count_include_pad=cip, **kw)
        oracle.assert_within_bound(got, want, info, dtype, "average")
    want, info = oracle.lp_pool(x, [2], **kw)
    oracle.assert_within_bound(poolfold.lp_pool(x, [2], **kw), want, info, dtype, "lp")


# ------------------------------------------------------------ magnitudes: no spurious overflow


LP_MAGNITUDE_CASES = [
    # (dtype, value, p): |x|^p leaves the float32 (or float64) range, Y does not
    (F32, 1e20, 2), (F32, 1e20, 3), (F32, 3e38, 2), (F32, 1e-30, 2), (F32, 1e-30, 3),
    (F32, 1e-40, 2),  # subnormal inputs
    (F64, 1e200, 2), (F64, 1e200, 3), (F64, 1e-200, 2), (F64, 1e-300, 3),
    (BF16, 1e20, 2), (BF16, 1e30, 3), (BF16, 1e-30, 2),
    (F16, 300.0, 2), (F16, 30000.0, 3), (F16, 1e-3, 3), (F16, 6e-8, 2),
    (F16, 60000.0, 2),  # Y = 120000 is past float16's largest: inf (or the bound)
]


@pytest.mark.parametrize("dtype,value,p", LP_MAGNITUDE_CASES,
                         ids=[f"{d.name}-{v:g}-p{p}" for d, v, p in LP_MAGNITUDE_CASES])
def test_lp_pool_large_and_tiny(dtype, value, p):
    rng = np.random.default_rng(42)
    # a 3x3 plane of +-value times factors in [0.5, 1], and one window with a zero
    signs = rng.choice([-1.0, 1.0], size=(1, 2, 3, 3))
    x = (signs * value * rng.uniform(0.5, 1.0, size=(1, 2, 3, 3))).astype(dtype)
    x[0, 1, 0, 0] = 0
    kw = dict(pads=[0, 0, 1, 1], ceil_mode=0)
    want, info = oracle.lp_pool(x, [2, 2], p=p, **kw)
    oracle.assert_within_bound(poolfold.lp_pool(x, [2, 2], p=p, **kw), want, info, dtype, "lp")
    want, info = oracle.global_lp_pool(x, p=p)
    oracle.assert_within_bound(poolfold.global_lp_pool(x, p=p), want, info, dtype, "lp")


def test_lp_pool_mixed_magnitudes():
    """One window holding 1e20 and 1: the small term must not turn a finite Y into inf/NaN."""
    x = np.array([1e20, 1.0, -1e-20, 3e19, 0.0], dtype=np.float32).reshape(1, 1, 5)
    for p in (1, 2, 3):
        want, info = oracle.lp_pool(x, [2], p=p, pads=[1, 1])
        oracle.assert_within_bound(poolfold.lp_pool(x, [2], p=p, pads=[1, 1]), want, info, F32,
                                   "lp")


@pytest.mark.parametrize("dtype,value", [(F32, 3e38), (F64, 1.5e308), (F16, 60000.0),
                                         (BF16, 3e38)])
def test_average_pool_no_spurious_overflow(dtype, value):
    """The sum leaves T's (and float32's) range, the average does not: the contract's bound
    (|V| u max|x|) leaves no room for inf."""
    x = np.full((1, 1, 4, 4), value, dtype=dtype)
    x[0, 0, 0, 0] = -value
    want, info = oracle.average_pool(x, [3, 3], pads=[1, 1, 1, 1])
    assert np.isfinite(want).all()
    oracle.assert_within_bound(poolfold.average_pool(x, [3, 3], pads=[1, 1, 1, 1]), want, info,
                               dtype, "average")
    want, info = oracle.global_average_pool(x)
    oracle.assert_within_bound(poolfold.global_average_pool(x), want, info, dtype, "average")
    # GlobalAveragePool of planes of which some overflow, some hold inf or NaN and some
    # neither: only the first two kinds are added again, after the others
    x = np.full((2, 3, 4, 5), 1.5, dtype=dtype)
    x[0, 1], x[0, 1, 0, 0] = value, -value
    x[1, 0, 2, 2], x[1, 2, 1, 1] = np.inf, np.nan
    want, info = oracle.global_average_pool(x)
    assert np.isfinite(want[0]).all()
    oracle.assert_within_bound(poolfold.global_average_pool(x), want, info, dtype, "average")
    # Channels-last, and a row whose other windows hold small values, inf and NaN: the
    # float32 row sums redo only the windows that overflowed, the others keep their values.
    x = np.full((1, 2, 3, 40), 1.5, dtype=dtype)
    x[0, :, :, 3:6] = value
    x[0, 1, 1, 20] = np.inf
    x[0, 0, 2, 30] = np.nan
    x[0, 0, 0, 35], x[0, 0, 1, 36] = np.inf, -np.inf
    want, info = oracle.average_pool(x, [3, 3], pads=[1, 1, 1, 1])
    assert np.isfinite(want[0, :, :, 2:7]).all()
    oracle.assert_within_bound(poolfold.average_pool(x, [3, 3], pads=[1, 1, 1, 1]), want, info,
                               dtype, "average")
    if dtype != BF16:  # the nhwc domain has no bfloat16 AveragePool
        got = poolfold.nhwc.average_pool(np.moveaxis(x, 1, -1).copy(), [3, 3],
                                         pads=[1, 1, 1, 1])
        oracle.assert_within_bound(np.moveaxis(got, -1, 1), want, info, dtype, "average")
        # channels-last GlobalAveragePool of several channels (row sums over the positions)
        x = np.full((1, 3, 4, 5), value, dtype=dtype)
        x[0, 0, 0, 0] = -value
        x[0, 2, 1, 1] = np.nan
        want, info = oracle.global_average_pool(x)
        got = poolfold.nhwc.global_average_pool(np.moveaxis(x, 1, -1).copy())
        oracle.assert_within_bound(np.moveaxis(got, -1, 1), want, info, dtype, "average")


# --------------------------------------------------------------------------------------------
# versions
# --------------------------------------------------------------------------------------------

# (opset, what that version accepts beyond kernel/strides/pads/auto_pad)
AVERAGE_OPSETS = [(1, ()), (7, ("cip",)), (10, ("cip", "ceil")), (11, ("cip", "ceil")),
                  (19, ("cip", "ceil", "dil")), (22, ("cip", "ceil", "dil")),
                  (None, ("cip", "ceil", "dil"))]


@pytest.mark.parametrize("opset,has", AVERAGE_OPSETS)
def test_average_pool_versions(opset, has):
    x = make_data((1, 2, 7, 6), F16, 17, specials=True)
    kw = dict(strides=[2, 2], pads=[1, 1, 2, 1])
    full = dict(kw)
    if "cip" in has:
        full["count_include_pad"] = 1
    if "ceil" in has:
        full["ceil_mode"] = 1
    if "dil" in has:
        full["dilations"] = [2, 1]
    want, info = oracle.average_pool(x, [3, 2], **full)
    got = poolfold.average_pool(x, [3, 2], opset=opset, **full)
    oracle.assert_within_bound(got, want, info, F16, "average")


@pytest.mark.parametrize("opset,p", [(1, 1.5), (1, 2.0), (2, 2), (2, 3), (11, 1), (18, 3),
                                     (22, 2)])
def test_lp_pool_versions(opset, p):
    """LpPool-1 takes a float p; from version 2 p is an int.  ceil_mode / dilations from 18."""
    x = make_data((1, 2, 6, 7), F32, 23)
    kw = dict(strides=[2, 1], pads=[1, 0, 0, 2])
    if opset >= 18:
        kw.update(ceil_mode=1, dilations=[1, 2])
    want, info = oracle.lp_pool(x, [2, 3], p=p, **kw)
    oracle.assert_within_bound(poolfold.lp_pool(x, [2, 3], p=p, opset=opset, **kw), want, info,
                               F32, "lp")
    want, info = oracle.global_lp_pool(x, p=p)
    oracle.assert_within_bound(poolfold.global_lp_pool(x, p=p, opset=opset), want, info, F32,
                               "lp")


BELOW_ONE_CASES = [  # (shape, kernel, geometry)
    ((2, 3, 17), [5], dict(pads=[2, 1], strides=[2])),
    ((1, 2, 9, 8), [3, 4], dict(pads=[1, 0, 2, 1], strides=[2, 1])),
    ((1, 1, 5, 6, 4), [2, 3, 2], dict(pads=[0, 1, 0, 1, 0, 1])),
]


@pytest.mark.parametrize("p", [1e-300, 1e-6, 0.01, 0.05, 0.37, 0.999])
@pytest.mark.parametrize("dtype", [F64, F32])
@pytest.mark.parametrize("shape,kernel,geometry", BELOW_ONE_CASES,
                         ids=[f"{len(c[0]) - 2}d" for c in BELOW_ONE_CASES])
def test_lp_pool_1_below_p_one_meets_the_bound(shape, kernel, geometry, dtype, p):
    """LpPool-1 takes a float p, and below 1 its root magnifies the sum's rounding 1/p
    times: float64 sums of float64 |x|^p missed the bound by that much (8e-15 against
    1.1e-15 at p = 0.01).  Values over 400 decades, zeros, and one window of NaN and one of
    inf (in float64; float32 inputs have room at these p, summed in float64)."""
    rng = np.random.default_rng(int(p * 1e6) + len(shape))
    magnitude = 10.0 ** rng.uniform(-200, 200, shape) if dtype == F64 else 10.0 ** rng.uniform(
        -30, 30, shape)
    x = (rng.standard_normal(shape) * magnitude).astype(dtype)
    x.flat[3] = 0.0
    if dtype == F64:
        x[-1, -1].flat[-1] = np.nan
        x[0, 0].flat[-1] = -np.inf
    want, info = oracle.lp_pool(x, kernel, p=p, **geometry)
    got = poolfold.lp_pool(x, kernel, p=p, opset=1, **geometry)
    oracle.assert_within_bound(got, want, info, dtype, "lp")
    want, info = oracle.global_lp_pool(x, p=p)
    got = poolfold.global_lp_pool(x, p=p, opset=1)
    oracle.assert_within_bound(got, want, info, dtype, "lp")


def test_lp_pool_1_below_p_one_is_summed_in_double_doubles():
    """Which sums take the double-doubles: float64 at any p < 1 (the narrower types' bound
    has room, and they are summed in float64)."""
    from poolfold.ops.averaging import is_scaled, precise_sums

    assert precise_sums("lp", np.dtype(F64), 0.999) is not None
    assert precise_sums("lp", np.dtype(F64), 1.0) is None
    assert precise_sums("lp", np.dtype(F32), 2.0 ** -40) is None
    assert is_scaled("lp", np.dtype(F32), 2.0 ** -30)  # (see PLAIN_LP_MIN_P)
    assert not is_scaled("lp", np.dtype(F32), 0.1)
    assert precise_sums("average", np.dtype(F64), 0.5) is None


@pytest.mark.parametrize("dtype", [F32, F16])  # (bfloat16 from version 22: p an int)
def test_lp_pool_1_tiny_p_of_narrow_types_meets_the_bound(dtype):
    """Below p = 2^-29 a float64 sum of |x|^p's rounding times 1/p passes float32's bound
    (a window of one tap off by 2^-13 at p = 2^-40): the scaled sums give that tap's |x|
    exactly, and every window of two taps that are not zero is inf."""
    x = np.array([[[0.0, 3.0, 0.0, 1.0 + 2.0 ** -7, 0.75]]]).astype(dtype)
    for p in (2.0 ** -40, 2.0 ** -30, 2.0 ** -25):
        want, info = oracle.lp_pool(x, [2], p=p)
        got = poolfold.lp_pool(x, [2], p=p, opset=1)
        oracle.assert_within_bound(got, want, info, dtype, "lp")
        assert got[0, 0, 0] == 3.0 and got[0, 0, 1] == 3.0 and np.isinf(got[0, 0, 3])
        want, info = oracle.global_lp_pool(x[..., 1:2], p=p)
        got = poolfold.global_lp_pool(x[..., 1:2], p=p, opset=1)
        oracle.assert_within_bound(got, want, info, dtype, "lp")


# --------------------------------------------------------------------------------------------
# global ops
# --------------------------------------------------------------------------------------------

GLOBAL_OPS = [
    (poolfold.global_max_pool, oracle.global_max_pool, "max"),
    (poolfold.global_average_pool, oracle.global_average_pool, "average"),
    (poolfold.global_lp_pool, oracle.global_lp_pool, "lp"),
]
GLOBAL_SHAPES = [(2, 3, 7), (1, 2, 40), (2, 2, 5, 6), (1, 3, 3, 4, 5), (1, 2, 2, 3, 2, 3),
                 (1, 1, 64, 64), (2, 1, 1, 1), (1, 2, 0), (2, 1, 3, 0, 2)]


@pytest.mark.parametrize("shape", GLOBAL_SHAPES, ids=[str(list(s)) for s in GLOBAL_SHAPES])
@pytest.mark.parametrize("dtype", FLOATS)
def test_global_ops(shape, dtype):
    seed = sum(shape) * 7 + FLOATS.index(dtype)
    for specials in (False, True):
        x = make_data(shape, dtype, seed, specials=specials)
        for fn, ofn, kind in GLOBAL_OPS:
            want, info = ofn(x)
            got = fn(x)
            oracle.assert_within_bound(got, want, info, dtype, kind)
        for p in (1, 3):
            want, info = oracle.global_lp_pool(x, p=p)
            oracle.assert_within_bound(poolfold.global_lp_pool(x, p=p), want, info, dtype, "lp")


@pytest.mark.parametrize("opset", [1, 2, 21, 22, None])
def test_global_versions(opset):
    """GlobalMaxPool / GlobalAveragePool 1, 22; GlobalLpPool 1, 2, 22 (p = 2 by default)."""
    x = make_data((2, 2, 3, 4), F64, 29)
    for fn, ofn, kind in GLOBAL_OPS:
        want, info = ofn(x)
        oracle.assert_within_bound(fn(x, opset=opset), want, info, F64, kind)


def test_global_max_pool_nan_and_inf_rows():
    """Each channel its own case: NaN anywhere -> NaN; only -inf -> -inf; +inf -> +inf."""
    x = np.array([[1, 2, np.nan, 4], [-np.inf, -np.inf, -np.inf, -np.inf],
                  [np.inf, np.nan, 0, 1], [-1, np.inf, -np.inf, 5]], dtype=np.float32)
    x = x.reshape(1, 4, 2, 2)
    for fn, ofn, kind in GLOBAL_OPS:
        want, info = ofn(x)
        oracle.assert_within_bound(fn(x), want, info, F32, kind)


def test_calls_with_the_same_exact_arguments_reuse_their_launch():
    """AveragePool and LpPool keep a call's launch (``_CALLS``) for calls the checks treat
    alike: the same op, exact Python ints and tuples, the same X shape and type, the same
    count_include_pad and p; others are checked afresh, and refusals are never kept."""
    from poolfold.ops import averaging as module

    x = np.arange(32, dtype=np.float32).reshape(1, 2, 4, 4)
    module._CALLS.clear()
    first = poolfold.average_pool(x, [2, 2], pads=[0, 0, 1, 1])
    assert len(module._CALLS) == 1
    launch = next(iter(module._CALLS.values()))
    again = poolfold.average_pool(x, (2, 2), pads=(0, 0, 1, 1))  # tuples and lists alike
    assert len(module._CALLS) == 1 and next(iter(module._CALLS.values())) is launch
    assert np.array_equal(first, again)
    padded = poolfold.average_pool(x, [2, 2], pads=[0, 0, 1, 1], count_include_pad=1)
    assert len(module._CALLS) == 2 and not np.array_equal(padded, first)
    for p in (1, 2):  # another op on the same windows, and another p: their own launches
        want, info = oracle.lp_pool(x, [2, 2], p=p, pads=[0, 0, 1, 1])
        oracle.assert_within_bound(poolfold.lp_pool(x, [2, 2], p=p, pads=[0, 0, 1, 1]),
                                   want, info, F32, "lp")
    assert len(module._CALLS) == 4
    poolfold.average_pool(x, [np.int64(2), 2])  # a numpy integer: checked, not kept
    assert len(module._CALLS) == 4
    with pytest.raises(TypeError, match="kernel_shape"):
        poolfold.average_pool(x, [2.0, 2])  # equal to 2, but refused: never served a launch
    with pytest.raises(PoolfoldError, match="p"):
        poolfold.lp_pool(x, [2, 2], p=-1)
    assert len(module._CALLS) == 4
    poolfold.average_pool(x.astype(np.float64), [2, 2], pads=[0, 0, 1, 1])  # another type
    assert len(module._CALLS) == 5


@pytest.mark.parametrize("dtype", FLOATS)
def test_global_max_pool_keeps_the_first_winners_bits(dtype):
    """The first of equal largest values, its bits: +0 and -0 tie (the first wins), and the
    first NaN wins whatever NaNs follow; each plane against a scan written here, in both
    layouts, planes of 4 and of 300 elements."""
    bits = {2: np.uint16, 4: np.uint32, 8: np.uint64}[np.dtype(dtype).itemsize]
    top = np.array(np.nan, dtype).view(bits)
    quiet, other = top | 1, (top | 2) ^ bits(1 << (8 * np.dtype(dtype).itemsize - 1))
    planes = [[-0.0, 0.0, -1.0, 0.0], [0.0, -0.0, -0.0, -2.0], [-0.0, -0.0, -3.0, -0.0],
              [1.0, np.nan, 5.0, np.nan], [-np.inf, np.nan, np.nan, 2.0],
              [2.0, -1.0, 2.0, 0.0], [-5.0, -4.0, -4.0, -6.0]]
    x = np.array(planes).astype(dtype)
    x[4, 1] = other.view(dtype)  # a negative NaN with a payload, then another NaN
    x[4, 2] = quiet.view(dtype)
    x[3, 3] = other.view(dtype)
    long = np.zeros((3, 300)).astype(dtype)
    long[0, 10], long[0, 200] = -0.0, 0.0  # a long plane whose largest is a zero
    long[1, 7], long[1, 250] = other.view(dtype), quiet.view(dtype)
    long[2] = np.linspace(-3, 3, 300).astype(dtype)
    for data in (x, long):
        want = []
        for plane in data:
            chosen = plane[0]
            for v in plane[1:]:
                if not np.isnan(chosen) and (np.isnan(v) or v > chosen):
                    chosen = v
            want.append(np.array(chosen, dtype).view(bits))
        got = poolfold.global_max_pool(data.reshape(1, len(data), -1, 2))
        assert got.reshape(-1).view(bits).tolist() == want
        if dtype != BF16:  # the nhwc domain has no bfloat16
            got = poolfold.nhwc.global_max_pool(data.T.reshape(1, -1, 2, len(data)).copy())
            assert got.reshape(-1).view(bits).tolist() == want


# --------------------------------------------------------------------------------------------
# com.ms.internal.nhwc
# --------------------------------------------------------------------------------------------


def to_nhwc(a):
    return np.moveaxis(a, 1, -1)


def to_nchw(a):
    return np.moveaxis(a, -1, 1)


NHWC_CASES = [c for c in AVERAGE_CASES if c.dtype != BF16][::6]  # nhwc has no bfloat16


@pytest.mark.parametrize("case", NHWC_CASES, ids=ids(NHWC_CASES))
def test_nhwc_average_and_lp_pool(case):
    x = np.ascontiguousarray(to_nhwc(case.data()))
    want, info = oracle.average_pool(to_nchw(x), case.kernel,
                                     count_include_pad=case.count_include_pad, **case.geometry)
    got = poolfold.nhwc.average_pool(x, case.kernel, count_include_pad=case.count_include_pad,
                                     **case.geometry)
    oracle.assert_within_bound(got, np.ascontiguousarray(to_nhwc(want)),
                               oracle.BoundInfo(to_nhwc(info.count), to_nhwc(info.maxabs)),
                               case.dtype, "average")
    want, info = oracle.lp_pool(to_nchw(x), case.kernel, p=case.p, **case.geometry)
    got = poolfold.nhwc.lp_pool(x, case.kernel, p=case.p, **case.geometry)
    oracle.assert_within_bound(got, to_nhwc(want),
                               oracle.BoundInfo(to_nhwc(info.count), to_nhwc(info.maxabs)),
                               case.dtype, "lp")


@pytest.mark.parametrize("shape", [(2, 5, 3), (1, 4, 3, 2), (2, 0, 3, 2), (1, 2, 3, 2, 5)])
@pytest.mark.parametrize("dtype", [F16, F32, F64])
def test_nhwc_global_ops(shape, dtype):
    x = make_data(shape, dtype, 31, specials=True)  # channels-last
    ops = [(poolfold.nhwc.global_max_pool, oracle.global_max_pool, "max"),
           (poolfold.nhwc.global_average_pool, oracle.global_average_pool, "average"),
           (poolfold.nhwc.global_lp_pool, oracle.global_lp_pool, "lp")]
    for fn, ofn, kind in ops:
        want, info = ofn(to_nchw(x))
        oracle.assert_within_bound(fn(x), to_nhwc(want),
                                   oracle.BoundInfo(to_nhwc(info.count), to_nhwc(info.maxabs)),
                                   dtype, kind)



@pytest.mark.parametrize("spatial", [(3, 2), (9, 9)])
@pytest.mark.parametrize("dtype", [F16, F32, F64])
def test_nhwc_global_pools_sum_channels_in_blocks_as_the_row_kernel_does(dtype, spatial):
    """Channels-last GlobalAveragePool and GlobalLpPool sum each sample's positions in
    blocks of POSITION_CHANNELS channels (two whole blocks and a partial one here), within
    the oracle's bound and bit for bit as the row kernel sums a window over every position
    (the path they took up to its 64 taps): NaN and inf, and float32 sums that overflow.
    81 positions: past the row kernel's window, as position_sums takes them too (but for
    float64 averages, which keep the windowed sums)."""
    from poolfold.ops import averaging
    from poolfold.kernels.window_rows import POSITION_CHANNELS, window_rows

    channels = 2 * POSITION_CHANNELS + 6
    positions = math.prod(spatial)
    x = make_data((2, *spatial, channels), dtype, 41, specials=True)
    if dtype == F32:
        x[1, :, :, :7] = np.float32(3e38)  # their float32 sums overflow: summed again
    for kind, function, oracle_function in (
            ("average", poolfold.nhwc.global_average_pool, oracle.global_average_pool),
            ("lp", poolfold.nhwc.global_lp_pool, oracle.global_lp_pool)):
        got = function(x)
        want, info = oracle_function(to_nchw(x))
        oracle.assert_within_bound(got, to_nhwc(want),
                                   oracle.BoundInfo(to_nhwc(info.count), to_nhwc(info.maxabs)),
                                   dtype, kind)
        if dtype == F64 and (kind == "lp" or positions > averaging.ROW_MAX_LAST_TAPS):
            continue  # the scaled sums (float64 LpPool), the windowed sums
        plan = averaging._whole_axis_plan("test", positions)
        tables = averaging.window_tables(plan, "valid" if kind == "average" else None)
        mode, transform = averaging._sum_mode(kind, 2.0)
        rows = np.empty(got.size, got.dtype)
        value_type = np.dtype(averaging.dtypes.value_type(x.dtype))
        window_rows(x.reshape(-1).view(value_type), rows.view(value_type), tables.axes,
                    tables.taps, tables.axis_inverse, tables.row_factors(x.dtype), channels,
                    mode, averaging.term_marker(transform), 2.0, 0, 2)
        assert got.tobytes() == rows.tobytes(), kind


# Monotone non-decreasing activations: Y's admissible interval maps to an interval.
ACTIVATIONS = [
    ("Relu", None, lambda v: np.maximum(v, 0.0)),
    ("LeakyRelu", [0.25], lambda v: np.where(v >= 0, v, 0.25 * v)),
    ("Clip", [-0.5, 0.75], lambda v: np.minimum(np.maximum(v, -0.5), 0.75)),
    ("HardSigmoid", [0.5, 0.25], lambda v: np.maximum(0.0, np.minimum(1.0, 0.5 * v + 0.25))),
    ("Tanh", None, np.tanh),
    ("Sigmoid", None, lambda v: 1.0 / (1.0 + np.exp(-v))),
]


@pytest.mark.parametrize("name,params,formula", ACTIVATIONS, ids=[a[0] for a in ACTIVATIONS])
@pytest.mark.parametrize("dtype", [F16, F32, F64])
def test_nhwc_average_pool_activation(name, params, formula, dtype):
    """nhwc AveragePool with an activation: activation(Y), Y as the average's contract says.

    Y may be anywhere in [exact - bound, exact + bound]; the activation is non-decreasing, so
    the result must lie in [f(lo), f(hi)], give or take a rounding to T (2 ulp_T)."""
    x = make_data((2, 6, 5, 3), dtype, 37, scale=1.5)  # N, H, W, C; finite
    kw = dict(strides=[2, 1], pads=[1, 1, 0, 1], ceil_mode=1, count_include_pad=1)
    want, info = oracle.average_pool(to_nchw(x), [3, 2], **kw)
    want, count, maxabs = to_nhwc(want), to_nhwc(info.count), to_nhwc(info.maxabs)
    u = 2.0 ** -53 if dtype == F64 else 2.0 ** -24
    bound = 2 * oracle.ulp(want, dtype) + count * u * maxabs
    lo, hi = formula(want - bound), formula(want + bound)
    got = poolfold.nhwc.average_pool(x, [3, 2], activation=name, activation_params=params, **kw)
    assert got.dtype == dtype and got.shape == want.shape
    g = got.astype(np.float64)
    slack = 2 * np.maximum(oracle.ulp(lo, dtype), oracle.ulp(hi, dtype)) + 4e-16
    bad = ~((g >= lo - slack) & (g <= hi + slack))
    assert not bad.any(), (f"{bad.sum()} outside; first at {np.argwhere(bad)[0]}: "
                           f"got {g[bad][0]!r}, want in [{lo[bad][0]!r}, {hi[bad][0]!r}]")


# --------------------------------------------------------------------------------------------
# errors
# --------------------------------------------------------------------------------------------

X2 = make_data((1, 2, 6, 6), F32, 41)
X2_BF16 = X2.astype(BF16)


def _error_cases():
    """(id, call, error type, op label, words the message must also hold)."""
    pf, nhwc = poolfold, poolfold.nhwc
    cases = [
        # attributes a version lacks
        ("avg11-dilations", lambda: pf.average_pool(X2, [2, 2], dilations=[2, 2], opset=11),
         PoolfoldError, "AveragePool-11", ["dilations"]),
        ("avg7-ceil_mode", lambda: pf.average_pool(X2, [2, 2], ceil_mode=1, opset=7),
         PoolfoldError, "AveragePool-7", ["ceil_mode"]),
        ("avg9-ceil_mode", lambda: pf.average_pool(X2, [2, 2], ceil_mode=1, opset=9),
         PoolfoldError, "AveragePool-7", ["ceil_mode"]),
        ("avg1-count_include_pad",
         lambda: pf.average_pool(X2, [2, 2], count_include_pad=1, opset=1),
         PoolfoldError, "AveragePool-1", ["count_include_pad"]),
        ("lp11-dilations", lambda: pf.lp_pool(X2, [2, 2], dilations=[2, 2], opset=11),
         PoolfoldError, "LpPool-11", ["dilations"]),
        ("lp11-ceil_mode", lambda: pf.lp_pool(X2, [2, 2], ceil_mode=1, opset=11),
         PoolfoldError, "LpPool-11", ["ceil_mode"]),
        ("nhwc-avg11-dilations",
         lambda: nhwc.average_pool(to_nhwc(X2), [2, 2], dilations=[2, 2], opset=11),
         PoolfoldError, "AveragePool-11", ["dilations"]),
        # types a version lacks
        ("avg19-bfloat16", lambda: pf.average_pool(X2_BF16, [2, 2], opset=19),
         PoolfoldTypeError, "AveragePool-19", []),
        ("lp18-bfloat16", lambda: pf.lp_pool(X2_BF16, [2, 2], opset=18),
         PoolfoldTypeError, "LpPool-18", []),
        ("gmax1-bfloat16", lambda: pf.global_max_pool(X2_BF16, opset=21),
         PoolfoldTypeError, "GlobalMaxPool-1", []),
        ("gavg1-bfloat16", lambda: pf.global_average_pool(X2_BF16, opset=21),
         PoolfoldTypeError, "GlobalAveragePool-1", []),
        ("glp2-bfloat16", lambda: pf.global_lp_pool(X2_BF16, opset=21),
         PoolfoldTypeError, "GlobalLpPool-2", []),
        ("nhwc-avg-bfloat16", lambda: nhwc.average_pool(to_nhwc(X2_BF16), [2, 2]),
         PoolfoldTypeError, "AveragePool-19", []),
        ("nhwc-lp-bfloat16", lambda: nhwc.lp_pool(to_nhwc(X2_BF16), [2, 2]),
         PoolfoldTypeError, "LpPool-18", []),
        # p
        ("lp-p0", lambda: pf.lp_pool(X2, [2, 2], p=0), PoolfoldError, "LpPool-22", ["p"]),
        ("lp-p-negative", lambda: pf.lp_pool(X2, [2, 2], p=-2), PoolfoldError, "LpPool-22",
         ["p"]),
        ("lp1-p0", lambda: pf.lp_pool(X2, [2, 2], p=0.0, opset=1), PoolfoldError, "LpPool-1",
         ["p"]),
        ("glp-p0", lambda: pf.global_lp_pool(X2, p=0), PoolfoldError, "GlobalLpPool-22",
         ["p"]),
        ("nhwc-lp-p0", lambda: nhwc.lp_pool(to_nhwc(X2), [2, 2], p=0), PoolfoldError,
         "LpPool-18", ["p"]),
        # rank < 3
        ("avg-rank2", lambda: pf.average_pool(X2[0, 0], [2]), PoolfoldError, "AveragePool-22",
         []),
        ("lp-rank2", lambda: pf.lp_pool(X2[0, 0], [2]), PoolfoldError, "LpPool-22", []),
        ("gmax-rank2", lambda: pf.global_max_pool(X2[0, 0]), PoolfoldError,
         "GlobalMaxPool-22", []),
        ("gavg-rank1", lambda: pf.global_average_pool(X2[0, 0, 0]), PoolfoldError,
         "GlobalAveragePool-22", []),
        ("glp-rank2", lambda: pf.global_lp_pool(X2[0, 0]), PoolfoldError, "GlobalLpPool-22",
         []),
        ("nhwc-gavg-rank2", lambda: nhwc.global_average_pool(X2[0, 0]), PoolfoldError,
         "GlobalAveragePool", []),
        # windows: MaxPool's rules
        ("avg-no-window-fits", lambda: pf.average_pool(X2, [7, 2]), PoolfoldError,
         "AveragePool-22", []),
        ("lp-pads-with-same", lambda: pf.lp_pool(X2, [2, 2], pads=[1, 0, 0, 0],
                                                 auto_pad="SAME_UPPER"),
         PoolfoldError, "LpPool-22", ["pads"]),
    ]
    for dtype in (np.int8, np.uint8, np.int32, np.int64, np.bool_):
        xi = np.zeros((1, 1, 4, 4), dtype=dtype)
        name = np.dtype(dtype).name
        cases += [
            (f"avg-{name}", lambda xi=xi: pf.average_pool(xi, [2, 2]), PoolfoldTypeError,
             "AveragePool-22", []),
            (f"lp-{name}", lambda xi=xi: pf.lp_pool(xi, [2, 2]), PoolfoldTypeError,
             "LpPool-22", []),
            (f"gmax-{name}", lambda xi=xi: pf.global_max_pool(xi), PoolfoldTypeError,
             "GlobalMaxPool-22", []),
        ]
    cases += [
        ("gavg-int8", lambda: pf.global_average_pool(np.zeros((1, 1, 2), np.int8)),
         PoolfoldTypeError, "GlobalAveragePool-22", []),
        ("glp-uint8", lambda: pf.global_lp_pool(np.zeros((1, 1, 2), np.uint8)),
         PoolfoldTypeError, "GlobalLpPool-22", []),
        ("nhwc-avg-int8", lambda: nhwc.average_pool(np.zeros((1, 4, 4, 1), np.int8), [2, 2]),
         PoolfoldTypeError, "AveragePool-19", []),
    ]
    return cases


ERROR_CASES = _error_cases()


@pytest.mark.parametrize("call,cls,label,words", [c[1:] for c in ERROR_CASES],
                         ids=[c[0] for c in ERROR_CASES])
def test_errors(call, cls, label, words):
    with pytest.raises(cls) as raised:
        call()
    message = str(raised.value)
    assert isinstance(raised.value, ValueError if cls is PoolfoldError else TypeError)
    assert re.search(rf"\b{re.escape(label)}\b", message), f"{label!r} not in {message!r}"
    for word in words:
        assert re.search(rf"\b{word}\b", message), f"{word!r} not in {message!r}"


@pytest.mark.parametrize("p", [2.5, 0.5])
def test_lp_pool_non_integer_p_from_version_2(p):
    """p is an int from LpPool-2 (an error of either kind, naming the op and p)."""
    for call, label in ((lambda: poolfold.lp_pool(X2, [2, 2], p=p), "LpPool-22"),
                        (lambda: poolfold.lp_pool(X2, [2, 2], p=p, opset=2), "LpPool-2"),
                        (lambda: poolfold.global_lp_pool(X2, p=p), "GlobalLpPool-22")):
        with pytest.raises((PoolfoldError, PoolfoldTypeError)) as raised:
            call()
        assert re.search(rf"\b{re.escape(label)}\b", str(raised.value)), str(raised.value)


# --------------------------------------------------------------------------------------------
# a property test
# --------------------------------------------------------------------------------------------


@st.composite
def property_cases(draw):
    r = draw(st.integers(1, 3))
    dims = st.lists(st.integers(1, {1: 10, 2: 6, 3: 4}[r]), min_size=r, max_size=r)
    small = lambda lo, hi: st.lists(st.integers(lo, hi), min_size=r, max_size=r)  # noqa: E731
    spatial = draw(dims)
    kernel = draw(small(1, 4))
    auto_pad = draw(st.sampled_from(["NOTSET", "NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID"]))
    pads = draw(st.lists(st.integers(0, 5), min_size=2 * r, max_size=2 * r)) \
        if auto_pad == "NOTSET" else None
    case = Case(
        shape=(draw(st.integers(0, 2)), draw(st.integers(1, 2)), *spatial),
        kernel=kernel,
        strides=draw(st.none() | small(1, 3)),
        pads=pads,
        dilations=draw(st.none() | small(1, 3)),
        auto_pad=auto_pad,
        ceil_mode=draw(st.integers(0, 1)),
        count_include_pad=draw(st.integers(0, 1)),
        p=draw(st.integers(1, 3)),
        dtype=draw(st.sampled_from(FLOATS)),
        specials=draw(st.booleans()),
        scale=draw(st.sampled_from([1.0, 1e3, 1e-3])),
        seed=draw(st.integers(0, 2**31 - 1)),
    )
    return case


@settings(max_examples=60, deadline=None)
@given(property_cases())
def test_property_average_and_lp_pool(case):
    note(str(case))
    x = case.data()
    if not fits(case):
        with pytest.raises(PoolfoldError, match=r"\bAveragePool-22\b"):
            poolfold.average_pool(x, case.kernel, **case.geometry)
        return
    want, info = oracle.average_pool(x, case.kernel, count_include_pad=case.count_include_pad,
                                     **case.geometry)
    got = poolfold.average_pool(x, case.kernel, count_include_pad=case.count_include_pad,
                                **case.geometry)
    oracle.assert_within_bound(got, want, info, case.dtype, "average")
    want, info = oracle.lp_pool(x, case.kernel, p=case.p, **case.geometry)
    got = poolfold.lp_pool(x, case.kernel, p=case.p, **case.geometry)
    oracle.assert_within_bound(got, want, info, case.dtype, "lp")


# --------------------------------------------------------------------------------------------
# differential: onnxruntime and PyTorch, with a tolerance that does not use the oracle
# --------------------------------------------------------------------------------------------


def loose_bound(reference, x, kernel):
    """|a - b| allowed between two results that each meet the contract's bound: 2 * (2 ulp +
    prod(kernel) * u * max|x|), with the whole input's max|x| and the full kernel standing in
    for the window's."""
    maxabs = float(np.max(np.abs(x.astype(np.float64)))) if x.size else 0.0
    u = 2.0 ** -53 if x.dtype == F64 else 2.0 ** -24
    return 4 * oracle.ulp(reference, x.dtype) + 2 * math.prod(kernel) * u * maxabs


def assert_close(got, reference, x, kernel):
    """got and reference (another library's result) agree within loose_bound."""
    assert got.dtype == reference.dtype and got.shape == reference.shape, (
        got.dtype, got.shape, reference.dtype, reference.shape)
    g, w = got.astype(np.float64), reference.astype(np.float64)
    bad = ~((np.abs(g - w) <= loose_bound(w, x, kernel)) | (np.isnan(g) & np.isnan(w))
            | (g == w))
    assert not bad.any(), (f"{bad.sum()} of {g.size} differ; first at {np.argwhere(bad)[0]}: "
                           f"got {g[bad][0]!r}, reference {w[bad][0]!r}")


def ort_cases(seed, count):
    """float32 AveragePool cases onnxruntime computes right: spatial rank <= 3, pads below the
    kernel (ORT refuses others), no SAME with a dilation or a stride past the kernel, no
    ceil_mode with VALID, no window made only of padding, finite data."""
    rng = np.random.default_rng(seed)
    cases = []
    while len(cases) < count:
        r = 1 + len(cases) % 3
        kernel = [int(rng.integers(1, 5)) for _ in range(r)]
        strides = [int(rng.integers(1, 4)) for _ in range(r)]
        dilations = [int(rng.integers(1, 3)) for _ in range(r)] if rng.random() < 0.3 else None
        auto_pad = str(rng.choice(["NOTSET", "NOTSET", "NOTSET", "SAME_UPPER", "SAME_LOWER",
                                   "VALID"]))
        pads = None
        if auto_pad == "NOTSET":
            pads = [int(rng.integers(0, kernel[a % r])) for a in range(2 * r)]
        elif auto_pad != "VALID":
            if dilations or any(s > k for s, k in zip(strides, kernel)):
                continue
        case = Case(shape=(int(rng.integers(1, 3)), 2,
                           *[int(rng.integers(1, {1: 12, 2: 8, 3: 5}[r] + 1)) for _ in range(r)]),
                    kernel=kernel, strides=strides, pads=pads, dilations=dilations,
                    auto_pad=auto_pad, ceil_mode=int(auto_pad == "NOTSET" and rng.random() < 0.5),
                    count_include_pad=int(rng.random() < 0.5), dtype=F32,
                    seed=int(rng.integers(0, 2**31)), name=f"ort{len(cases)}")
        if not fits(case) or has_empty_window(case):
            continue
        cases.append(case)
    return cases


def has_empty_window(case):
    outs, begins = oracle.max_pool_geometry(case.shape[2:], case.kernel, case.strides,
                                            case.pads, case.dilations, case.auto_pad,
                                            case.ceil_mode)
    strides = case.strides or [1] * len(outs)
    dilations = case.dilations or [1] * len(outs)
    for n, k, s, d, out, pb in zip(case.shape[2:], case.kernel, strides, dilations, outs,
                                   begins):
        for o in range(out):
            if not any(0 <= o * s - pb + j * d < n for j in range(k)):
                return True
    return False


ORT_CASES = ort_cases(777, 30)


@pytest.mark.parametrize("case", ORT_CASES, ids=ids(ORT_CASES))
def test_average_pool_matches_onnxruntime(case):
    ort = pytest.importorskip("onnxruntime")
    from onnx import TensorProto, helper

    x = case.data()
    attrs = dict(kernel_shape=case.kernel, count_include_pad=case.count_include_pad,
                 **case.geometry)
    node = helper.make_node("AveragePool", ["x"], ["y"], **attrs)
    graph = helper.make_graph(
        [node], "averagepool", [helper.make_tensor_value_info("x", TensorProto.FLOAT, x.shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])
    model.ir_version = 8  # the default IR version is newer than this onnxruntime reads
    options = ort.SessionOptions()
    options.log_severity_level = 3
    session = ort.InferenceSession(model.SerializeToString(), options,
                                   providers=["CPUExecutionProvider"])
    reference = session.run(None, {"x": x})[0]
    got = poolfold.average_pool(x, case.kernel, count_include_pad=case.count_include_pad,
                                opset=19, **case.geometry)
    assert_close(got, reference, x, case.kernel)


TORCH_CASES = [
    # (shape, kernel, stride, padding (symmetric, <= kernel/2), ceil_mode, count_include_pad)
    ((2, 3, 7, 5), (3, 3), (3, 1), (0, 0), True, False),
    ((2, 3, 7, 5), (3, 3), (3, 1), (1, 1), True, True),
    ((1, 2, 8, 9), (2, 4), (2, 3), (1, 2), True, True),
    ((1, 2, 8, 9), (2, 4), (2, 3), (1, 2), False, False),
    ((1, 1, 6, 6), (5, 5), (2, 2), (2, 2), True, False),
    ((2, 1, 5, 11), (1, 7), (1, 2), (0, 3), True, True),
    ((1, 2, 10, 10), (3, 2), (1, 1), (1, 0), False, True),
]


@pytest.mark.parametrize("shape,kernel,stride,padding,ceil_mode,cip", TORCH_CASES)
@pytest.mark.parametrize("dtype", [F32, F64])
def test_average_pool_matches_torch(shape, kernel, stride, padding, ceil_mode, cip, dtype):
    torch = pytest.importorskip("torch")
    x = make_data(shape, dtype, sum(shape) + sum(kernel))
    reference = torch.nn.functional.avg_pool2d(
        torch.from_numpy(x), kernel, stride, padding, ceil_mode=ceil_mode,
        count_include_pad=cip).numpy()
    got = poolfold.average_pool(x, list(kernel), strides=list(stride),
                                pads=list(padding) * 2, ceil_mode=int(ceil_mode),
                                count_include_pad=int(cip))
    assert_close(got, reference, x, kernel)


def test_global_pools_cap_their_pieces_by_their_work_and_windowed_pools_do_not(monkeypatch):
    """A global pool tells its launch its work (one piece a thread for a small call: a
    piece is a Python call, dear beside a plane's sums); a windowed pool does not (its
    pieces even out the threads)."""
    from poolfold.ops import averaging

    monkeypatch.setattr(averaging, "_CALLS", CallCache())
    x = np.ones((1, 100, 13, 13), np.float32)
    np.testing.assert_array_equal(poolfold.global_average_pool(x), np.ones((1, 100, 1, 1)))
    poolfold.average_pool(x, [3, 3])
    assert [launch.bound.work for launch in averaging._CALLS.values()] == [100 * 13 * 13, None]


def test_only_the_separable_passes_read_a_divisor_per_output(monkeypatch):
    """The row sums and the block sums multiply by per-axis factors: their calls make no
    table of a divisor per output (16 bytes an output: 256 MiB for a 256^3 slab of a chunked
    pool), which only the separable passes read (float64 here)."""
    from poolfold.ops import averaging

    def refuse(tables):
        raise AssertionError("the per-output divisor table was read")

    x = np.random.default_rng(3).standard_normal((1, 2, 12, 12, 12))
    with monkeypatch.context() as patch:
        patch.setattr(averaging._WholeTables, "divisor", property(refuse))
        averaging.window_tables.cache_clear()
        averaging._windows_launch.cache_clear()
        for kw in (dict(kernel_shape=[3, 3, 3], pads=[1] * 6),  # the row sums
                   dict(kernel_shape=[5, 5, 6], auto_pad="SAME_UPPER")):  # the block sums
            for cip in (0, 1):
                got = poolfold.average_pool(x.astype(np.float32), **kw, count_include_pad=cip)
                want, info = oracle.average_pool(x.astype(np.float32), **kw,
                                                 count_include_pad=cip)
                oracle.assert_within_bound(got, want, info, np.float32, "average")
        with pytest.raises(AssertionError, match="per-output divisor"):
            poolfold.average_pool(x, [5, 5, 6], auto_pad="SAME_UPPER")  # float64: the passes
    averaging.window_tables.cache_clear()
    averaging._windows_launch.cache_clear()
