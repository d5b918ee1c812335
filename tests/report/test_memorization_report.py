"""The memorization report (`privacylab.report.memorization` and its section): a run merged
into a folder draws originals above decodings as one PNG (the PSNR under each decoding
recomputed here from a known pixel error), the page holds the section, the picture and the
runs table; a re-run of a folder replaces its entry, other folders and other families' blocks
are kept; the verdict line from its closed form; benchmark tables; bad payloads refused in one
line with nothing written."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from matplotlib.image import imread

from privacylab.report.backdoor import add_backdoor_run
from privacylab.report.memorization import (
    MemorizationReportError,
    add_memorization_run,
    pairs_plot,
    verdict,
)
from privacylab.report.sections.memorization import MemorizationSection


def _images(n: int = 3, noise: float = 0.1) -> dict[str, list]:
    rng = np.random.default_rng(0)
    original = rng.uniform(0.2, 0.8, size=(n, 1, 8, 8))
    return {
        "original": original.tolist(),
        "decoded": (original + noise).tolist(),
        "requantized": rng.uniform(0, 1, size=(n, 1, 8, 8)).tolist(),
    }


def entry(folder: str = "/runs/lsb", **changes: object) -> dict:
    base = {
        "folder": folder,
        "method": "lsb",
        "label": "lsb, 100 × 512 bits, non-private",
        "clean_accuracy": 0.90,
        "honest_accuracy": 0.91,
        "items": 8,
        "recovered": 7,
        "bit_accuracy": 0.995,
        "exact_match": 0.5,
        "psnr": 41.25,
        "queries": 0,
        "bits_per_parameter": 0.0957,
        "bits_per_query": None,
        "epsilon": None,
        "checks": {
            "lsb-entropy": {
                "statistic": 40.0,
                "threshold": 10.0,
                "flagged": True,
                "honest_statistic": 2.0,
                "honest_flagged": False,
            },
            "sign-pattern": {
                "statistic": 1.0,
                "threshold": 10.0,
                "flagged": False,
                "honest_statistic": 1.0,
                "honest_flagged": False,
            },
        },
        "images": _images(),
    }
    base.update(changes)
    return base


def test_a_run_draws_its_pictures_into_the_page(tmp_path) -> None:
    page = add_memorization_run(tmp_path, {"attack": entry()})
    html = page.read_text()
    results = json.loads((tmp_path / "results.json").read_text())
    run = results["memorization"]["runs"][0]
    name = run["images"]["pairs"]
    assert run["images"]["count"] == 3
    assert run["images"]["rows"] == ["original", "decoded", "requantized"]
    assert '<section id="memorization">' in html and f'<img src="{name}"' in html
    picture = imread(tmp_path / name)
    assert picture.ndim == 3 and min(picture.shape[:2]) > 100
    assert "Memorized: 7 of 8 training items recovered" in html
    assert "lsb-entropy" in html and "/ param" in html and "7 / 8" in html
    assert "images" in run and "original" not in run["images"]


def test_pairs_plot_prints_each_decodings_psnr() -> None:
    rows = {k: [np.asarray(x) for x in v] for k, v in _images(noise=0.1).items()}
    rows["decoded"][1] = rows["original"][1].copy()
    fig = pairs_plot(rows)
    axes = np.asarray(fig.axes).reshape(3, 3)
    expected = 10 * math.log10(1 / 0.1**2)
    assert axes[1, 0].get_xlabel() == f"{expected:.1f} dB"
    assert axes[1, 1].get_xlabel() == "exact"
    assert axes[0, 0].get_xlabel() == "" and axes[0, 0].get_ylabel() == "original"
    assert axes[2, 0].get_ylabel() == "re-quantised"


def test_reruns_replace_and_other_blocks_are_kept(tmp_path) -> None:
    add_backdoor_run(tmp_path, {"attack": {"folder": "/runs/bd", "method": "badnets", "asr": 0.9}})
    add_memorization_run(tmp_path, {"attack": entry()})
    add_memorization_run(tmp_path, {"attack": entry(recovered=8)})
    page = add_memorization_run(
        tmp_path, {"attack": entry("/runs/cap", method="capacity", label=None, queries=342,
                                   bits_per_parameter=None, bits_per_query=0.35, images=None,
                                   epsilon=8.0, delta=1e-5)},
    )  # fmt: skip
    results = json.loads((tmp_path / "results.json").read_text())
    runs = results["memorization"]["runs"]
    assert [r["folder"] for r in runs] == ["/runs/lsb", "/runs/cap"]
    assert runs[0]["recovered"] == 8
    assert results["backdoor"]["attacks"][0]["asr"] == 0.9
    html = page.read_text()
    assert 'id="backdoor"' in html and 'id="memorization"' in html
    assert "capacity, 8 items, DP-SGD ε=8" in html and "/ query" in html


def test_verdict_closed_form() -> None:
    assert verdict({}) == "No memorization run yet."
    line = verdict({"runs": [entry(), entry("/b", recovered=2)]})
    assert line == (
        "Memorized: 7 of 8 training items recovered from the released model by lsb, 100 × 512 "
        "bits, non-private (bit accuracy 99.5%, PSNR 41.2 dB); clean accuracy 1.0 points below "
        "the honest model's (90% vs 91%); flagged by lsb-entropy."
    )
    none = verdict({"runs": [entry(recovered=0, checks={"x": {"flagged": False}}, psnr=None,
                                   queries=12, clean_accuracy=0.91)]})  # fmt: skip
    assert none.startswith("Not memorized: 0 of 8")
    assert "12 label queries" in none and "the same as the honest model's" in none
    assert none.endswith("; no weight check flagged it.")


def test_tables_and_escaping(tmp_path) -> None:
    rows = [{"method": "lsb", "ours_psnr": 100.0, "paper": "Table 2"}, {"method": "<b>x</b>"}]
    page = add_memorization_run(tmp_path, {"tables": {"song": rows}})
    html = page.read_text()
    assert "Table: song" in html and "ours psnr" in html and "100.000" in html
    assert "<b>x</b>" not in html and "&lt;b&gt;x&lt;/b&gt;" in html
    section = MemorizationSection()
    assert section.applies({"memorization": {"tables": {"song": rows}}})
    assert not section.applies({"memorization": {"runs": [], "tables": {}}})
    page = add_memorization_run(tmp_path, {"attack": entry(label="<script>x</script>")})
    assert "<script>x</script>" not in page.read_text()
    hostile = {"memorization": {"tables": {'x" onmouseover="alert(1)': rows}}}
    html = section.render(tmp_path, hostile)
    assert 'onmouseover="' not in html and "&quot; onmouseover=&quot;" in html


def test_a_tabular_run_has_no_picture(tmp_path) -> None:
    page = add_memorization_run(tmp_path, {"attack": entry(images={}, psnr=None)})
    html = page.read_text()
    assert '<section id="memorization">' in html and "<img" not in html
    assert list(Path(tmp_path).glob("*.png")) == []


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        ([], "must be a mapping"),
        ({"attack": entry(), "tables": {}}, "exactly one of"),
        ({"attack": entry(folder="")}, "needs the run's 'folder'"),
        ({"attack": entry(method=None)}, "needs a 'method' name"),
        ({"attack": entry(clean_accuracy=1.5)}, "'clean_accuracy'\\] must be in \\[0, 1\\]"),
        ({"attack": entry(images={"original": [[[0.0]]]})}, "needs both 'original' and"),
        ({"attack": entry(images={"original": [[[0.0]]], "decoded": []})}, "as many images"),
        (
            {"attack": entry(images={"original": [[[0.0]]] * 9, "decoded": [[[0.0]]] * 10})},
            "as many images",
        ),
        ({"attack": entry(images={"original": [[[math.nan]]], "decoded": [[[0.0]]]})}, "NaN"),
        ({"attack": entry(images={"original": [[1, 2]], "decoded": [[1, 2]]})}, "\\(H, W\\)"),
        ({"tables": {"Bad Name": []}}, "table name must be"),
        ({"tables": {"song": [1]}}, "must be a list of mappings"),
    ],
)
def test_bad_payloads_are_refused_before_writing(tmp_path, payload, message) -> None:
    with pytest.raises(MemorizationReportError, match=message) as error:
        add_memorization_run(tmp_path / "r", payload)
    assert "\n" not in str(error.value)
    assert not (tmp_path / "r").exists()
