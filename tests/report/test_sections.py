"""The report you can decide on: verdicts, risk scores, plots sized to be read, sections."""

from __future__ import annotations

import json
import os
import re
import stat
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg

from privacylab.attacks.membership.result import MembershipResult
from privacylab.report import sections as section_registry
from privacylab.report.html import render_html, target_tables, write_report
from privacylab.report.metrics import membership_metrics
from privacylab.report.plots import (
    DPI,
    LEGEND_FONT_PT,
    histogram_figure,
    histogram_informative,
    line_style,
    privacy_utility_figure,
    roc_figure,
    roc_plot,
)
from privacylab.report.sections import register_section, sections
from privacylab.report.verdict import (
    DEFAULT_VERDICT_THRESHOLD,
    check_threshold,
    risk_scores,
    strongest_attack,
    target_verdict,
    tpr_lower_bound,
)

PNG = b"\x89PNG\r\n\x1a\n"
ATTACKS = (
    "loss", "confidence", "entropy", "modified-entropy", "shadow", "lira-online", "lira-offline",
    "rmia", "gap", "augmentation", "noise", "boundary", "boundary-cw",
)  # fmt: skip


def scored(name: str, strength: float, n: int = 1000, seed: int = 0) -> MembershipResult:
    """Gaussian scores shifted by `strength` for members; "gap" gets 0/1 scores."""
    rng = np.random.default_rng(seed)
    labels = np.r_[np.ones(n // 2, np.int64), np.zeros(n - n // 2, np.int64)]
    scores = strength * labels + rng.normal(0.0, 1.0, n)
    if name == "gap":
        scores = (scores > 0.0).astype(np.float64)
    return MembershipResult(name, scores, labels, "scores", queries=n, seconds=0.1)


def full_run(images: dict[str, bytes] | None = None) -> dict[str, Any]:
    """A payload shaped like `run_experiment`'s: a leaking non-private target with 13 attacks,
    a DP target with noise-level attacks, risk scores, the privacy–utility plot and audits."""
    targets = []
    for name, epsilon, scale in (("non-private", None, 1.0), ("dp-eps1", 1.0, 0.0)):
        results = [
            scored(a, scale * (0.2 + 0.25 * i), seed=i + (0 if epsilon is None else 100))
            for i, a in enumerate(ATTACKS)
        ]
        metrics = [
            {**membership_metrics(r).to_dict(), "members": int(r.membership.sum())} for r in results
        ]
        hists = {}
        if images is not None:
            images[f"roc_{name}.png"] = roc_figure(results, f"{name}: ROC (log-log)")
            for r in results:
                if histogram_informative(r):
                    hists[r.attack] = f"hist_{name}_{r.attack}.png"
                    images[hists[r.attack]] = histogram_figure(r, r.attack)
        labels = np.arange(len(results[0].scores)) % 10
        target = {
            "name": name,
            "epsilon": epsilon,
            "delta": None if epsilon is None else 1e-5,
            "accountant": None if epsilon is None else "pld",
            "train_accuracy": 1.0 if epsilon is None else 0.7,
            "test_accuracy": 0.9 if epsilon is None else 0.67,
            "members": 500,
            "nonmembers": 500,
            "references": 4,
            "attacks": metrics,
            "images": {"roc": f"roc_{name}.png", "histograms": hists},
            "risk": risk_scores(results, metrics, labels=labels, indices=labels + 1000),
        }
        target["verdict"] = target_verdict(target)
        targets.append(target)
    payload: dict[str, Any] = {
        "title": "privacylab membership report: digits, mlp",
        "dataset": "digits",
        "model": "mlp",
        "verdict_threshold": DEFAULT_VERDICT_THRESHOLD,
        "targets": targets,
        "audit": [
            {
                "method": "dirac",
                "epsilon_theory": 1.0,
                "epsilon_lower_bound": 0.4,
                "confidence": 0.95,
                "trials": 40,
                "seconds": 3.0,
                "violated": False,
                "audited_model": "logreg",
                "audited_dataset": "digits",
            },
        ],
        "notes": ["a note"],
    }
    if images is not None:
        images["privacy_utility.png"] = privacy_utility_figure(targets, threshold=0.002)
        payload["images"] = {"privacy_utility": "privacy_utility.png"}
    return payload


def test_verdict_uses_low_fpr_tpr_with_confidence_never_epsilon_bound() -> None:
    strong = {
        "attack": "rmia",
        "tpr_at_01pct_fpr": 0.083,
        "tpr_at_1pct_fpr": 0.14,
        "auc": 0.7,
        "epsilon_lower_bound": 2.6,
        "examples": 2000,
        "members": 1000,
    }
    gap = {"attack": "gap", "tpr_at_01pct_fpr": 0.0, "tpr_at_1pct_fpr": 0.0, "auc": 0.55,
           "epsilon_lower_bound": 9.0, "examples": 2000, "members": 1000}  # fmt: skip
    leaks = target_verdict({"attacks": [gap, strong]})
    assert leaks["attack"] == "rmia" and leaks["leaks"] is True
    assert 0.06 < leaks["tpr_lower_bound"] < 0.083
    assert strongest_attack([gap, strong]) is strong
    assert target_verdict({"attacks": [gap]})["leaks"] is False

    # 5 of 1,000 members is within noise of the 0.2% threshold for the best of 13 attacks
    noise = [{**strong, "attack": f"a{i}", "tpr_at_01pct_fpr": 0.005} for i in range(13)]
    assert target_verdict({"attacks": noise})["leaks"] is False
    assert target_verdict({"attacks": noise}, threshold=0.0)["leaks"] is True
    # one hit in a 60-member subsample does not outrank 83 hits in 1,000
    lucky = {**strong, "attack": "boundary", "tpr_at_01pct_fpr": 1 / 60, "members": 60}
    assert target_verdict({"attacks": [lucky, strong]})["attack"] == "rmia"
    # member count from the target when the attack lacks it
    counted = {k: v for k, v in strong.items() if k != "members"}
    assert target_verdict({"members": 1000, "nonmembers": 1000, "attacks": [counted]})["leaks"]
    assert target_verdict({"attacks": []})["leaks"] is None
    assert tpr_lower_bound(0.0, 100, 0.95) == 0.0
    for bad in (-0.1, 1.0, True, "x"):
        with pytest.raises(ValueError):
            check_threshold(bad)  # type: ignore[arg-type]


def test_risk_scores_rank_members_of_the_strongest_full_attack() -> None:
    results = [scored("loss", 0.5), scored("lira-online", 3.0, seed=1)]
    small = scored("boundary", 9.0, n=120, seed=2)
    metrics = [membership_metrics(r).to_dict() for r in [*results, small]]
    labels = np.arange(1000) % 10
    risk = risk_scores([*results, small], metrics, labels=labels, indices=np.arange(1000) + 7)
    assert risk is not None and risk["attack"] == "lira-online"
    assert len(risk["risk"]) == len(risk["label"]) == len(risk["member"]) == 1000
    assert min(risk["risk"]) > 0 and max(risk["risk"]) == 1.0
    top = risk["most_exposed"]
    assert len(top) == 10
    assert all(risk["member"][t["candidate"]] == 1 for t in top)
    assert [t["risk"] for t in top] == sorted((t["risk"] for t in top), reverse=True)
    assert all(t["index"] == t["candidate"] + 7 and t["label"] == t["candidate"] % 10 for t in top)
    none = risk_scores(results, metrics[:2], labels=labels)
    assert none is not None and none["index"] is None and none["most_exposed"][0]["index"] is None
    assert risk_scores([], [], labels=labels) is None


def test_histograms_only_where_informative() -> None:
    assert histogram_informative(scored("loss", 1.0))
    assert not histogram_informative(scored("gap", 1.0))
    spike = scored("boundary-cw", 1.0)
    spike.scores[:800] = 0.0
    assert not histogram_informative(spike)
    assert histogram_figure(scored("gap", 1.0), "gap").startswith(PNG)


def test_roc_legend_is_legible_below_the_axes_and_curves_differ() -> None:
    results = [scored(a, 0.2 * i, seed=i) for i, a in enumerate(ATTACKS)]
    fig = roc_plot(results, "roc")
    renderer = FigureCanvasAgg(fig).get_renderer()
    fig.draw(renderer)
    ax = fig.axes[0]
    legend = ax.get_legend()
    texts = legend.get_texts()
    assert len(texts) == len(ATTACKS) + 1
    assert all(t.get_fontsize() >= 9 for t in texts)
    assert LEGEND_FONT_PT >= 9
    # at the PNG's DPI, cap height of 10 pt text is over 9 px; the page shows it 1:1 or larger
    heights = [t.get_window_extent(renderer).height * DPI / fig.dpi for t in texts]
    assert min(heights) >= 9 * DPI / 72
    assert legend.get_window_extent(renderer).y1 <= ax.get_window_extent(renderer).y0
    handles = legend.legend_handles[1:]
    styles = {(line.get_color(), str(line.get_linestyle())) for line in handles}
    assert len(styles) == len(ATTACKS)
    assert len({line_style(i)[0] for i in range(16)}) == 16
    labels = [t.get_text() for t in texts[1:]]
    tprs = [float(re.search(r"TPR@0.1%FPR ([0-9.]+)", s).group(1)) for s in labels]  # type: ignore[union-attr]
    assert tprs == sorted(tprs, reverse=True)


def test_privacy_utility_plot() -> None:
    payload = full_run()
    assert privacy_utility_figure(payload["targets"]).startswith(PNG)
    only = [{"name": "non-private", "epsilon": None, "test_accuracy": 0.9, "attacks": []}]
    assert privacy_utility_figure(only, threshold=0.002).startswith(PNG)
    with pytest.raises(ValueError):
        privacy_utility_figure([])


def test_report_has_verdicts_sorted_tables_and_explanations(tmp_path: Path) -> None:
    images: dict[str, bytes] = {}
    payload = full_run(images)
    page = write_report(tmp_path, payload, images)
    text = page.read_text(encoding="utf-8")
    top = text.index('class="verdicts"')
    assert top < text.index('id="target-non-private"') < text.index('id="audit"')
    assert 'class="verdict leak"' in text and 'class="verdict pass"' in text
    assert "FAIL — leaks membership" in text and "PASS — below threshold" in text
    assert "wrongly accusing only 0.1% of non-members" in text
    assert "What the ε lower bound means" in text and "single operating point" in text
    assert "logistic regression on sklearn digits" in text and "not the targets above" in text
    # one table per target, attacks strongest first, target facts not repeated per row
    tables = re.findall(r'<table class="sortable">(.*?)</table>', text, re.S)
    assert len(tables) == 2
    for table in tables:
        rows = re.findall(r"<tr[^>]*>(.*?)</tr>", table.split("<tbody>")[1], re.S)
        assert len(rows) == len(ATTACKS)
        tpr = [float(re.findall(r'data-sort="([^"]*)"', r)[2]) for r in rows]
        assert tpr == sorted(tpr, reverse=True)
        assert "non-private" not in table and "dp-eps1" not in table
    assert text.count('class="strongest"') + text.count('class="strongest ') == 2
    # ROC full size on click; histograms collapsed, the 0/1 gap attack left out
    assert re.search(r'<a href="roc_non-private.png"[^>]*><img src="roc_non-private.png"', text)
    assert text.count("<details>") == 2 and "hist_non-private_gap.png" not in text
    assert "Left out as uninformative" in text and "gap" in text
    assert 'src="privacy_utility.png"' in text
    assert "Most exposed examples" in text and "dataset row" in text
    assert text.count("<script>") == 1
    for name in images:
        assert (tmp_path / name).is_file()

    loaded = json.loads((tmp_path / "results.json").read_text(encoding="utf-8"))
    target = loaded["targets"][0]
    assert target["verdict"]["leaks"] is True and loaded["verdict_threshold"] == 0.002
    assert len(target["risk"]["risk"]) == 1000 and len(target["risk"]["most_exposed"]) == 10
    for key in ("auc", "tpr_at_1pct_fpr", "tpr_at_01pct_fpr", "epsilon_lower_bound", "queries"):
        assert key in target["attacks"][0]
    assert (tmp_path / "results.json").stat().st_size < 200_000


def test_target_tables_group_and_sort(tmp_path: Path) -> None:
    tables = target_tables(full_run())
    assert [facts["target"] for facts, _ in tables] == ["non-private", "dp-eps1"]
    facts, rows = tables[0]
    assert facts["epsilon"] == "∞ (non-private)" and "target" not in rows[0]
    tpr = [float(r["tpr_at_01pct_fpr"]) for r in rows]
    assert tpr == sorted(tpr, reverse=True)


@pytest.fixture
def umask_022() -> Iterator[None]:
    old = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(old)


def test_report_files_are_0644(tmp_path: Path, umask_022: None) -> None:
    images: dict[str, bytes] = {"roc_a.png": roc_figure([scored("loss", 1.0)], "a")}
    write_report(tmp_path, {"targets": []}, images)
    for name in ("index.html", "results.json", "roc_a.png"):
        assert stat.S_IMODE((tmp_path / name).stat().st_mode) == 0o644, name


def test_a_new_family_is_one_registered_section(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    keys = [s.key for s in sections()]
    assert keys.index("membership") < keys.index("audit")
    monkeypatch.setattr(section_registry, "_REGISTRY", dict(section_registry._REGISTRY))

    @register_section
    class ExtractionSection:
        key, title, order = "extraction", "Model extraction", 30

        def applies(self, payload: Mapping[str, Any]) -> bool:
            return "extraction" in payload

        def render(self, folder: Path, payload: Mapping[str, Any]) -> str:
            return f'<section id="extraction"><h2>Model extraction</h2>{len(payload)}</section>'

    page = render_html(tmp_path, {**full_run(), "extraction": {}})
    assert page.index('id="membership"') < page.index('id="extraction"') < page.index('id="audit"')
    assert '<a href="#extraction">Model extraction</a>' in page
    assert 'id="extraction"' not in render_html(tmp_path, full_run())
    with pytest.raises(TypeError):
        register_section(int)  # type: ignore[arg-type]
