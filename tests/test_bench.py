"""`poolfold bench`: what its JSON reports is what it measured.

Speed itself is never asserted here (shared machines are noisy): these tests check that the
medians, ratios and byte counts the benchmark prints follow from its own samples and inputs.
"""

import json
import statistics
import subprocess
import sys

import pytest

from poolfold import bench


def _bench(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "poolfold.cli", "bench", *args],
                          capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def unpool_report():
    done = _bench("maxunpool2d", "--repeat", "3", "--json")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_json_medians_and_ratios_follow_from_the_samples(unpool_report):
    (row,) = unpool_report["results"]
    assert row["key"] == "maxunpool2d"
    for name in ("poolfold", "onnxruntime", "memcopy"):
        assert row["rounds"][name] == 3
        assert len(row["samples_ms"][name]) == 3
        assert row["ms"][name] == pytest.approx(statistics.median(row["samples_ms"][name]),
                                                abs=1e-3)
    assert row["baseline"] == "onnxruntime"
    assert row["ratio"] == pytest.approx(row["ms"]["poolfold"] / row["ms"]["onnxruntime"])
    assert row["copy_multiple"] == pytest.approx(row["ms"]["poolfold"] / row["ms"]["memcopy"])


def test_memcopy_moves_the_bytes_poolfold_reads_and_writes(unpool_report):
    (row,) = unpool_report["results"]
    n, c, h, w = 8, 64, 56, 56
    x_bytes, indices_bytes, shape_bytes = n * c * h * w * 4, n * c * h * w * 8, 4 * 8
    y_bytes = n * c * (2 * h) * (2 * w) * 4
    assert row["bytes_moved"] == x_bytes + indices_bytes + shape_bytes + y_bytes


def test_report_names_the_run(unpool_report):
    assert unpool_report["threads"] == 2
    assert unpool_report["repeat"] == 3
    assert {"python", "poolfold", "numpy", "numba", "onnxruntime"} <= set(
        unpool_report["versions"])


def test_unknown_workload_is_a_usage_error():
    done = _bench("no-such-workload")
    assert done.returncode == 2
    assert "unknown workload no-such-workload" in done.stderr
    assert "maxpool2d" in done.stderr  # the known ones are listed


def test_startup_report_shows_the_numba_floor_beside_the_cold_start():
    text = bench.format_startup({
        "compile": [{"key": "maxpool2d", "compile_s": 12.5}, {"key": "col2im", "error": "boom"}],
        "cold_start_command": 'python -c "..."',
        "cold_start_s": 0.93, "numpy_import_s": 0.14, "numba_floor_s": 0.85,
    })
    assert "12.50" in text and "failed: boom" in text
    assert f"0.93 s (median of {bench.STARTUP_ROUNDS})" in text
    assert "0.14 s" in text and "0.85 s" in text
