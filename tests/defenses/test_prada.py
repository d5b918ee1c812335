"""PRADA (Juuti et al. 2019, Alg. 1): the detector against a plain re-implementation of the
algorithm, zero false alarms on ten benign clients streaming natural digits, detection of a
Jacobian-augmentation stream, blocking, per-client state, and the CLI refusal."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy import stats
from torch import nn

from privacylab.data import load_dataset
from privacylab.defenses import DefenseError, make_defense, parse_defense
from privacylab.defenses.query.prada import (
    Prada,
    QueryRefused,
    shapiro_wilk_without_outliers,
)
from privacylab.errors import PrivacylabError
from privacylab.target import Target


@pytest.fixture(scope="module")
def victim() -> tuple[nn.Module, torch.Tensor]:
    """A small MLP trained on the first 1,000 digits; the other 797 rows are natural test
    queries."""
    torch.manual_seed(0)
    data = load_dataset("digits")
    x, y = data.features, data.labels
    model = nn.Sequential(nn.Flatten(), nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))
    optimizer = torch.optim.Adam(model.parameters(), 1e-2)
    for _ in range(150):
        optimizer.zero_grad()
        nn.functional.cross_entropy(model(x[:1000]), y[:1000]).backward()
        optimizer.step()
    return model.eval(), x[1000:]


def _reference(rows: np.ndarray, labels: np.ndarray) -> list[float]:
    """Alg. 1's set D of minimum distances, written out plainly (lists, loops)."""
    sets: dict[int, list[np.ndarray]] = {}
    kept: dict[int, list[float]] = {}
    thresholds: dict[int, float] = {}
    out: list[float] = []
    for row, label in zip(rows, labels, strict=True):
        c = int(label)
        if not sets.get(c):
            sets[c], kept[c], thresholds[c] = [row], [], 0.0
            continue
        d_min = min(float(np.linalg.norm(row - y)) for y in sets[c])
        out.append(d_min)
        if d_min > thresholds[c]:
            sets[c].append(row)
            kept[c].append(d_min)
            thresholds[c] = max(thresholds[c], float(np.mean(kept[c]) - np.std(kept[c])))
    return out


def test_matches_a_plain_reading_of_algorithm_1() -> None:
    rng = np.random.default_rng(0)
    rows = rng.normal(size=(300, 5))
    labels = rng.integers(0, 3, size=300)
    lookup = {tuple(r): int(c) for r, c in zip(rows, labels, strict=True)}
    watch = Prada(delta=0.0001).use_labeller(
        lambda x: torch.tensor([lookup[tuple(r)] for r in x.double().numpy()])
    )
    for i in range(0, 300, 7):
        watch.observe(torch.from_numpy(rows[i : i + 7]))
    expected = _reference(rows, labels)
    np.testing.assert_allclose(watch.min_distances(), expected, rtol=1e-12)
    verdict = watch.verdict()
    assert verdict["queries"] == 300 and verdict["distances"] == 300 - 3
    assert verdict["tests"] == len(expected) - 100 + 1
    assert verdict["w_statistic"] == pytest.approx(float(stats.shapiro(expected).statistic))


def test_hand_worked_growing_set() -> None:
    watch = Prada().use_labeller(lambda x: torch.zeros(len(x), dtype=torch.int64))
    watch.observe(torch.tensor([[0.0], [1.0], [3.0], [3.5]]))
    # G = {0}; 1: d=1 > T=0 joins, T = 1 - 0; 3: d=2 > 1 joins, T = max(1, 1.5 - 0.5); 3.5: d=0.5
    assert watch.min_distances() == [1.0, 2.0, 0.5]


def test_outlier_removal_and_degenerate_sets() -> None:
    rng = np.random.default_rng(1)
    normal = rng.normal(10.0, 1.0, size=400)
    with_outliers = np.concatenate([normal, [60.0, 70.0]])
    assert shapiro_wilk_without_outliers(with_outliers) == pytest.approx(
        float(stats.shapiro(normal).statistic)
    )
    assert float(stats.shapiro(with_outliers).statistic) < 0.7
    assert shapiro_wilk_without_outliers(np.full(50, 2.0)) == 1.0
    assert shapiro_wilk_without_outliers(rng.exponential(size=400)) < 0.9


def _stream(target: Target, queries: torch.Tensor, batch: int = 16) -> None:
    for i in range(0, len(queries), batch):
        target.probabilities(queries[i : i + batch])


def test_ten_benign_clients_no_false_alarm(victim) -> None:
    model, natural = victim
    rng = np.random.default_rng(2)
    shared = Target(model, "scores", 10)
    watch = make_defense("prada")
    verdicts = []
    for _ in range(10):
        client = watch.fresh()
        order = torch.from_numpy(rng.permutation(len(natural))[:400])
        _stream(client.defend(shared), natural[order])
        verdicts.append(client.verdict())
    assert all(v["tests"] > 250 for v in verdicts)
    assert not any(v["detected"] for v in verdicts), [v["w_statistic"] for v in verdicts]
    assert shared.queries == 10 * 400


def _jacobian_like(seeds: torch.Tensor, n: int, step: float, seed: int) -> torch.Tensor:
    """Papernot et al. 2017-style growth: each round adds x + λ·sign(noise) for every point so
    far (noise standing in for the substitute's Jacobian), clipped to [0, 1]."""
    g = torch.Generator().manual_seed(seed)
    points = seeds.clone()
    while len(points) < n:
        grown = points + step * torch.sign(torch.randn(points.shape, generator=g))
        points = torch.cat([points, grown.clamp(0, 1)])
    return points[:n]


def test_jacobian_stream_detected_and_blocked(victim) -> None:
    model, natural = victim
    attack = _jacobian_like(natural[:10], 640, 0.1, seed=3)
    watch = make_defense("prada")
    target = watch.defend(Target(model, "scores", 10))
    _stream(target, attack)
    verdict = watch.verdict()
    assert verdict["detected"] and verdict["w_statistic"] < 0.9
    assert 100 < verdict["queries_until_detection"] <= 640 and verdict["queries"] == 640

    blocking = parse_defense("prada:block=1")
    guarded = blocking.defend(Target(model, "scores", 10))
    with pytest.raises(QueryRefused, match="prada flagged this client") as caught:
        _stream(guarded, attack)
    assert isinstance(caught.value, PrivacylabError) and "\n" not in str(caught.value)
    detected_at = blocking.verdict()["queries_until_detection"]
    assert detected_at == verdict["queries_until_detection"]
    assert guarded.queries < detected_at
    with pytest.raises(QueryRefused):
        guarded.probabilities(natural[:1])


def test_iid_uniform_queries_are_not_flagged(victim) -> None:
    """A documented limit of PRADA's premise: i.i.d. uniform queries have normally distributed
    minimum distances, so Alg. 1 does not flag them (random-query extraction evades it)."""
    model, _ = victim
    watch = make_defense("prada")
    g = torch.Generator().manual_seed(4)
    _stream(watch.defend(Target(model, "scores", 10)), torch.rand(600, 1, 8, 8, generator=g))
    assert not watch.verdict()["detected"]


def test_state_resumes_across_batches_and_fresh_starts_clean(victim) -> None:
    model, natural = victim
    attack = _jacobian_like(natural[:10], 400, 0.1, seed=5)
    whole, split = make_defense("prada"), make_defense("prada")
    whole.defend(Target(model, "scores", 10)).probabilities(attack)
    _stream(split.defend(Target(model, "scores", 10)), attack, batch=3)
    assert whole.verdict() == split.verdict()
    assert whole.min_distances() == split.min_distances()
    other = split.fresh()
    assert other.verdict()["queries"] == 0 and other.params == split.params


def test_labeller_is_the_defenders_and_uncounted(victim) -> None:
    model, natural = victim
    target = Target(model, "scores", 10, query_budget=50)
    seen: list[int] = []
    watch = make_defense("prada")
    view = watch.defend(target.with_monitor(lambda x: seen.append(len(x))))
    view.labels(natural[:50])
    assert target.queries == 50 and sum(seen) == 50 and watch.verdict()["queries"] == 50


def test_needs_a_labeller_and_bad_parameters_one_line() -> None:
    with pytest.raises(DefenseError, match="defend"):
        make_defense("prada").observe(torch.zeros(2, 3))
    for spec in (
        "prada:delta=1.5",
        "prada:min_queries=2",
        "prada:distance=cosine",
        "prada:block=2",
    ):
        with pytest.raises(DefenseError) as caught:
            parse_defense(spec)
        assert "\n" not in str(caught.value)


def test_cli_defend_refuses_prada(tmp_path) -> None:
    from typer.testing import CliRunner

    from privacylab.cli import app
    from privacylab.defend import DefendConfig

    with pytest.raises(DefenseError, match="privacylab attack extraction --defense"):
        DefendConfig(defenses=("prada",)).validate()
    result = CliRunner().invoke(
        app, ["defend", "--dataset", "digits", "--defenses", "prada", "--out", str(tmp_path)]
    )
    assert result.exit_code == 2, result.output
    assert "attack extraction --defense" in result.output
