"""Processes that start together compile each kernel signature once (poolfold.kernels.sharing):
one compiles under the signature's lock file, the others wait for it and load the kernel from
numba's cache; a lock held too long is given up on."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

from poolfold.kernels import sharing

fcntl = pytest.importorskip("fcntl")  # no flock: every process compiles on its own

# A kernel of its own in a module of its own, so that its cache (beside the module, in
# __pycache__) starts empty in each test's folder.
KERNEL_MODULE = textwrap.dedent("""
    import numpy as np
    from poolfold.kernels import kernel

    @kernel()
    def scaled_total(a, weight):
        total = 0.0
        for v in a:
            total += v * weight
        return total
""")

# A process that calls the kernel and prints whether it compiled it (a numba compile event
# is a cache miss) and what it returned.
CALLER = textwrap.dedent("""
    import sys
    sys.path.insert(0, sys.argv[1])
    import numpy as np
    from numba.core import event
    import shared_kernel

    class Compiles(event.Listener):
        names = []

        def on_start(self, ev):
            self.names.append(ev.data["dispatcher"].py_func.__name__)

        def on_end(self, ev):
            pass

    event.register("numba:compile", Compiles())
    print("STARTED", flush=True)
    total = shared_kernel.scaled_total(np.arange(5.0), 2.0)
    print("RESULT", total, "COMPILED", Compiles.names.count("scaled_total"), flush=True)
""")


@pytest.fixture
def shared_kernel(tmp_path, monkeypatch):
    (tmp_path / "shared_kernel.py").write_text(KERNEL_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("shared_kernel", None)
    import shared_kernel

    yield shared_kernel.scaled_total
    sys.modules.pop("shared_kernel", None)


def _signature():
    import numba

    return (numba.typeof(np.arange(5.0)), numba.typeof(2.0))


def _hold_lock(kernel, signature) -> int:
    """The signature's lock, taken as another process compiling it would hold it."""
    descriptor = sharing.open_lock(kernel, signature)
    assert descriptor is not None, "the kernel has an on-disk cache to lock beside"
    assert sharing.try_lock(descriptor)
    return descriptor


def test_a_process_waits_for_the_one_compiling_and_loads_its_kernel(shared_kernel, tmp_path):
    kernel, signature = shared_kernel, _signature()
    held = _hold_lock(kernel, signature)
    caller = subprocess.Popen([sys.executable, "-c", CALLER, str(tmp_path)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert caller.stdout.readline().split() == ["STARTED"]
        time.sleep(1.5)  # ample to compile this kernel: the caller is waiting for the lock
        assert caller.poll() is None, caller.communicate()
        # This process compiles the kernel into numba's cache as the lock's holder would
        # (numba's own compile: this process's would wait for the lock it holds itself).
        type(kernel).compile(kernel, signature)
    finally:
        os.close(held)  # unlocks
    out, err = caller.communicate(timeout=300)
    assert caller.returncode == 0, err
    assert out.split() == ["RESULT", "20.0", "COMPILED", "0"], (out, err)


def test_with_the_lock_free_a_process_compiles_and_holds_it_meanwhile(shared_kernel):
    from numba.core import event

    kernel, signature = shared_kernel, _signature()
    seen = []

    class LookAtTheLock(event.Listener):  # numba's compile of the kernel, as it starts
        def on_start(self, ev):
            if ev.data["dispatcher"] is kernel:
                descriptor = sharing.open_lock(kernel, signature)
                seen.append("held" if not sharing.try_lock(descriptor) else "free")
                os.close(descriptor)

        def on_end(self, ev):
            pass

    with event.install_listener("numba:compile", LookAtTheLock()):
        assert kernel(np.arange(5.0), 2.0) == 20.0
    assert seen == ["held"]
    # compiled, the kernel needs the lock no more, and no longer holds it
    descriptor = sharing.open_lock(kernel, signature)
    try:
        assert sharing.try_lock(descriptor)
    finally:
        os.close(descriptor)


def test_a_lock_held_too_long_is_given_up_and_the_kernel_compiled(shared_kernel, monkeypatch):
    kernel, signature = shared_kernel, _signature()
    monkeypatch.setattr(sharing, "WAIT_LIMIT_S", 0.5)
    held = _hold_lock(kernel, signature)  # a process stopped while it compiled
    try:
        started = time.monotonic()
        assert kernel(np.arange(5.0), 2.0) == 20.0
        assert time.monotonic() - started >= 0.5
    finally:
        os.close(held)


def test_every_poolfold_kernel_shares_its_compiles():
    """Each kernel Python calls is made by poolfold.kernels.kernel (or handed to
    share_compiles), so no kernel compiles beside another process's compile of it."""
    import importlib
    import pkgutil

    import numba

    import poolfold.kernels as package

    kernels = []
    for info in pkgutil.iter_modules(package.__path__):
        module = importlib.import_module(f"{package.__name__}.{info.name}")
        for value in vars(module).values():
            if (isinstance(value, numba.core.registry.CPUDispatcher)
                    and value.py_func.__module__ == module.__name__
                    and value.targetoptions.get("no_cpython_wrapper") is not True
                    and value._cache.__class__.__name__ != "NullCache"):
                kernels.append(value)
    assert len(kernels) >= 20
    unshared = [k.py_func.__qualname__ for k in kernels
                if getattr(k.compile, "__qualname__", "") != "share_compiles.<locals>.compile"]
    assert not unshared
