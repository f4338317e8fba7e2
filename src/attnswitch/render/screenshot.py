"""A report page in headless Chromium: a screenshot, or the DOM after the page's scripts ran.

    python -m attnswitch.render.screenshot report.html report.png [--width 1280 --height 900 | --full]

Uses the system's Chromium (Debian: ``apt-get install chromium``) on the local file; nothing else.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

__all__ = ["find_browser", "screenshot", "dump_dom", "page_height", "main"]

_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
# a fresh profile, no network of its own (updates, sync, QUIC probes); no sandbox, which needs
# user namespaces that containers and root often lack: the page is a local file we wrote
_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
          "--disable-background-networking", "--disable-component-update", "--disable-sync", "--hide-scrollbars",
          "--mute-audio", "--virtual-time-budget=3000")
_CONSOLE = re.compile(r":CONSOLE[:(]\d+\)?\] (.*)$")


def find_browser() -> str | None:
    """The path of a Chromium (or Chrome) on ``PATH``, or ``None``."""
    for name in _NAMES:
        path = shutil.which(name)
        if path:
            return path
    return None


def _run(args: list[str], html: str | Path, width: int, height: int, timeout: float):
    browser = find_browser()
    if browser is None:
        raise FileNotFoundError(f"no Chromium found ({', '.join(_NAMES)}); on Debian: apt-get install chromium")
    with tempfile.TemporaryDirectory(prefix="attnswitch-chromium-") as profile:
        cmd = [browser, *_FLAGS, f"--user-data-dir={profile}", f"--window-size={width},{height}", *args,
               Path(html).resolve().as_uri()]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)


def dump_dom(html: str | Path, width: int = 1280, height: int = 900, timeout: float = 90) -> tuple[str, list[str]]:
    """The page's DOM once its scripts ran, and the console messages Chromium logged meanwhile."""
    proc = _run(["--dump-dom", "--enable-logging=stderr", "--v=0"], html, width, height, timeout)
    if proc.returncode != 0 or "<html" not in proc.stdout:
        raise RuntimeError(f"chromium failed (exit {proc.returncode}): {proc.stderr[-2000:]}")
    console = [m.group(1) for line in proc.stderr.splitlines() if (m := _CONSOLE.search(line))]
    return proc.stdout, console


def page_height(html: str | Path, width: int = 1280, timeout: float = 90) -> int:
    """The height of the whole page laid out at ``width``, in CSS pixels."""
    text = Path(html).read_text(encoding="utf-8")
    probe = ('<script>addEventListener("load", function () { var p = document.createElement("pre"); '
             'p.id = "attnswitch-height"; p.textContent = document.documentElement.scrollHeight; '
             "document.body.appendChild(p); });</script>")
    with tempfile.TemporaryDirectory(prefix="attnswitch-page-") as tmp:
        copy = Path(tmp) / "page.html"
        copy.write_text(text.replace("</body>", probe + "</body>"), encoding="utf-8")
        dom, _ = dump_dom(copy, width, 900, timeout)
    m = re.search(r'id="attnswitch-height">(\d+)<', dom)
    if m is None:
        raise RuntimeError("the page did not report its height")
    return int(m.group(1))


def screenshot(html: str | Path, png: str | Path, width: int = 1280, height: int | None = 900,
               timeout: float = 90) -> Path:
    """A PNG of the page in a ``width`` x ``height`` window (the whole page when ``height`` is None)."""
    png = Path(png).resolve()
    if not Path(html).is_file():
        raise FileNotFoundError(f"{html}: no such page")
    height = page_height(html, width, timeout) if height is None else height
    # into a new file beside it, then over it: a failed capture leaves the PNG that was there
    with tempfile.TemporaryDirectory(prefix=".screenshot-", dir=png.parent) as tmp:
        shot = Path(tmp) / png.name
        # every compositor stage before the capture: without it, large inline SVGs come out half painted
        proc = _run(["--run-all-compositor-stages-before-draw", f"--screenshot={shot}"], html, width, height, timeout)
        if not shot.exists():
            raise RuntimeError(f"chromium wrote no screenshot (exit {proc.returncode}): {proc.stderr[-2000:]}")
        os.replace(shot, png)
    return png


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m attnswitch.render.screenshot", description=__doc__.splitlines()[0])
    p.add_argument("html")
    p.add_argument("png")
    p.add_argument("--width", type=int, default=1280)
    p.add_argument("--height", type=int, default=900)
    p.add_argument("--full", action="store_true", help="the whole page, not one window")
    a = p.parse_args(argv)
    try:
        out = screenshot(a.html, a.png, a.width, None if a.full else a.height)
    except (OSError, RuntimeError, subprocess.TimeoutExpired) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
