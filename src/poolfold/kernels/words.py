"""Reading two neighbouring elements as one machine word.

At stride 2, output j's taps lie at ``2*j + e``.  Seen as unsigned words of twice the element's
width (:func:`words_view`), the pair ``(2*i, 2*i + 1)`` is word i, so every tap e is one
contiguous stream of words, ``i + e // 2``, read in a fixed half, ``e % 2``: loops over such
streams vectorise.  Loops reading the elements at ``2*j + e`` for three or more e do not (LLVM
vectorises one interleaved pair of loads, not more).  Words exist for elements of 1, 2 and 4
bytes; there is no wider integer for 8-byte ones.
"""

from __future__ import annotations

import sys

import numpy as np
from llvmlite import ir
from numba import types
from numba.extending import intrinsic

from . import helper_overload

_WORD_TYPES = {1: np.uint16, 2: np.uint32, 4: np.uint64}

# Whether the element at the even position is a word's high half (big-endian machines).
EVEN_IS_HIGH = sys.byteorder == "big"


def has_words(itemsize: int) -> bool:
    """Whether elements of ``itemsize`` bytes can be read by pairs as one word."""
    return itemsize in _WORD_TYPES


def word_type(itemsize: int) -> type:
    """The unsigned integer holding two elements of ``itemsize`` bytes (see :func:`has_words`)."""
    return _WORD_TYPES[itemsize]


def words_view(a: np.ndarray) -> np.ndarray:
    """``a`` (C-contiguous, an even number of elements per row, see :func:`has_words`) seen
    as words of two elements, without a copy; an empty array of words when it cannot be."""
    word = _WORD_TYPES.get(a.itemsize, np.uint64)
    if a.itemsize not in _WORD_TYPES or a.ndim < 1 or a.shape[-1] % 2 \
            or not a.flags.c_contiguous:
        empty = np.empty((0,) * a.ndim, word)
        empty.flags.writeable = a.flags.writeable  # the same array type as a view of ``a``
        return empty
    return a.view(word)


@intrinsic
def element_of_word(typingctx, word, shift, like):
    """The element held in ``word >> shift`` (``shift`` 0 or the element's width in bits),
    of the element type of the array ``like``: truncated, then reinterpreted as a float
    where the element is one.  All in registers, so it vectorises."""
    element = like.dtype

    def codegen(context, builder, signature, args):
        bits, amount, _ = args
        width = bits.type.width
        if amount.type.width > width:
            amount = builder.trunc(amount, bits.type)
        elif amount.type.width < width:
            amount = builder.zext(amount, bits.type)
        value = builder.trunc(builder.lshr(bits, amount), ir.IntType(element.bitwidth))
        if isinstance(element, types.Float):
            value = builder.bitcast(value, context.get_value_type(element))
        return value

    return element(word, shift, like), codegen


def element_bits(a):  # pragma: no cover - replaced by the overload inside numba
    raise NotImplementedError


@helper_overload(element_bits)
def _element_bits(a):
    """The width in bits of ``a``'s elements, as a compile-time constant: ``8 * a.itemsize``
    is read from the array at run time, and the tiling MaxPool kernel's shifts by it ran
    about 10% slower (measured against a fixed reference kernel in the same process)."""
    bits = a.dtype.bitwidth
    return lambda a: bits
