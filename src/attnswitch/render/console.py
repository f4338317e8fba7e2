"""The report on a terminal (rich), or as plain text for ``str(report)``."""

from __future__ import annotations

import io

from .document import Heading, Table, Text
from .sections import sections

__all__ = ["to_console", "to_text"]

_STYLE = {"plain": "", "note": "dim", "strong": "bold", "error": "red"}


def _table(block: Table):
    from rich.markup import escape
    from rich.table import Table as RichTable

    t = RichTable(title=block.title, title_justify="left", title_style="bold")
    for h in block.headers:
        t.add_column(h, justify="left" if h in block.left else "right", no_wrap=h == block.headers[0])
    for row in block.rows:
        t.add_row(*map(escape, row))
    return t


def to_console(report, console=None, *, layers: bool = True, fold: bool = True) -> None:
    """Print the report on ``console`` (a ``rich.console.Console``; stdout by default)."""
    from rich.console import Console
    from rich.text import Text as RichText

    console = console or Console()
    for block in sections(report, layers=layers, fold_layers=fold):
        if isinstance(block, Table):
            console.print(_table(block))
        elif isinstance(block, Heading):
            if block.level > 1:
                console.print(RichText(block.text, style="bold underline"))
        elif isinstance(block, Text):
            console.print(RichText(block.text, style=_STYLE.get(block.kind, "")))


def to_text(report, width: int = 160) -> str:
    """The console rendering as plain text (no colours)."""
    from rich.console import Console

    console = Console(file=io.StringIO(), width=width, color_system=None, force_terminal=False)
    to_console(report, console)
    return console.file.getvalue()
