"""The extraction job, `privacylab attack extraction`: steal a model saved by privacylab with
each named extraction attack, through the deployment the user describes (what a query returns,
output defences, query watches such as PRADA), and measure the copies against the victim.

What each party holds (the threat model of Tramèr et al. 2016, Sec. 3; Orekondy et al. 2019,
Sec. 3; Jagielski et al. 2020, Sec. 3):
- the thief: the API (a `Target` at the access `--output` names) and an `ExtractionTask`: the
  input shape, the class count, the victim's architecture (Kerckhoffs), the input domain, a pool
  of unlabelled in-distribution rows it owns, its query budget (`--queries`);
- the evaluator: the victim's weights and held-out labelled rows (`Truth`), never shown to the
  attack. The pool and the evaluator's rows are the two halves of the victim's *test* rows
  (`privacylab.attacks.extraction.pools.extraction_split`), so neither holds a training row.

Deployment, built per attack before any query (so a bad combination is one line, exit 2, and
no attack has run): `--output labels` serves labels, `scores` probability vectors, `logits`
logits, `rounded:D` probability vectors rounded to D decimals (the `rounding` output defence).
Without `--output` each attack is served what it declares, at least scores. Exact attacks
(equation solving, `relu-exact`) get a target that answers in float64 (Carlini et al. 2020
assume it of the API); the JSON records `precision`. A defence alternative (`--defense`,
comma-separated alternatives, `+` stacks several in one deployment, `none` is the undefended
one) puts output defences in front of the answers and query defences (PRADA, `budget:N`) on
the query stream; each attack is one client with a fresh watch, whose verdict (`detected`,
`queries_until_detection`) joins its result. Training-time defences are refused (they need a
model trained with them).

Every (attack, deployment) result is written to the result store as it finishes, keyed by
the victim's weights digest, the attack and its options, the output, the defence, the budget
and the seed: a second run serves every result from the store, a killed run resumes.
"""

from __future__ import annotations

import copy
import hashlib
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from privacylab.attacks.extraction import (
    EXTRACTION_ATTACKS,
    ExtractionAttack,
    ExtractionError,
    ExtractionTask,
    Truth,
    extraction_names,
    make_extraction,
    relu_layers,
    run_extraction,
)
from privacylab.attacks.extraction.pools import extraction_split
from privacylab.data import Dataset, load_dataset
from privacylab.defenses import (
    Defense,
    DefenseError,
    OutputDefense,
    QueryDefense,
    TrainingDefense,
    parse_defense,
)
from privacylab.errors import PrivacylabError
from privacylab.execution import ResultStore, config_key
from privacylab.models import ModelSpec, load_model
from privacylab.report.jsonable import json_ready
from privacylab.target import Access, QueryBudgetError, Target

__all__ = [
    "EXTRACTIONS",
    "OUTPUTS",
    "Deployment",
    "ExtractConfig",
    "Victim",
    "default_checkpoints",
    "extraction_rows",
    "load_victim",
    "parse_output",
    "run_extract",
]

EXTRACTIONS = "extraction-results"
"""Result-store namespace of one (attack, deployment) result."""

OUTPUTS = ("labels", "scores", "logits", "rounded:D")
"""What `--output` may name."""

MAX_QUERIES = 10**9
"""Largest query budget accepted (Carlini et al. 2020's largest extraction used 2^21.5)."""

STORE_VERSION = 1
"""Part of every store key: bump when a stored row's meaning changes."""

Progress = Callable[[str, float, float], None]


def parse_output(text: str | None) -> tuple[Access | None, int | None]:
    """`--output` as (access served, rounding decimals or None); (None, None) for "each
    attack's own access". ExtractionError naming the choices for anything else."""
    if text is None:
        return None, None
    value = str(text).strip().lower()
    if value in ("label", "labels"):
        return Access.LABEL, None
    if value in ("score", "scores", "probabilities"):
        return Access.SCORES, None
    if value == "logits":
        return Access.LOGITS, None
    if value.startswith("rounded:"):
        digits = value.partition(":")[2].strip()
        rounding = parse_defense(f"rounding:{digits}")
        return Access.SCORES, int(rounding.params["d"])
    raise ExtractionError(f"unknown --output {text!r}; choose one of {', '.join(OUTPUTS)}")


def _output_label(access: Access, digits: int | None) -> str:
    if digits is not None:
        return f"rounded:{digits}"
    return {Access.LABEL: "labels", Access.SCORES: "scores"}.get(access, access.value)


def _parse_alternative(text: str) -> list[Defense]:
    """One deployment's defences: `none`, or specs joined by `+`; DefenseError for a bad spec
    or a training-time defence."""
    parts = [p.strip() for p in str(text).split("+")]
    if not any(parts):
        raise DefenseError("empty --defense; write e.g. prada, budget:1000 or rounding:2+prada")
    out = []
    for part in parts:
        if not part:
            raise DefenseError(f"empty defence in {text!r}; write e.g. rounding:2+prada")
        defense = parse_defense(part)
        if isinstance(defense, TrainingDefense):
            raise DefenseError(
                f"{defense.label} is a training-time defence: it needs a model trained with it "
                "(`privacylab train` / `privacylab defend`); --defense takes output defences "
                "and query watches (prada, budget:N, rounding:D, ...)"
            )
        if defense.kind == "none" and len(parts) > 1:
            raise DefenseError(f"{text!r}: none cannot be stacked with other defences")
        out.append(defense)
    return [d for d in out if d.kind != "none"]


def default_checkpoints(budget: int) -> tuple[int, ...]:
    """Query counts at which learning attacks snapshot their copy: 1/16, 1/8, 1/4, 1/2 and all
    of the budget (the accuracy/fidelity-against-queries curve)."""
    return tuple(sorted({max(1, round(budget / 2**k)) for k in range(4, -1, -1)}))


@dataclass
class ExtractConfig:
    """Everything `privacylab attack extraction` varies.

    `target`: a model folder written by privacylab (`save_model`: safetensors + JSON sidecar
    whose metadata names the dataset). `methods`: registered extraction attacks
    (`extraction_names()`). `queries`: the thief's budget. `output`: what a query returns
    (`OUTPUTS`; None: what each attack declares, at least scores). `defenses`: deployment
    alternatives, each run separately (`none`, or specs joined by `+`). `attack_options`:
    constructor options per method. `checkpoints`: query counts of the curve (default
    `default_checkpoints`). `seed` seeds the attacks (the pool/evaluation split follows the
    victim's own training seed, so that it holds none of its training rows).
    """

    target: str
    methods: tuple[str, ...] = ("knockoff",)
    queries: int = 1000
    output: str | None = None
    defenses: tuple[str, ...] = ("none",)
    attack_options: dict[str, dict[str, Any]] = field(default_factory=dict)
    checkpoints: tuple[int, ...] | None = None
    seed: int = 0
    root: str | None = None
    device: str = "cpu"

    def chosen_methods(self) -> list[str]:
        """The methods, aliases resolved, each once; ExtractionError naming the registered
        choices for an unknown one."""
        methods = [str(m).strip() for m in self.methods if str(m).strip()]
        if not methods:
            raise ExtractionError(
                f"no extraction method given; choose from {', '.join(extraction_names())}"
            )
        out: list[str] = []
        for name in methods:
            canonical = EXTRACTION_ATTACKS.canonical(name)
            if canonical not in out:
                out.append(canonical)
        return out

    def alternatives(self) -> list[tuple[str, list[Defense]]]:
        """(label, defences) of each deployment alternative, parsed (fresh objects)."""
        texts = [str(t).strip() for t in self.defenses] or ["none"]
        out = []
        seen = set()
        for text in texts:
            defenses = _parse_alternative(text)
            label = "+".join(d.label for d in defenses) or "none"
            key = "+".join(d.spec for d in defenses) or "none"
            if key not in seen:
                seen.add(key)
                out.append((label, defenses))
        return out

    def curve_points(self) -> tuple[int, ...]:
        """The curve's query counts, within the budget."""
        if self.checkpoints is None:
            return default_checkpoints(self.queries)
        points = sorted({int(c) for c in self.checkpoints if 0 < int(c) <= self.queries})
        return tuple(points) if points else (self.queries,)

    def validate(self) -> ExtractConfig:
        """One-line errors for the first bad option, before anything is loaded or queried."""
        if (
            isinstance(self.queries, bool)
            or not isinstance(self.queries, int)
            or not 1 <= self.queries <= MAX_QUERIES
        ):
            raise ExtractionError(
                f"--queries (the query budget) must be a whole number in [1, {MAX_QUERIES:,}], "
                f"got {self.queries!r}"
            )
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise ExtractionError(f"seed must be a whole number >= 0, got {self.seed!r}")
        methods = self.chosen_methods()
        parse_output(self.output)
        self.alternatives()
        if not isinstance(self.attack_options, Mapping) or not all(
            isinstance(v, Mapping) for v in self.attack_options.values()
        ):
            raise ExtractionError(
                'attack options must map a method to its options, e.g. {"knockoff": '
                '{"policy": "adaptive"}}'
            )
        for name in self.attack_options:
            if EXTRACTION_ATTACKS.canonical(name) not in methods:
                raise ExtractionError(f"options given for {name}, which is not run")
        for name in methods:
            self.attack(name)
        if self.checkpoints is not None:
            for c in self.checkpoints:
                if isinstance(c, bool) or not isinstance(c, int) or c < 1:
                    raise ExtractionError(f"checkpoints must be whole numbers >= 1, got {c!r}")
        return self

    def options_for(self, name: str) -> dict[str, Any]:
        """The constructor options given for `name` (under its name or an alias)."""
        for key, value in self.attack_options.items():
            if EXTRACTION_ATTACKS.canonical(key) == name:
                return dict(value)
        return {}

    def attack(self, name: str) -> ExtractionAttack:
        """A fresh instance of the attack `name` with its options (ExtractionError for a bad
        option)."""
        try:
            return make_extraction(name, **self.options_for(name))
        except TypeError as error:
            raise ExtractionError(f"{name}: bad options: {error}") from None


@dataclass(eq=False)
class Victim:
    """The saved model and what the evaluator derives from it: its spec, its dataset, the
    thief's pool rows and the evaluator's rows, the input bounds and the weights digest."""

    folder: Path
    model: nn.Module
    spec: ModelSpec
    metadata: dict[str, Any]
    data: Dataset
    pool_rows: np.ndarray
    eval_rows: np.ndarray
    bounds: tuple[float, float]
    digest: str

    @property
    def name(self) -> str:
        """The folder's name."""
        return self.folder.name

    def facts(self) -> dict[str, Any]:
        """JSON-ready facts about the victim for the result and the report."""
        summary = self.metadata.get("summary")
        return {
            "target": str(self.folder),
            "name": self.name,
            "dataset": self.data.name,
            "model": self.spec.name,
            "model_options": dict(self.spec.options),
            "input_shape": list(self.spec.input_shape),
            "num_classes": self.spec.num_classes,
            "parameters": int(sum(p.numel() for p in self.model.parameters())),
            "pool_rows": len(self.pool_rows),
            "eval_rows": len(self.eval_rows),
            "bounds": list(self.bounds),
            "epsilon": summary.get("epsilon") if isinstance(summary, dict) else None,
            "sha256": self.digest,
        }


def load_victim(folder: str | Path, root: str | None = None, device: str = "cpu") -> Victim:
    """The model saved at `folder`, its dataset (`metadata.data.name` of the sidecar) and the
    pool/evaluation split of its test rows (seeded by the victim's own training seed, so the
    split's test rows are the ones it did not train on); one-line PrivacylabError for a folder
    that is not a privacylab model."""
    path = Path(folder).expanduser()
    if not path.is_dir():
        raise PrivacylabError(f"--target {folder} is not a model folder")
    model, spec, meta = load_model(path, device=device)
    data_info = meta.get("data")
    if not isinstance(data_info, dict) or not isinstance(data_info.get("name"), str):
        raise PrivacylabError(f"{path}: the sidecar's metadata.data.name is not a dataset name")
    training = meta.get("training")
    seed = training.get("seed", 0) if isinstance(training, dict) else 0
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise PrivacylabError(f"{path}: the sidecar's training.seed is not a whole number")
    data = load_dataset(data_info["name"], root)
    if tuple(data.input_shape) != tuple(spec.input_shape):
        raise PrivacylabError(
            f"{path}: the model takes inputs of shape {tuple(spec.input_shape)} but dataset "
            f"{data.name} has {tuple(data.input_shape)}"
        )
    pool_rows, eval_rows = (np.asarray(r, dtype=np.int64) for r in extraction_split(data, seed))
    if len(eval_rows) == 0:
        raise PrivacylabError(f"{path}: dataset {data.name} leaves no held-out rows to evaluate")
    low, high = float(data.features.min()), float(data.features.max())
    if not (math.isfinite(low) and math.isfinite(high)) or low >= high:
        low, high = (0.0, 1.0) if not math.isfinite(low + high) else (low, low + 1.0)
    sidecar = path / "model.json"
    digest = hashlib.sha256(sidecar.read_bytes()).hexdigest()
    return Victim(path, model, spec, meta, data, pool_rows, eval_rows, (low, high), digest)


@dataclass(eq=False)
class Deployment:
    """One attack's view of the victim: the `target` it queries (its output, defences and
    watches applied), the query `watches` whose verdicts join its result, and the facts the
    result records."""

    method: str
    attack: ExtractionAttack
    target: Target
    watches: list[QueryDefense]
    defense: str
    output: str
    precision: str

    def key_facts(self) -> dict[str, Any]:
        """What identifies this deployment in the result store."""
        return {
            "method": self.method,
            "defense": self.defense,
            "output": self.output,
            "precision": self.precision,
        }


def _deploy(
    victim: Victim,
    method: str,
    attack: ExtractionAttack,
    output: str | None,
    label: str,
    defenses: Sequence[Defense],
    device: str,
    budget: int,
) -> Deployment:
    """The target `method` queries, or one-line ExtractionError/DefenseError when this
    deployment cannot serve it (checked before any query). The thief's `budget` is enforced
    on it (a view with that budget, inside every watch): an attack that asks for more gets
    `QueryBudgetError` and stops with what it has, so `queries` never exceeds `--queries`."""
    cls = type(attack)
    needs = attack.threat_model.access
    access, digits = parse_output(output)
    if access is None:
        access = needs if needs.rank > Access.SCORES.rank else Access.SCORES
    if access.allows(Access.WHITEBOX):
        raise ExtractionError(f"{method} needs white-box access; extraction serves at most logits")
    precision = "float64" if (cls.needs_float64 or cls.exact) else "float32"
    root = Target(
        victim.model,
        Access.LOGITS,
        victim.spec.num_classes,
        device=device,
        precision=precision,  # type: ignore[arg-type]
    )
    target = root.with_access(access)
    if digits is not None:
        rounding = parse_defense(f"rounding:{digits}")
        assert isinstance(rounding, OutputDefense)
        target = rounding.defend(target)
    target = target.with_budget(budget)
    watches: list[QueryDefense] = []
    for defense in defenses:
        if isinstance(defense, OutputDefense):
            target = defense.defend(target)
    for defense in defenses:
        if isinstance(defense, QueryDefense):
            target = defense.defend(target)
            watches.append(defense)
    if not target.access.allows(needs):
        said = f"--output {output}" if output is not None else "its deployment"
        defended = f" behind {label}" if label != "none" else ""
        raise ExtractionError(
            f"{method} needs {needs.value} access but {said}{defended} serves "
            f"{target.access.value}" + (" (use --output logits)" if needs is Access.LOGITS else "")
        )
    return Deployment(
        method, attack, target, watches, label, _output_label(target.access, digits), precision
    )


def _truth(
    victim: Victim, methods: Sequence[str], attacks: Mapping[str, ExtractionAttack]
) -> Truth:
    """The evaluator's truth, with the victim's affine layers when it is a fully connected
    ReLU network. An exact attack (its recovered layers are aligned with the victim's) on any
    other victim is one-line ExtractionError naming the first offending layer, before any
    query."""
    try:
        layers = relu_layers(victim.model)
    except ExtractionError as error:
        layers = None
        for method in methods:
            if type(attacks[method]).exact:
                raise ExtractionError(f"{method} cannot extract {victim.name}: {error}") from None
    x = victim.data.features[victim.eval_rows]
    y = victim.data.labels[victim.eval_rows]
    return Truth(victim.model, x, y, layers=layers, bounds=victim.bounds)


def _task(victim: Victim, config: ExtractConfig) -> ExtractionTask:
    return ExtractionTask(
        input_shape=tuple(victim.spec.input_shape),
        num_classes=victim.spec.num_classes,
        pool=victim.data.features[victim.pool_rows],
        pool_kind="in-distribution",
        architecture=victim.spec,
        bounds=victim.bounds,
        budget=config.queries,
        checkpoints=config.curve_points(),
        seed=config.seed,
    )


def _verdict(watches: Sequence[QueryDefense]) -> dict[str, Any] | None:
    """The watches' findings: one watch's verdict as it is (with `watch`, its label); several
    merged (`detected` if any detected, the smallest `queries_until_detection`), each in
    `watches`."""
    if not watches:
        return None
    found = [{"watch": w.label, **w.verdict()} for w in watches]
    if len(found) == 1:
        return found[0]
    counts = [v.get("queries_until_detection") for v in found]
    counts = [c for c in counts if isinstance(c, int)]
    return {
        "detected": any(bool(v.get("detected")) for v in found),
        "queries_until_detection": min(counts) if counts else None,
        "watches": found,
    }


def _run_one(deployment: Deployment, task: ExtractionTask, truth: Truth) -> dict[str, Any]:
    """One attack through its deployment: the result row (`ExtractionResult.to_dict()` with
    the deployment's facts and the watches' verdict). An attack stopped by the deployment
    (a spent budget, a refusing watch, an attack that finds the victim outside its model)
    gives a row with `error` and what was measured before it."""
    start = time.perf_counter()
    try:
        result = run_extraction(deployment.attack, deployment.target, task, truth)
    except PrivacylabError as error:
        row: dict[str, Any] = {
            "method": deployment.method,
            "access": type(deployment.attack).threat_model.access.value,
            "queries": deployment.target.queries,
            "seconds": time.perf_counter() - start,
            "accuracy": None,
            "fidelity": None,
            "victim_accuracy": None,
            "curve": [],
            "stopped": "budget" if isinstance(error, QueryBudgetError) else "refused",
            "error": " ".join(str(error).split()),
            "params": {},
        }
        verdict = _verdict(deployment.watches)
        if verdict is not None:
            row.update(verdict)
    else:
        result.defense = _verdict(deployment.watches)
        row = result.to_dict()
    row.update(
        {
            "defense": deployment.defense,
            "defended": deployment.defense != "none",
            "output": deployment.output,
            "precision": deployment.precision,
            "budget": task.budget,
        }
    )
    return json_ready(row)


def _store_key(victim: Victim, deployment: Deployment, config: ExtractConfig) -> str:
    return config_key(
        {
            "version": STORE_VERSION,
            "target": victim.digest,
            **deployment.key_facts(),
            "options": json_ready(config.options_for(deployment.method)),
            "budget": config.queries,
            "checkpoints": list(config.curve_points()),
            "seed": config.seed,
            "eval_rows": hashlib.sha256(victim.eval_rows.tobytes()).hexdigest(),
        }
    )


def extraction_rows(
    config: ExtractConfig,
    cache: str | Path,
    *,
    progress: Progress | None = None,
) -> tuple[Victim, list[dict[str, Any]]]:
    """Run every (method, defence alternative) of `config` against its victim, each result
    written to the store in `cache` as it finishes (and served from it when present); every
    deployment is built, and every bad combination refused, before the first query."""
    config.validate()
    methods = config.chosen_methods()
    victim = load_victim(config.target, config.root, config.device)
    attacks = {m: config.attack(m) for m in methods}
    truth = _truth(victim, methods, attacks)
    plan: list[Deployment] = []
    for method in methods:
        for label, fresh in config.alternatives():  # fresh defence objects per deployment
            plan.append(
                _deploy(
                    victim,
                    method,
                    config.attack(method),
                    config.output,
                    label,
                    fresh,
                    config.device,
                    config.queries,
                )
            )
    task = _task(victim, config)
    folder = Path(cache).expanduser()
    folder.mkdir(parents=True, exist_ok=True)
    rows = []
    with ResultStore(folder / "store.sqlite") as store:
        for i, deployment in enumerate(plan):
            stage = f"extraction: attack {deployment.method} ({deployment.defense})"
            key = _store_key(victim, deployment, config)
            stored = store.get(EXTRACTIONS, key)
            if stored is not None:
                rows.append({**stored, "from_store": True})
                if progress:
                    progress(f"{stage} from the store", i + 1, len(plan))
                continue
            if progress:
                progress(stage, i, len(plan))
            torch.manual_seed(config.seed)
            row = _run_one(deployment, copy.copy(task), truth)
            store.put(EXTRACTIONS, key, row)
            rows.append({**row, "from_store": False})
    if progress:
        progress("extraction", len(plan), len(plan))
    return victim, rows


def run_extract(
    config: ExtractConfig,
    *,
    out: str | Path | None = None,
    cache: str | Path | None = None,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """`privacylab attack extraction`: the payload (`extraction` holds the victim's facts and
    one row per attack and deployment); with `out`, `out/results.json` and `out/index.html`
    (the report's extraction section and its figure) are written too."""
    start = time.perf_counter()
    cache = cache if cache is not None else Path(config.target) / "extraction-cache"
    victim, rows = extraction_rows(config, cache, progress=progress)
    section = {
        "target": victim.facts(),
        "queries": config.queries,
        "attacks": rows,
        "images": {"curves": "extraction_curves.png"},
    }
    payload: dict[str, Any] = {
        "title": f"privacylab extraction report: {victim.name}",
        "dataset": victim.data.name,
        "model": victim.spec.name,
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "config": json_ready(asdict(config)),
        "extraction": section,
        "notes": [
            f"The thief owns {len(victim.pool_rows)} unlabelled test rows of {victim.data.name} "
            f"and may send {config.queries} queries; accuracy and fidelity (agreement with the "
            f"victim's labels) are measured on {len(victim.eval_rows)} other test rows it never "
            "sees. Neither set holds a row the victim trained on.",
        ],
    }
    payload["seconds"] = time.perf_counter() - start
    if out is not None:
        from privacylab.report.extraction import extraction_curves_figure
        from privacylab.report.html import write_report

        images = {"extraction_curves.png": extraction_curves_figure(rows)}
        write_report(out, payload, images)
    return payload
