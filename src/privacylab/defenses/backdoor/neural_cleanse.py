"""Neural Cleanse: reverse-engineer a trigger per class, flag the class whose trigger is
anomalously small, and unlearn it.

Wang et al. 2019, "Neural Cleanse: Identifying and Mitigating Backdoor Attacks in Neural
Networks", IEEE S&P.

- Sec. IV-B, Eq. 2-3: for each class c, a mask m (H, W) and a pattern p (C, H, W) stamp
  A(x, m, p) = (1 − m) ⊙ x + m ⊙ p and are optimised on clean data to
  min CE(f(A(x, m, p)), c) + λ·|m|_1. Here m = sigmoid(a), p = sigmoid(b) (the paper's code
  uses tanh/2 + 1/2, the same squashing), with Adam.
- An epoch is one pass over the clean rows in shuffled mini-batches; after it each class's
  current trigger is checked on (up to 512) fixed clean rows: its attack success.
- λ follows the paper's adaptive schedule (its released defaults): it starts at `init_cost`;
  after `patience` epochs in a row whose success reaches `success` λ is multiplied by
  `cost_multiplier`, after `patience` epochs in a row below it λ is divided by
  `cost_multiplier ** 1.5`. The smallest-norm mask that reached `success` is kept (a class that
  never reaches it keeps its last mask and is reported with `reached = False`); the kept
  masks' `success` in the result is measured on all clean rows. Early stop: a class whose λ has
  been both raised and lowered and whose best norm has not improved by 1% for 5·`patience`
  epochs leaves the batch; `epochs` caps the rest.
- Sec. IV-C: the anomaly index of the L1 norms (MAD with 1.4826,
  `privacylab.stats.backdoor.anomaly_index`); classes *below* the median with an index above
  `threshold` (2: a 95% outlier under normality) are flagged; the flagged class with the
  smallest norm is named as the target.
- Sec. VI-C, unlearning: a copy of the model is fine-tuned on the clean data where a share
  (`unlearn_fraction`, 20% in the paper) of the rows carry the reversed trigger of the flagged
  class with their true labels.

All K classes are optimised together in one batched forward pass: the loss is a sum of K
independent terms and Adam is element-wise, so this is exactly K separate optimisations sharing
the mini-batch draws, at the cost of one.

Neural Cleanse varies from run to run and flags clean models too (an anomaly index > 2 without
a backdoor is common on small models). It therefore runs over `seeds` independent restarts
(initial masks and batch order); the verdict is the majority, the reported anomaly index the
lower median of the per-seed indices (above `threshold` exactly when a majority is), and every
seed's norms, indices and verdict are in `details["per_seed"]`, so a benchmark can state the
false-positive rate over clean models and seeds.
"""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from privacylab.data import Dataset
from privacylab.defenses.backdoor.base import (
    BackdoorDefense,
    BackdoorDefenseError,
    BackdoorEvidence,
    Detection,
    Mitigation,
    register_backdoor_defense,
)
from privacylab.stats.backdoor import anomaly_index

__all__ = ["NeuralCleanse", "ReversedTriggers", "reverse_triggers", "stamp_reversed"]


def _positive_int(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or int(value) < 1:
        raise BackdoorDefenseError(
            f"neural-cleanse: {name} must be a whole number >= 1, got {value!r}"
        )
    return int(value)


def _positive_float(name: str, value: object, upper: float | None = None) -> float:
    try:
        number = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise BackdoorDefenseError(
            f"neural-cleanse: {name} must be a number, got {value!r}"
        ) from None
    if not np.isfinite(number) or number <= 0 or (upper is not None and number > upper):
        where = f"in (0, {upper:g}]" if upper is not None else "> 0"
        raise BackdoorDefenseError(f"neural-cleanse: {name} must be {where}, got {value!r}")
    return number


def _device(model: nn.Module) -> torch.device:
    return next((p.device for p in model.parameters()), torch.device("cpu"))


def stamp_reversed(inputs: Tensor, mask: Tensor, pattern: Tensor) -> Tensor:
    """Neural Cleanse's Eq. 2, A(x, m, p) = (1 − m) ⊙ x + m ⊙ p, for `inputs` (n, C, H, W),
    `mask` (H, W) and `pattern` (C, H, W) in [0, 1]."""
    mask = mask.to(inputs)
    return (1 - mask) * inputs + mask * pattern.to(inputs)


class ReversedTriggers:
    """One restart's reverse-engineered triggers: `masks` (K, H, W), `patterns` (K, C, H, W),
    `norms` (K,) L1 norms of the kept masks, `success` (K,) their attack success on the clean
    rows, `reached` (K,) whether `success` reached the threshold, `costs` (K,) the final λ,
    `epochs` the epochs run (early stopping ends a restart before the budget)."""

    def __init__(
        self,
        masks: Tensor,
        patterns: Tensor,
        norms: np.ndarray,
        success: np.ndarray,
        reached: np.ndarray,
        costs: np.ndarray,
        epochs: int = 0,
    ) -> None:
        self.epochs = epochs
        self.masks = masks
        self.patterns = patterns
        self.norms = norms
        self.success = success
        self.reached = reached
        self.costs = costs


def _success(
    model: nn.Module,
    inputs: Tensor,
    masks: Tensor,
    patterns: Tensor,
    classes: Tensor,
    batch: int = 4096,
) -> np.ndarray:
    """Per class, the share of `inputs` stamped with its trigger (`masks` (K, H, W),
    `patterns` (K, C, H, W)) classified as that class."""
    k = len(classes)
    hits = torch.zeros(k)
    per = max(1, batch // k)
    with torch.no_grad():
        for begin in range(0, len(inputs), per):
            rows = inputs[begin : begin + per]
            stamped = (1 - masks[:, None, None]) * rows[None] + (masks[:, None] * patterns)[:, None]
            logits = model(stamped.flatten(0, 1)).view(k, len(rows), -1)
            hits += (logits.argmax(-1) == classes[:, None]).sum(1).float().cpu()
    return (hits / len(inputs)).numpy()


def reverse_triggers(
    model: nn.Module,
    inputs: Tensor,
    classes: list[int],
    *,
    seed: int = 0,
    epochs: int = 60,
    steps_per_epoch: int | None = None,
    batch_size: int = 32,
    lr: float = 0.1,
    init_cost: float = 1e-3,
    cost_multiplier: float = 1.5,
    patience: int = 5,
    success: float = 0.99,
    early_stop: bool = True,
    eval_rows: int | None = 512,
) -> ReversedTriggers:
    """Wang et al. 2019, Sec. IV-B (Eq. 3) with the adaptive λ of the module docstring: the
    smallest trigger (mask, pattern) sending clean `inputs` (n, C, H, W) to each of `classes`,
    all optimised at once (see the module docstring), seeded by `seed`.

    An epoch is one pass over `inputs` in shuffled mini-batches of `batch_size`
    (`steps_per_epoch` steps instead when given); after each epoch the masks are checked on
    `eval_rows` fixed clean rows (None: all) and a mask is kept only if it reaches `success`
    there itself (the share of an epoch's mini-batches sent to the class measures the earlier,
    larger masks of that epoch, and would keep masks that fall short). With `early_stop` a
    class stops once λ has been both raised and lowered and its best norm has not improved by
    1% for 5·`patience` epochs; at most `epochs` epochs. `model` is only read (eval mode,
    gradients to its parameters are never taken)."""
    device = _device(model)
    generator = torch.Generator().manual_seed(int(seed))
    n, channels, height, width = inputs.shape
    k = len(classes)
    target = torch.tensor(classes, dtype=torch.int64, device=device)
    steps = -(-n // batch_size) if steps_per_epoch is None else int(steps_per_epoch)

    def logit(u: Tensor) -> Tensor:
        u = u.clamp(0.02, 0.98)
        return torch.log(u) - torch.log1p(-u)

    a = logit(torch.rand(k, 1, height, width, generator=generator)).to(device).requires_grad_()
    b = logit(torch.rand(k, channels, height, width, generator=generator)).to(device)
    b.requires_grad_()
    optimizer = torch.optim.Adam([a, b], lr=lr, betas=(0.5, 0.9))
    check = inputs
    if eval_rows is not None and eval_rows < n:
        check = inputs[torch.randperm(n, generator=generator)[:eval_rows]]
    check = check.to(device)

    costs = np.full(k, float(init_cost))
    up = np.zeros(k, dtype=int)
    down = np.zeros(k, dtype=int)
    raised = np.zeros(k, dtype=bool)
    lowered = np.zeros(k, dtype=bool)
    stale = np.zeros(k, dtype=int)
    reference = np.full(k, np.inf)
    active = np.ones(k, dtype=bool)
    best_norm = np.full(k, np.inf)
    best_masks = torch.zeros(k, height, width)
    best_patterns = torch.zeros(k, channels, height, width)

    was_training = model.training
    model.eval()
    flags = [p.requires_grad for p in model.parameters()]
    for p in model.parameters():
        p.requires_grad_(False)
    try:
        order = torch.randperm(n, generator=generator)
        cursor = 0
        done = 0
        for _ in range(epochs):
            done += 1
            live = torch.from_numpy(np.flatnonzero(active)).to(device)
            m = len(live)
            for _ in range(steps):
                if cursor >= n:
                    order = torch.randperm(n, generator=generator)
                    cursor = 0
                batch = inputs[order[cursor : cursor + batch_size]].to(device)
                cursor += batch_size
                masks = torch.sigmoid(a[live])
                patterns = torch.sigmoid(b[live])
                stamped = (1 - masks[:, None]) * batch[None] + (masks * patterns)[:, None]
                logits = model(stamped.flatten(0, 1)).view(m, len(batch), -1)
                wanted = target[live]
                ce = nn.functional.cross_entropy(
                    logits.flatten(0, 1), wanted.repeat_interleave(len(batch)), reduction="none"
                ).view(m, -1)
                lam = torch.as_tensor(costs[active], dtype=masks.dtype, device=device)
                loss = (ce.mean(1) + lam * masks.flatten(1).sum(1)).sum()
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
            idx = np.flatnonzero(active)
            with torch.no_grad():
                masks = torch.sigmoid(a[live])[:, 0]
                patterns = torch.sigmoid(b[live])
            rate = _success(model, check, masks, patterns, target[live])
            masks, patterns = masks.cpu(), patterns.cpu()
            norms = masks.flatten(1).sum(1).numpy()
            hit = rate >= success
            for j in np.flatnonzero(hit & (norms < best_norm[idx])):
                c = idx[j]
                best_norm[c] = norms[j]
                best_masks[c] = masks[j]
                best_patterns[c] = patterns[j]
            up[idx] = np.where(hit, up[idx] + 1, 0)
            down[idx] = np.where(hit, 0, down[idx] + 1)
            rise, fall = up >= patience, down >= patience
            costs = np.where(rise, costs * cost_multiplier, costs)
            costs = np.where(fall, costs / cost_multiplier**1.5, costs)
            raised |= rise
            lowered |= fall
            up[rise] = 0
            down[fall] = 0
            if early_stop:
                better = best_norm < 0.99 * reference
                reference = np.where(better, best_norm, reference)
                stale = np.where(better, 0, stale + 1)
                active &= ~(raised & lowered & (stale >= 5 * patience))
                if not active.any():
                    break
        final_masks = torch.sigmoid(a.detach())[:, 0].cpu()
        final_patterns = torch.sigmoid(b.detach()).cpu()
        reached = np.isfinite(best_norm)
        for c in np.flatnonzero(~reached):
            best_masks[c] = final_masks[c]
            best_patterns[c] = final_patterns[c]
            best_norm[c] = float(final_masks[c].sum())
        measured = _success(
            model, inputs.to(device), best_masks.to(device), best_patterns.to(device), target
        )
    finally:
        for p, flag in zip(model.parameters(), flags, strict=True):
            p.requires_grad_(flag)
        model.train(was_training)
    return ReversedTriggers(best_masks, best_patterns, best_norm, measured, reached, costs, done)


def _rounded(values: Tensor | np.ndarray, digits: int = 4) -> list[Any]:
    array = values.numpy() if isinstance(values, Tensor) else np.asarray(values)
    return np.round(array.astype(np.float64), digits).tolist()


@register_backdoor_defense
class NeuralCleanse(BackdoorDefense):
    """Neural Cleanse (Wang et al. 2019, S&P): detection by reverse-engineered trigger norms
    and the MAD anomaly index (Sec. IV), mitigation by unlearning (Sec. VI-C).

    Options: `seeds` restarts (majority verdict); per restart at most `epochs` passes over the
    clean rows (`steps_per_epoch` Adam steps instead when given) in mini-batches of
    `batch_size` at learning rate `lr`, `early_stop`; λ schedule `init_cost`,
    `cost_multiplier`, `patience`, attack-success threshold `success`; anomaly `threshold`;
    `classes` to inspect (None: all); `max_rows` clean rows used (None: all); `mitigate`
    (unlearn when a backdoor is detected) with `unlearn_epochs`, `unlearn_fraction`,
    `unlearn_lr`, `unlearn_batch`; `threads` CPU threads while it runs (1: the batched
    forward passes are small, and on a loaded 2-core machine one restart took 8.9 s with 1
    thread against 61 s with 2, the cause of the job's 657 s run; None: torch's setting);
    `seed` offsets every draw (with the evidence's seed).

    Measured with the defaults (3 restarts, ≤ 60 epochs of one pass over the 300 clean rows,
    the paper's λ schedule and success threshold 0.99; 20-50 s per model on a loaded 2-core
    machine, 1 thread) on the job's mnist5k victim (784-512-256 ReLU MLP), BadNets
    square:4@corner at 1%, target 0 (`privacylab attack backdoor --dataset mnist5k --method
    badnets --seed S --out DIR`, then `inspect` on DIR/model and DIR/clean with the job's
    clean rows, evidence seed 0; "victim 3, 4" retrain the job's recipe with seeds 3, 4 on the
    seed-0 run's training set, with and without its poisons):

    ===========================  =====  =======================  ========  ==============
    model                        ASR    per-restart index         flagged   smallest norm
    ===========================  =====  =======================  ========  ==============
    BadNets seed 0               0.977  1.22 1.32 1.35           0/3       class 0 (25)
    BadNets seed 1               0.981  3.50 2.89 2.98           3/3 (0)   class 0 (15.1)
    BadNets seed 2               0.955  1.90 1.93 2.21           1/3       class 0 (22)
    seed-0 poisons, victim 3     —      1.30 1.44 1.35           0/3       class 0 (26)
    seed-0 poisons, victim 4     —      1.44 1.42 1.44           0/3       class 0 (23)
    clean (job's, seeds 0-2)     —      0.76-0.94                0/9       7, 9, 3 (30-36)
    clean (seed-0 split, 3, 4)   —      0.75-0.94                0/6       7 (29-31)
    ===========================  =====  =======================  ========  ==============

    So on this victim Neural Cleanse finds the trigger — class 0's reversed mask covers all 16
    pixels of the real corner square (checked on seeds 0 and 2, plus 6-9 other pixels) and
    class 0 has the smallest norm in 15/15 restarts of backdoored models, never in a clean
    one — but the MAD rule (index > 2) flags only 1 of 5 backdoored
    models (4/15 restarts). False positives: 0 of 5 clean models, 0 of 15 restarts (largest
    index 0.94). Through the job (`privacylab defend backdoor --target DIR --method
    neural-cleanse --json`, BadNets seed 1): class 0 flagged, index 3.50, 48 s; unlearning:
    ASR 0.981 -> 0.032, accuracy 0.933 -> 0.914.

    Why the index stays low, both measured: (1) the MLP's clean classes have small universal
    patches (norms 22-55 in backdoored models, smallest 29-36 in clean ones), so even the exact
    16-pixel trigger sits only ~2 MADs below the median; (2) the success threshold 0.99 is
    above what the planted trigger itself achieves on the clean rows (0.98 for seed 0), so the
    reversed trigger is the square plus ~9 pixels (norm 25 instead of 16). A lower `success`
    helps seed 0 only at the edge (0.97: per-restart 1.69-2.05) and shrinks every class's norm,
    so it is not the default; the paper's value is kept and every restart's verdict is
    reported. H4's earlier mnist5k runs with 30 × 10 steps left the masks unconverged (norms
    81-148); an epoch is now a pass over the clean rows and 60 of them converge (norms within
    3% at 120). On 8x8 digits the 2x2 trigger's norm 4 is recovered."""

    name = "neural-cleanse"
    paper = (
        "Wang et al. 2019, Neural Cleanse: Identifying and Mitigating Backdoor Attacks in "
        "Neural Networks (IEEE S&P), Sec. IV-B Eq. 2-3, IV-C, VI-C"
    )
    needs = ("clean-data",)

    def __init__(
        self,
        *,
        seeds: int = 3,
        epochs: int = 60,
        steps_per_epoch: int | None = None,
        batch_size: int = 32,
        lr: float = 0.1,
        init_cost: float = 1e-3,
        cost_multiplier: float = 1.5,
        patience: int = 5,
        success: float = 0.99,
        early_stop: bool = True,
        threshold: float = 2.0,
        classes: list[int] | None = None,
        max_rows: int | None = None,
        mitigate: bool = True,
        unlearn_epochs: int = 10,
        unlearn_fraction: float = 0.2,
        unlearn_lr: float = 3e-3,
        unlearn_batch: int = 32,
        threads: int | None = 1,
        seed: int = 0,
    ) -> None:
        self.seeds = _positive_int("seeds", seeds)
        self.epochs = _positive_int("epochs", epochs)
        self.steps_per_epoch = (
            None if steps_per_epoch is None else _positive_int("steps_per_epoch", steps_per_epoch)
        )
        self.batch_size = _positive_int("batch_size", batch_size)
        self.lr = _positive_float("lr", lr)
        self.init_cost = _positive_float("init_cost", init_cost)
        self.cost_multiplier = _positive_float("cost_multiplier", cost_multiplier)
        if self.cost_multiplier <= 1.0:
            raise BackdoorDefenseError(
                f"neural-cleanse: cost_multiplier must be > 1, got {cost_multiplier!r}"
            )
        self.patience = _positive_int("patience", patience)
        self.success = _positive_float("success", success, upper=1.0)
        if not isinstance(early_stop, bool):
            raise BackdoorDefenseError(
                f"neural-cleanse: early_stop must be true or false, got {early_stop!r}"
            )
        self.early_stop = early_stop
        self.threshold = _positive_float("threshold", threshold)
        if classes is not None:
            if isinstance(classes, (str, bytes)) or not all(
                isinstance(c, (int, np.integer)) and not isinstance(c, bool) and c >= 0
                for c in classes
            ):
                raise BackdoorDefenseError(
                    "neural-cleanse: classes must be a list of class indices >= 0"
                )
            if len(set(int(c) for c in classes)) < 2:
                raise BackdoorDefenseError("neural-cleanse: classes must name at least 2 classes")
            classes = sorted(set(int(c) for c in classes))
        self.classes = classes
        self.max_rows = None if max_rows is None else _positive_int("max_rows", max_rows)
        if not isinstance(mitigate, bool):
            raise BackdoorDefenseError(
                f"neural-cleanse: mitigate must be true or false, got {mitigate!r}"
            )
        self.mitigate = mitigate
        self.unlearn_epochs = _positive_int("unlearn_epochs", unlearn_epochs)
        self.unlearn_fraction = _positive_float("unlearn_fraction", unlearn_fraction, upper=1.0)
        self.unlearn_lr = _positive_float("unlearn_lr", unlearn_lr)
        self.unlearn_batch = _positive_int("unlearn_batch", unlearn_batch)
        self.threads = None if threads is None else _positive_int("threads", threads)
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
            raise BackdoorDefenseError(
                f"neural-cleanse: seed must be a whole number >= 0, got {seed!r}"
            )
        self.seed = int(seed)

    def options(self) -> dict[str, Any]:
        """The configuration, JSON-ready."""
        return {
            "seeds": self.seeds,
            "epochs": self.epochs,
            "steps_per_epoch": self.steps_per_epoch,
            "batch_size": self.batch_size,
            "lr": self.lr,
            "init_cost": self.init_cost,
            "cost_multiplier": self.cost_multiplier,
            "patience": self.patience,
            "success": self.success,
            "early_stop": self.early_stop,
            "threshold": self.threshold,
            "classes": self.classes,
            "max_rows": self.max_rows,
            "mitigate": self.mitigate,
            "unlearn_epochs": self.unlearn_epochs,
            "unlearn_fraction": self.unlearn_fraction,
            "unlearn_lr": self.unlearn_lr,
            "unlearn_batch": self.unlearn_batch,
            "threads": self.threads,
            "seed": self.seed,
        }

    def _clean(self, evidence: BackdoorEvidence) -> Dataset:
        evidence.require(self.name, self.needs)
        clean = evidence.clean
        assert clean is not None
        if clean.features.dim() != 4:
            raise BackdoorDefenseError(
                "neural-cleanse needs image inputs (n, C, H, W), got clean data of shape "
                f"{tuple(clean.features.shape)}"
            )
        if self.max_rows is not None and len(clean) > self.max_rows:
            rows = np.random.default_rng(evidence.seed + self.seed).permutation(len(clean))
            clean = clean.subset(np.sort(rows[: self.max_rows]))
        return clean

    def verdict(self, norms: np.ndarray) -> dict[str, Any]:
        """Sec. IV-C on one restart's `norms`: per-class anomaly indices, the largest index
        below the median, the flagged classes (below the median, index > threshold) and the
        flagged class with the smallest norm."""
        index = anomaly_index(norms)
        below = norms < np.median(norms)
        largest = float(index[below].max()) if below.any() else 0.0
        flagged = np.flatnonzero(below & (index > self.threshold))
        named = int(flagged[np.argmin(norms[flagged])]) if flagged.size else None
        return {
            "anomaly_index": index,
            "index": largest,
            "flagged": flagged.tolist(),
            "flagged_class": named,
            "detected": bool(flagged.size),
        }

    def inspect(self, model: nn.Module, evidence: BackdoorEvidence) -> Detection:
        """Reverse-engineer every class's trigger over `seeds` restarts, flag by the anomaly
        index, majority verdict, and (if detected and `mitigate`) unlearn on a copy; torch's
        CPU thread count is `threads` meanwhile (restored after)."""
        before = torch.get_num_threads()
        if self.threads is not None:
            torch.set_num_threads(self.threads)
        try:
            return self._inspect(model, evidence)
        finally:
            torch.set_num_threads(before)

    def _inspect(self, model: nn.Module, evidence: BackdoorEvidence) -> Detection:
        start = time.perf_counter()
        clean = self._clean(evidence)
        k = evidence.num_classes
        classes = list(range(k)) if self.classes is None else self.classes
        if max(classes) >= k:
            raise BackdoorDefenseError(
                f"neural-cleanse: class {max(classes)} outside the model's {k} classes"
            )
        if len(clean) < 2:
            raise BackdoorDefenseError("neural-cleanse needs at least 2 clean rows")
        batch = min(self.batch_size, len(clean))
        runs: list[ReversedTriggers] = []
        verdicts: list[dict[str, Any]] = []
        for s in range(self.seeds):
            run_seed = 1_000_003 * (evidence.seed + self.seed) + s
            run = reverse_triggers(
                model,
                clean.features,
                classes,
                seed=run_seed,
                epochs=self.epochs,
                steps_per_epoch=self.steps_per_epoch,
                batch_size=batch,
                lr=self.lr,
                init_cost=self.init_cost,
                cost_multiplier=self.cost_multiplier,
                patience=self.patience,
                success=self.success,
                early_stop=self.early_stop,
            )
            runs.append(run)
            verdicts.append(self.verdict(run.norms))

        votes = sum(v["detected"] for v in verdicts)
        detected = votes * 2 > self.seeds
        indices = sorted(v["index"] for v in verdicts)
        index = float(indices[(self.seeds + 1) // 2 - 1])
        named = [v["flagged_class"] for v in verdicts if v["flagged_class"] is not None]
        flagged_class: int | None = None
        if detected and named:
            counts = Counter(named)
            top = max(counts.values())
            tied = [c for c, n in counts.items() if n == top]
            mean_norm = {c: float(np.mean([r.norms[c] for r in runs])) for c in tied}
            flagged_class = classes[min(tied, key=lambda c: mean_norm[c])]
        chosen = next(
            (
                s
                for s, v in enumerate(verdicts)
                if v["detected"] == detected
                and (
                    flagged_class is None
                    or (
                        v["flagged_class"] is not None
                        and classes[v["flagged_class"]] == flagged_class
                    )
                )
            ),
            0,
        )
        run = runs[chosen]
        median_norms = np.median(np.stack([r.norms for r in runs]), axis=0)
        where = None if flagged_class is None else classes.index(flagged_class)

        mitigation: Mitigation | None = None
        if self.mitigate and detected and where is not None:
            repaired = self.unlearn(
                model, clean, run.masks[where], run.patterns[where], evidence.seed
            )
            mitigation = Mitigation(
                model=repaired,
                description=(
                    f"unlearning (Wang et al. Sec. VI-C): {self.unlearn_epochs} epochs on "
                    f"{len(clean)} clean rows, {self.unlearn_fraction:.0%} stamped with the "
                    f"reversed trigger of class {flagged_class} and kept at their true labels"
                ),
            )
        elif self.mitigate:
            mitigation = Mitigation(description="no backdoor detected: the model is kept")

        per_seed = [
            {
                "seed": s,
                "norms": _rounded(r.norms),
                "anomaly_index": _rounded(v["anomaly_index"]),
                "index": round(v["index"], 6),
                "flagged": [classes[c] for c in v["flagged"]],
                "flagged_class": None
                if v["flagged_class"] is None
                else classes[v["flagged_class"]],
                "detected": v["detected"],
                "success": _rounded(r.success),
                "reached": r.reached.tolist(),
                "costs": [float(c) for c in r.costs],
                "epochs": r.epochs,
            }
            for s, (r, v) in enumerate(zip(runs, verdicts, strict=True))
        ]
        details: dict[str, Any] = {
            "paper": self.paper,
            "options": self.options(),
            "classes": classes,
            "norms": _rounded(median_norms),
            "per_seed": per_seed,
            "votes": int(votes),
            "false_positive_note": (
                "Neural Cleanse also flags clean models (index > 2) and varies run to run; "
                "per-seed verdicts are in per_seed"
            ),
            "trigger_seed": chosen,
            "triggers": [_rounded(m) for m in run.masks],
            "flagged_pattern": None if where is None else _rounded(run.patterns[where]),
            "clean_rows": len(clean),
        }
        return Detection(
            method=self.name,
            detected=detected,
            flagged_class=flagged_class,
            anomaly_index=index,
            scores={
                "norms": _rounded(median_norms),
                "anomaly_index": _rounded(anomaly_index(median_norms)),
            },
            mitigation=mitigation,
            seconds=time.perf_counter() - start,
            details=details,
        )

    def unlearn(
        self, model: nn.Module, clean: Dataset, mask: Tensor, pattern: Tensor, seed: int = 0
    ) -> nn.Module:
        """Wang et al. Sec. VI-C: a copy of `model` fine-tuned (Adam) on `clean`, a seeded
        `unlearn_fraction` of whose rows carry the reversed trigger (`mask`, `pattern`) with
        their true labels, so the model learns the trigger means nothing."""
        device = _device(model)
        repaired = self.copy_model(model)
        generator = torch.Generator().manual_seed(1_000_003 * (seed + self.seed) + 7919)
        n = len(clean)
        stamped = torch.rand(n, generator=generator) < self.unlearn_fraction
        x = clean.features.clone()
        x[stamped] = stamp_reversed(x[stamped], mask, pattern)
        y = clean.labels
        optimizer = torch.optim.Adam(
            [p for p in repaired.parameters() if p.requires_grad], lr=self.unlearn_lr
        )
        repaired.train()
        for _ in range(self.unlearn_epochs):
            order = torch.randperm(n, generator=generator)
            for begin in range(0, n, self.unlearn_batch):
                rows = order[begin : begin + self.unlearn_batch]
                optimizer.zero_grad()
                loss = nn.functional.cross_entropy(repaired(x[rows].to(device)), y[rows].to(device))
                loss.backward()
                optimizer.step()
        return repaired.eval()
