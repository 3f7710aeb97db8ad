"""What the benchmark prints: the timing table, the memory and start-up reports, the plot."""

from __future__ import annotations

import importlib.util
import math

from .runner import MOST_ROUNDS, PAUSE_S, SETTLE_CALLS, passes
from .workloads import (COLUMNS, FLOAT32, FLOAT32_TARGET, ONNXRUNTIME, ONNXRUNTIME_NO_SPIN,
                        POOLFOLD, REFERENCE, STREAM)

TINY_NOTE = ("--tiny: every case on a tiny input, without the pauses, to check that the bench "
             "runs; these times are not figures.")


def table(header: list[str], rows: list[list[str]]) -> str:
    """Left-aligned first column, right-aligned numbers."""
    widths = [max(len(r[i]) for r in [header] + rows) for i in range(len(header))]
    fmt = lambda r: "  ".join(  # noqa: E731
        c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths)))
    return "\n".join(fmt(r).rstrip() for r in [header, ["-" * w for w in widths]] + rows)


def _cell(result: dict, name: str) -> str:
    """A median, and half its interquartile range as a share of it."""
    ms = result["ms"].get(name)
    if ms is None:
        return "-"
    q1, q3 = result["spread_ms"][name]
    return f"{ms:.2f} ±{50 * (q3 - q1) / ms:.0f}%"


def over_float32(result: dict) -> float | None:
    """A float16 or bfloat16 case's poolfold time over poolfold's float32 call on the same
    values, where that call is timed beside it (and is not already its baseline)."""
    ms = result["ms"]
    if result["baseline"] == FLOAT32 or not ms.get(FLOAT32) or ms.get(POOLFOLD) is None:
        return None
    return ms[POOLFOLD] / ms[FLOAT32]


def _over_float32_line(results: list[dict]) -> str | None:
    """The worst of :func:`over_float32` against its target, or None where none was timed."""
    pairs = sorted((over_float32(r), r["key"]) for r in results if over_float32(r) is not None)
    if not pairs:
        return None
    within = sum(x <= FLOAT32_TARGET for x, _ in pairs)
    return (f"The float16 and bfloat16 cases over poolfold's own float32 on the same values: "
            f"worst {pairs[-1][0]:.2f} ({pairs[-1][1]}), best {pairs[0][0]:.2f} ({pairs[0][1]}); "
            f"{within} of {len(pairs)} within the target {FLOAT32_TARGET:g}.")


def format_results(results: list[dict], meta: dict) -> str:
    """The timing table of ``results`` (:class:`~.runner.Result` as dicts)."""
    columns = [c for c in COLUMNS if any(r["ms"].get(c) is not None for r in results)]
    own = any(over_float32(r) is not None for r in results)
    rows = []
    for r in results:
        ratio = "-" if r["ratio"] is None else f"{r['ratio']:.2f}"
        if r["ratio"] is not None and r["baseline"] not in (ONNXRUNTIME, ONNXRUNTIME_NO_SPIN):
            ratio += f" ({COLUMNS[r['baseline']]})"
        rows.append([r["key"]] + [_cell(r, c) for c in columns]
                    + [ratio, f"{r['stream_multiple']:.2f}"]
                    + ([_ratio(over_float32(r))] if own else []))
    lines = [
        f"poolfold bench: median ms ±half the interquartile range, {_rounds_text(meta)} per "
        f"implementation in {passes(meta['repeat'])} blocks, {meta['threads']} threads "
        f"({meta['cpu_count']} CPUs), {meta['platform']}",
        "",
        table(["workload"] + [COLUMNS[c] for c in columns] + ["pf/ort", "pf/stream"]
              + (["pf/f32"] if own else []), rows),
        "",
        f"Each implementation at its defaults, timed in its own blocks of calls, each block "
        f"after a {meta.get('pause_s', PAUSE_S):g} s pause and {SETTLE_CALLS} untimed call.",
        f"{COLUMNS[ONNXRUNTIME]}: onnxruntime at its default session options (idle threads spin); "
        f"{COLUMNS[ONNXRUNTIME_NO_SPIN]}: with session.intra_op.allow_spinning=0.",
        "pf/ort: poolfold / the faster of the two; where onnxruntime has no kernel, / the peer "
        "named in brackets (the fastest other peer, or poolfold float32 on the same values).",
        "pf/stream: poolfold / stream, a kernel that reads X once and writes Y once on "
        "poolfold's threads: the memory-speed limit of the call.",
    ]
    if own:
        lines.append(f"pf/f32: a float16 or bfloat16 case's poolfold time over poolfold's "
                     f"float32 call on the same values (column {COLUMNS[FLOAT32]}); target "
                     f"{FLOAT32_TARGET:g}. {_over_float32_line(results)}")
    if REFERENCE in columns:
        lines.append(f"{COLUMNS[REFERENCE]}: onnx's ReferenceEvaluator on the N=1 slice, time "
                     "multiplied by N (extrapolated).")
    if importlib.util.find_spec("torch") is None:
        lines.append("torch: not installed.")
    if meta["numba_threads"] < meta["threads"]:
        lines.append(f"numba's pool has {meta['numba_threads']} threads: poolfold ran with "
                     f"{meta['numba_threads']} (raise NUMBA_NUM_THREADS to go further).")
    if meta.get("tiny"):
        lines.append(TINY_NOTE)
    lines.append("")
    lines += [f"{r['key']}: {r['title']}" for r in results]
    notes = [f"  {r['key']}: {n}" for r in results for n in r["notes"]]
    if notes:
        lines += ["", "notes:"] + notes
    return "\n".join(lines)


def _ratio(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


def plot(results: list[dict], path: str) -> None:
    """Bars of each implementation's time over the workload's baseline (log scale)."""
    import matplotlib

    matplotlib.use("Agg")  # files only: no display needed
    import matplotlib.pyplot as plt

    shown = [r for r in results if r["ms"].get(r["baseline"])]
    names = [c for c in COLUMNS if c != STREAM
             and any(r["ms"].get(c) is not None and c != r["baseline"] for r in shown)]
    figure, axes = plt.subplots(figsize=(max(6.0, 1.2 * len(shown) + 2), 4.5))
    width = 0.8 / max(len(names), 1)
    for i, name in enumerate(names):
        xs, ys = [], []
        for j, r in enumerate(shown):
            if r["ms"].get(name) is not None and name != r["baseline"]:
                xs.append(j + (i - (len(names) - 1) / 2) * width)
                ys.append(r["ms"][name] / r["ms"][r["baseline"]])
        # Bars grow from 1 (as fast as the baseline), down for faster, up for slower.
        bars = axes.bar(xs, [y - 1 for y in ys], width, bottom=1, label=name)
        axes.bar_label(bars, labels=[f"{y:.2g}" for y in ys], fontsize=7)
    axes.axhline(1.0, color="black", linewidth=0.8)
    axes.set_yscale("log")
    axes.set_ylabel("time / the faster onnxruntime setting (log scale)")
    axes.set_xticks(range(len(shown)))
    axes.set_xticklabels(
        [r["key"] + ("" if r["baseline"] in (ONNXRUNTIME, ONNXRUNTIME_NO_SPIN)
                     else f"\n(/ {COLUMNS[r['baseline']]})") for r in shown], rotation=30, ha="right", fontsize=8)
    axes.legend(fontsize=8)
    axes.set_title("poolfold bench: lower is faster")
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def _rounds_text(meta: dict) -> str:
    """How many rounds each implementation had: --repeat, or more for short calls."""
    block_ms = meta.get("block_ms", 0)
    if not block_ms or meta.get("tiny"):
        return f"{meta['repeat']} rounds"
    return (f"at least {meta['repeat']} rounds (blocks of at least {block_ms:g} ms, up to "
            f"{MOST_ROUNDS} rounds)")


def machine_text(meta: dict) -> str:
    return f"{meta['processor']}, {meta['cpu_count']} CPUs"


def versions_text(meta: dict) -> str:
    return ", ".join(f"{k} {v}" for k, v in meta["versions"].items())


def load_text(meta: dict) -> str:
    """The load averages at both ends of a run, as a sentence: how quiet the machine was."""
    return (f"Load average (1, 5, 15 min) {meta['load_average_start']} at the start, "
            f"{meta['load_average_end']} at the end (read after a pause of "
            f"{meta.get('settle_s', 0):g} s, so that the bench's own threads count little).")


def markdown_table(results: list[dict], meta: dict, command: str) -> str:
    """The timing table as markdown, with what a reader needs to rerun it and judge it: the
    command, the date, the machine, the versions and the load average at both ends."""
    columns = [c for c in COLUMNS if any(r["ms"].get(c) is not None for r in results)]
    own = any(over_float32(r) is not None for r in results)
    header = (["case"] + [COLUMNS[c] + " ms" for c in columns] + ["poolfold / peer", "/ stream"]
              + (["/ pf f32"] if own else []))
    lines = [f"**{TINY_NOTE}**", ""] if meta.get("tiny") else []
    lines += ["| " + " | ".join(header) + " |",
              "|" + "|".join(["---"] + ["---:"] * (len(header) - 1)) + "|"]
    for r in results:
        cells = [f"{r['ms'][c]:.3g}" if r["ms"].get(c) is not None else "-" for c in columns]
        ratio = "-" if r["ratio"] is None else f"**{r['ratio']:.2f}**"
        if r["ratio"] is not None and r["baseline"] not in (ONNXRUNTIME, ONNXRUNTIME_NO_SPIN):
            ratio += f" ({COLUMNS[r['baseline']]})"
        lines.append("| " + " | ".join([r["key"]] + cells + [ratio, f"{r['stream_multiple']:.2f}"]
                                       + ([_ratio(over_float32(r))] if own else [])) + " |")
    ratios = [r["ratio"] for r in results if r["ratio"]]
    if ratios:
        geometric = math.exp(sum(math.log(x) for x in ratios) / len(ratios))
        lines += ["", f"Geometric mean of poolfold / peer over {len(ratios)} cases: "
                      f"**{geometric:.2f}**; worst {max(ratios):.2f}, best {min(ratios):.2f}."]
    if own:
        lines += ["", _over_float32_line(results)]
    lines += [
        "",
        f"`{command}` on {meta['date']}: {machine_text(meta)}, "
        f"{meta['threads']} threads for every implementation; {versions_text(meta)}. Median of "
        f"{_rounds_text(meta)} per implementation, each timed in its own blocks after a "
        f"pause. {load_text(meta)}",
        "",
        "Peers: onnxruntime at its default session options and with "
        "`session.intra_op.allow_spinning=0`, the faster of the two; where onnxruntime has no "
        "kernel, the fastest other peer (in brackets). `/ stream`: poolfold's time over a "
        "kernel that reads X once and writes Y once."
        + (" `/ pf f32`: a float16 or bfloat16 case's time over poolfold's float32 call on the "
           "same values." if own else ""),
    ]
    return "\n".join(lines)


# The README's one table of figures (``<!-- bench:glance -->``): a row per shape matrix and per
# route of the models bench, each rewritten by the run that measures it, the others kept.
GLANCE = "glance"
GLANCE_HEADER = ["benchmark", "cases", "geometric mean", "at or below 1.0", "worst", "measured"]
GLANCE_ORDER = ("MaxPool matrix", "averaging matrix", "models, `all` route",
                "models, `needed` route")


def glance_row(benchmark: str, ratios: list[tuple[float, str]], meta: dict,
               command: str) -> list[str] | None:
    """A row of the glance table: the spread of poolfold's ratios to its peers (each with the
    case or model it was measured on) and where, when and how they were measured."""
    if not ratios:
        return None
    ratios = sorted(ratios)
    geometric = math.exp(sum(math.log(x) for x, _ in ratios) / len(ratios))
    at_most_one = sum(x <= 1.0 for x, _ in ratios)
    measured = f"{meta['date']}, {machine_text(meta)}: `{command}`"
    return [benchmark, str(len(ratios)), f"**{geometric:.2f}**",
            f"{at_most_one} of {len(ratios)}", f"{ratios[-1][0]:.2f} ({ratios[-1][1]})",
            f"**{TINY_NOTE}** {measured}" if meta.get("tiny") else measured]


def merge_glance(rows: list[list[str]]):
    """What :func:`fill_marked_sections` writes for the glance table: its rows as the file
    has them, those named in ``rows`` (by their first cell) replaced or added."""
    def merge(old: str) -> str:
        kept = {}
        for line in old.splitlines():
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if line.startswith("| ") and cells[0] != GLANCE_HEADER[0]:
                kept[cells[0]] = line
        for row in rows:
            kept[row[0]] = "| " + " | ".join(row) + " |"
        order = sorted(kept, key=lambda k: (GLANCE_ORDER.index(k) if k in GLANCE_ORDER
                                            else len(GLANCE_ORDER)))
        return "\n".join(["| " + " | ".join(GLANCE_HEADER) + " |",
                          "|---|---:|---:|---:|---|---|"] + [kept[k] for k in order])

    return merge


def fill_marked_sections(path: str, sections: dict) -> None:
    """For each ``name: text``, replace what lies between ``<!-- bench:NAME -->`` and
    ``<!-- /bench:NAME -->`` in the file at ``path`` (markers kept); ``text`` may be a
    function of what lies there now (:func:`merge_glance`).  A file with none of the markers
    gets the first section appended."""
    try:
        with open(path, encoding="utf-8") as file:
            content = file.read()
    except FileNotFoundError:
        content = ""
    filled = False
    for name, text in sections.items():
        begin, end = f"<!-- bench:{name} -->", f"<!-- /bench:{name} -->"
        if begin in content and end in content:
            head, rest = content.split(begin, 1)
            old, tail = rest.split(end, 1)
            if callable(text):
                text = text(old.strip("\n"))
            content = head + f"{begin}\n{text}\n{end}" + tail
            filled = True
    if not filled:
        name, text = next(iter(sections.items()))
        if callable(text):
            text = text("")
        content += ("\n" if content and not content.endswith("\n") else "") + \
            f"<!-- bench:{name} -->\n{text}\n<!-- /bench:{name} -->\n"
    with open(path, "w", encoding="utf-8") as file:
        file.write(content)
