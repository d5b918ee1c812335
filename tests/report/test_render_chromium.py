"""The HTML report renders in headless Chromium with no console error and every image loaded.

Method: a probe script is inserted at the top of <head> of a copy of the page (in the same
folder, so relative image links resolve the same way). It records uncaught errors, unhandled
promise rejections, resource load failures (capture-phase "error" events) and console.error /
console.warn calls, and on "load" writes them and each <img>'s naturalWidth into a data attribute
of <html>; `--dump-dom` prints the DOM after load. As a second net, Chromium's stderr log
(`--enable-logging=stderr`) must hold no CONSOLE line: the report's one script (table sorting)
logs nothing, so any console message at all is a fault. Both checks are shown to fire on a
deliberately broken page (a thrown error and a missing image).

The screenshot test renders a full report at 1400 px, reads each plot's and each verdict box's
place from the probe, and checks the pixels of the screenshot there: a plot must not be blank
(non-white fraction and pixel spread), and the ROC legend's text, measured in the PNG by
matplotlib and scaled to the size Chromium shows it at, must be at least 9 pt (12 CSS px). The
blank-plot check is shown to fire on a white PNG.
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
from test_defenses_section import defenses_payload, twelve
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
    function box(el) {
      var r = el.getBoundingClientRect();
      return {x: r.left + window.scrollX, y: r.top + window.scrollY, w: r.width, h: r.height};
    }
    var images = Array.prototype.map.call(document.images, function (img) {
      return {src: img.getAttribute("src"), loaded: img.complete && img.naturalWidth > 0,
              width: img.naturalWidth, alt: img.getAttribute("alt"), shown: img.clientWidth,
              box: box(img), collapsed: !!img.closest("details:not([open])"),
              link: img.parentElement.tagName === "A" ?
                img.parentElement.getAttribute("href") : null};
    });
    var verdicts = Array.prototype.map.call(document.querySelectorAll(".verdict"),
      function (v) { return {text: v.textContent, box: box(v)}; });
    document.documentElement.setAttribute(
      "data-probe", JSON.stringify({errors: errors, images: images, verdicts: verdicts,
                                    height: document.documentElement.scrollHeight}));
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


def _render(
    chromium: str, page: Path, profile: Path, width: int = 1400
) -> tuple[dict[str, Any], list[str]]:
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
        f"--window-size={width},1000",
        "--force-device-scale-factor=1",
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
    from privacylab.report.defenses import defense_frontier_figure

    images: dict[str, bytes] = {}
    payload = make_payload(images, dp_bound=1.7)
    payload["defenses"] = defenses_payload(twelve(), 0.005)
    images["defense_frontier.png"] = defense_frontier_figure(twelve(), 0.005)
    page = write_report(tmp_path / "report", payload, images)
    probe, console = _render(chromium, page, tmp_path / "profile")
    assert probe["errors"] == []
    assert console == []
    assert len(probe["images"]) == len(images) == 4
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
    assert [
        {k: image[k] for k in ("src", "loaded", "width", "alt")} for image in probe["images"]
    ] == [{"src": "missing.png", "loaded": False, "width": 0, "alt": "missing"}]
    assert any("Error: x" in line for line in console), console


def _screenshot(chromium: str, page: Path, profile: Path, size: tuple[int, int]) -> Path:
    shot = page.with_name("screenshot.png")
    command = [
        chromium,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        f"--user-data-dir={profile}",
        "--hide-scrollbars",
        "--force-device-scale-factor=1",
        "--virtual-time-budget=5000",
        f"--window-size={size[0]},{size[1]}",
        f"--screenshot={shot}",
        page.as_uri(),
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0 and shot.is_file(), done.stderr[-2000:]
    return shot


def _blank(pixels: Any) -> bool:
    """Whether an RGB crop shows (nearly) nothing: under 2% non-white pixels or no spread."""
    import numpy as np

    gray = np.asarray(pixels, dtype=np.float64)[..., :3].mean(axis=-1)
    return bool(gray.size == 0 or (gray < 235).mean() < 0.02 or gray.std() < 8.0)


def test_screenshot_shows_verdicts_and_legible_nonblank_plots(
    chromium: str, tmp_path: Path
) -> None:
    import numpy as np
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from PIL import Image
    from test_sections import ATTACKS, full_run, scored

    from privacylab.report.plots import DPI, roc_plot

    images: dict[str, bytes] = {}
    page = write_report(tmp_path / "report", full_run(images), images)
    probe, console = _render(chromium, page, tmp_path / "profile")
    assert probe["errors"] == [] and console == []
    shot = _screenshot(chromium, page, tmp_path / "profile2", (1400, int(probe["height"]) + 20))
    pixels = np.asarray(Image.open(shot).convert("RGB"))
    assert not _blank(pixels)

    def crop(box: dict[str, float]) -> Any:
        x, y = int(box["x"]), int(box["y"])
        return pixels[y : y + int(box["h"]), x : x + int(box["w"])]

    assert len(probe["verdicts"]) == 2
    assert "FAIL" in probe["verdicts"][0]["text"] and "PASS" in probe["verdicts"][1]["text"]
    for verdict in probe["verdicts"]:
        assert verdict["box"]["y"] < 600 and not _blank(crop(verdict["box"]))

    shown = [i for i in probe["images"] if not i["collapsed"]]
    assert any(i["collapsed"] and i["src"].startswith("hist_") for i in probe["images"])
    rocs = [i for i in shown if i["src"].startswith("roc_")]
    assert len(rocs) == 2 and any(i["src"] == "privacy_utility.png" for i in shown)
    for image in shown:
        assert image["loaded"] and image["link"] == image["src"], image
        assert not _blank(crop(image["box"])), f"{image['src']} is blank on the page"

    # legend text height in the PNG, scaled to the width Chromium shows the PNG at
    fig = roc_plot([scored(a, 0.2 * i, seed=i) for i, a in enumerate(ATTACKS)], "roc")
    renderer = FigureCanvasAgg(fig).get_renderer()
    fig.draw(renderer)
    texts = fig.axes[0].get_legend().get_texts()
    png_px = min(t.get_window_extent(renderer).height for t in texts) * DPI / fig.dpi
    for roc in rocs:
        scale = roc["shown"] / roc["width"]
        assert png_px * scale >= 12.0, f"legend text {png_px * scale:.1f} CSS px tall"

    white = np.full((200, 300, 3), 255, dtype=np.uint8)
    white[100, 10:20] = 0
    assert _blank(white)
