"""The report as markdown (everything but the plots, which are the HTML page's)."""

from __future__ import annotations

import re
from pathlib import Path

from .document import Block, Callout, Code, Heading, Section, Table, Text
from .sections import sections

__all__ = ["to_markdown"]

_SKIP = frozenset({"plots"})


def _plain(s: str) -> str:
    """Text shown as it is, not read as markdown (a model's path in the title: ``<b>``, a backtick, ``*``)."""
    return re.sub(r"([\\`*_\[\]<>&|#])", r"\\\1", s)


def _cell(s: str) -> str:
    return s.replace("|", "\\|")


def _table(block: Table) -> list[str]:
    lines = [f"### {block.title}", ""] if block.title else []
    lines += ["| " + " | ".join(map(_cell, block.headers)) + " |", "|" + "---|" * len(block.headers)]
    for i, row in enumerate(block.rows):
        cells = [f"[{_cell(v)}]({v})" if h in block.links and v not in ("", "-") else _cell(v)
                 for h, v in zip(block.headers, row)]
        if block.kind(i) == "strong":
            cells[0] = f"**{cells[0]}**"
        lines.append("| " + " | ".join(cells) + " |")
    return lines + (["", block.caption] if block.caption else [])


def _lines(blocks, level: int) -> list[str]:
    lines: list[str] = []
    for block in blocks:
        if isinstance(block, Section):
            if block.key in _SKIP:
                continue
            if block.title and not block.collapsible:  # a collapsible group's tables carry its name
                lines += ["#" * level + " " + block.title, ""]
            lines += _lines(block.blocks, level + 1)
            continue
        if isinstance(block, Heading):
            lines.append("#" * block.level + " " + _plain(block.text))  # (a heading holds no markup)
        elif isinstance(block, Table):
            lines += _table(block)
        elif isinstance(block, Callout):
            lines.append(f"**{block.label}: {block.headline}**")
            if block.reasons:
                lines += [""] + [f"- {r}" for r in block.reasons]
        elif isinstance(block, Text):
            lines.append(f"- {block.text}" if block.kind == "error" else block.text)
        elif isinstance(block, Code):
            lines += [f"```{block.language}", block.text, "```"]
        else:  # a figure: drawn in the HTML page only
            continue
        lines.append("")
    return lines


def to_markdown(report, path: str | Path | None = None, *, fold: bool = True) -> str:
    """The report as markdown text; written to ``path`` too when given. ``fold``: repeated layers as one row."""
    blocks: list[Block] = sections(report, fold_layers=fold)
    text = "\n".join(_lines(blocks, 2))
    if path is not None:
        Path(path).write_text(text)
    return text
