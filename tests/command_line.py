"""The ``poolfold`` command run by ``poolfold.cli.main`` in the test's own process: what a
subprocess would show (exit status, stdout, stderr) without its second or two of imports."""

from __future__ import annotations

import contextlib
import io
import os
import subprocess


def cli_here(*args, cwd):
    """``poolfold ARGS`` run by ``poolfold.cli.main`` in this process, in ``cwd``: the exit
    status and what it printed, as a ``subprocess.run`` of the command gives them."""
    from poolfold import cli as command

    out, err = io.StringIO(), io.StringIO()
    here = os.getcwd()
    os.chdir(cwd)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = command.main([str(a) for a in args])
            except SystemExit as exit_:  # argparse's --help and usage errors
                code = exit_.code
    finally:
        os.chdir(here)
    return subprocess.CompletedProcess(args, code, out.getvalue(), err.getvalue())
