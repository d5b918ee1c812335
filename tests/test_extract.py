"""The extraction job (`privacylab.extract`): the deployment each attack is served, the split
it is scored on, the result store, one-line refusals before any query.

A tiny attack registered here (and removed after) checks the plumbing independently of the
real attacks: it labels pool rows through the target and fits a scikit-learn logistic
regression, so its fidelity can be recomputed with numpy from the copy's weights.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import ClassVar

import numpy as np
import pytest
import torch
from sklearn.linear_model import LogisticRegression
from torch import nn

from privacylab.attacks.core import ThreatModel
from privacylab.attacks.extraction import (
    EXTRACTION_ATTACKS,
    ExtractionAttack,
    ExtractionError,
    ExtractionTask,
    Stolen,
    register_extraction,
)
from privacylab.attacks.extraction.pools import extraction_split
from privacylab.data import load_dataset
from privacylab.defenses import (
    DEFENSES,
    DefenseError,
    Parameter,
    QueryDefense,
    register_defense,
)
from privacylab.execution import ResultStore
from privacylab.extract import (
    EXTRACTIONS,
    ExtractConfig,
    default_checkpoints,
    load_victim,
    parse_output,
    run_extract,
)
from privacylab.models import load_model
from privacylab.target import Access, QueryBudgetError, Target
from privacylab.training import TrainConfig, train_job

CONFIG = TrainConfig(epochs=4, batch_size=64, lr=0.1, optimizer="momentum", seed=0)
SEEN: list[dict] = []


def _linear(clf: LogisticRegression, d: int, k: int) -> nn.Module:
    """The fitted classifier as Flatten + Linear (classes the thief never saw get -inf)."""
    linear = nn.Linear(d, k)
    with torch.no_grad():
        linear.weight.zero_()
        linear.bias.fill_(-1e9)
        for row, c in enumerate(clf.classes_):
            linear.weight[int(c)] = torch.as_tensor(clf.coef_[row], dtype=torch.float32)
            linear.bias[int(c)] = float(clf.intercept_[row])
    return nn.Sequential(nn.Flatten(), linear).eval()


class _FakeCopy(ExtractionAttack):
    """Labels the first `budget` pool rows and fits a logistic regression (test-only)."""

    threat_model = ThreatModel(Access.LABEL, ("pool", "architecture"))
    paper = "test stand-in"

    def __init__(self, c: float = 1.0) -> None:
        self.c = c

    def steal(self, target: Target, task: ExtractionTask) -> Stolen:
        pool = task.require_pool(self.name)
        SEEN.append({"access": target.access, "precision": target.precision, "task": task})
        snapshots = []
        x_all, y_all = [], []
        done = 0
        stopped = None
        for point in task.checkpoints:
            x = pool[done:point]
            if len(x) == 0:
                break
            try:
                y = target.labels(x)
            except ExtractionError:
                raise
            except Exception as error:  # a watch or budget refusing: stop with what we have
                stopped = type(error).__name__
                break
            x_all.append(x)
            y_all.append(y)
            done = point
            xs = torch.cat(x_all).flatten(1).numpy()
            ys = torch.cat(y_all).numpy()
            if len(set(ys.tolist())) < 3:  # (binary coef_ has one row)
                continue
            clf = LogisticRegression(C=self.c, max_iter=300).fit(xs, ys)
            snapshots.append((target.queries, _linear(clf, xs.shape[1], task.num_classes)))
        if not snapshots:
            raise ExtractionError("fake-copy: fewer than three classes answered")
        return Stolen(model=snapshots[-1][1], snapshots=snapshots, stopped=stopped)


class _FakeExact(_FakeCopy):
    """An 'exact' stand-in: only its refusal on non-ReLU victims is tested."""

    threat_model = ThreatModel(Access.LOGITS, ("bounds",))
    exact: ClassVar[bool] = True
    needs_float64: ClassVar[bool] = True


class _FakeWatch(QueryDefense):
    """Flags a client once it has sent more than `n` queries; with `block`, refuses them
    (QueryBudgetError). Test-only."""

    name = "fake-watch"
    parameters: ClassVar[tuple[Parameter, ...]] = (
        Parameter("n", int, 50, low=1),
        Parameter("block", int, 0, low=0, high=1),
    )

    def __init__(self, **params: object) -> None:
        super().__init__(**params)
        self.seen = 0
        self.flagged_at: int | None = None

    def observe(self, x: torch.Tensor) -> None:
        if self.params["block"] and self.seen + len(x) > self.params["n"]:
            raise QueryBudgetError(f"fake-watch: more than {self.params['n']} queries")
        self.seen += len(x)
        if self.flagged_at is None and self.seen > self.params["n"]:
            self.flagged_at = self.seen

    def verdict(self) -> dict:
        return {"detected": self.flagged_at is not None, "queries_until_detection": self.flagged_at}


@pytest.fixture()
def fakes() -> Iterator[None]:
    register_extraction("fake-copy")(_FakeCopy)
    register_extraction("fake-exact")(_FakeExact)
    register_defense(_FakeWatch)
    SEEN.clear()
    yield
    EXTRACTION_ATTACKS.unregister("fake-copy")
    EXTRACTION_ATTACKS.unregister("fake-exact")
    DEFENSES.unregister("fake-watch")


@pytest.fixture(scope="module")
def victim(tmp_path_factory: pytest.TempPathFactory) -> Path:
    torch.manual_seed(0)
    out = tmp_path_factory.mktemp("victim") / "mlp"
    train_job("digits", "mlp", CONFIG, out, model_options={"widths": [16]})
    return out


@pytest.fixture(scope="module")
def tanh_victim(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("victim") / "tanh"
    config = TrainConfig(epochs=1, batch_size=64, lr=0.1, seed=0)
    train_job("digits", "mlp", config, out, model_options={"widths": [8], "activation": "tanh"})
    return out


def test_victim_split_is_the_test_rows_halved(victim: Path) -> None:
    v = load_victim(victim)
    data = load_dataset("digits")
    pool, held = extraction_split(data, 0)
    assert np.array_equal(v.pool_rows, pool) and np.array_equal(v.eval_rows, held)
    assert not set(v.pool_rows) & set(v.eval_rows)
    assert v.bounds == (0.0, 1.0)
    assert v.facts()["parameters"] == 64 * 16 + 16 + 16 * 10 + 10


def test_fidelity_and_accuracy_match_numpy(victim: Path, tmp_path: Path, fakes: None) -> None:
    config = ExtractConfig(str(victim), methods=("fake-copy",), queries=160, seed=3)
    payload = run_extract(config, cache=tmp_path / "cache")
    (row,) = payload["extraction"]["attacks"]
    assert row["method"] == "fake-copy" and row["queries"] == 160
    assert [p["queries"] for p in row["curve"]] == [10, 20, 40, 80, 160]
    assert row["output"] == "scores" and row["precision"] == "float32"
    assert row["defense"] == "none" and row["defended"] is False
    assert "detected" not in row
    # the thief's task: the victim's architecture, the pool half, the budget
    task = SEEN[0]["task"]
    v = load_victim(victim)
    assert task.budget == 160 and task.architecture == v.spec
    assert torch.equal(task.pool, v.data.features[v.pool_rows])
    # fidelity recomputed: refit the same copy, compare labels with numpy
    model, _, _ = load_model(victim)
    x = v.data.features[v.eval_rows]
    with torch.no_grad():
        victim_labels = model(x).argmax(1).numpy()
        pool_labels = model(v.data.features[v.pool_rows][:160]).argmax(1).numpy()
    clf = LogisticRegression(max_iter=300).fit(
        v.data.features[v.pool_rows][:160].flatten(1).numpy(), pool_labels
    )
    copy_labels = clf.predict(x.flatten(1).numpy())
    y = v.data.labels[v.eval_rows].numpy()
    assert row["fidelity"] == pytest.approx(float(np.mean(copy_labels == victim_labels)))
    assert row["accuracy"] == pytest.approx(float(np.mean(copy_labels == y)))
    assert row["victim_accuracy"] == pytest.approx(float(np.mean(victim_labels == y)))
    assert 0.5 < row["fidelity"] <= 1.0


def test_second_run_is_served_from_the_store(victim: Path, tmp_path: Path, fakes: None) -> None:
    config = ExtractConfig(str(victim), methods=("fake-copy",), queries=100)
    first = run_extract(config, cache=tmp_path)["extraction"]["attacks"]
    assert SEEN and [r["from_store"] for r in first] == [False]
    SEEN.clear()
    second = run_extract(config, cache=tmp_path)["extraction"]["attacks"]
    assert SEEN == [] and [r["from_store"] for r in second] == [True]
    strip = [{k: v for k, v in r.items() if k != "from_store"} for r in (first[0], second[0])]
    assert strip[0] == strip[1]
    # another budget or seed is another result
    run_extract(ExtractConfig(str(victim), methods=("fake-copy",), queries=120), cache=tmp_path)
    assert len(SEEN) == 1
    with ResultStore(tmp_path / "store.sqlite") as store:
        assert store.count(EXTRACTIONS) == 2


def test_a_killed_run_resumes_after_the_last_stored_attack(
    victim: Path, tmp_path: Path, fakes: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    import privacylab.extract as job

    calls = {"n": 0}
    real = job._run_one

    def dies_second(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 2:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(job, "_run_one", dies_second)
    config = ExtractConfig(
        str(victim), methods=("fake-copy",), queries=100, defenses=("none", "rounding:1")
    )
    with pytest.raises(KeyboardInterrupt):
        run_extract(config, cache=tmp_path)
    monkeypatch.setattr(job, "_run_one", real)
    rows = run_extract(config, cache=tmp_path)["extraction"]["attacks"]
    assert [r["from_store"] for r in rows] == [True, False]
    assert [r["defense"] for r in rows] == ["none", "rounding:1"]


def test_outputs_and_defences_shape_the_deployment(
    victim: Path, tmp_path: Path, fakes: None
) -> None:
    config = ExtractConfig(
        str(victim),
        methods=("fake-copy",),
        queries=100,
        output="labels",
        defenses=("none", "fake-watch:60:1", "fake-watch:30"),
    )
    rows = run_extract(config, cache=tmp_path)["extraction"]["attacks"]
    assert [s["access"] for s in SEEN] == [Access.LABEL] * 3
    assert [r["output"] for r in rows] == ["labels"] * 3
    blocked, watched = rows[1], rows[2]
    assert blocked["defended"] and blocked["defense"] == "fake-watch:60:1"
    assert blocked["queries"] == 50 and blocked["stopped"] == "QueryBudgetError"
    assert blocked["watch"] == "fake-watch:60:1" and blocked["detected"] is False
    # each run is a fresh client: the second watch counts from zero
    assert watched["detected"] is True and watched["queries_until_detection"] == 50
    assert watched["queries"] == 100 and watched["fidelity"] == rows[0]["fidelity"]
    label_only = ExtractConfig(str(victim), methods=("fake-copy",), defenses=("label-only",))
    (row,) = run_extract(label_only, cache=tmp_path)["extraction"]["attacks"]
    assert row["output"] == "labels" and SEEN[-1]["access"] is Access.LABEL
    with pytest.raises(DefenseError, match="label-only post-processes probability vectors"):
        run_extract(replace(label_only, output="labels"), cache=tmp_path)
    rounded = ExtractConfig(str(victim), methods=("fake-copy",), queries=50, output="rounded:2")
    (row,) = run_extract(rounded, cache=tmp_path)["extraction"]["attacks"]
    assert row["output"] == "rounded:2"


@pytest.mark.parametrize(
    ("changes", "error", "words"),
    [
        ({"methods": ("nope",)}, ExtractionError, "unknown extraction method 'nope'"),
        ({"queries": 0}, ExtractionError, "query budget"),
        ({"queries": True}, ExtractionError, "query budget"),
        ({"defenses": ("nope",)}, DefenseError, "unknown defense 'nope'"),
        ({"defenses": ("fake-watch:0",)}, DefenseError, "fake-watch: n must be >= 1"),
        ({"defenses": ("l2:1e-3",)}, DefenseError, "training-time defence"),
        ({"defenses": ("none+fake-watch",)}, DefenseError, "cannot be stacked"),
        ({"output": "probs"}, ExtractionError, "unknown --output 'probs'"),
        ({"output": "rounded:x"}, DefenseError, "rounding"),
    ],
)
def test_bad_options_are_one_line_before_any_work(
    victim: Path, fakes: None, changes: dict, error: type, words: str
) -> None:
    config = ExtractConfig(**{"target": str(victim), "methods": ("fake-copy",), **changes})
    with pytest.raises(error) as raised:
        config.validate()
    message = str(raised.value)
    assert words in message and "\n" not in message


def test_unknown_method_names_the_registered_choices(fakes: None) -> None:
    with pytest.raises(ExtractionError, match="fake-copy, fake-exact"):
        ExtractConfig("x", methods=("nope",)).validate()


def test_exact_attack_on_a_tanh_victim_is_refused_before_any_query(
    tanh_victim: Path, tmp_path: Path, fakes: None
) -> None:
    config = ExtractConfig(str(tanh_victim), methods=("fake-copy", "fake-exact"), queries=50)
    with pytest.raises(
        ExtractionError, match=r"fake-exact cannot extract tanh: layer '2' \(Tanh\)"
    ):
        run_extract(config, cache=tmp_path)
    assert SEEN == []  # not even the learning attack ran


def test_access_the_deployment_cannot_serve_is_refused(
    victim: Path, tmp_path: Path, fakes: None
) -> None:
    config = ExtractConfig(str(victim), methods=("fake-exact",), queries=50, output="scores")
    with pytest.raises(ExtractionError, match="fake-exact needs logits access but --output"):
        run_extract(config, cache=tmp_path)
    config = ExtractConfig(str(victim), methods=("fake-exact",), defenses=("rounding:2",))
    with pytest.raises(ExtractionError, match="behind rounding:2 serves scores"):
        run_extract(config, cache=tmp_path)
    assert SEEN == []


def test_exact_attacks_get_a_float64_logits_target(
    victim: Path, tmp_path: Path, fakes: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    import privacylab.extract as job

    seen = {}

    def capture(deployment, task, truth):
        seen.update(access=deployment.target.access, precision=deployment.target.precision)
        seen.update(layers=truth.layers)
        return {"method": deployment.method, "queries": 0}

    monkeypatch.setattr(job, "_run_one", capture)
    run_extract(ExtractConfig(str(victim), methods=("fake-exact",)), cache=tmp_path)
    assert seen["access"] is Access.LOGITS and seen["precision"] == "float64"
    model, _, _ = load_model(victim)
    assert np.array_equal(seen["layers"][0][0], model[1].weight.detach().double().numpy())


def test_parse_output_and_checkpoints() -> None:
    assert parse_output(None) == (None, None)
    assert parse_output("labels") == (Access.LABEL, None)
    assert parse_output("rounded:2") == (Access.SCORES, 2)
    assert parse_output("logits") == (Access.LOGITS, None)
    assert default_checkpoints(1000) == (62, 125, 250, 500, 1000)
    assert default_checkpoints(3) == (1, 2, 3)
    points = ExtractConfig("x", queries=100, checkpoints=(0, 10, 10, 500)).curve_points()
    assert points == (10,)


class _FakeUpTo(_FakeCopy):
    """Needs labels, can use scores (as the learning attacks declare with `uses_up_to`)."""

    uses_up_to: ClassVar[Access] = Access.SCORES


@pytest.mark.parametrize(
    ("output", "seen", "access"),
    [
        (None, Access.SCORES, "scores"),
        ("scores", Access.SCORES, "scores"),
        ("logits", Access.SCORES, "scores"),
        ("labels", Access.LABEL, "label"),
    ],
)
def test_an_attack_is_served_up_to_what_it_can_use(
    victim: Path, tmp_path: Path, fakes: None, output: str | None, seen: Access, access: str
) -> None:
    register_extraction("fake-up-to")(_FakeUpTo)
    try:
        config = ExtractConfig(str(victim), methods=("fake-up-to",), queries=40, output=output)
        (row,) = run_extract(config, cache=tmp_path)["extraction"]["attacks"]
    finally:
        EXTRACTION_ATTACKS.unregister("fake-up-to")
    assert SEEN[-1]["access"] is seen and row["access"] == access
    assert _FakeUpTo.threat_model.access is Access.LABEL  # the class is left as it was


class _Greedy(_FakeCopy):
    """Ignores the task's budget: asks for the whole pool, ten rows at a time."""

    def steal(self, target: Target, task: ExtractionTask) -> Stolen:
        for i in range(0, len(task.pool), 10):
            target.labels(task.pool[i : i + 10])
        raise AssertionError("the job's budget did not stop it")


def test_the_job_enforces_the_thiefs_budget(victim: Path, tmp_path: Path, fakes: None) -> None:
    register_extraction("fake-greedy")(_Greedy)
    try:
        config = ExtractConfig(str(victim), methods=("fake-greedy",), queries=35)
        (row,) = run_extract(config, cache=tmp_path)["extraction"]["attacks"]
    finally:
        EXTRACTION_ATTACKS.unregister("fake-greedy")
    assert row["queries"] == 30 and row["stopped"] == "budget"
    assert "query budget of 35 examples exhausted" in row["error"]
    assert row["fidelity"] is None and row["curve"] == []
