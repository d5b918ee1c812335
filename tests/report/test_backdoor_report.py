"""The backdoor report (`privacylab.report.backdoor`, section `#backdoor`) on synthetic payloads
shaped like `privacylab attack backdoor --json` and `privacylab defend backdoor --json` (no
training): runs merge by folder (attacks) and by folder and method (defences), tables by name,
other keys survive, concurrent writers lose nothing; the pictures it links exist and decode to
the arrays given (nearest-neighbour enlargement, checked pixel by pixel); Neural Cleanse's bars
are the MAD anomaly index recomputed here by hand; the verdict's numbers; hostile text is
escaped; bad payloads are refused in one line before anything is written."""

from __future__ import annotations

import html
import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from matplotlib.image import imread
from test_render_chromium import _render, chromium  # noqa: F401  (fixture)

from privacylab.errors import PrivacylabError
from privacylab.report._format import percent, safe_name
from privacylab.report.backdoor import (
    DISPLAY_PIXELS,
    MAX_INVERTED,
    NC_THRESHOLD,
    PUBLISHED_SOURCE,
    TABLE_FIGURES,
    BackdoorReportError,
    add_backdoor_run,
    anomaly_plot,
    attack_label,
    contrastive_series,
    nc_anomaly,
    nc_masks,
    nc_masks_plot,
    slug,
    verdict,
)
from privacylab.report.html import render_html
from privacylab.report.sections.backdoor import BackdoorSection

HOSTILE = '<script>alert("x")</script>&<img src=x onerror=1>'
SIDE = 28


def _trigger_image() -> np.ndarray:
    image = np.zeros((SIDE, SIDE))
    image[-4:, -4:] = np.array([[1, 0, 1, 0], [0, 1, 0, 1]] * 2, dtype=float)
    return image


def _clean_image() -> np.ndarray:
    return np.random.default_rng(0).random((SIDE, SIDE))


def attack(folder: str, **over: Any) -> dict[str, Any]:
    clean = _clean_image()
    entry = {
        "method": "badnets",
        "threat_model": {"access": "label", "knowledge": ["clean-data"]},
        "target_class": 0,
        "mode": "all-to-one",
        "trigger": {"spec": "square:4@corner"},
        "poisons": 35,
        "poison_rate": 0.01,
        "clean_accuracy": 0.971,
        "baseline_accuracy": 0.974,
        "asr": 0.992,
        "baseline_asr": 0.008,
        "z_score": None,
        "queries": 1000,
        "seconds": 12.3,
        "details": {},
        "folder": folder,
        "epsilon": None,
        "delta": 1e-5,
        "images": {
            "trigger": _trigger_image().tolist(),
            "clean_example": clean.tolist(),
            "triggered_example": np.maximum(clean, _trigger_image()).tolist(),
        },
    }
    entry.update(over)
    return entry


NORMS = [30.0, 31.0, 29.0, 33.0, 30.5, 32.0, 28.0, 31.5, 30.0, 29.5]


def nc_run(folder: str, flagged: int | None = 0, target: int = 0, **over: Any) -> dict[str, Any]:
    norms = list(NORMS)
    masks = []
    for k in range(10):
        mask = np.zeros((SIDE, SIDE))
        mask[:5, :6] = 0.9 if k == flagged else 0.1 * (k + 1)
        masks.append(mask.tolist())
    if flagged is not None:
        norms[flagged] = 6.0
    per_seed = [
        {"seed": s, "norms": [n + 0.5 * s * (k % 2) for k, n in enumerate(norms)]} for s in range(3)
    ]
    pattern = np.full((1, SIDE, SIDE), 0.5)
    entry = {
        "method": "neural-cleanse",
        "folder": folder,
        "detected": flagged is not None,
        "flagged_class": flagged,
        "anomaly_index": 12.0,
        "target_class": target,
        "correct_class": None if flagged is None else flagged == target,
        "before": {"accuracy": 0.97, "asr": 0.99},
        "after": {"accuracy": 0.96, "asr": 0.013, "rejected_clean": None},
        "seconds": 40.0,
        "details": {
            "classes": list(range(10)),
            "triggers": masks,
            "norms": norms,
            "per_seed": per_seed,
            "flagged_pattern": None if flagged is None else pattern.tolist(),
        },
    }
    entry.update(over)
    return entry


def strip_run(folder: str) -> dict[str, Any]:
    return {
        "method": "strip",
        "folder": folder,
        "detected": True,
        "flagged_class": 0,
        "anomaly_index": None,
        "target_class": 0,
        "correct_class": True,
        "before": {"accuracy": 0.97, "asr": 0.99},
        "after": {"accuracy": 0.95, "asr": 0.05},
        "seconds": 3.0,
        "details": {"frr": 0.01, "far": 0.02},
    }


TABLES = {
    "contrastive": [
        {"poisons": n, "asr": a + d, "z_score": z + d, "position": p, "seed": s}
        for n, a, z in ((0, 0.0, 0.1), (5, 0.3, 2.0), (20, 0.9, 6.0))
        for p in ("corner", "random")
        for s, d in ((0, 0.02), (1, -0.02))
    ],
    "badnets": [
        {"epsilon": None, "poison_rate": 0.005, "asr": 0.9, "poisons": 18},
        {"epsilon": None, "poison_rate": 0.01, "asr": 0.99, "poisons": 35},
        {"epsilon": 1.0, "poison_rate": 0.01, "asr": 0.2, "asr_bound": 1.0},
        {"epsilon": 8.0, "poison_rate": 0.01, "asr": 0.6, "asr_bound": 1.0},
    ],
    "trojan": [
        {"row": "weights", "Orig": 0.975, "Orig Dec": 0.004, "Orig+Tri": 0.97, "Ext+Tri": 0.99},
        {
            "group": "selection",
            "label": "random",
            "orig": 0.96,
            "orig_dec": 0.02,
            "orig_tri": 0.41,
            "ext_tri": 0.55,
            "phase_seconds": {"trigger_generation": 1.0, "data_generation": 2.0, "retraining": 3.0},
            "seed": {"orig": 57.3, "orig_dec": None, "orig_tri": 47.4, "ext_tri": 99.7},
        },
    ],
    "defenses": [{"method": "neural-cleanse", "detection_rate": 0.8, "false_positive_rate": 0.2}],
}


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One folder with a BadNets run, a trojan run, NC and STRIP on the BadNets run, and
    every kind of table (drawn once for the module)."""
    out = tmp_path_factory.mktemp("backdoor-report")
    add_backdoor_run(out, {"attack": attack(str(out / "badnets"))})
    rng = np.random.default_rng(1)
    trojan = attack(
        str(out / "trojan"),
        method="trojan",
        poisons=0,
        poison_rate=0.0,
        asr=0.97,
        details={
            "orig": 0.962,
            "orig_dec": 0.012,
            "orig_tri": 0.97,
            "ext_tri": 0.995,
            "selection": "weights",
            "mask": [[0.0, 1.0], [1.0, 0.0]],
            "phase_seconds": {
                "trigger_generation": 1.5,
                "data_generation": 7.25,
                "retraining": 3.0,
            },
        },
        trigger={
            "spec": "square:7@corner",
            "pattern": rng.random((1, SIDE, SIDE)).tolist(),
            "mask": np.ones((SIDE, SIDE)).tolist(),
        },
        images={
            "inverted": [rng.random((SIDE, SIDE)).tolist() for _ in range(MAX_INVERTED + 3)],
            "inverted_labels": list(range(MAX_INVERTED + 3)),
        },
    )
    add_backdoor_run(out, {"attack": trojan})
    add_backdoor_run(out, {"defense": nc_run(str(out / "badnets"))})
    add_backdoor_run(out, {"defense": strip_run(str(out / "badnets"))})
    add_backdoor_run(out, {"tables": TABLES})
    return out


def _results(folder: Path) -> dict[str, Any]:
    return json.loads((folder / "results.json").read_text(encoding="utf-8"))


def _section(folder: Path) -> str:
    page = (folder / "index.html").read_text(encoding="utf-8")
    found = re.search(r'<section id="backdoor">.*?</section>', page, re.S)
    assert found, "no backdoor section on the page"
    return found.group(0)


def test_every_linked_picture_exists_and_decodes(report: Path) -> None:
    section = _section(report)
    links = set(re.findall(r'src="([^"]+)"', section))
    block = _results(report)["backdoor"]
    names = {
        n
        for entry in block["attacks"] + block["defenses"]
        for k, n in entry["images"].items()
        if k != "inverted_count"
    }
    names |= set(block["images"].values())
    assert links == names
    assert len(links) == 3 + 2 + 3 + 2  # badnets 3, trojan trigger + grid, NC 3, curves 2
    for name in links:
        assert safe_name(name)
        pixels = imread(report / name)
        assert pixels.ndim == 3 and pixels.shape[0] > 20 and pixels.shape[1] > 20
        assert pixels[..., :3].std() > 0.01, f"{name} is blank"


def test_trigger_and_examples_are_the_arrays_enlarged_by_nearest_neighbour(report: Path) -> None:
    images = _results(report)["backdoor"]["attacks"][0]["images"]
    scale = DISPLAY_PIXELS // SIDE
    for key, want in (("trigger", _trigger_image()), ("clean_example", _clean_image())):
        pixels = imread(report / images[key])[..., 0]
        assert pixels.shape == (SIDE * scale, SIDE * scale)
        blocks = pixels.reshape(SIDE, scale, SIDE, scale)
        assert np.ptp(blocks, axis=(1, 3)).max() == 0.0, "not a nearest-neighbour enlargement"
        np.testing.assert_allclose(blocks[:, 0, :, 0], want, atol=2.5 / 255)  # 256-entry colormap


def test_learned_trojan_trigger_and_inversions_drawn_arrays_dropped(report: Path) -> None:
    trojan = _results(report)["backdoor"]["attacks"][1]
    assert trojan["trigger"] == {"spec": "square:7@corner", "learned": True}
    assert set(trojan["images"]) == {"trigger", "inverted", "inverted_count"}
    assert trojan["images"]["inverted_count"] == MAX_INVERTED
    section = _section(report)
    assert "generated trigger square:7@corner (learned)" in section
    assert f"reverse-engineered training images (first {MAX_INVERTED})" in section
    text = (report / "results.json").read_text(encoding="utf-8")
    assert len(text) < 20_000, "image arrays should not be stored in results.json"


def test_verdict_states_asr_poison_rate_and_accuracy_gap(report: Path) -> None:
    line = re.search(r'<p class="verdict">(.*?)</p>', _section(report)).group(1)
    assert line.startswith("Backdoored: ASR 99.2% at 1.0% poison (35 rows)")
    assert "clean accuracy within 0.3 points of the clean model (97.1% vs 97.4%)" in line
    assert "Neural Cleanse flagged class 0 (the target)" in line


def test_verdict_cases() -> None:
    weak = attack("a", asr=0.12, clean_accuracy=0.95, baseline_accuracy=0.9)
    assert verdict({"attacks": [weak]}).startswith("Not backdoored: ASR 12% at 1.0% poison")
    assert "accuracy 5.0 points above the clean model (95% vs 90%)" in verdict({"attacks": [weak]})
    worse = attack("a", clean_accuracy=0.697, baseline_accuracy=0.903)
    assert "accuracy 20.6 points below the clean model" in verdict({"attacks": [worse]})
    trojan = attack("t", method="trojan", poisons=0, poison_rate=0.0, baseline_accuracy=None)
    assert verdict({"attacks": [trojan]}) == (
        "Backdoored: ASR 99.2% after retraining; clean accuracy 97.1%."
    )
    clip = attack("c", method="clip-backdoor", asr=0.8, z_score=4.256)
    assert "backdoor z-score 4.26" in verdict({"attacks": [clip]})
    wrong = verdict({"defenses": [nc_run("a", flagged=3, target=0)]})
    assert wrong == "Neural Cleanse flagged class 3 (not the target 0)."
    assert verdict({"defenses": [nc_run("a", flagged=None)]}) == "Neural Cleanse found no backdoor."
    assert verdict({}) == "No backdoor run yet."


def test_neural_cleanse_bars_are_the_mad_anomaly_index(report: Path) -> None:
    run = next(
        d for d in _results(report)["backdoor"]["defenses"] if d["method"] == "neural-cleanse"
    )
    assert set(run["images"]) == {"masks", "anomaly", "flagged_trigger"}
    assert run["details"]["triggers"] == "drawn" and run["details"]["norms"][0] == 6.0
    assert run["details"]["flagged_pattern"] == "drawn"
    flagged = imread(report / run["images"]["flagged_trigger"])[..., 0]
    scale = DISPLAY_PIXELS // SIDE
    want = np.zeros((SIDE, SIDE))
    want[:5, :6] = 0.5 * 0.9  # the flagged class's mask times the pattern 0.5
    np.testing.assert_allclose(flagged[::scale, ::scale], want, atol=2.5 / 255)
    norms = np.array(run["details"]["norms"])
    median = np.median(norms)
    by_hand = np.abs(norms - median) / (1.4826 * np.median(np.abs(norms - median)))
    np.testing.assert_allclose(run["details"]["anomaly_indices"], by_hand, rtol=1e-12)
    anomaly = nc_anomaly(run["details"])
    fig = anomaly_plot(anomaly, list(range(10)), flagged=0)
    ax = fig.axes[0]
    heights = [p.get_height() for p in ax.patches]
    np.testing.assert_allclose(heights, by_hand, rtol=1e-12)
    seeds = []
    for r in run["details"]["per_seed"]:
        x = np.array(r["norms"])
        dev = np.abs(x - np.median(x))
        seeds.append(dev / (1.4826 * np.median(dev)))
    np.testing.assert_allclose(anomaly["low"], np.min(seeds, axis=0), rtol=1e-12)
    np.testing.assert_allclose(anomaly["high"], np.max(seeds, axis=0), rtol=1e-12)
    assert len(ax.collections) == 1, "whiskers: min and max over Neural Cleanse's seeds"
    lines = [ln for ln in ax.get_lines() if ln.get_linestyle() == "--"]
    assert [tuple(ln.get_ydata()) for ln in lines] == [(NC_THRESHOLD, NC_THRESHOLD)]
    red = [
        i
        for i, p in enumerate(ax.patches)
        if p.get_facecolor()[:3] == (214 / 255, 39 / 255, 40 / 255)
    ]
    assert red == [0], "only the flagged class below the median with index > 2 is red"
    assert "Anomaly index per class (threshold 2, dashed)" in _section(report)


def test_anomaly_over_seeds_is_the_mean_with_min_max_and_infinite_mad() -> None:
    seeds = [NORMS, [n + (3.0 if k == 2 else 0.0) for k, n in enumerate(NORMS)]]
    anomaly = nc_anomaly({"norms": seeds})
    per_seed = []
    for row in seeds:
        x = np.array(row)
        dev = np.abs(x - np.median(x))
        per_seed.append(dev / (1.4826 * np.median(dev)))
    np.testing.assert_allclose(anomaly["index"], np.mean(per_seed, axis=0))
    np.testing.assert_allclose(anomaly["high"], np.max(per_seed, axis=0))
    flat = nc_anomaly({"norms": {"0": 1.0, "1": 5.0, "2": 5.0, "3": 5.0}})
    assert np.isinf(flat["index"][0]) and flat["below"].tolist() == [True, False, False, False]
    fig = anomaly_plot(flat, [0, 1, 2, 3], flagged=0)
    assert any(t.get_text() == "∞" for t in fig.axes[0].texts)
    assert nc_anomaly({"norms": "nothing"}) is None and nc_anomaly({}) is None


def test_median_norm_index_outside_the_seeds_range_is_drawn() -> None:
    """Neural Cleanse's details from a real run: the index of the median norms (the bar) lies
    outside the per-seed indices' [min, max] for some classes; the whiskers reach the bar."""
    details = {
        "norms": [81.5496, 136.3949, 84.0674, 91.2568, 95.2125, 91.5978, 109.7192, 106.1717,
                  92.1523, 119.6988],
        "per_seed": [
            {"norms": [81.5496, 136.3949, 84.0674, 91.2568, 95.2125, 91.5978, 111.4524, 102.663,
                       95.4698, 120.635]},
            {"norms": [81.8354, 127.0589, 83.5335, 98.6976, 91.558, 89.0429, 107.3364, 106.1717,
                       92.1523, 119.4177]},
            {"norms": [79.1675, 138.5697, 84.8595, 84.1998, 96.0236, 93.163, 109.7192, 106.5669,
                       91.2442, 119.6988]},
        ],
    }  # fmt: skip
    anomaly = nc_anomaly(details)
    outside = (anomaly["index"] < anomaly["low"]) | (anomaly["index"] > anomaly["high"])
    assert outside.any()
    fig = anomaly_plot(anomaly, list(range(10)), flagged=None)
    heights = [p.get_height() for p in fig.axes[0].patches]
    np.testing.assert_allclose(heights, anomaly["index"])
    high = [i for i, h in enumerate(heights) if h > NC_THRESHOLD]
    assert high == [1] and not anomaly["below"][1], "only a class above the median exceeds 2"
    colours = {fig.axes[0].patches[i].get_facecolor()[:3] for i in high}
    assert colours == {(176 / 255, 176 / 255, 176 / 255)}, "not flaggable: drawn grey"


def test_masks_row_outlines_only_the_flagged_class() -> None:
    masks = nc_masks(nc_run("a", flagged=2)["details"])
    assert [k for k, _ in masks] == list(range(10))
    fig = nc_masks_plot(masks, flagged=2, target=0)
    widths = [ax.spines["top"].get_linewidth() for ax in fig.axes]
    assert widths[2] == 3.0 and all(w < 3.0 for i, w in enumerate(widths) if i != 2)
    assert fig.axes[0].get_title().startswith("class 0 (target)")
    assert fig.axes[3].get_title() == f"class 3\n|m|₁={np.abs(masks[3][1]).sum():.3g}"
    relabelled = nc_masks({"classes": [5, 7], "triggers": [m[1].tolist() for m in masks[:2]]})
    assert [k for k, _ in relabelled] == [5, 7]
    variants = (
        {"triggers": {"masks": {"1": masks[1][1].tolist(), "0": masks[0][1].tolist()}}},
        {"triggers": [{"mask": [m[1].tolist()]} for m in masks[:2]]},
    )
    for details in variants:
        got = nc_masks(details)
        assert [k for k, _ in got] == [0, 1]
        np.testing.assert_allclose(got[1][1], masks[1][1])


def test_tables_curves_and_published_numbers(report: Path) -> None:
    section = _section(report)
    for name in TABLE_FIGURES.values():
        assert f'src="{name}"' in section
    trojan = re.search(r'<table class="sortable backdoor-trojan">.*?</table>', section, re.S)
    head = re.findall(r'scope="col">([^<]*)<', trojan.group(0))
    seed_columns = ["row", "Orig", "Orig Dec", "Orig+Tri", "Ext+Tri"]
    assert head == [*seed_columns, "group", "trigger s", "data s", "retrain s"]
    cells = [
        c
        for r in re.findall(r"<tr>(.*?)</tr>", trojan.group(0), re.S)
        if (c := re.findall(r">([^<]*)</td>", r))
    ]
    assert cells[0][:5] == ["weights", "97.5%", "0.4%", "97%", "99%"]
    assert cells[1] == [
        "random",
        "96% (57.3%)",
        "2.0%",
        "41% (47.4%)",
        "55.0% (99.7%)",
        "selection",
        "1.000",
        "2.000",
        "3.000",
    ]
    assert "published, CIFAR-10, PreAct-ResNet18".lower() in section.lower()
    published = re.search(r'<table class="sortable backdoor-published">.*?</table>', section, re.S)
    rows = re.findall(r"<tr>(.*?)</tr>", published.group(0), re.S)
    cells = [c for r in rows if (c := re.findall(r">([^<]*)</td>", r))]
    nc10 = next(c for c in cells if c[0] == "neural-cleanse" and c[1] == "10%")
    assert nc10[3:] == ["95.0% → 1.3%", "removes"]
    spectral1 = next(c for c in cells if c[0] == "spectral" and c[1] == "1.0%")
    assert spectral1[4] == "fails"
    assert len(cells) == 8, "4 defences at 2 rates, each beside its attacked model"
    assert "PreAct-ResNet18" in PUBLISHED_SOURCE
    badnets = re.search(
        r'<table class="sortable backdoor-table-badnets">.*?</table>', section, re.S
    )
    eps = [
        c[0]
        for r in re.findall(r"<tr>(.*?)</tr>", badnets.group(0), re.S)
        if (c := re.findall(r">([^<]*)</td>", r))
    ]
    assert eps == ["∞", "∞", "1", "8"]
    runs = re.search(r'<table class="sortable backdoor-trojan-runs">.*?</table>', section, re.S)
    run = [
        c
        for r in re.findall(r"<tr>(.*?)</tr>", runs.group(0), re.S)
        if (c := re.findall(r">([^<]*)</td>", r))
    ]
    assert run == [
        [
            "trojan, square:7@corner",
            "96.2%",
            "1.2%",
            "97%",
            "99.5%",
            "weights",
            "1.500",
            "7.250",
            "3.000",
        ]
    ]
    attacks = re.search(r'<table class="sortable backdoor-attacks">.*?</table>', section, re.S)
    assert "35 (1.0%)" in attacks.group(0) and "97.1% (97.4%)" in attacks.group(0)
    assert "99.2% (0.8%)" in attacks.group(0) and ">∞<" in attacks.group(0)
    defences = re.search(r'<table class="sortable backdoor-defenses">.*?</table>', section, re.S)
    assert "0 ✓" in defences.group(0) and "99% → 1.3%" in defences.group(0)


def test_private_attack_shows_epsilon_and_the_group_privacy_bound(tmp_path: Path) -> None:
    entry = attack("runs/dp", epsilon=8.0, delta=1e-5, asr=0.6, asr_bound=0.93, images={})
    add_backdoor_run(tmp_path, {"attack": entry})
    cell = re.search(r'<td data-sort="8.0"[^>]*>[^<]*</td>', _section(tmp_path)).group(0)
    assert ">8 (δ=1e-05)<" in cell and "35 poisons: 93%" in cell
    assert "DP-SGD ε=8" in attack_label(dict(entry, label=None))


def test_nan_rates_are_missing_not_refused(tmp_path: Path) -> None:
    add_backdoor_run(tmp_path, {"attack": attack("runs/n", baseline_asr=float("nan"), images={})})
    stored = _results(tmp_path)["backdoor"]["attacks"][0]
    assert stored["baseline_asr"] is None
    assert "99.2%</td>" in _section(tmp_path)


def test_contrastive_series_average_seeds_per_number_of_poisons() -> None:
    series = contrastive_series(TABLES["contrastive"])
    assert set(series) == {"position=corner", "position=random"}
    corner = series["position=corner"]
    assert corner["poisons"] == [0, 5, 20]
    np.testing.assert_allclose(corner["asr"], [0.0, 0.3, 0.9], atol=1e-12)
    np.testing.assert_allclose(corner["z_score"], [0.1, 2.0, 6.0], atol=1e-12)


def test_merge_replaces_by_key_and_keeps_everything_else(tmp_path: Path) -> None:
    (tmp_path / "results.json").write_text(json.dumps({"title": "mine", "other": {"x": 1}}))
    add_backdoor_run(tmp_path, {"attack": attack("runs/a", images={})})
    add_backdoor_run(tmp_path, {"attack": attack("runs/b", asr=0.5, images={})})
    add_backdoor_run(tmp_path, {"attack": attack("runs/a", asr=0.61, images={})})
    add_backdoor_run(tmp_path, {"defense": strip_run("runs/a")})
    add_backdoor_run(tmp_path, {"defense": nc_run("runs/a", details={})})
    add_backdoor_run(tmp_path, {"defense": dict(strip_run("runs/a"), seconds=9.0)})
    add_backdoor_run(tmp_path, {"tables": {"badnets": TABLES["badnets"]}})
    add_backdoor_run(tmp_path, {"tables": {"trojan": TABLES["trojan"]}})
    add_backdoor_run(tmp_path, {"tables": {"badnets": TABLES["badnets"][:1]}})
    results = _results(tmp_path)
    assert results["title"] == "mine" and results["other"] == {"x": 1}
    block = results["backdoor"]
    assert [(a["folder"], a["asr"]) for a in block["attacks"]] == [
        ("runs/a", 0.61),
        ("runs/b", 0.5),
    ]
    assert [(d["method"], d["seconds"]) for d in block["defenses"]] == [
        ("strip", 9.0),
        ("neural-cleanse", 40.0),
    ]
    assert block["tables"]["badnets"] == TABLES["badnets"][:1]
    assert block["tables"]["trojan"] == TABLES["trojan"]
    assert block["images"] == {"badnets": TABLE_FIGURES["badnets"]}
    assert BackdoorSection().applies(results)
    assert 'id="backdoor"' in render_html(tmp_path, results)


def test_re_adding_a_stored_entry_keeps_its_pictures(report: Path, tmp_path: Path) -> None:
    for name in report.glob("backdoor-*.png"):
        (tmp_path / name.name).write_bytes(name.read_bytes())
    block = _results(report)["backdoor"]
    add_backdoor_run(tmp_path, {"attack": block["attacks"][0]})
    add_backdoor_run(tmp_path, {"defense": block["defenses"][0]})
    again = _results(tmp_path)["backdoor"]
    assert again["attacks"][0]["images"] == block["attacks"][0]["images"]
    assert again["defenses"][0]["images"] == block["defenses"][0]["images"]
    assert "is missing" not in _section(tmp_path)


def _add_one(args: tuple[str, int]) -> None:
    folder, i = args
    add_backdoor_run(folder, {"attack": attack(f"runs/{i}", images={})})


def test_concurrent_writers_lose_no_run(tmp_path: Path) -> None:
    import multiprocessing

    with multiprocessing.get_context("fork").Pool(4) as pool:
        pool.map(_add_one, [(str(tmp_path), i) for i in range(8)])
    folders = sorted(a["folder"] for a in _results(tmp_path)["backdoor"]["attacks"])
    assert folders == sorted(f"runs/{i}" for i in range(8))


def test_section_applies_only_to_backdoor_payloads(tmp_path: Path) -> None:
    section = BackdoorSection()
    assert not section.applies({})
    assert not section.applies({"backdoor": {}})
    assert not section.applies({"backdoor": {"attacks": [], "tables": {"x": []}}})
    assert not section.applies({"backdoor": "nonsense"})
    assert section.applies({"backdoor": {"tables": {"x": [{"a": 1}]}}})
    assert 'id="backdoor"' not in render_html(tmp_path, {"title": "t", "other": {}})


def test_hostile_text_is_escaped(tmp_path: Path) -> None:
    add_backdoor_run(tmp_path, {"attack": attack(f"runs/{HOSTILE}", label=HOSTILE, images={})})
    add_backdoor_run(tmp_path, {"defense": dict(strip_run(HOSTILE), method=HOSTILE)})
    add_backdoor_run(tmp_path, {"tables": {"other": [{HOSTILE: HOSTILE, "n": 1}]}})
    page = (tmp_path / "index.html").read_text(encoding="utf-8")
    assert "<script>alert" not in page and "<img src=x" not in page
    assert "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;" in page


def test_missing_picture_is_reported_not_linked(tmp_path: Path) -> None:
    add_backdoor_run(tmp_path, {"attack": attack("runs/a")})
    name = _results(tmp_path)["backdoor"]["attacks"][0]["images"]["trigger"]
    (tmp_path / name).unlink()
    results = _results(tmp_path)
    results["backdoor"]["attacks"][0]["images"]["clean_example"] = "../../etc/passwd"
    page = render_html(tmp_path, results)
    assert f'src="{name}"' not in page and "is missing" in page
    assert "passwd" not in page


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        ({"attack": attack("a"), "defense": nc_run("a")}, "exactly one of"),
        ({"nonsense": 1}, "exactly one of"),
        ({"attack": attack("")}, "needs the run's 'folder'"),
        ({"attack": attack("a", method=None)}, "needs a 'method'"),
        ({"attack": attack("a", asr=1.5)}, "['asr'] must be in [0, 1]"),
        ({"attack": attack("a", images={"trigger": [[float("nan")] * 3] * 3})}, "NaN"),
        ({"attack": attack("a", images={"trigger": np.zeros((5, 4, 4)).tolist()})}, "C = 1 or 3"),
        ({"attack": attack("a", images={"trigger": [[1, 2], [3]]})}, "array of numbers"),
        ({"attack": attack("a", images={"inverted": 3})}, "list of images"),
        ({"defense": nc_run("a", details={"triggers": [[["x"]]]})}, "array of numbers"),
        ({"tables": {"Bad Name": []}}, "table name"),
        ({"tables": {"badnets": [1, 2]}}, "list of mappings"),
        ({"tables": {}}, "non-empty mapping"),
    ],
)
def test_bad_payloads_are_one_line_and_write_nothing(
    tmp_path: Path, payload: dict[str, Any], message: str
) -> None:
    with pytest.raises(BackdoorReportError) as caught:
        add_backdoor_run(tmp_path / "out", payload)
    text = str(caught.value)
    assert message in text and "\n" not in text
    assert isinstance(caught.value, PrivacylabError)
    assert not (tmp_path / "out").exists()


@settings(max_examples=30, deadline=None)
@given(st.text(min_size=1, max_size=60), st.text(min_size=1, max_size=60))
def test_slug_is_a_safe_distinct_file_name(a: str, b: str) -> None:
    assert safe_name(slug(a)) and re.fullmatch(r"[A-Za-z0-9_-]+", slug(a))
    if a != b:
        assert slug(a) != slug(b)


unit = st.floats(min_value=0.0, max_value=1.0, allow_nan=False)


@settings(max_examples=40, deadline=None)
@given(st.text(max_size=40), unit, unit, unit)
def test_render_escapes_any_label_and_states_the_asr(
    label: str, asr: float, clean: float, base: float
) -> None:
    entry = attack("runs/x", label=label or None, asr=asr, clean_accuracy=clean, images={})
    entry["baseline_accuracy"] = base
    payload = {"backdoor": {"attacks": [entry]}}
    page = BackdoorSection().render(Path("/nonexistent"), payload)
    assert html.escape(label or "x", quote=True) in page  # the run column: label or folder
    line = re.search(r'<p class="verdict">(.*?)</p>', page).group(1)
    assert f"ASR {percent(asr)} " in html.unescape(line)
    assert html.unescape(line).startswith("Backdoored" if asr >= 0.5 else "Not backdoored")
    points = abs(clean - base) * 100
    assert f"{points:.1f} points" in line
    assert "<script" not in page.replace("&lt;script", "")


def test_page_renders_in_chromium_with_every_image(report: Path, chromium: str) -> None:  # noqa: F811
    probe, console = _render(chromium, report / "index.html", report / "profile")
    assert probe["errors"] == [] and console == []
    images = [i for i in probe["images"] if "backdoor-" in i["src"]]
    assert len(images) == 10 and all(i["loaded"] and i["shown"] > 0 for i in images)
    assert probe["verdicts"][0]["text"].startswith("Backdoored: ASR 99.2%")
