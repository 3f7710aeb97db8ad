"""Shared test setup: tests/ on sys.path (for ``import oracle``) and the hypothesis profile."""

from __future__ import annotations

import gc
import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings
from numba.core import event

TESTS = Path(__file__).resolve().parent
if str(TESTS) not in sys.path:
    sys.path.insert(0, str(TESTS))

# The oracle is pure Python and numba compiles on first use: no per-example deadline.
settings.register_profile(
    "poolfold",
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.load_profile("poolfold")

# Every test runs the kernel it names, compiled in its own process: no direct scan standing in
# while a child process compiles the separable MaxPool kernel (test_background_compile.py
# turns that on where it tests it).  Child processes the tests start inherit this.
os.environ["POOLFOLD_BACKGROUND_COMPILE"] = "0"


class _FreezeAfterCompiles(event.Listener):
    """After each compile, what is alive leaves the cycle collector's sight.

    numba keeps each signature it compiles alive, its typing and IR with it (about 100,000
    Python objects), and a compile makes many objects that live as long as it runs, which
    trigger the collector's full collections: each walks everything alive.  A test worker
    that had compiled a few dozen kernels spent 40-50 s of the run collecting, nearly all of
    it in full collections.  ``gc.freeze`` moves the live objects into the generation no
    collection walks (they are still freed when no longer referenced).  A full collection
    first frees the compile's own garbage, which frozen would stay (about a gigabyte per
    process over the run); it walks only what is younger than the last freeze."""

    def __init__(self):
        self.depth = 0

    def on_start(self, ev):
        self.depth += 1

    def on_end(self, ev):
        self.depth -= 1
        if self.depth == 0:
            gc.collect()
            gc.freeze()


event.register("numba:compile", _FreezeAfterCompiles())


# The files of the two tests pytest_collection_modifyitems moves to the end.
LAST_FILES = ("test_fuzz.py", "test_fuzz_boundscheck.py")


@pytest.hookimpl(trylast=True)  # after -k and --deselect have left out what they leave out
def pytest_collection_modifyitems(config, items):
    """Start the bounds-checked run (test_fuzz_boundscheck.py) in the background as soon as
    it is known to be wanted, so that it compiles beside the main run, and move the test
    that waits for it to the end: the run compiles every kernel again (about 6 minutes of
    one core at NUMBA_OPT=0, 12 at the default level), and waited for in its file's place
    the main run stood idle for most of that.  Under pytest-xdist (the README's ``-n auto``)
    the controlling process starts it instead, once (:func:`pytest_xdist_setupnodes`).

    The fuzz campaign (test_fuzz.py) goes just before it: its two worker processes compile,
    both at once, every kernel signature no test before them has put in numba's cache, and
    in its file's place, before the kernels' own tests, that was most of them (195 s of a
    19-minute run with an empty cache, 9-14 s with a full one; the whole run with a full
    cache went from 753 to 627 s with both moved)."""
    last = ("test_fixed_seed_cases_all_pass", "test_property_tests_pass_with_bounds_checking")
    # Under pytest-xdist the controlling process starts the run (below), once for all workers.
    if (any(item.name == last[1] for item in items) and not hasattr(config, "workerinput")
            and not config.option.collectonly):
        from test_fuzz_boundscheck import start_checked_run

        work = config.poolfold_checked_folder = Path(
            tempfile.mkdtemp(prefix="poolfold-boundscheck-"))
        config.poolfold_checked_run = work, start_checked_run(work)
    # Their files go last too, in the same order: ``--dist loadfile`` hands out whole files
    # in the order of their first test, and a worker given the checked run's file early
    # would stand idle, waiting for it, while the other ran the rest.
    def place(item):
        if item.name in last:
            return 2, last.index(item.name)
        return (1, LAST_FILES.index(item.path.name)) if item.path.name in LAST_FILES else (0, 0)

    items.sort(key=place)  # stable: every file's own order is kept


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_auto_num_workers(config):
    """``-n auto``: one worker per CPU this process may run on.  pytest-xdist's own count
    asks psutil for the machine's physical cores, which in a container limited to a few
    CPUs can be many times more than it has."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # no sched_getaffinity (macOS, Windows)
        return max(1, os.cpu_count() or 1)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_setupnodes(config, specs):
    """pytest-xdist's controlling process, before it starts its workers: the folder of the
    bounds-checked run, which they inherit and the worker that runs its test waits on."""
    from test_fuzz_boundscheck import CHECKED_RUN_FOLDER

    folder = Path(tempfile.mkdtemp(prefix="poolfold-boundscheck-"))
    os.environ[CHECKED_RUN_FOLDER] = str(folder)
    config.poolfold_checked_folder = folder


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_node_collection_finished(node, ids):
    """The controlling process starts the bounds-checked run as soon as the first worker's
    collection shows its test is wanted."""
    config = node.config
    folder = getattr(config, "poolfold_checked_folder", None)
    if (folder is None or getattr(config, "poolfold_checked_run", None)
            or not any(i.endswith("::test_property_tests_pass_with_bounds_checking")
                       for i in ids)):
        return
    from test_fuzz_boundscheck import start_checked_run

    config.poolfold_checked_run = folder, start_checked_run(folder)


def pytest_unconfigure(config):
    """An interrupted session leaves no bounds-checked run, nor its folder, behind."""
    started = getattr(config, "poolfold_checked_run", None)
    if started is not None:
        from test_fuzz_boundscheck import stop_checked_run

        stop_checked_run(started[1])
    folder = getattr(config, "poolfold_checked_folder", None)
    if folder is not None:
        shutil.rmtree(folder, ignore_errors=True)
