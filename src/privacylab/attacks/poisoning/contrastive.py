"""Poisoning and backdooring a contrastive image–text model (Carlini & Terzis 2022, "Poisoning
and Backdooring Contrastive Learning", ICLR'22), played on captioned digits with a small CLIP
(`privacylab.models.dual_encoder`) used as a zero-shot classifier.

Threat model (Sec. 3): the attacker adds a few image–caption pairs P to the victim's uncurated
training set, X' = X ∪ P, and never touches training. It writes captions itself: its *caption
set* for the target label y' is every caption of its own that contains the label string
(Sec. 4.1; `privacylab.data.captions.captions_with`), searched in captions it scraped for its
own images, never in the victim's rows.

- `clip-poison` (`ClipPoison`, Sec. 4.1, multi-sample targeted poisoning):
  P = {(x', c) : c ∈ caption set}, N pairs of one target image x' (an image of the attacker's
  that it will later show to the model) and captions of y'. Success: the zero-shot classifier
  labels x' as y'.
- `clip-backdoor` (`ClipBackdoor`, Sec. 4.2): P = {(x_i ⊕ bd, c)}, N distinct images of the
  attacker's, each stamped with the patch (at a fixed corner or, Sec. 5.2, at a random place),
  paired with captions of y'. Success: attack success rate of patched test images of other
  classes under zero-shot classification, and the backdoor z-score (Sec. 5.1;
  `privacylab.stats.backdoor.backdoor_z_score`) of the image encoder, clean vs patched test
  images.

`run_contrastive` plays the whole game: splits the dataset into test, victim and attacker rows,
captions them, trains the clean and the poisoned dual encoders with the same recipe, activates
the attack through a label-only `Target` around the zero-shot head, and returns the family's
`BackdoorResult`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch
from torch import Tensor

from privacylab.attacks.core import ThreatModel, execute
from privacylab.attacks.poisoning.base import (
    BackdoorResult,
    DataPoisoningAttack,
    PoisonError,
    Poisons,
    PoisonTask,
    ProbeTask,
    number_option,
    predict_labels,
    register_backdoor,
    whole_option,
)
from privacylab.attacks.poisoning.trigger import Trigger, TriggerError, parse_trigger
from privacylab.data import Dataset
from privacylab.data.captions import (
    CLASS_NAMES,
    PROMPTS,
    CaptionTokenizer,
    build_captions,
    captions_with,
    prompts,
    template_captions,
)
from privacylab.data.errors import DataError
from privacylab.models.dual_encoder import DualEncoder, ZeroShotClassifier, clip_loss
from privacylab.stats.backdoor import attack_success_rate, backdoor_z_score
from privacylab.target import Access, Target

__all__ = [
    "BATCH_SIZE",
    "CAPTION_LENGTH",
    "CAPTION_NOISE",
    "EPOCHS",
    "LR",
    "METHODS",
    "ClipBackdoor",
    "ClipPoison",
    "ContrastiveSplit",
    "caption_set",
    "contrastive_split",
    "image_embeddings",
    "run_contrastive",
    "train_dual_encoder",
    "zero_shot_classifier",
]

METHODS = ("clip-poison", "clip-backdoor")
EPOCHS = 10
BATCH_SIZE = 128
LR = 2e-3
CAPTION_LENGTH = 16
CAPTION_NOISE = 0.1
"""The victim's recipe: Adam at `LR`, shuffled batches of `BATCH_SIZE` (the in-batch
negatives), `EPOCHS` epochs; captions of at most `CAPTION_LENGTH` words with a share
`CAPTION_NOISE` of scraped noise."""

Progress = Callable[[str, float, float], None]

_THREAT = ThreatModel(Access.LABEL, ("clean-data", "caption-set"))


def caption_set(task: PoisonTask) -> list[str]:
    """The attacker's caption set Y' for `task.target_class` (Sec. 4.1): its own captions
    (`task.captions`) containing the label string; with none of its own, the captions it
    writes from the templates. PoisonError when no caption carries the label."""
    names = task.class_names or CLASS_NAMES[: task.source.num_classes]
    if len(names) != task.source.num_classes:
        raise PoisonError(
            f"{len(names)} class names for {task.source.num_classes} classes of {task.source.name}"
        )
    label = names[task.target_class]
    try:
        found = captions_with(label, task.captions)
        if not found and not task.captions:
            found = template_captions(label)
    except DataError as error:
        raise PoisonError(str(error)) from None
    if not found:
        raise PoisonError(f"none of the attacker's captions contains the label {label!r}")
    return found


def _all_to_one(name: str, task: PoisonTask) -> None:
    if task.mode != "all-to-one":
        raise PoisonError(f"{name}: captions of one target label make an all-to-one attack only")


def _draw_captions(pool: Sequence[str], count: int, rng: np.random.Generator) -> tuple[str, ...]:
    """`count` captions of `pool`, each used once before any repeats (a fresh shuffle per round)."""
    out: list[str] = []
    while len(out) < count:
        out.extend(pool[i] for i in rng.permutation(len(pool)))
    return tuple(out[:count])


@register_backdoor
class ClipPoison(DataPoisoningAttack):
    """Targeted multi-sample poisoning (Carlini & Terzis 2022, Sec. 4.1): `budget` pairs of one
    target image x' — row `target_index` of the attacker's source (None: one drawn, seeded,
    among rows not already of the target class) — with captions of its caption set for y'.
    Activation (`run`) shows x' to the deployed zero-shot classifier, unpatched."""

    name = "clip-poison"
    threat_model: ClassVar[ThreatModel] = _THREAT

    def __init__(self, target_index: int | None = None, seed: int = 0) -> None:
        if target_index is not None:
            whole_option(self.name, "target_index", target_index, low=0)
        self.target_index = target_index
        self.seed = whole_option(self.name, "seed", seed, low=0)
        self.trigger: Trigger | None = None

    def craft(self, task: PoisonTask) -> Poisons:
        """P = {(x', c) : c ∈ caption set}, `task.budget` pairs."""
        _all_to_one(self.name, task)
        rng = np.random.default_rng([self.seed, task.seed])
        labels = task.source.labels.numpy()
        index = self.target_index
        if index is None:
            others = np.flatnonzero(labels != task.target_class)
            if not len(others):
                raise PoisonError("clip-poison: the attacker has no image outside the target class")
            index = int(rng.choice(others))
        if index >= len(task.source):
            raise PoisonError(
                f"clip-poison: target_index {index} is outside the attacker's "
                f"{len(task.source)} images"
            )
        captions = _draw_captions(caption_set(task), task.budget, rng)
        image = task.source.features[index : index + 1]
        return Poisons(
            features=image.expand(task.budget, *image.shape[1:]).clone(),
            labels=torch.full((task.budget,), int(task.target_class), dtype=torch.int64),
            trigger=None,
            target_class=int(task.target_class),
            captions=captions,
            target_index=index,
        )


@register_backdoor
class ClipBackdoor(DataPoisoningAttack):
    """The contrastive backdoor (Carlini & Terzis 2022, Sec. 4.2): `budget` distinct images of
    the attacker's source (seeded draw), each stamped with `trigger` (a fixed corner or a random
    place per image, Sec. 5.2), paired with captions of the target label's caption set.
    Activation (`run`) stamps the probes the same way and reads their zero-shot labels."""

    name = "clip-backdoor"
    threat_model: ClassVar[ThreatModel] = _THREAT

    def __init__(self, trigger: str | Trigger = "pattern:4@corner", seed: int = 0) -> None:
        try:
            self.trigger = parse_trigger(trigger)
        except TriggerError as error:
            raise PoisonError(str(error)) from None
        self.seed = whole_option(self.name, "seed", seed, low=0)

    def craft(self, task: PoisonTask) -> Poisons:
        """P = {(x_i ⊕ bd, c) : x_i ∈ X_subset}, `task.budget` distinct images."""
        _all_to_one(self.name, task)
        if task.budget > len(task.source):
            raise PoisonError(
                f"clip-backdoor: {task.budget} poisons need as many distinct images, the "
                f"attacker has {len(task.source)}"
            )
        rng = np.random.default_rng([self.seed, task.seed])
        rows = rng.choice(len(task.source), size=task.budget, replace=False)
        captions = _draw_captions(caption_set(task), task.budget, rng)
        stamped = self.stamp(
            task.source.features[torch.as_tensor(rows)], seed=int(rng.integers(2**31))
        )
        return Poisons(
            features=stamped,
            labels=torch.full((task.budget,), int(task.target_class), dtype=torch.int64),
            trigger=self.trigger,
            target_class=int(task.target_class),
            captions=captions,
        )


# ------------------------------------------------------------------------------ the victim


def train_dual_encoder(
    model: DualEncoder,
    images: Tensor,
    ids: Tensor,
    *,
    epochs: int = EPOCHS,
    batch_size: int = BATCH_SIZE,
    lr: float = LR,
    seed: int = 0,
    device: str = "cpu",
    checkpoint_dir: str | Path | None = None,
    progress: Callable[[Any], None] | None = None,
) -> Any:
    """CLIP's contrastive pre-training (Radford et al. 2021, Fig. 3) of `model` on the pairs
    (images[i], ids[i]) with the one trainer (`privacylab.training.train`): Adam, shuffled
    batches of `batch_size` whose other pairs are the negatives, `clip_loss` per example;
    seeded, resumable from `checkpoint_dir`. Returns the trainer's `TrainResult`."""
    from privacylab.training import TrainConfig, train

    if len(images) != len(ids):
        raise PoisonError(f"{len(images)} images but {len(ids)} captions")
    if len(images) < 2:
        raise PoisonError("contrastive training needs at least 2 pairs")
    config = TrainConfig(
        epochs=epochs, batch_size=batch_size, lr=lr, optimizer="adam", seed=seed, device=device
    )
    dummy = torch.zeros(len(images), dtype=torch.float32)
    return train(
        model,
        ((images, ids), dummy),
        config,
        checkpoint_dir=checkpoint_dir,
        progress=progress,
        loss_fn=clip_loss,
    )


def zero_shot_classifier(
    model: DualEncoder,
    tokenizer: CaptionTokenizer,
    class_names: Sequence[str] = CLASS_NAMES,
) -> ZeroShotClassifier:
    """CLIP's zero-shot head over `class_names` with the prompt ensemble `captions.prompts`."""
    ids = [tokenizer.encode(prompts(name), CAPTION_LENGTH) for name in class_names]
    return ZeroShotClassifier(model, ids)


@torch.no_grad()
def image_embeddings(model: DualEncoder, images: Tensor, batch: int = 1024) -> np.ndarray:
    """f(x) for `images`, (n, dim), unit norm, as float64 numpy."""
    model.eval()
    device = next(model.parameters()).device
    out = [
        model.encode_image(images[i : i + batch].to(device)).cpu()
        for i in range(0, len(images), batch)
    ]
    return torch.cat(out).double().numpy()


class ContrastiveSplit:
    """The rows of one game: `test` (the first `test_size` of a seeded permutation — numpy's
    `default_rng(seed).permutation`), `victim` (the next `train_size`), `attacker` (the rest:
    the attacker's own images, disjoint from both)."""

    def __init__(self, test: Dataset, victim: Dataset, attacker: Dataset) -> None:
        self.test = test
        self.victim = victim
        self.attacker = attacker


def contrastive_split(
    data: Dataset, train_size: int, test_size: int, seed: int
) -> ContrastiveSplit:
    """Test, victim and attacker rows of `data` (see `ContrastiveSplit`); one PoisonError line
    when the dataset is too small to leave the attacker any image."""
    train_size = whole_option("contrastive", "train_size", train_size, low=2)
    test_size = whole_option("contrastive", "test_size", test_size, low=3)
    if data.kind != "image" or len(data.input_shape) != 3:
        raise PoisonError(f"contrastive poisoning needs (C, H, W) images, {data.name} is not")
    if train_size + test_size >= len(data):
        raise PoisonError(
            f"train_size {train_size} + test_size {test_size} leave none of {data.name}'s "
            f"{len(data)} rows to the attacker"
        )
    order = np.random.default_rng(seed).permutation(len(data))
    return ContrastiveSplit(
        test=data.subset(order[:test_size]),
        victim=data.subset(order[test_size : test_size + train_size]),
        attacker=data.subset(order[test_size + train_size :]),
    )


def _check_classes(data: Dataset) -> None:
    if data.num_classes != len(CLASS_NAMES):
        raise PoisonError(
            f"the caption set covers the digits 0-9; {data.name} has {data.num_classes} classes"
        )


def _train(
    images: Tensor,
    captions: Sequence[str],
    tokenizer: CaptionTokenizer,
    *,
    epochs: int,
    seed: int,
    device: str,
    checkpoint_dir: Path | None,
    progress: Progress | None,
    stage: str,
) -> DualEncoder:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = DualEncoder(tuple(images.shape[1:]), tokenizer.vocab_size)

    def tick(record: Any) -> None:
        if progress is not None:
            progress(stage, float(record.epoch), float(epochs))

    train_dual_encoder(
        model,
        images,
        tokenizer.encode(list(captions), CAPTION_LENGTH),
        epochs=epochs,
        seed=seed,
        device=device,
        checkpoint_dir=checkpoint_dir,
        progress=tick,
    )
    return model.eval()


def run_contrastive(
    method: str,
    *,
    data: Dataset,
    poisons: int,
    trigger: str | Trigger = "pattern:4@corner",
    target_class: int = 0,
    train_size: int = 4000,
    test_size: int = 500,
    seed: int = 0,
    device: str = "cpu",
    epochs: int | None = None,
    targets: int = 5,
    caption_noise: float = CAPTION_NOISE,
    clean_model: DualEncoder | None = None,
    checkpoint_dir: str | Path | None = None,
    progress: Progress | None = None,
) -> tuple[BackdoorResult, DualEncoder]:
    """The contrastive poisoning game of Carlini & Terzis 2022 (Sec. 3–5) on a captioned digit
    dataset `data` (10 classes: mnist5k or digits). Returns the result and the poisoned model.

    Rows (`contrastive_split`): `test_size` test images, `train_size` victim pairs captioned by
    `build_captions` (a share `caption_noise` of scraped noise), the rest the attacker's own
    images, captioned by the attacker for itself. The victim trains a `DualEncoder` on
    X ∪ P (`EPOCHS` epochs unless `epochs`), and the clean model — the same recipe and seed on
    X alone, or `clean_model` when given (the caller vouches that it is that model; with no
    poisons it is then also the attacked one) — is the baseline.

    - `clip-backdoor`: `poisons` patched pairs (`trigger`, default a 4-px checkerboard at the
      bottom-right corner; `@random` draws a place per image). asr = ASR of the patched test
      images (non-target classes) under zero-shot classification; z_score = the backdoor
      z-score of the poisoned image encoder over the test images, clean vs patched; the clean
      model's in details["baseline_z_score"].
    - `clip-poison`: `targets` independent target images x'_1..x'_T of the attacker (classes
      other than `target_class`), each with `poisons` pairs of its own, all injected into ONE
      victim model (T·N rows; one model rather than one per target keeps the cost of T trials
      at one training run, and the T poison sets do not interact beyond sharing the label).
      asr = details["poison_success"] = the share of the x'_j classified as `target_class`;
      baseline_asr the same share on the clean model; z_score None.

    clean_accuracy and baseline_accuracy are zero-shot accuracies on the clean test images.
    `checkpoint_dir` makes both trainings resumable (`clean/` and `poisoned/` under it);
    `progress(stage, done, total)` is called after each epoch ("clean", "poisoned")."""
    if method not in METHODS:
        raise PoisonError(
            f"unknown contrastive attack {method!r}; choose one of {', '.join(METHODS)}"
        )
    budget = whole_option(method, "poisons", poisons, low=0)
    epochs = EPOCHS if epochs is None else whole_option(method, "epochs", epochs)
    targets = whole_option(method, "targets", targets)
    seed = whole_option(method, "seed", seed, low=0)
    if number_option(method, "caption_noise", caption_noise, zero=True) > 1.0:
        raise PoisonError(f"caption noise must be a share in [0, 1], got {caption_noise!r}")
    _check_classes(data)
    target_class = whole_option(method, "target_class", target_class, low=0)
    if target_class >= data.num_classes:
        raise PoisonError(f"target class must be in [0, {data.num_classes}), got {target_class!r}")
    attack: DataPoisoningAttack
    if method == "clip-backdoor":
        attack = ClipBackdoor(trigger, seed=seed)
        assert attack.trigger is not None
        try:
            attack.trigger.check(data.input_shape)
        except TriggerError as error:
            raise PoisonError(str(error)) from None
    else:
        attack = ClipPoison(seed=seed)
    start = time.perf_counter()
    split = contrastive_split(data, train_size, test_size, seed)
    tokenizer = CaptionTokenizer()
    victim_captions = build_captions(split.victim.labels, noise=caption_noise, seed=seed)
    own_captions = tuple(build_captions(split.attacker.labels, noise=caption_noise, seed=seed + 1))
    base = Path(checkpoint_dir) if checkpoint_dir is not None else None

    crafted: list[Poisons] = []
    chosen: list[int] = []
    if method == "clip-poison":
        candidates = np.flatnonzero(split.attacker.labels.numpy() != int(target_class))
        if len(candidates) < targets:
            raise PoisonError(
                f"clip-poison: {targets} targets but the attacker has {len(candidates)} images "
                "outside the target class"
            )
        rng = np.random.default_rng([seed, 17])
        chosen = rng.choice(candidates, targets, replace=False).tolist()
    if budget and method == "clip-backdoor":
        task = PoisonTask(
            split.attacker, budget, int(target_class), captions=own_captions, seed=seed
        )
        crafted.append(attack.craft(task))
    elif budget:
        for j, index in enumerate(chosen):
            task = PoisonTask(
                split.attacker, budget, int(target_class), captions=own_captions, seed=seed + j
            )
            crafted.append(ClipPoison(target_index=int(index), seed=seed).craft(task))

    poison_images = [p.features for p in crafted]
    poison_captions = [c for p in crafted for c in p.captions]
    injected = sum(len(p) for p in crafted)

    def fit(images: Tensor, captions: Sequence[str], stage: str) -> DualEncoder:
        return _train(
            images,
            captions,
            tokenizer,
            epochs=epochs,
            seed=seed,
            device=device,
            checkpoint_dir=None if base is None else base / stage,
            progress=progress,
            stage=stage,
        )

    if not injected and clean_model is not None:
        model = clean_model
    else:
        model = fit(
            torch.cat([split.victim.features, *poison_images]),
            [*victim_captions, *poison_captions],
            "poisoned",
        )
    if clean_model is None:
        clean_model = fit(split.victim.features, victim_captions, "clean") if budget else model
    poisoned_head = zero_shot_classifier(model, tokenizer)
    clean_head = zero_shot_classifier(clean_model.eval(), tokenizer)
    target = Target(poisoned_head, Access.LABEL, data.num_classes, device=device)
    truth = split.test.labels.numpy()

    details: dict[str, Any] = {
        "dataset_size": int(train_size),
        "zero_shot_prompts": len(PROMPTS),
        "caption_noise": float(caption_noise),
        "epochs": int(epochs),
        "attacker_images": len(split.attacker),
    }
    z_score: float | None = None
    if method == "clip-backdoor":
        probe = ProbeTask(split.test.features, seed + 1)
        execution = execute(attack, target, probe)
        triggered = execution.output.triggered
        asr = attack_success_rate(execution.output.predictions, truth, int(target_class))
        baseline_asr = attack_success_rate(
            predict_labels(clean_head, triggered), truth, int(target_class)
        )
        z_score = backdoor_z_score(
            image_embeddings(model, split.test.features), image_embeddings(model, triggered)
        )
        details["baseline_z_score"] = backdoor_z_score(
            image_embeddings(clean_model, split.test.features),
            image_embeddings(clean_model, triggered),
        )
    else:
        shown = split.attacker.features[torch.as_tensor(chosen, dtype=torch.int64)]
        execution = execute(attack, target, ProbeTask(shown, seed + 1))
        hits = execution.output.predictions == int(target_class)
        asr = float(np.mean(hits))
        baseline_asr = float(np.mean(predict_labels(clean_head, shown) == int(target_class)))
        details.update(
            poison_success=asr,
            per_target_poisons=budget,
            targets=len(chosen),
            target_rows=chosen,
            target_labels=split.attacker.labels[torch.as_tensor(chosen)].tolist(),
            target_hits=hits.astype(bool).tolist(),
        )
    if crafted:
        task0 = PoisonTask(split.attacker, 1, int(target_class), captions=own_captions, seed=seed)
        details["caption_set_size"] = len(caption_set(task0))
    test_pred = predict_labels(poisoned_head, split.test.features)
    clean_pred = predict_labels(clean_head, split.test.features)
    result = BackdoorResult(
        method=method,
        threat_model=attack.threat_model.to_dict(),
        target_class=int(target_class),
        mode="all-to-one",
        trigger=None if attack.trigger is None else attack.trigger.to_dict(),
        poisons=injected,
        poison_rate=injected / (len(split.victim) + injected),
        clean_accuracy=float(np.mean(test_pred == truth)),
        baseline_accuracy=float(np.mean(clean_pred == truth)),
        asr=asr,
        baseline_asr=baseline_asr,
        z_score=z_score,
        queries=execution.queries,
        seconds=time.perf_counter() - start,
        details=details,
    )
    return result, model
