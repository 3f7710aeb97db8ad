"""One line on stderr (or a chosen stream) when numba compiles a poolfold kernel, as a first
run compiles for seconds: ``poolfold run`` says so rather than sit silent."""

from __future__ import annotations

import sys
import threading

from numba.core import event

# Every kernel's module is in this package; numba compiles other code too (the caller's own).
_KERNELS_PACKAGE = __package__


class _CompileNotices(event.Listener):
    """A numba compile-event listener: one line per poolfold kernel that numba compiles
    (a cache miss) rather than loads from its cache, for the outermost kernel only."""

    def __init__(self):
        self.stream = None  # None: whatever sys.stderr is when a line is written
        self._depth = threading.local()

    def on_start(self, ev):
        depth = getattr(self._depth, "value", 0)
        self._depth.value = depth + 1
        function = ev.data["dispatcher"].py_func
        if depth == 0 and function.__module__.startswith(_KERNELS_PACKAGE + "."):
            types = [str(getattr(t, "dtype", t)) for t in ev.data["args"][:1]]
            self._write(f"poolfold: compiling the {function.__name__} kernel for "
                        f"{', '.join(types)} data: once, numba caches it for later runs")

    def on_end(self, ev):
        # A compile already under way when the listener was registered ends unseen.
        self._depth.value = max(0, getattr(self._depth, "value", 0) - 1)

    def _write(self, line: str) -> None:
        try:
            print(line, file=self.stream if self.stream is not None else sys.stderr, flush=True)
        except (OSError, ValueError):  # a closed or broken stream must not fail the compile
            pass


_NOTICES: _CompileNotices | None = None
_NOTICES_LOCK = threading.Lock()


def announce_compiles(stream=None) -> None:
    """From now on, say on ``stream`` (default: the current stderr) whenever a kernel is being
    compiled.  Calling it again only changes the stream: one line per compile, however often
    it is called."""
    global _NOTICES
    with _NOTICES_LOCK:
        if _NOTICES is None:
            _NOTICES = _CompileNotices()
            event.register("numba:compile", _NOTICES)
        _NOTICES.stream = stream


def announce(line: str) -> None:
    """Write ``line`` where compiles are announced (:func:`announce_compiles`), if anywhere."""
    if _NOTICES is not None:
        _NOTICES._write(line)
