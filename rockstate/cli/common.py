"""What every command shares: sizes, the client connection, output (table, plain, JSON), confirmation.

Output. ``--output table`` (the default) draws rich tables; on a terminal they fit its width, and when
stdout is no terminal (a pipe, a file) they are never wrapped or folded, unless ``COLUMNS`` names a width.
``--output plain`` prints tab-separated rows with a header line and no decoration; ``--output json`` (or
``--json``) the document. Every name that comes from the cluster (node ids, states, events) is printed
as text, never read as rich markup.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from typing import Any, Iterable, Sequence

from pydantic import ByteSize, TypeAdapter, ValidationError

from ..errors import ConfigError

_SIZE = TypeAdapter(ByteSize)
DEFAULT_COORDINATOR = "127.0.0.1:7700"
WIDE = 100_000  # "no width": what a table gets when stdout is no terminal


def parse_size(text: str) -> int:
    """Bytes from "4GiB", "512MB", "1.5 GiB" or a plain number of bytes."""
    try:
        return int(_SIZE.validate_python(text))
    except ValidationError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size: give bytes, or a number with a unit such as 512MiB or 4GiB") from None


def human(n: float | None) -> str:
    """1536 -> "1.5 KiB"; None -> ""."""
    if n is None:
        return ""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:g} B" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return ""


def coordinator_of(args: argparse.Namespace) -> str:
    return getattr(args, "coordinator", None) or DEFAULT_COORDINATOR


def backend(args: argparse.Namespace, retry_timeout: float = 5.0):
    from ..cluster.client.backend import ClusterBackend
    from ..cluster.security import client_context, load_secret

    return ClusterBackend(coordinator_of(args), retry_timeout=retry_timeout, secret=load_secret(getattr(args, "secret_file", None)),
                          ssl=client_context(getattr(args, "tls_ca_file", None), getattr(args, "tls_cert_file", None),
                                             getattr(args, "tls_key_file", None)))


def output_of(args: argparse.Namespace) -> str:
    """table, plain or json (``--json`` is ``--output json``)."""
    return "json" if getattr(args, "json", None) else (getattr(args, "output", None) or "table")


def waiting(what: str, fn):
    """Run ``fn`` under a spinner with the elapsed time: restores and savepoints can take a while."""
    from rich.console import Console

    with Console(stderr=True).status(f"{what}..."):
        return fn()


def console(file=None):
    """A console for stdout: a terminal's width on a terminal; elsewhere ``COLUMNS`` if set, else no limit (nothing wraps)."""
    from rich.console import Console

    file = file or sys.stdout
    if file.isatty() or os.environ.get("COLUMNS"):
        return Console(file=file, highlight=False)
    return Console(file=file, width=WIDE, highlight=False, soft_wrap=True)


def json_default(o: Any) -> Any:
    if dataclasses.is_dataclass(o) and not isinstance(o, type):
        return dataclasses.asdict(o)
    if isinstance(o, (bytes, bytearray)):
        return o.decode("utf-8", "backslashreplace")
    if isinstance(o, (set, frozenset, tuple)):
        return list(o)
    return str(o)


def print_json(data: Any, file=None) -> None:
    print(json.dumps(data, indent=1, default=json_default), file=file or sys.stdout)


class Output:
    """Lines and tables, drawn for ``--output table`` or ``plain``; untrusted text is never markup."""

    def __init__(self, args: argparse.Namespace, file=None) -> None:
        self.mode = output_of(args)
        self.file = file or sys.stdout
        self.console = console(self.file)

    def line(self, text: str = "", style: str | None = None) -> None:
        """``text`` is plain text (never markup); ``style`` colours it on a terminal."""
        if self.mode == "plain":
            print(text, file=self.file)
        else:
            from rich.text import Text

            self.console.print(Text(text, style=style or ""))

    def table(self, columns: Sequence[str], rows: Iterable[Sequence[Any]], title: str | None = None) -> None:
        rows = [["" if c is None else str(c) for c in row] for row in rows]
        if self.mode == "plain":
            print("\t".join(columns), file=self.file)
            for row in rows:
                print("\t".join(c.replace("\t", " ").replace("\n", " ") for c in row), file=self.file)
            return
        from rich import box
        from rich.table import Table
        from rich.text import Text

        wide = self.console.width >= WIDE
        table = Table(box=box.SIMPLE_HEAD, title=title, title_justify="left", pad_edge=False)
        for c in columns:  # headers never cut; on a narrow terminal cells fold, with no width limit they never do
            table.add_column(c, no_wrap=wide, overflow="ignore" if wide else "fold", min_width=len(max(c.split(), key=len)))
        for row in rows:
            table.add_row(*(Text(c) for c in row))
        self.console.print(table)


def confirm(args: argparse.Namespace, what: str) -> None:
    """Ask before a command that rolls the live cluster back; ``--yes`` answers for scripts."""
    if args.yes:
        return
    if not sys.stdin.isatty():
        raise ConfigError(f"{what}: this rolls the live cluster back; run it from a terminal to confirm, or give --yes")
    print(f"{what}.\nEverything written to the cluster since is lost. Type 'yes' to go on: ", end="", file=sys.stderr, flush=True)
    if sys.stdin.readline().strip().lower() != "yes":
        raise ConfigError(f"{what}: not confirmed; nothing was changed")
