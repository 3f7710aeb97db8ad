"""The fuzz harness: hostile calls to every public op, each run in a worker process with a
time and memory limit and judged against the oracle (see ``campaign``)."""
