"""poolfold.max_pool against the slow oracle (tests/oracle.py), bit for bit, and its properties.

Every case is drawn by hypothesis: every MaxPool version (1, 8, 10, 11, 12, 22) with only the
attributes and types that version has, spatial ranks 1-4, every dtype, values with many ties
and (for floating types) NaNs with payloads, signalling NaNs, -0.0, +-inf, subnormals and the
extreme finite values; pads up to and beyond the kernel, dilations, strides, every auto_pad,
ceil_mode, storage_order 0/1, N or C equal to 0, and inputs in several memory layouts
(C, Fortran, transposed, strided, reversed, read-only, broadcast views).

Y is compared through a same-width unsigned view (so -0.0 != 0.0 and NaN payloads count) and
Indices exactly.  Shapes stay tiny: the oracle is pure Python.
"""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass, field

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, assume, event, given, note, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import oracle
from kernel_types import kernel_types
import poolfold
from poolfold import PoolfoldError

F16 = np.dtype(np.float16)
F32 = np.dtype(np.float32)
F64 = np.dtype(np.float64)
BF16 = np.dtype(ml_dtypes.bfloat16)
I8 = np.dtype(np.int8)
U8 = np.dtype(np.uint8)
FLOATS = (F16, F32, F64, BF16)

VERSIONS = (1, 8, 10, 11, 12, 22)
# opsets that resolve to each version (None: the latest)
OPSETS = {
    1: (1, 2, 3, 4, 5, 6, 7),
    8: (8, 9),
    10: (10,),
    11: (11,),
    12: tuple(range(12, 22)),
    22: (22, 23, None),
}


def types_of(version: int) -> tuple[np.dtype, ...]:
    types = [F16, F32, F64]
    if version >= 12:
        types += [I8, U8]
    if version >= 22:
        types.append(BF16)
    return tuple(types)


VERSION_DTYPES = [(v, t) for v in VERSIONS for t in types_of(v)]


def bits(a: np.ndarray) -> np.ndarray:
    """A contiguous same-width unsigned-int view of ``a``'s elements."""
    return np.ascontiguousarray(a).view(np.dtype(f"u{a.dtype.itemsize}"))


def assert_same_bits(got: np.ndarray, want: np.ndarray, what: str = "Y") -> None:
    assert isinstance(got, np.ndarray), f"{what}: {type(got)}"
    assert got.dtype == want.dtype, f"{what} dtype {got.dtype} != {want.dtype}"
    assert got.shape == want.shape, f"{what} shape {got.shape} != {want.shape}"
    g, w = bits(got), bits(want)
    if not np.array_equal(g, w):
        bad = np.argwhere(g != w)
        first = tuple(int(v) for v in bad[0])
        raise AssertionError(
            f"{what} differs at {len(bad)} positions, first {first}: got {got[first]!r} "
            f"(bits {int(g[first]):#x}), want {want[first]!r} (bits {int(w[first]):#x})"
        )


def assert_same_indices(got: np.ndarray, want: np.ndarray) -> None:
    assert isinstance(got, np.ndarray)
    assert got.dtype == np.int64, got.dtype
    assert got.shape == want.shape, (got.shape, want.shape)
    if not np.array_equal(got, want):
        bad = np.argwhere(got != want)
        first = tuple(int(v) for v in bad[0])
        raise AssertionError(
            f"Indices differ at {len(bad)} positions, first {first}: "
            f"got {int(got[first])}, want {int(want[first])}"
        )


# --------------------------------------------------------------------------------------------
# geometry, written from docs/semantics.md (independent of poolfold and of the oracle's code)
# --------------------------------------------------------------------------------------------


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def expected_geometry(spatial, kernel, strides, pads, dilations, auto_pad, ceil_mode):
    """(out_shape, pad_begins) per docs/semantics.md 'MaxPool', or None when no window fits.

    Written out here from the document's rules, not borrowed from the oracle, so that the
    output shapes the tests expect are an independent check on both."""
    r = len(spatial)
    strides = list(strides) if strides is not None else [1] * r
    dilations = list(dilations) if dilations is not None else [1] * r
    pads = list(pads) if pads is not None else [0] * (2 * r)
    outs, begins = [], []
    for i in range(r):
        n, k, s, d = int(spatial[i]), int(kernel[i]), int(strides[i]), int(dilations[i])
        K = (k - 1) * d + 1  # effective kernel
        if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
            out = ceil_div(n, s)
            begin = same_pads(n, k, s, d, auto_pad)[0]
        elif auto_pad == "VALID":
            out = (n - K) // s + 1
            begin = 0
        else:  # NOTSET: explicit pads
            pb, pe = int(pads[i]), int(pads[r + i])
            if ceil_mode:
                out = ceil_div(n + pb + pe - K, s) + 1
                if (out - 1) * s >= n + pb:  # a window starting in the right padding: dropped
                    out -= 1
            else:
                out = (n + pb + pe - K) // s + 1
            begin = pb
        if out < 1:
            return None
        outs.append(out)
        begins.append(begin)
    return tuple(outs), tuple(begins)


def same_pads(n: int, k: int, s: int, d: int, auto_pad: str) -> tuple[int, int]:
    """(begin, end) pads of SAME_UPPER / SAME_LOWER, docs/semantics.md's formula."""
    K = (k - 1) * d + 1
    out = ceil_div(n, s)
    total = max(0, (out - 1) * s + K - n)
    begin = total // 2 if auto_pad == "SAME_UPPER" else ceil_div(total, 2)
    return begin, total - begin


# --------------------------------------------------------------------------------------------
# values: many ties, plus special values sprinkled in
# --------------------------------------------------------------------------------------------

_FLOAT_LAYOUT = {F16: (5, 10), BF16: (8, 7), F32: (8, 23), F64: (11, 52)}


def _float_specials(dtype: np.dtype) -> list[int]:
    e, m = _FLOAT_LAYOUT[dtype]
    sign = 1 << (e + m)
    inf = ((1 << e) - 1) << m
    quiet = 1 << (m - 1)
    return [
        inf,  # +inf
        sign | inf,  # -inf
        inf | quiet,  # the default quiet NaN
        sign | inf | quiet | 1,  # negative quiet NaN with a payload
        inf | 1,  # signalling NaN
        sign | inf | 2,  # negative signalling NaN
        inf - 1,  # largest finite
        sign | (inf - 1),  # lowest finite
        1,  # smallest subnormal
        sign | 1,  # its negative
    ]


def value_table(dtype: np.dtype) -> np.ndarray:
    """Bit patterns: 7 ordinary values with ties (codes 0-6), then the special values."""
    width = np.dtype(f"u{dtype.itemsize}")
    if dtype in FLOATS:
        base = np.array([-2.0, -1.0, -0.0, 0.0, 1.0, 2.0, 3.0]).astype(dtype).view(width)
        specials = np.array(_float_specials(dtype), dtype=width)
    elif dtype == I8:
        base = np.arange(-3, 4, dtype=I8).view(width)
        specials = np.array([-128, 127, -127], dtype=I8).view(width)
    else:
        base = np.arange(0, 7, dtype=U8)
        specials = np.array([255, 254, 128], dtype=U8)
    return np.concatenate([base, specials])


@st.composite
def tensors(draw, dtype: np.dtype, shape: tuple[int, ...], specials: bool = True):
    table = value_table(dtype)
    size = math.prod(shape)
    codes = draw(hnp.arrays(np.uint8, shape, elements=st.integers(0, 6))).reshape(-1).copy()
    if specials and size:
        for pos, code in draw(st.lists(
            st.tuples(st.integers(0, size - 1), st.integers(7, len(table) - 1)), max_size=4
        )):
            codes[pos] = code
    return table[codes].reshape(shape).view(dtype)


LAYOUTS = ("C", "F", "transposed", "strided", "reversed", "readonly", "broadcast")


@st.composite
def in_layout(draw, x: np.ndarray, kinds=LAYOUTS):
    """``x``'s values, in a memory layout hypothesis picks (often a non-contiguous view)."""
    kind = draw(st.sampled_from(kinds))
    if kind == "C":
        return np.ascontiguousarray(x)
    if kind == "F":
        return np.asfortranarray(x)
    if kind == "transposed":
        perm = draw(st.permutations(range(x.ndim)))
        base = np.ascontiguousarray(x.transpose(perm))
        return base.transpose(np.argsort(perm))
    if kind == "readonly":
        x = x.copy()
        x.setflags(write=False)
        return x
    if kind == "broadcast":  # every batch entry reads the same memory (stride 0)
        return np.broadcast_to(np.ascontiguousarray(x[:1]), x.shape) if x.shape[0] else x
    if kind == "strided":
        starts = draw(st.lists(st.integers(0, 1), min_size=x.ndim, max_size=x.ndim))
        width = np.dtype(f"u{x.dtype.itemsize}")
        # garbage between the elements: a wrong read shows up as a wrong value
        base = np.full([2 * n + 1 for n in x.shape], np.iinfo(width).max // 3, dtype=width)
        window = tuple(slice(s, s + 2 * n, 2) for s, n in zip(starts, x.shape))
        base[window] = bits(x)
        return base.view(x.dtype)[window]
    axis = draw(st.integers(0, x.ndim - 1))
    return np.flip(np.flip(x, axis).copy(), axis)


# --------------------------------------------------------------------------------------------
# cases
# --------------------------------------------------------------------------------------------


@dataclass
class Case:
    opset: int | None
    version: int
    x: np.ndarray
    kernel_shape: list
    strides: list | None = None
    pads: list | None = None
    dilations: list | None = None
    auto_pad: str = "NOTSET"
    ceil_mode: bool = False
    storage_order: int = 0
    return_indices: bool = False
    out_shape: tuple = field(default=())
    pad_begins: tuple = field(default=())

    def attrs(self) -> dict:
        """Keyword arguments for max_pool_shape (and, with storage_order, max_pool)."""
        return dict(
            strides=self.strides, pads=self.pads, dilations=self.dilations,
            auto_pad=self.auto_pad, ceil_mode=self.ceil_mode, opset=self.opset,
        )

    def run(self, x=None):
        """poolfold's (Y, Indices or None)."""
        x = self.x if x is None else x
        result = poolfold.max_pool(
            x, self.kernel_shape, storage_order=self.storage_order,
            return_indices=self.return_indices, **self.attrs()
        )
        if self.return_indices:
            assert isinstance(result, tuple) and len(result) == 2
            return result
        assert isinstance(result, np.ndarray)
        return result, None

    def run_oracle(self):
        return oracle.max_pool(
            np.ascontiguousarray(self.x), self.kernel_shape, strides=self.strides,
            pads=self.pads, dilations=self.dilations, auto_pad=self.auto_pad,
            ceil_mode=self.ceil_mode, storage_order=self.storage_order,
        )


ORACLE_BUDGET = 6000  # planes * outputs * kernel taps the oracle may walk per case


@st.composite
def pool_cases(draw, version=None, dtype=None, rank=None, fit=True, auto_pads=None,
               storage_order=None, return_indices=None, layouts=LAYOUTS, budget=ORACLE_BUDGET,
               specials=True, empty=False):
    """A MaxPool call valid for its version.  ``fit=False``: one where no window fits."""
    version = draw(st.sampled_from(VERSIONS)) if version is None else version
    opset = draw(st.sampled_from(OPSETS[version]))
    dtype = draw(st.sampled_from(kernel_types(types_of(version)))) if dtype is None \
        else np.dtype(dtype)
    r = draw(st.integers(1, 4)) if rank is None else rank
    max_dim = {1: 7, 2: 7, 3: 5, 4: 4}[r]
    max_k = 3 if r <= 3 else 2
    ints = lambda lo, hi: st.lists(st.integers(lo, hi), min_size=r, max_size=r)  # noqa: E731

    spatial = draw(ints(1, max_dim))
    kernel = draw(ints(1, max_k))
    strides = draw(st.none() | ints(1, 3))
    dilations = draw(st.none() | ints(1, 3 if r <= 2 else 2)) if version >= 10 else None
    auto_pad = draw(st.sampled_from(
        auto_pads or ("NOTSET", "NOTSET", "NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID")))
    s = strides or [1] * r
    d = dilations or [1] * r
    spans = [(k - 1) * dd + 1 for k, dd in zip(kernel, d)]
    if auto_pad == "NOTSET":
        # up to and beyond the dilated kernel: pads >= kernel give windows of padding only
        pads = draw(st.none() | st.tuples(
            *[st.integers(0, K + 1) for K in spans], *[st.integers(0, K + 1) for K in spans]
        ).map(list))
    else:
        pads = draw(st.none() | st.just([0] * (2 * r)))
    ceil_mode = draw(st.booleans()) if version >= 10 else False
    if storage_order is None:
        storage_order = draw(st.integers(0, 1)) if version >= 8 else 0
    if return_indices is None:
        return_indices = draw(st.booleans()) if version >= 8 else False

    geometry = expected_geometry(spatial, kernel, s, pads or [0] * (2 * r), d, auto_pad,
                                 ceil_mode)
    if fit:
        assume(geometry is not None)
        out_shape, pad_begins = geometry
    else:
        assume(geometry is None)
        out_shape, pad_begins = (), ()

    cap = 6 if r <= 2 else 2
    n = draw(st.sampled_from([1, 1, 1, 1, 2, 2, 3, 0]))
    c = draw(st.sampled_from([1, 1, 1, 1, 2, 2, 3, 0]))
    n, c = min(n, cap), min(c, cap // max(1, min(n, cap)))
    if empty:  # N = 0 or C = 0 (or both)
        n, c = draw(st.sampled_from([(0, c), (n, 0), (0, 0)]))
    if fit:
        assume(n * c * math.prod(out_shape) * math.prod(kernel) <= budget)
    x = draw(tensors(dtype, (n, c, *spatial), specials=specials))
    x = draw(in_layout(x, layouts))
    case = Case(opset, version, x, kernel, strides, pads, dilations, auto_pad, ceil_mode,
                storage_order, return_indices, out_shape, pad_begins)
    event(f"rank {r}, N*C {n * c}, auto_pad {auto_pad}")
    if fit:
        work = n * c * math.prod(out_shape) * math.prod(kernel)
        event(f"oracle work ~1e{int(math.log10(max(1, work)))}")
    note(f"case: {case!r}\nlayout strides {x.strides}, x bits {bits(x).reshape(-1).tolist()}")
    return case


def check_against_oracle(case: Case) -> None:
    y, indices = case.run()
    y_ref, indices_ref = case.run_oracle()
    assert y.shape == case.x.shape[:2] + case.out_shape
    assert_same_bits(y, y_ref)
    if case.return_indices:
        assert_same_indices(indices, indices_ref)
    shape = poolfold.max_pool_shape(case.x.shape, case.kernel_shape, **case.attrs())
    assert shape == y.shape
    assert all(type(v) is int for v in shape), shape


# --------------------------------------------------------------------------------------------
# against the oracle
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "version, dtype", VERSION_DTYPES, ids=[f"MaxPool-{v}-{t.name}" for v, t in VERSION_DTYPES]
)
@settings(max_examples=80)
@given(data=st.data())
def test_matches_oracle(version, dtype, data):
    check_against_oracle(data.draw(pool_cases(version=version, dtype=dtype)))


@pytest.mark.parametrize("rank", [1, 2, 3, 4])
@settings(max_examples=80)
@given(data=st.data())
def test_matches_oracle_per_rank(rank, data):
    check_against_oracle(data.draw(pool_cases(rank=rank)))


@pytest.mark.parametrize("auto_pad", ["NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID"])
@settings(max_examples=30)
@given(data=st.data())
def test_matches_oracle_per_auto_pad(auto_pad, data):
    check_against_oracle(data.draw(pool_cases(auto_pads=(auto_pad,), version=22)))


# Most drawn cases have no window of padding only and are filtered out; on some seeds
# hypothesis found 9 of 59 draws kept and failed its filter health check.
@settings(max_examples=80, suppress_health_check=[HealthCheck.filter_too_much,
                                                  HealthCheck.too_slow])
@given(data=st.data())
def test_matches_oracle_big_pads_and_dilations(data):
    """Cases with at least one window made only of padding (pads >= kernel, or dilation)."""
    case = data.draw(pool_cases(version=22, auto_pads=("NOTSET",), return_indices=True))
    _, indices_ref = case.run_oracle()
    assume((indices_ref == -1).any())
    check_against_oracle(case)


@settings(max_examples=80)
@given(data=st.data())
def test_matches_oracle_empty_batch_or_channels(data):
    case = data.draw(pool_cases(empty=True))
    assert 0 in case.x.shape[:2]
    check_against_oracle(case)
    y, indices = case.run()
    assert y.size == 0
    if indices is not None:
        assert indices.size == 0


# Hand-picked cases for the subtle rules, run through the same comparison.
def _case_1d(values, dtype, kernel, **kw):
    x = np.array(values, dtype=np.float64).astype(dtype).reshape(1, 1, -1)
    return Case(kw.pop("opset", None), 22, x, kernel, return_indices=True, **kw,
                out_shape=expected_geometry(
                    [x.shape[2]], kernel, kw.get("strides") or [1],
                    kw.get("pads") or [0, 0], kw.get("dilations") or [1],
                    kw.get("auto_pad", "NOTSET"), kw.get("ceil_mode", False))[0])


@pytest.mark.parametrize("dtype", [F16, F32, F64, BF16, I8, U8], ids=lambda t: t.name)
@pytest.mark.parametrize(
    "values, kernel, kw",
    [
        ([1, 2], [1], dict(pads=[1, 1])),  # empty windows at both ends
        ([5, 7], [1], dict(pads=[2, 1])),
        ([3, 3, 1], [2], {}),  # ties: first wins
        ([1, 2, 3, 4], [3], dict(strides=[2], ceil_mode=True)),  # partial window
        ([1, 2, 3, 4], [3], dict(strides=[2], pads=[0, 2], ceil_mode=True)),  # drop rule
        ([1, 2], [3], dict(strides=[2], ceil_mode=True)),  # window longer than the input
        ([1, 6, 2, 5, 3, 4], [3], dict(strides=[2], auto_pad="SAME_LOWER")),
        ([1, 6, 2, 5, 3, 4], [3], dict(strides=[2], auto_pad="SAME_UPPER")),
        ([1, 4, 2, 3], [2], dict(strides=[2], dilations=[2], auto_pad="SAME_LOWER")),
        ([1, 5, 2, 4, 3], [2], dict(dilations=[2], auto_pad="SAME_UPPER")),
        ([1, 2], [2], dict(dilations=[4], pads=[3, 3])),  # empty windows from dilation
    ],
)
def test_rules_on_hand_picked_cases(dtype, values, kernel, kw):
    check_against_oracle(_case_1d(values, dtype, kernel, **kw))


MEDIUM_CASES = [
    ((2, 3, 40), [4], dict(strides=[3], pads=[2, 5], ceil_mode=True, dilations=[2])),
    ((2, 2, 13, 11), [3, 3], dict(strides=[2, 2], pads=[1, 1, 1, 1])),
    ((1, 3, 12, 9), [2, 3], dict(dilations=[3, 2], pads=[4, 2, 0, 5], storage_order=1)),
    ((3, 1, 9, 14), [3, 2], dict(strides=[2, 3], auto_pad="SAME_LOWER", dilations=[2, 1])),
    ((1, 2, 6, 7, 5), [2, 3, 2], dict(strides=[2, 1, 2], ceil_mode=True,
                                      pads=[1, 1, 0, 0, 1, 1], storage_order=1)),
    ((1, 1, 5, 4, 5, 4), [2, 2, 2, 2], dict(strides=[1, 2, 1, 2], auto_pad="SAME_UPPER")),
]


@pytest.mark.parametrize("shape, kernel, kw", MEDIUM_CASES, ids=[str(c[0]) for c in MEDIUM_CASES])
@pytest.mark.parametrize("dtype", [F32, BF16, I8], ids=lambda t: t.name)
def test_medium_sizes_against_oracle(shape, kernel, kw, dtype):
    """Larger planes than the hypothesis cases: long rows of windows wholly inside the input
    (the kernels' fast path) next to border windows, several planes in parallel."""
    # a seed fixed by the case (str hashes change per process with PYTHONHASHSEED)
    rng = np.random.default_rng(zlib.crc32(f"{shape}-{dtype.name}".encode()))
    table = value_table(dtype)
    codes = rng.integers(0, 7, shape)
    codes[rng.random(shape) < 0.02] = rng.integers(7, len(table))
    x = table[codes].view(dtype)
    kw = dict(kw)
    case = Case(None, 22, x, kernel, kw.pop("strides", None), kw.pop("pads", None),
                kw.pop("dilations", None), kw.pop("auto_pad", "NOTSET"),
                kw.pop("ceil_mode", False), kw.pop("storage_order", 0), True)
    assert not kw
    r = len(shape) - 2
    case.out_shape = expected_geometry(
        shape[2:], kernel, case.strides or [1] * r, case.pads or [0] * (2 * r),
        case.dilations or [1] * r, case.auto_pad, case.ceil_mode)[0]
    check_against_oracle(case)


# Shapes large enough that poolfold's own cost model picks its separable passes (several
# slabs of rows) for rank >= 2, checked against the oracle through the public API.
LARGE_CASES = [
    ((2, 4, 32, 32), [3, 3], {}),
    ((2, 4, 30, 33), [3, 2], dict(pads=[1, 0, 2, 1], dilations=[1, 2])),
    ((1, 6, 31, 29), [2, 3], dict(strides=[1, 1], ceil_mode=True, pads=[0, 1, 1, 1],
                                  storage_order=1)),
    ((2, 4, 10, 10, 10), [2, 2, 3], dict(auto_pad="SAME_UPPER")),
    ((2, 5, 10, 9, 11), [3, 2, 2], dict(pads=[1, 1, 1, 1, 1, 1], storage_order=1)),
    ((4, 4, 6, 6, 6, 6), [2, 2, 2, 2], dict(pads=[1, 0, 1, 0, 0, 1, 0, 1])),
]


@pytest.mark.parametrize("shape, kernel, kw", LARGE_CASES, ids=[str(c[0]) for c in LARGE_CASES])
@pytest.mark.parametrize("dtype", [F32, BF16], ids=lambda t: t.name)
def test_large_sizes_against_oracle(shape, kernel, kw, dtype):
    test_medium_sizes_against_oracle(shape, kernel, kw, dtype)


# Each kernel forced (poolfold.ops.max_pool.forced_kernel) on the small cases the oracle can
# afford; tests/test_max_pool_kernels.py goes further per kernel.
KERNEL_PATHS = ["direct", "passes", "separable", "rows", "row_blocks", "lines", "plane_lanes"]


@pytest.mark.parametrize("path", KERNEL_PATHS)
@settings(max_examples=120)
@given(data=st.data())
def test_each_kernel_path_matches_oracle(path, data):
    from poolfold.ops.max_pool import (choose_kernel, forced_kernel, lines_fit,
                                       plane_lanes_fit, resolve_plan, row_blocks_fit)

    case = data.draw(pool_cases(rank=data.draw(st.sampled_from([1, 2, 2, 3, 3, 4]))))
    with forced_kernel(path) as override:
        check_against_oracle(case)
    plan = resolve_plan(poolfold.schema.resolve("MaxPool", case.opset), case.x.shape,
                        case.kernel_shape, case.strides, case.pads, case.dilations,
                        case.auto_pad, case.ceil_mode)
    merged = 1
    if case.storage_order == 0:  # the launch pools the plan without its in-place axes
        plan, merged = plan.planes_from_leading_axes()
    # the kernel forced, unless it cannot pool the plan (the separable kernel cannot stage
    # every plan; the row kernels give no Indices, the row blocks take short rows and
    # windows; no kernel but the direct scan takes a 0-size axis); none for no planes
    expected, _ = choose_kernel(plan, case.x.dtype.itemsize, case.storage_order, path,
                                not case.return_indices,
                                planes=case.x.shape[0] * case.x.shape[1] * merged)
    takes = {"direct": True, "passes": True, "separable": False,
             "rows": not case.return_indices,
             "row_blocks": not case.return_indices and row_blocks_fit(plan),
             "lines": not case.return_indices and lines_fit(plan),
             "plane_lanes": not case.return_indices and plane_lanes_fit(
                 plan, case.x.dtype.itemsize)}[path]
    if takes and min(plan.in_shape) > 0:
        assert expected == path
    assert set(override.ran) <= {expected} and len(override.ran) <= 1
    if case.x.shape[0] * case.x.shape[1] > 0:
        assert override.ran == [expected]


@pytest.mark.parametrize("dtype", FLOATS, ids=lambda t: t.name)
def test_nan_and_signed_zero_hand_picked(dtype):
    width = np.dtype(f"u{dtype.itemsize}")
    table = value_table(dtype)
    one, neg_zero, zero = table[4], table[2], table[3]
    inf, ninf, qnan, nnan, snan = table[7], table[8], table[9], table[10], table[11]
    rows = [
        [one, qnan, one, nnan],  # first NaN wins, payload kept
        [neg_zero, zero, zero, neg_zero],  # ties between -0.0 and 0.0: first wins
        [zero, neg_zero, ninf, ninf],
        [ninf, ninf, ninf, ninf],  # -inf is a real value, not an empty window
        [inf, snan, one, one],  # a NaN after the maximum still wins; sNaN not quieted
    ]
    x = np.array(rows, dtype=width).view(dtype).reshape(1, len(rows), 4)
    for kernel in ([2], [3], [4]):
        for pads in (None, [1, 2], [4, 4]):
            case = Case(None, 22, x, kernel, pads=pads, return_indices=True)
            case.out_shape = expected_geometry([4], kernel, [1], pads or [0, 0], [1],
                                               "NOTSET", False)[0]
            check_against_oracle(case)


# --------------------------------------------------------------------------------------------
# no window fits
# --------------------------------------------------------------------------------------------


@st.composite
def no_fit_cases(draw):
    """A call where, on one axis, no window fits: floor mode, ceil mode or VALID."""
    version = draw(st.sampled_from(VERSIONS))
    r = draw(st.integers(1, 4))
    spatial = draw(st.lists(st.integers(1, 6), min_size=r, max_size=r))
    axis = draw(st.integers(0, r - 1))
    mode = draw(st.sampled_from(["floor", "ceil", "VALID"] if version >= 10 else ["floor", "VALID"]))
    kernel, strides, dilations, pads = [1] * r, [1] * r, [1] * r, [0] * (2 * r)
    n = spatial[axis]
    s = draw(st.integers(1, 3))
    strides[axis] = s
    if mode == "VALID":
        pb = pe = 0
    else:
        pb, pe = draw(st.integers(0, 3)), draw(st.integers(0, 3))
    if version >= 10:
        dilations[axis] = draw(st.integers(1, 3))
    d = dilations[axis]
    # smallest effective kernel that does not fit: n + pb + pe - K < 0 (floor, VALID),
    # or <= -s (ceil: ceil((n+pb+pe-K)/s) + 1 < 1)
    room = n + pb + pe
    need = room + 1 if mode != "ceil" else room + s
    k = ceil_div(need - 1, d) + 1 + draw(st.integers(0, 2))
    kernel[axis] = k
    pads[axis], pads[r + axis] = pb, pe
    auto_pad = "VALID" if mode == "VALID" else "NOTSET"
    ceil_mode = mode == "ceil"
    x = np.zeros((1, 1, *spatial), dtype=F32)
    case = Case(draw(st.sampled_from(OPSETS[version])), version, x, kernel, strides,
                None if auto_pad == "VALID" and draw(st.booleans()) else pads,
                dilations if version >= 10 else None, auto_pad, ceil_mode,
                0, version >= 8 and draw(st.booleans()))
    assert expected_geometry(spatial, kernel, strides, pads, dilations, auto_pad, ceil_mode) is None
    note(repr(case))
    return case


@settings(max_examples=150)
@given(case=no_fit_cases())
def test_no_window_fits_is_an_error(case):
    label = f"MaxPool-{case.version}"
    with pytest.raises(PoolfoldError, match=rf"{label}\b.*no window fits.*'kernel_shape'"):
        case.run()
    with pytest.raises(PoolfoldError, match=rf"{label}\b.*no window fits"):
        poolfold.max_pool_shape(case.x.shape, case.kernel_shape, **case.attrs())
    with pytest.raises(AssertionError, match="no window fits"):  # the oracle agrees
        case.run_oracle()


@settings(max_examples=30, suppress_health_check=[HealthCheck.filter_too_much])
@given(data=st.data())
def test_no_window_fits_generic_cases(data):
    """Cases of the general generator that happen not to fit are refused, never computed."""
    case = data.draw(pool_cases(fit=False))
    with pytest.raises(PoolfoldError, match=rf"MaxPool-{case.version}\b.*no window fits"):
        case.run()
    with pytest.raises(PoolfoldError, match="no window fits"):
        poolfold.max_pool_shape(case.x.shape, case.kernel_shape, **case.attrs())


# --------------------------------------------------------------------------------------------
# properties
# --------------------------------------------------------------------------------------------

BIG = 20000  # no oracle in these: cases may be larger


@settings(max_examples=200)
@given(data=st.data())
def test_indices_point_at_the_values(data):
    """x.flat[I] == Y bitwise where I >= 0; where I == -1, Y is the empty value."""
    case = data.draw(pool_cases(version=draw_version(data, minimum=8), storage_order=0,
                                return_indices=True, budget=BIG))
    y, indices = case.run()
    flat = bits(case.x).reshape(-1)
    y_bits = bits(y)
    hit = indices >= 0
    assert (indices[hit] < case.x.size).all()
    assert np.array_equal(flat[indices[hit]], y_bits[hit])
    empty = np.array(-np.inf if case.x.dtype in FLOATS else np.iinfo(case.x.dtype).min,
                     dtype=case.x.dtype)
    assert (indices[~hit] == -1).all()
    assert (y_bits[~hit] == bits(empty.reshape(1))[0]).all()
    # the index of a plane's output lies in that plane
    planes = case.x.shape[0] * case.x.shape[1]
    if planes and hit.any():
        plane_size = math.prod(case.x.shape[2:])
        plane_of_output = np.arange(planes).reshape(case.x.shape[:2] + (1,) * (y.ndim - 2))
        plane_of_output = np.broadcast_to(plane_of_output, y.shape)
        assert np.array_equal(indices[hit] // plane_size, plane_of_output[hit])


def draw_version(data, minimum=1):
    return data.draw(st.sampled_from([v for v in VERSIONS if v >= minimum]))


@settings(max_examples=200)
@given(data=st.data())
def test_same_equals_explicit_pads(data):
    """SAME_UPPER / SAME_LOWER give what explicit pads from docs/semantics.md's formula give,
    and ceil_mode changes nothing with auto_pad."""
    case = data.draw(pool_cases(auto_pads=("SAME_UPPER", "SAME_LOWER", "VALID"), budget=BIG))
    r = case.x.ndim - 2
    spatial = case.x.shape[2:]
    s = case.strides or [1] * r
    d = case.dilations or [1] * r
    if case.auto_pad == "VALID":
        begins, ends = [0] * r, [0] * r
    else:
        pairs = [same_pads(n, k, ss, dd, case.auto_pad)
                 for n, k, ss, dd in zip(spatial, case.kernel_shape, s, d)]
        begins, ends = [p[0] for p in pairs], [p[1] for p in pairs]
    y, indices = case.run()
    explicit = Case(case.opset, case.version, case.x, case.kernel_shape, case.strides,
                    begins + ends, case.dilations, "NOTSET", False, case.storage_order,
                    case.return_indices)
    y2, indices2 = explicit.run()
    assert_same_bits(y, y2)
    if case.return_indices:
        assert_same_indices(indices, indices2)
    if case.version >= 10:
        case.ceil_mode = not case.ceil_mode
        y3, indices3 = case.run()
        assert_same_bits(y, y3)
        if case.return_indices:
            assert_same_indices(indices, indices3)


@settings(max_examples=200)
@given(data=st.data())
def test_versions_agree_on_shared_types_and_attributes(data):
    """Opset 12 and 22 agree on every type they share; 10 and 11 agree with them on floats;
    8 and 1 on what they can express."""
    case = data.draw(pool_cases(version=12, budget=BIG))
    y, indices = case.run()
    for opset in (22, None):
        case.opset = opset
        y2, indices2 = case.run()
        assert_same_bits(y2, y)
        if case.return_indices:
            assert_same_indices(indices2, indices)
    if case.x.dtype in (F16, F32, F64):
        opsets = [10, 11]
        if case.dilations is None and not case.ceil_mode:
            opsets += [8, 9]
            if case.storage_order == 0 and not case.return_indices:
                opsets += [1, 7]
        for opset in opsets:
            case.opset = opset
            y2, indices2 = case.run()
            assert_same_bits(y2, y)
            if case.return_indices:
                assert_same_indices(indices2, indices)


@settings(max_examples=200)
@given(data=st.data())
def test_storage_order_1_selects_the_same_elements(data):
    """Column-major (first axis fastest) indices, converted per plane to row-major, are the
    storage_order 0 indices; Y does not depend on storage_order."""
    case = data.draw(pool_cases(version=draw_version(data, minimum=8), storage_order=0,
                                return_indices=True, budget=BIG))
    y0, i0 = case.run()
    case.storage_order = 1
    y1, i1 = case.run()
    assert_same_bits(y1, y0)
    spatial = case.x.shape[2:]
    plane_size = math.prod(spatial)
    hit = i1 >= 0
    assert np.array_equal(hit, i0 >= 0)
    if hit.any():
        plane, rest = np.divmod(i1[hit], plane_size)
        pos = np.unravel_index(rest, spatial, order="F")  # first axis fastest
        row_major = plane * plane_size + np.ravel_multi_index(pos, spatial)
        assert np.array_equal(row_major, i0[hit])
    if len(spatial) == 1:  # storage_order is meaningless in 1-D
        assert_same_indices(i1, i0)


@settings(max_examples=200)
@given(data=st.data())
def test_independent_of_memory_layout(data):
    case = data.draw(pool_cases(budget=BIG, layouts=LAYOUTS[1:]))
    before = bits(case.x).copy()  # snapshot taken before any call can write to x
    contiguous = np.array(case.x, order="C", copy=True)
    contiguous_before = bits(contiguous).copy()
    y, indices = case.run()
    y2, indices2 = case.run(contiguous)
    assert_same_bits(y, y2)
    if case.return_indices:
        assert_same_indices(indices, indices2)
    # the input is never written to, in either layout
    assert np.array_equal(bits(case.x), before)
    assert np.array_equal(bits(contiguous), contiguous_before)


@pytest.mark.parametrize("dtype", [F16, F32, F64], ids=lambda t: t.name)
def test_non_native_byte_order_is_the_same_tensor(dtype):
    """A byte-swapped (big-endian on this machine) array is still a float tensor: numpy's own
    reductions accept it, and MaxPool must give the values it gives on the native array."""
    rng = np.random.default_rng(3)
    x = rng.integers(-4, 5, (2, 3, 5, 4)).astype(dtype)
    swapped = x.astype(x.dtype.newbyteorder())
    assert np.array_equal(swapped, x)
    want_y, want_i = poolfold.max_pool(x, [2, 3], pads=[1, 0, 0, 1], return_indices=True)
    got_y, got_i = poolfold.max_pool(swapped, [2, 3], pads=[1, 0, 0, 1], return_indices=True)
    assert np.array_equal(np.asarray(got_y, dtype=dtype), want_y)
    assert_same_indices(got_i, want_i)


def test_output_arrays_are_fresh_and_writable():
    x = np.arange(32, dtype=np.float32).reshape(1, 2, 4, 4)
    y, i = poolfold.max_pool(x, [2, 2], return_indices=True)
    assert y.flags.writeable and i.flags.writeable
    assert not np.shares_memory(y, x) and not np.shares_memory(i, x)
    y[...] = 0
    assert x.max() == 31  # x untouched


def test_lists_and_numpy_integer_attributes_accepted():
    x = np.arange(50, dtype=np.float64).reshape(1, 2, 5, 5)
    want = poolfold.max_pool(x, [3, 2], strides=[2, 1], pads=[1, 0, 1, 1], dilations=[1, 2])
    got = poolfold.max_pool(x, np.array([3, 2]), strides=(np.int32(2), np.int64(1)),
                            pads=np.array([1, 0, 1, 1], dtype=np.int8),
                            dilations=[np.uint8(1), 2])
    assert_same_bits(got, want)
    y_ref, _ = oracle.max_pool(x, [3, 2], strides=[2, 1], pads=[1, 0, 1, 1], dilations=[1, 2])
    assert_same_bits(got, y_ref)


def test_calls_with_the_same_exact_arguments_reuse_their_launch():
    """The kept launch (``_LAUNCHES``) serves only calls the checks treat alike: exact
    Python ints and tuples, the same X shape and type; others are checked afresh."""
    from poolfold.ops import max_pool as module

    x = np.arange(32, dtype=np.float32).reshape(1, 2, 4, 4)
    module._LAUNCHES.clear()
    first = poolfold.max_pool(x, [2, 2], strides=[1, 1])
    assert len(module._LAUNCHES) == 1
    launch = next(iter(module._LAUNCHES.values()))
    again = poolfold.max_pool(x, (2, 2), strides=(1, 1))  # tuples and lists alike
    assert len(module._LAUNCHES) == 1 and next(iter(module._LAUNCHES.values())) is launch
    np.testing.assert_array_equal(first, again)
    poolfold.max_pool(x, [np.int64(2), 2])  # a numpy integer: checked, not kept
    assert len(module._LAUNCHES) == 1
    with pytest.raises(TypeError, match="kernel_shape"):
        poolfold.max_pool(x, [2.0, 2])  # equal to 2, but refused: never served a launch
    with pytest.raises(TypeError, match="ceil_mode"):
        poolfold.max_pool(x, [2, 2], strides=[1, 1], ceil_mode=[1])  # unhashable
    poolfold.max_pool(x.astype(np.float64), [2, 2], strides=[1, 1])  # another type
    assert len(module._LAUNCHES) == 2
