"""Input checks shared by the ops, and the fused activation they apply."""

from __future__ import annotations

import numpy as np

from .. import activations, dtypes
from ..errors import PoolfoldError, PoolfoldTypeError
from ..kernels.activation import IDENTITY, activate_in_place
from ..geometry import INEXACT, exact_key
from ..kernels.threads import kernel_threads, launch_split
from ..schema import OpVersion


# The most values of an int64 array a call's key holds (a shape input holds one per axis).
SHORT_ARRAY = 64


def _int64_array_key(values):
    """A shape input (Col2Im's image_shape and block_shape) as the tensor an ONNX model
    holds: a short 1-D int64 array, whose checks depend on its values alone, as a key marked
    so that it equals no list's (which the checks treat otherwise); else INEXACT.  Without
    it, every call with such arrays was checked and planned afresh: 0.14-0.23 ms of a 0.1 ms
    Col2Im (4x4 blocks at stride 2 onto (1,16,64,64))."""
    if (type(values) is np.ndarray and values.dtype == np.int64 and values.ndim == 1
            and values.size <= SHORT_ARRAY):
        return ("int64 array", *values.tolist())
    return INEXACT


class CallCache:
    """The launch of every call whose arguments were checked before, by their exact values:
    a model makes the same calls every run, and the checks and planning cost a small call
    more than its kernel (measured: 15 us of Python per MaxPool call on a (1,1,8,8) input, 4
    with this; after a kernel that leaves the caches cold, about three times as much)."""

    def __init__(self, size: int = 256):
        self.size = size
        self.launches: dict = {}

    def key(self, x, windows: tuple, scalars: tuple) -> tuple | None:
        """A key equal only for calls the checks treat alike: X's shape and type, the window
        attributes ``windows`` by :func:`poolfold.geometry.exact_key` (short int64 arrays by
        :func:`_int64_array_key`), each of ``scalars`` with its type, and the thread count.
        None where a value is not exact or X is no native-order ndarray: those calls are
        checked afresh (as are calls whose key cannot be hashed, see :meth:`find`)."""
        if type(x) is not np.ndarray or not x.dtype.isnative:
            return None
        # one flat tuple: hashed on every call, where nested ones cost twice as much
        key = [x.shape, x.dtype, kernel_threads(), *scalars, *map(type, scalars)]
        for values in windows:
            exact = exact_key(values)
            if exact is INEXACT:
                exact = _int64_array_key(values)
                if exact is INEXACT:
                    return None
            key.append(exact)
        return tuple(key)

    def find(self, x, windows: tuple, scalars: tuple) -> tuple:
        """(the call's :meth:`key`, the launch kept for it or None).  The caller prepares a
        launch where there is none (its checks, then :meth:`keep`), in a branch of its own
        rather than through a function handed in: a closure over the call's arguments cost
        0.5 us of every call, hit or miss (measured, batch-1 MaxPool)."""
        key = self.key(x, windows, scalars)
        if key is None:
            return None, None
        try:
            return key, self.launches.get(key)
        except TypeError:  # an unhashable attribute: the checks say what is wrong with it
            return None, None

    def keep(self, key, launch) -> None:
        """Keep ``launch`` for the calls of ``key`` (none where the key is None)."""
        if key is not None:
            if len(self.launches) >= self.size:
                self.launches.clear()
            self.launches[key] = launch

    def clear(self) -> None:
        self.launches.clear()

    def values(self):
        return self.launches.values()

    def __len__(self) -> int:
        return len(self.launches)


# (version row, dtype, input) triples whose type check passed: the check, a dozen numpy
# attribute reads, is most of a small call's cost, and its result depends on nothing else.
_ACCEPTED_TYPES: dict = {}


def as_tensor(spec: OpVersion, value, name: str, min_rank: int = 3) -> np.ndarray:
    """``value`` as an ndarray of a type the version accepts, of rank >= ``min_rank``."""
    if not isinstance(value, np.ndarray):
        try:
            value = np.asarray(value)
        except (ValueError, TypeError) as error:
            raise not_convertible(spec, name, error) from None
    check_tensor(spec, value.dtype, value.shape, name, min_rank)
    return native(value)


def not_convertible(spec: OpVersion, name: str, error: Exception) -> PoolfoldTypeError:
    """The error for an input that no array can be made of (in memory or chunked)."""
    return PoolfoldTypeError(
        f"{spec.label}: input '{name}' is not convertible to an array: {error}"
    )


def check_tensor(spec: OpVersion, dtype: np.dtype, shape: tuple, name: str,
                 min_rank: int = 3) -> None:
    """Refuse an input of a type the version does not accept, or of rank below ``min_rank``:
    the checks of in-memory and chunked inputs alike, made on the dtype and shape only."""
    accepted = (id(spec), dtype, name)
    if accepted not in _ACCEPTED_TYPES:
        spec.check_type(dtype, name)  # raises for a type the version refuses
        if len(_ACCEPTED_TYPES) >= 1024:  # string widths are dtypes of their own: stay small
            _ACCEPTED_TYPES.clear()
        _ACCEPTED_TYPES[accepted] = spec  # holding the row keeps its id from being reused
    if len(shape) < min_rank:
        raise PoolfoldError(
            f"{spec.label}: input '{name}' must have rank >= {min_rank} "
            f"(N, C and at least one spatial axis), got shape {shape}"
        )


def byte_swapped(dtype: np.dtype) -> bool:
    """Whether values of ``dtype`` must be put in the machine's byte order for the kernels."""
    return dtype.byteorder not in "=|" and dtype.kind not in "OUS"


def kernel_input(array: np.ndarray) -> np.ndarray:
    """``array`` as a read-only view: how every input is handed to a kernel.

    numba compiles a kernel once per type of its arguments, and whether an array may be
    written is part of its type: read-only inputs (``np.frombuffer``, onnx's tensors, memory
    maps, dask's chunks) would compile each kernel a second time, seconds to tens of seconds
    apiece.  Kernels never write their inputs, so they always get them read-only, and one
    compile serves writeable and read-only callers alike."""
    view = array.view()
    view.flags.writeable = False
    return view


def kernel_rows(x: np.ndarray, rows: int, value_type: np.dtype) -> np.ndarray:
    """X's values as ``rows`` rows of ``value_type`` (the kernel's view of X's type), read
    only as :func:`kernel_input`."""
    view = as_rows(np.ascontiguousarray(x), rows, value_type)  # a new view: its flag its own
    view.flags.writeable = False
    return view


def as_rows(array: np.ndarray, rows: int, value_type: np.dtype) -> np.ndarray:
    """A C-contiguous ``array`` as ``rows`` > 0 rows of ``value_type``, in as few numpy calls
    as can make it: a batch-1 call makes this each time, and runs in a few tens of
    microseconds all told."""
    view = array.reshape(rows, -1)
    return view if view.dtype is value_type else view.view(value_type)


def native(array):
    """``array`` (an ndarray, or a dask array) in the machine's byte order (kernels read
    native values): a copy only for byte-swapped input."""
    if byte_swapped(array.dtype):
        return array.astype(array.dtype.newbyteorder("="))
    return array


def flag(spec: OpVersion, name: str, value, allowed=(0, 1)) -> int:
    """An integer-valued attribute restricted to ``allowed`` (booleans count as 0 / 1)."""
    if not isinstance(value, (bool, int, np.integer, np.bool_)):
        raise PoolfoldTypeError(
            f"{spec.label}: attribute '{name}' must be an integer, got {value!r}"
        )
    if int(value) not in allowed:
        raise PoolfoldError(
            f"{spec.label}: attribute '{name}' must be one of {list(allowed)}, got {value!r}"
        )
    return int(value)


def int64_tensor(spec: OpVersion, value, name: str) -> np.ndarray:
    """``value`` as an int64 ndarray; other integer arrays are refused, as the spec types them."""
    array = native(value if isinstance(value, np.ndarray) else np.asarray(value))
    if array.dtype != np.int64:
        if not isinstance(value, np.ndarray) and (array.dtype.kind in "iu" or array.size == 0):
            return array.astype(np.int64)  # a Python list of ints
        raise PoolfoldTypeError(
            f"{spec.label}: input '{name}' must be int64, got {dtypes.name(array.dtype)}"
        )
    return array


def activate(y: np.ndarray, act: activations.Activation) -> np.ndarray:
    """``y`` with the nhwc domain's fused activation ``act`` applied, in place."""
    if act.code != IDENTITY and y.size:
        launch_split(activate_in_place, y.size, dtypes.bits_view(y).reshape(-1), act.code,
                     act.params, act.table, work=y.size)
    return y
