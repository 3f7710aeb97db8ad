"""`poolfold bench`: what its JSON reports is what it measured, and it measures fairly.

Speed itself is never asserted here (shared machines are noisy): these tests check that the
medians, spreads, ratios and byte counts the benchmark prints follow from its own samples and
inputs, that every implementation is timed in blocks of its own, that the averaging matrix's
peers compute what poolfold does, and the shape of the start-up report.
"""

import argparse
import importlib.util
import json
import math
import statistics
import subprocess
import sys
import time
import types

import numpy as np
import pytest

from poolfold.bench import add_arguments, flatness, memory, report, runner, startup


def _bench(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "poolfold.cli", "bench", "--settle", "0", *args],
                          capture_output=True, text=True, timeout=600)


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(argv)


@pytest.fixture(scope="module")
def unpool_report():
    done = _bench("maxunpool2d", "--repeat", "3", "--json")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_json_medians_spreads_and_ratios_follow_from_the_samples(unpool_report):
    (row,) = unpool_report["results"]
    assert row["key"] == "maxunpool2d"
    for name in ("poolfold", "onnxruntime", "onnxruntime no-spin", "stream"):
        samples = row["samples_ms"][name]
        # at least --repeat rounds, more where 3 calls would not fill a 50 ms block
        assert 3 <= row["rounds"][name] == len(samples) <= runner.MOST_ROUNDS
        assert row["ms"][name] == pytest.approx(statistics.median(samples), abs=1e-3)
        q1, q3 = row["spread_ms"][name]
        assert min(samples) <= q1 <= row["ms"][name] <= q3 <= max(samples)
    # The ratio is taken to the faster onnxruntime setting, never the slower.
    fastest = min(("onnxruntime", "onnxruntime no-spin"), key=lambda name: row["ms"][name])
    assert row["baseline"] == fastest
    assert row["ratio"] == pytest.approx(row["ms"]["poolfold"] / row["ms"][fastest])
    assert row["stream_multiple"] == pytest.approx(row["ms"]["poolfold"] / row["ms"]["stream"])


def test_the_stream_moves_the_bytes_poolfold_reads_and_writes(unpool_report):
    (row,) = unpool_report["results"]
    n, c, h, w = 8, 64, 56, 56
    x_bytes, indices_bytes, shape_bytes = n * c * h * w * 4, n * c * h * w * 8, 4 * 8
    y_bytes = n * c * (2 * h) * (2 * w) * 4
    assert row["bytes_moved"] == x_bytes + indices_bytes + shape_bytes + y_bytes


def test_the_stream_reads_x_once_and_writes_y_once():
    from poolfold.bench.yardstick import stream_runner

    run = stream_runner(8 * 1000, 8 * 7)
    y = run()
    assert y.size == 7 and (y == 1).all()  # every word written, each the max of its run of X

def test_report_names_the_run(unpool_report):
    assert unpool_report["threads"] == 2
    assert unpool_report["repeat"] == 3
    assert {"python", "poolfold", "numpy", "numba", "onnxruntime"} <= set(
        unpool_report["versions"])
    assert unpool_report["settle_s"] == 0  # --settle 0: no pause before the end's load
    for when in ("load_average_start", "load_average_end"):
        assert len(unpool_report[when]) == 3


def test_each_implementation_is_timed_in_blocks_of_its_own_after_a_pause(monkeypatch):
    calls, pauses = [], []
    monkeypatch.setattr(runner.time, "sleep", lambda s: (pauses.append(s), calls.append("pause")))
    # A collection of this process's whole heap takes a second late in the suite: counted
    # here, not run.
    monkeypatch.setattr(runner.gc, "collect", lambda: calls.append("collect"))
    runners = {name: (lambda name=name: calls.append(name)) for name in "abc"}
    times = runner.time_blocks(runners, {"c": 2}, repeat=7)

    assert {name: len(t) for name, t in times.items()} == {"a": 7, "b": 7, "c": 2}
    # before each block, the garbage collected, then the pause
    assert "".join(calls).count("collectpause") == calls.count("pause") == calls.count("collect")
    blocks = "".join(calls).replace("collectpause", " ").split()
    settle = runner.SETTLE_CALLS
    # Three passes in a rotating order; a block is its untimed calls, then the timed ones
    # back to back; 7 rounds split 3 + 2 + 2, c's 2 rounds 1 + 1 (no block, no pause, after).
    assert blocks == ["a" * (settle + 3), "b" * (settle + 3), "c" * (settle + 1),
                      "b" * (settle + 2), "c" * (settle + 1), "a" * (settle + 2),
                      "a" * (settle + 2), "b" * (settle + 2)]
    assert pauses == [runner.PAUSE_S] * len(blocks)


def test_short_calls_get_rounds_enough_to_fill_each_block():
    repeat, blocks = 15, runner.passes(15)
    floor = runner.BLOCK_FLOOR_S
    assert runner.rounds_for(1.0, repeat) == repeat  # long calls: --repeat
    assert runner.rounds_for(floor, repeat) == repeat
    # 40 us calls: each of the three blocks lasts the floor, the same for every implementation
    rounds = runner.rounds_for(40e-6, repeat)
    assert rounds == math.ceil(blocks * floor / 40e-6)
    assert rounds * 40e-6 / blocks >= floor
    assert runner.rounds_for(1e-7, repeat) == runner.MOST_ROUNDS
    assert runner.rounds_for(1e-7, repeat, block_s=0.0) == repeat
    assert runner.rounds_for(1e-3, 1, block_s=0.01) == 10  # --repeat 1: one block



def test_rounds_come_from_the_time_of_a_warm_call(monkeypatch):
    """An implementation whose first runs are slow (onnxruntime's second run of a session
    took 16 times its settled one) gets the rounds of its settled time, so its blocks last
    the floor as everyone's do; a call longer than the estimate's time is timed once.  The
    calls take simulated time (a clock they advance), so a busy host cannot change how many
    fit in the estimate's time."""
    clock = [0.0]
    monkeypatch.setattr(runner, "time", types.SimpleNamespace(perf_counter=lambda: clock[0]))
    calls = []

    def settling():
        calls.append(None)
        clock[0] += 0.004 if len(calls) <= 2 else 0.0002

    settled = runner.steady_seconds(settling)  # two slow calls of 25: the median is fast
    assert settled == pytest.approx(0.0002) and len(calls) == runner.ESTIMATE_CALLS
    assert runner.rounds_for(settled, 15) > 5 * runner.rounds_for(0.004, 15)

    long_calls = []

    def long_call():
        long_calls.append(None)
        clock[0] += runner.ESTIMATE_S * 1.5

    assert runner.steady_seconds(long_call) == pytest.approx(runner.ESTIMATE_S * 1.5)
    assert len(long_calls) == 1  # one call, not 25


def test_block_floor_zero_keeps_exactly_repeat_rounds():
    done = _bench("maxunpool2d", "--repeat", "2", "--block-ms", "0", "--json", "--settle", "0")
    assert done.returncode == 0, done.stderr
    (row,) = json.loads(done.stdout)["results"]
    assert set(row["rounds"].values()) == {2}
    assert _bench("--block-ms", "-1").returncode == 2


def test_unknown_workload_is_a_usage_error():
    done = _bench("no-such-workload")
    assert done.returncode == 2
    assert "unknown workload no-such-workload" in done.stderr
    assert "maxpool2d" in done.stderr  # the known ones are listed


def test_no_timing_and_no_section_is_a_usage_error():
    done = _bench("--no-timing")
    assert done.returncode == 2
    assert "--no-timing leaves nothing to run" in done.stderr


def test_memory_section_alone_reports_the_peak_beyond_the_outputs():
    done = _bench("maxunpool2d", "--no-timing", "--memory", "--json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["results"] == []
    (row,) = report["memory"]
    assert row["key"] == "maxunpool2d"
    assert row["output_bytes"] == 8 * 64 * 112 * 112 * 4  # Y, float32
    assert row["extra_bytes"] == row["peak_bytes"] - row["output_bytes"]
    assert "maxunpool2d" in memory.summary([row])


def test_flatness_times_every_window_and_reports_the_growth(monkeypatch, tmp_path):
    """The flatness section times each op, input and window (small inputs here), reports
    each window's median and the slowest over the 3-wide one, and writes its markdown
    table between its markers."""
    monkeypatch.setattr(flatness, "INPUTS", (("1-D", (1, 2, 300)), ("2-D", (1, 2, 40, 40))))
    monkeypatch.setattr(runner, "PAUSE_S", 0.0)
    rows = flatness.measure(_args("--repeat", "3", "--block-ms", "0"))
    assert [(r["op"], r["rank"]) for r in rows] == [
        (op, rank) for rank in ("1-D", "2-D") for op in flatness.OPS]
    for row in rows:
        assert sorted(row["ms"]) == list(flatness.WINDOWS)
        assert all(t > 0 for t in row["ms"].values())
    row = flatness._rows(rows)[0]
    assert row.growth() == pytest.approx(max(row.ms.values()) / row.ms[3])
    text = flatness.summary(rows)
    assert "slowest / 3-wide" in text and "MaxPool" in text and "AveragePool" in text
    meta = {"date": "2026-01-01", "processor": "cpu", "cpu_count": 2, "threads": 2,
            "versions": {"poolfold": "x"}, "load_average_start": [0.1, 0.1, 0.1],
            "load_average_end": [0.2, 0.1, 0.1]}
    path = tmp_path / "page.md"
    path.write_text("before\n<!-- bench:flatness -->\nSTALE\n<!-- /bench:flatness -->\nafter\n")
    report.fill_marked_sections(str(path), {"flatness": flatness.markdown(rows, meta, "cmd")})
    page = path.read_text()
    assert "STALE" not in page and "| MaxPool | 1-D (1, 2, 300) |" in page and "after" in page


def test_startup_cases_cover_every_op_dtype_and_indices():
    args = _args()
    assert startup.chosen_cases(_args("--startup")) == list(startup.DEFAULT_CASES)
    assert startup.chosen_cases(_args("--startup-all")) == list(startup.CASES)
    assert startup.chosen_cases(
        _args("--startup-case", "col2im-float16", "--startup-case", "col2im-float16")
    ) == ["col2im-float16"]
    assert not args.startup and not args.startup_all
    every = {(d, i) for d in ("float32", "float16", "float64", "int8", "uint8", "bfloat16")
             for i in (False, True)}
    for op in ("MaxPool", "MaxPool 2x2"):  # the separable kernel's pool, and the fused one's
        assert {(c.dtype, c.indices) for c in startup.ALL_CASES if c.op == op} == every
    assert {"maxunpool-float32", "col2im-float32"} <= set(startup.CASES)
    assert set(startup.DEFAULT_CASES) <= set(startup.CASES)


def test_startup_json_shape(monkeypatch):
    """The whole --startup section with the child processes replaced: what it reports."""
    commands = []

    def fake_child(target, key, threads, env):
        assert target == "poolfold.bench.startup:first_call" and threads == 2
        assert env["NUMBA_CACHE_DIR"]  # a fresh temporary cache for every first call
        row = {"first_s": 4.0, "first_cpu_s": 3.5, "second_s": 0.5, "second_cpu_s": 0.75,
               "compile_s": 3.5, "compile_cpu_s": 2.75}
        if key == "maxpool-int8-indices":  # a stand-in answered; the fast kernel came later
            row.update(background_s=6.25, switched_s=0.031)
        return row

    def fake_command(command, env=None, unset=()):
        commands.append((command, env))
        snippet = command[-1]
        wall = {startup.STARTUP_SNIPPET: 0.9, startup.NUMBA_FLOOR_SNIPPET: 0.85}.get(snippet, 0.2)
        if command[1:] == ["-m", "poolfold.cli", "run"]:
            wall = 20.0
        return {"wall_s": wall, "cpu_s": wall / 2, "stdout": ""}

    together = []

    def fake_together(commands, env=None):
        together.append((commands, env))
        return {"wall_s": 12.0 + len(commands), "cpu_s": 11.0 + 2 * len(commands)}

    monkeypatch.setattr(startup, "run_child", fake_child)
    monkeypatch.setattr(startup, "run_command", fake_command)
    monkeypatch.setattr(startup, "run_commands_together", fake_together)
    result = startup.measure(_args("--startup-case", "maxpool-int8-indices",
                                   "--startup-case", "col2im-float32"))
    json.dumps(result)  # every part can be written as JSON

    first = result["first_calls"]
    assert [r["key"] for r in first] == ["maxpool-int8-indices", "col2im-float32"]
    assert (first[0]["op"], first[0]["dtype"], first[0]["indices"]) == ("MaxPool", "int8", True)
    assert first[0]["target_s"] == 3.0 and first[1]["target_s"] == 2.0
    assert first[1]["first_cpu_s"] == 3.5
    cold = result["cold_start"]
    assert cold["wall_s"] == 0.9 and cold["numba_floor_s"] == 0.85 and cold["numpy_import_s"] == 0.2
    assert cold["rounds"] == startup.STARTUP_ROUNDS
    quick = result["quickstart"]
    assert quick == {"command": "poolfold run", "target_s": startup.QUICKSTART_TARGET_S,
                     "wall_s": 20.0, "cpu_s": 10.0}
    (run_env,) = [env for command, env in commands if command[-1] == "run"]
    assert run_env["NUMBA_CACHE_DIR"]  # the Quickstart runs with an empty cache

    text = startup.summary(result)
    assert "maxpool-int8-indices" in text and "4.00" in text and "<= 3: OVER" in text
    rows = {line.split()[0]: line.split() for line in text.splitlines() if line.strip()}
    assert rows["maxpool-int8-indices"][4:6] == ["6.25", "0.031"]
    assert rows["col2im-float32"][4:6] == ["-", "-"]  # nothing compiled in the background
    assert f"0.90 s wall, 0.45 s CPU (median of {startup.STARTUP_ROUNDS})" in text
    assert "+0.05 s beyond it (<= 0.1: ok)" in text
    assert "20.00 s wall, 10.00 s CPU (<= 15: OVER)" in text
    # one process alone, then TOGETHER_PROCESSES at once, each time with a cache of its own
    assert [len(commands) for commands, _ in together] == [1, startup.TOGETHER_PROCESSES]
    assert all(env["NUMBA_CACHE_DIR"] and env["POOLFOLD_BACKGROUND_COMPILE"] == "0"
               for _, env in together)
    assert together[0][1]["NUMBA_CACHE_DIR"] != together[1][1]["NUMBA_CACHE_DIR"]
    n = startup.TOGETHER_PROCESSES
    assert (result["together"]["together_wall_s"], result["together"]["alone_cpu_s"]) == (
        12.0 + n, 13.0)
    assert (f"{n} processes started together with an empty cache" in text
            and f"{12 + n:.1f} s wall, {11 + 2 * n:.1f} s CPU in all; one process alone: "
                "13.0 s wall, 13.0 s CPU" in text)


def test_commands_started_together_run_at_once_and_their_cpu_adds_up(tmp_path):
    """Each child waits until every one has started (so one at a time would fail), then
    burns 0.3 s of CPU; a failing command's last line of errors is reported."""
    from poolfold.bench.child import run_commands_together

    script = (
        "import os, sys, time\n"
        "folder, me, count = sys.argv[1], sys.argv[2], int(sys.argv[3])\n"
        "open(os.path.join(folder, me), 'w').close()\n"
        "deadline = time.monotonic() + 60\n"
        "while len(os.listdir(folder)) < count:\n"
        "    if time.monotonic() > deadline:\n"
        "        sys.exit('alone')\n"
        "    time.sleep(0.01)\n"
        "while time.process_time() < 0.3:\n"
        "    pass\n")
    commands = [[sys.executable, "-c", script, str(tmp_path), str(i), "3"] for i in range(3)]
    done = run_commands_together(commands)
    assert "error" not in done, done
    assert done["cpu_s"] >= 0.9 and done["wall_s"] > 0
    failed = run_commands_together([[sys.executable, "-c", "print('fine')"],
                                    [sys.executable, "-c", "raise SystemExit('broken here')"]])
    assert failed == {"error": "broken here"}


def test_first_call_is_measured_in_a_child_with_an_empty_cache():
    """One real child: MaxUnpool's kernels are the quickest to compile."""
    (row,) = startup.measure_first_calls(["maxunpool-float32"], threads=2)
    assert "error" not in row, row
    assert (row["op"], row["dtype"], row["indices"]) == ("MaxUnpool", "float32", False)
    assert row["first_s"] > 0 and row["first_cpu_s"] > 0 and row["second_s"] > 0
    assert row["compile_s"] == pytest.approx(row["first_s"] - row["second_s"])
    assert row["compile_cpu_s"] == pytest.approx(row["first_cpu_s"] - row["second_cpu_s"])


def test_the_bench_package_never_imports_the_command_line():
    code = ("import sys, poolfold.bench as b, poolfold.bench.startup, poolfold.bench.memory, "
            "poolfold.bench.report, poolfold.bench.runner; "
            "assert 'poolfold.cli' not in sys.modules, 'poolfold.cli imported'")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_the_text_report_says_when_the_machine_was_busier_than_its_cores():
    from poolfold.bench import _load_note

    meta = {"cpu_count": 2, "threads": 2}
    quiet = _load_note({**meta, "load_average_start": [0.5, 0.4, 0.3],
                        "load_average_end": [3.5, 1.0, 0.5]})  # the bench's own 2 threads
    busy = _load_note({**meta, "load_average_start": [9.9, 10.0, 8.0],
                       "load_average_end": [12.0, 11.1, 9.5]})
    assert "[0.5, 0.4, 0.3] at the start" in quiet and "busier" not in quiet
    assert "busier than its 2 CPUs" in busy


def test_averaging_matrix_tiny_fills_its_own_markdown_sections(tmp_path):
    """The whole averaging matrix on tiny inputs (--tiny): every case runs, the float16 and
    bfloat16 cases beside poolfold's float32, and --markdown fills the averaging table and
    the averaging row of the glance table only."""
    from poolfold.bench.averaging import CASES

    page = tmp_path / "page.md"
    maxpool_row = "| MaxPool matrix | 3 | **0.50** | 3 of 3 | 0.70 (a) | then |"
    page.write_text("<!-- bench:averaging -->\nPLACEHOLDER\n<!-- /bench:averaging -->\n"
                    f"<!-- bench:glance -->\n{maxpool_row}\n<!-- /bench:glance -->\n"
                    "<!-- bench:matrix -->\nMaxPool's\n<!-- /bench:matrix -->\n")
    done = _bench("--averaging-matrix", "--tiny", "--repeat", "1", "--json",
                  "--markdown", str(page))
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["tiny"] and report["pause_s"] == 0
    rows = {row["key"]: row for row in report["results"]}
    assert list(rows) == [case.key for case in CASES]
    for case in CASES:
        row = rows[case.key]
        assert row["ms"]["poolfold"] is not None and row["ms"]["stream"] is not None
        if case.dtype in ("float32", "float16"):  # onnxruntime has these kernels
            assert row["ms"]["onnxruntime"] is not None, (case.key, row["notes"])
            assert row["baseline"] in ("onnxruntime", "onnxruntime no-spin")
        else:
            assert row["ms"]["onnxruntime"] is None
        assert (row["ms"].get("poolfold float32") is not None) == (
            case.dtype in ("float16", "bfloat16")), case.key

    text = page.read_text()
    table = text.split("<!-- bench:averaging -->")[1].split("<!-- /bench:averaging -->")[0]
    glance = text.split("<!-- bench:glance -->\n")[1].split("\n<!-- /")[0].splitlines()
    assert "PLACEHOLDER" not in table
    assert "--tiny" in table and "| case |" in table and "/ pf f32" in table
    assert "own float32" in table and "within the target 1.3" in table
    for case in CASES:
        assert f"| {case.key} |" in table
    # the MaxPool row kept, the averaging row added after it, both under the header
    assert glance[0].startswith("| benchmark |") and glance[2] == maxpool_row
    averaging = [c.strip() for c in glance[3].strip("|").split("|")]
    ratios = sum(1 for row in report["results"] if row["ratio"])  # cases with a peer here
    assert averaging[:2] == ["averaging matrix", str(ratios)] and len(glance) == 4
    assert "--tiny" in averaging[-1] and "--averaging-matrix" in averaging[-1]
    assert "<!-- bench:matrix -->\nMaxPool's\n<!-- /bench:matrix -->" in text  # untouched


def _as_nchw_float64(output, channels_last: bool) -> np.ndarray:
    if type(output).__module__.startswith("torch"):  # numpy has no bfloat16 of torch's
        output = output.double().numpy()
    if isinstance(output, list):  # onnxruntime's outputs
        (output,) = output
    output = np.asarray(output).astype(np.float64)
    return np.moveaxis(output, -1, 1) if channels_last else output


def test_every_peer_of_the_averaging_matrix_computes_what_poolfold_does():
    """A ratio means something only if both sides compute the same thing: on the tiny
    inputs, every peer the averaging matrix times (onnxruntime, PyTorch, scipy, poolfold's
    float32 on the same values) gives poolfold's answer."""
    from poolfold.bench.averaging import CASES, workloads
    from poolfold.bench.peers import onnxruntime_runner

    tolerance = {"float32": 1e-5, "float64": 1e-12, "float16": 2e-3, "bfloat16": 1.6e-2}
    checked = 0
    for case, workload in zip(CASES, workloads(tiny=True)):
        feeds = workload.inputs()
        node_feeds = workload.node_feeds(feeds)
        expected = _as_nchw_float64(workload.poolfold(feeds), case.channels_last)
        peers = dict(workload.extras)
        if workload.node is not None and importlib.util.find_spec("onnxruntime"):
            peers["onnxruntime"] = lambda f, w=workload: onnxruntime_runner(w, f, 1, True)
        if workload.torch is not None and importlib.util.find_spec("torch"):
            peers["torch"] = workload.torch
        if workload.scipy is not None and importlib.util.find_spec("scipy"):
            peers["scipy"] = workload.scipy
        for name, build in peers.items():
            found = _as_nchw_float64(build(node_feeds)(),
                                     case.channels_last and name == "poolfold float32")
            tol = tolerance[case.dtype]
            np.testing.assert_allclose(found, expected, rtol=tol, atol=tol,
                                       err_msg=f"{case.key}: {name}")
            checked += 1
    assert checked >= len(CASES)


def test_glance_rows_replace_their_own_and_keep_the_others_in_order():
    """A run rewrites its own rows of the README's glance table, keeps the others, and the
    rows stay in the table's order whichever run came first."""
    meta = {"date": "2026-01-02", "processor": "x86_64", "cpu_count": 2}
    row = report.glance_row("averaging matrix", [(0.5, "a"), (2.0, "b"), (1.0, "c")], meta,
                            "poolfold bench --averaging-matrix")
    # geometric mean of 0.5, 2 and 1 is 1; two of three at or below 1.0; the worst is b
    assert row[:5] == ["averaging matrix", "3", "**1.00**", "2 of 3", "2.00 (b)"]
    assert "2026-01-02" in row[5] and "`poolfold bench --averaging-matrix`" in row[5]
    assert report.glance_row("MaxPool matrix", [], meta, "x") is None
    old = "\n".join(["| benchmark | old header |", "|---|---|",
                     "| models, `all` route | 6 | kept |",
                     "| averaging matrix | 1 | replaced |"])
    lines = report.merge_glance([row])(old).splitlines()
    assert lines[0] == "| " + " | ".join(report.GLANCE_HEADER) + " |"
    assert [line.split("|")[1].strip() for line in lines[2:]] == [
        "averaging matrix", "models, `all` route"]
    assert "replaced" not in lines[2] and lines[3] == "| models, `all` route | 6 | kept |"
    assert report.merge_glance([row])("").splitlines()[2:] == ["| " + " | ".join(row) + " |"]


def test_models_glance_rows_are_each_routes_ratios_over_the_models():
    from poolfold.bench import models

    def row(model, implementation, ms):
        return {"model": model, "implementation": implementation, "median_ms": ms,
                "block_ms": [], "prepare_s": None, "runs": 1, "note": ""}

    all_route, needed = list(models._GLANCE_ROUTES)
    result = [row("m1", "onnxruntime", 10.0), row("m1", all_route, 20.0),
              row("m1", needed, 5.0), row("m2", "onnxruntime", 4.0),
              row("m2", all_route, 2.0), row("m2", needed, None)]
    meta = {"date": "d", "processor": "p", "cpu_count": 2}
    rows = models.glance(result, meta, "poolfold bench --models")
    assert rows[0][:5] == ["models, `all` route", "2", "**1.00**", "1 of 2", "2.00 (m1)"]
    assert rows[1][:5] == ["models, `needed` route", "1", "**0.50**", "1 of 1", "0.50 (m1)"]


def test_the_machine_is_named_by_its_cpu_model_and_last_level_cache(monkeypatch):
    """Ratios move with the CPU (a window's input in one CPU's cache and not another's), so
    the tables name the model and the last-level cache Linux reports, and the architecture
    alone where those files cannot be read."""
    import io

    import poolfold.bench as bench

    files = {"/proc/cpuinfo": "processor\t: 0\nmodel name\t: Some CPU 9000\n",
             "/sys/devices/system/cpu/cpu0/cache/index0/size": "48K\n",
             "/sys/devices/system/cpu/cpu0/cache/index1/size": "32K\n",
             "/sys/devices/system/cpu/cpu0/cache/index2/size": "2048K\n",
             "/sys/devices/system/cpu/cpu0/cache/index3/size": "32768K\n"}

    def fake_open(path, *args, **kwargs):
        if path not in files:
            raise FileNotFoundError(path)
        return io.StringIO(files[path])

    monkeypatch.setattr(bench.platform, "processor", lambda: "x86_64")
    monkeypatch.setattr(bench, "open", fake_open, raising=False)
    assert bench._processor() == "Some CPU 9000 (x86_64), last-level cache 32 MiB"
    del files["/sys/devices/system/cpu/cpu0/cache/index3/size"]
    files["/sys/devices/system/cpu/cpu0/cache/index2/size"] = "1000K\n"
    assert bench._processor() == "Some CPU 9000 (x86_64), last-level cache 1000K"
    files.clear()
    assert bench._processor() == "x86_64"
