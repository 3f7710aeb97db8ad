"""Run one case and judge it against the oracle (inside a worker process).

A case passes *by value* when poolfold returns exactly what the oracle returns (same shape,
same type once byte order is set aside, the same bits), and *by error* when it raises
``PoolfoldError`` / ``PoolfoldTypeError`` naming the op for a call the contract refuses too
(:mod:`fuzz.validity`: an invalid call, or one too large for memory where the refusal says
so).  The averaging family adds its sums in any order the contract allows: its values pass
within the contract's bound of the oracle's exact ones (``oracle.assert_within_bound``).
A case fails on any other exception, on a value for a call the contract refuses, on a value
the oracle does not give (or for an input the oracle refuses), and on any change to its
inputs.  Crashes, hangs and memory beyond the limit are caught by the worker's parent.
"""

from __future__ import annotations

import math
from typing import Callable, NamedTuple

import ml_dtypes
import numpy as np
from onnx import helper

import oracle
import poolfold
import poolfold.backend
import poolfold.nhwc
from poolfold import PoolfoldError, PoolfoldTypeError

from . import cases, validity

FUNCTIONS = {
    "max_pool": poolfold.max_pool,
    "max_pool_shape": poolfold.max_pool_shape,
    "max_unpool": poolfold.max_unpool,
    "col2im": poolfold.col2im,
    "nhwc.max_pool": poolfold.nhwc.max_pool,
    "nhwc.max_unpool": poolfold.nhwc.max_unpool,
    "average_pool": poolfold.average_pool,
    "lp_pool": poolfold.lp_pool,
    "global_max_pool": poolfold.global_max_pool,
    "global_average_pool": poolfold.global_average_pool,
    "global_lp_pool": poolfold.global_lp_pool,
    "nhwc.average_pool": poolfold.nhwc.average_pool,
    "nhwc.lp_pool": poolfold.nhwc.lp_pool,
    "nhwc.global_max_pool": poolfold.nhwc.global_max_pool,
    "nhwc.global_average_pool": poolfold.nhwc.global_average_pool,
    "nhwc.global_lp_pool": poolfold.nhwc.global_lp_pool,
}

validity.warm()  # onnxruntime's schemas, read once before the workers fork

# The oracle is pure Python: compare only calls it finishes in well under a second.
ORACLE_BUDGET = 20_000
# The averaging family's oracle adds exactly (Fraction, Decimal): per window tap, about 4 us
# for AveragePool, 15 us for LpPool with an integer p and 120 us with another; per element of
# a global pool, under 1 us.  Budgets in taps (one per output and kernel offset, and one per
# tap read), each about 0.1 s.
AVERAGE_BUDGET = 20_000
LP_BUDGET = 6_000
FRACTIONAL_LP_BUDGET = 800
GLOBAL_BUDGET = 100_000

# nhwc.average_pool's fused activations (SEMANTICS.md), as numpy formulas on float64: every
# one is non-decreasing for the parameters the cases draw, so the interval the contract
# allows for Y maps to an interval for activation(Y).  NaN stays NaN.
ACTIVATIONS = {
    "Relu": lambda v, q: np.where(v < 0, 0.0, v),
    "Tanh": lambda v, q: np.tanh(v),
    "Sigmoid": lambda v, q: 1.0 / (1.0 + np.exp(-v)),
    "LeakyRelu": lambda v, q: np.where(v < 0, q[0] * v, v),
    "Clip": lambda v, q: np.minimum(np.maximum(v, q[0]), q[1]),
    "HardSigmoid": lambda v, q: np.maximum(0.0, np.minimum(1.0, q[0] * v + q[1])),
}


class Failure(Exception):
    """The case failed; the message says how."""


def _snapshot(value):
    if isinstance(value, np.ndarray):
        return value.copy(), value.flags.writeable
    return None


def _native(array: np.ndarray) -> np.ndarray:
    array = np.asarray(array)
    if array.dtype.byteorder not in "=|" and array.dtype.kind not in "OV":
        return array.astype(array.dtype.newbyteorder("="))
    return array


def _nan_free_bits(a: np.ndarray) -> np.ndarray:
    """``a``'s bytes per element with every NaN (of any payload or sign) the same."""
    a = np.array(a)  # a copy, written below
    parts = [a.real, a.imag] if a.dtype.kind == "c" else [a]
    for part in parts:
        if part.dtype.kind == "f" or part.dtype.name == "bfloat16":
            part[np.isnan(part)] = np.nan
    return a


def _same(got, want, what: str, arithmetic: bool = False) -> None:
    """The same shape, type and bits; with ``arithmetic`` (values computed by sums or
    activations, not copied) any NaN equals any NaN: their payloads depend on the order of
    the operations, which no spec fixes."""
    got, want = np.asarray(got), _native(want)
    if arithmetic and got.dtype == want.dtype and got.shape == want.shape:
        got, want = _nan_free_bits(got), _nan_free_bits(want)
    if got.shape != want.shape:
        raise Failure(f"{what}: shape {got.shape}, oracle {want.shape}")
    if want.dtype.kind in "USO":
        if got.dtype.kind not in "USO" or got.tolist() != want.tolist():
            raise Failure(f"{what}: strings differ from the oracle's")
        return
    if got.dtype != want.dtype:
        raise Failure(f"{what}: dtype {got.dtype}, oracle {want.dtype}")
    if got.tobytes() != np.ascontiguousarray(want).tobytes():
        raise Failure(f"{what}: values differ from the oracle's")


def _node(op, args, kwargs, extra=None):
    """The call as an ONNX node and its inputs; attributes helper cannot encode are left out.
    ``extra`` (the averaging family's cases): attributes to add, or ``outputs``: how many."""
    op_type = cases.OP_TYPES[op]
    domain = "com.ms.internal.nhwc" if op.startswith("nhwc.") else ""
    kwargs = dict(kwargs)
    extra = dict(extra or {})
    opset = kwargs.pop("opset", None)
    outputs = ["Y", "Indices"] if kwargs.pop("return_indices", False) is True else ["Y"]
    outputs = outputs if op_type == "MaxPool" else ["Y"]
    outputs += [f"Y{i}" for i in range(1, extra.pop("outputs", 1))]
    if op in cases.AVERAGING_OPS:
        inputs = [args[0]]
        if op in cases.WINDOWED_OPS:
            kwargs["kernel_shape"] = args[1]
        for name, value in extra.items():
            kwargs.setdefault(name, value)
    elif op_type == "MaxPool":
        inputs = [args[0]]
        kwargs["kernel_shape"] = args[1]
    elif op_type == "MaxUnpool":
        inputs = [args[0], args[1]]
        kwargs["kernel_shape"] = args[2]
        output_shape = kwargs.pop("output_shape", None)
        if output_shape is not None:
            inputs.append(np.asarray(output_shape) if not isinstance(output_shape, np.ndarray)
                          else output_shape)
        kwargs.pop("inferred_shape_indices", None)
    else:
        inputs = [args[0]] + [np.asarray(v) if not isinstance(v, np.ndarray) else v
                              for v in args[1:]]
    attributes = []
    for name, value in kwargs.items():
        if value is None:
            continue
        try:
            attributes.append(helper.make_attribute(name, value))
        except Exception:  # not encodable as an attribute: the node simply lacks it
            continue
    names = [f"in{i}" for i in range(len(inputs))]
    node = helper.make_node(op_type, names, outputs, domain=domain)
    node.attribute.extend(attributes)
    read_back = {}
    for attribute in node.attribute:
        value = helper.get_attribute_value(attribute)
        read_back[attribute.name] = value.decode() if isinstance(value, bytes) else value
    return node, inputs, opset, read_back


class Call(NamedTuple):
    """A case ready to run: ``run()`` gives poolfold's result; ``args`` and ``kwargs`` are
    the call as the oracles should see it (for a node: its attributes as they read back)."""

    run: Callable
    args: list
    kwargs: dict


def _prepare(spec) -> Call:
    op, args, kwargs = cases.build(spec)
    if spec.get("via") == "run_node":
        node, inputs, opset, attributes = _node(op, args, kwargs, spec.get("node_extra"))

        def run_node():
            snapshots = [_snapshot(v) for v in inputs]
            try:
                result = poolfold.backend.run_node(node, inputs, opset_version=opset)
            finally:
                _check_untouched(inputs, snapshots)
            result = tuple(result)
            return result if len(node.output) > 1 else result[0]

        kwargs = dict(attributes, opset=opset)
        if op in cases.AVERAGING_OPS:
            kwargs["node_outputs"] = len(node.output)
            args = [args[0]] + ([kwargs.pop("kernel_shape", None)] if op in cases.WINDOWED_OPS
                                else [])
        elif op.endswith("max_pool"):
            kwargs["return_indices"] = len(node.output) > 1
            args = [args[0], kwargs.pop("kernel_shape", None)]
        elif op.endswith("max_unpool"):
            kwargs["output_shape"] = inputs[2] if len(inputs) > 2 else None
            args = [args[0], args[1], kwargs.pop("kernel_shape", None)]
        else:
            args = [args[0], inputs[1], inputs[2]]
        return Call(run_node, args, kwargs)

    def run_function():
        snapshots = [_snapshot(v) for v in args] + [_snapshot(v) for v in kwargs.values()]
        try:
            return FUNCTIONS[op](*args, **kwargs)
        finally:
            _check_untouched(list(args) + list(kwargs.values()), snapshots)

    return Call(run_function, args, kwargs)


def _check_untouched(values, snapshots):
    for value, snap in zip(values, snapshots):
        if snap is None:
            continue
        copy, writeable = snap
        if value.flags.writeable != writeable:
            raise Failure("an input's writeable flag changed")
        if value.dtype.kind == "O":
            same = value.tolist() == copy.tolist()
        else:
            same = value.tobytes() == copy.tobytes()
        if not same:
            raise Failure("an input was modified")


def _oracle_input(x):
    """The oracle checks types with ``==`` and reads element by element: give it the values
    in native byte order, C order (the array poolfold got is left as it was)."""
    return np.ascontiguousarray(_native(np.asarray(x)))


def _cost(shape, kernel) -> int:
    try:
        return math.prod(shape) * math.prod(int(k) for k in kernel)
    except (TypeError, ValueError):
        return 0


def _empty_axis_geometry(shape, kernel, kwargs):
    """The output shape over spatial dims some of which are 0, from docs/semantics.md's
    formulas (the oracle asserts every spatial dim >= 1); None when no window fits.  Every
    window of such an input is empty."""
    rank = len(shape) - 2
    kernel = [int(v) for v in kernel]
    def given(name, default):
        value = kwargs.get(name)
        return [int(v) for v in (default if value is None else value)]

    strides = given("strides", [1] * rank)
    dilations = given("dilations", [1] * rank)
    pads = given("pads", [0] * 2 * rank)
    auto_pad, ceil_mode = kwargs.get("auto_pad", "NOTSET"), bool(kwargs.get("ceil_mode", 0))
    outs = []
    for a in range(rank):
        n, k, s, d, pb, pe = shape[2 + a], kernel[a], strides[a], dilations[a], pads[a], \
            pads[rank + a]
        span = (k - 1) * d + 1
        if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
            out = -(-n // s)
        elif auto_pad == "VALID":
            out = (n - span) // s + 1
        elif ceil_mode:
            out = -(-(n + pb + pe - span) // s) + 1
            out -= (out - 1) * s >= n + pb
        else:
            out = (n + pb + pe - span) // s + 1
        if out < 1:
            return None
        outs.append(out)
    return tuple(shape[:2]) + tuple(outs)


def _relu(y):
    return np.where(y < 0, np.zeros((), y.dtype), y)


def _expected(op, args, kwargs, result):
    """What the oracle returns for the call that gave ``result`` (None when too costly)."""
    kwargs = {k: v for k, v in kwargs.items() if k not in ("opset",)}
    if op == "max_pool_shape":
        shape, kernel = args
        shape = [int(v) for v in shape]
        if 0 in shape[2:]:
            expected = _empty_axis_geometry(shape, kernel, kwargs)
            if expected is None:
                raise Failure("returned a shape where no window fits")
            return expected
        geometry = oracle.max_pool_geometry(
            shape[2:], [int(v) for v in kernel], kwargs.get("strides"), kwargs.get("pads"),
            kwargs.get("dilations"), kwargs.get("auto_pad", "NOTSET"),
            kwargs.get("ceil_mode", False))
        if geometry is None:
            raise Failure("returned a shape where no window fits")
        return tuple(shape[:2]) + geometry[0]
    x = _oracle_input(args[0])
    if op in ("max_pool", "nhwc.max_pool"):
        return_indices = kwargs.pop("return_indices", False)
        activation = kwargs.pop("activation", None)
        kwargs.pop("activation_params", None)
        y_shape = np.shape(result[0] if return_indices else result)
        if _cost(y_shape, args[1]) > ORACLE_BUDGET or x.size > ORACLE_BUDGET:
            return None
        channels_last = op.startswith("nhwc.")
        if channels_last:
            x = np.ascontiguousarray(np.moveaxis(x, -1, 1))
        if x.ndim >= 3 and 0 in x.shape[2:]:
            shape = _empty_axis_geometry(x.shape, args[1], kwargs)
            if shape is None:
                raise Failure("returned a value where no window fits")
            lowest = -np.inf if x.dtype.kind == "f" or x.dtype.name == "bfloat16" \
                else np.iinfo(x.dtype).min
            y, indices = np.full(shape, lowest, x.dtype), np.full(shape, -1, np.int64)
        else:
            y, indices = oracle.max_pool(x, args[1], **kwargs)
        if channels_last:
            y = np.moveaxis(y, 1, -1)
        if activation not in (None, "Relu"):
            return None  # transcendental: no bit-exact reference here
        if activation == "Relu":
            y = _relu(y)
        return (y, indices) if return_indices else y
    if op in ("max_unpool", "nhwc.max_unpool"):
        activation = kwargs.pop("activation", None)
        kwargs.pop("activation_params", None)
        kwargs.pop("inferred_shape_indices", None)
        if x.size > ORACLE_BUDGET or np.size(result) > 10 * ORACLE_BUDGET:
            return None
        channels_last = op.startswith("nhwc.")
        if channels_last:
            x = np.ascontiguousarray(np.moveaxis(x, -1, 1))
        output_shape = kwargs.pop("output_shape", None)
        y = oracle.max_unpool(x, np.asarray(args[1]), args[2], output_shape=output_shape,
                              **kwargs)
        if channels_last:
            y = np.moveaxis(y, 1, -1)
        if activation not in (None, "Relu"):
            return None
        return _relu(y) if activation == "Relu" else y
    # Col2Im
    if _cost(x.shape, args[2]) > ORACLE_BUDGET:
        return None
    return oracle.col2im(x, args[1], args[2], **kwargs)


class Bounded(NamedTuple):
    """The averaging family's expectation: the exact value (float64) and what the contract's
    bound needs, Y's type, the bound's kind ("average", "lp", "max") and the fused activation
    (name, params) if any."""

    exact: np.ndarray
    info: oracle.BoundInfo
    dtype: np.dtype
    kind: str
    activation: tuple | None = None


KINDS = {"average_pool": "average", "lp_pool": "lp", "global_max_pool": "max",
         "global_average_pool": "average", "global_lp_pool": "lp"}


def _plain_p(p):
    """p as the oracle takes it: a Python int or float."""
    if isinstance(p, np.ndarray):
        p = p.item()
    if isinstance(p, (bool, np.bool_, np.integer)):
        return int(p)
    return float(p) if isinstance(p, np.floating) else p


def _expected_averaging(op, args, kwargs):
    """What the oracle says of an averaging-family call that returned (None when too costly)."""
    base = op.removeprefix("nhwc.")
    kind = KINDS[base]
    kwargs = {k: v for k, v in kwargs.items() if k not in ("opset", "node_outputs")}
    activation = kwargs.pop("activation", None)
    params = kwargs.pop("activation_params", None)
    p = _plain_p(kwargs.pop("p", 2))
    x = _oracle_input(args[0])
    dtype = x.dtype
    if op != base:
        x = np.ascontiguousarray(np.moveaxis(x, -1, 1))
    whole = kind != "lp" or float(p).is_integer()
    if base.startswith("global_"):
        if x.size > (GLOBAL_BUDGET if whole else FRACTIONAL_LP_BUDGET):
            return None
        oracle_call = {"max": oracle.global_max_pool, "average": oracle.global_average_pool,
                       "lp": lambda x: oracle.global_lp_pool(x, p=p)}[kind]
        exact, info = oracle_call(x)
    else:
        kernel = [int(v) for v in args[1]]
        window = {k: kwargs.get(k) for k in ("strides", "pads", "dilations")}
        window.update(auto_pad=kwargs.get("auto_pad", "NOTSET"),
                      ceil_mode=int(kwargs.get("ceil_mode", 0)))
        geometry = oracle.max_pool_geometry(x.shape[2:], kernel, window["strides"],
                                            window["pads"], window["dilations"],
                                            window["auto_pad"], window["ceil_mode"])
        if geometry is None:
            raise Failure("returned a value where no window fits")
        y_shape = x.shape[:2] + geometry[0]
        if math.prod(y_shape) == 0:  # no output: the oracle would still visit every window
            exact = np.zeros(y_shape)
            info = oracle.BoundInfo(np.zeros(y_shape, np.int64), exact)
        else:
            taps = math.prod(geometry[0]) * math.prod(kernel) * (1 + x.shape[0] * x.shape[1])
            budget = (AVERAGE_BUDGET if kind == "average" else LP_BUDGET if whole
                      else FRACTIONAL_LP_BUDGET)
            if taps > budget:
                return None
            if kind == "average":
                exact, info = oracle.average_pool(
                    x, kernel, count_include_pad=int(kwargs.get("count_include_pad", 0)),
                    **window)
            else:
                exact, info = oracle.lp_pool(x, kernel, p=p, **window)
    if op != base:
        exact = np.moveaxis(exact, 1, -1)
        info = oracle.BoundInfo(np.moveaxis(info.count, 1, -1), np.moveaxis(info.maxabs, 1, -1))
    return Bounded(exact, info, dtype, kind,
                   None if activation is None else (activation, params or []))


def _check_bounded(result, expected: Bounded) -> None:
    if not isinstance(result, np.ndarray):
        raise Failure(f"returned {type(result).__name__}, expected an array")
    if expected.activation is None:
        try:
            with np.errstate(all="ignore"):  # NaN bits of float16 cast to float64
                oracle.assert_within_bound(result, expected.exact, expected.info,
                                           expected.dtype, expected.kind)
        except AssertionError as error:
            raise Failure(f"Y outside the contract's bound: {error}") from None
        return
    if result.dtype != expected.dtype or result.shape != expected.exact.shape:
        raise Failure(f"Y: {result.dtype} {result.shape}, oracle {expected.dtype} "
                      f"{expected.exact.shape}")
    # activation(Y) for any Y the contract allows: Y in [lo, hi] (or past T's largest value:
    # inf), so activation(Y) in [f(lo), f(hi)], give or take a rounding to T (2 ulp) and
    # float64's own (the formulas).
    name, params = expected.activation
    formula = ACTIVATIONS[name]
    exact, info, dtype = expected.exact, expected.info, expected.dtype
    u = 2.0 ** -53 if dtype == np.float64 else 2.0 ** -24
    largest = float(ml_dtypes.finfo(dtype).max)
    with np.errstate(all="ignore"):
        bound = 2 * oracle.ulp(exact, dtype) + info.count * u * info.maxabs
        finite = np.isfinite(exact)
        lo = np.where(exact < -largest, -np.inf, np.where(finite, exact - bound, exact))
        hi = np.where(exact > largest, np.inf, np.where(finite, exact + bound, exact))
        f_lo, f_hi = formula(lo, params), formula(hi, params)
        slack = 2 * np.maximum(oracle.ulp(f_lo, dtype), oracle.ulp(f_hi, dtype)) + 4e-16
        got = result.astype(np.float64)
        ok = np.where(np.isnan(exact), np.isnan(got),
                      (got >= f_lo - slack) & (got <= f_hi + slack))
    if not ok.all():
        at = tuple(int(v) for v in np.argwhere(~ok)[0])
        raise Failure(f"{name}(Y) outside the contract's bound: {int((~ok).sum())} of "
                      f"{ok.size}; at {at}: got {got[at]!r}, allowed [{f_lo[at]!r}, "
                      f"{f_hi[at]!r}] (exact Y {exact[at]!r})")


# What a refusal for size says (the library's own wording, or numpy's for an empty array
# whose other dims overflow its index range).
SIZE_WORDS = ("more than this machine's memory", "array is too big", "cannot allocate")


def _judge_refusal(op, args, kwargs, error) -> tuple[str, str]:
    """A refusal passes only where the contract refuses the call too (or may: ``EITHER``),
    or where the call is too large and the refusal says so.  A refusal of a call the
    contract says is valid fails, whether or not the value oracle could compute it: a
    regression that refuses valid calls must not pass as "by error"."""
    found = validity.verdict(op, args, kwargs)
    detail = f"{type(error).__name__}: {error} [contract: {found.kind}: {found.reason}]"
    if found.kind in (validity.INVALID, validity.EITHER):
        return "error", detail
    if found.kind == validity.TOO_LARGE:
        if any(words in str(error) for words in SIZE_WORDS):
            return "error", detail
        return "fail", f"refused a call too large for memory without saying so: {detail}"
    return "fail", f"refused a call the contract says is valid: {detail}"


def judge(spec) -> tuple[str, str]:
    """("value" | "error" | "unchecked" | "fail", detail) for one case.  "unchecked" is a
    returned value too large for the oracle; "error" details say whether the oracle would
    have computed a value (an input poolfold refuses but the oracle does not)."""
    op = spec["op"]
    op_type = cases.OP_TYPES[op]
    call = _prepare(spec)
    args, kwargs = call.args, call.kwargs
    try:
        result = call.run()
    except Failure as failure:
        return "fail", str(failure)
    except (PoolfoldError, PoolfoldTypeError) as error:
        if op_type not in str(error):
            return "fail", f"{type(error).__name__} does not name {op_type}: {error}"
        return _judge_refusal(op, args, kwargs, error)
    except Exception as error:  # noqa: BLE001 - any other exception is the defect sought
        return "fail", f"{type(error).__name__}: {error}"
    found = validity.verdict(op, args, kwargs)
    if found.kind == validity.INVALID:
        return "fail", f"computed a call the contract refuses: {found.reason}"
    if op in cases.AVERAGING_OPS:
        return _judge_averaging_value(op, args, kwargs, result)
    try:
        expected = _expected(op, args, kwargs, result)
    except Failure as failure:
        return "fail", str(failure)
    except Exception as error:  # noqa: BLE001
        return "fail", f"accepted a call the oracle refuses ({type(error).__name__}: {error})"
    if expected is None:
        return "unchecked", ""
    arithmetic = op == "col2im" or bool(kwargs.get("activation"))
    try:
        if op == "max_pool_shape":
            if tuple(result) != tuple(expected) or not all(type(v) is int for v in result):
                raise Failure(f"shape {result}, oracle {expected}")
        elif isinstance(expected, tuple):
            if not isinstance(result, tuple) or len(result) != 2:
                raise Failure(f"returned {type(result).__name__}, expected (Y, Indices)")
            _same(result[0], expected[0], "Y", arithmetic)
            _same(result[1], expected[1], "Indices")
        else:
            if not isinstance(result, np.ndarray):
                raise Failure(f"returned {type(result).__name__}, expected an array")
            _same(result, expected, "output", arithmetic)
    except Failure as failure:
        return "fail", str(failure)
    return "value", ""


def _judge_averaging_value(op, args, kwargs, result) -> tuple[str, str]:
    """A value of the averaging family passes within the contract's bound of the exact
    result."""
    try:
        expected = _expected_averaging(op, args, kwargs)
    except Failure as failure:
        return "fail", str(failure)
    except Exception as error:  # noqa: BLE001
        return "fail", f"accepted a call the oracle refuses ({type(error).__name__}: {error})"
    if expected is None:
        return "unchecked", ""
    try:
        _check_bounded(result, expected)
    except Failure as failure:
        return "fail", str(failure)
    return "value", ""
