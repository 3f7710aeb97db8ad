"""Whole models through ``poolfold.backend`` against onnxruntime alone: ``poolfold bench --models``.

The bundled SegNet-style example (1, 3, 64, 64), which onnxruntime runs by itself;
``conv-pool4d-conv``, a Conv, a 4-D-spatial MaxPool on a rank-6 tensor (onnxruntime's MaxPool
stops at 3-D) and a Relu and Conv after it, which onnxruntime refuses; and, where torch is
installed (or the models were exported before), the zoo of :mod:`poolfold.bench.zoo`: resnet18,
googlenet, squeezenet1_0, vgg11 and an Unfold -> Fold model, exported into a cache folder.
Each implementation is timed in blocks of its own, a warm-up then ``repeat`` runs, the
implementations' blocks in turn for fifteen rounds (each round starting one implementation
further on), the median of its blocks' medians kept; its ``prepare`` (or session creation)
is timed once, before any implementation's session is kept.  A route's ratio to onnxruntime is the median over the rounds of its block's
time over onnxruntime's block of the same round: this host's speed drifts by tens of percent
within a minute, which a ratio of two medians taken over different minutes carries whole
(three rounds of one model's "needed" route, a single onnxruntime session like onnxruntime
alone, gave 1.46x).  Faster noise remains: two runs can still differ by tens of percent in
a model's ratio.  onnxruntime runs at its default
session options; ``poolfold.backend`` at its defaults (its other nodes on onnxruntime) with
``poolfold_nodes="all"`` (as one session, and cut into sessions: ``one_session=False``) and
``"needed"``, and, for the two small models unless
``reference=False``, with ``other_ops="reference"`` (every other node on onnx's
ReferenceEvaluator) for comparison.

>>> from poolfold.bench import models as backend_bench
>>> print(backend_bench.format_rows(backend_bench.run()))      # doctest: +SKIP
"""

from __future__ import annotations

import gc
import math
import time
from dataclasses import asdict, dataclass, field
from typing import Callable

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


@dataclass
class Row:
    model: str
    implementation: str
    median_ms: float | None  # None: the implementation cannot run the model
    runs: int
    note: str = ""
    prepare_s: float | None = None  # prepare(), or onnxruntime's session creation
    block_ms: list = field(default_factory=list)  # each round's block median, in order


def bundled_model() -> tuple[onnx.ModelProto, dict]:
    from ..models import path
    from ..models.segnet import INPUT_SHAPE

    image = np.random.default_rng(0).standard_normal(INPUT_SHAPE).astype(np.float32)
    return onnx.load(str(path())), {"image": image}


def pool4d_model() -> tuple[onnx.ModelProto, dict]:
    """Conv -> Reshape to rank 6 -> MaxPool over four spatial axes -> Reshape -> Relu -> Conv."""
    rng = np.random.default_rng(1)
    weights = [
        numpy_helper.from_array(rng.standard_normal((8, 4, 3, 3)).astype(np.float32) * 0.2, "w1"),
        numpy_helper.from_array(rng.standard_normal((4, 8, 3, 3)).astype(np.float32) * 0.2, "w2"),
        numpy_helper.from_array(np.array([1, 8, 4, 8, 4, 8], np.int64), "rank6"),
        numpy_helper.from_array(np.array([1, 8, 8, 8], np.int64), "rank4"),
    ]
    conv = dict(kernel_shape=[3, 3], pads=[1, 1, 1, 1])
    graph_nodes = [
        helper.make_node("Conv", ["x", "w1"], ["c1"], **conv),
        helper.make_node("Reshape", ["c1", "rank6"], ["c1_6d"]),
        helper.make_node("MaxPool", ["c1_6d"], ["p"], kernel_shape=[2, 2, 2, 2],
                         strides=[2, 2, 2, 2]),
        helper.make_node("Reshape", ["p", "rank4"], ["p_4d"]),
        helper.make_node("Relu", ["p_4d"], ["r"]),
        helper.make_node("Conv", ["r", "w2"], ["y"], **conv),
    ]
    graph = helper.make_graph(
        graph_nodes, "conv_pool4d_conv",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, (1, 4, 32, 32))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, (1, 4, 8, 8))], weights)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=8)
    x = rng.standard_normal((1, 4, 32, 32)).astype(np.float32)
    return model, {"x": x}


MODELS: dict[str, Callable[[], tuple[onnx.ModelProto | str, dict]]] = {
    "segnet (bundled)": bundled_model,
    "conv-pool4d-conv": pool4d_model,
}


def zoo_models() -> dict[str, Callable[[], tuple[str, dict]]]:
    """The zoo's models (a path and feeds each), where torch can export them or the cache
    holds them."""
    import importlib.util

    from . import zoo

    have_torch = importlib.util.find_spec("torch") is not None
    return {name: (lambda name=name: zoo.model(name)) for name in zoo.ARCHITECTURES
            if have_torch or (zoo.cache_folder() / f"{name}.onnx").exists()}


def _median_ms(run: Callable[[], object], warmup: int, repeat: int) -> float:
    for _ in range(warmup):
        run()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return float(np.median(times)) * 1e3


def _first_line(error: BaseException, limit: int = 100) -> str:
    text = (str(error).strip().splitlines() or [type(error).__name__])[0]
    return text if len(text) <= limit else text[: limit - 3] + "..."


# Rounds of one block per implementation: more, shorter blocks follow a drifting host
# closer than a few long ones (see the module's docstring).  A block of the bundled model's
# one onnxruntime session took 0.20 to 0.42 ms a run from one block to the next, so the
# median of 7 paired ratios of two identical sessions still strayed by a fifth: 15.
ROUNDS = 15
BLOCK_RUNS = 15


def run(repeat: int = BLOCK_RUNS, warmup: int = 5, reference: bool = True,
        zoo: bool = True, rounds: int = ROUNDS, block_s: float = 0.0) -> list[Row]:
    """Time every model of :data:`MODELS` and, with ``zoo``, of :func:`zoo_models` (see the
    module's docstring): ``rounds`` blocks of ``repeat`` runs per implementation, in turn,
    the median of the blocks' medians kept; rows in table order.  ``block_s``: more runs
    where a run is short, so that each block lasts that long (as the matrices' blocks)."""
    from .. import backend
    from .runner import MOST_ROUNDS

    models = dict(MODELS)
    if zoo:
        models.update(zoo_models())
    rows = []
    for name, build in models.items():
        model, feeds = build()
        source = model.SerializeToString() if isinstance(model, onnx.ModelProto) else model
        runners: list[tuple[str, Callable[[], Callable[[], object]], int]] = []
        try:
            import onnxruntime

            onnxruntime.set_default_logger_severity(4)  # its refusal is a row's note, not a log

            def session(source=source, feeds=feeds):
                s = onnxruntime.InferenceSession(source, providers=["CPUExecutionProvider"])
                return lambda: s.run(None, feeds)

            runners.append(("onnxruntime", session, repeat))
        except ImportError:
            pass
        default = "onnxruntime" if backend.onnxruntime_available() else "reference"

        def poolfold(model=model, feeds=feeds, **options):
            rep = backend.prepare(model, **options)
            return lambda: rep.run(feeds)

        runners.append((f"poolfold.backend (other ops: {default})", poolfold, repeat))
        if default == "onnxruntime":
            runners.append((CUT, lambda: poolfold(one_session=False), repeat))
            runners.append(("poolfold.backend (poolfold_nodes='needed')",
                            lambda: poolfold(poolfold_nodes="needed"), repeat))
        if reference and default != "reference" and name in MODELS:
            # The reference evaluator is about 100 times slower: fewer runs.
            runners.append(("poolfold.backend (other ops: reference)",
                            lambda: poolfold(other_ops="reference"), max(3, repeat // 5)))
        # Each prepare timed alone first, with no other implementation's session alive:
        # kept alive, vgg11's sessions made the later ones slower to prepare (its "needed"
        # route, one plain onnxruntime session: 0.71 s first, 1.87 s after three others).
        prepare_s = {}
        for implementation, prepare, _ in runners:
            try:
                start = time.perf_counter()
                prepare()
                prepare_s[implementation] = time.perf_counter() - start
            except Exception:  # noqa: BLE001 -- said again, with its reason, below
                pass
            gc.collect()
        ready = []
        for implementation, prepare, runs in runners:
            try:
                call = prepare()
                prepared = prepare_s.get(implementation)
                call()  # the first run compiles poolfold's kernels if they are not cached
                once = math.inf
                for _ in range(3):  # the runs just after the first can be slow ones
                    start = time.perf_counter()
                    call()
                    once = min(once, time.perf_counter() - start)
            except Exception as error:  # an implementation that refuses the model
                rows.append(Row(name, implementation, None, 0, f"cannot run it: "
                                                                f"{_first_line(error)}"))
                continue
            # a block of the bundled model's 15 runs lasted 3 ms, whose medians moved by
            # tens of percent from run to run (1.02 then 1.21 for its one-session route)
            runs = max(runs, min(MOST_ROUNDS // rounds, int(block_s / max(once, 1e-9))))
            ready.append((Row(name, implementation, None, runs * rounds, prepare_s=prepared),
                          call, runs))
        # Rounds of one block per implementation, in turn: a machine whose speed drifts
        # over the minutes a model takes moves every implementation's blocks alike.
        blocks: dict[int, list[float]] = {i: [] for i in range(len(ready))}
        # Each round starts one implementation further on, so that none always follows the
        # same one (the reference evaluator's blocks, say, or another model's last).
        for r in range(rounds):
            for k in range(len(ready)):
                i = (r + k) % len(ready)
                _, call, runs = ready[i]
                time.sleep(0.5)  # a pause between blocks: the last one's threads settle
                blocks[i].append(_median_ms(call, warmup, runs))
        for i, (row, _, _) in enumerate(ready):
            row.median_ms = float(np.median(blocks[i]))
            row.block_ms = [float(b) for b in blocks[i]]
            rows.append(row)
    return rows


def ratio(row: Row, base: Row | None) -> float | None:
    """``row``'s time over onnxruntime's (``base``): the median over the rounds of the ratio
    of their blocks in the same round (the ratio of the medians where the blocks are not
    paired); None where either did not run."""
    if row.median_ms is None or base is None or not base.median_ms:
        return None
    if row.block_ms and len(row.block_ms) == len(base.block_ms):
        return float(np.median([a / b for a, b in zip(row.block_ms, base.block_ms)]))
    return row.median_ms / base.median_ms


def format_rows(rows: list[Row]) -> str:
    """A table: model, implementation, median ms, and the ratio to onnxruntime alone."""
    baseline = {r.model: r for r in rows if r.implementation == "onnxruntime"}
    header = ["model", "implementation", "median ms", "vs onnxruntime", "prepare s", "runs"]
    lines = []
    for row in rows:
        times = ratio(row, baseline.get(row.model))
        lines.append([row.model, row.implementation,
                      "-" if row.median_ms is None else f"{row.median_ms:.3f}",
                      "-" if times is None else f"{times:.2f}x",
                      "-" if row.prepare_s is None else f"{row.prepare_s:.2f}", str(row.runs)])
    widths = [max(len(h), *(len(line[i]) for line in lines)) for i, h in enumerate(header)]
    text = ["  ".join(h.ljust(w) for h, w in zip(header, widths)),
            "  ".join("-" * w for w in widths)]
    text += ["  ".join(c.ljust(w) for c, w in zip(line, widths)) for line in lines]
    notes = [f"{r.model}, {r.implementation}: {r.note}" for r in rows if r.note]
    return "\n".join(text + notes)


# The "all" route cut into one session per stretch (the route before poolfold's nodes ran
# inside one session; still taken where the one session cannot be had)
CUT = "poolfold.backend (one_session=False)"

# Short column headings for the markdown table; the text table keeps the full names.
_HEADINGS = {
    "poolfold.backend (other ops: onnxruntime)": "poolfold `all`",
    CUT: "poolfold `all`, cut into sessions",
    "poolfold.backend (poolfold_nodes='needed')": "poolfold `needed`",
    "poolfold.backend (other ops: reference)": "poolfold, other ops on reference",
}


def markdown(result: list[dict], meta: dict, command: str) -> str:
    """The models table for a README: one line per model, onnxruntime's time and each
    poolfold route's time and ratio to it, the prepare times; then where and when measured."""
    from .report import load_text, machine_text, versions_text

    rows = [Row(**row) for row in result]
    implementations = list(dict.fromkeys(r.implementation for r in rows))
    by_cell = {(r.model, r.implementation): r for r in rows}
    header = (["model"] + [f"{_HEADINGS.get(i, i)} ms" for i in implementations]
              + ["prepare s"])
    lines = ["| " + " | ".join(header) + " |",
             "|" + "|".join(["---"] + ["---:"] * (len(header) - 1)) + "|"]
    notes = []
    for model in dict.fromkeys(r.model for r in rows):
        base = by_cell.get((model, "onnxruntime"))
        cells, prepares = [model], []
        for implementation in implementations:
            row = by_cell.get((model, implementation))
            if row is None:  # not run on this model
                cells.append("")
                prepares.append("-")
                continue
            if row.median_ms is None:
                cells.append("cannot run it")
                prepares.append("-")
                notes.append(f"{model}, {implementation}: {row.note}")
                continue
            cell = f"{row.median_ms:.3g}"
            times = ratio(row, base)
            if implementation != "onnxruntime" and times is not None:
                cell += f" (**{times:.2f}x**)"
            cells.append(cell)
            prepares.append("-" if row.prepare_s is None else f"{row.prepare_s:.2f}")
        lines.append("| " + " | ".join(cells + [" / ".join(prepares)]) + " |")
    lines += [""] + [f"- {note}" for note in notes] + ([""] if notes else []) + [
        f"`{command}` on {meta['date']}: {machine_text(meta)}; {versions_text(meta)}. "
        "Each implementation prepared and timed alone, no other one's session alive "
        "(`prepare s`: onnxruntime's session creation, then each poolfold route's `prepare`, "
        "in the columns' order), then prepared again and run once; then "
        f"{ROUNDS} "
        "rounds of one block each, in turn (each round starting one implementation further "
        f"on), each block at least 15 runs and {meta.get('block_ms', 0):g} ms after a warm-up "
        "and a pause; the median of the "
        "blocks' medians, in milliseconds; in brackets, the median over the rounds of the "
        "block's time over onnxruntime's block of the same round. "
        f"{load_text(meta)}"]
    return "\n".join(lines)


def measure(args) -> list[dict]:
    """``poolfold bench --models``: :func:`run` with at least :data:`BLOCK_RUNS` runs a
    block, and blocks of at least ``--block-ms``."""
    return [asdict(row) for row in run(max(args.repeat, BLOCK_RUNS),
                                       block_s=args.block_ms / 1e3)]


def summary(result: list[dict]) -> str:
    return format_rows([Row(**row) for row in result])


# The models bench's rows of the README's glance table: a route each, over the models
_GLANCE_ROUTES = {
    "poolfold.backend (other ops: onnxruntime)": "models, `all` route",
    "poolfold.backend (poolfold_nodes='needed')": "models, `needed` route",
}


def glance(result: list[dict], meta: dict, command: str) -> list[list[str] | None]:
    """Each route's row of the glance table (:func:`poolfold.bench.report.glance_row`): its
    ratios to onnxruntime alone over the models that both ran."""
    from .report import glance_row

    rows = [Row(**row) for row in result]
    baseline = {r.model: r for r in rows if r.implementation == "onnxruntime"}
    glances = []
    for implementation, benchmark in _GLANCE_ROUTES.items():
        ratios = [(times, r.model) for r in rows if r.implementation == implementation
                  for times in [ratio(r, baseline.get(r.model))] if times is not None]
        glances.append(glance_row(benchmark, ratios, meta, command))
    return glances
