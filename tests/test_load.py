"""Load: many Python threads calling mixed ops on shared read-only inputs for a bounded time.

Every result must equal the single-threaded one bit for bit, no thread may hang (each is
joined with a deadline), the shared inputs must stay untouched, and the process's memory
must not grow over the run beyond a small allowance (results are dropped as they are
checked, so a leak per call would show).
"""

from __future__ import annotations

import threading
import time

import ml_dtypes
import numpy as np
import psutil

import poolfold
import poolfold.nhwc

THREADS = 8
SECONDS = 8.0
ALLOWED_GROWTH = 64 * 2**20


def _shared_inputs():
    rng = np.random.default_rng(7)
    x = rng.standard_normal((2, 5, 19, 17)).astype(np.float32)
    x[0, 1, 2:5, 2:5] = 0.5  # ties
    x[1, 3, 8, 8] = np.nan
    y, i = poolfold.max_pool(x, [3, 3], strides=[2, 2], pads=[1, 1, 1, 1], return_indices=True)
    inputs = dict(
        x=x,
        x_int8=rng.integers(-128, 128, (3, 4, 11, 13)).astype(np.int8),
        x_bf16=x.astype(ml_dtypes.bfloat16),
        x_3d=rng.standard_normal((1, 3, 7, 8, 9)).astype(np.float16),
        x_nhwc=np.ascontiguousarray(x.transpose(0, 2, 3, 1)),
        y=y, i=i,
        y_nhwc=np.ascontiguousarray(y.transpose(0, 2, 3, 1)),
        cols=rng.integers(-9, 9, (2, 3 * 6, 7 * 3)).astype(np.int32),
        cols_f=rng.standard_normal((1, 2 * 4, 25)).astype(np.float64),
    )
    for value in inputs.values():
        value.flags.writeable = False
    return inputs


CALLS = {
    "pool": lambda d: poolfold.max_pool(d["x"], [3, 3], strides=[2, 2], pads=[1, 1, 1, 1],
                                        return_indices=True),
    "pool_dilated_so": lambda d: poolfold.max_pool(d["x"], [2, 3], dilations=[2, 1],
                                                   storage_order=1, ceil_mode=True,
                                                   return_indices=True),
    "pool_int8": lambda d: poolfold.max_pool(d["x_int8"], [2, 2], strides=[2, 2]),
    "pool_bf16": lambda d: poolfold.max_pool(d["x_bf16"], [3, 3], auto_pad="SAME_UPPER",
                                             return_indices=True),
    "pool_3d": lambda d: poolfold.max_pool(d["x_3d"], [2, 2, 2], strides=[2, 1, 2]),
    "unpool": lambda d: poolfold.max_unpool(d["y"], d["i"], [3, 3], strides=[2, 2],
                                            pads=[1, 1, 1, 1], output_shape=d["x"].shape),
    "col2im_int": lambda d: poolfold.col2im(d["cols"], [8, 5], [2, 3]),
    "col2im_f64": lambda d: poolfold.col2im(d["cols_f"], [6, 6], [2, 2], strides=[1, 1],
                                            pads=[0, 0, 0, 0], dilations=[1, 1]),
    "nhwc_pool": lambda d: poolfold.nhwc.max_pool(d["x_nhwc"], [3, 3], strides=[2, 2],
                                                  return_indices=True, activation="Relu"),
    "nhwc_unpool": lambda d: poolfold.nhwc.max_unpool(d["y_nhwc"], d["i"], [3, 3],
                                                      strides=[2, 2], pads=[1, 1, 1, 1],
                                                      output_shape=d["x"].shape),
}


def _as_bytes(result):
    parts = result if isinstance(result, tuple) else (result,)
    return tuple((p.shape, p.dtype.str, p.tobytes()) for p in parts)


def test_threads_calling_mixed_ops_agree_with_one_thread():
    inputs = _shared_inputs()
    snapshot = {k: v.tobytes() for k, v in inputs.items()}
    expected = {name: _as_bytes(call(inputs)) for name, call in CALLS.items()}
    names = list(CALLS)
    # Warm up every call in threads once, then take the baseline memory.
    for name in names:
        CALLS[name](inputs)
    process = psutil.Process()
    baseline = process.memory_info().rss

    mismatches, errors, counts = [], [], [0] * THREADS
    stop = time.monotonic() + SECONDS

    def work(k):
        turn = k
        try:
            while time.monotonic() < stop:
                name = names[turn % len(names)]
                turn += 1
                if _as_bytes(CALLS[name](inputs)) != expected[name]:
                    mismatches.append(name)
                counts[k] += 1
        except BaseException as error:  # noqa: BLE001 - reported below
            errors.append(repr(error))

    threads = [threading.Thread(target=work, args=(k,), daemon=True) for k in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(SECONDS + 120)
    assert not any(t.is_alive() for t in threads), "a thread did not finish: deadlock?"
    assert not errors, errors[:3]
    assert not mismatches, sorted(set(mismatches))
    assert min(counts) >= len(names), counts  # every thread ran every op at least once
    assert {k: v.tobytes() for k, v in inputs.items()} == snapshot
    growth = process.memory_info().rss - baseline
    assert growth < ALLOWED_GROWTH, f"RSS grew by {growth / 2**20:.1f} MiB over {sum(counts)} calls"
