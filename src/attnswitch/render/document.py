"""The blocks a rendered report is made of; each writer (console, markdown, HTML) writes the same list."""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["Heading", "Table", "Text", "Block"]


@dataclass(frozen=True)
class Heading:
    text: str
    level: int = 2


@dataclass(frozen=True)
class Text:
    text: str
    kind: str = "plain"  # "plain", "note", "strong" (a recommendation), "error" (a backend that did not run)


@dataclass(frozen=True)
class Table:
    title: str
    headers: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]
    left: frozenset[str] = field(default_factory=frozenset)  # left-aligned columns; the rest are numbers


Block = Heading | Text | Table
