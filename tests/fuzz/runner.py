"""Worker processes with a time and a memory limit, forked from a parent that has imported
poolfold, numba and the oracle (a fresh Python costs about a second per case; a fork,
milliseconds).

The parent never runs a kernel: numba's OpenMP threading layer cannot survive a fork once
its threads exist, so each worker loads the (disk-cached) kernels itself and then runs case
after case.  A worker that dies (a signal: a crash) or does not answer in time (a hang) is
killed and counted against its case, and a fresh one is forked.  Workers are also replaced
every ``RECYCLE`` cases, so that a corrupted heap cannot hide for long.
"""

from __future__ import annotations

import multiprocessing
import os
import resource
import signal
import time
import traceback
from multiprocessing.connection import wait

RECYCLE = 10000
MEMORY_LIMIT = 2 * 2**30  # address space a worker may add to what it holds when it starts
# Generous: a worker compiles a kernel the first time it meets a new type (seconds), and
# the machine may be busy.
TIME_LIMIT = 180.0


def _address_space() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    return 0


def _serve(connection, memory_limit):
    from . import judge  # imported before the fork, so this is free

    limit = _address_space() + memory_limit
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    while True:
        try:
            spec = connection.recv()
        except EOFError:
            return
        try:
            verdict = judge.judge(spec)
        except MemoryError:
            verdict = ("fail", "MemoryError: beyond the worker's memory limit")
        except BaseException:  # noqa: BLE001 - the harness itself must not die silently
            verdict = ("fail", "harness: " + traceback.format_exc(limit=3))
        connection.send(verdict)


class Worker:
    def __init__(self, memory_limit=MEMORY_LIMIT):
        context = multiprocessing.get_context("fork")
        self.connection, child = context.Pipe()
        self.process = context.Process(target=_serve, args=(child, memory_limit), daemon=True)
        self.process.start()
        child.close()
        self.done = 0
        self.spec = None
        self.started = 0.0

    def submit(self, spec):
        self.spec, self.started = spec, time.monotonic()
        self.connection.send(spec)

    def stop(self):
        if self.process.is_alive():
            os.kill(self.process.pid, signal.SIGKILL)
        self.process.join()
        self.connection.close()


def run(specs, workers=1, time_limit=TIME_LIMIT, memory_limit=MEMORY_LIMIT, on_result=None):
    """Judge every spec (an iterable); yields (index, status, detail) in completion order.  Status is
    judge's, or "fail" with "crash (signal N)" / "hang (over T s)" for a dead worker."""
    from . import judge  # noqa: F401 - warm the parent before forking

    pending = enumerate(specs)  # drawn lazily: a long campaign starts at once
    busy = {}

    def feed(worker):
        for index, spec in pending:
            worker.submit(spec)
            busy[worker.connection] = (worker, index)
            return
        worker.stop()

    for _ in range(workers):
        feed(Worker(memory_limit))
    while busy:
        ready = wait(list(busy), timeout=5.0)
        now = time.monotonic()
        finished = []
        for connection in ready:
            worker, index = busy.pop(connection)
            try:
                status, detail = connection.recv()
            except (EOFError, OSError):
                worker.process.join(5)
                code = worker.process.exitcode
                status, detail = "fail", (f"crash (signal {-code})" if code and code < 0
                                          else f"worker exited with status {code}")
                worker.stop()
                worker = Worker(memory_limit)
            finished.append((worker, index, status, detail))
        for connection, (worker, index) in list(busy.items()):
            if now - worker.started > time_limit:
                busy.pop(connection)
                worker.stop()
                finished.append((Worker(memory_limit), index, "fail",
                                 f"hang (no answer in {time_limit:.0f} s)"))
        for worker, index, status, detail in finished:
            yield index, status, detail
            worker.done += 1
            if worker.done >= RECYCLE:
                worker.stop()
                worker = Worker(memory_limit)
            feed(worker)
