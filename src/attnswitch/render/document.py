"""The blocks a rendered report is made of; each writer (console, markdown, HTML) writes the same list.

Blocks are plain data. A writer shows what its medium can: a ``Figure`` is drawn by the HTML writer
and left out of text, a collapsible ``Section`` is a ``<details>`` in HTML and a plain group in text.
"""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass, field

__all__ = ["Heading", "Text", "Code", "Callout", "Table", "Bars", "Lines", "Figure", "Section", "Block", "Chart",
           "EMPTY", "NAMING", "KEEP_FIRST", "drop_empty_columns", "has_data", "walk", "code", "CODE_SPAN", "code_text"]

#: what a cell holds when there is nothing to show; a column of only these is left out
EMPTY = frozenset({"-", ""})

#: columns that, right after the first, tell a table's rows apart (a layer's phase, rank and GPU; a sweep's shape):
#: there they are part of each row's name
NAMING = frozenset({"phase", "rank", "GPU", "batch", "seq", "new", "prompt"})

#: by header, the columns a writer short of width keeps longest, most important first: the time and the margin
#: against the pick; the answer's own columns (the best backend, whether the output is right); then what explains
#: the time. Other columns follow in the table's order.
KEEP_FIRST = tuple(re.compile(p) for p in (
    r"time/.*|time ms|step ms|workload ms|GPU µs|host µs",
    r"vs pick|best",
    r".*max rel err|tokens agree|mismatch",
    r"ttft ms|step p50 ms|tokens/s|new-length step ms|compile s|pays after .*|forward ms|backward ms|"
    r"kernels/.*|comm µs",
))


def code(text: str) -> str:
    """``text`` as one inline code span (CommonMark's): fenced by more backticks than any run inside it, padded by
    a space where it starts or ends with one (a command whose path holds a backtick stays one span)."""
    runs = [len(r) for r in re.findall(r"`+", text)]
    fence = "`" * (max(runs, default=0) + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{fence}{pad}{text}{pad}{fence}"


#: an inline code span as ``code`` writes it: its fence, then its text (the writers' reading of it)
CODE_SPAN = re.compile(r"(?<!`)(`+)(?!`)(.+?)(?<!`)\1(?!`)")


def code_text(span: re.Match) -> str:
    """The text of a ``CODE_SPAN`` match: one space stripped from each end where both have one."""
    t = span.group(2)
    return t[1:-1] if len(t) > 1 and t.startswith(" ") and t.endswith(" ") and t.strip() else t


@dataclass(frozen=True)
class Heading:
    text: str
    level: int = 2


@dataclass(frozen=True)
class Text:
    text: str
    kind: str = "plain"  # "plain", "note", "strong", "error" (a backend that did not run)


@dataclass(frozen=True)
class Code:
    """Code to copy as it is (a snippet that runs)."""

    text: str
    language: str = "python"


@dataclass(frozen=True)
class Callout:
    """The answer a report gives (the recommendation): ``label: headline``, then its reasons, a line each."""

    label: str
    headline: str
    reasons: tuple[str, ...] = ()


@dataclass(frozen=True)
class Table:
    title: str
    headers: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]
    left: frozenset[str] = field(default_factory=frozenset)  # left-aligned columns; the rest are numbers
    row_kinds: tuple[str, ...] = ()  # per row: "plain", "strong" (best, heaviest), "error", "note" (did not run)
    caption: str = ""  # what the marked rows mean
    sortable: bool = True  # HTML: sort by clicking a header
    links: frozenset[str] = field(default_factory=frozenset)  # columns of relative paths, links in HTML
    # how many leading columns name a row: a writer shows them whole, whatever its width. None: the first, and
    # the ``NAMING`` columns right after it
    names: int | None = None
    # per column, where a writer short of width must leave some out: lowest kept longest. (): by header
    # (``KEEP_FIRST``), then in the table's order
    priority: tuple[int, ...] = ()

    def kind(self, i: int) -> str:
        return self.row_kinds[i] if i < len(self.row_kinds) else "plain"

    def name_columns(self) -> int:
        """How many leading columns name a row (at least one)."""
        if self.names is not None:
            return max(1, min(self.names, len(self.headers)))
        n = 1
        while n < len(self.headers) and self.headers[n] in NAMING:
            n += 1
        return n

    def keep_rank(self, i: int) -> int:
        """How long column ``i`` is kept: 0 longest (``priority``, else its header's place in ``KEEP_FIRST``)."""
        if self.priority:
            return self.priority[i]
        return next((r for r, p in enumerate(KEEP_FIRST) if p.fullmatch(self.headers[i])), len(KEEP_FIRST))

    def keep_order(self) -> tuple[int, ...]:
        """The columns after the names, the one to keep longest first."""
        return tuple(sorted(range(self.name_columns(), len(self.headers)), key=lambda i: (self.keep_rank(i), i)))


@dataclass(frozen=True)
class Bars:
    """Bars per category (a backend), one value per category in each series; ``None`` is no bar."""

    title: str
    categories: tuple[str, ...]
    series: tuple[tuple[str, tuple[float | None, ...]], ...]
    y_label: str
    stacked: bool = False
    log: bool = False
    limit: tuple[float | None, ...] = ()  # a reference per category (a tolerance), drawn as a dashed line
    limit_label: str = ""
    annotate: bool = False  # write each value above its bar
    errors: tuple[tuple[float, float] | None, ...] = ()  # per category, the interval (low, high) of its bar


@dataclass(frozen=True)
class Lines:
    """One line per series through ``(x, y)`` points."""

    title: str
    x_label: str
    y_label: str
    series: tuple[tuple[str, tuple[tuple[float, float], ...]], ...]
    log_x: bool = False
    log_y: bool = False


Chart = Bars | Lines


@dataclass(frozen=True)
class Figure:
    chart: Chart
    caption: str = ""


@dataclass(frozen=True)
class Section:
    """A titled group of blocks. ``key`` names it for anchors and tests; a ``collapsible`` one is a
    ``<details>`` in HTML (open when ``open``), titled by its own content in text writers."""

    title: str
    blocks: tuple[Block, ...]
    key: str = ""
    collapsible: bool = False
    open: bool = False


Block = Heading | Text | Code | Callout | Table | Figure | Section


def _finite(v) -> bool:
    return v is not None and math.isfinite(v)


def has_data(chart: Chart) -> bool:
    """Whether a chart would draw anything: a non-zero bar, or a line with a point."""
    if isinstance(chart, Bars):
        return bool(chart.categories) and any(_finite(v) and v != 0 for _, vals in chart.series for v in vals)
    return any(_finite(x) and _finite(y) for _, pts in chart.series for x, y in pts)


def drop_empty_columns(table: Table, keep: int = 1) -> Table:
    """The table without the columns in which every row is empty (``-``); the first ``keep`` stay."""
    cols = [i for i in range(len(table.headers))
            if i < keep or any(row[i] not in EMPTY for row in table.rows)]
    if not table.rows or len(cols) == len(table.headers):
        return table
    headers = tuple(table.headers[i] for i in cols)
    rows = tuple(tuple(row[i] for i in cols) for row in table.rows)
    names = None if table.names is None else sum(i < table.names for i in cols)
    priority = tuple(table.priority[i] for i in cols) if table.priority else ()
    return dataclasses.replace(table, headers=headers, rows=rows, left=table.left & set(headers),
                               links=table.links & set(headers), names=names, priority=priority)


def walk(blocks):
    """Every block, sections' contents included, in reading order."""
    for b in blocks:
        yield b
        if isinstance(b, Section):
            yield from walk(b.blocks)
