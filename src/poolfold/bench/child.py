"""Measurements made in a fresh child process: one that starts with nothing imported,
compiled or allocated, which peak memory and first-call compile time need.

The parent calls :func:`run_child` with a ``module:function`` name; the child
(``python -m poolfold.bench.child module:function ARG ...``) imports that function, calls it
with the arguments (strings) and prints its result, a dict, as the last line of JSON.
"""

from __future__ import annotations

import importlib
import json
import os
import resource
import subprocess
import sys
import time

CHILD_TIMEOUT_S = 900  # a first call that compiles many kernels on a busy machine is slow


def _children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_command(command: list[str], env: dict | None = None, unset: tuple = ()) -> dict:
    """Run ``command`` to completion in this environment, updated with ``env`` and without the
    variables ``unset``: its wall and CPU seconds (``wall_s``, ``cpu_s``) and its last line of
    output (``stdout``), or ``error`` with the last line of its errors."""
    environment = {k: v for k, v in {**os.environ, **(env or {})}.items() if k not in unset}
    cpu = _children_cpu_s()
    start = time.perf_counter()
    try:
        done = subprocess.run(command, capture_output=True, text=True, env=environment,
                              timeout=CHILD_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {CHILD_TIMEOUT_S} s"}
    wall = time.perf_counter() - start
    if done.returncode != 0:
        lines = done.stderr.strip().splitlines() or [f"exit status {done.returncode}"]
        return {"error": lines[-1][:110]}
    lines = done.stdout.strip().splitlines()
    return {"wall_s": wall, "cpu_s": _children_cpu_s() - cpu, "stdout": lines[-1] if lines else ""}


def run_commands_together(commands: list[list[str]], env: dict | None = None) -> dict:
    """Start every one of ``commands`` at once in this environment, updated with ``env``, and
    wait for them all: the wall seconds until the last one ends and their CPU seconds
    together (``wall_s``, ``cpu_s``), or ``error`` with the last line of the first failed
    one's errors."""
    environment = {**os.environ, **(env or {})}
    cpu = _children_cpu_s()
    start = time.perf_counter()
    running = [subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                text=True, env=environment) for command in commands]
    errors = []
    for process in running:
        try:
            _, err = process.communicate(timeout=max(1.0, CHILD_TIMEOUT_S
                                                     - (time.perf_counter() - start)))
        except subprocess.TimeoutExpired:
            process.kill()
            process.communicate()
            errors.append(f"timed out after {CHILD_TIMEOUT_S} s")
            continue
        if process.returncode != 0:
            lines = err.strip().splitlines() or [f"exit status {process.returncode}"]
            errors.append(lines[-1][:110])
    wall = time.perf_counter() - start
    if errors:
        return {"error": errors[0]}
    return {"wall_s": wall, "cpu_s": _children_cpu_s() - cpu}


def run_child(target: str, *args, env: dict | None = None) -> dict:
    """``target`` (``module:function``) called with ``args`` in a child process: its result,
    or ``{"error": ...}``."""
    done = run_command([sys.executable, "-m", __name__, target, *map(str, args)], env)
    if "error" in done:
        return done
    return json.loads(done["stdout"])


def main(argv: list[str]) -> int:
    target, *args = argv
    module, _, function = target.partition(":")
    result = getattr(importlib.import_module(module), function)(*args)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
