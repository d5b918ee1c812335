"""`privacylab attack lm-membership` and its job (`privacylab.lm_membership`): the JSON contract
(schemas.md "membership run"), the report written with --out (results.json's
language.membership and the ROC figure), the reference attack with --reference, and bad input
refused in one line with exit code 2 (unknown attack naming the choices, reference without a
reference model, missing folders, --documents 0, a negative --seed)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from _cli import command
from _tiny_lm import train_tiny_gpt
from privacylab.data.corpus import Corpus, Record
from privacylab.lm_membership import run_lm_membership_job
from privacylab.models import ModelSpec, save_model

invoke, run_json, fails = command("attack", "lm-membership")
CONTEXT = 48
OPTIONS = {"dim": 32, "heads": 2, "blocks": 1}
ATTACK_KEYS = {
    "name", "attack", "access", "queries", "seconds", "examples", "auc", "tpr_at_1pct_fpr",
    "tpr_at_01pct_fpr", "balanced_accuracy", "advantage", "threshold_source",
    "epsilon_lower_bound", "confidence", "delta", "roc", "params",
}  # fmt: skip


def _model_folder(folder: Path, corpus: Corpus, steps: int, seed: int, size: str) -> Path:
    """A model folder as `privacylab lm train` writes it: a tiny GPT trained on the members."""
    model = train_tiny_gpt(corpus.texts(corpus.member_indices), steps, seed, CONTEXT)
    language = {
        "size": size, "parameters": sum(p.numel() for p in model.parameters()),
        "context": CONTEXT, "private": False, "epsilon": None, "delta": None,
        "accountant": None, "noise_multiplier": None, "epochs": steps, "seconds": 1.0,
        "perplexity": {"members": 2.0, "heldout": 3.0},
    }  # fmt: skip
    spec = ModelSpec("gpt", (CONTEXT,), 259, OPTIONS)
    save_model(model, folder, spec, metadata={"language": language})
    corpus.save(folder)
    return folder


def _corpus(seed: int) -> Corpus:
    rng = np.random.default_rng(seed)
    words = ["red", "fox", "Blue", "owl", "quiet", "lake", "North", "pine"]
    docs = [f"{' '.join(rng.choice(words, 3))} {int(rng.integers(100, 999))}." for _ in range(80)]
    docs[0] = docs[1] = "Ann Lee, ann@lee.org 555-0101"
    members = np.r_[np.ones(40, bool), np.zeros(40, bool)]
    record = Record(docs[0], {"name": "Ann Lee"}, 2, (0, 1))
    return Corpus(docs, members, records=[record], context=CONTEXT)


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    base = tmp_path_factory.mktemp("lm-membership")
    target = _model_folder(base / "target", _corpus(0), 60, 0, "tiny")
    reference = _model_folder(base / "reference", _corpus(1), 20, 1, "tiny")
    return target, reference


def test_json_run_and_report(folders: tuple[Path, Path], tmp_path: Path) -> None:
    target, _ = folders
    out = tmp_path / "report"
    run = run_json("--target", str(target), "--documents", "30", "--out", str(out))
    assert set(run) == {"target", "reference", "documents", "attacks", "order", "queries",
                        "resumed", "seconds"}  # fmt: skip
    assert run["resumed"] == 0 and (target / "lm-membership.sqlite").is_file()
    assert run["target"]["folder"] == str(target) and run["target"]["size"] == "tiny"
    assert run["reference"] is None
    assert run["documents"] == {"members": 30, "heldout": 30}
    names = [a["name"] for a in run["attacks"]]
    assert names == ["loss", "zlib", "lowercase", "min-k", "min-k++"]
    for attack in run["attacks"]:
        assert set(attack) == ATTACK_KEYS and attack["examples"] == 60
        assert len(attack["roc"]["fpr"]) == len(attack["roc"]["tpr"]) <= 200
    aucs = {a["name"]: a["auc"] for a in run["attacks"]}
    assert run["order"] == sorted(aucs, key=lambda n: -aucs[n])
    assert aucs["loss"] > 0.8
    assert run["queries"] == sum(a["queries"] for a in run["attacks"]) == 6 * 60
    saved = json.loads((out / "results.json").read_text())
    assert saved["language"]["membership"][0]["order"] == run["order"]
    assert (out / "language-roc-0.png").read_bytes().startswith(b"\x89PNG")
    assert "language-roc-0.png" in (out / "index.html").read_text()

    same = run_lm_membership_job(target, attacks=["loss"], documents=30)
    assert same["attacks"][0]["auc"] == aucs["loss"] and same["resumed"] == 0

    again = run_json("--target", str(target), "--documents", "30", "--attacks", "min-k,loss")
    assert again["resumed"] == 2 and again["queries"] == 2 * 60
    assert [a["auc"] for a in again["attacks"]] == [aucs["min-k"], aucs["loss"]]
    other = run_json("--target", str(target), "--documents", "30", "--attacks", "loss",
                     "--seed", "5")  # fmt: skip
    assert other["resumed"] == 0


def test_reference_and_plain_output(folders: tuple[Path, Path], tmp_path: Path) -> None:
    target, reference = folders
    run = run_json(
        "--target", str(target), "--reference", str(reference), "--attacks", "reference,mink",
        "--documents", "20", "--seed", "1", "--store", str(tmp_path / "s.sqlite"),
    )  # fmt: skip
    assert (tmp_path / "s.sqlite").is_file()
    assert [a["name"] for a in run["attacks"]] == ["reference", "min-k"]
    assert run["reference"]["folder"] == str(reference)
    params = run["attacks"][0]["params"]
    assert params["reference_queries"] == 40 and run["attacks"][0]["queries"] == 40
    result = invoke("--target", str(target), "--attacks", "loss", "--documents", "10")
    assert result.exit_code == 0, result.stderr
    assert "LM membership inference" in result.stdout and "AUC" in result.stdout


def test_bad_input_is_one_line(folders: tuple[Path, Path], tmp_path: Path) -> None:
    target, _ = folders
    line = fails("--target", str(target), "--attacks", "loss,nope")
    assert "unknown membership attack 'nope'" in line and "min-k++" in line
    assert "reference model" in fails("--target", str(target), "--attacks", "reference")
    assert "is not a model folder" in fails("--target", str(tmp_path / "missing"))
    assert "--reference" in fails("--target", str(target), "--reference", str(tmp_path / "no"))
    assert "--documents" in fails("--target", str(target), "--documents", "0")
    assert "--seed must be" in fails("--target", str(target), "--seed", "-1")
    assert "no membership attack" in fails("--target", str(target), "--attacks", ",")
    (tmp_path / "empty").mkdir()
    assert "error: " in fails("--target", str(tmp_path / "empty"))
