"""Untrusted strings in the CLI: a node id (or any cell the cluster sends) with rich markup is printed as text."""

from rich.console import Console

from rockstate import cli


def test_markup_in_a_node_id_is_printed_as_text_not_parsed():
    table = cli._table("node", "address", title="nodes")
    table.add_row("../../../x<script>[/x]", "[bold red]127.0.0.1:1[/]")  # before: rich.errors.MarkupError
    console = Console(record=True, width=120)
    console.print(table)
    text = console.export_text()
    assert "../../../x<script>[/x]" in text and "[bold red]127.0.0.1:1[/]" in text
