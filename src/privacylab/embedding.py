"""The embedding attack job: what an untrusted service learns from the embeddings users release
to a DP-Forward model (or to a non-private / DP-SGD one cut at the same place), and whether the
deployed classifier leaks membership.

Du et al. 2023 ("DP-Forward: Fine-tuning and Inference on Language Models with Differential
Privacy in Forward Pass", CCS'23, Sec. 6) evaluate three threats on one fine-tuned model:

- embedding inversion (Sec. 6.3): recover a victim's tokens from the matrix released at the cut,
  token-wise nearest neighbour on the public input-embedding table ("inversion-nn") or an
  optimisation over a softmax relaxation of the tokens for deeper layers ("inversion-opt"), both
  with the public pretrained encoder the model was fine-tuned from; success is token recall;
- sensitive attribute inference (Sec. 6.4): a classifier trained on released embeddings of
  auxiliary data labelled with the attribute ("attribute"); success is accuracy against the
  majority-class share (chance);
- sequence-level membership inference (Sec. 6.2): the confidence- and entropy-threshold
  attacks (Song & Mittal 2021, Eqs. 3-4) on the deployed classifier's probability vectors,
  members from the training split against as many non-members from the test split;
  `mia_auc` is the higher of their two AUCs (the stronger attack), `mia` holds each one's
  metrics from the one metrics path.

`run_embedding_attack` loads a model folder of `privacylab dpforward train`
(`privacylab.dpforward.load_dpforward`), puts its classifier behind an `EmbeddingTarget` at
the model's cut (what a user releases there: f(X) + Z under DP-Forward, the clear f(X)
otherwise), draws `victims` test sequences (seeded), obtains their released embeddings through
the target (counted as queries), gives the attack only the side information it declares, and
returns `schemas.md` §5's result. The truth (victims' tokens, attributes, membership) is
attached only after the attack has answered. With a `ResultStore` (default
FOLDER/embedding.sqlite) the result is stored under (method, victims, seed, model digest, cut
when given, `RESULT_KEYS`) and a re-run reads it back; a result stored with other keys (an
older version of this job) is computed again.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from privacylab.errors import PrivacylabError
from privacylab.execution.store import ResultStore, config_key
from privacylab.target import Target

__all__ = [
    "METHODS",
    "MIA_ATTACKS",
    "RESULT_KEYS",
    "STORE_FILE",
    "EmbeddingJobError",
    "model_digest",
    "public_encoder",
    "run_embedding_attack",
]

METHODS = ("inversion-nn", "inversion-opt", "attribute")
"""The embedding attacks a run may name (`privacylab.attacks.embedding`)."""

MIA_ATTACKS = ("confidence", "entropy")
"""The membership attacks run on the deployed classifier (Du et al. 2023, Sec. 6.2)."""

RESULT_KEYS = (
    "method",
    "target",
    "accuracy",
    "epsilon",
    "delta",
    "event",
    "accountant",
    "position",
    "inversion_recall",
    "inversion_baseline_recall",
    "attribute_accuracy",
    "attribute_chance",
    "mia_auc",
    "mia",
    "examples",
    "queries",
    "seconds",
)
"""The keys of a run's result, exactly (schemas.md §5)."""

STORE_FILE = "embedding.sqlite"
"""Default result store, inside the model folder."""

NAMESPACE = "embedding-attack"
"""The result-store namespace of finished runs."""

EXAMPLES = 5
"""The most inversion examples (truth beside recovered text) a result keeps."""

FOLDER_FILES = ("model.safetensors", "model.json", "reviews.json")
"""What a DP-Forward model folder's digest covers: weights, sidecar and data."""

Progress = Callable[[str, float, float], None]


class EmbeddingJobError(PrivacylabError, ValueError):
    """Bad input to the embedding attack job (unknown method, victims < 1, not a model
    folder); one line."""


def _whole(name: str, value: object, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < low:
        raise EmbeddingJobError(f"{name} must be a whole number >= {low}, got {value!r}")
    return int(value)


def _method(method: object) -> str:
    name = str(method).strip().lower()
    if name not in METHODS:
        raise EmbeddingJobError(f"unknown method {method!r}; choose one of {', '.join(METHODS)}")
    return name


def _folder(folder: str | Path) -> tuple[Path, Any]:
    """The model folder and the config it was trained with (`forward_config`), or a one-line
    EmbeddingJobError before any weights are read."""
    from privacylab.dpforward import DPForwardError, forward_config

    path = Path(folder)
    if not path.is_dir():
        raise EmbeddingJobError(f"{path} is not a model folder")
    missing = [name for name in FOLDER_FILES if not (path / name).is_file()]
    if missing:
        raise EmbeddingJobError(
            f"{path} is not a DP-Forward model folder (no {', '.join(missing)}); "
            "write one with `privacylab dpforward train`"
        )
    try:
        return path, forward_config(path)
    except DPForwardError as error:
        raise EmbeddingJobError(f"{path} is not a DP-Forward model folder: {error}") from None


def model_digest(folder: str | Path) -> str:
    """sha256 of the weights, sidecar and data of the model folder: what a stored result was
    computed on, so that a re-run on another model never reads it back."""
    digest = hashlib.sha256()
    for name in FOLDER_FILES:
        digest.update(name.encode() + b"\0")
        path = Path(folder) / name
        if path.is_file():
            digest.update(path.read_bytes())
    return digest.hexdigest()


def public_encoder(loaded: Any, *, device: str = "cpu") -> nn.Module:
    """The pretrained encoder the model was fine-tuned from, as the attacker has it (public):
    for encoder "minilm" a fresh all-MiniLM-L6-v2 with the same layers, for "tiny" the tiny
    BERT's initial weights, rebuilt from the saved encoder config and the run's seed (as
    `privacylab.models.minilm.tiny_bert` seeds them)."""
    config = loaded.config
    if config.encoder == "minilm":
        from privacylab.models.minilm import load_minilm

        encoder = load_minilm(layers=config.layers)
    else:
        from privacylab.models.minilm import encoder_config, encoder_from_config

        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(config.seed)
            encoder = encoder_from_config(encoder_config(loaded.model.encoder))
    return encoder.to(device).eval()


def _decode(tokenizer: Any, ids: list[int]) -> str:
    from privacylab.models.minilm import CLS_ID, PAD_ID, SEP_ID

    kept = [int(t) for t in ids if int(t) not in (PAD_ID, CLS_ID, SEP_ID)]
    return str(tokenizer.decode(kept)).strip()


def _membership(
    loaded: Any, target: Target, count: int, seed: int
) -> tuple[float | None, dict[str, dict[str, Any]]]:
    """Du et al. 2023, Sec. 6.2: the confidence and entropy attacks (no shadow models, so
    threshold-free scores) on the deployed classifier's probability vectors; `count` members
    (train split) and `count` non-members (test split), seeded, at most as many as either split
    holds, queried through `target` (the deployed classifier at scores access); metrics on the
    one path (`privacylab.report.metrics.membership_metrics`). Returns the best AUC and each
    attack's metrics."""
    from privacylab.attacks.membership.base import MembershipTask, make_attack, run_attack
    from privacylab.models.minilm import encode_texts
    from privacylab.report.metrics import membership_metrics

    reviews = loaded.reviews
    train, test = reviews.subset("train"), reviews.subset("test")
    n = min(count, len(train), len(test))
    if n == 0:
        return None, {}
    rng = np.random.default_rng([seed, 1])
    members = np.sort(rng.choice(len(train), n, replace=False))
    others = np.sort(rng.choice(len(test), n, replace=False))
    texts = [train.texts[i] for i in members] + [test.texts[i] for i in others]
    labels = np.concatenate([train.labels[members], test.labels[others]])
    truth = np.r_[np.ones(n, dtype=int), np.zeros(n, dtype=int)]
    order = rng.permutation(2 * n)
    ids = encode_texts(loaded.tokenizer, [texts[i] for i in order], loaded.config.max_len)
    task = MembershipTask(ids, torch.as_tensor(labels[order]), loaded.model.num_classes)
    rows: dict[str, dict[str, Any]] = {}
    for name in MIA_ATTACKS:
        result = run_attack(make_attack(name, thresholds="global"), target, task, truth[order])
        row = membership_metrics(result).to_dict()
        row["tpr_at_1_fpr"] = row["tpr_at_1pct_fpr"]
        rows[name] = row
    aucs = [r["auc"] for r in rows.values() if r["auc"] is not None]
    return (max(aucs) if aucs else None), rows


def run_embedding_attack(
    folder: str | Path,
    method: str,
    *,
    victims: int = 200,
    seed: int = 0,
    store: ResultStore | str | Path | None = None,
    progress: Progress | None = None,
    device: str = "cpu",
    position: str | None = None,
) -> dict[str, Any]:
    """One embedding attack (`method`: inversion-nn, inversion-opt or attribute) and the
    membership attacks on the DP-Forward model folder `folder` (module docstring): the result of
    schemas.md §5 (`RESULT_KEYS`). `victims` test sequences (seeded by `seed`, at most the test
    split) are attacked; membership uses as many members and non-members each. `store`: a
    ResultStore or its file (default FOLDER/embedding.sqlite); a stored run is read back.
    Bad input is one-line EmbeddingJobError before any model is loaded.

    `position` reads a model without a release layer (non-private, DP-SGD) at another cut than
    the one it was trained with (its function is the same whatever its cut), so one baseline
    serves every position; the result's facts then name the folder as ``FOLDER@POSITION``, one
    report row per cut read. A DP-Forward model releases only at its own cut.
    `inversion_baseline_recall` is the recall of the recovered tokens against another victim's
    (`run_inversion`): what guessing common words alone scores."""
    name = _method(method)
    victims = _whole("victims", victims, 1)
    seed = _whole("seed", seed, 0)
    path, config = _folder(folder)
    fields: dict[str, Any] = {
        "method": name,
        "victims": victims,
        "seed": seed,
        "model": model_digest(path),
        "keys": list(RESULT_KEYS),
    }
    if position is not None:
        fields["position"] = position = _position(config, position)
    key = config_key(fields)
    opened = not isinstance(store, ResultStore)
    results = ResultStore(path / STORE_FILE if store is None else store) if opened else store
    try:
        done = results.get(NAMESPACE, key)
        if done is not None:
            if progress is not None:
                progress(f"embedding {name}: read back", 1, 1)
            return {k: done[k] for k in RESULT_KEYS}
        result = _run(path, name, victims, seed, device, progress, position)
        results.put(NAMESPACE, key, result)
        return result
    finally:
        if opened:
            results.close()


def _position(config: Any, position: object) -> str:
    """`position` checked against the model's `config`: a valid cut of its encoder, and the
    model's own cut when it is a DP-Forward model (it releases nothing elsewhere)."""
    from privacylab.models.encoder import parse_position
    from privacylab.models.errors import ModelError

    try:
        cut = str(parse_position(str(position), config.depth))
    except ModelError as error:
        raise EmbeddingJobError(str(error)) from None
    if config.method == "dp-forward" and cut != str(config.position):
        raise EmbeddingJobError(
            f"a DP-Forward model releases only at its cut {config.position}, not {cut}"
        )
    return cut


def _run(
    folder: Path,
    name: str,
    victims: int,
    seed: int,
    device: str,
    progress: Progress | None,
    position: str | None = None,
) -> dict[str, Any]:
    from privacylab.attacks.embedding import (
        EmbeddingTask,
        make_embedding,
        run_attribute,
        run_inversion,
    )
    from privacylab.data.reviews import CATEGORIES
    from privacylab.dpforward import load_dpforward
    from privacylab.models.minilm import encode_texts
    from privacylab.report.jsonable import json_ready
    from privacylab.target.embedding import EmbeddingTarget

    def step(stage: str, done: int) -> None:
        if progress is not None:
            progress(f"embedding {name}: {stage}", done, 4)

    start = time.perf_counter()
    step("load", 0)
    attack = make_embedding(name)
    loaded = load_dpforward(folder, device=device)
    release = getattr(loaded.model, "release", None)
    if release is not None:
        words = f"{name}/{victims}/{seed}/{position}".encode()
        release.start_session(int.from_bytes(hashlib.sha256(words).digest()[:4], "big"))
    config, facts, reviews = loaded.config, loaded.facts, loaded.reviews
    cut = str(config.position) if position is None else position
    if cut != str(config.position):
        facts = {**facts, "position": cut, "folder": f"{facts.get('folder', folder)}@{cut}"}
    target = EmbeddingTarget(
        loaded.model,
        "logits",
        position=cut,
        length=config.max_len,
        device=device,
    )
    test = reviews.subset("test")
    rng = np.random.default_rng(seed)
    chosen = np.sort(rng.choice(len(test), min(victims, len(test)), replace=False))
    ids = encode_texts(loaded.tokenizer, [test.texts[i] for i in chosen], config.max_len)
    step("release", 1)
    observed = target.embeddings(ids)
    released = target.queries
    aux = reviews.subset("aux")
    inversion = attack.kind == "inversion"
    task = EmbeddingTask(
        observed=observed,
        length=int(ids.shape[1]),
        public_encoder=public_encoder(loaded, device=device) if inversion else None,
        auxiliary_ids=encode_texts(loaded.tokenizer, list(aux.texts), config.max_len),
        auxiliary_attributes=np.asarray(aux.attributes, dtype=np.int64),
        attribute_names=tuple(CATEGORIES),
        seed=seed,
    )
    step(f"attack {name}", 2)
    recall = baseline = accuracy = chance = None
    examples: list[dict[str, str]] = []
    if inversion:
        inverted = run_inversion(
            attack,
            target,
            task,
            ids,
            decode=lambda tokens: _decode(loaded.tokenizer, tokens),
            examples=EXAMPLES,
        )
        recall, baseline, queries = inverted.recall, inverted.baseline_recall, inverted.queries
        examples = [{"truth": e["truth"], "recovered": e["recovered"]} for e in inverted.examples]
    else:
        inferred = run_attribute(attack, target, task, np.asarray(test.attributes)[chosen])
        accuracy, chance, queries = inferred.accuracy, inferred.chance, inferred.queries
    step("membership", 3)
    mia_auc, mia = _membership(loaded, target.with_access("scores"), victims, seed)
    step("done", 4)
    return json_ready(
        {
            "method": name,
            "target": facts,
            "accuracy": facts.get("accuracy"),
            "epsilon": facts.get("epsilon"),
            "delta": facts.get("delta"),
            "event": facts.get("event"),
            "accountant": facts.get("accountant"),
            "position": cut,
            "inversion_recall": recall,
            "inversion_baseline_recall": baseline,
            "attribute_accuracy": accuracy,
            "attribute_chance": chance,
            "mia_auc": mia_auc,
            "mia": mia,
            "examples": examples,
            "queries": released + int(queries),
            "seconds": time.perf_counter() - start,
        }
    )
