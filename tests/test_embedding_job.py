"""The embedding attack job (`privacylab.embedding.run_embedding_attack`, Du et al. 2023,
DP-Forward, Sec. 6) on two tiny-BERT folders cut at the input embeddings and trained once for
the module: one non-private (users release f(X) in clear), one under DP-Forward at a small ε.

Token-wise inversion must recover the clear embeddings' tokens and fail on the noisy ones;
attribute chance is checked against the majority share read from the folder's own data; the
membership part has every metric on the one path; results are stored and read back without
loading the model, under a key that names the method, victims, seed and model.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import privacylab.dpforward as dpforward_job
from privacylab.data.reviews import CATEGORIES, load_reviews
from privacylab.dpforward import DPForwardConfig, load_dpforward, train_dpforward
from privacylab.embedding import (
    MIA_ATTACKS,
    NAMESPACE,
    RESULT_KEYS,
    EmbeddingJobError,
    model_digest,
    public_encoder,
    run_embedding_attack,
)
from privacylab.execution.store import ResultStore
from privacylab.models.minilm import tiny_bert
from privacylab.stats.embedding import majority_share

VICTIMS = 12
COMMON = {
    "encoder": "tiny",
    "position": "input",
    "documents": 96,
    "epochs": 1,
    "batch_size": 16,
    "max_len": 24,
    "seed": 0,
}


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("embedding-job")
    clear, noisy = root / "clear", root / "noisy"
    train_dpforward(DPForwardConfig(method="non-private", epsilon=None, **COMMON), clear)
    train_dpforward(DPForwardConfig(method="dp-forward", epsilon=1.0, **COMMON), noisy)
    return clear, noisy


@pytest.fixture(scope="module")
def runs(folders, tmp_path_factory):
    clear, noisy = folders
    store = tmp_path_factory.mktemp("embedding-store") / "runs.sqlite"
    return store, {
        "clear": run_embedding_attack(clear, "inversion-nn", victims=VICTIMS, store=store),
        "noisy": run_embedding_attack(noisy, "inversion-nn", victims=VICTIMS, store=store),
        "attribute": run_embedding_attack(clear, "attribute", victims=10_000, store=store),
    }


def _facts(folder):
    return json.loads((folder / "model.json").read_text())["facts"]


def test_result_has_exactly_the_schema_keys(folders, runs):
    clear, noisy = folders
    _, done = runs
    for name, result in done.items():
        assert tuple(result) == RESULT_KEYS, name
        json.dumps(result, allow_nan=False)
    for result, folder in ((done["clear"], clear), (done["noisy"], noisy)):
        facts = _facts(folder)
        assert result["target"] == facts
        for key in ("accuracy", "epsilon", "delta", "event", "accountant"):
            assert result[key] == facts[key]
        assert result["position"] == "input"
        assert result["attribute_accuracy"] is None and result["attribute_chance"] is None
    assert done["clear"]["epsilon"] is None and done["clear"]["event"] is None
    assert done["noisy"]["epsilon"] > 0 and done["noisy"]["accountant"]
    assert done["attribute"]["inversion_recall"] is None
    assert done["attribute"]["examples"] == []


def test_token_wise_inversion_succeeds_in_clear_and_fails_under_dp_forward(runs):
    _, done = runs
    assert done["clear"]["inversion_recall"] >= 0.9
    assert done["noisy"]["inversion_recall"] < 0.2
    for result in (done["clear"], done["noisy"]):
        assert result["queries"] >= VICTIMS
        assert 1 <= len(result["examples"]) <= 5


def test_inversion_examples_are_victims_texts(folders, runs):
    clear, _ = folders
    _, done = runs
    texts = " ".join(load_reviews(clear / "reviews.json").subset("test").texts).lower()
    for example in done["clear"]["examples"]:
        words = [w for w in example["truth"].split() if w.isalpha()]
        assert words and all(w in texts for w in words)
        recovered = set(example["recovered"].split())
        assert len(recovered & set(example["truth"].split())) >= 0.8 * len(
            set(example["truth"].split())
        )


def test_attribute_chance_is_the_victims_majority_share(folders, runs):
    clear, _ = folders
    _, done = runs
    attributes = load_reviews(clear / "reviews.json").subset("test").attributes
    shares = np.bincount(attributes, minlength=len(CATEGORIES)) / len(attributes)
    result = done["attribute"]
    assert result["attribute_chance"] == pytest.approx(float(shares.max()))
    assert result["attribute_chance"] == pytest.approx(majority_share(attributes))
    assert 0.0 <= result["attribute_accuracy"] <= 1.0
    assert result["queries"] >= len(attributes)


def test_membership_metrics_on_the_one_path(folders, runs):
    clear, _ = folders
    _, done = runs
    reviews = load_reviews(clear / "reviews.json")
    pairs = min(VICTIMS, len(reviews.subset("train")), len(reviews.subset("test")))
    for result in (done["clear"], done["noisy"]):
        assert set(result["mia"]) == set(MIA_ATTACKS)
        for name, row in result["mia"].items():
            assert row["attack"] == name and row["access"] == "scores"
            assert row["examples"] == 2 * pairs and row["queries"] == 2 * pairs
            for key in ("auc", "tpr_at_1_fpr", "tpr_at_1pct_fpr", "advantage"):
                assert 0.0 <= row[key] <= 1.0, key
        assert result["mia_auc"] == max(row["auc"] for row in result["mia"].values())


def test_a_stored_run_is_read_back_without_loading_the_model(folders, runs, monkeypatch):
    clear, noisy = folders
    store, done = runs

    def refuse(*args, **kwargs):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(dpforward_job, "load_dpforward", refuse)
    again = run_embedding_attack(clear, "inversion-nn", victims=VICTIMS, store=store)
    assert again == done["clear"]
    with ResultStore(store) as results:
        assert results.count(NAMESPACE) == 3
        assert (
            run_embedding_attack(noisy, "inversion-nn", victims=VICTIMS, store=results)
            == (done["noisy"])
        )
    for other in (
        {"victims": VICTIMS + 1},
        {"victims": VICTIMS, "seed": 1},
    ):
        with pytest.raises(AssertionError, match="loaded"):
            run_embedding_attack(clear, "inversion-nn", store=store, **other)
    with pytest.raises(AssertionError, match="loaded"):
        run_embedding_attack(clear, "inversion-opt", victims=VICTIMS, store=store)
    assert model_digest(clear) != model_digest(noisy)


def test_default_store_is_in_the_folder_and_runs_are_seeded(folders, tmp_path):
    _, noisy = folders
    first = run_embedding_attack(noisy, "inversion-nn", victims=4, seed=3)
    assert (noisy / "embedding.sqlite").is_file()
    fresh = run_embedding_attack(noisy, "inversion-nn", victims=4, seed=3, store=tmp_path / "s")
    assert fresh["inversion_recall"] == first["inversion_recall"]
    assert fresh["examples"] == first["examples"]
    for name, row in first["mia"].items():
        same = {k: v for k, v in fresh["mia"][name].items() if k != "seconds"}
        assert same == {k: v for k, v in row.items() if k != "seconds"}


def test_bad_input_is_one_line_before_any_model_is_loaded(folders, tmp_path, monkeypatch):
    clear, _ = folders
    monkeypatch.setattr(dpforward_job, "load_dpforward", None)
    empty = tmp_path / "empty"
    empty.mkdir()
    fake = tmp_path / "fake"
    fake.mkdir()
    for name in ("model.safetensors", "reviews.json"):
        (fake / name).write_bytes(b"x")
    (fake / "model.json").write_text('{"language": {}}')
    cases = [
        ((clear, "inversion"), "unknown method"),
        ((clear, "inversion-nn"), "victims must", {"victims": 0}),
        ((clear, "inversion-nn"), "victims must", {"victims": True}),
        ((clear, "attribute"), "seed must", {"seed": -1}),
        ((tmp_path / "missing", "attribute"), "not a model folder"),
        ((empty, "attribute"), "not a DP-Forward model folder"),
        ((fake, "attribute"), "not a DP-Forward model folder"),
    ]
    for case in cases:
        args, message, options = case[0], case[1], case[2] if len(case) > 2 else {}
        with pytest.raises(EmbeddingJobError, match=message) as caught:
            run_embedding_attack(*args, **options)
        assert "\n" not in str(caught.value)
    assert not (fake / "embedding.sqlite").exists()


def test_public_encoder_is_the_tiny_bert_the_run_started_from(folders):
    clear, _ = folders
    loaded = load_dpforward(clear)
    state = torch.get_rng_state()
    public = public_encoder(loaded)
    assert torch.equal(torch.get_rng_state(), state)  # seeded without touching torch's own
    start = tiny_bert(layers=2, max_len=COMMON["max_len"], seed=COMMON["seed"])
    theirs = start.state_dict()
    for key, value in public.state_dict().items():
        assert torch.equal(value, theirs[key]), key
    trained = loaded.model.encoder.state_dict()
    assert any(not torch.equal(trained[k], theirs[k]) for k in theirs)


def test_relaxation_inversion_runs_through_the_job(folders, tmp_path):
    clear, _ = folders
    result = run_embedding_attack(clear, "inversion-opt", victims=2, store=tmp_path / "s")
    assert tuple(result) == RESULT_KEYS and result["method"] == "inversion-opt"
    assert result["inversion_recall"] >= 0.8
    assert len(result["examples"]) == 2


def test_baseline_read_at_another_cut(folders, tmp_path):
    """A model without a release layer is read at any cut (one baseline serves every position):
    its own row per cut, the clear layer-1 rows still inverted; a DP-Forward model is refused
    elsewhere than its cut, and a bad cut is one line."""
    clear, noisy = folders
    store = tmp_path / "cut.sqlite"
    result = run_embedding_attack(
        clear, "inversion-nn", victims=VICTIMS, store=store, position="layer:1"
    )
    assert result["position"] == "layer:1"
    assert result["target"]["position"] == "layer:1"
    assert result["target"]["folder"].endswith("@layer:1")
    assert result["inversion_recall"] > 0.5
    assert 0.0 <= result["inversion_baseline_recall"] < result["inversion_recall"]
    same = run_embedding_attack(clear, "inversion-nn", victims=VICTIMS, store=store)
    assert same["position"] == "input" and same["target"]["folder"] == str(clear)
    with pytest.raises(EmbeddingJobError, match="releases only at its cut input"):
        run_embedding_attack(noisy, "inversion-nn", victims=VICTIMS, position="output")
    with pytest.raises(EmbeddingJobError, match="out of range"):
        run_embedding_attack(clear, "inversion-nn", victims=VICTIMS, position="layer:9")


def test_a_result_stored_by_an_older_job_is_computed_again(folders, tmp_path, monkeypatch):
    """A run stored before `inversion_baseline_recall` joined `RESULT_KEYS` (under the old key:
    method, victims, seed, model) is not read back as a result missing a key: the run is
    computed again."""
    from privacylab.execution.store import config_key

    clear, _ = folders
    store = tmp_path / "old.sqlite"
    fields = {"method": "inversion-nn", "victims": 3, "seed": 0, "model": model_digest(clear)}
    older = {k: None for k in RESULT_KEYS if k != "inversion_baseline_recall"}
    with ResultStore(store) as results:
        results.put(NAMESPACE, config_key(fields), older)

    def refuse(*args, **kwargs):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(dpforward_job, "load_dpforward", refuse)
    with pytest.raises(AssertionError, match="loaded"):
        run_embedding_attack(clear, "inversion-nn", victims=3, store=store)
