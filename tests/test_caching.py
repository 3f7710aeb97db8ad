"""A kernel loaded from the disk cache parses its linking module only when something links it
(poolfold.kernels.caching): it runs as compiled, a function compiled later can still call it,
and entries numba wrote itself still load."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

from poolfold.kernels import caching

# A kernel in a module of its own (numba caches functions defined in files), decorated as
# poolfold's kernels are, or as numba's own cache would have it with PLAIN set.
MODULE = textwrap.dedent("""
    import os
    import numba
    from poolfold.kernels import kernel

    decorate = numba.njit(cache=True) if os.environ.get("PLAIN") else kernel()

    @decorate
    def scaled_sum(a, weight):
        total = 0.0
        for v in a:
            total += v * weight
        return total
""")

# Run in a fresh process: the kernel's first call (compiled, or loaded from the cache), what
# its code library holds, then a function compiled afterwards that calls the kernel.
CHECK = textwrap.dedent("""
    import json, sys
    import numba
    import numpy as np
    import cached_kernel

    a = np.arange(10.0)
    first = cached_kernel.scaled_sum(a, 2.0)
    [result] = cached_kernel.scaled_sum.overloads.values()
    lazy = result.library._shared_module is None

    @numba.njit
    def outer(a):
        return cached_kernel.scaled_sum(a, 3.0) + 1.0

    print(json.dumps({"first": first, "outer": outer(a), "lazy_on_load": lazy,
                      "hits": sum(cached_kernel.scaled_sum.stats.cache_hits.values())}))
""")


def _run(tmp_path, plain: bool = False) -> dict:
    import json

    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path / "cache"),
           "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]),
           "POOLFOLD_BACKGROUND_COMPILE": "0"}
    env.pop("PLAIN", None)
    if plain:
        env["PLAIN"] = "1"
    done = subprocess.run([sys.executable, "-c", CHECK], env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_the_installed_numba_takes_the_lazy_path():
    """A numba whose internals moved would load every kernel as numba does (correct, and
    slower to start): the suite says so instead."""
    assert caching.AVAILABLE


def test_a_cached_kernel_loads_without_its_linking_module_and_still_links(tmp_path):
    (tmp_path / "cached_kernel.py").write_text(MODULE)
    compiled = _run(tmp_path)
    assert compiled["hits"] == 0 and compiled["first"] == 90.0 and compiled["outer"] == 136.0
    assert not compiled["lazy_on_load"]  # compiled in this process: its module is at hand
    loaded = _run(tmp_path)
    assert loaded["hits"] == 1, "the second process did not load the kernel from the cache"
    assert loaded["lazy_on_load"], "loading the kernel parsed its linking module"
    assert loaded["first"] == 90.0
    assert loaded["outer"] == 136.0  # linked from the module parsed on demand


def test_entries_numba_wrote_itself_still_load(tmp_path):
    (tmp_path / "cached_kernel.py").write_text(MODULE)
    written = _run(tmp_path, plain=True)
    assert written["hits"] == 0
    loaded = _run(tmp_path)
    assert loaded["hits"] == 1
    assert not loaded["lazy_on_load"]  # numba's own entry: parsed as numba parses it
    assert loaded["first"] == 90.0 and loaded["outer"] == 136.0
