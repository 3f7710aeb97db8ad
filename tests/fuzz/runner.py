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
# A case hangs when its worker spends more than TIME_LIMIT seconds of CPU on it (an endless
# loop burns CPU), or more than WALL_LIMIT seconds in all (a deadlock does not).  CPU time,
# not wall time, so that a busy machine does not make hangs: a worker compiles a kernel the
# first time it meets a new type, 5-30 s of CPU each.
TIME_LIMIT = 120.0
WALL_LIMIT = 1800.0


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of process ``pid`` so far."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return 0.0


def _address_space() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    return 0


def _serve(connection, memory_limit):
    from . import judge  # imported before the fork, so this is free

    try:  # die with the parent, whatever kills it
        import ctypes

        ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
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
        self.cpu_started = cpu_seconds(self.process.pid)
        self.connection.send(spec)

    def overdue(self, time_limit) -> bool:
        return (cpu_seconds(self.process.pid) - self.cpu_started > time_limit
                or time.monotonic() - self.started > WALL_LIMIT)

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
            if worker.overdue(time_limit):
                busy.pop(connection)
                worker.stop()
                finished.append((Worker(memory_limit), index, "fail",
                                 f"hang (over {time_limit:.0f} s of CPU)"))
        for worker, index, status, detail in finished:
            yield index, status, detail
            worker.done += 1
            if worker.done >= RECYCLE:
                worker.stop()
                worker = Worker(memory_limit)
            feed(worker)
