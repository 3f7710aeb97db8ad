"""A threaded call's pieces claimed and run by the spinning threads without the GIL.

:func:`poolfold.kernels.threads.launch_split` hands a call to the pool's threads as a Python
job: each thread takes the GIL back to claim a piece and to call the kernel, and hands it
over again inside the kernel.  On a small call those hand-offs are most of the time: a
batch-1 (1,64,56,56) 3x3 MaxPool spent 6-10 us before the caller's first piece started, and
the other thread's GIL wake-ups made pieces of 1 us of work take 8 (measured, 2 CPUs).

Here one compiled call (:func:`run_pieces`) does all of it, the GIL released throughout:

- it stores its arguments in a frame on its own stack, and the address of a function
  compiled with it that runs the pieces from such a frame (:func:`_stage`);
- publishes the call to the spinning threads (:mod:`.handoff`), which call that function
  from their own compiled loop (:func:`poolfold.kernels.handoff.serve_calls`), not from
  Python;
- claims pieces itself from the same atomic counter as the threads, so that a thread that
  joins late, or not at all (asleep, or its core taken), costs nothing but its share;
- closes the call and waits for the threads that joined it, so that none reads the frame
  once the call has returned (the threads join by an atomic increment, then check that the
  call is still open: the two sides' sequentially consistent stores and loads cannot both
  miss each other).

The kernel is called through the address of its compiled code for the call's argument
types (numba's own calling convention), looked up once per launch
(:class:`Crew`), not linked into this function: linking it would compile the kernel's
code again into every such function (3.8 s for the row-block kernel, measured; this
function alone compiles in a fraction of that, once per tuple of argument types and cached).
A piece whose kernel raises (only under ``NUMBA_BOUNDSCHECK``, as the op layer checks every
input) flags the call, and :func:`poolfold.kernels.threads.launch_split` runs it again in
Python, where the error is raised as such.
"""

from __future__ import annotations

import hashlib

import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from . import kernel
from .handoff import (ACTIVE, CLAIMS, ENTRY, ERROR, FRAME, HELPERS, OPEN, YIELD_PAUSES,
                      _load_acquire, _pause, _yield_core, call_entry, fetch_add,
                      load_sequential, publish, store_sequential)


def _unshared(context, builder, kind, value):
    """An array argument without its reference-counted owner (numba skips the counting of
    an array that has none, as for ``carray``); any other argument as it is.

    Every thread of a call gets the caller's arrays, owner included, where calls from Python
    unbox each thread's own.  Kernels that take views (a row of a table, say) count
    references on the owner as they go, and two threads counting on one cache line made
    AveragePool 2x2 over (8,64,112,112) 1.6x slower on two threads than through Python
    (measured).  The caller holds the arrays until every thread is done with them."""
    if not isinstance(kind, types.Array):
        return value
    array = context.make_array(kind)(context, builder, value)
    array.meminfo = cgutils.get_null_value(array.meminfo.type)
    # the struct proxy's value, as numba's extending guide reads its proxies (the Interval
    # example's ``interval._getvalue()``): the documented way out of a proxy
    return array._getvalue()


@intrinsic
def _call_kernel(typingctx, address, returns, arguments, start, stop):
    """``kernel(*arguments, start, stop)`` for the compiled kernel at ``address`` (numba's
    calling convention, for these argument types and the return type of ``returns``):
    (1 if it raised else 0, what it returned as an int64, 0 for none)."""
    result = types.UniTuple(types.int64, 2)

    def codegen(context, builder, signature, args):
        address_value, _, packed, start_value, stop_value = args
        returned = signature.args[1]
        argument_types = (*signature.args[2].types, signature.args[3], signature.args[4])
        values = [_unshared(context, builder, kind, builder.extract_value(packed, i))
                  for i, kind in enumerate(signature.args[2].types)]
        values += [start_value, stop_value]
        call_conv = context.call_conv
        function_type = call_conv.get_function_type(returned, argument_types)
        kernel = builder.inttoptr(address_value, function_type.as_pointer())
        # as numba's CPUCallConv.call_function, through a pointer
        return_slot = cgutils.alloca_once(builder, call_conv.get_return_type(returned).pointee)
        builder.store(cgutils.get_null_value(return_slot.type.pointee), return_slot)
        exception_slot = cgutils.alloca_once(builder, function_type.args[1].pointee)
        flat = list(context.get_arg_packer(argument_types).as_arguments(builder, values))
        code = builder.call(kernel, [return_slot, exception_slot, *flat])
        # numba's statuses: 0 returned, -2 returned none (as CPUCallConv reads them); any
        # other is an exception
        raised = builder.not_(builder.or_(
            builder.icmp_signed("==", code, ir.Constant(code.type, 0)),
            builder.icmp_signed("==", code, ir.Constant(code.type, -2))))
        i64 = ir.IntType(64)
        if isinstance(returned, types.NoneType):
            value = ir.Constant(i64, 0)
        else:
            value = context.cast(builder, context.get_returned_value(
                builder, returned, builder.load(return_slot)), returned, types.int64)
        return context.make_tuple(builder, result, [builder.zext(raised, i64), value])

    return result(address, returns, arguments, start, stop), codegen


def _claim_pieces(flags, bounds, results, address, returns, arguments):
    """Run the call's pieces that no other thread has claimed: piece p is
    ``[bounds[p], bounds[p + 1])``; what it returned goes to ``results[p]``."""
    pieces = bounds.size - 1
    while True:
        piece = fetch_add(flags, CLAIMS, 1)
        if piece >= pieces:
            return
        raised, value = _call_kernel(address, returns, arguments, bounds[piece],
                                     bounds[piece + 1])
        if raised:
            store_sequential(flags, ERROR, 1)
            return
        results[piece] = value


def _entry(context, builder, frame_type, pointer_type):
    """The function ``void(i8*)`` that runs :func:`_claim_pieces` on the frame (of
    ``frame_type``, at a ``pointer_type``) at its argument, one per frame type in a
    module."""
    module = builder.module
    # its name only needs to be unique in the module
    name = "poolfold_pieces_" + hashlib.sha1(str(frame_type).encode()).hexdigest()
    entry = module.globals.get(name)
    if entry is None:
        entry = ir.Function(module, ir.FunctionType(ir.VoidType(), [cgutils.voidptr_t]), name)
        entry.linkage = "internal"
        inner = ir.IRBuilder(entry.append_basic_block())
        value = inner.load(inner.bitcast(entry.args[0], pointer_type))
        members = [inner.extract_value(value, i) for i in range(len(frame_type))]
        claim = types.void(*frame_type.types)
        compiled = context.compile_subroutine(inner, _claim_pieces, claim)
        # _claim_pieces raises nothing (the kernel's errors are flagged in the frame)
        context.call_internal_no_propagate(inner, compiled.fndesc, claim, members)
        inner.ret_void()
    return entry


@intrinsic
def _stage(typingctx, frame):
    """(the address of ``frame`` stored on the caller's stack, the address of a function
    ``void(i8*)`` that runs :func:`_claim_pieces` on the frame at its argument)."""
    result = types.UniTuple(types.int64, 2)

    def codegen(context, builder, signature, args):
        slot = cgutils.alloca_once_value(builder, args[0])
        entry = _entry(context, builder, signature.args[0], slot.type)
        i64 = ir.IntType(64)
        return context.make_tuple(builder, result, [builder.ptrtoint(slot, i64),
                                                    builder.ptrtoint(entry, i64)])

    return result(frame), codegen


def _unowned(context, builder, kind, value):
    """``value`` with every array in it (tuples searched) without its owner, as
    :func:`_unshared` makes one: a frame kept past its call holds arrays whose owners numba
    made for that call only."""
    if isinstance(kind, types.Array):
        return _unshared(context, builder, kind, value)
    if isinstance(kind, types.BaseTuple):
        members = [_unowned(context, builder, member, builder.extract_value(value, i))
                   for i, member in enumerate(kind.types)]
        return context.make_tuple(builder, kind, members)
    return value


@intrinsic
def _keep(typingctx, buffer, size, frame):
    """Stores ``frame`` (its arrays without their owners) at the address ``buffer`` of
    ``size`` bytes: the address of the function ``void(i8*)`` that runs
    :func:`_claim_pieces` on it, or 0 where it does not fit."""
    def codegen(context, builder, signature, args):
        frame_type = signature.args[2]
        value_type = context.get_value_type(frame_type)
        needed = context.get_abi_sizeof(value_type)
        at = builder.inttoptr(args[0], value_type.as_pointer())
        entry = _entry(context, builder, frame_type, value_type.as_pointer())
        i64 = ir.IntType(64)
        fits = builder.icmp_signed(">=", args[1], ir.Constant(i64, needed))
        with builder.if_then(fits):
            builder.store(_unowned(context, builder, frame_type, args[2]), at)
        return builder.select(fits, builder.ptrtoint(entry, i64), ir.Constant(i64, 0))

    return types.int64(buffer, size, frame), codegen


@kernel()
def run_pieces(flags, call, bounds, results, helpers, address, returns, *arguments):
    """Run the kernel at ``address`` over the pieces ``bounds`` on this thread and on
    ``helpers`` spinning threads, as call number ``call``: 1 if a piece raised, else 0.

    Whatever each piece returned is in ``results`` (0 for a kernel that returns none);
    ``returns`` is a value of the kernel's return type (None, or 0 / False)."""
    frame, entry = _stage((flags, bounds, results, address, returns, arguments))
    flags[ENTRY] = entry
    flags[FRAME] = frame
    flags[HELPERS] = helpers
    flags[CLAIMS] = 0
    flags[ERROR] = 0
    store_sequential(flags, OPEN, call)
    publish(flags, call)  # every store above is seen by a thread that sees this
    call_entry(entry, frame)  # this thread's pieces
    store_sequential(flags, OPEN, -1)  # no thread joins from here on ...
    waits = 0
    while load_sequential(flags, ACTIVE) != 0:  # ... and those that joined are done with it
        _pause()
        waits += 1
        if waits % YIELD_PAUSES == 0:  # a thread that joined on this core runs its piece
            _yield_core()
    return _load_acquire(flags, ERROR)


@intrinsic
def _call_host(typingctx, host, context, entry, frame, threads):
    """Call the function ``void(i8*, i64, i64, i64)`` at address ``host`` on
    (``context``, ``entry``, ``frame``, ``threads``): a host's thread pool, which runs the
    call's pieces as :func:`run_pieces_hosted` says."""
    def codegen(context_, builder, signature, args):
        i64 = ir.IntType(64)
        function = builder.inttoptr(args[0], ir.FunctionType(
            ir.VoidType(), [cgutils.voidptr_t, i64, i64, i64]).as_pointer())
        builder.call(function, [builder.inttoptr(args[1], cgutils.voidptr_t), args[2],
                                args[3], args[4]])
        return context_.get_dummy_value()

    return types.void(types.int64, types.int64, types.int64, types.int64, types.int64), codegen


@kernel()
def keep_hosted(buffer, size, flags, bounds, results, address, returns, *arguments):
    """:func:`run_pieces_hosted`'s frame stored at the address ``buffer`` (``size`` bytes)
    instead of run: the address of the function ``void(i8*)`` a host's threads call on it
    to claim and run the pieces, or 0 where it does not fit.  Whoever calls it must keep
    ``flags``, ``bounds``, ``results`` and the arguments' arrays alive, and zero the flags'
    CLAIMS and ERROR before each call (see :mod:`poolfold.session_ops`)."""
    return _keep(buffer, size, (flags, bounds, results, address, returns, arguments))


@kernel()
def run_pieces_hosted(flags, bounds, results, host, context, threads, address, returns,
                      *arguments):
    """:func:`run_pieces` on a host's threads instead of poolfold's: the function at
    ``host`` (``pf_parallel`` of :mod:`poolfold.session_ops`' library) has ``threads`` of
    onnxruntime's threads, the calling one among them, each call the entry on the frame
    (claiming pieces until none is left), and returns once all are done.  1 if a piece
    raised, else 0.  ``flags`` is the call's own (only its CLAIMS and ERROR are used)."""
    frame, entry = _stage((flags, bounds, results, address, returns, arguments))
    flags[CLAIMS] = 0
    flags[ERROR] = 0
    _call_host(host, context, entry, frame, threads)
    return _load_acquire(flags, ERROR)


class Crew:
    """How one launch's kernel runs natively (:func:`run_pieces`): its compiled address and
    return type, found on the launch's first threaded call and kept, since a launch always
    calls the same kernel with arguments of the same types; None where it cannot (the kernel
    not compiled for them, or :func:`run_pieces` not yet compiled for them: see
    :func:`poolfold.kernels.threads.launch_split`)."""

    __slots__ = ("kernel", "address", "returns", "checked", "split", "bounds", "scratch")

    def __init__(self):
        self.kernel = None
        self.address = 0
        self.returns = None
        self.checked = False
        self.split = None
        self.bounds = np.zeros(1, np.int64)
        self.scratch = np.zeros(0, np.int64)

    def cut(self, split, count: int, pieces: int) -> None:
        """Keep the bounds of ``pieces`` pieces of ``[0, count)`` for the calls that
        ``split`` (the caller's key: a launch's calls cut alike) describes."""
        self.split = split
        self.bounds = np.arange(pieces + 1, dtype=np.int64) * count // pieces
        self.scratch = np.zeros(pieces, np.int64)

    def results(self) -> np.ndarray:
        """An array for what each piece returns: a new one where the kernel returns a value
        (it is read after the spinning threads are let go), else one kept."""
        return self.scratch if self.returns is None else np.zeros(len(self.scratch), np.int64)

    def resolve(self, kernel, arguments: tuple) -> bool:
        """Whether ``kernel(*arguments, start, stop)`` can run natively; found once."""
        if self.checked and self.kernel is kernel:
            return self.address != 0
        self.kernel, self.checked, self.address = kernel, False, 0
        signature = tuple(kernel.typeof_pyval(a) for a in (*arguments, 0, 0))
        compiled = kernel.overloads.get(signature)
        if compiled is None:  # asked again once a call through Python has compiled it
            return False
        self.checked = True
        returned = compiled.signature.return_type
        if isinstance(returned, types.NoneType):
            self.returns = None
        elif isinstance(returned, types.Boolean):
            self.returns = False
        elif isinstance(returned, types.Integer):
            self.returns = 0
        else:
            return False
        self.address = compiled.library.get_pointer_to_function(compiled.fndesc.llvm_func_name)
        return self.address != 0

