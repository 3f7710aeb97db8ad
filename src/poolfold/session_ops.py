"""poolfold's nodes inside one onnxruntime session, as custom ops that call back into Python.

Cut into one onnxruntime session per stretch between poolfold's nodes, a model pays at each
cut for a session's run (its inputs bound, its outputs allocated and handed over, its
threads woken): the bundled model's four stretches took longer than onnxruntime's run of
the whole model.  Here the model stays one session: each of poolfold's nodes becomes a
custom op of its own (domain :data:`DOMAIN_PREFIX` and a number, op ``N<k>``, typed as the
node's inputs and outputs), whose kernel calls back into Python.  The callback reads the
inputs in place (arrays over onnxruntime's buffers), runs the node as the split route does
(:func:`poolfold.nodes.bind`), asks onnxruntime for each output in the shape found, and
copies the result there.

A node handed the same buffers run after run (onnxruntime's arena keeps them) keeps the
arrays over them, and a node whose call is only its outputs' allocation and one kernel
launch (:func:`poolfold.nodes.replayable`) keeps that launch: the library then runs it
itself over those buffers, without calling back (see ``replayed`` in the C file).

The ops come from a small C library (``native/session_ops.c``), compiled once per machine
with the C compiler (``CC``, else the one Python was built with, else ``cc``) into
poolfold's cache folder (``POOLFOLD_CACHE_DIR``, default ``~/.cache/poolfold``), where
onnxruntime loads it by path (``SessionOptions.register_custom_ops_library``).  Without a
compiler, :func:`library` says why, and the backend cuts the model into sessions instead.
The library speaks onnxruntime's C ABI alone, which is stable across releases (1.16 on).
"""

from __future__ import annotations

import ctypes
import hashlib
import itertools
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import threading
import weakref
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
from onnx import helper

from . import memory
from .kernels import background, handoff, native_split, threads

DOMAIN_PREFIX = "poolfold.session"
_SOURCE = Path(__file__).with_name("native") / "session_ops.c"
_MAX_RANK = 61  # the most dims an input may have (the C side checks; its MAX_RANK)
_FRAME_BYTES = 4096  # room for an armed launch's frame (see native_split.keep_hosted)
_MAX_VALUES = 8  # the most inputs or outputs of one node (session_ops.c's MAX_TYPES)


def cache_folder() -> Path:
    folder = os.environ.get("POOLFOLD_CACHE_DIR")
    if folder:
        return Path(folder)
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "poolfold"


class _Library:
    """The loaded library and the callback it calls; one per process."""

    def __init__(self, path: Path):
        self.path = str(path)
        lib = ctypes.CDLL(self.path)
        pointer, size = ctypes.c_void_p, ctypes.c_size_t
        lib.pf_inputs.argtypes = [pointer, size, pointer, size]
        lib.pf_inputs.restype = ctypes.c_int
        lib.pf_output.argtypes = [pointer, size, pointer, size, pointer]
        lib.pf_output.restype = ctypes.c_int
        lib.pf_begin.argtypes = [ctypes.c_char_p]
        lib.pf_declare.argtypes = [ctypes.c_char_p, ctypes.c_int64, size, pointer, size,
                                   pointer]
        lib.pf_declare.restype = ctypes.c_int
        lib.pf_arm.argtypes = [ctypes.c_int64, size, pointer, size, pointer, pointer, pointer,
                               pointer, pointer, ctypes.c_int64, ctypes.c_int64,
                               ctypes.c_int64, ctypes.c_int64, ctypes.c_int64]
        lib.pf_arm.restype = ctypes.c_int
        self.lib = lib
        self.parallel = ctypes.cast(lib.pf_parallel, ctypes.c_void_p).value
        # the ctypes function must live as long as the library may call it
        self._callback = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int64, ctypes.c_void_p)(
            _call_node)
        lib.pf_set_callback(self._callback)
        # declarations and the registration that consumes them go together
        self.registering = threading.Lock()


_LOADED: _Library | None = None
_UNAVAILABLE: str | None = None
_LOADING = threading.Lock()


def library() -> tuple[_Library | None, str | None]:
    """(the library, None), or (None, why it cannot be had here)."""
    global _LOADED, _UNAVAILABLE
    with _LOADING:
        if _LOADED is None and _UNAVAILABLE is None:
            try:
                _LOADED = _Library(_built())
            except (OSError, subprocess.SubprocessError, RuntimeError) as error:
                _UNAVAILABLE = str(error).strip().splitlines()[0] if str(error).strip() \
                    else type(error).__name__
        return _LOADED, _UNAVAILABLE


def _compiler() -> list[str]:
    given = os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc"
    command = given.split()
    if shutil.which(command[0]) is None:
        raise RuntimeError(f"no C compiler to build poolfold's onnxruntime ops ({command[0]!r} "
                           f"not found; set CC)")
    return command


def _built() -> Path:
    """The compiled library, built now if this source and compiler have not built it yet."""
    if sys.platform == "win32":
        raise RuntimeError("poolfold's onnxruntime ops are built on Linux and macOS only")
    compiler = _compiler()
    source = _SOURCE.read_bytes()
    key = hashlib.sha256(source + " ".join(compiler).encode() +
                         sysconfig.get_platform().encode()).hexdigest()[:16]
    suffix = ".dylib" if sys.platform == "darwin" else ".so"
    for folder in (cache_folder(), Path(tempfile.gettempdir()) / f"poolfold-{os.getuid()}"):
        target = folder / f"session_ops-{key}{suffix}"
        if target.exists():
            return target
        try:
            folder.mkdir(parents=True, exist_ok=True)
            handle, partial = tempfile.mkstemp(suffix=suffix, dir=folder)
            os.close(handle)
        except OSError:
            continue  # a folder we cannot write: the next one
        try:
            done = subprocess.run(
                [*compiler, "-O2", "-shared", "-fPIC", "-fvisibility=hidden", "-o", partial,
                 str(_SOURCE)], capture_output=True, text=True, timeout=120)
            if done.returncode != 0:
                raise RuntimeError(f"compiling poolfold's onnxruntime ops failed: "
                                   f"{done.stderr.strip() or done.returncode}")
            os.replace(partial, target)  # whole or not at all, for processes racing here
        finally:
            if os.path.exists(partial):
                os.unlink(partial)
        return target
    raise RuntimeError("no writable folder for poolfold's onnxruntime ops (POOLFOLD_CACHE_DIR)")


# ------------------------------------------------------------------------ the node calls

class _Array:
    """An array's interface over a buffer onnxruntime owns (numpy wraps it, no copy)."""

    __slots__ = ("__array_interface__",)

    def __init__(self, address: int, dtype: np.dtype, shape: tuple):
        self.__array_interface__ = {"data": (address, False), "shape": shape,
                                    "typestr": dtype.str, "version": 3}


def _over(address: int, dtype: np.dtype, shape: tuple) -> np.ndarray:
    if not address:  # onnxruntime may give no buffer for a tensor of no elements
        return np.empty(shape, dtype)
    array = np.asarray(_Array(address, dtype, shape))
    # numpy reads ml_dtypes' types (bfloat16) from the interface as plain bytes
    return array.view(dtype) if array.dtype != dtype else array


_DTYPES: dict[int, np.dtype] = {}


def _dtype(element_type: int) -> np.dtype:
    if element_type not in _DTYPES:
        _DTYPES[element_type] = np.dtype(helper.tensor_dtype_to_np_dtype(element_type))
    return _DTYPES[element_type]


class _Node:
    """One node's callback: ``run`` takes its inputs (None for an omitted one) and returns
    its outputs, as :func:`poolfold.nodes.bind` does; ``outputs`` gives each output's
    element type (None where the node omits it) and ``names`` its name in the op's schema,
    which poolfold's ops allocate it by (:func:`poolfold.memory.allocate`)."""

    def __init__(self, run: Callable, inputs: Sequence[bool], outputs: Sequence[int | None],
                 names: Sequence[str], failures: list, blocks: int = 0,
                 replayable: bool = False, number: int = -1):
        self._run = run
        self._number = number
        # what the launch armed in the library reads (see _arm), kept alive while armed
        self._armed: tuple | None = None
        self._blocks = blocks  # see Declared.add
        self._replayable = replayable
        # The last call's launch, to run again on the same buffers (see _replayed): (the
        # inputs' facts, the thread count, per output (place, shape, the address of its dims,
        # rank, its buffer's address), the launch as threads.RECORDING took it, the dims'
        # arrays)
        self._replay: tuple | None = None
        self._given = list(inputs)  # which of the node's inputs the op takes, in order
        self._count = sum(self._given)
        self._places: dict[str, tuple[int, np.dtype]] = {}  # name -> (op's output, type)
        self._kept: list[int | None] = []  # each node output's place among the op's
        for name, element in zip(names, outputs):
            self._kept.append(None if element is None else len(self._places))
            if element is not None:
                self._places[name] = (len(self._places), _dtype(element))
        self._failures = failures
        # The output shapes the last call of these input shapes gave: a buffer is handed
        # out only for an allocation of that shape (an op may allocate an output in another
        # shape and return a view of it reshaped; onnxruntime's shape would then be wrong).
        self._last: tuple = ((), {})  # (the inputs' shapes and types, the outputs' shapes)
        # the last call's inputs: (their facts as onnxruntime gave them, the arrays over
        # them, N of a blocked node, their shapes and types)
        self._seen: tuple | None = None
        self._outputs: dict[int, tuple] = {}  # op's output -> ((address, type, shape), array)

    def __call__(self, context: int, loaded: _Library) -> None:
        # A node runs right after onnxruntime's kernels, with the interpreter's own code and
        # data out of the caches: each Python step costs several times what it does in a
        # loop (googlenet: 35 us a node around the kernel, measured).  So what repeats from
        # one run to the next is kept: onnxruntime's arena hands a node the same buffers
        # run after run, and the arrays over them serve again.
        lib = loaded.lib
        facts, address = _scratch()
        if lib.pf_inputs(context, self._count, address, _STRIDE):
            raise RuntimeError("onnxruntime did not hand over the node's inputs")
        handed_in = facts[:self._count].tobytes()
        replay = self._replay
        fetched: dict[int, tuple] = {}  # outputs a replay that could not be had asked for
        if replay is not None and replay[0] == handed_in \
                and self._replayed(replay, loaded, context, facts, address, fetched):
            return
        seen = self._seen
        if seen is not None and seen[0] == handed_in:
            _, inputs, samples, key = seen
            inputs = list(inputs)
        else:
            inputs, samples = self._inputs(handed_in)
            key = tuple((a.shape, a.dtype) if a is not None else None for a in inputs)
            self._seen = (handed_in, tuple(inputs), samples, key)
        shown = _blocked_as_shown if self._blocks else _as_is
        handed: dict[int, np.ndarray] = {}
        addresses: dict[int, int] = {}  # of the buffers handed, this call's
        given: dict[int, np.ndarray] = {}  # what provide() gave the op, as it gave it
        last_key, last_shapes = self._last
        expected = last_shapes if key == last_key else {}

        def output(place: int, dtype: np.dtype, shape: tuple) -> np.ndarray:
            # onnxruntime allocates an output once a call: one asked for already is taken
            if fetched.get(place, (None, None))[1] == shape:
                found = (fetched.pop(place)[0], dtype, shape)
            else:
                row = facts[0]
                row[1:1 + len(shape)] = shape
                if lib.pf_output(context, place, address + 8, len(shape), address):
                    raise RuntimeError("onnxruntime did not allocate an output")
                found = (int(row[0]), dtype, shape)
            kept = self._outputs.get(place)
            if kept is None or kept[0] != found:
                kept = self._outputs[place] = (found, _over(*found))
            handed[place], addresses[place] = kept[1], found[0]
            return kept[1]

        def provide(what: str, shape: tuple, dtype: np.dtype) -> np.ndarray | None:
            place, wanted = self._places.get(what, (None, None))
            if place is None or place in handed or dtype != wanted \
                    or expected.get(place) != shown(shape, samples):
                return None  # a buffer of another kind or shape, or asked for twice
            buffer = output(place, dtype, shown(shape, samples))
            given[place] = buffer if buffer.shape == shape else buffer.reshape(shape)
            return given[place]

        recording = self._replayable and background.settled()
        memory.PLACES.provide = provide
        threads.HOSTED.host = (loaded.parallel, context)  # the pieces go to onnxruntime's threads
        threads.RECORDING.calls = [] if recording else None
        try:
            results = self._run(inputs)
        finally:
            memory.PLACES.provide = None
            threads.HOSTED.host = None
            launches, threads.RECORDING.calls = threads.RECORDING.calls, None
        shapes = {}
        in_place = 0
        for place, result in zip(self._kept, results):
            if place is None:
                continue
            if result is given.get(place):  # written in place, in the shape expected
                shapes[place] = handed[place].shape
                in_place += 1
                continue
            result = result.reshape(shown(result.shape, samples))
            shapes[place] = result.shape
            target = handed.get(place)
            if target is None:
                target = output(place, result.dtype, result.shape)
            elif target.shape != result.shape:
                raise RuntimeError("a node's output changed shape after its allocation")
            elif _same_memory(target, result):
                continue  # written in place
            if result.size:
                _copy(target, result)
        if shapes != expected:
            self._last = (key, shapes)
        if recording and launches is not None and len(launches) == 1 \
                and in_place == len(self._places) == len(shapes) and background.idle():
            outputs, kept_dims = [], []
            for place, shape in shapes.items():
                dims = np.array(shape or (0,), np.int64)  # kept alive with its address
                outputs.append((place, shape, dims.ctypes.data, len(shape), addresses[place]))
                kept_dims.append(dims)
            self._replay = (handed_in, threads.kernel_threads(), tuple(outputs), launches[0],
                            kept_dims)
            self._arm(loaded, handed_in, shapes, addresses, launches[0])

    def _arm(self, loaded: _Library, handed_in: bytes, shapes: dict, addresses: dict,
             launch: tuple) -> None:
        """Arms the library with this call's launch (see ``replayed`` in session_ops.c):
        its next calls over the same buffers then run it without calling back.  Only a
        launch whose kernel runs natively (:class:`~poolfold.kernels.native_split.Crew`)
        and returns nothing; not while the frame's function is compiling in the
        background."""
        kernel, count, args, work, parts, crew = launch
        if crew is None or not crew.resolve(kernel, args) or crew.returns is not None \
                or self._number < 0:
            return
        if parts == 1:
            bounds = np.array([0, count], np.int64)
        elif crew.split == (count, parts, work):
            bounds = crew.bounds.copy()
        else:
            return
        flags = np.zeros(handoff.ERROR + 1, np.int64)
        results = np.zeros(len(bounds) - 1, np.int64)
        frame = np.zeros(_FRAME_BYTES, np.uint8)
        kept = (frame.ctypes.data, frame.size, flags, bounds, results, crew.address, None,
                *args)
        if not background.ready(native_split.keep_hosted, kept):
            background.start_queued()
            return
        entry = native_split.keep_hosted(*kept)
        if not entry:
            return  # a frame larger than _FRAME_BYTES
        places = np.array(list(shapes), np.int64)
        ranks = np.array([len(shape) for shape in shapes.values()], np.int64)
        dims = np.zeros((len(shapes), _MAX_RANK), np.int64)
        for row, shape in zip(dims, shapes.values()):
            row[:len(shape)] = shape
        data = np.array([addresses[place] for place in shapes], np.int64)
        facts = np.frombuffer(handed_in, np.int64)
        previous = self._armed
        self._armed = (facts, places, ranks, dims, data, flags, bounds, results, frame, args)
        if loaded.lib.pf_arm(self._number, self._count, facts.ctypes.data, len(shapes),
                             places.ctypes.data, ranks.ctypes.data, dims.ctypes.data,
                             data.ctypes.data, flags.ctypes.data, handoff.CLAIMS,
                             handoff.ERROR, entry, frame.ctypes.data, parts):
            self._armed = previous

    def _replayed(self, replay: tuple, loaded: _Library, context: int, facts: np.ndarray,
                  address: int, fetched: dict) -> bool:
        """Runs the node as its last call did, where onnxruntime hands it the same buffers
        (inputs checked by the caller; the outputs here) at the same thread count: the one
        launch that call made, on the arrays it made it on (a MaxPool's call is its
        outputs' allocation and one kernel launch, nothing that depends on the values; see
        :func:`poolfold.nodes.replayable`).  False where it cannot: the call then runs in
        full, and the outputs it asked for already go in ``fetched`` (place -> (address,
        shape)): onnxruntime allocates an output once a call."""
        _, count, outputs, launch, _ = replay
        if count != threads.kernel_threads():
            return False
        output = loaded.lib.pf_output
        for place, shape, dims, rank, data in outputs:
            if output(context, place, dims, rank, address):
                return False
            fetched[place] = (int(facts[0, 0]), shape)
            if fetched[place][0] != data:
                return False
        threads.HOSTED.host = (loaded.parallel, context)
        try:
            threads.replay(launch)
        finally:
            threads.HOSTED.host = None
        return True

    def _inputs(self, handed_in: bytes) -> tuple[list, int]:
        """The inputs over onnxruntime's buffers (their facts as pf_inputs wrote them: a
        replay's outputs may have been asked for since, in the same scratch), as the op takes
        them (None for an omitted one; a blocked one as channels-last samples), and N for a
        blocked node."""
        rows = iter(np.frombuffer(handed_in, np.int64).reshape(-1, _STRIDE).tolist())
        inputs: list = []
        for given in self._given:
            if not given:
                inputs.append(None)
                continue
            data, element, rank, *dims = next(rows)
            inputs.append(_over(data, _dtype(element & 0xFFFFFFFF), tuple(dims[:rank])))
        if not self._blocks:
            return inputs, 0
        samples = inputs[0].shape[0]
        inputs[0] = _blocked_as_channels_last(inputs[0], self._blocks)
        return inputs, samples


def _as_is(shape: tuple, samples: int) -> tuple:
    return shape


def _blocked_as_channels_last(x: np.ndarray, blocks: int) -> np.ndarray:
    """A tensor in onnxruntime's blocked layout, shown as ``(N, C, D1, ..., Dr)`` with C a
    multiple of ``blocks`` and laid out as ``(N, C / blocks, D1, ..., Dr, blocks)``: that
    layout, as ``(N * C / blocks, D1, ..., Dr, blocks)`` channels-last samples."""
    n, c = x.shape[:2]
    if c % blocks:
        raise RuntimeError(f"a blocked tensor of {c} channels, not a multiple of {blocks}")
    return x.reshape((n * c // blocks,) + x.shape[2:] + (blocks,))


def _blocked_as_shown(shape: tuple, samples: int) -> tuple:
    """:func:`_blocked_as_channels_last`'s inverse on shapes, for ``samples`` N."""
    channels = shape[0] * shape[-1] // samples if samples else 0
    return (samples, channels) + tuple(shape[1:-1])


def _copy(target: np.ndarray, result: np.ndarray) -> None:
    """A result the op did not write in onnxruntime's buffer, copied there."""
    np.copyto(target, result)


def _same_memory(target: np.ndarray, result: np.ndarray) -> bool:
    """Whether ``result`` is ``target``'s buffer as it is laid out (itself, or a view of it
    of the same shape)."""
    return result is target or (
        result.__array_interface__["data"][0] == target.__array_interface__["data"][0]
        and result.dtype == target.dtype and result.flags.c_contiguous)


_STRIDE = 3 + _MAX_RANK  # an input's facts: data address, element type, rank, dims
_THREAD = threading.local()


def _scratch() -> tuple[np.ndarray, int]:
    """This thread's buffer for the facts of a node's inputs, and its address (a session
    may run on several threads at once)."""
    kept = getattr(_THREAD, "scratch", None)
    if kept is None:
        facts = np.zeros((_MAX_VALUES, _STRIDE), np.int64)
        kept = _THREAD.scratch = (facts, facts.ctypes.data)
    return kept


_NODES: dict[int, _Node] = {}
_NUMBERS = itertools.count()
_DOMAINS = itertools.count()


def _call_node(number: int, context: int) -> int:
    node = _NODES.get(number)
    if node is None:
        return 1
    try:
        node(context, _LOADED)
    except BaseException as error:  # noqa: BLE001 -- handed to the run that called the node
        node._failures.append(error)
        return 1
    return 0


class Declared:
    """The custom ops of one model: what ``add`` declared, registered on a SessionOptions by
    ``register``.  The callbacks stay as long as this object (the session holds it)."""

    def __init__(self, lib: _Library):
        self._lib = lib
        self.domain = f"{DOMAIN_PREFIX}{next(_DOMAINS)}"
        self.failures: list[BaseException] = []
        self._ops: list[tuple[int, str, list[int], list[int]]] = []
        self._numbers: list[int] = []
        weakref.finalize(self, _forget, self._numbers)

    def add(self, run: Callable, inputs: Sequence[int | None], outputs: Sequence[int | None],
            names: Sequence[str], blocks: int = 0, replayable: bool = False) -> str:
        """Declares a node: ``inputs`` and ``outputs`` give each of its values' element type
        (None for an omitted one), ``names`` its outputs' names in the op's schema.  Returns
        the op's name in :attr:`domain`.

        ``blocks``: the node's one input and its outputs are in onnxruntime's blocked
        channel layout (NCHWc) of that many channels a block, which ``run`` takes and
        gives as channels-last samples (see :mod:`poolfold.blocked`).  ``replayable``: a call
        of ``run`` is its outputs' allocation and its launches, nothing else (see
        :func:`poolfold.nodes.replayable`)."""
        given = [t for t in inputs if t is not None]
        kept = [t for t in outputs if t is not None]
        if len(given) > _MAX_VALUES or len(kept) > _MAX_VALUES:
            raise ValueError("too many inputs or outputs for a custom op")
        number = next(_NUMBERS)
        _NODES[number] = _Node(run, [t is not None for t in inputs], list(outputs), names,
                               self.failures, blocks, replayable, number)
        self._numbers.append(number)
        name = f"N{number}"
        self._ops.append((number, name, given, kept))
        return name

    def register(self, options) -> None:
        """Adds the declared ops to onnxruntime's ``options``."""
        lib = self._lib
        with lib.registering:
            lib.lib.pf_begin(self.domain.encode())
            for number, name, given, kept in self._ops:
                types_in = (ctypes.c_int * max(len(given), 1))(*given)
                types_out = (ctypes.c_int * max(len(kept), 1))(*kept)
                if lib.lib.pf_declare(name.encode(), number, len(given), types_in, len(kept),
                                      types_out):
                    raise RuntimeError(f"cannot declare the custom op {name}")
            options.register_custom_ops_library(lib.path)

    def take_failure(self) -> BaseException | None:
        """The error a node's callback met in the run that failed, if one did."""
        if not self.failures:
            return None
        error = self.failures.pop()
        self.failures.clear()
        return error


def _forget(numbers: list[int]) -> None:
    for number in numbers:
        node = _NODES.pop(number, None)
        if node is not None and node._armed is not None and _LOADED is not None:
            _LOADED.lib.pf_arm(number, 0, None, 0, None, None, None, None, None, 0, 0, 0, 0,
                               0)
