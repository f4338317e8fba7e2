"""The HTML report in a real browser (headless Chromium, ``apt-get install chromium``): no console errors,
the summary table and the plots are there and drawn, the recommendation is above the fold of a 1280x900
window, and clicking a header sorts the rows. Skipped where no Chromium is installed."""

import html
import json
import re
import struct
from pathlib import Path

import pytest

from attnswitch.render import screenshot as browser
from attnswitch.render.document import Figure, walk
from attnswitch.render.sections import sections
from attnswitch.results import Report

pytestmark = pytest.mark.skipif(browser.find_browser() is None,
                                reason="no Chromium (/usr/bin/chromium): apt-get install chromium")

ROOT = Path(__file__).resolve().parents[1]
WIDTH, FOLD = 1280, 900

# before the page's own code: every error the page meets is kept (exceptions, console.error, a resource
# that failed to load, a rejected promise)
HOOK = """<script>
window.__errors = [];
addEventListener("error", function (e) {
  __errors.push(e.message || "failed to load " + (e.target && (e.target.src || e.target.href)));
}, true);
addEventListener("unhandledrejection", function (e) { __errors.push("unhandled rejection: " + e.reason); });
(function (orig) {
  console.error = function () { __errors.push([].join.call(arguments, " ")); return orig.apply(console, arguments); };
})(console.error);
</script>"""

# after it: what a reader would see, and the summary sorted by clicks, written into the DOM as JSON
PROBE = """<script>
addEventListener("load", function () {
  var out = {errors: __errors, viewport: [innerWidth, innerHeight],
             pageWidth: document.documentElement.scrollWidth};
  var rec = document.getElementById("recommendation"), r = rec && rec.getBoundingClientRect();
  out.recommendation = r ? {top: r.top + scrollY, bottom: r.bottom + scrollY} : null;
  var table = document.querySelector("#summary table.sortable");
  function column(c) { return [].map.call(table.tBodies[0].rows, function (row) {
    return row.cells[c].textContent.trim(); }); }
  var heads = [].map.call(table.tHead.rows[0].cells, function (th) { return th.textContent.trim(); });
  var time = heads.indexOf("time/fwd ms"), th = table.tHead.rows[0].cells;
  out.rows = column(0).length;
  th[time].click(); out.ascending = {names: column(0), times: column(time)};
  th[time].click(); out.descending = {names: column(0), times: column(time)};
  th[0].click(); out.byName = column(0);
  out.figures = [].map.call(document.querySelectorAll("figure.plot"), function (f) {
    var box = f.querySelector("svg").getBoundingClientRect();
    return {points: +f.dataset.points, width: box.width, height: box.height, drawn: f.querySelectorAll("path").length};
  });
  var pre = document.createElement("pre"); pre.id = "probe"; pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
});
</script>"""


def _probe(report, tmp_path) -> tuple[dict, list[str]]:
    page = report.write_html(tmp_path / "report.html").read_text()
    assert page.count("<head>") == 1 and page.count("</body>") == 1
    probed = page.replace("<head>", "<head>" + HOOK).replace("</body>", PROBE + "</body>")
    (tmp_path / "probed.html").write_text(probed)
    dom, console = browser.dump_dom(tmp_path / "probed.html", WIDTH, FOLD)
    m = re.search(r'<pre id="probe">(.*?)</pre>', dom, re.S)
    assert m, "the page's load handler never ran"
    return json.loads(html.unescape(m.group(1))), console


def _number(cell: str):
    m = re.match(r"[-+]?\d+(\.\d+)?(e[-+]?\d+)?", cell)
    return float(m.group(0)) if m else None


@pytest.fixture(params=["h200 prefill", "cpu"])
def report(request, cpu_report):
    if request.param == "cpu":
        return cpu_report
    return Report.from_json(ROOT / "benchmarks/results/h200/compare_prefill.json")


def test_the_page_in_a_browser(report, tmp_path):
    out, console = _probe(report, tmp_path)
    assert out["errors"] == [] and console == []
    assert out["viewport"][0] == WIDTH and out["pageWidth"] <= WIDTH  # nothing wider than the window
    # the answer first: the recommendation lies within the first screen. Positions are measured from the
    # top of the page laid out 1280 wide (the page has no height-relative sizes), whatever height the
    # headless window was given
    assert 0 <= out["recommendation"]["top"] < out["recommendation"]["bottom"] <= FOLD
    assert out["rows"] == len(report.backends)
    # every plot is drawn at a readable size, with data
    figures = [b for b in walk(sections(report)) if isinstance(b, Figure)]
    assert len(out["figures"]) == len(figures) > 0
    for f in out["figures"]:
        assert f["points"] > 0 and f["drawn"] > 0 and f["width"] >= 300 and f["height"] >= 150
    # sorting: numbers by value both ways; a backend that did not run stays last
    ran = [b.backend for b in report.backends if b.ok]
    for order, reverse in (("ascending", False), ("descending", True)):
        times = [_number(t) for t in out[order]["times"]]
        known = [t for t in times if t is not None]
        assert known == sorted(known, reverse=reverse) and len(known) == len(ran)
        assert times[len(known):] == [None] * (len(times) - len(known))
    assert out["ascending"]["names"][0] == min(ran, key=lambda n: report[n].time_ms)
    assert out["byName"] == sorted(b.backend for b in report.backends)


def _png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()[:24]
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", data[16:24])


def test_screenshot_of_a_report(tmp_path):
    rep = Report.from_json(ROOT / "benchmarks/results/h200/compare_prefill.json")
    page = rep.write_html(tmp_path / "report.html")
    assert _png_size(browser.screenshot(page, tmp_path / "shot.png")) == (WIDTH, FOLD)
    full = browser.screenshot(page, tmp_path / "full.png", height=None)
    assert _png_size(full)[1] == browser.page_height(page) > FOLD

