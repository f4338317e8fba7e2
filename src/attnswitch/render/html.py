"""The report as one self-contained HTML page: the recommendation first, then the summary (sortable),
the plots (inline SVG), the per-layer tables, the notes, the environment and the traces.

Needs no network and no other file to view; the only URL is the Perfetto link for the traces.
"""

from __future__ import annotations

import html
import math
import re
from pathlib import Path

from .document import CODE_SPAN, Bars, Block, Callout, Code, Figure, Heading, Section, Table, Text, code_text
from .page import CSS, SCRIPT
from .plots import draw, svg
from .sections import sections

__all__ = ["to_html", "write_html", "page_html", "figure_html"]

_URL = re.compile(r"https://[\w.\-/]*[\w/]")


def _inline(text: str) -> str:
    """Escaped text with `code` spans (``document.code``'s, a fence of several backticks too) and https links."""
    out = CODE_SPAN.sub(lambda m: f"<code>{code_text(m)}</code>", html.escape(text, quote=False))
    return _URL.sub(lambda m: f'<a href="{m.group(0)}">{m.group(0)}</a>', out)


def _table(t: Table) -> str:
    cls = [("text" if h in t.left else "num") for h in t.headers]
    head = "".join(f'<th scope="col" class="{c}">{html.escape(h)}</th>' for h, c in zip(t.headers, cls))
    body = []
    for i, row in enumerate(t.rows):
        cells = []
        for h, c, v in zip(t.headers, cls, row):
            value = html.escape(v)
            if h in t.links and v not in ("", "-"):
                value = f'<a href="{html.escape(v, quote=True)}">{value}</a>'
            cells.append(f'<td class="{c}">{value}</td>')
        body.append(f'<tr class="{t.kind(i)}">{"".join(cells)}</tr>')
    caption = f"<caption>{html.escape(t.title)}</caption>" if t.title else ""
    legend = f'<p class="legend">{html.escape(t.caption)}</p>' if t.caption else ""
    sortable = ' class="sortable"' if t.sortable else ""
    return (f'<div class="scroll"><table{sortable}>{caption}<thead><tr>{head}</tr></thead>'
            f'<tbody>{"".join(body)}</tbody></table></div>{legend}')


def _points(chart) -> int:
    if isinstance(chart, Bars):
        return sum(1 for _, vals in chart.series for v in vals if v is not None and math.isfinite(v))
    return sum(len(pts) for _, pts in chart.series)


def figure_html(fig: Figure, salt: str) -> str:
    """A figure block as ``<figure>`` with its chart inlined as SVG; ``data-points`` counts what it draws."""
    drawn = svg(draw(fig.chart), salt=salt)
    caption = f"<figcaption>{_inline(fig.caption)}</figcaption>" if fig.caption else ""
    return (f'<figure class="plot" data-points="{_points(fig.chart)}" aria-label="{html.escape(fig.chart.title)}">'
            f"{drawn}{caption}</figure>")


def _callout(c: Callout) -> str:
    detail = ('<ul class="detail">' + "".join(f"<li>{_inline(r)}</li>" for r in c.reasons) + "</ul>"
              if c.reasons else "")
    return (f'<div class="label">{html.escape(c.label)}</div><p class="headline">{_inline(c.headline)}</p>'
            f"{detail}")


def _section(s: Section, counter: list[int]) -> str:
    inner = _blocks(s.blocks, counter)
    if any(isinstance(b, Figure) for b in s.blocks) and all(isinstance(b, Figure | Text) for b in s.blocks):
        inner = f'<div class="plots">{inner}</div>'
    if s.collapsible:
        return (f'<details id="{html.escape(s.key)}"{" open" if s.open else ""}>'
                f"<summary>{html.escape(s.title)}</summary>{inner}</details>")
    cls = ' class="answer"' if any(isinstance(b, Callout) for b in s.blocks) else ""
    heading = f"<h2>{html.escape(s.title)}</h2>" if s.title else ""
    return f'<section id="{html.escape(s.key)}"{cls}>{heading}{inner}</section>'


def _blocks(blocks, counter: list[int]) -> str:
    out = []
    for b in blocks:
        if isinstance(b, Section):
            out.append(_section(b, counter))
        elif isinstance(b, Table):
            out.append(_table(b))
        elif isinstance(b, Figure):
            counter[0] += 1
            out.append(figure_html(b, salt=f"fig{counter[0]}"))
        elif isinstance(b, Callout):
            out.append(_callout(b))
        elif isinstance(b, Heading):
            out.append(f"<h{b.level + 1}>{html.escape(b.text)}</h{b.level + 1}>")
        elif isinstance(b, Text):
            out.append(f'<p class="{b.kind}">{_inline(b.text)}</p>')
        elif isinstance(b, Code):
            out.append(f'<pre class="code"><code>{html.escape(b.text)}</code></pre>')
    return "".join(out)


def _page(title: str, about: str, nav: list[tuple[str, str]], body: str) -> str:
    links = "".join(f'<a href="#{html.escape(k)}">{html.escape(t)}</a>' for k, t in nav)
    return (f'<!doctype html><html lang="en"><head><meta charset="utf-8">'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">'
            f"<title>{html.escape(title)}</title><style>{CSS}</style></head><body><main>"
            f"<header><h1>{html.escape(title)}</h1><p>{_inline(about)}</p><nav>{links}</nav></header>"
            f"{body}</main><script>{SCRIPT}</script></body></html>\n")


def page_html(blocks: list[Block]) -> str:
    """A page of blocks: a leading level-1 heading and text are its title and subtitle; each titled
    section gets a link at the top."""
    head = [b for b in blocks[:2] if isinstance(b, (Heading, Text))]
    rest = blocks[len(head):]
    title = head[0].text if head else "attnswitch report"
    about = head[1].text if len(head) > 1 else ""
    nav = [(s.key, s.title) for s in rest if isinstance(s, Section) and s.title]
    return _page(title, about, nav, _blocks(rest, [0]))


def to_html(report, *, fold: bool = True) -> str:
    """The report's page, as text: every section of ``sections(report)``, plots drawn here. ``fold``: repeated
    layers as one row."""
    return page_html(sections(report, fold_layers=fold))


def write_html(report, path: str | Path, *, fold: bool = True) -> Path:
    path = Path(path)
    path.write_text(to_html(report, fold=fold), encoding="utf-8")
    return path
