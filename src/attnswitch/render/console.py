"""The report on a terminal (rich), or as plain text for ``str(report)``.

Tables are sized to their data: a header wraps (at spaces, or before a ``/``) onto at most two lines
rather than widen its column, and the columns sit two spaces apart, so the summary of every backend
fits 120 columns. Plots, the environment table and the trace list are the HTML page's.
"""

from __future__ import annotations

import io
import re

from .document import Block, Callout, Code, Figure, Heading, Section, Table, Text
from .sections import sections

__all__ = ["to_console", "to_text", "fit_header", "TABLE_WIDTH"]

#: the width every table fits (kept where the output is not a terminal and prose wraps narrower)
TABLE_WIDTH = 120

_STYLE = {"plain": "", "note": "dim", "strong": "bold", "error": "red"}  # of a text or a table row
_SKIP = frozenset({"plots", "environment", "traces"})  # sections the page shows and a terminal does not


def _wrap(header: str, width: int, slash: bool) -> list[str]:
    lines: list[str] = []
    for word in header.split(" "):
        parts = [p for p in re.split(r"(?=/)", word) if p] if slash and len(word) > width else [word]
        for i, part in enumerate(parts):
            sep = " " if i == 0 else ""
            if lines and len(lines[-1]) + len(sep) + len(part) <= width:
                lines[-1] += sep + part
            else:
                lines.append(part)
    return lines


def _narrowest(header: str, data_width: int, max_lines: int, slash: bool) -> tuple[str, int]:
    for width in range(max(data_width, 1), len(header) + 1):
        lines = _wrap(header, width, slash)
        if len(lines) <= max_lines and max(map(len, lines)) <= width:
            return "\n".join(lines), width
    return header, max(len(header), data_width)


def fit_header(header: str, data_width: int, max_lines: int = 2) -> tuple[str, int]:
    """``header`` wrapped onto at most ``max_lines`` lines, and the narrowest column width (at least the
    data's) at which it does: at spaces, or also before a ``/`` where that saves more than a character."""
    spaces = _narrowest(header, data_width, max_lines, slash=False)
    slashes = _narrowest(header, data_width, max_lines, slash=True)
    return spaces if spaces[1] <= slashes[1] + 1 else slashes


def _table(block: Table, styled: bool):
    from rich import box
    from rich.table import Table as RichTable
    from rich.text import Text as RichText

    t = RichTable(title=RichText(block.title) if block.title else None, title_justify="left", title_style="bold",
                  caption=RichText(block.caption) if block.caption and styled else None, caption_justify="left",
                  caption_style="dim", box=box.SIMPLE_HEAD, padding=(0, 1), collapse_padding=True, show_edge=False,
                  pad_edge=False)
    for i, h in enumerate(block.headers):
        data = max((len(row[i]) for row in block.rows), default=0)
        text, width = fit_header(h, data)
        # numbers are never cut; where the screen is too narrow, the names (first column) wrap instead
        t.add_column(RichText(text), justify="left" if h in block.left else "right",
                     min_width=width if i > 0 else None, no_wrap=i > 0, overflow="fold")
    for i, row in enumerate(block.rows):
        t.add_row(*map(RichText, row), style=_STYLE.get(block.kind(i), ""))
    return t


def _print(console, blocks: list[Block] | tuple[Block, ...]) -> None:
    from rich.text import Text as RichText

    for block in blocks:
        if isinstance(block, Section):
            if block.key in _SKIP:
                continue
            if block.title and not block.collapsible:  # a collapsible group's tables carry its name
                console.print(RichText(block.title, style="bold underline"))
            _print(console, block.blocks)
        elif isinstance(block, Table):
            # a table fits 120 columns; where the output is not a terminal (a log, a pipe), prose wraps at
            # the console's width and a table keeps its 120
            wide = None if console.is_terminal else max(console.width, TABLE_WIDTH)
            console.print(_table(block, styled=console.color_system is not None), width=wide)  # plain: no bold
        elif isinstance(block, Callout):
            console.print(RichText(f"{block.label}: {block.headline}", style="bold"))
            for reason in block.reasons:
                console.print(RichText(f"  {reason}"))
        elif isinstance(block, Heading):
            console.print(RichText(block.text, style="bold" if block.level == 1 else "bold underline"))
        elif isinstance(block, Text):
            console.print(RichText(block.text, style=_STYLE.get(block.kind, "")))
        elif isinstance(block, Code):
            for line in block.text.splitlines():
                console.print(RichText("    " + line), soft_wrap=True)  # as it is: code is copied, never wrapped
        elif isinstance(block, Figure):
            continue


def to_console(report, console=None, *, layers: bool = True, fold: bool = True) -> None:
    """Print the report on ``console`` (a ``rich.console.Console``; stdout by default). ``layers``: the
    per-layer tables; ``fold``: repeated layers as one row."""
    from rich.console import Console

    _print(console or Console(), sections(report, layers=layers, fold_layers=fold))


def to_text(report, width: int = 160, *, layers: bool = True, fold: bool = True) -> str:
    """The console rendering as plain text (no colours)."""
    from rich.console import Console

    console = Console(file=io.StringIO(), width=width, color_system=None, force_terminal=False)
    to_console(report, console, layers=layers, fold=fold)
    return console.file.getvalue()
