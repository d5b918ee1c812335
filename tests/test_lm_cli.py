"""`privacylab lm train`: the JSON contract, the model folder it writes, and one-line refusals
(exit 2) for bad input."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from _cli import command
from privacylab.cli.lm import _fit_planted
from privacylab.data.corpus import Corpus, Record, load_corpus
from privacylab.data.corpus_build import CorpusConfig
from privacylab.lm import language_target, load_language_model, target_facts

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


def test_a_text_corpus_end_to_end(tmp_path: Path) -> None:
    """A .txt file's paragraphs become the documents, the default planted strings shrink to
    what its 20 member documents hold (a note on stderr), the user's canary is planted as
    asked, and the model folder is a target."""
    text = tmp_path / "docs.txt"
    paragraphs = [f"paragraph {i} tells of\nsome text and words" for i in range(40)]
    text.write_text("\n\n".join(paragraphs) + "\n")
    out = tmp_path / "m"
    args = ["--corpus", str(text), "--context", "48", "--size", "tiny", "--epochs", "2"]
    result = invoke(*args, "--canary", "my PIN is {4829}", "--repeats", "2", "--out", str(out))
    assert result.exit_code == 0, result.stderr
    assert "note: 20 member documents hold records planted 1-2 times" in result.stderr
    assert "not records planted 1-64 times" in result.stderr
    corpus = load_language_model(out).corpus
    assert len(corpus.documents) == 40 and len(corpus.member_indices) == 20
    assert corpus.config["record_copies"] == [1, 2]
    assert corpus.config["canary_repeats"] == [0, 1, 2]
    (user,) = [c for c in corpus.canaries if c.user]
    assert user.text == "my PIN is 4829" and user.repeats == 2 and len(user.documents) == 2
    planted = [d for r in corpus.records for d in r.documents]
    planted += [d for c in corpus.canaries for d in c.documents]
    assert len(planted) == len(set(planted)) == 4 * 3 + 3 + 2
    assert set(planted) <= set(corpus.member_indices.tolist())
    for i, document in enumerate(corpus.documents):
        if i not in planted:
            assert document == " ".join(paragraphs[i].split())
    target = language_target(out)
    target.token_log_probs(target.tokenizer.batch([user.text], 48))
    assert target.queries == 1


def test_the_default_corpus_fits_a_few_documents(tmp_path: Path) -> None:
    """The issue's command line on a small default corpus: --documents 60 (30 members)."""
    out = tmp_path / "m"
    result = invoke(
        "--corpus",
        "default",
        "--size",
        "tiny",
        "--documents",
        "60",
        "--epochs",
        "1",
        "--out",
        str(out),
        "--json",
    )
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["documents"] == {"members": 30, "heldout": 30}
    assert (
        "note: 30 member documents hold records planted 1-2 times and canaries planted "
        "0-4 times" in result.stderr
    )
    corpus = load_corpus(out)
    need = sum(r.copies for r in corpus.records) + sum(c.repeats for c in corpus.canaries)
    assert need == 4 * (1 + 2) + (1 + 2 + 4) <= 30


@pytest.mark.parametrize(
    ("members", "users", "records", "canaries"),
    [
        (571, (), (1, 2, 4, 8, 16, 32, 64), (0, 1, 2, 4, 8, 16, 32)),
        (570, (), (1, 2, 4, 8, 16, 32), (0, 1, 2, 4, 8, 16, 32)),
        (187, (), (1, 2, 4, 8, 16), (0, 1, 2, 4, 8, 16, 32)),
        (186, (), (1, 2, 4, 8, 16), (0, 1, 2, 4, 8, 16)),
        (60, (("a {12}", 30),), (1, 2), (0, 1, 2, 4)),
        (0, (), (), (0,)),
    ],
)
def test_planted_counts_shrink_to_the_member_documents(
    members: int, users: tuple, records: tuple, canaries: tuple
) -> None:
    """The largest count of either kind goes first, records on a tie; the defaults need
    4 * 127 + 63 = 571 documents."""
    config = CorpusConfig(user_canaries=users)
    fitted = _fit_planted(config, members)
    assert (fitted.record_copies, fitted.canary_repeats) == (records, canaries)
    assert (fitted is config) == (members >= 571)
    assert 4 * sum(records) + sum(canaries) + sum(r for _, r in users) <= members


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
        (["--context", "100000"], "--context must be a whole number in [32, 1,024]"),
        (["--context", "24", "--documents", "300"], "--context must be a whole number in [32"),
        (
            ["--documents", "60", "--dp", "--epsilon", "8", "--batch-size", "99"],
            "batch size 99 exceeds the 30 member documents",
        ),
        (["--documents", "8", "--canary", "a {12}", "--repeats", "5"], "need 5 distinct member"),
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
