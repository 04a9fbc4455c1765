"""The one console and the one table renderer of optbench's commands, pages and reports.

A table is columns and rows of cells (any value, shown as ``str``), rendered as a rich Table for the
terminal, GitHub Markdown (``|`` in a cell escaped) or HTML (every cell, header and row mark
escaped). A row's mark (a compare verdict such as 'REGRESSION') is its HTML class and, through
:data:`STYLES`, its rich style.
"""

from __future__ import annotations

import sys
from collections.abc import Collection, Iterable, Sequence
from html import escape
from typing import TYPE_CHECKING, Literal, overload

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table

STYLES = {"REGRESSION": "bold red", "improvement": "green"}  # rich style of a row mark

Format = Literal["rich", "markdown", "html"]


def console() -> Console:
    """A console on stdout: the terminal's width on a terminal, else 200 columns (logs and pipes
    keep whole rows)."""
    from rich.console import Console

    return Console(width=None if sys.stdout.isatty() else 200)


@overload
def table(
    columns: Sequence[str],
    rows: Iterable[Sequence[object]],
    fmt: Literal["rich"] = ...,
    *,
    title: str = "",
    marks: Sequence[str] = (),
    right: Collection[str] = (),
    compact: bool = False,
) -> Table: ...


@overload
def table(
    columns: Sequence[str],
    rows: Iterable[Sequence[object]],
    fmt: Literal["markdown", "html"],
    *,
    title: str = "",
    marks: Sequence[str] = (),
    right: Collection[str] = (),
    compact: bool = False,
) -> str: ...


def table(
    columns: Sequence[str],
    rows: Iterable[Sequence[object]],
    fmt: Format = "rich",
    *,
    title: str = "",
    marks: Sequence[str] = (),
    right: Collection[str] = (),
    compact: bool = False,
) -> Table | str:
    """``rows`` under ``columns`` as ``fmt``. ``marks``: one per row from the first ('' for none);
    ``title`` (rich only) above the table; ``right``: the columns aligned right (rich and
    Markdown); ``compact`` (rich only): no lines but the one under the header (a console's
    table among other lines)."""
    cells = [[str(c) for c in row] for row in rows]
    marked = [*marks, *[""] * (len(cells) - len(marks))]
    if fmt == "rich":
        from rich import box
        from rich.table import Table

        out = (
            Table(title=title or None, box=box.SIMPLE_HEAD, show_edge=False)
            if compact
            else Table(title=title or None)
        )
        for column in columns:
            out.add_column(column, justify="right" if column in right else "left")
        for row, mark in zip(cells, marked):
            out.add_row(*row, style=STYLES.get(mark))
        return out
    if fmt == "markdown":

        def line(values: Iterable[str]) -> str:
            return "| " + " | ".join(v.replace("|", "\\|") for v in values) + " |"

        rule = "|" + "|".join("---:" if column in right else "---" for column in columns) + "|"
        return "\n".join([line(columns), rule, *map(line, cells)])
    if fmt != "html":
        raise ValueError(f"unknown table format {fmt!r}")
    head = "".join(f"<th>{escape(c)}</th>" for c in columns)
    body = "".join(
        (f'<tr class="{escape(mark)}">' if mark else "<tr>")
        + "".join(f"<td>{escape(c)}</td>" for c in row)
        + "</tr>"
        for row, mark in zip(cells, marked)
    )
    return f"<table><tr>{head}</tr>{body}</table>"
