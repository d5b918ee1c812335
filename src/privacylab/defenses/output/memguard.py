"""MemGuard (Jia, Salem, Backes, Zhang & Gong, "MemGuard: Defending against Black-Box Membership
Inference Attacks via Adversarial Examples", CCS 2019), as an output defence.

The defender trains its own membership classifier g on the model's confidence vectors (members:
its training set; non-members: its holdout), then answers every query with a confidence vector
that is an *adversarial example* for g: g's output is driven to 0.5 while the predicted label is
kept and the distortion is small. Two phases (paper Sec. 4):

- **Phase I** (Sec. 4.2, Algorithm 1) finds, for a query's confidence vector s, logit-space
  noise e for z = log s (softmax(z) = s) minimising
  L(e) = |h(softmax(z + e))| + c2 · ReLU(max_{j≠l} (z+e)_j − (z+e)_l)
  + c3 · ||softmax(z + e) − s||₁,
  where h is g's pre-sigmoid output (h = 0 ⇔ g = 0.5) and l the predicted label. Normalised
  gradient steps of size β run until the label is kept and g has crossed 0.5 (at most
  `max_steps`); then c3 is multiplied by 10 and the search restarts from e = 0, keeping the
  last noise that succeeded, until a round fails or `rounds` rounds are done (larger c3: smaller
  noise). A row whose first round fails, or whose g output is already within 1e-5 of 0.5, gets
  no noise. The search runs on a whole batch at once; each row stops at its own first success.
- **Phase II** (Sec. 4.3): the expected L1 distortion must not exceed the budget ε. With
  r = softmax(z + e) − s from Phase I, the answer is s + r with probability p and s otherwise,
  p minimising |E[g] − 0.5| under E[d] = p·||r||₁ ≤ ε: p = 0 where g(s + r) is not closer to
  0.5 than g(s) (Phase I may overshoot when g(s) is already near 0.5), else p = min(1, ε/||r||₁)
  (as the authors' `evaluate_nn_attack.py` computes it).

Three additions of ours, none changing an answer: Phase I is memoised per row (an attack that
asks the same examples again costs nothing); Phase II's coin is a keyed hash of the query (seed
as the key), so the coin depends on the query alone, not on the batch or on earlier queries,
and repeating a query cannot average it away; and a row that stops making progress for
`patience` steps leaves its round early (the authors always spend `max_steps`). Phase I's noise
itself may differ in the last float bits (about 1e-8) with the batch a row is first optimised
in (matrix kernels round differently for other batch sizes); the memo serves that first answer
to every repeat while it holds the row.

g follows the authors' code (jjy1994/MemGuard, `model_defense`): a 256-128-64 ReLU network with
a sigmoid output on the confidence vector sorted in **descending** order (the authors sort
ascending; the order only fixes the column layout), trained with binary cross-entropy. As in
their code, Phase I sorts each query once, optimises in that order and puts the classes back.
Two choices of ours: g's inputs are standardised with the training set's per-column mean and
standard deviation, and g is trained briefly (10 epochs of Adam by default; the authors ran SGD
at lr 0.001, which also leaves g smooth). A g trained to memorise its members is bumpy: tiny
noise then flips it without moving what an attacker measures (on digits, 100 epochs left the
entropy attack at 0.65 balanced accuracy, 10 epochs brought it to 0.53).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, ClassVar

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from privacylab.data import Dataset
from privacylab.defenses.base import (
    DefenseData,
    DefenseError,
    OutputDefense,
    Parameter,
    register_defense,
)
from privacylab.defenses.output import check_rows
from privacylab.target import Access

TINY = 1e-30
"""Probabilities are clamped to this before taking logs (log TINY ≈ −69)."""

CHUNK = 8192
"""Rows optimised together in Phase I (bounds memory for large query batches)."""

CACHE_ROWS = 200_000
"""Phase I answers memoised per defence (see `MemGuard.phase_one`)."""

PHASE_ONE_SETTINGS = ("max_steps", "step", "c2", "c3", "patience", "rounds")

HIDDEN = (256, 128, 64)
"""Widths of g's hidden layers (the authors' `model_defense`)."""


def confidences(model: nn.Module, features: Tensor, chunk: int = 4096) -> Tensor:
    """The model's probability vectors on `features` (float32, CPU), in evaluation mode: softmax
    of its outputs, or the outputs themselves when they already are probability rows."""
    was = model.training
    model.eval()
    try:
        device = next(model.parameters()).device
    except StopIteration:
        device = torch.device("cpu")
    outs = []
    with torch.no_grad():
        for i in range(0, int(features.shape[0]), chunk):
            out = model(features[i : i + chunk].to(device)).float().cpu()
            is_probs = bool((out >= 0).all()) and bool(((out.sum(1) - 1).abs() <= 1e-4).all())
            outs.append(out if is_probs else F.softmax(out, dim=1))
    model.train(was)
    if not outs:
        raise DefenseError("memguard: no examples to compute confidence vectors on")
    return torch.cat(outs)


@contextmanager
def _one_thread() -> Iterator[None]:
    """Run with one torch thread, then restore the count. g's matrices are small (n x classes
    by 256): the intra-op pool costs more than it gains (on a busy 2-core machine a Phase I step
    took 25 times longer with 2 threads), and one thread makes the answers independent of the
    machine's thread count."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def _defender_classifier(num_classes: int) -> nn.Sequential:
    layers: list[nn.Module] = []
    width = num_classes
    for hidden in HIDDEN:
        layers += [nn.Linear(width, hidden), nn.ReLU()]
        width = hidden
    layers.append(nn.Linear(width, 1))
    return nn.Sequential(*layers)


def _uniforms(rows: np.ndarray, seed: int) -> np.ndarray:
    """One uniform in [0, 1) per row: a keyed hash (BLAKE2b, key = the seed) of the row's bytes.
    The coin of Phase II is thus a seeded function of the query itself: the same confidence
    vector always gets the same answer, whatever else is in the batch or was asked before."""
    key = int(seed).to_bytes(8, "little")
    out = np.empty(len(rows))
    for i, row in enumerate(rows):
        digest = hashlib.blake2b(row.tobytes(), digest_size=8, key=key).digest()
        out[i] = (int.from_bytes(digest, "little") >> 11) / float(1 << 53)
    return out


@register_defense
class MemGuard(OutputDefense):
    """MemGuard (Jia et al. 2019): Phase I noise against the defender's classifier g, Phase II
    randomised under the expected-L1 budget. Call `fit` before querying (budget 0 excepted:
    it returns every row unchanged)."""

    name = "memguard"
    parameters: ClassVar[tuple[Parameter, ...]] = (
        Parameter(
            "budget",
            float,
            1.0,
            "expected L1 distortion ε of Phase II (0: no defence; >= 2: every row perturbed)",
            low=0.0,
        ),
        Parameter("seed", int, 0, "seed of g's training and of Phase II's coin", low=0),
        Parameter("max_steps", int, 300, "gradient steps per round of Phase I", low=1, high=5000),
        Parameter(
            "step",
            float,
            0.1,
            "Phase I step β (normalised gradient)",
            low=0,
            high=10,
            low_open=True,
        ),
        Parameter(
            "c2", float, 10.0, "weight of the keep-the-label term", low=0, high=1e6, low_open=True
        ),
        Parameter(
            "c3",
            float,
            0.1,
            "first weight of the L1 distortion term (×10 per round)",
            low=0,
            high=1e6,
            low_open=True,
        ),
        Parameter(
            "patience",
            int,
            30,
            "steps without progress before a row gives up a round",
            low=1,
            high=5000,
        ),
        Parameter("rounds", int, 7, "rounds of Algorithm 1's c3 search", low=1, high=12),
        Parameter(
            "epochs", int, 10, "training epochs of the defender's classifier g", low=1, high=5000
        ),
    )
    paper = (
        "Jia, Salem, Backes, Zhang & Gong 2019, MemGuard: Defending against Black-Box "
        "Membership Inference Attacks via Adversarial Examples (CCS), Sec. 4, Algorithm 1"
    )
    serves: ClassVar[Access] = Access.SCORES
    requires_holdout: ClassVar[bool] = True

    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        self.classifier: nn.Sequential | None = None
        self.num_classes: int | None = None
        self.notes: dict[str, Any] = {}
        self._memo: dict[tuple[Any, ...], dict[bytes, tuple[Tensor, bool]]] = {}
        self._shift = torch.zeros(())
        self._scale = torch.ones(())

    # ---------------------------------------------------------------- fit: the classifier g
    def fit(self, model: nn.Module, train_data: Dataset, extra: DefenseData) -> None:
        """Train the defender's membership classifier g (paper Sec. 4.1; authors'
        `train_defense_model_defensemodel.py`): members are `train_data`, non-members
        `extra.holdout`, balanced by a seeded subsample of the larger side; g's input is the
        confidence vector sorted descending; Adam (lr 1e-3, batch 64) on binary cross-entropy
        for `epochs` epochs, seeded. `notes` records g's accuracy on its own training set."""
        holdout = extra.holdout if extra is not None else None
        if holdout is None or len(holdout) == 0:
            raise DefenseError(
                f"{self.label} needs the defender's holdout data (non-members to train g)"
            )
        if len(train_data) == 0:
            raise DefenseError(f"{self.label} needs a non-empty training set (members)")
        members = confidences(model, train_data.features)
        others = confidences(model, holdout.features)
        if members.shape[1] != others.shape[1] or members.shape[1] < 2:
            raise DefenseError(
                f"{self.label}: the model returns {members.shape[1]} and {others.shape[1]} "
                "classes on members and holdout; need the same number, at least 2"
            )
        seed = int(self.params["seed"])
        rng = np.random.default_rng(seed)
        n = min(len(members), len(others))
        members = members[np.sort(rng.permutation(len(members))[:n])]
        others = others[np.sort(rng.permutation(len(others))[:n])]
        raw = torch.cat([members, others]).sort(dim=1, descending=True).values
        self._shift = raw.mean(0)
        self._scale = raw.std(0).clamp_min(1e-6)
        x = (raw - self._shift) / self._scale
        y = torch.cat([torch.ones(n), torch.zeros(n)])
        num_classes = int(x.shape[1])
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            g = _defender_classifier(num_classes)
        optimiser = torch.optim.Adam(g.parameters(), lr=1e-3)
        order = torch.Generator().manual_seed(seed)
        g.train()
        with _one_thread():
            for _ in range(int(self.params["epochs"])):
                perm = torch.randperm(2 * n, generator=order)
                for i in range(0, 2 * n, 64):
                    rows = perm[i : i + 64]
                    loss = F.binary_cross_entropy_with_logits(g(x[rows]).squeeze(1), y[rows])
                    optimiser.zero_grad()
                    loss.backward()
                    optimiser.step()
        g.eval()
        for p in g.parameters():
            p.requires_grad_(False)
        with torch.no_grad():
            accuracy = float(((g(x).squeeze(1) > 0).float() == y).float().mean())
        self.classifier, self.num_classes = g, num_classes
        self._memo = {}
        self.notes = {"defender_accuracy": accuracy, "defender_examples": 2 * n}

    def _h(self, g: nn.Sequential, logits: Tensor) -> Tensor:
        """g's pre-sigmoid output h on the confidence vector softmax(z), sorted again (noise
        may reorder the classes below the label; g must judge what a query would show)."""
        probs = F.softmax(logits, dim=1).sort(dim=1, descending=True).values
        return g((probs - self._shift) / self._scale).squeeze(1)

    def with_budget(self, budget: float) -> MemGuard:
        """This fitted defence at another budget ε: g and the memoised Phase I answers are
        shared (Phase I does not depend on ε), so a budget sweep fits and optimises once."""
        twin = type(self)(**{**self.params, "budget": budget})
        twin.classifier, twin.num_classes, twin.notes = (
            self.classifier,
            self.num_classes,
            self.notes,
        )
        twin._shift, twin._scale, twin._memo = self._shift, self._scale, self._memo
        return twin

    def membership_probability(self, probs: Tensor) -> Tensor:
        """g's output (probability of "member") on probability rows `probs` (n, classes)."""
        g = self._require_fit(probs)
        with torch.no_grad():
            sorted_probs = probs.detach().cpu().float().sort(dim=1, descending=True).values
            x = (sorted_probs - self._shift) / self._scale
            return torch.sigmoid(g(x).squeeze(1))

    def _require_fit(self, probs: Tensor) -> nn.Sequential:
        """g, or a one-line DefenseError: not fitted, or `probs` not finite (n, classes) rows."""
        check_rows(self, probs)
        if self.classifier is None:
            raise DefenseError(f"{self.label}: call fit(model, train_data, extra) before querying")
        if probs.ndim != 2 or probs.shape[1] != self.num_classes:
            raise DefenseError(
                f"{self.label}: expected probability rows of shape (n, {self.num_classes}), "
                f"got {tuple(probs.shape)}"
            )
        if not bool(torch.isfinite(probs).all()):
            raise DefenseError(f"{self.label}: the probability rows hold NaN or infinite values")
        return self.classifier

    # ---------------------------------------------------------------- Phase I
    def phase_one(self, probs: Tensor) -> tuple[Tensor, Tensor]:
        """Phase I (Algorithm 1) on every row of `probs`: the noisy rows softmax(z + e) (rows
        without a solution are returned unchanged) and a bool mask of the rows that got noise.
        Phase I is a deterministic function of the row, so answers are memoised per row (up
        to `CACHE_ROWS` rows, per Phase I settings; a refit starts afresh): attacks that ask
        the same examples again cost nothing."""
        self._require_fit(probs)
        device, probs = probs.device, probs.detach().cpu()
        if probs.shape[0] == 0:
            return probs.clone().to(device), torch.zeros(0, dtype=torch.bool, device=device)
        settings = tuple(self.params[k] for k in PHASE_ONE_SETTINGS)
        memo = self._memo.setdefault(settings, {})
        keys = [row.tobytes() for row in probs.contiguous().numpy()]
        answers = {key: memo[key] for key in keys if key in memo}
        unique = [key for key in dict.fromkeys(keys) if key not in answers]
        if unique:
            first = {key: i for i, key in reversed(list(enumerate(keys)))}
            todo = probs[torch.tensor([first[key] for key in unique], dtype=torch.int64)]
            for i in range(0, len(unique), CHUNK):
                noisy, found = self._phase_one_chunk(todo[i : i + CHUNK])
                if sum(map(len, self._memo.values())) + len(noisy) > CACHE_ROWS:
                    for table in self._memo.values():
                        table.clear()
                for key, row, hit in zip(unique[i : i + CHUNK], noisy, found, strict=True):
                    memo[key] = answers[key] = (row, bool(hit))
        noisy = torch.stack([answers[key][0] for key in keys]).to(probs.dtype)
        found = torch.tensor([answers[key][1] for key in keys], dtype=torch.bool)
        return noisy.to(device), found.to(device)

    def _phase_one_chunk(self, probs: Tensor) -> tuple[Tensor, Tensor]:
        with _one_thread():
            return self._phase_one_rows(probs)

    def _phase_one_rows(self, probs: Tensor) -> tuple[Tensor, Tensor]:
        g = self.classifier
        assert g is not None
        s = probs.float()
        order = torch.argsort(s, dim=1, descending=True, stable=True)
        s_sorted = s.gather(1, order)
        z0 = s_sorted.clamp_min(TINY).log()
        with torch.no_grad():
            h0 = self._h(g, z0)
        side0 = torch.sign(h0)
        todo = (torch.sigmoid(h0) - 0.5).abs() > 1e-5
        best = z0.clone()
        found = torch.zeros(s.shape[0], dtype=torch.bool)
        active = torch.nonzero(todo).squeeze(1)
        c2, beta = float(self.params["c2"]), float(self.params["step"])
        c3 = float(self.params["c3"])
        for _ in range(int(self.params["rounds"])):
            if active.numel() == 0:
                break
            z = z0[active].clone()
            success = self._search(g, z, s_sorted[active], side0[active], c2, c3, beta)
            won = active[success]
            best[won] = z[success]
            found[won] = True
            active = won
            c3 *= 10.0
        out = F.softmax(best.double(), dim=1).to(probs.dtype)
        unsorted = torch.empty_like(out).scatter_(1, order, out)
        kept = unsorted.argmax(1) == probs.argmax(1)
        found &= kept
        return torch.where(found.unsqueeze(1), unsorted, probs), found

    def _search(
        self,
        g: nn.Sequential,
        z: Tensor,
        s_sorted: Tensor,
        side0: Tensor,
        c2: float,
        c3: float,
        beta: float,
    ) -> Tensor:
        """One round of Algorithm 1's inner loop, in place on the sorted logits `z` (label in
        column 0): normalised gradient steps on every row not yet done, for at most
        `max_steps`; returns the rows that keep the label with g across 0.5. A row whose
        signed margin h·sign(h₀) has not reached a new low for `patience` steps gives up (the
        authors always spend `max_steps`; a stalled row only oscillates under the L1 pull)."""
        n = z.shape[0]
        done = torch.zeros(n, dtype=torch.bool)
        alive = torch.ones(n, dtype=torch.bool)
        lowest = torch.full((n,), float("inf"))
        stalled = torch.zeros(n, dtype=torch.int64)
        steps, patience = int(self.params["max_steps"]), int(self.params["patience"])
        for step in range(steps + 1):
            rows = torch.nonzero(alive & ~done).squeeze(1)
            if rows.numel() == 0:
                break
            zr = z[rows].requires_grad_(True)
            soft = F.softmax(zr, dim=1)
            h = self._h(g, zr)
            with torch.no_grad():
                margin = h * side0[rows]
                label_kept = zr[:, 0] > zr[:, 1:].max(1).values
                ok = label_kept & (margin <= 0)
                done[rows[ok]] = True
                if step == steps:
                    break
                better = margin < lowest[rows]
                lowest[rows] = torch.minimum(lowest[rows], margin)
                stalled[rows] = torch.where(better, 0, stalled[rows] + 1)
                alive[rows[stalled[rows] > patience]] = False
            label_gap = F.relu(zr[:, 1:].max(1).values - zr[:, 0])
            distortion = (soft - s_sorted[rows]).abs().sum(1)
            loss = h.abs() + c2 * label_gap + c3 * distortion
            (grad,) = torch.autograd.grad(loss.sum(), zr)
            with torch.no_grad():
                move = ~ok
                norm = grad.norm(dim=1, keepdim=True).clamp_min(1e-12)
                z[rows[move]] = zr[move] - beta * grad[move] / norm[move]
        return done

    # ---------------------------------------------------------------- Phase II
    def transform(self, probs: Tensor) -> Tensor:
        """MemGuard's answer for probability rows `probs` (Phase II, Sec. 4.3): Phase I's noisy
        row s + r with probability min(1, ε/||r||₁) where g(s + r) is closer to 0.5 than g(s),
        else the row unchanged; budget 0 returns `probs` as is. Computed on the CPU (where g
        lives) and returned on `probs`' device."""
        check_rows(self, probs)
        budget = float(self.params["budget"])
        if budget == 0.0:
            return probs.clone()
        self._require_fit(probs)
        device, probs = probs.device, probs.detach().cpu()
        if probs.shape[0] == 0:
            return probs.clone().to(device)
        noisy, found = self.phase_one(probs)
        distortion = (noisy.double() - probs.double()).abs().sum(1)
        p = torch.where(distortion > 0, (budget / distortion.clamp_min(1e-300)).clamp(max=1.0), 1.0)
        closer = (self.membership_probability(noisy) - 0.5).abs() < (
            self.membership_probability(probs) - 0.5
        ).abs()
        coin = torch.from_numpy(_uniforms(probs.contiguous().numpy(), int(self.params["seed"])))
        add = found & closer & (coin < p)
        return torch.where(add.unsqueeze(1), noisy, probs).to(device)
