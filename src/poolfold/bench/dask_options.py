"""The options of ``poolfold bench --dask`` beside the flag itself.  They live here, not in
poolfold.dask, whose package imports dask: the command line must work without it."""

from __future__ import annotations


def add_dask_arguments(parser) -> None:
    parser.add_argument("--dask-size", type=int, default=2048, metavar="S",
                        help="side of the out-of-core float32 (1, 1, S, S, S) zarr volume "
                             "(default 2048: 32 GiB on disk; 0 skips the out-of-core run)")
    parser.add_argument("--dask-chunk", type=int, default=256, metavar="C",
                        help="chunk side of both volumes (default 256)")
    parser.add_argument("--dask-memory-limit", default="4GiB", metavar="M",
                        help="memory limit of each of the 2 workers (default 4GiB)")
    parser.add_argument("--dask-dir", default=None, metavar="DIR",
                        help="where the temporary zarr stores go (default: the temp dir)")
    parser.add_argument("--dask-in-memory-size", type=int, default=512, metavar="S",
                        help="side of the in-memory comparison volume (default 512; 0 skips it)")
