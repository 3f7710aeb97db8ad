"""``poolfold bench``: poolfold against onnxruntime (and PyTorch and onnx's reference
evaluator when they are installed), plus optional sections measured in child processes.

Layout (nothing here imports :mod:`poolfold.cli`; the command imports this package):

- :mod:`.workloads`  the table of workloads and the names of the implementations
- :mod:`.matrix`, :mod:`.averaging`  the shape matrices (MaxPool; AveragePool, LpPool and
  the global pools), each a table of cases built into workloads
- :mod:`.peers`      the other implementations, each built into a runner outside the clock
- :mod:`.runner`     timing: every implementation in its own blocks of calls (fairness)
- :mod:`.report`     the timing table, the plot, the table helper the sections use
- :mod:`.child`      running a ``module:function`` in a fresh child process
- :mod:`.memory`     the ``--memory`` section; :mod:`.startup` the ``--startup`` section
- :mod:`.flatness`   the ``--flatness`` section: time against window length, stride 1

Adding a benchmark is a module plus a flag: a module with ``measure(args) -> dict`` (or list;
anything JSON can hold; it may draw its own bar with :func:`poolfold.console.progress`) and
``summary(result) -> str``, and one :class:`Section` line in :data:`SECTIONS`, as the
``models`` (:mod:`poolfold.bench.models`) and ``dask`` (:mod:`poolfold.bench.dask`) lines.
The flag (``--dask``) runs it after the timing table (``--no-timing`` skips that); its
result goes into the JSON under the section's name.  ``args`` holds every option of the
command, ``args.workloads`` the chosen workload keys.  The module is imported only when its
flag is given, so it may import its own dependencies (dask, onnxruntime) at its top.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import platform
import sys
import time
from dataclasses import asdict, dataclass

DESCRIPTION = """\
Benchmarks: poolfold against onnxruntime (and PyTorch and onnx's reference evaluator when
they are installed), on the same data, in one process, every implementation with the same
number of threads (--threads) and otherwise at its defaults.

How it is kept fair: each implementation is warmed up, then timed in its own blocks of
consecutive calls, as it would run in a loop of its own: before each block a short pause,
in which the idle threads of whatever ran before go to sleep, and one untimed call, which
wakes its own threads.  A block holds at least --repeat / 3 calls and lasts at least
--block-ms (more calls where a call is short, the same floor for everyone).  The blocks of
the implementations take turns over three passes in a rotating order, so that a noisy
stretch of a shared machine does not fall on one of them.
onnxruntime runs at its default session options (its idle threads spin after a run) and
again with spinning off (session.intra_op.allow_spinning=0); poolfold's ratio is taken to
the faster of the two.  Reported: the median of every timed call and the interquartile
spread, poolfold's time over onnxruntime's and over the memory-speed limit (a kernel that
reads X once and writes Y once on poolfold's threads, timed the same way).

--matrix and --averaging-matrix time shape matrices instead of the standard workloads:
MaxPool's, and AveragePool's, LpPool's and the global pools' (with each float16 and bfloat16
case over poolfold's own float32 on the same values); --tiny runs a matrix on tiny inputs, a
check that every case runs.

--memory and --startup add measurements made in child processes: the peak memory a call
allocates beyond its outputs; the first-ever call of each op and dtype with an empty numba
cache (--startup: float32 only; --startup-all: every op, dtype and Indices), the cold start
of a fresh process once the kernels are cached, beside numba's own start-up, the
Quickstart's `poolfold run` with an empty cache, and three processes making the same first
calls at once with an empty cache, beside one alone."""


@dataclass(frozen=True)
class Section:
    """An optional benchmark run by the flag ``--NAME`` (``name`` a Python identifier):
    ``measure`` and ``summary`` of ``module`` (see this package's docstring)."""

    name: str
    module: str
    help: str
    # the module has ``markdown(result, meta, command) -> str`` and ``glance(result, meta,
    # command)``, its rows of the glance table; its markers are ``bench:NAME``, or
    # ``bench:`` + its ``section_name(result)`` where it has one
    markdown: bool = False


@dataclass(frozen=True)
class Matrix:
    """A shape matrix, timed instead of the standard workloads by the flag ``--OPTION``:
    ``workloads(tiny)`` of ``module``; ``--markdown`` fills the section ``bench:NAME`` with
    its table, and its row of the glance table (``bench:glance``)."""

    option: str
    module: str
    name: str
    glance: str  # its row's name in the glance table
    help: str


MATRICES: tuple[Matrix, ...] = (
    Matrix("matrix", "poolfold.bench.matrix", "matrix", "MaxPool matrix",
           "time the MaxPool shape matrix (ranks 1-3, windows 2-256, strides, pads, dilations, "
           "ceil_mode, every type, both layouts, batch 1 and large) instead of the standard "
           "workloads"),
    Matrix("averaging-matrix", "poolfold.bench.averaging", "averaging", "averaging matrix",
           "time the averaging matrix (AveragePool ranks 1-3, windows 2-31, strides, pads, "
           "count_include_pad, ceil_mode, dilations, float32/16, bfloat16, float64, both "
           "layouts, batch 1 and large; LpPool p=1,2,3; the global pools) instead of the "
           "standard workloads"),
)


SECTIONS: tuple[Section, ...] = (
    Section("memory", "poolfold.bench.memory",
            "also measure poolfold's peak memory beyond its outputs (child processes)"),
    Section("startup", "poolfold.bench.startup",
            "also measure start-up: first calls with an empty numba cache (float32 ops), "
            "the warm-cache cold start, the Quickstart's `poolfold run` and processes "
            "starting together with an empty cache (minutes)"),
    Section("models", "poolfold.bench.models",
            "also time whole models through poolfold.backend against onnxruntime alone "
            "(--markdown writes its table between <!-- bench:models --> markers)",
            markdown=True),
    Section("flatness", "poolfold.bench.flatness",
            "also time stride-1 MaxPool and AveragePool windows of 3 to 63 taps an axis on "
            "one 1-D, 2-D and 3-D input each: how the time grows with the window "
            "(--markdown writes its table between <!-- bench:flatness --> markers)",
            markdown=True),
    Section("dask", "poolfold.bench.dask",
            "also time poolfold.dask: in-memory comparison and an out-of-core zarr run "
            "(needs poolfold[dask]; the default out-of-core volume is 32 GiB on disk; "
            "--markdown writes its figures between <!-- bench:dask-OP --> markers)",
            markdown=True),
)


def _positive(text: str) -> int:
    import argparse

    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text!r}")
    return value


def _not_negative(text: str) -> float:
    import argparse

    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value >= 0:  # NaN too
        raise argparse.ArgumentTypeError(f"must be a number, 0 or more, got {text!r}")
    return value


def add_arguments(parser) -> None:
    from . import runner
    from .startup import CASES
    from .workloads import BY_KEY

    parser.add_argument("workloads", nargs="*", metavar="WORKLOAD",
                        help=f"which workloads (default all): {', '.join(BY_KEY)}; or, with "
                             "--matrix or --averaging-matrix, which of its cases")
    matrices = parser.add_mutually_exclusive_group()
    for matrix in MATRICES:
        matrices.add_argument(f"--{matrix.option}", action="store_true", help=matrix.help)
    parser.add_argument("--tiny", action="store_true",
                        help="with a matrix: every case on a tiny input (batch 1, at most 3 "
                             "channels, a few windows per axis), without the pauses: checks "
                             "that every case and peer runs; the times mean nothing")
    parser.add_argument("--repeat", type=_positive, default=15, metavar="N",
                        help="timed rounds per implementation at least (default 15)")
    parser.add_argument("--block-ms", type=_not_negative, default=runner.BLOCK_FLOOR_S * 1e3,
                        metavar="MS",
                        help="with more rounds where --repeat calls would take less, each "
                             "implementation's block of timed calls lasts MS at least, up to "
                             f"{runner.MOST_ROUNDS} rounds (default "
                             f"{runner.BLOCK_FLOOR_S * 1e3:g}; 0: --repeat rounds exactly)")
    parser.add_argument("--threads", type=_positive, default=2, metavar="T",
                        help="threads for every implementation (default 2)")
    parser.add_argument("--settle", type=float, default=60.0, metavar="S",
                        help="seconds to pause before the load average is read at the end, "
                             "so that the bench's own threads count little (default 60)")
    parser.add_argument("--json", action="store_true",
                        help="print the results as JSON instead of tables")
    parser.add_argument("--markdown", metavar="FILE.md", action="append", default=[],
                        help="also write the timing table as markdown into FILE.md, between "
                             "the markers <!-- bench:matrix --> and <!-- /bench:matrix --> "
                             "(bench:averaging with --averaging-matrix, bench:workloads "
                             "without a matrix), with the date, machine, versions and load "
                             "average; with --models, its table between <!-- bench:models --> "
                             "markers; and the matrix's or the models' rows of the one-table "
                             "summary between <!-- bench:glance --> markers, where the file "
                             "has them (repeatable: docs/benchmarks.md and README.md)")
    parser.add_argument("--plot", metavar="FILE.png",
                        help="also draw the ratios to onnxruntime as a bar chart (needs matplotlib)")
    parser.add_argument("--no-timing", dest="timing", action="store_false",
                        help="skip the timing table: only the sections asked for")
    for section in SECTIONS:
        parser.add_argument(f"--{section.name}", action="store_true", help=section.help)
    parser.add_argument("--startup-all", action="store_true",
                        help="--startup with the first call of every op, dtype and Indices "
                             "(many minutes)")
    parser.add_argument("--startup-case", action="append", default=[], choices=list(CASES),
                        metavar="CASE",
                        help=f"--startup with these first calls only (repeatable): {', '.join(CASES)}")
    from .dask import add_dask_arguments  # imports no dask (poolfold.dask would)

    add_dask_arguments(parser)
    parser.set_defaults(handler=command)


def _meta(args, numba_threads: int) -> dict:
    import numba
    import numpy as np

    import poolfold

    versions = {"python": platform.python_version(), "poolfold": poolfold.__version__,
                "numpy": np.__version__, "numba": numba.__version__}
    for name in ("onnxruntime", "onnx", "torch"):
        if importlib.util.find_spec(name) is not None:
            versions[name] = __import__(name).__version__
    return {"threads": args.threads, "numba_threads": numba_threads, "cpu_count": os.cpu_count(),
            "platform": platform.platform(), "processor": _processor(),
            "repeat": args.repeat, "versions": versions}


def _processor() -> str:
    """The CPU's model and last-level cache where Linux says them, else the architecture:
    the same two cores give other ratios on another CPU (a 3-wide window's input that fits
    one CPU's cache and not another's), so a table says which it was measured on."""
    machine = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as info:
            model = next((line.split(":", 1)[1].strip() for line in info
                          if line.startswith("model name")), "")
    except OSError:
        return machine
    caches = []
    for index in range(4):
        try:
            with open(f"/sys/devices/system/cpu/cpu0/cache/index{index}/size",
                      encoding="utf-8") as size:
                caches.append(size.read().strip())
        except OSError:
            break
    described = f"{model} ({machine})" if model else machine
    if not caches:
        return described
    last = caches[-1]  # Linux writes "32768K"
    if last.endswith("K") and last[:-1].isdigit() and int(last[:-1]) % 1024 == 0:
        last = f"{int(last[:-1]) // 1024} MiB"
    return f"{described}, last-level cache {last}"


def _load_average() -> list[float] | None:
    """The 1, 5 and 15 minute load averages: how busy the (shared) machine was."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:  # not available on this platform
        return None


def _load_note(meta: dict) -> str:
    start, end = meta["load_average_start"], meta["load_average_end"]
    if start is None:
        return "load average: not available on this platform"
    note = f"load average (1, 5, 15 min): {start} at the start, {end} at the end"
    cpus = meta["cpu_count"] or 1
    # At the end the bench's own threads count in the load; at the start they do not.
    if start[0] > cpus or end[0] - meta["threads"] > cpus:
        note += (f"\nthe machine was busier than its {meta['cpu_count']} CPUs: these figures say "
                 "more about the machine than about the implementations")
    return note


def _error(message: str) -> int:
    print(f"poolfold bench: error: {message}", file=sys.stderr)
    return 2


def command(args) -> int:
    from ..console import progress
    from . import report, runner
    from .peers import set_threads
    from .workloads import BY_KEY as WORKLOAD_BY_KEY

    matrix = next((m for m in MATRICES if getattr(args, m.option.replace("-", "_"))), None)
    if args.tiny and matrix is None:
        return _error("--tiny shrinks a matrix's cases: add --matrix or --averaging-matrix")
    by_key = WORKLOAD_BY_KEY
    if matrix is not None:
        by_key = {w.key: w for w in importlib.import_module(matrix.module).workloads(args.tiny)}
    keys = list(dict.fromkeys(args.workloads)) or list(by_key)
    unknown = [k for k in keys if k not in by_key]
    if unknown:
        return _error(f"unknown workload {', '.join(unknown)} (known: {', '.join(by_key)})")
    # Checked before the run, not after minutes of it.
    if args.settle < 0:
        return _error("--settle must be a number of seconds, 0 or more")
    if args.plot and not args.timing:
        return _error("--plot shows the timing table: drop --no-timing")
    if args.markdown and not args.timing and not any(
            s.markdown for s in SECTIONS if getattr(args, s.name)):
        return _error("--markdown writes the timing table or the --models table: drop "
                      "--no-timing or add --models")
    if args.plot and importlib.util.find_spec("matplotlib") is None:
        return _error('--plot needs matplotlib: pip install "poolfold[plot]"')
    if matrix is not None and any(getattr(args, s.name) for s in SECTIONS):
        return _error(f"--{matrix.option} times its shape matrix only: run the other sections "
                      "without it")
    args.workloads = keys
    args.startup = args.startup or args.startup_all or bool(args.startup_case)
    sections = [s for s in SECTIONS if getattr(args, s.name)]
    if not args.timing and not sections:
        return _error("--no-timing leaves nothing to run: add a section such as --memory")
    numba_threads = set_threads(args.threads)
    meta = {**_meta(args, numba_threads), "tiny": args.tiny,
            "pause_s": 0.0 if args.tiny else runner.PAUSE_S, "block_ms": args.block_ms,
            "settle_s": 0.0 if args.tiny else args.settle,
            "load_average_start": _load_average()}

    results = []
    if args.timing:
        steps = runner.steps(args.repeat)
        total = len(keys) * steps
        for i, key in enumerate(keys):
            results.append(asdict(runner.run_workload(
                by_key[key], args.repeat, args.threads,
                lambda s, base=i * steps, key=key: progress(base + s, total, f"timing {key}"),
                pause_s=meta["pause_s"], block_s=meta["block_ms"] / 1e3)))
        progress(total, total)  # clears the bar
    modules = {s.name: importlib.import_module(s.module) for s in sections}
    measured = {name: module.measure(args) for name, module in modules.items()}
    if meta["settle_s"]:
        # The bench's own threads, busy for minutes, hold the 1-minute load average near the
        # thread count: read after a pause, it says whether anything else was running.
        time.sleep(args.settle)
    meta["load_average_end"] = _load_average()

    if args.json:
        print(json.dumps({**meta, "results": results, **measured}, indent=2))
    else:
        texts = [report.format_results(results, meta)] if args.timing else []
        texts += [modules[name].summary(result) for name, result in measured.items()]
        texts.append(_load_note(meta))
        print("\n\n".join(texts))
    if args.markdown:
        meta["date"] = time.strftime("%Y-%m-%d")
        command_line = "poolfold bench " + " ".join(sys.argv[2:] if sys.argv[1:2] == ["bench"]
                                                     else sys.argv[1:])
        command_line = command_line.strip()
        blocks, glance = {}, []
        if args.timing:
            blocks[matrix.name if matrix is not None else "workloads"] = \
                report.markdown_table(results, meta, command_line)
            if matrix is not None:
                glance.append(report.glance_row(
                    matrix.glance, [(r["ratio"], r["key"]) for r in results if r["ratio"]],
                    meta, command_line))
        for section in sections:
            if section.markdown:
                module, result = modules[section.name], measured[section.name]
                name = getattr(module, "section_name", lambda _: section.name)(result)
                blocks[name] = module.markdown(result, meta, command_line)
                glance += modules[section.name].glance(measured[section.name], meta,
                                                       command_line)
        if any(glance):
            blocks[report.GLANCE] = report.merge_glance([row for row in glance if row])
        for path in args.markdown:
            report.fill_marked_sections(path, blocks)
            print(f"poolfold bench: wrote the figures into {path}", file=sys.stderr)
    if args.plot:
        report.plot(results, args.plot)
        print(f"poolfold bench: wrote {args.plot}", file=sys.stderr)
    return 0


def main(argv=None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m poolfold.bench", description=DESCRIPTION,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser)
    return command(parser.parse_args(argv))
