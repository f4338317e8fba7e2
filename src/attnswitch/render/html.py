"""The report as one self-contained HTML page."""

from __future__ import annotations

import html
from pathlib import Path

from .markdown import to_markdown
from .plots import figures

__all__ = ["to_html", "write_html"]


def to_html(report) -> str:
    md = html.escape(to_markdown(report))
    imgs = "\n".join(f'<h3>{html.escape(t)}</h3><img alt="{html.escape(t)}" src="data:image/png;base64,{b64}">'
                     for t, b64 in figures(report))
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>attnswitch report</title>"
            f"<style>body{{font-family:sans-serif;max-width:1100px;margin:2em auto}}pre{{font-size:12px}}</style>"
            f"</head><body><h1>attnswitch report</h1>{imgs}<h2>Tables</h2><pre>{md}</pre></body></html>")


def write_html(report, path: str | Path) -> Path:
    path = Path(path)
    path.write_text(to_html(report))
    return path
