"""The README's Python API example runs as written, and its error example is what poolfold
says: a newcomer copies them first."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

import poolfold

README = Path(__file__).resolve().parents[1] / "README.md"


def _section(title: str) -> str:
    text = README.read_text(encoding="utf-8")
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start:end if end >= 0 else None]


def test_python_api_example_runs():
    blocks = re.findall(r"```python\n(.*?)```", _section("Python API"), re.S)
    assert len(blocks) == 1, "the section should hold one Python example"
    scope: dict = {}
    exec(compile(blocks[0], str(README), "exec"), scope)  # its asserts are the checks
    assert scope["y"].shape == (8, 64, 56, 56) and scope["image"].shape == (1, 2, 6, 6)
    assert scope["image"].dtype == np.int8 and scope["g"].shape == (8, 64, 1, 1)


def test_error_example_is_what_poolfold_says():
    example = re.search(r"```text\n>>> (.*?)\n(\w+): (.*?)\n```", _section("Python API"), re.S)
    call, kind, message = example.groups()
    with pytest.raises(getattr(poolfold, kind)) as raised:
        eval(call, {"poolfold": poolfold, "np": np})
    assert str(raised.value) == message
