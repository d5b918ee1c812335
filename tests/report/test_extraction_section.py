"""The model-extraction report section: curves figure, run/exact/detection tables, and a
render in headless Chromium with no console error and the figure loaded."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from test_render_chromium import _render, chromium  # noqa: F401  (fixture)

from privacylab.report.extraction import curve_points, extraction_curves_plot, row_label
from privacylab.report.html import render_html, write_report
from privacylab.report.sections import sections


def _row(method: str, defense: str = "none", **extra: Any) -> dict[str, Any]:
    curve = [
        {"queries": q, "accuracy": 0.2 + 0.7 * i / 4, "fidelity": 0.25 + 0.7 * i / 4}
        for i, q in enumerate((62, 125, 250, 500, 1000))
    ]
    return {
        "method": method,
        "access": "label",
        "queries": 1000,
        "seconds": 1.25,
        "accuracy": curve[-1]["accuracy"],
        "fidelity": curve[-1]["fidelity"],
        "victim_accuracy": 0.93,
        "curve": curve,
        "stopped": None,
        "params": {},
        "defense": defense,
        "defended": defense != "none",
        "output": "scores",
        "precision": "float32",
        **extra,
    }


def payload() -> dict[str, Any]:
    exact = _row(
        "relu-exact",
        output="logits",
        precision="float64",
        max_weight_error=3.2e-12,
        max_output_error_log2=-33.7,
        neurons_recovered=16,
        neurons_total=16,
        neurons_missed=0,
    )
    exact["curve"] = []
    rows = [
        _row("knockoff"),
        _row("knockoff", "prada", watch="prada", detected=True, queries_until_detection=140),
        _row("jacobian", "prada", watch="prada", detected=False, queries_until_detection=None),
        exact,
        {
            **_row("random", "budget:50"),
            "accuracy": None,
            "fidelity": None,
            "curve": [],
            "queries": 50,
            "error": "query budget of 50 examples exhausted",
            "watch": "budget:50",
            "detected": True,
            "queries_until_detection": 50,
        },
    ]
    return {
        "title": "extraction",
        "extraction": {
            "target": {"target": "runs/mlp", "name": "mlp", "dataset": "digits", "model": "mlp",
                       "input_shape": [1, 8, 8], "num_classes": 10, "parameters": 1210,
                       "pool_rows": 180, "eval_rows": 180},
            "queries": 1000,
            "attacks": rows,
            "images": {"curves": "extraction_curves.png"},
        },
    }  # fmt: skip


def test_section_is_registered_and_applies_only_to_runs() -> None:
    (section,) = [s for s in sections() if s.key == "model-extraction"]
    assert section.applies(payload())
    assert not section.applies({"extraction": {}})
    assert not section.applies({"extraction": {"attacks": []}})
    assert not section.applies({})


def test_figure_has_one_curve_per_row_dashed_when_defended() -> None:
    rows = payload()["extraction"]["attacks"]
    fig = extraction_curves_plot(rows)
    fidelity, accuracy = fig.axes[:2]
    lines = [ln for ln in fidelity.get_lines()]
    # the failed run has no point; the exact run has its final point only
    assert len(lines) == 4
    styles = {ln.get_label(): ln.get_linestyle() for ln in lines}
    assert styles[row_label(rows[0])] == "-" and styles[row_label(rows[1])] == "--"
    knock = lines[0]
    assert np.allclose(knock.get_xdata(), [62, 125, 250, 500, 1000])
    assert np.allclose(knock.get_ydata(), [p["fidelity"] for p in rows[0]["curve"]])
    assert fidelity.get_xscale() == "log"
    victim = [ln for ln in accuracy.get_lines() if ln.get_label() == "victim's accuracy"]
    assert victim and victim[0].get_ydata()[0] == pytest.approx(0.93)
    # colour per method: both knockoff curves share one
    assert lines[0].get_color() == lines[1].get_color() != lines[2].get_color()


def test_curve_points_fall_back_to_the_final_result() -> None:
    row = payload()["extraction"]["attacks"][3]
    assert curve_points(row) == [(1000.0, row["accuracy"], row["fidelity"])]
    assert curve_points({"queries": 0, "curve": []}) == []


def _table(page: str, klass: str) -> list[list[str]]:
    found = re.search(rf'<table class="sortable {klass}">(.*?)</table>', page, re.S)
    assert found, klass
    rows = re.findall(r"<tr[^>]*>(.*?)</tr>", found.group(1), re.S)
    return [re.findall(r"<t[dh][^>]*>(.*?)</t[dh]>", r, re.S) for r in rows]


def test_tables_show_runs_exact_recovery_and_detection(tmp_path: Path) -> None:
    from privacylab.report.extraction import extraction_curves_figure

    data = payload()
    (tmp_path / "extraction_curves.png").write_bytes(
        extraction_curves_figure(data["extraction"]["attacks"])
    )
    page = render_html(tmp_path, data)
    assert '<section id="model-extraction">' in page
    assert '<a href="#model-extraction">Model extraction</a>' in page
    runs = _table(page, "extraction-runs")
    assert runs[0][:4] == ["method", "output", "defence", "queries"]
    assert runs[1][:6] == ["knockoff", "scores", "none", "1000", "0.900", "0.950"]
    assert len(runs) == 1 + 5
    exact = _table(page, "extraction-exact")
    assert exact[0][3:7] == ["neurons recovered", "neurons", "missed", "unobservable"]
    assert exact[1][:9] == ["relu-exact", "none", "1000", "16", "16", "0", "—", "3.2e-12", "-33.7"]
    detection = _table(page, "extraction-detection")
    assert [r[2:5] for r in detection[1:]] == [
        ["prada", "yes", "140"],
        ["prada", "no", "—"],
        ["budget:50", "yes", "50"],
    ]
    assert "stopped before a copy was made: query budget of 50 examples exhausted" in page
    assert 'src="extraction_curves.png"' in page


def test_missing_figure_is_said_not_broken(tmp_path: Path) -> None:
    page = render_html(tmp_path, payload())
    assert "image extraction_curves.png is missing" in page


def test_report_renders_in_chromium(chromium: str, tmp_path: Path) -> None:  # noqa: F811
    from privacylab.report.extraction import extraction_curves_figure

    data = payload()
    images = {"extraction_curves.png": extraction_curves_figure(data["extraction"]["attacks"])}
    page = write_report(tmp_path / "report", data, images)
    probe, console = _render(chromium, page, tmp_path / "profile")
    assert probe["errors"] == [] and console == []
    assert len(probe["images"]) == 1
    (image,) = probe["images"]
    assert image["loaded"] and image["width"] > 300 and image["alt"]
