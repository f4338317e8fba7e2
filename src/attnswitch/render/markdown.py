"""The report as markdown."""

from __future__ import annotations

from pathlib import Path

from .document import Heading, Table, Text
from .sections import sections

__all__ = ["to_markdown"]


def _cell(s: str) -> str:
    return s.replace("|", "\\|")


def _table(block: Table) -> list[str]:
    lines = [f"### {block.title}", ""] if block.title else []
    lines += ["| " + " | ".join(map(_cell, block.headers)) + " |", "|" + "---|" * len(block.headers)]
    lines += ["| " + " | ".join(map(_cell, row)) + " |" for row in block.rows]
    return lines


def to_markdown(report, path: str | Path | None = None) -> str:
    """The report as markdown text; written to ``path`` too when given."""
    lines: list[str] = []
    for block in sections(report):
        if isinstance(block, Heading):
            lines += ["#" * block.level + " " + block.text]
        elif isinstance(block, Table):
            lines += _table(block)
        elif isinstance(block, Text):
            text = block.text
            if block.kind == "strong" and ":" in text:
                head, _, rest = text.partition(":")
                text = f"**{head}:**{rest}"
            elif block.kind == "error":
                text = f"- {text}"
            lines.append(text)
        lines.append("")
    text = "\n".join(lines)
    if path is not None:
        Path(path).write_text(text)
    return text
