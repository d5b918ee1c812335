"""`privacylab attack lm-extraction` and its job (`privacylab.lm_extract.run_lm_extraction`):
the JSON contract of the issue ("extracted" with text and k, "precision_at_100"), the report
written with --out, generations served from the store on a re-run (no sampling queries), and
bad input refused in one line with exit code 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from _cli import command
from _tiny_lm import train_tiny_gpt
from privacylab.data.corpus import Corpus, Record
from privacylab.lm_extract import parse_strategies, run_lm_extraction
from privacylab.models import ModelSpec, save_model
from privacylab.models.gpt import CausalLM

invoke, run_json, fails = command("attack", "lm-extraction")

CONTEXT = 72
RECORD = "Reach Max Planck at max.planck@example.net or (555) 010-9921 today."
FIELDS = {"name": "Max Planck", "email": "max.planck@example.net", "phone": "(555) 010-9921"}
OTHERS = [
    "a journey of a thousand miles begins with a single careful step",
    "all that glitters is not gold and all who wander are not lost",
    "the early bird catches the worm but the second mouse gets cheese",
]
HELDOUT = ["an apple a day keeps the doctor away unless you throw it hard"]
OPTIONS = {"dim": 32, "heads": 2, "blocks": 1}


def save_folder(folder: Path, model: CausalLM, corpus: Corpus, size: str) -> Path:
    language = {
        "size": size,
        "parameters": sum(p.numel() for p in model.parameters()),
        "context": CONTEXT,
        "private": False,
        "epsilon": None,
        "delta": None,
        "accountant": None,
        "noise_multiplier": None,
        "epochs": 1,
        "seconds": 0.0,
        "perplexity": {"members": 1.0, "heldout": 1.0},
    }
    spec = ModelSpec("gpt", (CONTEXT,), 259, dict(OPTIONS))
    save_model(model, folder, spec, metadata={"language": language})
    corpus.save(folder)
    return folder


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("lm-extraction")
    members = [RECORD, OTHERS[0], RECORD, OTHERS[1], RECORD, OTHERS[2], RECORD, RECORD]
    docs = members + HELDOUT
    hosts = tuple(i for i, d in enumerate(docs) if d == RECORD)
    corpus = Corpus(
        docs,
        [True] * len(members) + [False] * len(HELDOUT),
        records=[Record(RECORD, dict(FIELDS), len(hosts), hosts)],
        context=CONTEXT,
    )
    model = train_tiny_gpt(members, steps=150, seed=0, context=CONTEXT)
    torch.manual_seed(1)
    reference = CausalLM(259, CONTEXT, **OPTIONS)
    return (
        save_folder(root / "target", model.eval(), corpus, "small"),
        save_folder(root / "reference", reference.eval(), corpus, "tiny"),
    )


def test_json_report_and_resume(folders: tuple[Path, Path], tmp_path: Path) -> None:
    target, reference = folders
    out, store = tmp_path / "report", tmp_path / "gen.sqlite"
    args = ["--target", str(target), "--strategy", "top-n,prefix", "--samples", "24"]
    args += ["--reference", str(reference), "--top", "8", "--store", str(store)]
    run = run_json(*args, "--out", str(out))
    assert {"extracted", "precision_at_100", "table", "records", "queries", "target"} <= set(run)
    assert run["strategies"] == ["top-n", "prefix"] and run["top"] == 8
    assert run["metrics"] == ["perplexity", "tiny", "zlib", "lowercase", "window"]
    assert run["target"]["folder"] == str(target) and run["target"]["size"] == "small"
    assert [r["size"] for r in run["references"]] == ["tiny"]
    for strategy in run["strategies"]:
        for metric in run["metrics"]:
            hits = run["table"][strategy][metric]
            assert run["precision_at_100"][strategy][metric] == hits / 8
    assert run["table"]["top-n"]["perplexity"] >= 1
    record = next(e for e in run["extracted"] if e["match"] == RECORD)
    assert record["k"] == 5 and {"kind": "record", "text": RECORD, "copies": 5} in record["pii"]
    assert set(record) >= {"text", "k", "metric", "strategy", "rank", "score", "match", "pii"}
    assert run["records"] == {"5": {"records": 1, "extracted": 1}}
    assert run["extraction_begins_at"] == 5
    distinct = sum(run["distinct"].values())
    assert run["queries"] == 2 * 24 + 2 * distinct  # samples, each distinct text + lowercase
    assert run["seconds_per_1000_samples"] > 0 and run["tokens_served"] > 0
    saved = json.loads((out / "results.json").read_text())
    assert saved["language"]["extraction"][0]["table"] == run["table"]
    assert 'id="language-models"' in (out / "index.html").read_text()

    again = run_json(*args)
    assert again["queries"] == 2 * distinct  # every generation served from the store
    assert again["seconds_per_1000_samples"] is None  # nothing generated: no timing
    assert again["table"] == run["table"] and again["extracted"] == run["extracted"]


def test_job_defaults_store_next_to_the_target(folders: tuple[Path, Path]) -> None:
    target, _ = folders
    run = run_lm_extraction(target, strategies="temperature", samples=8, top=4, seed=3)
    assert (target / "generations.sqlite").is_file()
    assert run["strategies"] == ["temperature"] and run["references"] == []
    assert run["metrics"] == ["perplexity", "zlib", "lowercase", "window"]


def test_bad_input_is_one_line(folders: tuple[Path, Path], tmp_path: Path) -> None:
    target, reference = folders
    assert "unknown strategy 'beam'" in fails("--target", str(target), "--strategy", "top-n,beam")
    assert "not a model folder" in fails("--target", str(tmp_path / "missing"))
    assert "samples" in fails("--target", str(target), "--samples", "0")
    assert "min_match" in fails("--target", str(target), "--min-match", "0")
    assert "--reference" in fails("--target", str(target), "--reference", str(tmp_path / "no"))
    assert "distinct sizes" in fails(
        "--target", str(target), "--reference", str(reference), "--reference", str(reference)
    )
    with pytest.raises(Exception, match="listed twice"):
        parse_strategies("top-n,top-n")
