"""PNG plots and the JSON + HTML report files."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from privacylab.attacks.membership.result import MembershipResult
from privacylab.report.html import SUMMARY_COLUMNS, summary_table_rows, write_report
from privacylab.report.metrics import membership_metrics
from privacylab.report.plots import histogram_figure, roc_figure, save_png

PNG = b"\x89PNG\r\n\x1a\n"


def make_result(name: str, strength: float, n: int = 400, seed: int = 0) -> MembershipResult:
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 2, n)
    scores = strength * labels + rng.normal(0.0, 1.0, n)
    return MembershipResult(
        attack=name, scores=scores, membership=labels, access="scores", queries=n, seconds=0.25
    )


def make_payload(images: dict[str, bytes] | None = None, dp_bound: float = 0.2) -> dict[str, Any]:
    results = [make_result("lira-online", 2.0), make_result("loss", 0.5, seed=1)]
    dp_metrics = membership_metrics(make_result("loss", 0.1, seed=2)).to_dict()
    dp_metrics["epsilon_lower_bound"] = dp_bound
    if images is not None:
        images["roc_non-private.png"] = roc_figure(results, "non-private")
        for r in results:
            images[f"hist_non-private_{r.attack}.png"] = histogram_figure(r, r.attack)
    return {
        "title": "Report <b>&</b> co",
        "dataset": "digits",
        "model": "mlp",
        "created": "2026-11-22T10:00:00+00:00",
        "seconds": 12.5,
        "targets": [
            {
                "name": "non-private",
                "epsilon": None,
                "delta": None,
                "accountant": None,
                "train_accuracy": 1.0,
                "test_accuracy": 0.9,
                "attacks": [membership_metrics(r).to_dict() for r in results],
                "images": {
                    "roc": "roc_non-private.png",
                    "histograms": {r.attack: f"hist_non-private_{r.attack}.png" for r in results},
                },
            },
            {
                "name": "dp-eps1",
                "epsilon": 1.0,
                "delta": 1e-5,
                "accountant": "rdp",
                "train_accuracy": 0.8,
                "test_accuracy": float("nan"),
                "attacks": [dp_metrics],
            },
        ],
        "notes": ["<script>alert(1)</script>"],
    }


def test_plots_are_png() -> None:
    results = [make_result("a", 1.0), make_result("b", 3.0, seed=3)]
    assert roc_figure(results, "roc").startswith(PNG)
    assert histogram_figure(results[0], "hist").startswith(PNG)
    constant = MembershipResult(
        attack="c",
        scores=np.r_[np.inf, np.zeros(9)],
        membership=np.r_[1, np.zeros(9)],
        access="labels",
        queries=10,
    )
    assert histogram_figure(constant, "constant").startswith(PNG)
    with pytest.raises(ValueError):
        roc_figure([], "empty")


def test_save_png(tmp_path: Path) -> None:
    data = histogram_figure(make_result("a", 1.0), "h")
    path = save_png(data, tmp_path / "sub" / "h.png")
    assert path.read_bytes() == data
    with pytest.raises(ValueError, match="not PNG"):
        save_png(b"GIF89a", tmp_path / "x.png")


def test_write_report_files_and_json_round_trip(tmp_path: Path) -> None:
    images: dict[str, bytes] = {}
    payload = make_payload(images)
    page = write_report(tmp_path / "out", payload, images)
    folder = page.parent
    assert page.name == "index.html"
    loaded = json.loads((folder / "results.json").read_text(encoding="utf-8"))
    assert loaded["targets"][1]["test_accuracy"] is None
    assert loaded["targets"][0]["attacks"] == payload["targets"][0]["attacks"]
    assert loaded["title"] == payload["title"]
    for name, data in images.items():
        assert (folder / name).read_bytes() == data
    assert not list(folder.glob("*.tmp"))

    text = page.read_text(encoding="utf-8")
    assert text.count("<script") == 1 and "<script>" in text
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in text.split("<script>")[0]
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in text
    assert "Report &lt;b&gt;&amp;&lt;/b&gt; co" in text
    assert not re.search(r"""(?:src|href)\s*=\s*["']?(?:https?:)?//""", text)
    assert "∞ (non-private)" in text
    imgs = re.findall(r"<img [^>]*>", text)
    assert len(imgs) == 3
    for tag in imgs:
        src = re.search(r'src="([^"]+)"', tag)
        alt = re.search(r'alt="([^"]+)"', tag)
        assert src and alt and alt.group(1).strip()
        assert (folder / src.group(1)).is_file()


def test_violation_row_is_highlighted(tmp_path: Path) -> None:
    rows = summary_table_rows(make_payload(dp_bound=1.7))
    assert [r["violation"] for r in rows] == [False, False, True]
    assert all(key in rows[0] for key, _ in SUMMARY_COLUMNS)
    assert rows[2]["epsilon"].startswith("1 ")
    text = write_report(tmp_path, make_payload(dp_bound=1.7), {}).read_text(encoding="utf-8")
    assert len(re.findall(r'<tr class="[^"]*\bviolation\b', text)) == 1
    text = write_report(tmp_path, make_payload(dp_bound=0.3), {}).read_text(encoding="utf-8")
    assert not re.search(r'<tr class="[^"]*\bviolation\b', text)


def test_missing_keys_and_missing_images_are_tolerated(tmp_path: Path) -> None:
    payload: dict[str, Any] = {"targets": [{"name": "t", "images": {"roc": "absent.png"}}, 3]}
    rows = summary_table_rows(payload)
    assert len(rows) == 1 and rows[0]["auc"] == "—"
    text = write_report(tmp_path, payload, {}).read_text(encoding="utf-8")
    assert "<img" not in text
    assert "absent.png is missing" in text
    assert write_report(tmp_path / "empty", {}, {}).is_file()
    assert summary_table_rows({}) == []


def test_bad_image_names_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="plain file name"):
        write_report(tmp_path, {}, {"../evil.png": PNG})
    with pytest.raises(ValueError, match="plain file name"):
        write_report(tmp_path, {}, {"results.json": PNG})


def test_audit_section_is_a_table_with_violations_marked(tmp_path) -> None:
    from privacylab.report.html import render_html

    audit = [
        {"method": "dirac", "epsilon_theory": 4.0, "epsilon_lower_bound": 3.1, "confidence": 0.95,
         "trials": 200, "seconds": 12.0, "violated": False},
        {"method": "<b>clipbkd</b>", "epsilon_theory": 1.0, "epsilon_lower_bound": 2.0,
         "confidence": 0.95, "trials": 200, "seconds": 3.0, "violated": True},
    ]  # fmt: skip
    page = render_html(tmp_path, {"title": "t", "targets": [], "audit": audit})
    section = page[page.index('<section id="audit">') :]
    assert section.count("<tr") == 3
    assert section.count('class="violation"') == 1
    assert "&lt;b&gt;clipbkd&lt;/b&gt;" in section and "<b>clipbkd" not in section
    assert re.findall(r"<td[^>]*>(pass|FAIL)</td>", section) == ["pass", "FAIL"]
