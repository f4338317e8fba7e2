"""The HTML page's inline style and script: the page needs no network and no other file."""

from __future__ import annotations

__all__ = ["CSS", "SCRIPT"]

CSS = """
:root { --fg: #1d2330; --muted: #5c6577; --line: #dde1e8; --accent: #2563eb; --bad: #b42318; --bg-alt: #f6f7f9; }
* { box-sizing: border-box; }
body { margin: 0; color: var(--fg); background: #fff;
       font: 15px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, "DejaVu Sans", sans-serif; }
main { max-width: 1200px; margin: 0 auto; padding: 20px 28px 48px; }
header h1 { font-size: 22px; margin: 0 0 2px; }
header p { margin: 0; color: var(--muted); font-size: 13px; }
nav { margin: 10px 0 0; font-size: 13px; }
nav a { color: var(--accent); text-decoration: none; margin-right: 14px; }
h2 { font-size: 18px; margin: 30px 0 10px; padding-bottom: 4px; border-bottom: 1px solid var(--line); }
code { font: 0.92em/1.3 ui-monospace, "DejaVu Sans Mono", monospace; background: var(--bg-alt); padding: 0 3px;
       border-radius: 3px; }
.answer { margin: 18px 0 6px; padding: 14px 18px; border-left: 5px solid var(--accent); background: #eef3fe;
          border-radius: 4px; }
.answer .label { font-size: 12px; text-transform: uppercase; letter-spacing: .06em; color: var(--muted); }
.answer .headline { font-size: 22px; font-weight: 650; margin: 2px 0 4px; }
.answer .detail { margin: 0; padding-left: 20px; }
.scroll { overflow-x: auto; }
pre.code { background: var(--bg-alt); padding: 8px 12px; border-radius: 4px; overflow-x: auto; font-size: 13px; }
pre.code code { padding: 0; }  /* (inline code's padding would shift a block's first line alone) */
table { border-collapse: collapse; font-size: 13px; margin: 4px 0; }
caption { text-align: left; font-weight: 600; padding: 4px 0; }
th, td { padding: 4px 9px; border-bottom: 1px solid var(--line); white-space: nowrap; }
th { background: var(--bg-alt); text-align: right; font-weight: 600; vertical-align: bottom; white-space: normal; }
th.text, td.text { text-align: left; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
table.sortable th { cursor: pointer; user-select: none; }
table.sortable th::after { content: "\\00a0\\2195"; color: #aab; }
table.sortable th[aria-sort="ascending"]::after { content: "\\00a0\\25B2"; color: var(--accent); }
table.sortable th[aria-sort="descending"]::after { content: "\\00a0\\25BC"; color: var(--accent); }
tbody tr:hover { background: #fafbfc; }
tr.strong td { font-weight: 650; }
tr.strong td:first-child { box-shadow: inset 3px 0 0 var(--accent); }
tr.error td { color: var(--bad); }
tr.note td { color: #9aa1ad; }
p.legend, p.note { color: var(--muted); font-size: 13px; margin: 4px 0 10px; }
p.error { color: var(--bad); }
.plots { display: flex; flex-wrap: wrap; gap: 20px 36px; align-items: flex-start; }
figure.plot { margin: 0; display: table; max-width: 100%; }
figure.plot svg { display: block; max-width: 100%; height: auto; }
figure.plot figcaption { display: table-caption; caption-side: bottom; color: var(--muted); font-size: 13px; }
.plots > p.note { flex-basis: 100%; }
details { margin: 6px 0; border: 1px solid var(--line); border-radius: 4px; padding: 4px 12px; }
details > summary { cursor: pointer; font-weight: 600; padding: 4px 0; }
"""

# Sort a table by the clicked column: numbers by value, text alphabetically, empty cells ("-") and words
# in a number column (a backend that did not run) last in both directions.
SCRIPT = """
(function () {
  function key(cell, numeric) {
    var t = cell.textContent.trim();
    if (!numeric) return t === "-" ? null : t;
    var m = t.match(/^[-+]?(\\d+\\.?\\d*|\\.\\d+)(e[-+]?\\d+)?/i);
    return m ? parseFloat(m[0]) : null;
  }
  function sortBy(th) {
    var table = th.closest("table"), col = th.cellIndex, numeric = th.classList.contains("num");
    var dir = th.getAttribute("aria-sort") === "ascending" ? -1 : 1;
    table.querySelectorAll("th").forEach(function (h) { h.removeAttribute("aria-sort"); });
    th.setAttribute("aria-sort", dir > 0 ? "ascending" : "descending");
    var body = table.tBodies[0], rows = Array.prototype.slice.call(body.rows);
    rows.sort(function (a, b) {
      var x = key(a.cells[col], numeric), y = key(b.cells[col], numeric);
      if (x === null || y === null) return (x === null) - (y === null);
      return dir * (numeric ? x - y : x.localeCompare(y));
    });
    rows.forEach(function (r) { body.appendChild(r); });
  }
  document.querySelectorAll("table.sortable th").forEach(function (th) {
    th.tabIndex = 0;
    th.addEventListener("click", function () { sortBy(th); });
    th.addEventListener("keydown", function (e) {
      if (e.key === "Enter" || e.key === " ") { e.preventDefault(); sortBy(th); }
    });
  });
})();
"""
