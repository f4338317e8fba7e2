"""Rendering a report: ``sections`` builds what it says once; console, markdown and HTML write it.

Reads report fields only (any report-shaped object), so results can offer ``print(report)``.
"""

from __future__ import annotations

from .console import to_console, to_text
from .html import to_html, write_html
from .markdown import to_markdown
from .sections import sections

__all__ = ["sections", "to_console", "to_text", "to_markdown", "to_html", "write_html"]
