"""`privacylab lm train`: the JSON contract, the model folder it writes, and one-line refusals
(exit 2) for bad input."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from _cli import command
from privacylab.data.corpus import Corpus, Record, load_corpus
from privacylab.lm import load_language_model, target_facts

invoke, run_json, fails = command("lm", "train")

KEYS = {
    "out",
    "size",
    "parameters",
    "epochs",
    "private",
    "epsilon",
    "delta",
    "perplexity",
    "documents",
    "seconds",
}


@pytest.fixture(scope="module")
def saved_corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    rng = np.random.default_rng(1)
    words = ["alpha", "beta", "gamma", "delta", "data", "text", "model"]
    documents = [" ".join(rng.choice(words, size=4)) for _ in range(24)]
    members = np.arange(24) % 2 == 0
    for i in (0, 2, 4):
        documents[i] += " Ann 555-0173"
    record = Record("Ann 555-0173", {"name": "Ann"}, 3, (0, 2, 4))
    folder = tmp_path_factory.mktemp("corpus")
    Corpus(documents, members, records=[record], context=40).save(folder)
    return folder / "corpus.json"


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory, saved_corpus: Path) -> tuple[Path, dict]:
    out = tmp_path_factory.mktemp("lm") / "tiny"
    args = ["--corpus", str(saved_corpus), "--size", "tiny", "--epochs", "3"]
    payload = run_json(*args, "--batch-size", "8", "--out", str(out))
    return out, payload


def test_json_contract_and_model_folder(trained: tuple[Path, dict], saved_corpus: Path) -> None:
    out, payload = trained
    assert set(payload) >= KEYS
    assert payload["out"] == str(out) and payload["size"] == "tiny"
    assert payload["private"] is False and payload["epsilon"] is None
    assert payload["epochs"] == 3 and payload["documents"] == {"members": 12, "heldout": 12}
    assert 1 < payload["perplexity"]["members"] < 259 and payload["seconds"] > 0
    loaded = load_language_model(out)
    assert loaded.corpus.to_dict() == load_corpus(saved_corpus).to_dict()
    assert payload["parameters"] == sum(p.numel() for p in loaded.model.parameters())
    assert target_facts(out)["perplexity"] == payload["perplexity"]


def test_dp_run_reports_epsilon_and_accountant(tmp_path: Path, saved_corpus: Path) -> None:
    args = ["--corpus", str(saved_corpus), "--size", "tiny", "--epochs", "2", "--batch-size", "6"]
    payload = run_json(*args, "--dp", "--epsilon", "4", "--out", str(tmp_path / "dp"))
    assert payload["private"] is True and 0 < payload["epsilon"] <= 4.0
    assert payload["accountant"] == "pld" and payload["delta"] == 1e-5
    assert payload["noise_multiplier"] > 0


def test_human_output(trained: tuple[Path, dict], saved_corpus: Path) -> None:
    out, _ = trained
    args = ["--corpus", str(saved_corpus), "--size", "tiny", "--epochs", "3"]
    result = invoke(*args, "--batch-size", "8", "--out", str(out))
    assert result.exit_code == 0, result.stderr
    assert "tiny GPT" in result.stdout and "non-private" in result.stdout


def test_a_text_corpus_too_small_for_the_planted_strings_is_refused(tmp_path: Path) -> None:
    text = tmp_path / "docs.txt"
    text.write_text("\n\n".join(f"paragraph {i} of some text" for i in range(12)))
    line = fails("--corpus", str(text), "--canary", "my PIN is {4829}", "--out", str(tmp_path))
    assert "member documents" in line


@pytest.mark.parametrize(
    ("args", "match"),
    [
        (["--size", "huge"], "unknown model size 'huge'"),
        (["--dp"], "--dp needs --epsilon"),
        (["--epsilon", "8"], "add --dp"),
        (["--dp", "--epsilon", "-1"], "epsilon"),
        (["--epochs", "0"], "epochs"),
        (["--canary", "a {12}", "--canary", "b {34}", "--repeats", "2"], "2 --canary"),
        (["--canary", "x" * 200 + " {1234}"], "context"),
        (["--documents", "8"], "member documents"),
    ],
)
def test_bad_input_is_one_line(tmp_path: Path, args: list[str], match: str) -> None:
    assert match in fails(*args, "--out", str(tmp_path / "m"))
    assert not (tmp_path / "m" / "model.json").exists()


def test_bad_corpus_files(tmp_path: Path, saved_corpus: Path) -> None:
    empty = tmp_path / "empty.txt"
    empty.write_text("\n\n  \n")
    assert "empty" in fails("--corpus", str(empty), "--out", str(tmp_path / "a"))
    assert "no text file" in fails("--corpus", str(tmp_path / "nope.txt"), "--out", str(tmp_path))
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    assert "not a privacylab corpus" in fails("--corpus", str(bad), "--out", str(tmp_path / "b"))
    line = fails("--corpus", str(saved_corpus), "--context", "64", "--out", str(tmp_path / "c"))
    assert "--context cannot change a saved corpus" in line
    blocker = tmp_path / "file"
    blocker.write_text("x")
    assert "not a folder" in fails("--corpus", str(saved_corpus), "--out", str(blocker))
