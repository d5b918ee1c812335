"""The HTML report renders in headless Chromium with no console error and every image loaded.

Method: a probe script is inserted at the top of <head> of a copy of the page (in the same
folder, so relative image links resolve the same way). It records uncaught errors, unhandled
promise rejections, resource load failures (capture-phase "error" events) and console.error /
console.warn calls, and on "load" writes them and each <img>'s naturalWidth into a data attribute
of <html>; `--dump-dom` prints the DOM after load. As a second net, Chromium's stderr log
(`--enable-logging=stderr`) must hold no CONSOLE line: the report has no scripts of its own, so
any console message at all is a fault. Both checks are shown to fire on a deliberately broken
page (a thrown error and a missing image).
"""

from __future__ import annotations

import html
import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from test_plots_html import make_payload

from privacylab.report.html import write_report

_PROBE = """<script>
(function () {
  var errors = [];
  window.addEventListener("error", function (e) {
    var t = e.target;
    if (t && t !== window && t.tagName) {
      errors.push("resource " + t.tagName + " " + (t.currentSrc || t.src || t.href || ""));
    } else {
      errors.push("error " + e.message);
    }
  }, true);
  window.addEventListener("unhandledrejection", function (e) {
    errors.push("rejection " + e.reason);
  });
  ["error", "warn"].forEach(function (level) {
    var original = console[level];
    console[level] = function () {
      errors.push("console." + level + " " + Array.prototype.join.call(arguments, " "));
      return original.apply(console, arguments);
    };
  });
  window.addEventListener("load", function () {
    var images = Array.prototype.map.call(document.images, function (img) {
      return {src: img.getAttribute("src"), loaded: img.complete && img.naturalWidth > 0,
              width: img.naturalWidth, alt: img.getAttribute("alt")};
    });
    document.documentElement.setAttribute(
      "data-probe", JSON.stringify({errors: errors, images: images}));
  });
})();
</script>"""


def _chromium() -> str | None:
    for candidate in ("/usr/bin/chromium", "chromium", "chromium-browser"):
        found = shutil.which(candidate)
        if found:
            return found
    return None


@pytest.fixture(scope="module")
def chromium() -> str:
    found = _chromium()
    if found is None:
        reason = "headless Chromium not installed (apt-get install -y chromium)"
        if os.environ.get("CI", "").strip().lower() not in {"", "0", "false", "no"}:
            pytest.fail(f"{reason}; CI is set, so the render test must run")
        pytest.skip(reason)
    return found


def _render(chromium: str, page: Path, profile: Path) -> tuple[dict[str, Any], list[str]]:
    text = page.read_text(encoding="utf-8")
    probed = page.with_name("probe_" + page.name)
    probed.write_text(re.sub(r"<head>", "<head>" + _PROBE, text, count=1), encoding="utf-8")
    command = [
        chromium,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={profile}",
        "--enable-logging=stderr",
        "--v=0",
        "--run-all-compositor-stages-before-draw",
        "--virtual-time-budget=5000",
        "--dump-dom",
        probed.as_uri(),
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, f"chromium exited {done.returncode}: {done.stderr[-2000:]}"
    found = re.search(r'<html[^>]*\sdata-probe="([^"]*)"', done.stdout)
    assert found, f"probe did not run; stdout starts {done.stdout[:300]!r}"
    probe = json.loads(html.unescape(found.group(1)))
    console = [line for line in done.stderr.splitlines() if ":CONSOLE" in line]
    return probe, console


def test_report_renders_without_errors(chromium: str, tmp_path: Path) -> None:
    images: dict[str, bytes] = {}
    page = write_report(tmp_path / "report", make_payload(images, dp_bound=1.7), images)
    probe, console = _render(chromium, page, tmp_path / "profile")
    assert probe["errors"] == []
    assert console == []
    assert len(probe["images"]) == len(images) == 3
    for image in probe["images"]:
        assert image["loaded"] and image["width"] > 0, image
        assert image["alt"]


def test_probe_detects_a_broken_page(chromium: str, tmp_path: Path) -> None:
    folder = tmp_path / "broken"
    folder.mkdir()
    page = folder / "index.html"
    page.write_text(
        "<!DOCTYPE html><html><head><title>broken</title></head><body>"
        '<img src="missing.png" alt="missing"><script>throw new Error("x")</script>'
        "</body></html>",
        encoding="utf-8",
    )
    probe, console = _render(chromium, page, tmp_path / "profile")
    assert any("Error: x" in e for e in probe["errors"]), probe
    assert any(e.startswith("resource IMG") and "missing.png" in e for e in probe["errors"]), probe
    assert probe["images"] == [
        {"src": "missing.png", "loaded": False, "width": 0, "alt": "missing"}
    ]
    assert any("Error: x" in line for line in console), console
