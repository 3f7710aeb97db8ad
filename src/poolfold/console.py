"""Terminal helpers shared by the ``poolfold`` command and its benchmarks."""

from __future__ import annotations

import sys


def progress(done: int, total: int, label: str = "", stream=None) -> None:
    """A one-line progress bar, redrawn in place (only on a terminal)."""
    stream = sys.stderr if stream is None else stream
    if not stream.isatty():
        return
    width = 30
    filled = width * done // max(total, 1)
    stream.write(f"\r[{'#' * filled}{'.' * (width - filled)}] {done}/{total} {label[:40]:<40}")
    if done >= total:
        stream.write("\r" + " " * (width + 54) + "\r")
    stream.flush()


def first_line(error: BaseException, limit: int = 110) -> str:
    """An error's first line, shortened to ``limit`` characters: one cell of a table."""
    text = (str(error).strip().splitlines() or [type(error).__name__])[0]
    return text if len(text) <= limit else text[: limit - 3] + "..."
