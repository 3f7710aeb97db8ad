"""The fuzz campaign: draw hostile cases with hypothesis from a seed, judge each in a worker
process with a time and memory limit, and count the outcomes.

    python -m tests.fuzz.campaign --cases 100000 --seed 1 --workers 2
    python -m tests.fuzz.campaign --cases 20000 --ops averaging     # only those ops
    python -m tests.fuzz.campaign --replay "{'op': 'max_pool', ...}"   # one printed case
    python -m tests.fuzz.campaign --replay-log campaign.log            # every failing case

Prints the counts (tried, passed by value, passed by error, unchecked, failed) and every
failing case as a line ``--replay`` takes; ``--json`` prints the counts as JSON as the last
line.  Exit status 1 if any case failed.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import sys
import time
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
if str(TESTS) not in sys.path:
    sys.path.insert(0, str(TESTS))

os.environ.setdefault("POOLFOLD_NUM_THREADS", "1")  # many small calls: no pool wake-ups

from fuzz import cases, runner  # noqa: E402


BATCH = 500


# --ops takes op names (cases.OPS) and these groups, comma-separated.
OP_GROUPS = {"all": cases.OPS, "averaging": cases.AVERAGING_OPS}


def select_ops(text: str) -> tuple[str, ...]:
    ops = []
    for name in text.split(","):
        name = name.strip()
        if name not in OP_GROUPS and name not in cases.OPS:
            raise SystemExit(f"--ops: unknown op or group {name!r}; "
                             f"known: {', '.join(list(OP_GROUPS) + list(cases.OPS))}")
        ops += [op for op in OP_GROUPS.get(name, (name,)) if op not in ops]
    return tuple(ops)


def draw_specs(count: int, seed: int, ops=cases.OPS):
    """``count`` case specs of ``ops``, the same ones for the same seed (and the same harness
    code), drawn in batches of ``BATCH`` (each from its own seed, derived from ``seed``)."""
    for batch in range(0, count, BATCH):
        yield from draw_batch(min(BATCH, count - batch), seed * 1_000_003 + batch // BATCH, ops)


def draw_batch(count: int, seed: int, ops=cases.OPS) -> list[dict]:
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import seed as hypothesis_seed

    specs = []

    @hypothesis_seed(seed)
    @settings(max_examples=count, database=None, deadline=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(cases.any_case(ops=tuple(ops)))
    def collect(spec):
        specs.append(spec)

    collect()
    return specs[:count]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.fuzz.campaign", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--time-limit", type=float, default=runner.TIME_LIMIT)
    parser.add_argument("--ops", default="all",
                        help="comma-separated op names or groups (all, averaging)")
    parser.add_argument("--replay", metavar="SPEC", help="judge one printed case")
    parser.add_argument("--replay-log", metavar="FILE",
                        help="judge again every failing case a campaign's output printed")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--progress", type=int, default=0, metavar="N",
                        help="print the counts every N cases")
    args = parser.parse_args(argv)

    start = time.monotonic()
    specs = {}

    def remember(stream):
        for index, spec in enumerate(stream):
            specs[index] = spec
            yield spec

    if args.replay_log:
        with open(args.replay_log) as log:
            stream = [cases.read_spec(line.split("case: ", 1)[1]) for line in log
                      if line.startswith("  case: ")]
    elif args.replay:
        stream = [cases.read_spec(args.replay)]
    else:
        stream = draw_specs(args.cases, args.seed, select_ops(args.ops))
    total = len(stream) if isinstance(stream, list) else args.cases
    counts = collections.Counter()
    by_op = collections.defaultdict(collections.Counter)
    failures = []
    for index, status, detail in runner.run(remember(stream), args.workers, args.time_limit):
        counts[status] += 1
        spec = specs[index]
        by_op[spec["op"] + (" (run_node)" if spec.get("via") else "")][status] += 1
        if status == "fail":
            failures.append((index, detail))
            print(f"FAIL {detail.splitlines()[0] if detail else ''}\n  case: {spec!r}",
                  flush=True)
        del specs[index]
        done = sum(counts.values())
        if args.progress and done % args.progress == 0:
            print(f"[{done}/{total} in {time.monotonic() - start:.0f} s] {dict(counts)}",
                  flush=True)
    summary = {
        "seed": args.seed, "tried": sum(counts.values()), "value": counts["value"],
        "error": counts["error"], "unchecked": counts["unchecked"], "fail": counts["fail"],
        "seconds": round(time.monotonic() - start, 1),
        "by_op": {op: dict(c) for op, c in sorted(by_op.items())},
    }
    print(f"tried {summary['tried']}: passed by value {summary['value']}, by error "
          f"{summary['error']}, returned but too large for the oracle {summary['unchecked']}, "
          f"failed {summary['fail']} ({summary['seconds']} s)")
    for op, c in summary["by_op"].items():
        print(f"  {op}: {c}")
    if args.json:
        print(json.dumps(summary))
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
