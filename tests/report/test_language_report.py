"""The language-model report: `add_language_run` merges runs into results.json (replace by
target folder, keep every other key, JSON round trip), the "language-models" section renders
each kind alone and all together, PII on the page is redacted (`redact`, checked on faker
records and by hypothesis properties), the figures draw what the runs hold, and the page
renders in headless Chromium without errors."""

from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from test_render_chromium import _render, chromium  # noqa: F401  (fixture)

from privacylab.errors import PrivacylabError
from privacylab.report.html import render_html, write_report
from privacylab.report.jsonable import json_ready
from privacylab.report.language import (
    EXPOSURE_IMAGE,
    EXTRACTION_IMAGE,
    RANDOM_EXPOSURE,
    LanguageReportError,
    add_language_run,
    epsilon_label,
    exposure_plot,
    language_roc_plot,
    records_plot,
    redact,
    roc_image_name,
    run_label,
    run_labels,
)
from privacylab.report.metrics import membership_metrics
from privacylab.report.sections.language import facts_line
from privacylab.stats.roc import roc_curve

PNG = b"\x89PNG\r\n\x1a\n"
METRICS = ["perplexity", "small", "tiny", "zlib", "lowercase", "window"]
RECORD = "Jonathan Doering, jdoering@example.org, (555) 123-1234"


def facts(folder: str, size: str = "tiny", epsilon: float | None = None) -> dict[str, Any]:
    return {
        "folder": folder,
        "size": size,
        "parameters": 12345,
        "private": epsilon is not None,
        "epsilon": epsilon,
        "perplexity": {"members": 3.25, "heldout": 11.5},
    }


def extraction_run(folder: str = "/models/tiny") -> dict[str, Any]:
    table = {
        "top-n": dict(zip(METRICS, [9, 20, 12, 15, 3, 4], strict=True)),
        "temperature": dict(zip(METRICS, [5, 7, 1, 0, 0, 2], strict=True)),
        "internet": dict.fromkeys(METRICS, 0),
    }
    return {
        "target": facts(folder),
        "references": [facts("/models/small", "small")],
        "samples": 300,
        "strategies": list(table),
        "metrics": METRICS,
        "table": table,
        "precision_at_100": {s: {m: v / 100 for m, v in row.items()} for s, row in table.items()},
        "top": 100,
        "extracted": [
            {
                "text": f"Contact: {RECORD} — call today",
                "k": 8,
                "metric": "small",
                "strategy": "top-n",
                "rank": 3,
                "score": -1.25,
                "match": RECORD,
                "pii": [{"kind": "record", "text": RECORD, "copies": 8}],
            },
            {
                "text": "my pin is 739204",
                "k": 16,
                "metric": "zlib",
                "strategy": "temperature",
                "rank": 1,
                "score": -2.0,
                "match": "my pin is 739204",
                "pii": [{"kind": "canary", "text": "my pin is 739204", "copies": 16}],
            },
        ],
        "records": {
            "1": {"records": 10, "extracted": 0},
            "8": {"records": 5, "extracted": 2},
            "32": {"records": 5, "extracted": 5},
        },
        "extraction_begins_at": 8,
        "queries": 900,
        "tokens_served": 57600,
        "seconds": 12.5,
        "seconds_per_1000_samples": 13.9,
    }


def exposure_run(folder: str = "/models/tiny", epsilon: float | None = None) -> dict[str, Any]:
    rows = [(0, 1.1), (0, 0.6), (1, 2.5), (4, 7.0), (16, 13.29), (16, 11.0)]
    if epsilon is not None:
        rows = [(r, 1.0 + 0.01 * r) for r, _ in rows]
    canaries = [
        {
            "prefix": "my pin is ",
            "repeats": r,
            "space_bits": 6 * math.log2(10),
            "exposure": x,
            "rank": max(1, round(10**6 / 2**x)),
            "method": "enumerate",
            "extrapolated_exposure": None,
            "user": False,
        }
        for r, x in rows
    ]
    canaries.append({**canaries[-1], "prefix": "user canary ", "exposure": 40.0, "user": True})
    return {
        "target": facts(folder, epsilon=epsilon),
        "method": "enumerate",
        "canaries": canaries,
        "queries": 7000,
        "seconds": 3.5,
    }


@dataclass
class Scored:
    attack: str
    scores: np.ndarray
    membership: np.ndarray
    access: str = "scores"
    queries: int = 80
    seconds: float = 0.5
    predictions: np.ndarray | None = None


def membership_run(folder: str = "/models/tiny", shift: float = 1.5) -> dict[str, Any]:
    """Attacks as the membership job writes them: `MembershipMetrics.to_dict()` of real
    scores plus name and ROC points."""
    rng = np.random.default_rng(0)
    membership = np.repeat([1, 0], 40)
    attacks = []
    for name, gain in (("loss", shift), ("zlib", shift / 2), ("random", 0.0)):
        scores = rng.normal(size=80) + gain * membership
        result = Scored(name, scores, membership)
        fpr, tpr, _ = roc_curve(scores, membership)
        attacks.append(
            {
                **membership_metrics(result).to_dict(),
                "name": name,
                "roc": {"fpr": fpr.tolist(), "tpr": tpr.tolist()},
            }
        )
    order = [a["name"] for a in sorted(attacks, key=lambda a: -a["auc"])]
    return {
        "target": facts(folder),
        "reference": facts("/models/ref", "small"),
        "documents": {"members": 40, "heldout": 40},
        "attacks": attacks,
        "order": order,
        "queries": 240,
        "seconds": 1.5,
    }


def page_images(page: Path) -> list[str]:
    return re.findall(r'<img src="([^"]+)"', page.read_text(encoding="utf-8"))


# ----------------------------------------------------------------------------- redact


def test_redact_examples() -> None:
    assert redact("John Doe, john@example.org, (555) 123-1234") == (
        "J*** D**, j***@e******.org, (5**) ***-**34"
    )
    assert redact("born 1987, SSN 123-45-6789") == "b*** **87, S** 1**-**-**89"
    assert redact("42 Main St.") == "*2 M*** S*."
    assert redact("a@b.c12") == "a@b.c*2"
    assert redact("") == ""


def test_redact_hides_every_faker_record() -> None:
    from faker import Faker

    fake = Faker("en_US")
    fake.seed_instance(15)
    for _ in range(60):
        fields = {
            "name": fake.name(),
            "email": fake.email(),
            "phone": fake.phone_number(),
            "address": fake.address().replace("\n", ", "),
        }
        text = f"{fields['name']}, {fields['email']}, {fields['phone']}, {fields['address']}"
        masked = redact(text)
        assert len(masked) == len(text)
        for value in fields.values():
            assert value not in masked
            for token in re.findall(r"[A-Za-z]{3,}|\d{3,}", value):
                if token.isalpha() and re.search(rf"@[\w.-]*\.{token}\b", text):
                    continue  # a top-level domain ("com"), kept on purpose
                assert token not in masked, (token, masked)


@given(
    st.text(
        alphabet=st.one_of(
            st.characters(min_codepoint=32, max_codepoint=0x24F),
            st.sampled_from(list("0123456789aZ -.()@'/+_")),
        ),
        max_size=80,
    )
)
def test_redact_properties(text: str) -> None:
    masked = redact(text)
    assert len(masked) == len(text)
    for before, after in zip(text, masked, strict=True):
        assert after in (before, "*")
        if not before.isalnum() and before not in "'’":
            assert after == before
    digits = sum(c.isdigit() for c in text)
    shown = sum(c.isdigit() and c == m for c, m in zip(text, masked, strict=True))
    assert shown <= digits // 2
    if "@" not in text:
        for word in re.finditer(r"[^\W\d_]+", text):
            visible = masked[word.start() : word.end()].replace("*", "")
            assert len(visible) <= 1, (word.group(0), masked)


# ------------------------------------------------------------------- add_language_run


def test_bad_kind_and_bad_runs_are_one_line_errors(tmp_path: Path) -> None:
    with pytest.raises(LanguageReportError, match="kind must be one of") as info:
        add_language_run(tmp_path, "canaries", exposure_run())
    assert isinstance(info.value, ValueError) and isinstance(info.value, PrivacylabError)
    assert "\n" not in str(info.value)
    with pytest.raises(LanguageReportError, match="folder"):
        add_language_run(tmp_path, "exposure", {"canaries": []})
    with pytest.raises(LanguageReportError, match="mapping"):
        add_language_run(tmp_path, "exposure", [1, 2])  # type: ignore[arg-type]
    (tmp_path / "results.json").write_text("{not json", encoding="utf-8")
    with pytest.raises(LanguageReportError, match="cannot read") as info:
        add_language_run(tmp_path, "exposure", exposure_run())
    assert "\n" not in str(info.value)
    (tmp_path / "results.json").write_text("[1, 2]", encoding="utf-8")
    with pytest.raises(LanguageReportError, match="JSON object"):
        add_language_run(tmp_path, "exposure", exposure_run())
    assert not (tmp_path / "index.html").exists()


def test_merge_replaces_by_folder_and_keeps_other_keys(tmp_path: Path) -> None:
    other = {
        "title": "earlier run",
        "membership": {"note": "kept"},
        "notes": ["from another job"],
        "targets": [],
    }
    write_report(tmp_path, other, {})
    add_language_run(tmp_path, "membership", membership_run("/a"))
    add_language_run(tmp_path, "membership", membership_run(str(tmp_path / "b"), shift=0.5))
    add_language_run(tmp_path, "exposure", exposure_run("/a"))
    relative = membership_run(os.path.relpath(tmp_path / "b"), shift=0.5)
    (tmp_path / "b").mkdir()
    add_language_run(tmp_path, "membership", {**relative, "target": {**relative["target"]}})
    before = {n: (tmp_path / n).stat().st_mtime_ns for n in (roc_image_name(0), roc_image_name(1))}
    first = (tmp_path / roc_image_name(0)).read_bytes()
    replaced = membership_run("/a", shift=3.0)
    page = add_language_run(tmp_path, "membership", replaced)
    assert (tmp_path / roc_image_name(1)).stat().st_mtime_ns == before[roc_image_name(1)]
    assert (tmp_path / roc_image_name(0)).read_bytes() != first  # only the changed run redrawn
    payload = json.loads((tmp_path / "results.json").read_text(encoding="utf-8"))
    for key, value in other.items():
        assert payload[key] == value
    block = payload["language"]
    assert [r["target"]["folder"] for r in block["membership"]] == [
        "/a",
        os.path.relpath(tmp_path / "b"),
    ]  # the relative path to the same folder replaced the absolute one
    assert block["membership"][0] == json_ready(replaced)
    assert block["membership"][0]["attacks"][0]["auc"] > 0.95
    assert [r["target"]["folder"] for r in block["exposure"]] == ["/a"]
    assert block["extraction"] == []
    assert block["images"] == {
        "extraction": None,
        "exposure": EXPOSURE_IMAGE,
        "membership": [roc_image_name(0), roc_image_name(1)],
    }
    assert sorted(page_images(page)) == sorted([EXPOSURE_IMAGE, *block["images"]["membership"]])
    for name in page_images(page):
        assert (tmp_path / name).read_bytes().startswith(PNG)
    assert "earlier run" in page.read_text(encoding="utf-8")


def _add_bare_runs(folder: str, worker: int) -> None:
    for i in range(4):
        add_language_run(folder, "membership", {"target": {"folder": f"/w{worker}/{i}"}})


def test_concurrent_writers_lose_no_run(tmp_path: Path) -> None:
    import multiprocessing

    context = multiprocessing.get_context("fork")
    workers = [context.Process(target=_add_bare_runs, args=(str(tmp_path), w)) for w in range(4)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(60)
        assert worker.exitcode == 0
    payload = json.loads((tmp_path / "results.json").read_text(encoding="utf-8"))
    folders = sorted(r["target"]["folder"] for r in payload["language"]["membership"])
    assert folders == sorted(f"/w{w}/{i}" for w in range(4) for i in range(4))


def test_json_round_trip(tmp_path: Path) -> None:
    run = extraction_run()
    run["seconds"] = np.float32(2.5)
    run["queries"] = np.int64(900)
    run["samples"] = float("nan")
    run["table"]["top-n"]["window"] = np.int32(4)
    add_language_run(tmp_path, "extraction", run)
    payload = json.loads((tmp_path / "results.json").read_text(encoding="utf-8"))
    stored = payload["language"]["extraction"][0]
    assert stored == json_ready(run)
    assert stored["samples"] is None and stored["queries"] == 900 and stored["seconds"] == 2.5
    again = tmp_path / "again"
    add_language_run(again, "extraction", stored)
    assert json.loads((again / "results.json").read_text(encoding="utf-8")) == payload
    assert render_html(tmp_path, payload) == (tmp_path / "index.html").read_text(encoding="utf-8")


# ------------------------------------------------------------------------- rendering


def _section(page: Path) -> str:
    text = page.read_text(encoding="utf-8")
    start = text.index('<section id="language-models">')
    return text[start : text.index("</section>", start)]


def test_extraction_alone(tmp_path: Path) -> None:
    page = add_language_run(tmp_path, "extraction", extraction_run())
    text = page.read_text(encoding="utf-8")
    assert '<a href="#language-models">Language models: memorisation</a>' in text
    html = _section(page)
    assert 'id="language-extraction"' in html
    assert 'id="language-exposure"' not in html and 'id="language-membership"' not in html
    assert page_images(page) == [EXTRACTION_IMAGE]
    body = html.split('class="sortable language-extraction"')[1].split("<tbody>")[1]
    rows = re.findall(r"<tr>(.*?)</tr>", body)
    best = {}
    for row in rows[: len(extraction_run()["strategies"])]:
        cells = re.findall(r"<td[^>]*>(.*?)</td>", row)
        best[cells[0]] = [i for i, c in enumerate(cells[1:]) if c.startswith("<strong>")]
    assert best == {"top-n": [METRICS.index("small")], "temperature": [1], "internet": []}
    assert "Extraction begins at 8 copies." in html
    assert re.search(r"<td[^>]*>8</td><td[^>]*>5</td><td[^>]*>2</td><td[^>]*>40%</td>", html)
    assert "12,345 parameters · non-private · perplexity members 3.25 / held-out 11.50" in html
    # every piece of PII is redacted on the page (and in its sort keys and tooltips)
    for secret in ("Jonathan", "Doering", "jdoering", "example", "123-1234", "(555)", "739204"):
        assert secret not in text
    assert redact(RECORD) in html
    assert "record: " + redact(RECORD) + " (×8)" in html
    assert "m* p** i* 7***04" in html


def test_exposure_alone(tmp_path: Path) -> None:
    page = add_language_run(tmp_path, "exposure", exposure_run("/tiny"))
    page = add_language_run(tmp_path, "exposure", exposure_run("/dp", epsilon=8.0))
    html = _section(page)
    assert 'id="language-exposure"' in html and 'id="language-extraction"' not in html
    assert page_images(page) == [EXPOSURE_IMAGE]
    assert "Exposure vs insertion count: tiny, non-private, tiny, DP ε=8" in html
    assert html.count('class="sortable language-exposure"') == 2
    assert "DP-SGD, ε = 8" in html
    assert html.count('<td class="text" data-sort="yes">yes</td>') == 2


def test_membership_alone(tmp_path: Path) -> None:
    run = membership_run()
    page = add_language_run(tmp_path, "membership", run)
    html = _section(page)
    assert 'id="language-membership"' in html and 'id="language-exposure"' not in html
    assert page_images(page) == [roc_image_name(0)]
    table = html.split('class="sortable language-membership"')[1]
    names = re.findall(r'<tr><td class="text" data-sort="([^"]+)"', table)
    assert names == run["order"] == ["loss", "zlib", "random"]
    loss = run["attacks"][0]
    first = re.findall(r"<td[^>]*>([^<]*)</td>", table.split("<tbody>")[1].split("</tr>")[0])
    assert first == [
        "loss",
        f"{loss['auc']:.3f}",
        f"{loss['tpr_at_1pct_fpr']:.3f}",
        f"{loss['tpr_at_01pct_fpr']:.3f}",
        f"{loss['advantage']:.3f}",
        "80",
    ]
    assert "reference model: model: small" in html
    assert "40 member and 40 held-out documents" in html


def test_all_kinds_together_and_partial_runs(tmp_path: Path) -> None:
    add_language_run(tmp_path, "extraction", extraction_run())
    add_language_run(tmp_path, "exposure", exposure_run())
    add_language_run(tmp_path, "membership", membership_run())
    add_language_run(tmp_path, "membership", {"target": {"folder": "/bare"}})
    page = add_language_run(tmp_path, "extraction", {"target": {"folder": "/bare"}})
    html = _section(page)
    ids = [m for m in re.findall(r'<h3 id="([^"]+)"', html)]
    assert ids == ["language-extraction", "language-exposure", "language-membership"]
    assert sorted(page_images(page)) == sorted(
        [EXTRACTION_IMAGE, EXPOSURE_IMAGE, roc_image_name(0)]
    )
    assert all((tmp_path / name).is_file() for name in page_images(page))
    summary = html.split('class="sortable language-summary"')[1].split("</table>")[0]
    rows = [
        re.findall(r"<td[^>]*>([^<]*)</td>", r)
        for r in summary.split("<tbody>")[1].split("</tr>")[:-1]
    ]
    aucs = [a["auc"] for a in membership_run()["attacks"]]
    tprs = [a["tpr_at_1pct_fpr"] for a in membership_run()["attacks"]]
    assert rows[0] == [
        "tiny, non-private",
        "12345",
        "∞",
        "3.25",
        "11.50",
        "20",
        "7 / 20",
        "8",
        f"{(13.29 + 11.0) / 2:.2f} / {6 * math.log2(10):.1f} (×16)",
        f"{max(aucs):.3f}",
        f"{max(tprs):.3f}",
    ]
    assert rows[1][0] == "/bare, non-private"
    assert rows[1][5:] == ["—"] * 6
    assert "No planted record was extracted." in html
    assert "nothing extracted" in html and "no attack" in html
    garbage = {
        "language": {
            "extraction": [{"target": "x", "table": "y", "records": [1], "extracted": "z"}],
            "exposure": [{"canaries": [{"repeats": "many", "exposure": None}]}],
            "membership": [{"attacks": [{"roc": {"fpr": [0, 1], "tpr": [1]}}], "documents": 3}],
            "images": {"membership": "nope"},
        }
    }
    out = render_html(tmp_path, garbage)
    assert '<section id="language-models">' in out
    assert 'id="language-models"' not in render_html(tmp_path, {"language": {"exposure": []}})


def test_labels_and_facts() -> None:
    assert run_label(facts("/x", "small")) == "small, non-private"
    assert run_label(facts("/x", "medium", 8.0)) == "medium, DP ε=8"
    assert run_label(None) == "model, non-private"
    assert run_label(facts("/x", "tiny", 7.9934192952963885)) == "tiny, DP ε=8"
    assert [epsilon_label(x) for x in (0.5, 1.0, 2.54, 16.0, 100.0)] == [
        "0.5",
        "1",
        "2.5",
        "16",
        "100",
    ]
    assert run_labels([facts("/m/a"), facts("/m/b"), facts("/m/c", "small")]) == [
        "tiny, non-private (a)",
        "tiny, non-private (b)",
        "small, non-private",
    ]
    line = facts_line({**facts("/x", epsilon=1.5), "delta": 1e-5, "accountant": "pld"})
    assert line == (
        "model: tiny · 12,345 parameters · DP-SGD, ε = 1.5, δ = 1.0e-05 (pld accountant) · "
        "perplexity members 3.25 / held-out 11.50 · folder: /x"
    )


# --------------------------------------------------------------------------- figures


def test_exposure_plot_draws_means_and_levels() -> None:
    runs = [exposure_run("/a"), exposure_run("/b", epsilon=8.0)]
    ax = exposure_plot(runs).axes[0]
    lines = {line.get_label(): line for line in ax.get_lines()}
    tiny = lines["tiny, non-private"]
    assert list(tiny.get_xdata()) == [0, 1, 4, 16]
    np.testing.assert_allclose(tiny.get_ydata(), [0.85, 2.5, 7.0, (13.29 + 11.0) / 2])
    dp = lines["tiny, DP ε=8"]
    np.testing.assert_allclose(dp.get_ydata(), [1.0, 1.01, 1.04, 1.16])
    level = next(v for k, v in lines.items() if k.startswith("random canary"))
    assert level.get_ydata()[0] == pytest.approx(1 / np.log(2)) == RANDOM_EXPOSURE
    assert level.get_linestyle() == ":"
    top = next(v for k, v in lines.items() if k.startswith("max exposure"))
    assert top.get_ydata()[0] == pytest.approx(6 * np.log2(10))
    assert top.get_linestyle() == "--"
    assert ax.get_xscale() == "symlog"


def test_records_plot_draws_shares_by_copies() -> None:
    other = extraction_run("/b")
    other["records"] = {"4": {"records": 4, "extracted": 1}, "2": {"records": 0, "extracted": 0}}
    ax = records_plot([extraction_run("/a"), other, {"target": facts("/c")}]).axes[0]
    lines = ax.get_lines()
    assert [line.get_label() for line in lines] == [
        "tiny, non-private (a)",
        "tiny, non-private (b)",
    ]
    assert list(lines[0].get_xdata()) == [1, 8, 32]
    np.testing.assert_allclose(lines[0].get_ydata(), [0.0, 0.4, 1.0])
    assert list(lines[1].get_xdata()) == [4] and list(lines[1].get_ydata()) == [0.25]
    assert ax.get_xscale() == "log"


def test_language_roc_plot_is_log_log_with_diagonal() -> None:
    run = membership_run()
    ax = language_roc_plot(run).axes[0]
    assert ax.get_xscale() == ax.get_yscale() == "log"
    labels = [line.get_label() for line in ax.get_lines()]
    assert labels[0] == "chance"
    assert [label.split(":")[0] for label in labels[1:]] == run["order"]
    chance = ax.get_lines()[0]
    np.testing.assert_allclose(chance.get_xdata(), chance.get_ydata())
    assert ax.get_xlim()[0] == pytest.approx(1e-3)


def test_language_page_renders_in_chromium(
    chromium: str,  # noqa: F811
    tmp_path: Path,
) -> None:
    folder = tmp_path / "report"
    add_language_run(folder, "extraction", extraction_run())
    add_language_run(folder, "exposure", exposure_run())
    add_language_run(folder, "exposure", exposure_run("/dp", epsilon=8.0))
    page = add_language_run(folder, "membership", membership_run())
    probe, console = _render(chromium, page, tmp_path / "profile")
    assert probe["errors"] == [] and console == []
    assert len(probe["images"]) == 3
    for image in probe["images"]:
        assert image["loaded"] and image["width"] > 0 and image["alt"], image
