"""The main job, `privacylab run`: train a non-private target and DP-SGD targets, attack each
with the membership suite, and write the privacy report.

The membership game follows Carlini et al. 2022 (Sec. III): the dataset is cut by a seeded
permutation into target members, target non-members (the candidates, half of each) and a
population neither the target nor any reference trains on (RMIA's z). References are trained
with each target's own recipe on random halves of the candidates, so every candidate is IN for
half of them and OUT for the other half, through an executor, and are kept in a durable
store: a second run reuses them and a killed run resumes.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
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
    attack_aliases,
    attack_names,
    default_suite,
    make_attack,
    run_attack,
    subsampled_attacks,
)
from privacylab.attacks.membership.references import (
    Recipe,
    TrainFn,
    train_one,
    train_references,
)
from privacylab.attacks.membership.result import AttackError
from privacylab.data import (
    Dataset,
    balanced_subsample,
    load_dataset,
    membership_split,
    train_test_indices,
)
from privacylab.execution import (
    ResultStore,
    config_key,
    durable_map,
    make_executor,
    progress_counter,
)
from privacylab.execution.executor import torch_threads
from privacylab.models import load_model
from privacylab.report import membership_metrics
from privacylab.target import Target
from privacylab.training import PrivacyConfig, TrainConfig

DEFAULT_ATTACKS = default_suite()
"""The suite `privacylab run` runs on every target: the registered attacks whose class sets
`in_default_suite`, in `suite_order` (loss ... boundary-cw)."""

ALIASES = attack_aliases()
"""Other names of attacks, as their classes declare them (e.g. lira -> lira-online)."""

SUBSAMPLED = subsampled_attacks()
"""Attacks that cost thousands of queries per example and run on a balanced subsample."""


def resolve_attacks(names: Sequence[str]) -> list[str]:
    """Attack names with aliases resolved, or AttackError naming the unknown one."""
    known = set(attack_names())
    out = []
    for name in names:
        name = name.strip()
        if name not in known and name not in ATTACKS:
            choices = ", ".join(sorted(known | set(attack_aliases())))
            raise AttackError(f"unknown membership attack {name!r}; choose one of {choices}")
        name = ATTACKS.canonical(name)
        if name not in out:
            out.append(name)
    return out


@dataclass
class RunConfig:
    """Everything `privacylab run` varies. `members` is the target's training-set size, the
    same number of non-members are candidates and `population` more rows are the attacker's."""

    dataset: str = "mnist5k"
    model: str = "mlp"
    model_options: dict[str, Any] = field(default_factory=lambda: {"widths": [256]})
    epsilons: tuple[float, ...] = (1.0, 8.0)
    nonprivate: bool = True
    delta: float = 1e-5
    attacks: tuple[str, ...] = DEFAULT_ATTACKS
    references: int = 16
    members: int = 2000
    population: int = 1000
    epochs: int = 30
    batch_size: int = 128
    lr: float = 0.1
    dp_batch_size: int = 256
    dp_lr: float = 0.05
    max_grad_norm: float = 1.0
    subsample: int = 200
    attack_options: dict[str, dict[str, Any]] = field(default_factory=dict)
    audits: tuple[str, ...] = ("dirac", "one-run-whitebox")
    audit_trials: int = 100
    workers: int = 2
    seed: int = 0
    root: str | None = None
    device: str = "cpu"
    defenses: tuple[str, ...] = ()
    """Defences evaluated on the non-private target (the report's defence section; see
    `privacylab.defend`); the CLI's default is `defend.RUN_DEFENSES`, output defences that
    train nothing."""
    max_tpr: float | None = None
    """The defence section's release gate on TPR at 0.1% FPR (None: no gate)."""

    @classmethod
    def quick(cls, **overrides: Any) -> RunConfig:
        """A smaller run: 4 references, 15 epochs, 1,000 members, 60 boundary examples a side,
        and lighter label-only attacks (fewer noisy copies, queries and C&W steps)."""
        base: dict[str, Any] = {
            "references": 4,
            "epochs": 15,
            "members": 1000,
            "population": 500,
            "subsample": 60,
            "audit_trials": 40,
            "attack_options": {
                "noise": {"n_samples": 20},
                "boundary": {"max_queries": 1000},
                "boundary-cw": {"steps": 100, "search_steps": 4},
            },
        }
        base.update(overrides)
        return cls(**base)

    def validate(self) -> RunConfig:
        """One-line AttackError or TrainingError for the first bad option; checked in the
        calling process before any work, so no bad option fails in a worker."""
        if not self.attacks:
            raise AttackError("no attacks given: name at least one, e.g. lira,rmia")
        self.attacks = tuple(resolve_attacks(self.attacks))
        for eps in self.epsilons:
            if not (isinstance(eps, (int, float)) and math.isfinite(eps) and 0 < eps <= 1e4):
                raise AttackError(
                    f"every epsilon must be a finite number > 0 and at most 1e4, got {eps!r}"
                )
        if not (isinstance(self.delta, float) and 0 < self.delta < 1):
            raise AttackError(f"delta must be in (0, 1), got {self.delta!r}")
        for name in ("lr", "dp_lr", "max_grad_norm"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and 0 < value <= 1e3):
                raise AttackError(f"{name} must be a finite number in (0, 1e3], got {value!r}")
        for name, high in (
            ("epochs", 100_000), ("batch_size", 10**7), ("dp_batch_size", 10**7),
            ("references", 10**4), ("members", 10**7), ("subsample", 10**7),
            ("workers", 1024), ("audit_trials", 10**6),
        ):  # fmt: skip
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= high:
                raise AttackError(
                    f"{name} must be a whole number >= 1 and at most {high:,}, got {value!r}"
                )
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise AttackError(f"seed must be a whole number >= 0, got {self.seed!r}")
        if not self.epsilons and not self.nonprivate:
            raise AttackError("nothing to attack: give epsilons or keep the non-private target")
        for name in ("references", "members", "workers", "subsample"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise AttackError(f"{name} must be a whole number >= 1, got {value!r}")
        from privacylab.audit.job import METHODS

        for method in self.audits:
            if method not in METHODS:
                raise AttackError(
                    f"unknown audit method {method!r}; choose one of {', '.join(METHODS)}"
                )
        if self.population < 0:
            raise AttackError(f"population must be >= 0, got {self.population}")
        try:
            device = torch.device(self.device)
        except RuntimeError:
            raise AttackError(f"unknown device {self.device!r}; use cpu or cuda") from None
        if device.type not in ("cpu", "cuda"):
            raise AttackError(f"unsupported device {self.device!r}; use cpu or cuda")
        if device.type == "cuda" and not torch.cuda.is_available():
            raise AttackError("--device cuda was asked for but no CUDA device is available")
        if self.root is not None and not Path(self.root).expanduser().is_dir():
            raise AttackError(f"root {self.root} is not a folder")
        if not isinstance(self.model_options, dict):
            raise AttackError(f"model_options must be a dict, got {self.model_options!r}")
        from privacylab.data.info import dataset_info
        from privacylab.models import model_options
        from privacylab.models._checks import parameter_shapes

        model_options(self.model)  # an unknown model name is refused before the data load
        data = dataset_info(self.dataset, self.root)
        parameter_shapes(self.model, data.input_shape, data.num_classes, dict(self.model_options))
        if 2 * self.members > data.size:
            raise AttackError(
                f"{self.members} members and as many non-members need {2 * self.members} rows; "
                f"dataset {self.dataset} has {data.size}"
            )
        if self.defenses:
            if not self.nonprivate:
                raise AttackError("defences are evaluated on the non-private target: keep it")
            self.defend_config(data.size).validate()
        return self

    def defend_config(self, size: int) -> Any:
        """The `privacylab.defend.DefendConfig` of this run's defence section: the run's
        dataset, model, recipe, membership split and references (so its undefended target and
        references are this run's non-private ones, shared through the store), the run's
        attacks that need at most scores, and what rows are left as holdout pools."""
        from privacylab.defend import DefendConfig

        population = min(self.population, max(0, size - 2 * self.members))
        left = size - 2 * self.members - population
        attacks = tuple(a for a in self.attacks if not ATTACKS.get(a).access.allows("logits"))
        return DefendConfig(
            dataset=self.dataset,
            model=self.model,
            model_options=self.model_options,
            defenses=self.defenses,
            attacks=attacks,
            references=self.references,
            members=self.members,
            population=population,
            holdout=min(2000, left // 4),
            epochs=self.epochs,
            batch_size=self.batch_size,
            lr=self.lr,
            delta=self.delta,
            subsample=self.subsample,
            attack_options=self.attack_options,
            max_tpr=self.max_tpr,
            workers=self.workers,
            seed=self.seed,
            root=self.root,
            device=self.device,
        )

    def recipes(self) -> list[tuple[str, Recipe]]:
        """(target name, training recipe) for the non-private and each DP target."""
        out = []
        base = {
            "epochs": self.epochs,
            "seed": self.seed,
            "optimizer": "momentum",
            "device": self.device,
        }
        if self.nonprivate:
            plain = TrainConfig(batch_size=self.batch_size, lr=self.lr, **base)
            out.append(("non-private", self._recipe(plain)))
        for eps in self.epsilons:
            privacy = PrivacyConfig(
                epsilon=float(eps), delta=self.delta, max_grad_norm=self.max_grad_norm
            )
            dp = TrainConfig(batch_size=self.dp_batch_size, lr=self.dp_lr, privacy=privacy, **base)
            out.append((f"dp-eps{eps:g}", self._recipe(dp)))
        return out

    def _recipe(self, config: TrainConfig) -> Recipe:
        config.validate()
        return Recipe(self.dataset, self.model, config.to_dict(), self.model_options, self.root)


Progress = Callable[[str, float, float], None]
"""progress(stage, done, total)."""


def attack_target(
    target: Target,
    task: MembershipTask,
    membership: np.ndarray,
    attacks: Sequence[str],
    *,
    subsample: int,
    seed: int,
    progress: Progress | None = None,
    options: dict[str, dict[str, Any]] | None = None,
) -> list[MembershipResult]:
    """Run each attack; those in SUBSAMPLED on `subsample` members and as many non-members.

    Attacks are loops of small batched forward passes; they run on one torch thread, which on a
    shared machine is many times faster than an OpenMP pool spinning for cores (restored after).
    """
    with torch_threads(1):
        results = []
        small = balanced_subsample(membership, subsample, seed)
        small_task = task.subset(small)
        for i, name in enumerate(attacks):
            if progress:
                progress(f"attack {name}", i, len(attacks))
            attack = make_attack(name, **(options or {}).get(name, {}))
            if name in SUBSAMPLED:
                results.append(run_attack(attack, target, small_task, membership[small]))
            else:
                results.append(run_attack(attack, target, task, membership))
        if progress:
            progress("attacks done", len(attacks), len(attacks))
        return results


@dataclass(eq=False)
class Game:
    """One target ready to attack: its name, recipe and training record, the target (white-box,
    each attack narrows it), the attacker's task and the truth for the candidates."""

    name: str
    recipe: Recipe
    record: dict[str, Any]
    target: Target
    task: MembershipTask
    membership: np.ndarray
    test_accuracy: float
    candidates: np.ndarray | None = None
    """Dataset row of each candidate (the report's "most exposed examples" name rows by it)."""


def prepare_games(
    config: RunConfig, cache: str | Path, *, progress: Progress | None = None
) -> Iterator[Game]:
    """Train (or load from `cache`) every target and its references, yielding one Game per
    target. Each model is recorded in `cache/store.sqlite` as it finishes, so a killed run
    resumes and a second run trains nothing."""
    config.validate()
    cache = Path(cache).expanduser().resolve()
    cache.mkdir(parents=True, exist_ok=True)
    data = load_dataset(config.dataset, config.root)
    population = None
    if len(data) >= 2 * config.members:
        population = min(config.population, len(data) - 2 * config.members)
    split = membership_split(
        len(data), target_size=config.members, population_size=population, seed=config.seed
    )
    candidates, membership = split.target_indices()
    executor = make_executor("local", config.workers)
    recipes = config.recipes()

    with ResultStore(cache / "store.sqlite") as store:
        target_jobs = {
            config_key({"target": recipe.to_dict(), "members": split.target_members.tolist()}): {
                "recipe": recipe.to_dict(),
                "indices": split.target_members.tolist(),
                "seed": config.seed,
                "folder": str(cache / "targets" / name),
            }
            for name, recipe in recipes
        }
        trained = durable_map(
            train_one,
            target_jobs,
            store,
            "targets",
            executor,
            on_done=progress_counter(progress, "train targets", len(target_jobs)),
        )
        for index, ((name, recipe), key) in enumerate(zip(recipes, target_jobs, strict=True)):
            pool = train_references(
                recipe,
                candidates,
                config.references,
                config.members,
                cache / "references",
                store=store,
                executor=executor,
                seed=config.seed + index,
                on_done=progress_counter(progress, f"references for {name}", config.references),
            )
            model, _, _ = load_model(trained[key]["folder"])
            target = Target(model, "white-box", data.num_classes, device=config.device)
            keep = pool.task_keep(len(split.population))
            task = MembershipTask.from_rows(data, candidates, split.population, pool.models, keep)
            nonmembers = split.target_nonmembers
            accuracy = target.accuracy(data.features[nonmembers], data.labels[nonmembers])
            yield Game(name, recipe, trained[key], target, task, membership, accuracy, candidates)


def run_experiment(
    config: RunConfig,
    out: str | Path,
    *,
    cache: str | Path | None = None,
    progress: Progress | None = None,
    games: Iterable[Game] | None = None,
    verdict_threshold: float = 0.002,
) -> dict[str, Any]:
    """Train, attack and report; writes `out/results.json` and `out/index.html` and returns the
    payload. Trained models live under `cache` (default `out/cache`) with their store. `games`
    replaces the targets `config` would train (a user's own model, see `privacylab.byo`); the
    caller then validates `config` (its dataset and sizes describe no game of its own).

    Each target gets a `verdict`: it leaks when an attack's TPR at 0.1% FPR exceeds
    `verdict_threshold` (default 0.002, twice chance) with 95% confidence over all attacks (see
    `privacylab.report.verdict.target_verdict`), and a per-example `risk` (see
    `privacylab.report.verdict.risk_scores`)."""
    from privacylab.report.html import write_report
    from privacylab.report.plots import (
        histogram_figure,
        histogram_informative,
        privacy_utility_figure,
        roc_figure,
    )
    from privacylab.report.verdict import (
        RISK_METHOD,
        check_threshold,
        risk_scores,
        target_verdict,
    )

    games_given = games
    if games is None:
        config.validate()  # caller-made games come with a config its maker validated
    verdict_threshold = check_threshold(verdict_threshold)
    start = time.perf_counter()
    out = Path(out)
    payload: dict[str, Any] = {
        "title": f"privacylab membership report: {config.dataset}, {config.model}",
        "dataset": config.dataset,
        "model": config.model,
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "config": {**asdict(config), "attacks": list(config.attacks)},
        "verdict_threshold": verdict_threshold,
        "verdict_metric": "tpr_at_01pct_fpr",
        "risk_method": RISK_METHOD,
        "targets": [],
        "notes": [
            "Scores are ranked per attack; TPR at fixed FPR follows Carlini et al. 2022.",
            "The ε lower bound is the one implied by the attack's (TPR, FPR) with 95% "
            "Clopper–Pearson confidence, at the attack's own threshold (chosen on reference "
            "models) or at one chosen on a held-out half of the examples; for a DP model it must "
            "not exceed the certified ε.",
            f"Attacks {', '.join(sorted(SUBSAMPLED & set(config.attacks))) or 'none'} run on "
            f"{config.subsample} members and {config.subsample} non-members.",
        ],
    }
    images: dict[str, bytes] = {}
    if games is None:
        games = prepare_games(
            config, cache if cache is not None else out / "cache", progress=progress
        )
    for game in games:
        name = game.name

        def stage(s: str, d: float, t: float, name: str = name) -> None:
            if progress:
                progress(f"{name}: {s}", d, t)

        results = attack_target(
            game.target,
            game.task,
            game.membership,
            config.attacks,
            subsample=config.subsample,
            seed=config.seed,
            progress=stage,
            options=config.attack_options,
        )
        epsilon = game.record.get("epsilon")
        metrics = [
            {
                **membership_metrics(r, delta=config.delta).to_dict(),
                "members": int(r.membership.sum()),
            }
            for r in results
        ]
        roc_name = f"roc_{name}.png"
        images[roc_name] = roc_figure(results, f"{name}: ROC (log-log)")
        hists = {}
        for r in results:
            if not histogram_informative(r):
                continue
            file = f"hist_{name}_{r.attack}.png"
            images[file] = histogram_figure(r, f"{name}: {r.attack}")
            hists[r.attack] = file
        privacy = game.recipe.train.get("privacy")
        risk = risk_scores(
            results,
            metrics,
            labels=game.task.y.cpu().numpy(),
            indices=getattr(game, "candidates", None),
        )
        payload["targets"].append(
            {
                "name": name,
                "epsilon": epsilon,
                "delta": config.delta if epsilon is not None else None,
                "accountant": privacy["accountant"] if privacy else None,
                "train_accuracy": game.record["train_accuracy"],
                "test_accuracy": game.test_accuracy,
                "members": int(game.membership.sum()),
                "nonmembers": int((1 - game.membership).sum()),
                "population": game.task.m,
                "references": config.references,
                "attacks": metrics,
                "images": {"roc": roc_name, "histograms": hists},
                "risk": risk,
            }
        )
        payload["targets"][-1]["verdict"] = target_verdict(
            payload["targets"][-1], verdict_threshold
        )
    payload["audit"] = audit_epsilons(config, Path(cache) if cache else out / "cache", progress)
    if config.defenses and games_given is None:
        from privacylab.data.info import dataset_info
        from privacylab.defend import evaluate_defenses

        size = dataset_info(config.dataset, config.root).size
        section, defense_images = evaluate_defenses(
            config.defend_config(size),
            Path(cache) if cache else out / "cache",
            progress=progress,
        )
        payload["defenses"] = section
        images.update(defense_images)
    if payload["targets"]:
        first = payload["targets"][0]
        payload["notes"].insert(
            0,
            f"Each target trains on {first['members']} members of {config.dataset}; as many "
            f"non-members are the other candidates and {first['population']} population rows "
            f"are the attacker's own. {config.references} reference models per target are "
            "trained with that target's recipe (DP-SGD for DP targets) on random halves of the "
            f"candidates; {config.model} {config.model_options}, {config.epochs} epochs.",
        )
    if payload["targets"]:
        images["privacy_utility.png"] = privacy_utility_figure(
            payload["targets"], threshold=verdict_threshold
        )
        payload["images"] = {"privacy_utility": "privacy_utility.png"}
    payload["seconds"] = time.perf_counter() - start
    write_report(out, payload, images)
    return payload


def audit_epsilons(
    config: RunConfig, cache: Path, progress: Progress | None = None
) -> list[dict[str, Any]]:
    """Audit our DP-SGD at each of the run's ε with `config.audits` (a logistic regression on
    digits, the audits' standard setting, named in each result as `audited_model` and
    `audited_dataset`); trials are kept in the cache's store."""
    from privacylab.audit.job import run_audit

    audited = {"audited_model": "logreg", "audited_dataset": "digits"}

    out = []
    jobs = [(eps, method) for eps in config.epsilons for method in config.audits]
    executor = make_executor("local", config.workers)
    with ResultStore(cache / "store.sqlite") as store:
        for i, (eps, method) in enumerate(jobs):
            if progress:
                progress("audits", i, len(jobs))
            result = run_audit(
                method,
                epsilon=float(eps),
                delta=config.delta,
                trials=config.audit_trials,
                dataset=audited["audited_dataset"],
                model=audited["audited_model"],
                store=store,
                executor=executor,
                seed=config.seed,
            )
            out.append({**result.to_dict(), **audited})
    if progress:
        progress("audits", len(jobs), len(jobs))
    return out


def saved_target_game(
    path: str | Path,
    *,
    references: int,
    cache: str | Path,
    workers: int = 2,
    root: str | None = None,
    progress: Progress | None = None,
) -> Game:
    """The membership game for a model saved by `privacylab train`: its training rows are the
    members; half of its test rows are the non-member candidates and the other half the
    attacker's population. References are trained with the recipe in the model's sidecar."""
    model, spec, meta = load_model(path)
    try:
        dataset = meta["data"]["name"]
        training = dict(meta["training"])
    except (KeyError, TypeError):
        raise AttackError(
            f"{path} has no training recipe in its sidecar; train it with `privacylab train`"
        ) from None
    data = load_dataset(dataset, root)
    recipe = Recipe(dataset, spec.name, training, dict(spec.options), root)
    game = model_game(
        model,
        data,
        recipe,
        references=references,
        cache=cache,
        workers=workers,
        seed=training.get("seed", 0),
        name=Path(path).name,
        epsilon=(meta.get("summary") or {}).get("epsilon"),
        progress=progress,
    )
    game.record["folder"] = str(path)
    return game


def model_game(
    model: torch.nn.Module,
    data: Dataset,
    recipe: Recipe,
    *,
    references: int,
    cache: str | Path,
    workers: int = 2,
    seed: int = 0,
    name: str = "your-model",
    epsilon: float | None = None,
    outputs: str = "logits",
    train_fn: TrainFn | None = None,
    device: str = "cpu",
    progress: Progress | None = None,
) -> Game:
    """The membership game for a trained `model` whose training rows are the canonical train
    part of `data` (`train_test_indices`): those are the members; half of the test rows are the
    non-member candidates and the other half the attacker's population (Carlini et al. 2022,
    Sec. III). `references` models are trained by `recipe` (the project's trainer) or, with
    `train_fn(model, x, y)`, by the user's own loop, on random halves of all rows but the
    target's members' truth is never used; they are stored in `cache` as each finishes."""
    if isinstance(references, bool) or not isinstance(references, int) or references < 1:
        raise AttackError(f"references must be a whole number >= 1, got {references!r}")
    members, test_rows = train_test_indices(data, seed=seed)
    if len(members) < 1 or len(test_rows) < 2:
        raise AttackError("need at least one training row and two test rows")
    order = np.random.default_rng(seed + 7).permutation(test_rows)
    nonmembers, population = np.sort(order[: len(order) // 2]), np.sort(order[len(order) // 2 :])
    candidates = np.concatenate([members, nonmembers])
    membership = np.r_[np.ones(len(members), np.int64), np.zeros(len(nonmembers), np.int64)]
    cache = Path(cache).expanduser().resolve()
    with ResultStore(cache / "store.sqlite") as store:
        pool = train_references(
            recipe,
            np.concatenate([candidates, population]),
            references,
            len(members),
            cache / "references",
            store=store,
            executor=make_executor("local", workers),
            seed=seed,
            on_done=progress_counter(progress, "references", references),
            train_fn=train_fn,
        )
    target = Target(model, "white-box", data.num_classes, device=device, outputs=outputs)
    task = MembershipTask.from_rows(data, candidates, population, pool.models, pool.keep)
    accuracy = target.accuracy(data.features[nonmembers], data.labels[nonmembers])
    record = {
        "folder": None,
        "train_accuracy": target.accuracy(data.features[members], data.labels[members]),
        "epsilon": epsilon,
    }
    return Game(name, recipe, record, target, task, membership, accuracy, candidates)
