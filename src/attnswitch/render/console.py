"""The report on a terminal (rich), or as plain text for ``str(report)``.

A table fits the console's width and never loses a row's name: its name columns (``Table.name_columns``) print
whole on one line, and where the other columns do not fit beside them, the least important
(``Table.keep_order``) are left out, named in a dim line under the table. A header wraps (at spaces, or before
a ``/``) onto at most two lines rather than widen its column; numbers are never cut; a column of words (a
sweep's best) wraps at spaces only. The columns sit two spaces apart.

In a terminal, prose wraps at its width. Elsewhere (a pipe, a log, ``str(report)``) prose is never wrapped: a
line is as long as its text, so a recommendation copied out of a log is whole. No line ends in spaces. Plots,
the environment table and the trace list are the HTML page's.
"""

from __future__ import annotations

import io
import re

from .document import Block, Callout, Code, Figure, Heading, Section, Table, Text
from .sections import sections

__all__ = ["to_console", "to_text", "fit_header", "fit_columns", "TABLE_WIDTH"]

#: the width tables fit where the output is not a terminal and nothing says how wide it is (a pipe, a log,
#: ``str(report)``): wide enough for every column of a summary, even with long candidates' names
TABLE_WIDTH = 160

_STYLE = {"plain": "", "note": "dim", "strong": "bold", "error": "red"}  # of a text or a table row
_SKIP = frozenset({"plots", "environment", "traces"})  # sections the page shows and a terminal does not
_GAP = 2  # columns between two columns of a table


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


def _len(text: str) -> int:
    from rich.cells import cell_len

    return cell_len(text)


def _widths(block: Table, i: int) -> tuple[int, int]:
    """Column ``i``'s narrowest and natural width: a name or a number as wide as its longest cell, a column of
    words (left-aligned, not a name) as narrow as its longest word; a header no wider than needed."""
    cells = [row[i] for row in block.rows]
    natural = fit_header(block.headers[i], max(map(_len, cells), default=0))[1]
    if i < block.name_columns() or block.headers[i] not in block.left:
        return natural, natural
    longest_word = max((_len(w) for cell in cells for w in cell.split()), default=0)
    return fit_header(block.headers[i], longest_word)[1], natural


#: the columns kept first by their headers (``KEEP_FIRST``: the time, the margin) that every other column comes
#: after (a table of its own ``priority`` has none)
_ORDERED = 2


def fit_columns(block: Table, width: int) -> tuple[list[int], list[int]]:
    """The columns a table shows in ``width`` columns, and each one's width. The names always (however wide);
    then, most important first (``Table.keep_order``), every other column that still fits at its narrowest,
    except after a time or a margin that does not: the rows are in their order.
    Columns of words wrap only as far as they must: the widest first, never below their longest word."""
    ranges = [_widths(block, i) for i in range(len(block.headers))]
    shown = list(range(block.name_columns()))
    used = sum(ranges[i][0] for i in shown) + _GAP * (len(shown) - 1)
    for i in block.keep_order():
        if used + _GAP + ranges[i][0] <= width:
            shown.append(i)
            used += _GAP + ranges[i][0]
        elif not block.priority and block.keep_rank(i) < _ORDERED:
            break  # (no error column beside times ranked by a margin it cannot show)
    shown.sort()
    widths = {i: ranges[i][1] for i in shown}
    excess = sum(widths.values()) + _GAP * (len(shown) - 1) - width
    while excess > 0:  # narrow the widest column of words that can still give, one character at a time
        give = [i for i in shown if widths[i] > ranges[i][0]]
        if not give:
            break
        widest = max(give, key=lambda i: (widths[i], -i))
        widths[widest] -= 1
        excess -= 1
    return shown, [widths[i] for i in shown]


def _table(block: Table, width: int):
    """A rich table of the columns that fit ``width``, and the headers of those left out."""
    from rich import box
    from rich.table import Table as RichTable
    from rich.text import Text as RichText

    shown, widths = fit_columns(block, width)
    names = block.name_columns()
    t = RichTable(box=box.SIMPLE_HEAD, padding=(0, 1), collapse_padding=True, show_edge=False, pad_edge=False)
    for i, w in zip(shown, widths):
        h = block.headers[i]
        words = i >= names and h in block.left  # a column of words may wrap at spaces; names and numbers never
        t.add_column(RichText(fit_header(h, w)[0]), justify="left" if h in block.left else "right", width=w,
                     no_wrap=not words, overflow="fold")
    for r, row in enumerate(block.rows):
        t.add_row(*(RichText(row[i]) for i in shown), style=_STYLE.get(block.kind(r), ""))
    return t, [block.headers[i] for i in range(len(block.headers)) if i not in shown]


def _rstrip(line: list) -> list:
    """A rendered line's segments without the spaces at its end."""
    from rich.segment import Segment

    line = list(line)
    while line and not line[-1].control and not line[-1].text.rstrip():
        line.pop()
    if line and not line[-1].control:
        line[-1] = Segment(line[-1].text.rstrip(), line[-1].style)
    return line


def _print_table(console, block: Table, soft: bool) -> None:
    from rich.segment import Segment, Segments
    from rich.text import Text as RichText

    if block.title:
        console.print(RichText(block.title, style="bold"), soft_wrap=soft)
    table, left_out = _table(block, console.width)
    lines = console.render_lines(table, console.options.update_width(max(console.width, 1 << 14)), pad=False)
    # a table wider than the console (its names alone) prints whole: the terminal folds it, we never do
    console.print(Segments([s for line in lines for s in (*_rstrip(line), Segment.line())]), end="", crop=False,
                  soft_wrap=True)
    if block.caption and console.color_system is not None:  # "bold: ..." says nothing without bold
        console.print(RichText(block.caption, style="dim"), soft_wrap=soft)
    if left_out:
        console.print(RichText(f"left out at {console.width} columns: {', '.join(left_out)}; a wider terminal "
                               "shows them, as do report.md and report.html (--out)", style="dim"), soft_wrap=soft)


def _print(console, blocks: list[Block] | tuple[Block, ...]) -> None:
    from rich.text import Text as RichText

    soft = not console.is_terminal  # a pipe, a log: a line as long as its text
    for block in blocks:
        if isinstance(block, Section):
            if block.key in _SKIP:
                continue
            if block.title and not block.collapsible:  # a collapsible group's tables carry its name
                console.print(RichText(block.title, style="bold underline"), soft_wrap=soft)
            _print(console, block.blocks)
        elif isinstance(block, Table):
            _print_table(console, block, soft)
        elif isinstance(block, Callout):
            console.print(RichText(f"{block.label}: {block.headline}", style="bold"), soft_wrap=soft)
            for reason in block.reasons:
                console.print(RichText(f"  {reason}"), soft_wrap=soft)
        elif isinstance(block, Heading):
            console.print(RichText(block.text, style="bold" if block.level == 1 else "bold underline"),
                          soft_wrap=soft)
        elif isinstance(block, Text):
            console.print(RichText(block.text, style=_STYLE.get(block.kind, "")), soft_wrap=soft)
        elif isinstance(block, Code):
            for line in block.text.splitlines():
                # as it is: code is copied, never wrapped
                console.print(RichText(("    " + line).rstrip()), soft_wrap=True)
        elif isinstance(block, Figure):
            continue


def to_console(report, console=None, *, layers: bool = True, fold: bool = True) -> None:
    """Print the report on ``console`` (a ``rich.console.Console``; stdout by default). ``layers``: the
    per-layer tables; ``fold``: repeated layers as one row."""
    from rich.console import Console

    _print(console or Console(), sections(report, layers=layers, fold_layers=fold))


def to_text(report, width: int = TABLE_WIDTH, *, layers: bool = True, fold: bool = True) -> str:
    """The console rendering as plain text (no colours), as on an output that is not a terminal: tables fit
    ``width`` columns, prose is never wrapped."""
    from rich.console import Console

    console = Console(file=io.StringIO(), width=width, color_system=None, force_terminal=False)
    to_console(report, console, layers=layers, fold=fold)
    return console.file.getvalue()
