"""`privacylab attack exposure`: one JSON object (the schemas.md "exposure run") on stdout,
progress on stderr, `--out` merges the run into results.json / index.html (#language-models),
a re-run resumes from the store, and bad input is one `error:` line with exit code 2."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from _cli import command
from privacylab.data.corpus import Canary, Corpus
from privacylab.data.tokenizer import VOCAB_SIZE
from privacylab.models import ModelSpec, save_model

invoke, run_json, fails = command("attack", "exposure")


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An untrained tiny GPT's model folder with two canaries (3 and 2 digits), one of them
    planted, and a user canary without a candidate space."""
    out = tmp_path_factory.mktemp("exposure-cli") / "model"
    documents = ["pin 123 is set", "the cat sat", "a dog ran", "pin 123 is set", "we sat far"]
    canaries = [
        Canary("pin ", "123", "0123456789", 3, 2, (0, 3), suffix=" is"),
        Canary("key ", "42", "0123456789", 2, 0, ()),
        Canary("my note", "", "", 0, 1, (1,), user=True),
    ]
    corpus = Corpus(documents, np.array([1, 1, 1, 1, 0], bool), canaries=canaries, context=24)
    spec = ModelSpec("gpt", (24,), VOCAB_SIZE, {"dim": 16, "heads": 2, "blocks": 1})
    language = {"size": "tiny", "parameters": 1, "context": 24, "private": False,
                "epsilon": None, "delta": None, "accountant": None, "noise_multiplier": None,
                "epochs": 0, "seconds": 0.0,
                "perplexity": {"members": 259.0, "heldout": 259.0}}  # fmt: skip
    corpus.save(out)
    save_model(spec.build(seed=0), out, spec, metadata={"language": language})
    return out


def test_json_is_the_exposure_run(folder: Path, tmp_path: Path) -> None:
    run = run_json("--target", str(folder), "--samples", "50", "--store", str(tmp_path / "s.db"))
    assert run["target"]["folder"] == str(folder) and run["target"]["size"] == "tiny"
    assert run["method"] == "auto"
    rows = {c["prefix"]: c for c in run["canaries"]}
    assert set(rows) == {"pin ", "key "}
    assert rows["pin "]["space_bits"] == pytest.approx(math.log2(1000))
    assert rows["key "]["space_bits"] == pytest.approx(math.log2(100))
    for row in rows.values():
        assert row["method"] == "enumerate" and row["user"] is False
        assert 0.0 <= row["exposure"] <= row["space_bits"] + 1e-9
        assert row["exposure"] == pytest.approx(row["space_bits"] - math.log2(row["rank"]))
    assert run["queries"] == (1 + 10 + 100 + 1000) + (1 + 10)
    assert any("my note" in note for note in run["notes"])
    again = run_json("--target", str(folder), "--samples", "50", "--store", str(tmp_path / "s.db"))
    assert again["formats_resumed"] == 2 and again["canaries"] == run["canaries"]


def test_extrapolate_and_report(folder: Path, tmp_path: Path) -> None:
    out = tmp_path / "report"
    run = run_json("--target", str(folder), "--method", "extrapolate", "--samples", "60",
                   "--store", str(tmp_path / "s.db"), "--out", str(out))  # fmt: skip
    assert {c["method"] for c in run["canaries"]} == {"extrapolate"}
    assert run["queries"] == 2 * (60 + 1)
    saved = json.loads((out / "results.json").read_text())
    assert saved["language"]["exposure"][0]["target"]["folder"] == str(folder)
    assert (out / "index.html").is_file()


def test_terminal_summary(folder: Path, tmp_path: Path) -> None:
    result = invoke("--target", str(folder), "--samples", "50", "--store", str(tmp_path / "t.db"))
    assert result.exit_code == 0, result.stderr
    assert "exposure of 2 canaries" in result.stdout and "log2|R|" in result.stdout
    assert "my note" in result.stderr


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (("--target", "/nonexistent/model"), "--target"),
        (("--method", "guess"), "--method"),
        (("--samples", "2"), "--samples"),
        (("--enumerate-limit", "0"), "--enumerate-limit"),
        (("--device", "tpu"), "device"),
    ],
)
def test_bad_input_is_one_line(folder: Path, args: tuple[str, ...], needle: str) -> None:
    full = args if args[0] == "--target" else ("--target", str(folder), *args)
    assert needle in fails(*full)


def test_a_folder_without_a_model_is_refused(tmp_path: Path) -> None:
    assert "error:" in fails("--target", str(tmp_path))
