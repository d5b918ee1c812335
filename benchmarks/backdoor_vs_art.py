"""Backdoors: privacylab's BadNets and backdoor defences against IBM ART 1.20, on the same
poisoned training set and the same trained models.

    python benchmarks/backdoor_vs_art.py [--json] [--quick] [--cache DIR] [--seed 0]

Setting. mnist5k's canonical cut (4,000 / 1,000): 3,500 training rows for the victim, the
other 500 the defender's clean held-out rows, the 1,000 test rows for accuracy and attack
success rate (ASR, `privacylab.stats.backdoor.attack_success_rate`, defined once; ART has no
ASR of its own, so ART's predictions go through the same function). The victim's recipe is
`VictimRecipe()` (the family's default: the 784-512-256-10 ReLU MLP, Adam, 20 epochs).
``--quick``: 1,200 training rows, 300 clean, 500 test, 8 epochs, 10% poison only, one Neural
Cleanse restart of 5 epochs on 100 clean rows (a few minutes on a shared machine).

Attack (Gu et al. 2017). The poisoned rows are drawn once (seeded, non-target classes of the
victim's training rows, `poison_count(rate, 3500)` of them: 35 at 1%, 389 at 10%, target class
0), then stamped by both toolkits:

* ours: `make_backdoor("badnets", trigger=...)` over a `PoisonTask` whose source is exactly
  those rows (so it takes all of them, in order);
* ART: `PoisoningAttackBackdoor(perturbation).poison(x, y=onehot(0), broadcast=True)`.

Two triggers: ``art-pattern`` is ART's own `add_pattern_bd` (four white pixels in a 3x3 box two
pixels from the bottom-right corner), written for us as a `Trigger` with that mask at (24, 24);
``square:4@corner`` is our default, given to ART as a perturbation function (ART ships no
square). ART's `add_pattern_bd` assumes channels-last: on PyTorch's NCHW batch it raises
IndexError unless given ``channels_first=True`` (done here). The two poisoned sets are compared
byte for byte; when they are identical (they are:
``identical_poisons`` in the output) one model is trained on X ∪ P and both toolkits are
measured on it (ours through `run_poisoning`'s label queries, ART through
`PyTorchClassifier.predict` on ART-stamped test images). A clean model (same recipe, X
alone) gives the baseline accuracy and the trigger's ASR without a backdoor.

Defences, each on the same poisoned model and the same data (the truth: the poisons are the
last rows of X ∪ P):

* ``activation-clustering``: ours (whole activation of the layer feeding the last Linear,
  through a forward hook; whitened PCA to 10 dims — FastICA's sources are a rotation of
  it, so 2-means finds the same clusters —, seeded 2-means, small cluster < 35% and
  silhouette > 0.15) vs `ActivationDefence` **as shipped** (its default: PCA, cluster analysis
  "smaller", which marks the smaller cluster of *every* class as poison, and the layer
  ``layer_names[-1]``, which for an `nn.Sequential` is the *logits* layer) and **matched**
  (FastICA, "relative-size" 0.35, the model wrapped so that its last registered child is the
  same penultimate layer ours reads). ART 1.20.1's own "relative-size" analysis crashes
  (``ValueError: The truth value of an empty array is ambiguous`` — `analyze_by_relative_size`
  tests ``cluster_id in np.where(...)``, a tuple of arrays, and any class without a small
  cluster ends it: ``art_relative_size`` in the output), so "matched" runs ART's "smaller"
  clustering and keeps only the classes whose small cluster holds < 35% of the class — the
  relative-size rule applied to ART's own clusters and report.
* ``spectral``: ours (ε = 0.1, remove 1.5ε per label) vs `SpectralSignatureDefense` as shipped
  (``expected_pp_poison`` = 0.33, so half of every class is removed; logits layer) and matched
  (0.1, penultimate layer). ART scores ``‖v·R_i‖`` on the *uncentred* representations (its
  `spectral_signature_scores` centres only to find v), where Tran et al. Alg. 1 scores
  ``((R_i − R̂)·v)²``; BackdoorBench's issue #44 (SCLBD/BackdoorBench) asks the same of its
  own code; ART fixed an earlier spectral bug that flagged every clean image in PR #1189.
* ``strip``: ours (n = 20 superimpositions, boundary at the clean entropies' 1% quantile) vs
  `STRIP(classifier)(num_samples=20, false_acceptance_rate=0.01)` + ``mitigate(clean)`` (its
  "false acceptance rate" sets a normal fit's 1% quantile of *clean* entropies, i.e. an FRR).
  ART's transformer rewrites the wrapped classifier's ``__class__`` in place (the call returns
  the same object, now a ``STRIPMixin`` subclass): ``strip_rewrites_class_in_place`` in the
  output; ours returns a filter and never touches the model. ART abstains with an all-zero
  row; both are scored by `evaluate_mitigation` (a rejected input counts as neither correct nor
  a success), on the same test and triggered-test rows. ART's STRIP takes the entropy of
  whatever ``predict`` returns: on a model that outputs logits (ours, like most PyTorch
  classifiers) the entropies are NaN and ``mitigate`` fails in ``norm.fit`` ("The data
  contains non-finite values"), so ART gets the model followed by a softmax.
* ``neural-cleanse``: ART 1.20's `NeuralCleanse` transformer raises NotImplementedError for any
  classifier but Keras (``"Only Keras classifiers are supported for this defence."``; ART
  issue #871, Trusted-AI/adversarial-robustness-toolbox): it cannot run on a PyTorch model, so
  only ours is timed. Neural Cleanse is known to flag clean models and to vary run to run
  (VinAIResearch/input-aware-backdoor-attack-release issue #10: a clean model's anomaly index
  above 2; VinAIResearch/Warping-based_Backdoor_Attack-release issue #10: single NC runs
  unreliable) — ours takes the median over 3 restarts; `backdoor_defenses.py` measures its
  false-positive rate on clean models.
* ``fine-pruning``: ART has none; ours only.

Detection per defence: ``detected``, ``flagged_class`` (and whether it is the target),
precision and recall of the flagged training rows against the true poison rows (data
defences), STRIP's FRR (clean test rejected) and FAR (triggered non-target test inputs let
through), accuracy and ASR after the mitigation (ours: the defence's own; ART's AC/spectral:
our recipe retrained on the rows ART keeps, since ART only flags), and ``seconds`` of the
detection (retraining excluded for both, timed apart as ``retrain_seconds``); ``ratio`` =
our seconds / ART's. ART's `get_activations` registers a forward hook on the user's model at
every call and never removes it (``art_hooks_left`` counts them after the run); ART's
activation reading once took only the first channel of unflattened conv outputs (ART issue
#2313) — ours always reads the whole flattened activation through `layer_activations`.
ART's k-means is unseeded, so `np.random` is seeded before each ART call.

Measured (``OMP_NUM_THREADS=1 python benchmarks/backdoor_vs_art.py --json``, seed 0, ART
1.20.1, `VictimRecipe()` = the MLP at Adam 2e-3, one thread on a shared 2-core machine;
seconds are noisy):

* Attacks: both toolkits' poisoned sets are byte-identical for both triggers and both rates, so
  each pair shares one model and one ASR. ``art-pattern``: ASR 0.830 at 1% (35 poisons), 0.997
  at 10%; ``square:4@corner``: 0.979 at 1%, 0.997 at 10%; clean accuracy 0.949-0.953 against
  0.952 for the clean model (whose ASR is 0.003).
* Neural Cleanse (ours only; the defaults of commit 957d0d8 and after): both models flagged,
  class 0 named (anomaly index 2.54 / 2.20), unlearning ASR → 0.019 / 0.028 at accuracy 0.941 /
  0.943 (35 / 33 s).
* STRIP on the same filter metric: ours FAR 0.46 (1%) / 0.12 (10%) at FRR 0.007 / 0.013;
  ART FAR 0.99 / 0.97 at FRR 0.010 / 0.008; ours/ART seconds 0.11 / 0.15. ART superimposes by
  averaging (0.5·x + 0.5·x'), ours adds and clips as Gao et al.'s code does; ours with
  ``blend="average"`` on the earlier (Adam 1e-3) models gave FAR 0.95 / 0.51 against 0.68 /
  0.09 with "add", so the blend accounts for most of ART's failure (the rest: its normal-fit
  threshold and per-sample entropy sum).
* Activation clustering: ours flags nothing at either rate; ART as shipped flags the smaller
  cluster of every class (1,605 / 1,790 rows, precision 0.02 / 0.18, recall 0.77 / 0.82);
  ART matched names class 8 both times (precision 0.05 / 0.00, recall 0.74 / 0.00) and its
  retrained model keeps ASR 0.60 / 0.99.
* Spectral signatures (ε = 0.1, 15% of each label removed): ours precision 0.03 / 0.10, recall
  0.51 / 0.15, ASR after retraining 0.92 / 1.00; ART matched precision 0.04 / 0.19, recall
  0.66 / 0.29, ASR after 0.88 / 1.00; ART as shipped removes half of every class. Both fail
  here, as BackdoorBench finds on CIFAR-10 (see `backdoor_defenses.py`).
* Detection seconds, ours / ART matched: activation clustering 1.27 / 0.21, spectral 2.36 /
  0.66 (sub-second runs, noisy); against ART as shipped (10 logits instead of 256 features)
  13.1 / 2.6 and 7.2 / 1.7.
* ART: STRIP rewrote the wrapped classifier's class in place (True); 2 forward hooks were left
  on the user's model; "relative-size" crashed; NeuralCleanse refused the PyTorch classifier.
"""

from __future__ import annotations

import os

os.environ.setdefault("TQDM_DISABLE", "1")

import argparse
import json
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from privacylab.attacks.poisoning import (
    PoisonTask,
    Trigger,
    make_backdoor,
    parse_trigger,
    poison_count,
    run_poisoning,
    target_labels,
)
from privacylab.attacks.poisoning.recipe import VictimRecipe, train_victim
from privacylab.data import Dataset, load_dataset
from privacylab.data.dataset import split_train_test
from privacylab.defenses.backdoor import (
    BackdoorEvidence,
    Detection,
    Mitigation,
    backdoor_defense_names,
    evaluate_mitigation,
    feature_layer,
    make_backdoor_defense,
)
from privacylab.stats.backdoor import attack_success_rate

TARGET = 0
RELATIVE_SIZE = 0.35
"""Chen et al. 2019's small-cluster share (ours' `size_threshold`, ART's relative-size)."""
ART_PATTERN_MASK = ((0.0, 0.0, 1.0), (0.0, 1.0, 0.0), (1.0, 0.0, 1.0))
"""ART's `add_pattern_bd(distance=2)`: pixels (H−2, W−2), (H−3, W−3), (H−2, W−4), (H−4, W−2)
set to 1 — a 3x3 box at (H−4, W−4) with this mask."""


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# ------------------------------------------------------------------------------- the setting


def split(quick: bool, seed: int) -> tuple[Dataset, Dataset, Dataset]:
    """(victim's training rows, defender's clean rows, test rows) of mnist5k."""
    train_all, test = split_train_test(load_dataset("mnist5k"))
    order = np.random.default_rng(seed).permutation(len(train_all))
    n_train, n_clean, n_test = (1200, 300, 500) if quick else (3500, 500, 1000)
    victim = train_all.subset(np.sort(order[:n_train]))
    clean = train_all.subset(np.sort(order[n_train : n_train + n_clean]))
    return victim, clean, test.subset(np.arange(n_test))


def art_pattern_trigger(height: int = 28, width: int = 28) -> Trigger:
    """ART's `add_pattern_bd` trigger as one of ours (same pixels, opacity 1)."""
    return Trigger(
        "pattern",
        3,
        (height - 4, width - 4),
        1.0,
        pattern=torch.ones(1, 3, 3),
        mask=torch.tensor(ART_PATTERN_MASK),
    )


def _art_square(x: np.ndarray, size: int = 4) -> np.ndarray:
    """A white `size` square in the bottom-right corner of NCHW images, as an ART
    perturbation (ART ships no square trigger)."""
    out = np.copy(x)
    out[..., -size:, -size:] = 1.0
    return out


def triggers() -> dict[str, tuple[Trigger, Callable[[np.ndarray], np.ndarray]]]:
    """Each trigger as ours and as ART's perturbation."""
    from art.attacks.poisoning.perturbations import add_pattern_bd

    return {
        "art-pattern": (art_pattern_trigger(), partial(add_pattern_bd, channels_first=True)),
        "square:4@corner": (parse_trigger("square:4@corner"), _art_square),
    }


def art_classifier(model: nn.Module, data: Dataset) -> Any:
    """ART's wrapper of the very same PyTorch model (no copy)."""
    from art.estimators.classification import PyTorchClassifier

    return PyTorchClassifier(
        model=model,
        loss=nn.CrossEntropyLoss(),
        input_shape=data.input_shape,
        nb_classes=data.num_classes,
        clip_values=(0.0, 1.0),
        device_type="cpu",
    )


class PenultimateLast(nn.Module):
    """The same model with its children registered head first, so that ART's
    ``layer_names[-1]`` (the last registered child) is the layer feeding the last Linear —
    the layer our defences read. Shares the parameters; forward is unchanged."""

    def __init__(self, model: nn.Sequential) -> None:
        super().__init__()
        children = list(model.children())
        cut = int(feature_layer(model)) + 1
        self.head = nn.Sequential(*children[cut:])
        self.features = nn.Sequential(*children[:cut])

    def forward(self, x: Tensor) -> Tensor:
        return self.head(self.features(x))


def _relative_size(is_clean: list[int], labels: np.ndarray, kept: dict[int, float]) -> np.ndarray:
    """ART's "smaller" verdict restricted to the classes whose small cluster holds less than
    `RELATIVE_SIZE` of the class (ART's own "relative-size" rule, which crashes in 1.20.1)."""
    out = np.asarray(is_clean).copy()
    out[~np.isin(labels, list(kept))] = 1
    return out


def _relative_size_crashes(victim: Victim, data: Any, seed: int) -> str:
    """The error ART 1.20.1's "relative-size" cluster analysis raises ("" if it ran)."""
    from art.defences.detector.poison import ActivationDefence

    classifier = art_classifier(PenultimateLast(victim.model), data[2])
    x = victim.poisoned.features.numpy()
    y = _onehot(victim.poisoned.labels.numpy(), data[2].num_classes)
    np.random.seed(seed)
    try:
        ActivationDefence(classifier, x, y).detect_poison(
            nb_clusters=2, nb_dims=10, reduce="PCA", cluster_analysis="relative-size"
        )
    except ValueError as error:
        return f"ValueError: {error}"
    return ""


def _hooks(model: nn.Module) -> int:
    return sum(len(m._forward_hooks) for m in model.modules())


def _onehot(labels: np.ndarray, classes: int) -> np.ndarray:
    return np.eye(classes, dtype=np.float32)[labels]


def _pr(flagged: np.ndarray | None, truth: np.ndarray) -> dict[str, Any]:
    if flagged is None:
        return {"flagged_rows": None, "precision": None, "recall": None}
    hit = np.isin(flagged, truth).sum()
    return {
        "flagged_rows": len(flagged),
        "precision": float(hit / len(flagged)) if len(flagged) else None,
        "recall": float(hit / len(truth)) if len(truth) else None,
    }


def _short(after: dict[str, float] | None) -> dict[str, Any] | None:
    if after is None:
        return None
    return {
        "accuracy": after["accuracy"],
        "asr": after["asr"],
        "frr": after["rejected_clean"],
        "far": 1.0 - after["rejected_triggered"],
    }


# --------------------------------------------------------------------------------- a model


class Victim:
    """One poisoned model with everything both toolkits need."""

    def __init__(
        self,
        label: str,
        trigger: Trigger,
        art_perturb: Callable[[np.ndarray], np.ndarray],
        rate: float,
        model: nn.Module,
        poisoned: Dataset,
        truth: np.ndarray,
        triggered_test: Tensor,
        wanted: np.ndarray,
    ) -> None:
        self.label = label
        self.trigger = trigger
        self.art_perturb = art_perturb
        self.rate = rate
        self.model = model
        self.poisoned = poisoned
        self.truth = truth
        self.triggered_test = triggered_test
        self.wanted = wanted


def attack(
    name: str,
    trigger: Trigger,
    art_perturb: Callable[[np.ndarray], np.ndarray],
    rate: float,
    data: tuple[Dataset, Dataset, Dataset],
    recipe: VictimRecipe,
    clean_model: nn.Module,
    cache: Path,
    seed: int,
) -> tuple[dict[str, Any], Victim]:
    """Poison with both toolkits, train once on X ∪ P, measure both."""
    from art.attacks.poisoning import PoisoningAttackBackdoor

    victim, _clean, test = data
    budget = poison_count(rate, len(victim))
    pool = np.flatnonzero(victim.labels.numpy() != TARGET)
    rows = np.sort(np.random.default_rng([seed, budget]).choice(pool, budget, replace=False))
    source = victim.subset(rows)
    task = PoisonTask(source=source, budget=budget, target_class=TARGET, seed=seed)
    ours = make_backdoor("badnets", trigger=trigger, seed=seed)

    start = time.perf_counter()
    ours_poisons = ours.craft(task)  # type: ignore[attr-defined]
    ours_seconds = time.perf_counter() - start
    start = time.perf_counter()
    art_x, art_y = PoisoningAttackBackdoor(art_perturb).poison(
        source.features.numpy(), y=_onehot(np.array([TARGET]), 10)[0], broadcast=True
    )
    art_seconds = time.perf_counter() - start
    identical = bool(
        np.array_equal(ours_poisons.features.numpy(), art_x)
        and np.array_equal(ours_poisons.labels.numpy(), art_y.argmax(1))
    )
    differing = int((ours_poisons.features.numpy() != art_x).reshape(budget, -1).any(1).sum())

    folder = cache / f"{name}-{rate:g}-{seed}"
    trained: dict[str, Dataset] = {}

    def train_fn(data_set: Dataset) -> nn.Module:
        trained["set"] = data_set
        return train_victim(recipe, data_set, seed=seed, checkpoint_dir=folder)[0]

    result, model, _ = run_poisoning(
        ours, task, victim, test, train_fn, clean_model=clean_model, probe_seed=seed + 1
    )
    poisoned = trained["set"]
    truth = np.arange(len(victim), len(poisoned))

    classifier = art_classifier(model, test)
    art_test = art_perturb(test.features.numpy())
    art_pred = classifier.predict(art_test).argmax(1)
    art_clean = classifier.predict(test.features.numpy()).argmax(1)
    wanted = target_labels(test.labels, TARGET, "all-to-one", test.num_classes).numpy()
    art_asr = attack_success_rate(art_pred, test.labels.numpy(), wanted)
    label = f"{name} @ {rate:.0%}"
    row = {
        "model": label,
        "trigger": name,
        "poison_rate": rate,
        "poisons": budget,
        "identical_poisons": identical,
        "differing_poisons": differing,
        "ours": {
            "asr": result.asr,
            "clean_accuracy": result.clean_accuracy,
            "craft_seconds": ours_seconds,
        },
        "art": {
            "asr": art_asr,
            "clean_accuracy": float(np.mean(art_clean == test.labels.numpy())),
            "craft_seconds": art_seconds,
        },
        "baseline_accuracy": result.baseline_accuracy,
        "baseline_asr": result.baseline_asr,
    }
    triggered = torch.from_numpy(art_test).float()
    if not np.array_equal(art_test, trigger.stamp(test.features).numpy()):
        _log(f"{label}: ART's and our stamped test images differ")
    out = Victim(label, trigger, art_perturb, rate, model, poisoned, truth, triggered, wanted)
    return row, out


# ------------------------------------------------------------------------------ the defences


def ours_defence(
    name: str,
    victim: Victim,
    data: tuple[Dataset, Dataset, Dataset],
    retrain: Callable[[Dataset], nn.Module],
    quick: bool,
    seed: int,
) -> dict[str, Any]:
    """One of our registered defences on `victim`, detection timed without retraining."""
    _train, clean, test = data
    options: dict[str, Any] = {}
    if name == "neural-cleanse" and quick:
        options = {"seeds": 1, "epochs": 5, "max_rows": 100}
    defence = make_backdoor_defense(name, **options)
    spent = [0.0]

    def timed_retrain(data_set: Dataset) -> nn.Module:
        start = time.perf_counter()
        model = retrain(data_set)
        spent[0] += time.perf_counter() - start
        return model

    needs = set(defence.needs)
    evidence = BackdoorEvidence(
        num_classes=test.num_classes,
        clean=clean if "clean-data" in needs else None,
        training=victim.poisoned if "training-data" in needs else None,
        retrain=timed_retrain,
        seed=seed,
    )
    start = time.perf_counter()
    detection: Detection = defence.inspect(victim.model, evidence)
    seconds = time.perf_counter() - start - spent[0]
    after = evaluate_mitigation(
        detection.mitigation, victim.model, test, victim.triggered_test, victim.wanted
    )
    if name == "strip":
        seconds = time.perf_counter() - start - spent[0]
    return {
        "model": victim.label,
        "defense": name,
        "toolkit": "privacylab",
        "variant": "default",
        "detected": detection.detected,
        "flagged_class": detection.flagged_class,
        "correct_class": None
        if detection.flagged_class is None
        else detection.flagged_class == TARGET,
        "anomaly_index": detection.anomaly_index,
        **_pr(detection.flagged_rows, victim.truth),
        "after": _short(after) if detection.mitigation is not None else None,
        "seconds": seconds,
        "retrain_seconds": spent[0],
    }


def _art_clusters(
    victim: Victim, variant: str, retrain: Callable[[Dataset], nn.Module], data: Any, seed: int
) -> list[dict[str, Any]]:
    """ART's ActivationDefence and SpectralSignatureDefense, as shipped and matched."""
    from art.defences.detector.poison import ActivationDefence, SpectralSignatureDefense

    _train, _clean, test = data
    model = victim.model if variant == "as shipped" else PenultimateLast(victim.model)
    classifier = art_classifier(model, test)
    x = victim.poisoned.features.numpy()
    y = _onehot(victim.poisoned.labels.numpy(), test.num_classes)
    rows = []
    for name in ("activation-clustering", "spectral"):
        np.random.seed(seed)
        start = time.perf_counter()
        if name == "activation-clustering":
            defence = ActivationDefence(classifier, x, y)
            reduce = "PCA" if variant == "as shipped" else "FastICA"
            report, is_clean = defence.detect_poison(nb_clusters=2, nb_dims=10, reduce=reduce)
            shares = {}
            for key, value in report.items():
                if key.startswith("Class_"):
                    small = [c for c in value.values() if c.get("suspicious_cluster")]
                    if small:
                        shares[int(key.split("_")[1])] = min(
                            c["ptc_data_in_cluster"] for c in small
                        )
            if variant == "matched":
                shares = {c: share for c, share in shares.items() if share < RELATIVE_SIZE}
                is_clean = _relative_size(is_clean, victim.poisoned.labels.numpy(), shares)
            detected = bool(shares)
            flagged_class = min(shares, key=lambda c: (shares[c], c)) if shares else None
        else:
            expected = 0.33 if variant == "as shipped" else 0.1
            defence = SpectralSignatureDefense(classifier, x, y, expected_pp_poison=expected)
            _report, is_clean = defence.detect_poison()
            detected, flagged_class = None, None
        seconds = time.perf_counter() - start
        flagged = np.flatnonzero(np.asarray(is_clean) == 0)
        keep = np.flatnonzero(np.asarray(is_clean) == 1)
        start = time.perf_counter()
        after = None
        if variant == "matched":
            repaired = retrain(victim.poisoned.subset(keep))
            after = evaluate_mitigation(
                Mitigation(model=repaired), victim.model, test, victim.triggered_test, victim.wanted
            )
        retrain_seconds = time.perf_counter() - start
        rows.append(
            {
                "model": victim.label,
                "defense": name,
                "toolkit": "art",
                "variant": variant,
                "detected": detected,
                "flagged_class": flagged_class,
                "correct_class": None if flagged_class is None else flagged_class == TARGET,
                "anomaly_index": None,
                **_pr(flagged, victim.truth),
                "after": _short(after),
                "seconds": seconds,
                "retrain_seconds": retrain_seconds,
                "layer": classifier.layer_names[-1],
            }
        )
    return rows


def _art_strip(victim: Victim, data: Any, seed: int) -> tuple[dict[str, Any], bool]:
    """ART's STRIP on a fresh wrapper; returns the row and whether it rewrote the class."""
    from art.defences.transformer.poisoning import STRIP

    _train, clean, test = data
    classifier = art_classifier(nn.Sequential(victim.model, nn.Softmax(dim=1)), test)
    before = type(classifier)
    np.random.seed(seed)
    start = time.perf_counter()
    defended = STRIP(classifier)(num_samples=20, false_acceptance_rate=0.01)
    rewrote = defended is classifier and type(classifier) is not before
    defended.mitigate(clean.features.numpy())

    def reject(inputs: Tensor) -> np.ndarray:
        out = defended.predict(inputs.numpy())
        return ~np.any(out != 0, axis=1)

    after = evaluate_mitigation(
        Mitigation(reject=reject), victim.model, test, victim.triggered_test, victim.wanted
    )
    seconds = time.perf_counter() - start
    row = {
        "model": victim.label,
        "defense": "strip",
        "toolkit": "art",
        "variant": "as shipped",
        "detected": None,
        "flagged_class": None,
        "correct_class": None,
        "anomaly_index": None,
        **_pr(None, victim.truth),
        "after": _short(after),
        "seconds": seconds,
        "retrain_seconds": 0.0,
    }
    return row, rewrote


def _art_neural_cleanse(victim: Victim, data: Any) -> str:
    """The error ART's NeuralCleanse gives for a PyTorch classifier ("" if it ran)."""
    from art.defences.transformer.poisoning import NeuralCleanse

    try:
        NeuralCleanse(art_classifier(victim.model, data[2]))
    except NotImplementedError as error:
        return f"NotImplementedError: {error}"
    return ""


# ------------------------------------------------------------------------------------- run


def run(quick: bool, seed: int, cache: Path) -> dict[str, Any]:
    """The whole comparison; returns the JSON object."""
    recipe = VictimRecipe(epochs=8) if quick else VictimRecipe()
    data = split(quick, seed)
    victim_rows, clean_rows, test = data
    _log(f"mnist5k: {len(victim_rows)} training, {len(clean_rows)} clean, {len(test)} test rows")
    start = time.perf_counter()
    clean_model = train_victim(recipe, victim_rows, seed=seed, checkpoint_dir=cache / "clean")[0]
    _log(f"clean model trained in {time.perf_counter() - start:.1f}s")
    retrain_count = [0]

    def retrain(data_set: Dataset) -> nn.Module:
        retrain_count[0] += 1
        return train_victim(recipe, data_set, seed=seed)[0]

    rates = (0.1,) if quick else (0.01, 0.1)
    chosen = triggers()
    attacks, victims = [], []
    for name, (trigger, perturb) in chosen.items():
        for rate in rates:
            _log(f"attack {name} at {rate:.0%} ...")
            row, victim = attack(
                name, trigger, perturb, rate, data, recipe, clean_model, cache, seed
            )
            attacks.append(row)
            victims.append(victim)
            _log(
                f"  ASR ours {row['ours']['asr']:.3f} / ART {row['art']['asr']:.3f}, "
                f"identical poisons: {row['identical_poisons']}"
            )

    defended = [v for v in victims if v.trigger.spec == "square:4@corner"]
    defences: list[dict[str, Any]] = []
    findings: dict[str, Any] = {}
    names = backdoor_defense_names()
    for victim in defended:
        for name in names:
            defences.append(ours_defence(name, victim, data, retrain, quick, seed))
            _log(f"{victim.label}: ours {name} {defences[-1]['seconds']:.1f}s")
        hooks_before = _hooks(victim.model)
        for variant in ("as shipped", "matched"):
            defences.extend(_art_clusters(victim, variant, retrain, data, seed))
            _log(f"{victim.label}: ART activation defence + spectral ({variant}) done")
        row, rewrote = _art_strip(victim, data, seed)
        _log(f"{victim.label}: ART STRIP {row['seconds']:.1f}s")
        defences.append(row)
        findings["strip_rewrites_class_in_place"] = rewrote
        findings["art_hooks_left"] = _hooks(victim.model) - hooks_before
        findings["art_relative_size"] = _relative_size_crashes(victim, data, seed) or "ran"
        findings["art_neural_cleanse"] = _art_neural_cleanse(victim, data) or "ran"
    findings["art_fine_pruning"] = "ART 1.20 has no fine-pruning defence"
    return {
        "setting": {
            "dataset": "mnist5k",
            "train_rows": len(victim_rows),
            "clean_rows": len(clean_rows),
            "test_rows": len(test),
            "recipe": recipe.to_dict(),
            "target_class": TARGET,
            "seed": seed,
            "quick": quick,
            "art_version": __import__("art").__version__,
            "threads": torch.get_num_threads(),
        },
        "attacks": attacks,
        "defenses": defences,
        "ratios": ratios(defences),
        "findings": findings,
    }


def ratios(defences: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Our seconds over ART's, per model and defence (ART's matched variant when it has one)."""
    out = []
    for ours in (d for d in defences if d["toolkit"] == "privacylab"):
        peers = [
            d
            for d in defences
            if d["toolkit"] == "art"
            and d["model"] == ours["model"]
            and d["defense"] == ours["defense"]
        ]
        for art in peers:
            out.append(
                {
                    "model": ours["model"],
                    "defense": ours["defense"],
                    "art_variant": art["variant"],
                    "seconds_ratio": ours["seconds"] / art["seconds"] if art["seconds"] else None,
                }
            )
    return out


def _fmt(value: Any, spec: str = ".3f") -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return format(value, spec)
    return str(value)


def table(result: dict[str, Any]) -> str:
    """The human-readable tables."""
    lines = ["Attacks (same poisons, same model):"]
    lines.append(
        f"{'model':<24}{'poisons':>8}{'identical':>10}{'ASR ours':>10}{'ASR ART':>9}"
        f"{'acc ours':>10}{'acc ART':>9}{'clean acc':>10}{'clean ASR':>10}"
    )
    for row in result["attacks"]:
        lines.append(
            f"{row['model']:<24}{row['poisons']:>8}{_fmt(row['identical_poisons']):>10}"
            f"{_fmt(row['ours']['asr']):>10}{_fmt(row['art']['asr']):>9}"
            f"{_fmt(row['ours']['clean_accuracy']):>10}{_fmt(row['art']['clean_accuracy']):>9}"
            f"{_fmt(row['baseline_accuracy']):>10}{_fmt(row['baseline_asr']):>10}"
        )
    lines.append("")
    lines.append("Defences (same model, same data):")
    lines.append(
        f"{'model':<24}{'defence':<23}{'toolkit':<20}{'det':>5}{'class':>6}{'prec':>7}"
        f"{'recall':>7}{'FRR':>7}{'FAR':>7}{'acc':>7}{'ASR':>7}{'sec':>8}"
    )
    for d in result["defenses"]:
        after = d["after"] or {}
        who = d["toolkit"] if d["toolkit"] == "privacylab" else f"art {d['variant']}"
        lines.append(
            f"{d['model']:<24}{d['defense']:<23}{who:<20}{_fmt(d['detected']):>5}"
            f"{_fmt(d['flagged_class']):>6}{_fmt(d['precision'], '.2f'):>7}"
            f"{_fmt(d['recall'], '.2f'):>7}{_fmt(after.get('frr'), '.2f'):>7}"
            f"{_fmt(after.get('far'), '.2f'):>7}{_fmt(after.get('accuracy'), '.2f'):>7}"
            f"{_fmt(after.get('asr'), '.2f'):>7}{_fmt(d['seconds'], '.1f'):>8}"
        )
    lines.append("")
    lines.append("Seconds, ours / ART:")
    for r in result["ratios"]:
        lines.append(
            f"  {r['model']:<24}{r['defense']:<23}vs art {r['art_variant']:<12}"
            f"{_fmt(r['seconds_ratio'], '.2f')}"
        )
    lines.append("")
    for key, value in result["findings"].items():
        lines.append(f"{key}: {value}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--quick", action="store_true", help="a ~1 minute run")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--cache", type=Path, default=None, help="keep trained models here")
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore")
    torch.manual_seed(args.seed)
    if args.cache is None:
        with tempfile.TemporaryDirectory() as folder:
            result = run(args.quick, args.seed, Path(folder))
    else:
        args.cache.mkdir(parents=True, exist_ok=True)
        result = run(args.quick, args.seed, args.cache)
    if args.json:
        print(json.dumps(result, default=float))
    else:
        print(table(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
