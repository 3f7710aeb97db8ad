"""The ``poolfold`` command: ``run``, ``conformance`` and ``bench``."""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
import warnings

import numpy as np

from .console import progress

EXIT_FAILURE = 1  # the work ran and something failed
EXIT_USAGE = 2  # bad arguments or input files


class UsageError(Exception):
    """A problem with what the user gave: printed as one line, exit status 2."""


# ---------------------------------------------------------------------------------------- run

RUN_HELP = """\
Run an ONNX model with poolfold: MaxPool, MaxUnpool, Col2Im, AveragePool, LpPool, the global
pools and the com.ms.internal.nhwc ops on poolfold's kernels, every other op on onnxruntime
when it is installed (each stretch of them one session), else on onnx's ReferenceEvaluator;
--other-ops chooses.

With no MODEL, runs the bundled example, a small SegNet-style encoder-decoder that uses
MaxPool with Indices, MaxUnpool with output_shape and Col2Im. Inputs not given with --input
are generated from the model's declared shapes and types (random, seeded; the seed is printed;
unknown dims are taken as 1). Prints each output's name, shape, dtype and a short summary,
and the run time; --output also writes every output to an .npz file under its graph name.
"""


def _onnx_dtype(elem_type: int) -> np.dtype:
    from onnx import helper

    try:
        return np.dtype(helper.tensor_dtype_to_np_dtype(elem_type))
    except (KeyError, TypeError, ValueError):
        raise UsageError(f"the model declares an input of unknown element type {elem_type}") from None


def _declared_inputs(model) -> dict:
    """name -> (dtype, shape with None for unknown dims) of the graph inputs to feed."""
    initializers = {i.name for i in model.graph.initializer}
    declared = {}
    for value in model.graph.input:
        if value.name in initializers:
            continue
        tensor = value.type.tensor_type
        shape = tuple(
            d.dim_value if d.HasField("dim_value") else None for d in tensor.shape.dim
        )
        declared[value.name] = (_onnx_dtype(tensor.elem_type), shape)
    return declared


# Generated inputs are for trying a model out: one larger than this is refused (give it with
# --input), rather than filling memory for a declared dim of 2**40.
MAX_GENERATED_BYTES = 2**30


def _generate(dtype: np.dtype, shape, rng: np.random.Generator, name: str = "") -> np.ndarray:
    shape = tuple(1 if d is None else d for d in shape)
    if any(d < 0 for d in shape):
        raise UsageError(f"input {name!r} declares a negative dim {shape}; give it with --input")
    if math.prod(shape) * dtype.itemsize > MAX_GENERATED_BYTES:
        raise UsageError(
            f"input {name!r} of declared shape {shape} ({dtype}) would need more than "
            f"{MAX_GENERATED_BYTES // 2**20} MiB to generate; give it with --input"
        )
    if dtype.kind == "f" or dtype.name == "bfloat16":
        return rng.standard_normal(shape).astype(dtype)
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return rng.integers(max(info.min, -100), min(info.max, 100), shape, endpoint=True).astype(dtype)
    if dtype.kind == "b":
        return rng.integers(0, 2, shape).astype(bool)
    raise UsageError(f"cannot generate an input of type {dtype}; give it with --input")


def _read_input(spec: str, declared: dict) -> tuple[str, np.ndarray]:
    name, sep, path = spec.partition("=")
    if not sep or not name or not path:
        raise UsageError(f"--input takes NAME=FILE.npy, got {spec!r}")
    if name not in declared:
        raise UsageError(
            f"unknown input {name!r}; the model's inputs are {', '.join(declared) or '(none)'}"
        )
    try:
        value = np.load(path, allow_pickle=False)
    except FileNotFoundError:
        raise UsageError(f"input file not found: {path}") from None
    except (OSError, ValueError) as error:
        raise UsageError(f"cannot read {path} as a .npy array: {error}") from None
    if not isinstance(value, np.ndarray):
        raise UsageError(f"{path} holds several arrays (an .npz?); give one .npy per input")
    dtype, shape = declared[name]
    if value.dtype != dtype:
        raise UsageError(f"input {name!r} must be {dtype}, but {path} holds {value.dtype}")
    if len(value.shape) != len(shape) or any(
        want is not None and got != want for got, want in zip(value.shape, shape)
    ):
        wanted = "(" + ", ".join("?" if d is None else str(d) for d in shape) + ")"
        raise UsageError(f"input {name!r} must have shape {wanted}, but {path} holds {value.shape}")
    return name, value


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def _summary(value: np.ndarray) -> str:
    if value.size == 0:
        return "empty"
    if value.dtype.kind in "fiu" or value.dtype.name == "bfloat16":
        v = value.astype(np.float64)
        finite = v[np.isfinite(v)]
        nan = int(np.isnan(v).sum())
        text = (f"min {finite.min():.4g}  max {finite.max():.4g}  mean {finite.mean():.4g}"
                if finite.size else "no finite values")
        return text + (f"  ({nan} NaN)" if nan else "")
    if value.dtype.kind == "b":
        return f"{int(value.sum())} of {value.size} true"
    return f"{value.size} values"


def command_run(args) -> int:
    from . import backend, models
    from .errors import PoolfoldError
    from .kernels import notices

    notices.announce_compiles()  # a first run compiles for seconds: say so, not sit silent
    path = args.model or str(models.path())
    if not os.path.exists(path):
        raise UsageError(f"model file not found: {path}")
    try:
        # The graph only: prepare maps the weights of an external-data model from their file.
        model, _ = backend.load_model(path)
    except (PoolfoldError, OSError) as error:
        raise UsageError(f"{path}: {_first_line(error)}") from None
    if args.repeat < 1:
        raise UsageError(f"--repeat takes a positive count, got {args.repeat}")
    declared = _declared_inputs(model)
    feeds = dict(_read_input(spec, declared) for spec in args.input)
    rng = np.random.default_rng(args.seed)
    generated = [name for name in declared if name not in feeds]
    for name in generated:
        feeds[name] = _generate(*declared[name], rng, name)
    print(f"model: {path if args.model else 'bundled example (SegNet-style encoder-decoder)'}")
    for name, value in feeds.items():
        origin = f"generated, seed {args.seed}" if name in generated else "from file"
        print(f"input  {name}: shape {value.shape}, {value.dtype} ({origin})")
    try:
        rep = backend.prepare(path, other_ops=args.other_ops,
                              poolfold_nodes=args.poolfold_nodes)
        times = []
        for _ in range(args.repeat):
            start = time.perf_counter()
            outputs = rep.run(feeds)
            times.append(time.perf_counter() - start)
    except Exception as error:  # a model that cannot run is bad input: one line, no traceback
        raise UsageError(_first_line(error)) from None
    if rep.other_ops == "onnxruntime":
        print(f"where it runs (--poolfold-nodes {args.poolfold_nodes}):")
        for line in rep.describe().splitlines():
            print(f"  {line}")
    names = [o.name for o in model.graph.output]
    for name, value in zip(names, outputs):
        value = np.asarray(value)
        print(f"output {name}: shape {value.shape}, {value.dtype}, {_summary(value)}")
    print(f"ran in {times[0] * 1e3:.1f} ms")
    if len(times) > 1:
        print(f"then {len(times) - 1} more runs: median {np.median(times[1:]) * 1e3:.2f} ms "
              f"(other ops on {rep.other_ops})")
    if args.output:
        try:
            np.savez(args.output, **{n: np.asarray(v) for n, v in zip(names, outputs)})
        except OSError as error:
            raise UsageError(f"cannot write {args.output}: {error}") from None
        print(f"wrote {len(names)} outputs to {args.output}")
    return 0


# -------------------------------------------------------------------------------- conformance

def command_conformance(args) -> int:
    from . import conformance

    cases = conformance.cases()
    if args.filter:
        cases = [c for c in cases if args.filter in c.name]
    outcomes = []
    for done, case in enumerate(cases):
        progress(done, len(cases), case.name)
        outcomes.append(conformance.run_case(case))
    progress(len(cases), len(cases))
    width = max((len(c.name) for c in cases), default=10)
    print(f"{'test':<{width}}  {'kind':<17}  {'result':<10}  {'time':>8}")
    for outcome in outcomes:
        print(f"{outcome.case.name:<{width}}  {outcome.case.kind:<17}  {outcome.status:<10}  "
              f"{outcome.seconds * 1e3:6.1f} ms")
    for outcome in outcomes:
        if outcome.detail:
            print(f"  {outcome.case.name}: {outcome.detail}")
    passed = sum(o.status == "pass" for o in outcomes)
    divergent = sum(o.status == "divergence" for o in outcomes)
    failed = sum(o.status == "fail" for o in outcomes)
    print(f"{passed} passed, {failed} failed, {divergent} documented divergence")
    return EXIT_FAILURE if failed else 0


# ------------------------------------------------------------------------------------- main

def parser() -> argparse.ArgumentParser:
    from . import __version__, bench

    top = argparse.ArgumentParser(
        prog="poolfold",
        description="Fast, spec-exact ONNX MaxPool, MaxUnpool, Col2Im and the averaging "
                    "family (AveragePool, LpPool, the global pools).",
    )
    top.add_argument("--version", action="version", version=f"poolfold {__version__}")
    commands = top.add_subparsers(dest="command", metavar="COMMAND")

    run = commands.add_parser("run", help="run an ONNX model (the bundled example by default)",
                              description=RUN_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    run.add_argument("model", nargs="?", metavar="MODEL", help="an .onnx file (default: the bundled example)")
    run.add_argument("--input", action="append", default=[], metavar="NAME=FILE.npy",
                     help="feed the graph input NAME from a .npy file (repeatable)")
    run.add_argument("--output", metavar="FILE.npz", help="write every output to this .npz")
    run.add_argument("--seed", type=int, default=0, help="seed for generated inputs (default 0)")
    run.add_argument("--repeat", type=int, default=1, metavar="N",
                     help="run N times; print the first run's time and the median of the others")
    run.add_argument("--other-ops", choices=["onnxruntime", "reference"], default=None,
                     help="what runs the ops poolfold does not implement (default: onnxruntime "
                          "when installed, else onnx's reference evaluator)")
    run.add_argument("--poolfold-nodes", choices=["all", "needed"], default="all",
                     help="with the other ops on onnxruntime: run every node of poolfold's "
                          "ops on poolfold (all, the default), or only those "
                          "onnxruntime cannot run or would compute differently (needed)")
    run.set_defaults(handler=command_run)

    conformance = commands.add_parser(
        "conformance", help="run onnx's backend tests for these ops through poolfold.backend",
        description="Run the onnx package's MaxPool, MaxUnpool, Col2Im, AveragePool, LpPool, "
                    "GlobalAveragePool and GlobalMaxPool node tests and its PyTorch-converted "
                    "MaxPool and AvgPool models through poolfold.backend; print a table "
                    "of test, result and time. Exit status 1 if any test fails (the documented "
                    "divergence excepted).")
    conformance.add_argument("--filter", metavar="TEXT", help="only tests whose name contains TEXT")
    conformance.set_defaults(handler=command_conformance)

    bench.add_arguments(commands.add_parser(
        "bench", help="benchmark poolfold against onnxruntime (and others when installed)",
        description=bench.DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter))
    return top


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    if not getattr(args, "handler", None):
        parser().print_help()
        return EXIT_USAGE
    try:
        with warnings.catch_warnings():
            # onnx's test generators overflow casts on purpose; poolfold's own warnings (a bad
            # POOLFOLD_NUM_THREADS, a stretch that fell back) must still show.
            warnings.filterwarnings("ignore", category=RuntimeWarning, module=r"onnx(\.|$)")
            return args.handler(args)
    except UsageError as error:
        print(f"poolfold {args.command}: error: {error}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
