"""Untrusted strings in the CLI: a node id (or any cell or line the cluster sends) with rich markup is printed as text."""

import argparse
import io

from rockstate.cli.common import Output


def test_markup_in_a_node_id_is_printed_as_text_not_parsed():
    out = io.StringIO()
    output = Output(argparse.Namespace(output="table", json=False), file=out)
    output.table(["node", "address"], [["../../../x<script>[/x]", "[bold red]127.0.0.1:1[/]"]], title="nodes")  # before: MarkupError
    output.line("leader [/x] node-1")
    text = out.getvalue()
    assert "../../../x<script>[/x]" in text and "[bold red]127.0.0.1:1[/]" in text and "leader [/x] node-1" in text
