"""Output (post-processing) defences: one contract for every registered `OutputDefense`, closed
forms and properties per defence (top-k, rounding, label-only, temperature, noise, reverse
sigmoid), numerical cross-checks against IBM ART's post-processors when `art` imports, bad specs,
and membership attacks that still succeed (top-k, label-only's gap) or can no longer run
(score attacks against a label-only deployment)."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays
from torch import nn

from privacylab.attacks.membership import MembershipTask, make_attack, run_attack
from privacylab.data import Dataset, load_dataset
from privacylab.defenses import (
    DEFENSES,
    DefenseData,
    DefenseError,
    OutputDefense,
    defense_names,
    make_defense,
    parse_defense,
)
from privacylab.defenses.base import seeded_generator
from privacylab.models import build_model
from privacylab.report import membership_metrics
from privacylab.target import Access, AccessError, Target
from privacylab.training import TrainConfig, train

CLASSES = 4
OUTPUT_DEFENSES = [n for n in defense_names() if issubclass(DEFENSES.get(n), OutputDefense)]
QUICK = {"memguard": {"epochs": 20, "max_steps": 50, "rounds": 3}}
"""Fewer iterations for defences whose defaults take seconds per call (every other parameter
keeps its default)."""


@pytest.fixture(autouse=True)
def _one_thread() -> None:
    """Tiny batched ops: one torch thread is many times faster on a shared machine (the
    conftest restores the default after each test)."""
    torch.set_num_threads(1)


# ------------------------------------------------------------------------------ fixtures


def _model() -> nn.Module:
    torch.manual_seed(0)
    model = nn.Linear(6, CLASSES)
    with torch.no_grad():
        model.weight.mul_(4.0)
    return model.eval()


def _data(n: int, seed: int) -> Dataset:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 6, generator=g)
    y = _model()(x).argmax(1).detach()
    flip = torch.rand(n, generator=g) < 0.2
    y = torch.where(flip, (y + 1) % CLASSES, y)
    return Dataset("synthetic", x, y, CLASSES, (6,), "tabular")


EDGE_ROWS = torch.tensor(
    [
        [0.25, 0.25, 0.25, 0.25],  # uniform
        [1.0, 0.0, 0.0, 0.0],  # one-hot
        [0.4, 0.4, 0.1, 0.1],  # exact tie at the top
        [0.1, 0.45, 0.45, 0.0],  # tie at the top, not at class 0
        [0.47, 0.46, 0.04, 0.03],  # rounds to a tie at d = 0 and d = 1
        [0.999997, 1e-6, 1e-6, 1e-6],  # confident
    ]
)


def _rows() -> torch.Tensor:
    model = _model()
    with torch.no_grad():
        probs = F.softmax(model(_data(40, 1).features), 1)
    return torch.cat([probs, EDGE_ROWS / EDGE_ROWS.sum(1, keepdim=True)])


def _fitted(name: str) -> OutputDefense:
    """The defence `name` with its defaults (iterations as in QUICK), fitted on the synthetic
    defender data (a no-op for every defence that learns nothing)."""
    defense = make_defense(name, **QUICK.get(name, {}))
    assert isinstance(defense, OutputDefense)
    defense.fit(_model(), _data(60, 2), DefenseData(holdout=_data(60, 3)))
    return defense


@pytest.fixture(scope="module")
def rows() -> torch.Tensor:
    return _rows()


# ------------------------------------------------------------------------------ contract


@pytest.mark.parametrize("name", OUTPUT_DEFENSES)
def test_contract(name: str, rows: torch.Tensor) -> None:
    """Every output defence, with its defaults: finite rows >= 0 of the same shape, the label
    kept when it says so, deterministic given its seed, a declared paper, and `defend` serving
    exactly the transformed rows at its `serves` access."""
    first, second = _fitted(name), _fitted(name)
    assert first.paper, f"{name} names no paper"
    assert first.kind == "output" and first.changes == ("outputs",)
    out = first.transform(rows)
    assert out.shape == rows.shape and out.dtype == rows.dtype
    assert torch.isfinite(out).all()
    assert (out >= 0).all()
    if first.keeps_label:
        assert torch.equal(out.argmax(1), rows.argmax(1))
    again = first.transform(rows)  # a random defence draws afresh; its twin repeats the sequence
    assert torch.equal(second.transform(rows), out)
    assert torch.equal(second.transform(rows), again)

    model, x = _model(), _data(30, 4).features
    served = Target(model, "scores", CLASSES)
    view = _fitted(name).defend(served)
    twin = _fitted(name)
    expected = twin.transform(served.probabilities(x))
    assert view.access is first.serves
    if first.serves.allows(Access.SCORES):
        assert torch.equal(view.probabilities(x), expected)
        assert torch.equal(view.labels(x), twin.transform(served.probabilities(x)).argmax(1))
    else:
        with pytest.raises(AccessError):
            view.probabilities(x)
        assert torch.equal(view.labels(x), expected.argmax(1))
    with pytest.raises(AccessError):
        view.logits(x)
    wider = _fitted(name).defend(Target(model, "logits", CLASSES))
    assert wider.access is first.serves

    for access in ("white-box", "label"):
        with pytest.raises(DefenseError) as error:
            first.defend(Target(model, access, CLASSES))
        assert "\n" not in str(error.value)


def test_every_output_defense_is_listed() -> None:
    assert {"topk", "rounding", "label-only", "temperature", "noise", "reverse-sigmoid"} <= set(
        OUTPUT_DEFENSES
    )
    assert make_defense("label-only").serves is Access.LABEL
    assert not make_defense("reverse-sigmoid").keeps_label
    for name in ("topk", "rounding", "label-only", "temperature", "noise", "memguard"):
        assert make_defense(name).keeps_label, name


@pytest.mark.parametrize("name", OUTPUT_DEFENSES)
def test_bad_rows_are_one_line(name: str, rows: torch.Tensor) -> None:
    """A vector, a numpy array or integer rows given to `transform`: one-line DefenseError,
    not a traceback from deep inside the defence."""
    defense = _fitted(name)
    for bad in (rows[0], rows.numpy(), (rows * 100).long()):
        with pytest.raises(DefenseError) as error:
            defense.transform(bad)
        assert "\n" not in str(error.value) and name in str(error.value)


def _near_ties(seed: int) -> list[torch.Tensor]:
    """float32 probability rows (2 to 100 classes, flat to confident) where a class *before*
    the arg-max equals it, sits one float below it, or 1e-6 below it: the rows on which
    rounding, float64 -> float32 conversion or renormalisation could move the first maximum."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for classes in (2, 4, 10, 100):
        for scale in (0.1, 1.0, 5.0, 30.0):
            p = torch.softmax(torch.randn(300, classes, generator=g) * scale, 1)
            index = torch.arange(len(p))
            p = torch.where(p.argmax(1, keepdim=True) == 0, p.flip(1), p)  # arg-max not class 0
            label = p.argmax(1)
            earlier = label - 1
            top = p[index, label]
            for value in (top, top.nextafter(torch.zeros(())), top * (1 - 1e-6)):
                q = p.clone()
                q[index, earlier] = value
                out.append(q)
    return out


KEEPS_LABEL = (
    [("topk", {"k": k}) for k in (1, 2, 3)]
    + [("rounding", {"d": d}) for d in range(16)]
    + [("temperature", {"t": t}) for t in (1e-3, 0.3, 5.0, 1e3, 1e6)]
    + [("noise", {"scale": s}) for s in (1e-6, 0.1, 1e3)]
    + [("label-only", {})]
)


@pytest.mark.parametrize(("name", "params"), KEEPS_LABEL)
def test_label_keeping_defenses_keep_the_first_maximum(name: str, params: dict) -> None:
    """`Target.labels` skips every defence with `keeps_label = True` and answers the model's
    arg-max, so each such defence must return rows whose first maximum is the model's, also
    on exact and one-float ties, at every parameter (d = 0..15, extreme t, huge noise), for
    float32 and float64 rows. (MemGuard: `test_contract` and test_memguard.py.)"""
    defense = make_defense(name, **params)
    assert defense.keeps_label
    for rows, dtype in itertools.product(_near_ties(len(name)), (torch.float32, torch.float64)):
        p = rows.to(dtype)
        out = defense.transform(p)
        assert out.dtype == dtype and torch.isfinite(out).all()
        assert torch.equal(out.argmax(1), p.argmax(1)), (name, params, dtype)


# ------------------------------------------------------------------------------ properties

_logits = st.integers(1, 6).flatmap(
    lambda n: st.integers(2, 12).flatmap(
        lambda c: arrays(np.float64, (n, c), elements=st.floats(-8, 8, width=64))
    )
)


def _probs(logits: np.ndarray) -> torch.Tensor:
    return torch.softmax(torch.as_tensor(logits), 1).float()


@settings(max_examples=60, deadline=None)
@given(_logits, st.integers(1, 14))
def test_topk_keeps_exactly_k_scores(logits: np.ndarray, k: int) -> None:
    """Top-k: min(k, classes) non-zeros, equal to the k largest probabilities, at classes
    whose probability is at least every dropped one; the arg-max is the model's."""
    p = _probs(logits)
    out = make_defense("topk", k=k).transform(p)
    kept = min(k, p.shape[1])
    assert ((out != 0).sum(1) == kept).all()
    for row, orig in zip(out, p, strict=True):
        nz = row != 0
        assert torch.equal(row[nz], orig[nz])
        assert torch.equal(row[nz].sort().values, orig.sort().values[-kept:])
        if kept < len(orig):
            assert orig[nz].min() >= orig[~nz].max()
    assert torch.equal(out.argmax(1), p.argmax(1))


def test_topk_ties_keep_the_lower_class() -> None:
    p = torch.tensor([[0.1, 0.3, 0.3, 0.3]])
    assert torch.equal(make_defense("topk", k=1).transform(p), torch.tensor([[0, 0.3, 0, 0]]))
    assert torch.equal(make_defense("topk", k=2).transform(p), torch.tensor([[0, 0.3, 0.3, 0]]))


@settings(max_examples=80, deadline=None)
@given(_logits, st.integers(0, 6))
def test_rounding_error_and_label(logits: np.ndarray, d: int) -> None:
    """Rounding: every entry within 0.5·10^-d of the model's (numpy's half-to-even rounding),
    except the model's arg-max in a row whose rounded maximum was shared, which is lifted one
    step (10^-d) and becomes the unique maximum."""
    p = _probs(logits)
    out = make_defense("rounding", d=d).transform(p).double()
    step, slack = 10.0**-d, 1e-6
    reference = torch.as_tensor(np.around(p.double().numpy(), d))
    top = reference.max(1, keepdim=True).values
    tied = ((reference == top).sum(1) > 1).numpy()
    label = p.argmax(1)
    for i in range(len(p)):
        error = (out[i] - p[i].double()).abs()
        if tied[i]:
            others = torch.arange(p.shape[1]) != label[i]
            assert (error[others] <= 0.5 * step + slack).all()
            assert error[label[i]] <= 1.5 * step + slack
            assert math.isclose(float(out[i, label[i]]), float(top[i]) + step, abs_tol=slack)
        else:
            assert (error <= 0.5 * step + slack).all()
            assert torch.allclose(out[i], reference[i], atol=1e-7)
        assert int((out[i] == out[i].max()).sum()) == 1
    assert torch.equal(out.argmax(1), label)


def test_rounding_ties_keep_the_label() -> None:
    """0.47 and 0.46 both round to 0.5 at d = 1 and to 0 at d = 0: the model's arg-max is
    lifted one step, also when an equal class comes before it."""
    p = torch.tensor([[0.47, 0.46, 0.04, 0.03], [0.04, 0.46, 0.47, 0.03]])
    one = make_defense("rounding", d=1).transform(p)
    assert torch.allclose(one, torch.tensor([[0.6, 0.5, 0.0, 0.0], [0.0, 0.5, 0.6, 0.0]]))
    zero = make_defense("rounding", d=0).transform(p)
    assert torch.equal(zero, torch.tensor([[1.0, 0, 0, 0], [0, 0, 1.0, 0]]))
    plain = torch.tensor([[0.1234, 0.5678, 0.3088]])
    assert torch.allclose(
        make_defense("rounding").transform(plain), torch.tensor([[0.123, 0.568, 0.309]])
    )


def test_label_only_is_the_one_hot_arg_max(rows: torch.Tensor) -> None:
    out = make_defense("label-only").transform(rows)
    assert torch.equal(out, F.one_hot(rows.argmax(1), CLASSES).float())


@settings(max_examples=60, deadline=None)
@given(_logits, st.floats(0.05, 50))
def test_temperature_is_softmax_of_scaled_logits(logits: np.ndarray, t: float) -> None:
    """softmax(log p / t) = softmax(logits / t) (the closed form), the label is kept, and t = 1
    is the identity."""
    p = _probs(logits)
    out = make_defense("temperature", t=t).transform(p)
    closed = torch.softmax(torch.as_tensor(logits) / t, 1).float()
    assert torch.allclose(out, closed, atol=2e-6, rtol=1e-4)
    assert torch.equal(out.argmax(1), p.argmax(1))
    assert torch.allclose(make_defense("temperature", t=1).transform(p), p, atol=1e-6)


@settings(max_examples=60, deadline=None)
@given(_logits, st.floats(0.1, 50), st.floats(1.01, 10))
def test_temperature_flattens(logits: np.ndarray, t: float, factor: float) -> None:
    """The entropy grows with t, and a huge t returns nearly the uniform vector."""
    p = _probs(logits)

    def entropy(q: torch.Tensor) -> torch.Tensor:
        q = q.double()
        return -(q * q.clamp_min(1e-300).log()).sum(1)

    low = entropy(make_defense("temperature", t=t).transform(p))
    high = entropy(make_defense("temperature", t=t * factor).transform(p))
    assert (high >= low - 1e-5).all()
    flat = make_defense("temperature", t=1e5).transform(p)
    assert torch.allclose(flat, torch.full_like(p, 1 / p.shape[1]), atol=1e-3)


def _reverse_sigmoid_closed_form(p: np.ndarray, beta: float, gamma: float) -> np.ndarray:
    """Lee et al. 2019 Sec. 4 written out: q = clip(p − β(σ(γ log(p/(1−p))) − 1/2), 0, 1),
    renormalised."""
    c = np.clip(p, 1e-9, 1 - 1e-9)
    r = beta * (1 / (1 + np.exp(-gamma * np.log(c / (1 - c)))) - 0.5)
    q = np.clip(p - r, 0, 1)
    return q / q.sum(1, keepdims=True)


@settings(max_examples=60, deadline=None)
@given(_logits, st.floats(0.05, 5), st.floats(0.01, 2))
def test_reverse_sigmoid_closed_form_and_order(
    logits: np.ndarray, beta: float, gamma: float
) -> None:
    """Output = the closed form; within a row the order of two classes is the order of the
    per-entry map f(p) = clip(p − r(p), 0, 1) (the normalisation is a positive factor)."""
    p = _probs(logits)
    defense = make_defense("reverse-sigmoid", beta=beta, gamma=gamma)
    out = defense.transform(p).double().numpy()
    pn = p.double().numpy()
    assert np.allclose(out, _reverse_sigmoid_closed_form(pn, beta, gamma), atol=1e-6)
    assert np.allclose(out.sum(1), 1, atol=1e-5)
    f = np.clip(pn - defense.perturbation(p).numpy(), 0, 1)
    for i in range(len(pn)):
        diff_f = f[i][:, None] - f[i][None, :]
        diff_out = out[i][:, None] - out[i][None, :]
        clear = np.abs(diff_f) > 1e-6
        assert (np.sign(diff_f[clear]) == np.sign(diff_out[clear])).all()


def test_reverse_sigmoid_shape_of_the_perturbation() -> None:
    """r(1 − p) = −r(p); r(1/2) = 0; r > 0 above 1/2 (confident scores are lowered) and < 0
    below; f is decreasing near 0 (tiny scores are raised the most), so the arg-max can change:
    a row of three near-equal classes and a zero class is served with the zero class on top."""
    defense = make_defense("reverse-sigmoid")
    p = torch.linspace(1e-6, 1 - 1e-6, 201, dtype=torch.float64)[None, :]
    r = defense.perturbation(p)
    assert torch.allclose(r, -defense.perturbation(1 - p), atol=1e-12)
    assert abs(float(defense.perturbation(torch.tensor([[0.5]])))) < 1e-12
    assert (r[p > 0.5] > 0).all() and (r[p < 0.5] < 0).all()
    f = p - r
    assert f[0, 0] > f[0, 1]  # decreasing at 0
    row = torch.tensor([[0.35, 0.33, 0.32, 0.0]])
    out = defense.transform(row)
    assert int(out.argmax(1)) == 3
    assert math.isclose(float(out[0, 3]), float(out.max()), rel_tol=0)


def test_noise_is_the_recipe_on_the_same_draws(rows: torch.Tensor) -> None:
    """With the defence's own seeded draws N: each row is a permutation of ART's recipe
    clip(p + scale·N, 0) / sum, equal to it wherever the recipe kept the model's arg-max, and
    the model's arg-max on top."""
    scale, seed = 0.1, 7
    out = make_defense("noise", scale=scale, seed=seed).transform(rows).double().numpy()
    draws = torch.randn(rows.shape, generator=seeded_generator(seed), dtype=torch.float64)
    recipe = np.clip(rows.double().numpy() + scale * draws.numpy(), 0, None)
    recipe /= recipe.sum(1, keepdims=True)
    label = rows.argmax(1).numpy()
    assert np.allclose(np.sort(out, 1), np.sort(recipe, 1), atol=1e-6)
    same = recipe.argmax(1) == label
    assert not same.all() and same.any()  # the edge rows flip some labels
    assert np.allclose(out[same], recipe[same], atol=1e-6)
    assert (out.argmax(1) == label).all()
    assert np.allclose(out.sum(1), 1, atol=1e-5)


def test_noise_small_scale_returns_the_probabilities_and_all_negative_rows_are_one_hot() -> None:
    p = torch.tensor([[0.5, 0.3, 0.2], [0.1, 0.1, 0.8]])
    assert torch.allclose(make_defense("noise", scale=1e-7).transform(p), p, atol=1e-5)
    huge = make_defense("noise", scale=100.0, seed=3)
    many = p.repeat(200, 1)
    out = huge.transform(many)
    assert torch.isfinite(out).all() and torch.equal(out.argmax(1), many.argmax(1))
    onehot = (out == 1).sum(1) == 1
    assert onehot.any()  # some rows had every entry clipped to 0
    # fresh draws per query, the same sequence for the same seed
    a, b = make_defense("noise", seed=5), make_defense("noise", seed=5)
    first = a.transform(p)
    assert not torch.equal(a.transform(p), first)
    assert torch.equal(b.transform(p), first)
    assert not torch.equal(make_defense("noise", seed=6).transform(p), first)


# ------------------------------------------------------------------------------ ART cross-check


def test_matches_art_postprocessors() -> None:
    """Numerically the same as ART's Rounded (rows without ties), ClassLabels (one row per
    call: on a batch ART 1.20 marks every row at every arg-max of the batch), ReverseSigmoid
    (exactly) and GaussianNoise (in distribution); HighConfidence(cutoff) equals top-k where
    exactly k scores reach the cutoff."""
    postprocessor = pytest.importorskip("art.defences.postprocessor")
    p = _rows().double().numpy()
    pt = torch.as_tensor(p)

    for d in (1, 2, 3):
        ours = make_defense("rounding", d=d).transform(pt).numpy()
        art = postprocessor.Rounded(decimals=d)(p)
        untied = (art == art.max(1, keepdims=True)).sum(1) == 1
        assert untied.sum() > len(p) // 2
        assert np.array_equal(ours[untied], art[untied])

    labels = make_defense("label-only").transform(pt).numpy()
    art_rows = np.concatenate([postprocessor.ClassLabels()(p[i : i + 1]) for i in range(len(p))])
    untied = (p == p.max(1, keepdims=True)).sum(1) == 1
    assert np.array_equal(labels[untied], art_rows[untied])

    for beta, gamma in ((1.0, 0.1), (0.5, 0.5), (2.0, 0.05)):
        ours = make_defense("reverse-sigmoid", beta=beta, gamma=gamma).transform(pt).numpy()
        art = postprocessor.ReverseSigmoid(beta=beta, gamma=gamma)(p)
        assert np.allclose(ours, art, atol=1e-12)
        assert np.array_equal(ours.argmax(1), art.argmax(1))

    one = np.array([[0.7, 0.2, 0.1]])
    many = np.repeat(one, 20000, 0)
    np.random.seed(0)
    art = postprocessor.GaussianNoise(scale=0.05)(many)
    ours = make_defense("noise", scale=0.05).transform(torch.as_tensor(many)).numpy()
    assert np.allclose(ours.mean(0), art.mean(0), atol=2e-3)
    assert np.allclose(ours.std(0), art.std(0), rtol=0.05)

    cut = 0.3
    art = postprocessor.HighConfidence(cutoff=cut)(p)
    for k in (1, 2):
        exact = (p >= cut).sum(1) == k
        ours = make_defense("topk", k=k).transform(pt).numpy()
        assert np.array_equal(ours[exact], art[exact])


# ------------------------------------------------------------------------------ bad specs


@pytest.mark.parametrize(
    "spec",
    [
        "topk:0",
        "topk:-1",
        "topk:1.5",
        "topk:k=abc",
        "rounding:-1",
        "rounding:0.5",
        "rounding:16",
        "rounding:inf",
        "label-only:1",
        "temperature:0",
        "temperature:-2",
        "temperature:nan",
        "noise:0",
        "noise:scale=-0.1",
        "noise:0.1:-1",
        "noise:sigma=1",
        "reverse-sigmoid:0",
        "reverse-sigmoid:beta=1:gamma=0",
        "reverse-sigmoid:1:-0.1",
        "reverse-sigmoid:1:0.1:3",
        "rounding:d=1:d=2",
    ],
)
def test_bad_specs_are_one_line(spec: str) -> None:
    with pytest.raises(DefenseError) as error:
        parse_defense(spec)
    assert "\n" not in str(error.value) and str(error.value)


def test_specs_round_trip() -> None:
    for spec in ("topk:1", "rounding:0", "temperature:20", "noise:0.3:4", "reverse-sigmoid:2:0.5"):
        defense = parse_defense(spec)
        assert parse_defense(defense.spec).params == defense.params
        assert defense.label == spec
    assert parse_defense("rounding").params == {"d": 3}
    assert parse_defense("temperature").params == {"t": 5.0}
    assert parse_defense("noise").params == {"scale": 0.1, "seed": 0}
    assert parse_defense("reverse-sigmoid").params == {"beta": 1.0, "gamma": 0.1}


# ------------------------------------------------------------------------------ attacks


@pytest.fixture(scope="module")
def game() -> tuple[Target, MembershipTask, np.ndarray]:
    """An MLP overfit on 200 digits, a fifth of the candidates relabelled at random (members
    memorise theirs, which is what the attacks find); 200 members and 200 non-members."""
    torch.set_num_threads(1)
    data = load_dataset("digits")
    rng = np.random.default_rng(0)
    order = rng.permutation(len(data))[:400]
    labels = data.labels[order].clone()
    noisy = torch.as_tensor(rng.random(400) < 0.2)
    labels[noisy] = torch.as_tensor(rng.integers(0, data.num_classes, 400))[noisy]
    features = data.features[order]
    members = Dataset("digits-noisy", features[:200], labels[:200], 10, data.input_shape, "image")
    model = build_model("mlp", data.input_shape, data.num_classes, seed=0, widths=[128])
    with torch.random.fork_rng(devices=[]):
        train(model, members, TrainConfig(epochs=60, batch_size=50, lr=0.1, seed=0))
    task = MembershipTask(features, labels, data.num_classes)
    membership = np.r_[np.ones(200, np.int64), np.zeros(200, np.int64)]
    return Target(model, "scores", data.num_classes), task, membership


def _auc(attack: str, target: Target, task: MembershipTask, membership: np.ndarray) -> float:
    result = run_attack(make_attack(attack), target, task, membership)
    return membership_metrics(result).auc


def test_masking_leaves_the_attack_and_label_only_leaves_the_gap(
    game: tuple[Target, MembershipTask, np.ndarray],
) -> None:
    """Seed 004 / Choquette-Choo et al. 2021: top-1 and rounding barely change the
    confidence attack; a label-only deployment refuses score attacks, and the gap attack
    scores exactly as on the undefended model."""
    target, task, membership = game
    plain = _auc("confidence", target, task, membership)
    assert plain > 0.6
    for spec in ("topk:1", "rounding:1", "temperature:5"):
        defended = parse_defense(spec).defend(target)
        assert abs(_auc("confidence", defended, task, membership) - plain) < 0.06, spec
    label_only = parse_defense("label-only").defend(target)
    with pytest.raises(AccessError):
        run_attack(make_attack("confidence"), label_only, task, membership)
    gap = _auc("gap", target, task, membership)
    assert gap > 0.55
    assert _auc("gap", label_only, task, membership) == gap
