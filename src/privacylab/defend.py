"""The defend step, `privacylab defend`: train (or load) the undefended target and one model per
training-time defence, put every output defence in front of the target, attack each defended
model with the membership suite *adaptively*, and place every defence on one privacy–utility
frontier.

The membership game is the main job's (`privacylab.experiment`, Carlini et al. 2022 Sec. III):
the same seeded `membership_split` gives target members, non-member candidates and the
attacker's population, so the undefended target and its references are the very models
`privacylab run` trains (shared through the result store). The rows left over are cut into
the defender's own data (a labelled holdout and a public pool: early stopping's validation set,
AdvReg's reference set, MemGuard's non-members, DMP's unlabelled pool) and the attacker's copies
of the same (for the references it trains with the defence).

Adaptive evaluation (Kerckhoffs: the attacker knows the defence, not the defender's data or
randomness):
- output defences are attacked by the label-only attacks (their view is unchanged by any
  defence that keeps the label) and by every score attack whose references are queried *through
  the same defence* (`MembershipTask.reference_defense`), beside the same attacks calibrated on
  undefended references (non-adaptive, the setting of Jia et al. 2019's MemGuard evaluation);
- training-time defences are attacked with references trained *with the defence*
  (`privacylab.defenses.fitting.train_defended`), beside references trained without it.
An attack row is `adaptive` when the attacker's calibration saw the defence, or when the attack
calibrates on nothing the defence could change (an attack without references, a label-only
attack against a label-keeping output defence). A defence passes the release gate only on the
strength of adaptive attacks (`privacylab.report.defenses.gate`).

Every trained model, and every defence's attack results, is recorded in the cache's result
store as it finishes: a second run trains and attacks nothing, a killed run resumes.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
import torch

from privacylab.attacks.membership import (
    ATTACKS,
    MembershipResult,
    MembershipTask,
    default_suite,
    make_attack,
    run_attack,
    subsampled_attacks,
)
from privacylab.attacks.membership.references import (
    Recipe,
    ReferencePool,
    train_one,
    train_references,
)
from privacylab.attacks.membership.result import AttackError
from privacylab.data import Dataset, balanced_subsample, load_dataset, membership_split
from privacylab.defenses import (
    Defense,
    DefenseData,
    DefenseError,
    OutputDefense,
    QueryDefense,
    TrainingDefense,
    parse_defenses,
)
from privacylab.defenses.fitting import load_defended, train_defended
from privacylab.execution import (
    ResultStore,
    config_key,
    durable_map,
    make_executor,
    progress_counter,
)
from privacylab.execution.executor import torch_threads
from privacylab.models import load_model, model_options
from privacylab.report import membership_metrics
from privacylab.target import Access, Target
from privacylab.training import TrainConfig

DEFAULT_DEFENSES: tuple[str, ...] = (
    "none",
    "topk:1",
    "rounding:1",
    "label-only",
    "memguard",
    "l2:1e-3",
    "advreg:3",
    "dmp",
    "selena",
    "dp:8",
)
"""The defences `privacylab defend` evaluates by default (the issue's list)."""

RUN_DEFENSES: tuple[str, ...] = ("none", "topk:1", "rounding:1", "label-only")
"""The cheap subset `privacylab run` evaluates by default: output defences only, which reuse
the non-private target and its references (no training)."""

EVALUATIONS = "defense-evaluations"
"""Result-store namespace of one defence's attack results."""

Progress = Callable[[str, float, float], None]


@dataclass
class DefendConfig:
    """Everything `privacylab defend` varies.

    `members` rows train the target, as many non-members are candidates, `population` rows are
    the attacker's own; `holdout` rows each go to the defender's holdout, the defender's public
    pool, the attacker's holdout and the attacker's public pool. `access` is what the
    undefended deployment serves (output defences need scores or logits). `max_tpr` is the
    release gate's threshold on the strongest attack's TPR at 0.1% FPR (None: no gate).
    """

    dataset: str = "purchase-like"
    model: str = "mlp"
    model_options: dict[str, Any] = field(default_factory=lambda: {"widths": [256]})
    defenses: tuple[str, ...] = DEFAULT_DEFENSES
    attacks: tuple[str, ...] | None = None
    references: int = 4
    members: int = 2500
    population: int = 1000
    holdout: int = 1500
    epochs: int = 30
    batch_size: int = 128
    lr: float = 0.1
    delta: float = 1e-5
    subsample: int = 100
    attack_options: dict[str, dict[str, Any]] = field(
        default_factory=lambda: {
            "shadow": {"max_iter": 30},
            "noise": {"n_samples": 20},
            "boundary": {"max_queries": 1000},
        }
    )
    """Lighter attack settings than `privacylab run`'s (every attack runs twice per defence):
    30 boosting rounds per class for the shadow attack, 20 noisy copies, 1,000 boundary
    queries."""
    access: str = "scores"
    max_tpr: float | None = None
    workers: int = 2
    seed: int = 0
    root: str | None = None
    device: str = "cpu"

    def parsed_defenses(self) -> list[Defense]:
        """The defences, parsed (DefenseError for a bad spec)."""
        return parse_defenses(self.defenses)

    def chosen_attacks(self) -> list[str]:
        """The attacks to run: the given ones (aliases resolved), or the membership default
        suite without those needing more than the deployment's access."""
        if self.attacks is None:
            return [n for n in default_suite() if self._affordable(n)]
        out: list[str] = []
        for name in self.attacks:
            canonical = ATTACKS.canonical(name.strip())
            if canonical not in out:
                out.append(canonical)
        return out

    def _affordable(self, name: str) -> bool:
        return Access.parse(self.access).allows(ATTACKS.get(name).access)

    def validate(self) -> DefendConfig:
        """One-line DefenseError/AttackError for the first bad option, before any work."""
        defenses = self.parsed_defenses()
        access = Access.parse(self.access)
        for defense in defenses:
            if isinstance(defense, QueryDefense):
                raise DefenseError(
                    f"{defense.label} watches the query stream against model extraction; "
                    "use it with `privacylab attack extraction --defense`"
                )
            if isinstance(defense, OutputDefense):
                defense.check_applies(access)
            if isinstance(defense, TrainingDefense):
                model_options(self.model)
                defense.check_model(self.model)
                defense.model_options(dict(self.model_options))
        attacks = self.chosen_attacks()
        if not attacks:
            raise AttackError("no attacks to run; name some with --attacks")
        for name in attacks:
            if not self._affordable(name):
                need = ATTACKS.get(name).access.value
                raise AttackError(
                    f"attack {name} needs {need} access but the deployment serves {access.value}"
                )
        for name, value, low in (
            ("references", self.references, 1),
            ("members", self.members, 1),
            ("population", self.population, 0),
            ("holdout", self.holdout, 0),
            ("epochs", self.epochs, 1),
            ("batch_size", self.batch_size, 1),
            ("subsample", self.subsample, 1),
            ("workers", self.workers, 1),
            ("seed", self.seed, 0),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise AttackError(f"{name} must be a whole number >= {low}, got {value!r}")
        if not (isinstance(self.lr, (int, float)) and math.isfinite(self.lr) and self.lr > 0):
            raise AttackError(f"lr must be a finite number > 0, got {self.lr!r}")
        if not 0 < self.delta < 1:
            raise AttackError(f"delta must be in (0, 1), got {self.delta!r}")
        if self.max_tpr is not None and not (
            isinstance(self.max_tpr, (int, float)) and 0 <= self.max_tpr <= 1
        ):
            raise AttackError(f"--max-tpr-at-0.1 must be in [0, 1], got {self.max_tpr!r}")
        for defense in defenses:
            needs = getattr(defense, "needs", ())
            if isinstance(defense, OutputDefense) and defense.requires_holdout:
                needs = ("holdout",)
            if needs and self.holdout == 0:
                raise DefenseError(
                    f"{defense.label} needs the defender's {' and '.join(needs)} data; "
                    "give holdout rows (--holdout N)"
                )
        from privacylab.data.info import dataset_info

        size = dataset_info(self.dataset, self.root).size
        needed = 2 * self.members + self.population + 4 * self.holdout
        if needed > size:
            raise AttackError(
                f"{self.members} members, as many non-members, a population of "
                f"{self.population} and 4 x {self.holdout} holdout rows need {needed} rows; "
                f"dataset {self.dataset} has {size}"
            )
        return self

    def base_recipe(self) -> Recipe:
        """The undefended target's recipe (the same as `privacylab run`'s non-private one)."""
        config = TrainConfig(
            epochs=self.epochs,
            batch_size=self.batch_size,
            lr=self.lr,
            optimizer="momentum",
            seed=self.seed,
            device=self.device,
        ).validate()
        return Recipe(self.dataset, self.model, config.to_dict(), self.model_options, self.root)


@dataclass(frozen=True)
class DefenseSplit:
    """Disjoint dataset rows of one defence evaluation."""

    members: np.ndarray
    nonmembers: np.ndarray
    population: np.ndarray
    defender_holdout: np.ndarray
    defender_public: np.ndarray
    attacker_holdout: np.ndarray
    attacker_public: np.ndarray

    @property
    def candidates(self) -> np.ndarray:
        """Members then non-members."""
        return np.concatenate([self.members, self.nonmembers])

    @property
    def membership(self) -> np.ndarray:
        """1 for members, 0 for non-members, in `candidates` order."""
        return np.r_[np.ones(len(self.members), np.int64), np.zeros(len(self.nonmembers), np.int64)]


def defense_split(n: int, members: int, population: int, holdout: int, seed: int) -> DefenseSplit:
    """`membership_split`'s members, non-members and population (so the undefended target is
    `privacylab run`'s), and four disjoint blocks of `holdout` rows from what remains."""
    split = membership_split(n, target_size=members, population_size=population, seed=seed)
    used = np.concatenate([split.target_members, split.target_nonmembers, split.population])
    rest = np.setdiff1d(np.arange(n, dtype=np.int64), used)
    rest = np.random.default_rng(seed + 17).permutation(rest)
    if len(rest) < 4 * holdout:
        raise AttackError(f"{len(rest)} rows left for 4 x {holdout} holdout rows")
    blocks = [np.sort(rest[i * holdout : (i + 1) * holdout]) for i in range(4)]
    return DefenseSplit(split.target_members, split.target_nonmembers, split.population, *blocks)


@dataclass(eq=False)
class _Models:
    """The trained models of one evaluation: the undefended target and references, and per
    training-time defence its target and its references."""

    target: torch.nn.Module
    target_record: dict[str, Any]
    target_key: str
    references: ReferencePool
    defended: dict[str, tuple[torch.nn.Module, dict[str, Any], str]]
    defended_references: dict[str, ReferencePool]


def _train_models(
    config: DefendConfig,
    defenses: Sequence[Defense],
    split: DefenseSplit,
    cache: Path,
    store: ResultStore,
    progress: Progress | None,
) -> _Models:
    executor = make_executor("local", config.workers)
    base = config.base_recipe()
    base_key = config_key({"target": base.to_dict(), "members": split.members.tolist()})
    base_jobs = {
        base_key: {
            "recipe": base.to_dict(),
            "indices": split.members.tolist(),
            "seed": config.seed,
            "folder": str(cache / "targets" / "non-private"),
        }
    }
    trained = durable_map(
        train_one,
        base_jobs,
        store,
        "targets",
        executor,
        on_done=progress_counter(progress, "target", 1),
    )
    target = load_model(trained[base_key]["folder"])[0]
    references = train_references(
        base,
        split.candidates,
        config.references,
        config.members,
        cache / "references",
        store=store,
        executor=executor,
        seed=config.seed,
        on_done=progress_counter(progress, "references", config.references),
    )
    training = [d for d in defenses if isinstance(d, TrainingDefense)]
    recipes = {d.spec: Recipe(**{**base.__dict__, "defense": d.spec}) for d in training}
    jobs = {
        config_key({"target": r.to_dict(), "members": split.members.tolist()}): {
            "recipe": r.to_dict(),
            "indices": split.members.tolist(),
            "holdout": split.defender_holdout.tolist(),
            "public": split.defender_public.tolist(),
            "seed": config.seed,
            "folder": str(cache / "defended" / config_key({"spec": spec})[:16]),
        }
        for spec, r in recipes.items()
    }
    done = durable_map(
        train_defended,
        jobs,
        store,
        "defended-targets",
        executor,
        on_done=progress_counter(progress, "defended targets", len(jobs)),
    )
    defended = {}
    for (spec, _), key in zip(recipes.items(), jobs, strict=True):
        defended[spec] = (load_defended(done[key]["folder"]), done[key], key)
    labels = {d.spec: d.label for d in training}
    defended_references = {}
    for spec, recipe in recipes.items():
        defended_references[spec] = train_references(
            recipe,
            split.candidates,
            config.references,
            config.members,
            cache / "references",
            store=store,
            executor=executor,
            seed=config.seed,
            on_done=progress_counter(
                progress, f"references with {labels[spec]}", config.references
            ),
            worker=train_defended,
            loader=load_defended,
            job_extra={
                "holdout": split.attacker_holdout.tolist(),
                "public": split.attacker_public.tolist(),
            },
        )
    return _Models(target, trained[base_key], base_key, references, defended, defended_references)


def _task(
    data: Dataset,
    split: DefenseSplit,
    pool: ReferencePool,
    reference_defense: OutputDefense | None = None,
) -> MembershipTask:
    keep = pool.task_keep(len(split.population))
    return MembershipTask.from_rows(
        data, split.candidates, split.population, pool.models, keep, reference_defense
    )


def _uses_references(name: str) -> bool:
    return "references" in ATTACKS.get(name).threat_model.side_information


def attack_plan(
    defense: Defense, attacks: Sequence[str], serves: Access | None = None
) -> list[tuple[str, str, bool]]:
    """(attack, references, adaptive) for each attack run on `defense`: references "plain"
    (undefended references, queried plainly) or "defended" (references that saw the defence:
    queried through an output defence, or trained with a training-time one).

    Attacks that calibrate on references run twice, non-adaptively and adaptively; those that
    do not run once and count as adaptive (nothing they use depends on knowing the defence).
    Label-only attacks against a label-keeping output defence see exactly what they would see
    without it: they run once, adaptively. On the undefended model ("none") every attack runs
    once, on the plain references, and counts as adaptive (there is nothing to adapt to). An
    attack needing more than the defended deployment `serves` is planned once (it is reported
    as skipped)."""
    plan = []
    for name in attacks:
        needs = ATTACKS.get(name).access
        keeps_view = (
            isinstance(defense, OutputDefense) and needs is Access.LABEL and defense.keeps_label
        )
        if defense.kind == "none":
            plan.append((name, "plain", True))
        elif serves is not None and not serves.allows(needs):
            plan.append((name, "plain", False))
        elif not _uses_references(name) or keeps_view:
            plan.append((name, "defended", True))
        else:
            plan.append((name, "plain", False))
            plan.append((name, "defended", True))
    return plan


def _evaluate(
    defense: Defense,
    target: Target,
    tasks: dict[str, MembershipTask],
    membership: np.ndarray,
    attacks: Sequence[str],
    config: DefendConfig,
    progress: Progress | None,
) -> list[dict[str, Any]]:
    """Every planned attack on `target`: metric rows with `adaptive` and `references`."""
    rows = []
    small = balanced_subsample(membership, config.subsample, config.seed)
    subsampled = subsampled_attacks()
    plan = attack_plan(defense, attacks, target.access)
    with torch_threads(1):
        for i, (name, refs, adaptive) in enumerate(plan):
            if progress:
                progress(f"{defense.label}: attack {name}", i, len(plan))
            needs = ATTACKS.get(name).access
            if not target.access.allows(needs):
                rows.append(
                    {
                        "attack": name,
                        "adaptive": adaptive,
                        "references": refs,
                        "skipped": f"needs {needs.value} access; the defended model serves "
                        f"{target.access.value}",
                    }
                )
                continue
            attack = make_attack(name, **config.attack_options.get(name, {}))
            task = tasks[refs]
            try:
                if name in subsampled:
                    result = run_attack(attack, target, task.subset(small), membership[small])
                else:
                    result = run_attack(attack, target, task, membership)
            except AttackError as error:
                rows.append(
                    {
                        "attack": name,
                        "adaptive": adaptive,
                        "references": refs,
                        "skipped": str(error),
                    }
                )
                continue
            rows.append(_metrics(result, config.delta, adaptive, refs))
    if progress:
        progress(f"{defense.label}: attacks done", len(plan), len(plan))
    return rows


def _metrics(
    result: MembershipResult, delta: float, adaptive: bool, references: str
) -> dict[str, Any]:
    return {
        **membership_metrics(result, delta=delta).to_dict(),
        "members": int(result.membership.sum()),
        "adaptive": adaptive,
        "references": references,
    }


RESOLVING_NONMEMBERS = 1000
"""Non-members an attack must have scored for its TPR at 0.1% FPR to rank it the strongest:
with fewer, the lowest FPR it can measure is above 0.1% (a subsampled attack on 100
non-members measures TPR at 0% of 100, which overstates TPR at 0.1%)."""


def _strongest(rows: list[dict[str, Any]], key: str) -> dict[str, Any] | None:
    scored = [r for r in rows if r.get(key) is not None and "skipped" not in r]
    if key == "tpr_at_01pct_fpr" and scored:
        counts = [r["examples"] - r["members"] for r in scored]
        enough = min(RESOLVING_NONMEMBERS, max(counts))
        scored = [r for r, n in zip(scored, counts, strict=True) if n >= enough]
    if not scored:
        return None
    return max(scored, key=lambda r: (r[key], r.get("auc") or 0.0))


def defense_row(
    defense: Defense,
    serves: Access,
    test_accuracy: float,
    train_accuracy: float | None,
    epsilon: float | None,
    attacks: list[dict[str, Any]],
    note: str | None = None,
) -> dict[str, Any]:
    """One frontier row (the `privacylab defend --json` contract): the defence, its accuracy,
    every attack row, and the strongest attack by TPR at 0.1% FPR (among attacks that scored
    enough non-members to measure it, `RESOLVING_NONMEMBERS`) and by AUC."""
    best = _strongest(attacks, "tpr_at_01pct_fpr")
    best_auc = _strongest(attacks, "auc")
    info = defense.to_dict()
    return {
        "defense": info["label"],
        "spec": info["spec"],
        "name": info["name"],
        "kind": info["kind"],
        "changes": info["changes"],
        "params": info["params"],
        "paper": info["paper"],
        "serves": serves.value,
        "test_accuracy": test_accuracy,
        "train_accuracy": train_accuracy,
        "epsilon": epsilon,
        "attacks": attacks,
        "adaptive_attacks": sorted({a["attack"] for a in attacks if a.get("adaptive")}),
        "best": None
        if best is None
        else {
            "attack": best["attack"],
            "adaptive": best["adaptive"],
            "tpr_at_01pct_fpr": best["tpr_at_01pct_fpr"],
            "auc": best["auc"],
            "balanced_accuracy": best["balanced_accuracy"],
            "epsilon_lower_bound": best["epsilon_lower_bound"],
        },
        "best_auc": None
        if best_auc is None
        else {
            "attack": best_auc["attack"],
            "adaptive": best_auc["adaptive"],
            "auc": best_auc["auc"],
        },
        "note": note,
    }


def evaluate_defenses(
    config: DefendConfig,
    cache: str | Path,
    *,
    progress: Progress | None = None,
) -> tuple[dict[str, Any], dict[str, bytes]]:
    """Train, defend and attack: the payload's `defenses` object and its images."""
    from privacylab.report.defenses import annotate, defense_frontier_figure

    config.validate()
    defenses = config.parsed_defenses()
    attacks = config.chosen_attacks()
    cache = Path(cache).expanduser().resolve()
    cache.mkdir(parents=True, exist_ok=True)
    data = load_dataset(config.dataset, config.root)
    split = defense_split(len(data), config.members, config.population, config.holdout, config.seed)
    access = Access.parse(config.access)
    rows = []
    with ResultStore(cache / "store.sqlite") as store:
        models = _train_models(config, defenses, split, cache, store, progress)
        base_target = Target(models.target, access, data.num_classes, device=config.device)
        plain_task = _task(data, split, models.references)
        for defense in defenses:
            key = config_key(
                {
                    "target": models.target_key,
                    "defense": defense.spec,
                    "attacks": attacks,
                    "options": config.attack_options,
                    "references": config.references,
                    "subsample": config.subsample,
                    "access": access.value,
                    "delta": config.delta,
                    "seed": config.seed,
                }
            )
            stored = store.get(EVALUATIONS, key)
            if stored is not None:
                rows.append(stored)
                if progress:
                    progress(f"{defense.label}: reused", 1, 1)
                continue
            row = _evaluate_one(
                defense, config, data, split, models, base_target, plain_task, attacks, progress
            )
            store.put(EVALUATIONS, key, row)
            rows.append(row)
    frontier = annotate(rows, config.max_tpr)
    rows = frontier["rows"]
    section = {
        "dataset": config.dataset,
        "model": config.model,
        "access": access.value,
        "metric": "tpr_at_01pct_fpr",
        "max_tpr_at_01pct_fpr": config.max_tpr,
        "attacks": attacks,
        "rows": rows,
        "pareto": frontier["pareto"],
        "passing": frontier["passing"],
        "images": {"frontier": "defense_frontier.png"},
        "notes": [
            f"The target trains on {config.members} members of {config.dataset}; as many "
            f"non-members are the other candidates and {len(split.population)} population rows "
            f"are the attacker's. {config.references} references per recipe; the defender "
            f"holds {config.holdout} labelled and {config.holdout} public rows, the attacker "
            "its own copies of both.",
            "adaptive: the attacker's calibration saw the defence (references queried through "
            "the output defence or trained with the training-time defence), or the attack uses "
            "nothing the defence could change.",
        ],
    }
    images = {"defense_frontier.png": defense_frontier_figure(rows, config.max_tpr)}
    return section, images


def _evaluate_one(
    defense: Defense,
    config: DefendConfig,
    data: Dataset,
    split: DefenseSplit,
    models: _Models,
    base_target: Target,
    plain_task: MembershipTask,
    attacks: Sequence[str],
    progress: Progress | None,
) -> dict[str, Any]:
    membership = split.membership
    members_data = data.subset(split.members)
    epsilon = None
    train_accuracy: float | None
    if isinstance(defense, OutputDefense):
        defense.fit(
            models.target, members_data, DefenseData(holdout=data.subset(split.defender_holdout))
        )
        target = defense.defend(base_target)
        tasks = {
            "plain": plain_task,
            "defended": _task(data, split, models.references, reference_defense=defense),
        }
    elif isinstance(defense, TrainingDefense):
        model, record, _ = models.defended[defense.spec]
        epsilon = record.get("epsilon")
        target = Target(model, base_target.access, data.num_classes, device=config.device)
        tasks = {
            "plain": plain_task,
            "defended": _task(data, split, models.defended_references[defense.spec]),
        }
    else:
        target = base_target
        tasks = {"plain": plain_task, "defended": plain_task}
    rows = _evaluate(defense, target, tasks, membership, attacks, config, progress)
    with torch_threads(1):
        test_accuracy = target.accuracy(
            data.features[split.nonmembers], data.labels[split.nonmembers]
        )
        train_accuracy = target.accuracy(data.features[split.members], data.labels[split.members])
    return defense_row(defense, target.access, test_accuracy, train_accuracy, epsilon, rows)


def run_defend(
    config: DefendConfig,
    out: str | Path,
    *,
    cache: str | Path | None = None,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """`privacylab defend`: evaluate the defences and write `out/results.json` and
    `out/index.html` (the report's defences section); returns the payload."""
    from privacylab.report.html import write_report

    start = time.perf_counter()
    out = Path(out)
    section, images = evaluate_defenses(
        config, cache if cache is not None else out / "cache", progress=progress
    )
    payload: dict[str, Any] = {
        "title": f"privacylab defence report: {config.dataset}, {config.model}",
        "dataset": config.dataset,
        "model": config.model,
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "config": asdict(config),
        "defenses": section,
        "notes": section["notes"],
    }
    payload["seconds"] = time.perf_counter() - start
    write_report(out, payload, images)
    return payload
