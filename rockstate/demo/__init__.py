"""``make demo`` / ``rockstate demo``: a CDC pipeline on PySpark, through a node failure and a node join (see ``run``).

Only the command's flags are here: every ``rockstate`` process builds its
command line, and the run's imports (pandas, Spark helpers) cost each of
them memory they never use.
"""

from __future__ import annotations

import argparse

FILES = 12


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--events", type=int, default=100_000, help="CDC events to generate (default 100000)")
    parser.add_argument("--nodes", type=int, default=3, help="state nodes to start with (default 3)")
    parser.add_argument("--storage", default=None, help="checkpoint storage URL (default: a local directory), e.g. s3://bucket/demo")
    parser.add_argument("--no-failure", action="store_true", help="do not kill a node (the join still happens)")
    parser.add_argument("--files", type=int, default=FILES, help=f"files the stream arrives in, one micro-batch each (default {FILES})")
    parser.add_argument("--ha", action="store_true",
                        help="three coordinators on a ZooKeeper server (Debian's package); the leader is killed (SIGKILL) halfway")
    parser.add_argument("--spark-cluster", action="store_true",
                        help="run Spark as a standalone master and two workers (own JVMs, on 127.0.0.1) instead of local mode")


def main(args: argparse.Namespace) -> int:
    import tempfile

    from rich.console import Console

    from .run import Demo

    with tempfile.TemporaryDirectory(prefix="rockstate-demo-") as root:
        return Demo(args, root, Console()).run()
