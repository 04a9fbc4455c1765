"""optbench.run.console: one table renderer (rich, Markdown, HTML) and one console."""

from __future__ import annotations

import pytest

from optbench.run.console import STYLES, console, table

COLUMNS = ("name", "ms")
ROWS = [("a|b", 1.5), ("<c>", "2")]


def test_markdown_escapes_pipes_and_aligns_right_columns():
    assert (
        table(COLUMNS, ROWS, "markdown", right=("ms",))
        == "| name | ms |\n|---|---:|\n| a\\|b | 1.5 |\n| <c> | 2 |"
    )


def test_html_escapes_cells_and_marks_rows_by_class():
    assert table(COLUMNS, ROWS, "html", marks=["REGRESSION"]) == (
        "<table><tr><th>name</th><th>ms</th></tr>"
        '<tr class="REGRESSION"><td>a|b</td><td>1.5</td></tr>'
        "<tr><td>&lt;c&gt;</td><td>2</td></tr></table>"
    )


def test_rich_rows_take_their_marks_style():
    t = table(COLUMNS, ROWS, title="T", marks=["improvement", ""], right=("ms",))
    assert t.title == "T" and [c.header for c in t.columns] == list(COLUMNS)
    assert [c.justify for c in t.columns] == ["left", "right"]
    assert [r.style for r in t.rows] == [STYLES["improvement"], None]
    with pytest.raises(ValueError):
        table(COLUMNS, ROWS, "latex")


def test_the_console_keeps_whole_rows_off_a_terminal(capsys):
    out = console()
    assert out.width == 200  # pytest captures stdout: not a terminal
    out.print(table(("x" * 150, "y"), [("1", "2")]))
    assert all(len(line) <= 200 for line in capsys.readouterr().out.splitlines())
