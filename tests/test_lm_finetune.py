"""Fine-tuning a publicly pretrained language model (Li et al. 2022's setting): the public corpus
(the pydoc chunks the private corpus does not use), `LMConfig.init` / `lm train --init`, and
the refusals (another size, context, not a model folder, another init on resume).

One tiny GPT is pretrained (module-scoped) on public chunks; the private corpus is a small
default corpus at context 48. Fine-tuned from it, the first epoch's training loss on the
private documents is below the same run from a random start."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from _cli import command
from privacylab.data.corpus import Corpus
from privacylab.data.corpus_build import CorpusConfig, build_corpus, public_corpus
from privacylab.data.errors import DataError
from privacylab.lm import (
    LMConfig,
    LMError,
    folder_digest,
    load_language_model,
    target_facts,
    train_language_model,
)

invoke, run_json, fails = command("lm", "train")

CONFIG = CorpusConfig(
    context=48,
    documents=300,
    record_copies=(1, 4),
    records_per_count=2,
    canary_repeats=(0, 2),
    seed=3,
)
PUBLIC_DOCUMENTS = 400


@pytest.fixture(scope="module")
def public() -> Corpus:
    return public_corpus(CONFIG)


@pytest.fixture(scope="module")
def private() -> Corpus:
    return build_corpus(CONFIG)


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory: pytest.TempPathFactory, public: Corpus) -> Path:
    small = Corpus(
        documents=public.documents[:PUBLIC_DOCUMENTS],
        members=np.ones(PUBLIC_DOCUMENTS, dtype=bool),
        context=public.context,
        config=public.config,
    )
    folder = tmp_path_factory.mktemp("pretrained")
    train_language_model(small, LMConfig(size="tiny", epochs=4, lr=1e-2, seed=1), folder)
    return folder


@pytest.fixture(scope="module")
def private_file(tmp_path_factory: pytest.TempPathFactory, private: Corpus) -> Path:
    folder = tmp_path_factory.mktemp("private")
    private.save(folder)
    return folder / "corpus.json"


def test_public_corpus_is_disjoint_from_the_private_one(public: Corpus, private: Corpus) -> None:
    assert not set(public.documents) & set(private.documents)
    planted = [r.text for r in private.records] + [c.text for c in private.canaries]
    assert planted and not any(t in d for t in planted for d in public.documents)
    assert public.members.all() and not public.records and not public.canaries
    assert public.context == private.context == 48
    assert all(len(d.encode()) <= 46 for d in public.documents)
    assert public.config["public"] is True and public.config["seed"] == 3
    # the public chunks and the private corpus's unplanted chunks together are all the chunks
    bare = build_corpus(replace(CONFIG, documents=None, record_copies=(), canary_repeats=()))
    used = build_corpus(replace(CONFIG, record_copies=(), canary_repeats=())).documents
    assert sorted([*public.documents, *used]) == sorted(bare.documents)


def test_public_corpus_is_deterministic_and_follows_the_seed(public: Corpus) -> None:
    assert public_corpus(CONFIG).to_dict() == public.to_dict()
    assert public_corpus(replace(CONFIG, seed=4)).documents != public.documents


def test_public_corpus_refuses_when_the_private_one_takes_everything() -> None:
    with pytest.raises(DataError, match="no public text"):
        public_corpus(replace(CONFIG, documents=None))


def test_init_starts_from_the_pretrained_weights(
    tmp_path: Path, pretrained: Path, private: Corpus
) -> None:
    base = LMConfig(size="tiny", epochs=1, lr=1e-2, seed=1)
    scratch = train_language_model(private, base, tmp_path / "scratch")
    tuned = train_language_model(private, replace(base, init=str(pretrained)), tmp_path / "tuned")
    first_scratch = scratch["history"][0]["train_loss"]
    first_tuned = tuned["history"][0]["train_loss"]
    assert first_tuned < first_scratch - 0.3, (first_tuned, first_scratch)
    assert tuned["perplexity"]["heldout"] < scratch["perplexity"]["heldout"]
    assert scratch["init"] is None
    assert tuned["init"] == {"folder": str(pretrained), "digest": folder_digest(pretrained)}
    assert target_facts(tmp_path / "tuned")["pretrained"] == pretrained.name
    assert target_facts(tmp_path / "scratch")["pretrained"] is None
    assert load_language_model(tmp_path / "tuned").language["init"]["folder"] == str(pretrained)
    # a re-run with the same init resumes; another init (or none) is refused
    again = train_language_model(private, replace(base, init=str(pretrained)), tmp_path / "tuned")
    assert math.isclose(again["perplexity"]["heldout"], tuned["perplexity"]["heldout"])
    with pytest.raises(LMError, match="other weights"):
        train_language_model(private, base, tmp_path / "tuned")
    with pytest.raises(LMError, match="other weights"):
        train_language_model(private, replace(base, init=str(pretrained)), tmp_path / "scratch")


def test_cli_fine_tunes_and_records_the_init(
    tmp_path: Path, pretrained: Path, private_file: Path
) -> None:
    out = tmp_path / "cli"
    payload = run_json(
        "--corpus", str(private_file), "--size", "tiny", "--epochs", "1",
        "--init", str(pretrained), "--out", str(out),
    )  # fmt: skip
    assert payload["init"]["folder"] == str(pretrained)
    recorded = json.loads((out / "model.json").read_text())
    assert "init" in json.dumps(recorded)
    assert target_facts(out)["pretrained"] == pretrained.name


def test_cli_refuses_a_mismatched_init(tmp_path: Path, pretrained: Path, private_file: Path):
    common = ("--corpus", str(private_file), "--epochs", "1")
    line = fails(
        *common, "--size", "small", "--init", str(pretrained), "--out", str(tmp_path / "a")
    )
    assert "--init" in line and "size" in line
    line = fails(
        "--corpus", "default", "--documents", "200", "--context", "64", "--size", "tiny",
        "--init", str(pretrained), "--out", str(tmp_path / "b"),
    )  # fmt: skip
    assert "context 48" in line and "context 64" in line
    missing = tmp_path / "nowhere"
    line = fails(*common, "--size", "tiny", "--init", str(missing), "--out", str(tmp_path / "c"))
    assert "not a model folder" in line
    empty = tmp_path / "empty"
    empty.mkdir()
    line = fails(*common, "--size", "tiny", "--init", str(empty), "--out", str(tmp_path / "d"))
    assert str(empty) in line


def test_cli_builds_the_public_corpus(tmp_path: Path) -> None:
    line = fails("--corpus", "public", "--canary", "my PIN is {1234}", "--out", str(tmp_path))
    assert "public" in line
    out = tmp_path / "public"
    payload = run_json(
        "--corpus", "public", "--documents", "8000", "--context", "48", "--size", "tiny",
        "--epochs", "1", "--out", str(out),
    )  # fmt: skip
    expected = public_corpus(CorpusConfig(context=48, documents=8000, seed=0))
    assert load_language_model(out).corpus.to_dict() == expected.to_dict()
    assert payload["documents"] == {"members": len(expected.documents), "heldout": 0}
    assert payload["init"] is None
