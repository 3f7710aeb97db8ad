"""Hostile calls, as plain data: hypothesis strategies draw *case specs* and :func:`build`
turns a spec into arrays and arguments.

A spec holds only literals (dicts, lists, tuples, numbers, strings, bytes, None), so a failing
case prints as one line that :func:`read_spec` reads back and :func:`build` rebuilds exactly:
arrays are described (dtype, shape, layout, value kind, seed) rather than stored, numpy
arrays given as attributes are the tuple ``("__ndarray__", dtype, values)`` and numpy scalars
``("__scalar__", dtype, value)``.

Most draws are near-valid (so that many calls compute values the oracle can check); the rest
break one thing at a time: an attribute of the wrong length, sign, type or size, a kernel
larger than the input, ranks 0 to 7, zero-size axes, every numpy and ml_dtypes type plus object
and string arrays, big-endian, strided, reversed, Fortran-order, broadcast and read-only
arrays, Indices out of range, negative, of the wrong type or shape, output_shape huge or
inconsistent.  The averaging family (AveragePool, LpPool and the global pools, both domains)
adds p of every wrong kind (0, negative, non-integral, a float where an int is wanted, bool,
huge, NaN, inf), count_include_pad values, fused activations, kernels long enough for the
running sums, and nodes carrying attributes or outputs their op lacks.
"""

from __future__ import annotations

import ast
import math
import sys

import ml_dtypes
import numpy as np
from hypothesis import strategies as st

# The op's own types first: drawn most often, so that most calls reach a kernel.
POOL_DTYPES = ["float32", "float64", "float16", "bfloat16", "int8", "uint8"]
OTHER_DTYPES = [
    "bool", "int16", "int32", "int64", "uint16", "uint32", "uint64", "longdouble",
    "complex64", "complex128", "clongdouble", "datetime64[ns]", "timedelta64[s]", "U3", "S3",
    "object_str", "object_mixed", "V4", "struct", "float8_e4m3fn", "float8_e5m2",
    "float8_e4m3fnuz", "float8_e5m2fnuz", "float8_e4m3b11fnuz", "float4_e2m1fn", "int4",
    "uint4", "int2",
]
COL2IM_DTYPES = POOL_DTYPES + ["bool", "int16", "int32", "int64", "uint16", "uint32", "uint64",
                               "complex64", "complex128", "U3", "S3", "object_str"]
LAYOUTS = ["C", "F", "strided", "reversed", "swapped", "readonly", "broadcast", "list"]
VALUE_KINDS = ["small", "normal", "bits", "special"]
HOSTILE_INTS = [0, -1, -2, 2**31, 2**40, 2**40 + 1, 2**62, -(2**62), 2**63 - 1]
HOSTILE_ITEMS = [2.0, 1.5, True, False, "2", None, [1], b"1", float("inf")]

# The averaging family, ai.onnx and channels-last: windowed ops take (X, kernel_shape), the
# global ones X alone.
WINDOWED_OPS = ("average_pool", "lp_pool", "nhwc.average_pool", "nhwc.lp_pool")
GLOBAL_OPS = ("global_max_pool", "global_average_pool", "global_lp_pool",
              "nhwc.global_max_pool", "nhwc.global_average_pool", "nhwc.global_lp_pool")
AVERAGING_OPS = WINDOWED_OPS + GLOBAL_OPS

OPS = ("max_pool", "max_pool_shape", "max_unpool", "col2im", "nhwc.max_pool",
       "nhwc.max_unpool") + AVERAGING_OPS
OP_TYPES = {"max_pool": "MaxPool", "max_pool_shape": "MaxPool", "max_unpool": "MaxUnpool",
            "col2im": "Col2Im", "nhwc.max_pool": "MaxPool", "nhwc.max_unpool": "MaxUnpool"}
OP_TYPES.update({op: {"average_pool": "AveragePool", "lp_pool": "LpPool",
                      "global_max_pool": "GlobalMaxPool",
                      "global_average_pool": "GlobalAveragePool",
                      "global_lp_pool": "GlobalLpPool"}[op.removeprefix("nhwc.")]
                 for op in AVERAGING_OPS})


# ------------------------------------------------------------------------------ dtypes

def numpy_dtype(name: str) -> np.dtype:
    if name in ("object_str", "object_mixed"):
        return np.dtype(object)
    if name == "struct":
        return np.dtype([("a", "<i4"), ("b", "<f4")])
    if hasattr(ml_dtypes, name):
        return np.dtype(getattr(ml_dtypes, name))
    return np.dtype(name)


def _values(name: str, shape, kind: str, rng: np.random.Generator) -> np.ndarray:
    """A C-contiguous array of ``shape`` and type ``name`` with values of ``kind``."""
    dtype = numpy_dtype(name)
    size = math.prod(shape)
    if name == "object_str" or dtype.kind in "US":
        words = ["", "a", "bc", "x", "yz", "é", "q"]
        picks = [words[i] for i in rng.integers(0, len(words), size)]
        if dtype.kind == "S":
            return np.array([w.encode("utf-8")[:3] for w in picks], dtype).reshape(shape)
        return np.array(picks, dtype if dtype.kind == "U" else object).reshape(shape)
    if name == "object_mixed":
        pool = np.array(["a", 1, None, 2.5, b"b", (1,)], dtype=object)
        return pool[rng.integers(0, len(pool), size)].reshape(shape)
    if dtype.kind == "V" or dtype.names:
        return np.frombuffer(rng.bytes(size * dtype.itemsize), dtype).reshape(shape).copy()
    if dtype.kind == "b":
        return rng.integers(0, 2, size).astype(bool).reshape(shape)
    if dtype.kind in "mM":
        return rng.integers(-5, 5, size).astype(dtype).reshape(shape)
    sub_byte = name in ("int4", "uint4", "int2", "float4_e2m1fn")
    if kind == "bits" and not sub_byte:
        return np.frombuffer(rng.bytes(size * dtype.itemsize), dtype).reshape(shape).copy()
    if kind == "special" and (dtype.kind in "fc" or name.startswith(("float", "bfloat"))):
        special = np.array([np.nan, np.inf, -np.inf, -0.0, 0.0, 1.0, -1.0, 65504.0, 1e-8],
                           np.float64)
        with np.errstate(all="ignore"):
            return special[rng.integers(0, len(special), size)].astype(dtype).reshape(shape)
    if kind == "small" or sub_byte:
        return rng.integers(-1 if name in ("uint4", "int2") else -3, 2, size).clip(
            0 if name.startswith("u") else -2, None).astype(dtype).reshape(shape)
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return rng.integers(info.min, info.max, size, endpoint=True, dtype=dtype).reshape(shape)
    with np.errstate(all="ignore"):
        return (rng.standard_normal(size) * 10).astype(dtype).reshape(shape)


def make_array(spec: dict):
    """The array an array spec describes (or, for the ``list`` layout, a nested list)."""
    rng = np.random.default_rng(spec["seed"])
    shape = tuple(spec["shape"])
    name, kind = spec["dtype"], spec["values"]
    array = None
    for layout in spec["layout"]:
        if layout == "strided" and shape:
            wide = _values(name, shape[:-1] + (2 * shape[-1],), kind, rng)
            array = wide[..., ::2]
        elif layout == "broadcast" and shape:
            base = _values(name, (1,) + shape[1:], kind, rng)
            array = np.broadcast_to(base, shape)
    if array is None:
        array = _values(name, shape, kind, rng)
    for layout in spec["layout"]:
        if layout == "F":
            array = np.asfortranarray(array)
        elif layout == "reversed" and array.ndim:
            array = array[(slice(None, None, -1),) * array.ndim]
        elif layout == "swapped" and array.dtype.kind not in "OV" and array.dtype.itemsize > 1:
            array = array.astype(array.dtype.newbyteorder(">" if sys.byteorder == "little" else "<"))
        elif layout == "readonly":
            array = array.view()
            array.flags.writeable = False
    if "list" in spec["layout"] and array.dtype.kind in "fiub":
        return array.tolist()
    return array


def decode(value):
    """An attribute value from its spec: ``("__ndarray__", dtype, values)`` is an array."""
    if isinstance(value, tuple) and value and value[0] == "__ndarray__":
        try:
            return np.array(value[2], dtype=value[1])
        except (OverflowError, ValueError, TypeError):  # a value the type cannot hold
            return np.array(value[2], dtype=object)
    if isinstance(value, tuple) and value and value[0] == "__scalar__":
        return np.dtype(value[1]).type(value[2])
    return value


def read_spec(text: str):
    """A spec from its printed line: ``ast.literal_eval``, with the ``nan`` and ``inf`` that
    ``repr`` writes for those floats read back as floats."""
    tree = ast.parse(text.strip(), mode="eval")

    class Floats(ast.NodeTransformer):
        def visit_Name(self, node):
            if node.id in ("nan", "inf"):
                return ast.copy_location(ast.Constant(float(node.id)), node)
            return node

    return ast.literal_eval(Floats().visit(tree))


# --------------------------------------------------------------------------- strategies

@st.composite
def array_spec(draw, shape, dtypes=None, layouts=LAYOUTS, preferred=POOL_DTYPES):
    # hypothesis leans towards small draws: the likely branch is the low one.
    if dtypes is not None:
        dtype = draw(st.sampled_from(dtypes))
    else:
        dtype = draw(st.sampled_from(preferred if draw(st.integers(0, 5)) < 5
                                     else POOL_DTYPES + OTHER_DTYPES))
    layout = []
    if draw(st.integers(0, 2)) == 0:
        layout = draw(st.lists(st.sampled_from(layouts), min_size=1, max_size=3, unique=True))
    return {"dtype": dtype, "shape": tuple(shape), "layout": tuple(layout),
            "values": draw(st.sampled_from(VALUE_KINDS)), "seed": draw(st.integers(0, 2**31))}


@st.composite
def shapes(draw, min_rank=0, max_rank=7, max_dim=6):
    rank = draw(st.sampled_from([3, 4, 3, 5]) if draw(st.integers(0, 4)) < 3
                else st.integers(min_rank, max_rank))
    if draw(st.integers(0, 6)) == 6:
        max_dim = 2 if rank > 5 else max_dim
        return tuple(draw(st.lists(st.integers(0, max_dim), min_size=rank, max_size=rank)))
    dims = draw(st.lists(st.integers(1, max_dim if rank <= 4 else 3), min_size=rank,
                         max_size=rank))
    if dims and draw(st.integers(0, 10)) == 10:  # one long axis
        dims[draw(st.integers(0, rank - 1))] = draw(st.integers(7, 40))
    return tuple(dims)


def hostile_value():
    return st.one_of(st.sampled_from(HOSTILE_INTS), st.sampled_from(HOSTILE_ITEMS))


@st.composite
def int_list(draw, length, low, high, optional=True):
    """An attribute of ``length`` integers in [low, high], usually; else broken one way."""
    roll = draw(st.integers(0, 19))
    if optional and roll < 3:
        return None
    valid = draw(st.lists(st.integers(low, high), min_size=length, max_size=length))
    if roll < 14:
        return valid if roll % 2 else tuple(valid)
    if roll == 14:  # wrong length
        other = draw(st.integers(0, 8).filter(lambda n: n != length))
        return draw(st.lists(st.integers(low, high), min_size=other, max_size=other))
    if roll in (15, 16) and valid:  # one bad element
        valid[draw(st.integers(0, len(valid) - 1))] = draw(hostile_value())
        return valid
    if roll == 17:  # a numpy array, of an integer type or not
        return ("__ndarray__", draw(st.sampled_from(["int64", "int32", "uint8", "float64"])),
                valid)
    return draw(st.sampled_from([3, "abc", b"ab", {"a": 1}, [[1, 2]], 2.0, [], None]))


def choice(valid, hostile, p_valid=12):
    """``valid`` values most of the time, ``hostile`` ones 1 in ``p_valid + 1``."""
    return st.integers(0, p_valid).flatmap(
        lambda roll: st.sampled_from(hostile if roll == p_valid else valid))


OPSETS = choice([None] * 6 + [1, 7, 8, 9, 10, 11, 12, 17, 18, 21, 22, 23],
                [0, -1, 2**62, "12", 12.0, True, 5])
COL2IM_OPSETS = choice([None] * 6 + [18, 19, 22, 23], [17, 1, -1, "18"])
AUTO_PADS = choice(["NOTSET"] * 6 + ["SAME_UPPER", "SAME_LOWER", "VALID"],
                   ["same_upper", b"VALID", 3, None, ""])
FLAGS = choice([0] * 4 + [1], [2, -1, True, "1", 1.0, None])


@st.composite
def window_attributes(draw, rank, dilations=True):
    attrs = {
        "kernel_shape": draw(int_list(rank, 1, 4, optional=False)),
        "strides": draw(int_list(rank, 1, 3)),
        "pads": draw(int_list(2 * rank, 0, 3)),
    }
    if dilations:
        attrs["dilations"] = draw(int_list(rank, 1, 3))
    return {k: v for k, v in attrs.items() if v is not None}


@st.composite
def max_pool_case(draw, channels_last=False):
    shape = draw(shapes())
    rank = max(len(shape) - 2, 1)
    kwargs = draw(window_attributes(rank))
    for name, strategy in (("auto_pad", AUTO_PADS), ("ceil_mode", FLAGS),
                           ("storage_order", FLAGS), ("opset", OPSETS)):
        if draw(st.booleans()):
            kwargs[name] = draw(strategy)
    kwargs["return_indices"] = draw(choice([False, True], [1, None, "yes"]))
    if channels_last and draw(st.integers(0, 3)) == 3:
        kwargs["activation"] = draw(choice(["Relu"], ["relu", "Tanh", "Nope", 3, ""]))
        if draw(st.integers(0, 5)) == 5:
            kwargs["activation_params"] = draw(st.sampled_from([[], [0.5], [1, 2, 3], "x"]))
    op = "nhwc.max_pool" if channels_last else "max_pool"
    preferred = [d for d in POOL_DTYPES if d != "bfloat16"] if channels_last else POOL_DTYPES
    return {"op": op, "x": draw(array_spec(shape, preferred=preferred)), "kwargs": kwargs}


@st.composite
def max_pool_shape_case(draw):
    shape = list(draw(shapes(max_dim=10)))
    if shape and draw(st.integers(0, 4)) == 4:
        shape[draw(st.integers(0, len(shape) - 1))] = draw(hostile_value())
    elif shape and draw(st.integers(0, 6)) == 6:
        shape[draw(st.integers(0, len(shape) - 1))] = 2**40
    rank = max(len(shape) - 2, 1)
    kwargs = draw(window_attributes(rank))
    for name, strategy in (("auto_pad", AUTO_PADS), ("ceil_mode", FLAGS), ("opset", OPSETS)):
        if draw(st.booleans()):
            kwargs[name] = draw(strategy)
    container = draw(st.sampled_from(["tuple", "list", "ndarray", "tuple", "list", "other"]))
    if container == "other":
        return {"op": "max_pool_shape", "kwargs": kwargs,
                "input_shape": draw(st.sampled_from([7, None, "abc", b"\x01\x01\x04", 2.5]))}
    value = tuple(shape) if container == "tuple" else shape
    if container == "ndarray" and all(type(v) is int and abs(v) < 2**62 for v in shape):
        value = ("__ndarray__", "int64", shape)
    return {"op": "max_pool_shape", "input_shape": value, "kwargs": kwargs}


INDEX_KINDS = ["in_range"] * 8 + ["out_of_range", "negative", "huge", "int32", "float64",
                                  "wrong_shape", "list", "uint64", "readonly_reversed"]


@st.composite
def max_unpool_case(draw, channels_last=False):
    shape = draw(shapes())
    rank = max(len(shape) - 2, 1)
    kwargs = draw(window_attributes(rank, dilations=False))
    if draw(st.booleans()):
        kwargs["opset"] = draw(OPSETS)
    roll = draw(st.integers(0, 9))
    output_shape = None
    if roll >= 6:
        output_shape = ("grow", tuple(draw(st.lists(st.integers(0, 3), min_size=rank,
                                                    max_size=rank))))
    elif roll == 5:
        output_shape = draw(st.sampled_from([
            ("huge",), ("swap_nc",), ("short",), ("zero",), ("negative",), ("int32",),
            ("float",), ("2d",), ("scalar",),
        ]))
    if channels_last and draw(st.integers(0, 4)) == 4:
        kwargs["activation"] = draw(choice(["Relu"], ["Softmax", 1]))
    op = "nhwc.max_unpool" if channels_last else "max_unpool"
    preferred = POOL_DTYPES[:3] if channels_last else POOL_DTYPES[:4]
    return {"op": op, "x": draw(array_spec(shape, preferred=preferred)), "kwargs": kwargs,
            "indices": {"kind": draw(st.sampled_from(INDEX_KINDS)),
                        "seed": draw(st.integers(0, 2**31))},
            "output_shape": output_shape}


@st.composite
def col2im_case(draw):
    rank = draw(st.sampled_from([1, 2, 2, 3]) if draw(st.integers(0, 9)) < 9
                else st.sampled_from([0, 4]))
    image = draw(st.lists(st.integers(1, 6), min_size=rank, max_size=rank))
    block = draw(st.lists(st.integers(1, 3), min_size=rank, max_size=rank))
    kwargs = {}
    for name, low, high, length in (("strides", 1, 2, rank), ("dilations", 1, 2, rank),
                                    ("pads", 0, 2, 2 * rank)):
        if draw(st.booleans()):
            kwargs[name] = draw(st.lists(st.integers(low, high), min_size=length,
                                         max_size=length))
    strides = kwargs.get("strides", [1] * rank)
    dilations = kwargs.get("dilations", [1] * rank)
    pads = kwargs.get("pads", [0] * 2 * rank)
    blocks = [(image[a] + pads[a] + pads[a + rank] - (block[a] - 1) * dilations[a] - 1)
              // strides[a] + 1 for a in range(rank)]
    n, c = draw(st.integers(0, 2)), draw(st.integers(0, 2))
    shape = [n, c * math.prod(block), max(math.prod(blocks), 0)]
    roll = 9 - draw(st.integers(0, 9))
    if roll == 0:
        shape[draw(st.integers(1, 2))] += draw(st.sampled_from([-1, 1]))
    elif roll == 1:
        shape = list(draw(shapes(max_rank=5)))
    elif roll == 2:  # a hostile image or block shape, or a hostile attribute
        target = draw(st.sampled_from(["image", "block", "strides", "dilations", "pads"]))
        if target == "image":
            image = draw(int_list(rank, 1, 6, optional=False))
        elif target == "block":
            block = draw(int_list(rank, 1, 3, optional=False))
        else:
            kwargs[target] = draw(int_list(rank * (2 if target == "pads" else 1), 0, 3))
    elif roll == 3 and rank:  # an image that would need terabytes, with one block
        image, block = [2**40] * rank, [1] * rank
        kwargs = {"strides": [2**40] * rank}
        shape = [1, 1, 1]
    shape = [max(v, 0) if isinstance(v, int) else v for v in shape]
    if draw(st.integers(0, 4)) == 4:
        image = ("__ndarray__", draw(st.sampled_from(["int64", "int32"])), image)
    if draw(st.booleans()):
        kwargs["opset"] = draw(COL2IM_OPSETS)
    return {"op": "col2im", "x": draw(array_spec(shape, dtypes=draw(
        st.sampled_from([COL2IM_DTYPES, COL2IM_DTYPES, None, OTHER_DTYPES])))),
        "image_shape": image, "block_shape": block, "kwargs": kwargs}


# ------------------------------------------------------------------- the averaging family

AVERAGING_DTYPES = ["float32", "float64", "float16", "bfloat16"]
# Opsets at, between and below the family's versions (1, 2, 7, 10, 11, 18, 19, 22), then
# wrong ones.
AVERAGING_OPSETS = choice([None] * 6 + [1, 2, 6, 7, 9, 10, 11, 17, 18, 19, 21, 22, 23],
                          [0, -1, 2**62, "19", 19.0, True])
COUNT_INCLUDE_PAD = choice([0, 1, 1], [2, -1, True, False, "1", 1.0, None, [1]])
# p: the common values, the scaled sums' (float64 aside, p > 7 takes them), floats (valid
# in version 1 only), then every wrong kind.
P_VALUES = choice([2, 2, 1, 3, 4, 1, 3, 8, 9, 65, 2.0, 0.5, 1.5, 2.5, 0.01,
                   ("__scalar__", "int64", 3), ("__scalar__", "float32", 1.5)],
                  [0, -1, -2, 0.0, -0.5, True, False, 2**31, 2**62, 2**63 - 1, 2**64, 1e300,
                   float("inf"), float("nan"), "2", None, [2], b"2",
                   ("__scalar__", "bool", True), ("__ndarray__", "int64", 2)], p_valid=4)
# LpPool-1 and GlobalLpPool-1 take p as a float: any value > 0, below 1 too.
FLOAT_P_VALUES = choice([0.5, 1.5, 2.5, 0.25, 0.1, 0.05, 0.01, 3.7, 7.5, 12.25, 2.0, 1.0, 3],
                        [0.0, -1.5, 1e300, 1e-300, float("inf"), float("nan"), "0.5"], p_valid=6)
# Monotone non-decreasing activations (so that the judge can bound them), then bad ones.
ACTIVATION_CHOICES = choice(
    [("Relu", None), ("Tanh", None), ("Sigmoid", None), ("LeakyRelu", [0.25]),
     ("Clip", [-0.5, 0.75]), ("HardSigmoid", [0.5, 0.25])],
    [("relu", None), ("Nope", None), (3, None), ("", None), ("Relu", [1.0]), ("Clip", [1.0]),
     ("LeakyRelu", []), ("Relu", "x"), (None, [0.5]), ("Tanh", [True])], p_valid=6)
# What a node may carry beyond its op's attributes, or an attribute another version has.
NODE_EXTRAS = [{"storage_order": 0}, {"storage_order": 1}, {"activation": "Relu"},
               {"kernel_shape": [2]}, {"p": 2}, {"count_include_pad": 0}, {"dilations": [1]},
               {"ceil_mode": 0}, {"alpha": 1.0}]


@st.composite
def averaging_window_attributes(draw, rank):
    """MaxPool's hostile window attributes, with kernels long enough for running sums (more
    than 5 taps over an axis they cross many times), and now and then a stride, pad or
    dilation bigger than the input (windows of padding only) but not past the oracle."""
    attrs = draw(window_attributes(rank))
    kernel = attrs.get("kernel_shape")  # None (a hostile draw) is left out
    if isinstance(kernel, list) and kernel and draw(st.integers(0, 3)) == 3:
        kernel[draw(st.integers(0, len(kernel) - 1))] = draw(st.integers(5, 12))
    if draw(st.integers(0, 7)) == 7:
        name = draw(st.sampled_from(["strides", "pads", "dilations"]))
        length = 2 * rank if name == "pads" else rank
        values = draw(st.lists(st.integers(0 if name == "pads" else 1, 3), min_size=length,
                               max_size=length))
        values[draw(st.integers(0, length - 1))] = draw(st.integers(5, 60))
        attrs[name] = values
    return attrs


@st.composite
def long_window_shape(draw):
    """One long axis (two at most) crossed by a long, stride-1 window: the running sums."""
    rank = draw(st.sampled_from([1, 1, 2]))
    spatial = [draw(st.integers(20, 70))] + [draw(st.integers(1, 4)) for _ in range(rank - 1)]
    if draw(st.booleans()):
        spatial.reverse()
    shape = (draw(st.integers(0, 2)), draw(st.integers(1, 3)), *spatial)
    kernel = [draw(st.integers(6, min(n, 40))) if n >= 20 else draw(st.integers(1, n))
              for n in spatial]
    attrs = {"kernel_shape": kernel}
    if draw(st.booleans()):
        attrs["strides"] = [draw(st.sampled_from([1, 1, 2])) for _ in spatial]
    if draw(st.booleans()):
        attrs["pads"] = [draw(st.integers(0, 4)) for _ in range(2 * rank)]
    return shape, attrs


@st.composite
def wide_shape(draw, windowed):
    """Many channels (channels-last work items take 64 at a time) or many long planes
    (channels-first work items take several small planes as one, and the last fewer): the
    splits of the work, with windows the oracle still checks quickly."""
    if draw(st.booleans()):  # channels past one block
        shape = (draw(st.integers(1, 2)), draw(st.integers(60, 140)),
                 *draw(st.lists(st.integers(1, 5), min_size=1, max_size=2)))
        kernel = [draw(st.integers(1, min(n, 3))) for n in shape[2:]]
        return shape, {"kernel_shape": kernel} if windowed else {}
    shape = (draw(st.integers(1, 3)), draw(st.integers(3, 7)), draw(st.integers(1000, 3000)))
    if not windowed:
        return shape, {}
    # more than 16 taps: not each output's taps summed directly
    return shape, {"kernel_shape": [draw(st.sampled_from([3, 17, 20, 30]))],
                   "strides": [draw(st.integers(40, 200))]}


@st.composite
def averaging_case(draw, op):
    """A hostile call of one op of the averaging family (ai.onnx or channels-last)."""
    channels_last = op.startswith("nhwc.")
    base = op.removeprefix("nhwc.")
    windowed = base in ("average_pool", "lp_pool")
    kwargs = {}
    roll = draw(st.integers(0, 11))
    if windowed and roll >= 10:
        nchw, kwargs = draw(long_window_shape())
    elif roll >= 8:
        nchw, kwargs = draw(wide_shape(windowed))
    else:
        nchw = draw(shapes(max_dim=6 if windowed else 9))
        if windowed:
            kwargs = draw(averaging_window_attributes(max(len(nchw) - 2, 1)))
    if windowed:
        for name, strategy in (("auto_pad", AUTO_PADS), ("ceil_mode", FLAGS)):
            if draw(st.booleans()):
                kwargs[name] = draw(strategy)
    if base == "average_pool" and draw(st.booleans()):
        kwargs["count_include_pad"] = draw(COUNT_INCLUDE_PAD)
    if base.endswith("lp_pool") and draw(st.integers(0, 3)) == 3:  # version 1: a float p
        kwargs["opset"] = 1
        kwargs["p"] = draw(FLOAT_P_VALUES)
    else:
        if base.endswith("lp_pool") and draw(st.integers(0, 3)) > 0:
            kwargs["p"] = draw(P_VALUES)
        if draw(st.booleans()):
            kwargs["opset"] = draw(AVERAGING_OPSETS)
    if op == "nhwc.average_pool" and draw(st.integers(0, 3)) == 3:
        name, params = draw(ACTIVATION_CHOICES)
        if name is not None:
            kwargs["activation"] = name
        if params is not None:
            kwargs["activation_params"] = params
    # channels-last: (N, D1..Dr, C) from the drawn (N, C, D1..Dr)
    shape = ((nchw[0],) + tuple(nchw[2:]) + (nchw[1],) if channels_last and len(nchw) >= 3
             else tuple(nchw))
    preferred = AVERAGING_DTYPES[:3] if channels_last else AVERAGING_DTYPES
    spec = {"op": op, "x": draw(array_spec(shape, preferred=preferred)), "kwargs": kwargs}
    if draw(st.integers(0, 4)) == 4:  # nodes only: see any_case
        spec["node_extra"] = draw(st.sampled_from(NODE_EXTRAS + [{"outputs": 2}]))
    return spec


@st.composite
def any_case(draw, ops=OPS):
    kind = draw(st.sampled_from(ops))
    case = {
        "max_pool": max_pool_case,
        "nhwc.max_pool": lambda: max_pool_case(channels_last=True),
        "max_pool_shape": max_pool_shape_case,
        "max_unpool": max_unpool_case,
        "nhwc.max_unpool": lambda: max_unpool_case(channels_last=True),
        "col2im": col2im_case,
    }.get(kind, lambda: averaging_case(kind))()
    spec = draw(case)
    if kind != "max_pool_shape" and draw(st.integers(0, 4)) == 4:
        spec["via"] = "run_node"
    else:
        spec.pop("node_extra", None)  # a Python call cannot carry them
    return spec


# --------------------------------------------------------------------------- building

def unpool_target_shape(spec, x_shape):
    """The NCHW output shape a MaxUnpool spec asks for, when its attributes make sense
    (used only to draw indices in range); None otherwise."""
    nchw = x_shape if spec["op"] == "max_unpool" else \
        ((x_shape[0], x_shape[-1]) + tuple(x_shape[1:-1]) if len(x_shape) >= 1 else x_shape)
    if len(nchw) < 3:
        return None
    rank = len(nchw) - 2
    kwargs = spec["kwargs"]
    try:
        kernel = [int(v) for v in decode(kwargs["kernel_shape"])]
        strides = [int(v) for v in decode(kwargs.get("strides") or [1] * rank)]
        pads = [int(v) for v in decode(kwargs.get("pads") or [0] * 2 * rank)]
        inferred = [(nchw[2 + a] - 1) * strides[a] + kernel[a] - pads[a] - pads[a + rank]
                    for a in range(rank)]
    except (TypeError, ValueError, IndexError, KeyError, OverflowError):
        return None
    request = spec.get("output_shape")
    if request and request[0] == "grow":
        grow = list(request[1]) + [0] * rank
        base = [max(v, 1) for v in inferred]
        return tuple(nchw[:2]) + tuple(base[a] + grow[a] for a in range(rank))
    if all(1 <= v <= 10**6 for v in inferred):
        return tuple(nchw[:2]) + tuple(inferred)
    return None


def build_output_shape(spec, x_shape):
    request = spec.get("output_shape")
    if request is None:
        return None
    target = unpool_target_shape(spec, x_shape)
    nchw = list(target) if target is not None else [1, 1, 4]
    kind = request[0]
    if kind == "grow":
        return nchw
    if kind == "huge":
        return nchw[:2] + [2**40] * (len(nchw) - 2)
    if kind == "swap_nc":
        return [nchw[1] + 1, nchw[0]] + nchw[2:]
    if kind == "short":
        return nchw[:-1]
    if kind == "zero":
        return nchw[:2] + [0] * (len(nchw) - 2)
    if kind == "negative":
        return nchw[:2] + [-v for v in nchw[2:]]
    if kind == "int32":
        return np.array(nchw, np.int32)
    if kind == "float":
        return np.array(nchw, np.float64)
    if kind == "2d":
        return np.array([nchw], np.int64)
    return 7  # "scalar"


def build_indices(spec, x_shape):
    kind = spec["indices"]["kind"]
    rng = np.random.default_rng(spec["indices"]["seed"])
    nchw = x_shape if spec["op"] == "max_unpool" or len(x_shape) < 2 else \
        (x_shape[0], x_shape[-1]) + tuple(x_shape[1:-1])
    target = unpool_target_shape(spec, x_shape)
    total = min(math.prod(target), 2**62) if target is not None else 16
    if kind == "wrong_shape":
        shape = tuple(nchw) + (2,) if rng.integers(0, 2) else tuple(nchw)[:-1]
        return rng.integers(0, max(total, 1), shape)
    shape = tuple(nchw)
    values = rng.integers(0, max(total, 1), shape, dtype=np.int64)
    if kind == "out_of_range" and values.size:
        values.flat[rng.integers(0, values.size)] = total + rng.integers(0, 3)
    elif kind == "negative" and values.size:
        values.flat[rng.integers(0, values.size)] = -1 - rng.integers(0, 3)
    elif kind == "huge" and values.size:
        values.flat[rng.integers(0, values.size)] = 2**62
    elif kind == "int32":
        return values.astype(np.int32)
    elif kind == "uint64":
        return values.astype(np.uint64)
    elif kind == "float64":
        return values.astype(np.float64)
    elif kind == "list":
        return values.tolist()
    elif kind == "readonly_reversed":
        values = np.asarray(values[(slice(None, None, -1),) * values.ndim])
        values.flags.writeable = False
    return values


def build(spec: dict):
    """(op name, positional arguments, keyword arguments) of the call a spec describes."""
    op = spec["op"]
    kwargs = {k: decode(v) for k, v in spec["kwargs"].items()}
    if op == "max_pool_shape":
        return op, [decode(spec["input_shape"]), kwargs.pop("kernel_shape", None)], kwargs
    x = make_array(spec["x"])
    if op in WINDOWED_OPS:
        return op, [x, kwargs.pop("kernel_shape", None)], kwargs
    if op in GLOBAL_OPS:
        return op, [x], kwargs
    if op in ("max_pool", "nhwc.max_pool"):
        return op, [x, kwargs.pop("kernel_shape", None)], kwargs
    if op in ("max_unpool", "nhwc.max_unpool"):
        x_shape = tuple(np.shape(x))
        kwargs["output_shape"] = build_output_shape(spec, x_shape)
        return op, [x, build_indices(spec, x_shape), kwargs.pop("kernel_shape", None)], kwargs
    return op, [x, decode(spec["image_shape"]), decode(spec["block_shape"])], kwargs
