"""The error types poolfold raises for bad input.

Every message starts with the op and its version (``MaxPool-12: ...``) and then names the
attribute or input at fault, so a user can find the offending node in a model.  Both types
subclass the builtin a caller would expect (``ValueError`` / ``TypeError``), so code written
against numpy-style errors keeps working.
"""

from __future__ import annotations


class PoolfoldError(ValueError):
    """A value, shape or attribute is invalid for the op and version."""


class PoolfoldTypeError(TypeError):
    """A tensor or attribute has a type the op's version does not accept."""


def op_label(op: str, version: int, domain: str = "") -> str:
    """``MaxPool-12`` for ai.onnx, ``com.ms.internal.nhwc.MaxPool-11`` for other domains."""
    prefix = f"{domain}." if domain else ""
    return f"{prefix}{op}-{version}"
