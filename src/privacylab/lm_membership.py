"""The LM membership-inference job: every membership attack of `privacylab.attacks.language`
on one trained language model (a model folder of `privacylab lm train`), measured on the one
metrics path (`privacylab.report.metrics.membership_metrics`).

Candidates (Duan et al. 2024, "Do Membership Inference Attacks Work on Large Language Models?",
Sec. 3): members are training documents WITHOUT planted strings (records and canaries, whose
repetition would make membership trivially visible and belongs to extraction and exposure),
non-members are held-out documents of the same distribution; a seeded, balanced sample of up
to `documents` of each. The attacker sees the texts only, in a seeded shuffled order (members
are not first); the truth is attached after scoring.

The run is `schemas.md`'s "membership run": target facts, reference facts, document counts,
per attack its `MembershipMetrics` with a ROC curve of at most `ROC_POINTS` points, the attack
names by AUC (best first), the queries sent to the target and the seconds taken.

Resumable: with a `ResultStore`, each attack's per-document scores (with its queries, seconds
and parameters) are stored as soon as it finishes, keyed by the bytes of the target and
reference folders, the attack, its options and the documents scored; a re-run (after a kill,
or with more attacks) reads them back instead of querying the model again, and its metrics
are recomputed from them on the one metrics path. `resumed` counts the attacks read back.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from torch import nn

from privacylab.attacks.language import LanguageError, language_names, make_language
from privacylab.attacks.language.membership import LMMembershipTask, run_lm_membership
from privacylab.attacks.membership.result import MembershipResult
from privacylab.data.corpus import Corpus
from privacylab.execution.store import ResultStore, config_key
from privacylab.report.metrics import membership_metrics
from privacylab.stats.roc import roc_curve
from privacylab.target.language import LanguageTarget

__all__ = [
    "DEFAULT_ATTACKS",
    "ROC_POINTS",
    "choose_attacks",
    "membership_documents",
    "membership_run",
    "roc_points",
    "run_lm_membership_job",
]

DEFAULT_ATTACKS = ("loss", "zlib", "reference", "lowercase", "min-k", "min-k++")
"""Every LM membership attack, in the order of Duan et al. 2024's tables."""

ROC_POINTS = 200
"""The most ROC points kept per attack in a run (the report draws them)."""

NAMESPACE = "lm-membership"
"""The result-store namespace of finished attacks."""

Progress = Callable[[str, float, float], None]


def choose_attacks(attacks: Sequence[str] | str, *, reference: bool) -> list[str]:
    """The registered membership attacks named in `attacks` (a list or "a,b"), by their
    registered names, in order, without repeats. LanguageError naming the choices for an
    unknown name; "reference" without a reference model is an error unless `attacks` is the
    default set, which then drops it."""
    names = [a.strip() for a in attacks.split(",")] if isinstance(attacks, str) else list(attacks)
    names = [n for n in names if n]
    if not names:
        raise LanguageError(
            f"no membership attack named; choose from {', '.join(language_names('membership'))}"
        )
    default = tuple(names) == DEFAULT_ATTACKS
    chosen: list[str] = []
    for name in names:
        registered = make_language(name, "membership").name
        if registered == "reference" and not reference:
            if default:
                continue
            raise LanguageError("the reference attack needs a reference model (--reference DIR)")
        if registered not in chosen:
            chosen.append(registered)
    return chosen


def _planted(corpus: Corpus) -> set[int]:
    return {int(d) for p in [*corpus.records, *corpus.canaries] for d in p.documents}


def membership_documents(
    corpus: Corpus, documents: int = 500, seed: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """(member indices, held-out indices), sorted: a seeded sample of min(`documents`,
    clean members, clean held-out) of each, where clean means holding no planted record or
    canary."""
    if isinstance(documents, bool) or not isinstance(documents, int) or documents < 1:
        raise LanguageError(f"documents must be a whole number >= 1, got {documents!r}")
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise LanguageError(f"seed must be a whole number >= 0, got {seed!r}")
    planted = _planted(corpus)
    members = np.asarray([i for i in corpus.member_indices if int(i) not in planted], dtype=int)
    heldout = np.asarray([i for i in corpus.heldout_indices if int(i) not in planted], dtype=int)
    count = min(documents, members.size, heldout.size)
    if count == 0:
        raise LanguageError(
            f"the corpus has {members.size} member documents without planted strings and "
            f"{heldout.size} held-out documents: membership inference needs both"
        )
    rng = np.random.default_rng(seed)
    return (
        np.sort(rng.choice(members, count, replace=False)),
        np.sort(rng.choice(heldout, count, replace=False)),
    )


def roc_points(scores: np.ndarray, membership: np.ndarray, most: int = ROC_POINTS) -> dict:
    """The ROC curve of `scores` (`privacylab.stats.roc.roc_curve`) thinned to at most `most`
    of its points: half evenly spaced along the curve, half geometrically spaced from its start
    (the low-FPR region that a log-log ROC shows, Carlini et al. 2022, Sec. 4), its first (0, 0)
    and last (1, 1) kept."""
    fpr, tpr, _ = roc_curve(scores, membership)
    if fpr.size > most:
        last = fpr.size - 1
        even = np.linspace(0, last, most // 2)
        early = np.geomspace(1, last, most - most // 2)
        keep = np.unique(np.round(np.r_[0, even, early]).astype(int))[:most]
        if keep[-1] != last:
            keep[-1] = last
        fpr, tpr = fpr[keep], tpr[keep]
    return {"fpr": [float(x) for x in fpr], "tpr": [float(x) for x in tpr]}


def membership_run(
    target: LanguageTarget,
    corpus: Corpus,
    *,
    facts: dict[str, Any],
    reference: nn.Module | None = None,
    reference_facts: dict[str, Any] | None = None,
    attacks: Sequence[str] | str = DEFAULT_ATTACKS,
    documents: int = 500,
    seed: int = 0,
    batch_size: int = 64,
    store: ResultStore | None = None,
    identity: str | None = None,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """The membership run of `attacks` on `target`, trained on `corpus` (module docstring);
    `facts` describe the target (`privacylab.lm.target_facts`), `reference_facts` the
    reference model. With `store`, finished attacks are stored under keys that include
    `identity` (what names the target and reference models, e.g. a digest of their files;
    required with a store) and read back on a re-run."""
    if store is not None and not identity:
        raise LanguageError("a result store needs the identity of the models it stores for")
    start = time.perf_counter()
    names = choose_attacks(attacks, reference=reference is not None)
    members, heldout = membership_documents(corpus, documents, seed)
    order = np.random.default_rng(seed).permutation(np.concatenate([members, heldout]))
    truth = np.isin(order, members).astype(int)
    task = LMMembershipTask(corpus.texts(order), reference)
    queries = 0
    resumed = 0
    rows = []
    for i, name in enumerate(names):
        if progress is not None:
            progress(f"membership: attack {name}", i, len(names))
        attack = make_language(name, "membership", batch_size=batch_size)
        key = config_key(
            {
                "models": identity,
                "attack": name,
                "params": attack.params(),
                "documents": [int(d) for d in order],
            }
        )
        done = store.get(NAMESPACE, key) if store is not None else None
        if done is not None:
            result = _stored_result(done, truth)
            resumed += 1
        else:
            result = run_lm_membership(attack, target, task, truth)
            if store is not None:
                store.put(NAMESPACE, key, _storable(result))
        queries += result.queries
        row = {"name": name, **membership_metrics(result).to_dict()}
        row["params"] = result.params
        row["roc"] = roc_points(result.scores, result.membership)
        rows.append(row)
    if progress is not None:
        progress("membership", len(names), len(names))
    ranked = sorted(rows, key=lambda r: -(r["auc"] if r["auc"] is not None else -1.0))
    return {
        "target": facts,
        "reference": reference_facts if reference is not None else None,
        "documents": {"members": int(members.size), "heldout": int(heldout.size)},
        "attacks": rows,
        "order": [r["name"] for r in ranked],
        "queries": int(queries),
        "resumed": resumed,
        "seconds": time.perf_counter() - start,
    }


def _storable(result: MembershipResult) -> dict[str, Any]:
    return {
        "attack": result.attack,
        "access": result.access,
        "scores": [float(x) if math.isfinite(x) else repr(float(x)) for x in result.scores],
        "queries": int(result.queries),
        "seconds": float(result.seconds),
        "params": result.params,
    }


def _stored_result(done: dict[str, Any], truth: np.ndarray) -> MembershipResult:
    return MembershipResult(
        attack=str(done["attack"]),
        scores=np.asarray([float(x) for x in done["scores"]]),
        membership=truth,
        access=str(done["access"]),
        queries=int(done["queries"]),
        seconds=float(done["seconds"]),
        params=dict(done["params"]),
    )


def run_lm_membership_job(
    target_dir: str | Path,
    *,
    reference: str | Path | None = None,
    attacks: Sequence[str] | str = DEFAULT_ATTACKS,
    documents: int = 500,
    seed: int = 0,
    device: str = "cpu",
    store: str | Path | None = None,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """`membership_run` on the model folder `target_dir` (written by `privacylab lm train`),
    with the model folder `reference` as the attacker's reference model: the schemas.md
    membership run. With `store` (a SQLite file), finished attacks are stored and a re-run
    resumes. Attack names are checked before any model is loaded."""
    choose_attacks(attacks, reference=reference is not None)
    from privacylab.lm import folder_digest, language_target, load_language_model, target_facts

    loaded = load_language_model(target_dir)
    target = language_target(target_dir, "scores", device=device, loaded=loaded)
    reference_model = None
    reference_facts = None
    if reference is not None:
        reference_loaded = load_language_model(reference)
        reference_model = reference_loaded.model
        reference_facts = target_facts(reference, reference_loaded)
    options: dict[str, Any] = {
        "facts": target_facts(target_dir, loaded),
        "reference": reference_model,
        "reference_facts": reference_facts,
        "attacks": attacks,
        "documents": documents,
        "seed": seed,
        "progress": progress,
    }
    if store is None:
        return membership_run(target, loaded.corpus, **options)
    with ResultStore(store) as results:
        return membership_run(
            target,
            loaded.corpus,
            store=results,
            identity=folder_digest(target_dir, reference),
            **options,
        )
